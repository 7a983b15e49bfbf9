#!/usr/bin/env bash
# Two hosts on one machine (issue 14): two network namespaces joined by a
# veth pair, two gloo ranks per "host", HYBRID_SHARD with shard groups inside
# the hosts (gradients cross the link only in the replica all-reduce).
#
#   1. An uninterrupted run of STEPS steps: the reference losses.
#   2. The same run, checkpointed after step SAVE; before step PAUSE every rank
#      waits while the test takes the link down, then the step runs: every
#      rank must fail within the timeout, naming the peer ranks it cannot
#      reach (the ones on the other host).
#   3. With the link up again, all four ranks restart from the checkpoint:
#      their losses for steps SAVE+1..STEPS must equal the reference bit for bit.
#
# Needs CAP_NET_ADMIN (ip netns, veth): skips, saying why, where namespaces
# cannot be made. Usage: two_host_test.sh WORKER
set -uo pipefail
export PATH="/usr/sbin:/sbin:$PATH"

WORKER=$(readlink -f "$1")
STEPS=8 SAVE=4 PAUSE=6 TIMEOUT_MS=3000
TAG="sk$$"
NS_A="${TAG}a" NS_B="${TAG}b"
NET=$((($$ % 200) + 20))  # 10.NET.77.0/24, varied so concurrent runs do not clash
ADDR_A="10.$NET.77.1" ADDR_B="10.$NET.77.2"
PORT=$((20000 + $$ % 20000))
WORK="${TEST_TMPDIR:-/tmp}/two_host.$$"
mkdir -p "$WORK"

skip() {
  echo "SKIPPED: $*"
  exit 0
}
fail() {
  echo "FAIL: $*"
  exit 1
}

command -v ip >/dev/null || skip "iproute2's ip is not installed"
unshare -rn true 2>/dev/null || skip "network namespaces are not permitted here (unshare -rn true failed)"

cleanup() {
  ip netns del "$NS_A" 2>/dev/null
  ip netns del "$NS_B" 2>/dev/null
}
trap cleanup EXIT

ip netns add "$NS_A" 2>/dev/null || skip "ip netns add failed (needs CAP_NET_ADMIN)"
ip netns add "$NS_B" || skip "ip netns add failed (needs CAP_NET_ADMIN)"
ip link add "${TAG}va" type veth peer name "${TAG}vb" || skip "cannot create a veth pair"
ip link set "${TAG}va" netns "$NS_A"
ip link set "${TAG}vb" netns "$NS_B"
ip -n "$NS_A" addr add "$ADDR_A/24" dev "${TAG}va"
ip -n "$NS_B" addr add "$ADDR_B/24" dev "${TAG}vb"
for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
ip -n "$NS_A" link set "${TAG}va" up
ip -n "$NS_B" link set "${TAG}vb" up
ip netns exec "$NS_A" ping -c 1 -W 2 "$ADDR_B" >/dev/null 2>&1 ||
  echo "note: ping across the veth failed (no ping?); continuing"

# run_world NAME MODE PORT: the four ranks, two per namespace, started
# directly (not by the launcher, which would stop the survivors of the first
# failure before they report theirs). Each rank's output goes to
# $WORK/NAME.RANK; waits for all four; prints their exit codes.
run_world() {
  local name=$1 mode=$2 port=$3 pids=() codes=()
  for rank in 0 1 2 3; do
    local ns=$NS_A addr=$ADDR_A
    if ((rank >= 2)); then ns=$NS_B addr=$ADDR_B; fi
    ip netns exec "$ns" env RANK=$rank WORLD_SIZE=4 LOCAL_RANK=$((rank % 2)) LOCAL_WORLD_SIZE=2 \
      GROUP_RANK=$((rank / 2)) MASTER_ADDR="$ADDR_A" MASTER_PORT="$port" HOST_ADDR="$addr" \
      "$WORKER" "$STEPS" "$TIMEOUT_MS" "$WORK/$name" "$mode" >"$WORK/$name.$rank" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid"
    codes+=($?)
  done
  echo "${codes[*]}"
}

losses() { grep '^loss ' "$1"; }

# 1. The reference.
mkdir -p "$WORK/ref"
codes=$(run_world ref plain "$PORT")
[[ $codes == "0 0 0 0" ]] || { tail -n 5 "$WORK"/ref.*; fail "the uninterrupted run failed: exit codes $codes"; }
echo "reference run: $(losses "$WORK/ref.0" | wc -l) steps"

# 2. The link goes down while the ranks wait before step PAUSE.
mkdir -p "$WORK/cut"
run_world cut "save:$SAVE,pause:$PAUSE" $((PORT + 1)) >"$WORK/cut.codes" &
runner=$!
for _ in $(seq 1 600); do
  n=$(ls "$WORK/cut"/paused.* 2>/dev/null | wc -l)
  ((n == 4)) && break
  sleep 0.1
done
((n == 4)) || { tail -n 5 "$WORK"/cut.*; fail "the ranks did not all reach step $PAUSE"; }
ip -n "$NS_A" link set "${TAG}va" down
start=$(date +%s%N)
touch "$WORK/cut/go"
wait "$runner"
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
codes=$(cat "$WORK/cut.codes")
echo "link down before step $PAUSE: exit codes $codes after $elapsed_ms ms (timeout $TIMEOUT_MS ms)"
for rank in 0 1 2 3; do
  out="$WORK/cut.$rank"
  line=$(grep '^error' "$out")
  echo "  rank $rank: $line"
  [[ -n $line ]] || fail "rank $rank did not report an error: $(tail -n 3 "$out")"
  took=$(sed -n 's/^error after \([0-9]*\) ms.*/\1/p' <<<"$line")
  ((took <= 2 * TIMEOUT_MS + 2000)) || fail "rank $rank took $took ms to fail (timeout $TIMEOUT_MS ms)"
  # The unreachable peers are the other host's ranks.
  if ((rank < 2)); then peers="2|3"; else peers="0|1"; fi
  grep -Eq "ranks? ([0-9]+,)*($peers)(,[0-9]+)*\)? did not arrive" <<<"$line" ||
    fail "rank $rank's error does not name an unreachable peer ($peers): $line"
  [[ $(losses "$out" | wc -l) -eq $((PAUSE - 1)) ]] || fail "rank $rank did not finish steps 1..$((PAUSE - 1))"
done
[[ -f "$WORK/cut/ckpt/index.json" ]] || fail "no checkpoint after step $SAVE"

# 3. Link up, restart from the step-SAVE checkpoint.
ip -n "$NS_A" link set "${TAG}va" up
cp -r "$WORK/cut" "$WORK/resume"
codes=$(run_world resume resume $((PORT + 2)))
[[ $codes == "0 0 0 0" ]] || { tail -n 5 "$WORK"/resume.*; fail "the restart failed: exit codes $codes"; }
expected=$(losses "$WORK/ref.0" | awk -v s="$SAVE" '$2 > s')
got=$(losses "$WORK/resume.0")
[[ -n $got && $got == "$expected" ]] || fail "restart losses differ from the uninterrupted run:
expected:
$expected
got:
$got"
echo "restart from step $SAVE reproduced steps $((SAVE + 1))..$STEPS bit for bit:"
echo "$got"
echo "PASS"
