#!/usr/bin/env bash
# examples/c/train_gpt_gloo under a real single-host Slurm: starts munged,
# slurmctld and slurmd of its own (private sockets, ports and directories),
# runs `srun -n 2` (Slurm's variables only: no RANK, no MASTER_*), and checks
# rank 0's losses against the 2-rank local session's, bit for bit. Skips,
# saying why, where Slurm cannot start here (not root, slurm-wlm or munge not
# installed, daemons that do not come up).
#   slurm_launch_test.sh TRAIN_GPT_GLOO TRAIN_GPT
set -uo pipefail
gloo="$(realpath "$1")" local_run="$(realpath "$2")"
skip() {
  echo "SKIP: $*"
  exit 0
}
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
[[ $(id -u) == 0 ]] || skip "not root (slurmd and munged run as root here)"
for b in munged mungekey slurmctld slurmd srun sinfo; do
  command -v "$b" >/dev/null 2>&1 || [[ -x /usr/sbin/$b ]] || skip "$b is not installed (Debian: apt-get install slurm-wlm munge)"
done
PATH="$PATH:/usr/sbin"
# Under /tmp, not TEST_TMPDIR: munge's socket path must stay under 108 bytes.
dir="$(mktemp -d /tmp/sk_slurm.XXXXXX)"
chmod 755 "$dir"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  sleep 1
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
mungekey --create --keyfile="$dir/munge/key" >/dev/null 2>&1 || skip "mungekey failed"
munged --force --foreground --socket="$dir/munge/sock" --key-file="$dir/munge/key" \
  --pid-file="$dir/munge/pid" --seed-file="$dir/munge/seed" --log-file="$dir/munge/log" >"$dir/munge/out" 2>&1 &
pids+=($!)
host=$(hostname)
base=$((20000 + RANDOM % 10000))
cat >"$dir/slurm.conf" <<CONF
ClusterName=sktest
SlurmctldHost=$host
AuthType=auth/munge
AuthInfo=socket=$dir/munge/sock
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/linear
SlurmUser=root
SlurmdUser=root
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmdSpoolDir=$dir/spool
StateSaveLocation=$dir/state
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
MpiDefault=none
ReturnToService=2
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SrunPortRange=$((base + 2))-$((base + 100))
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$dir/slurm.conf"
sleep 1
slurmctld -D -i >"$dir/ctld.out" 2>&1 &
pids+=($!)
slurmd -D >"$dir/d.out" 2>&1 &
pids+=($!)
up=0
for _ in $(seq 60); do
  if sinfo -h -o %t 2>/dev/null | grep -q idle; then
    up=1
    break
  fi
  sleep 0.5
done
[[ $up == 1 ]] || skip "the Slurm daemons did not come up in 30 s: $(tail -n 2 "$dir/slurmctld.log" "$dir/slurmd.log" 2>/dev/null | tr '\n' ' ')"

"$local_run" >"$dir/local.txt"
env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT -u LOCAL_RANK -u LOCAL_WORLD_SIZE \
  timeout 300 srun -N1 -n2 -O --label "$gloo" >"$dir/srun.log" 2>&1 || {
  cat "$dir/srun.log" >&2
  fail "srun -n2 failed"
}
sed -n 's/^0: \(step .*\)/\1/p' "$dir/srun.log" >"$dir/rank0.txt"
diff -u "$dir/local.txt" "$dir/rank0.txt" || fail "rank 0's losses under srun differ from the local session's"
echo "PASS: srun -n2 on a single-host Slurm: rank 0's losses equal the local session's bit for bit"
