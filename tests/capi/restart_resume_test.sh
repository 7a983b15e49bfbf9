#!/usr/bin/env bash
# launch --max_restarts and sk_trainer_resume_latest together: a 2-rank run in
# which one rank (chosen at random) kills itself after a random step ends
# with weights bit-identical to an uninterrupted run; and rank 0's death under
# the launcher is reported as rank 0's.
#   restart_resume_test.sh LAUNCH RESUME_WORKER
set -euo pipefail
launch="$1" worker="$2"
out="${TEST_TMPDIR:-$(mktemp -d)}"
steps=8
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

"$launch" --nproc_per_node=2 --master_port=0 "$worker" "$out/plain" "$steps" >"$out/plain.log" 2>&1 ||
  { cat "$out/plain.log" >&2; fail "the uninterrupted run failed"; }

victim=$((RANDOM % 2))
kill_step=$((RANDOM % (steps - 1) + 1))
echo "killing rank $victim after step $kill_step of the first attempt"
rc=0
"$launch" --nproc_per_node=2 --master_port=0 --max_restarts=2 "$worker" "$out/killed" "$steps" "$victim" "$kill_step" \
  >"$out/killed.log" 2>&1 || rc=$?
cat "$out/killed.log"
[[ $rc == 0 ]] || fail "the restarted run exited $rc"
grep -q "launch: attempt 0 failed (rank $victim was killed by signal 9); restarting the group (restart 1 of 2)" \
  "$out/killed.log" || fail "the launcher did not report rank $victim's death and the restart"
resumed=$((kill_step / 2 * 2))
grep -q "\[rank 0\] attempt 1: resumed at step $resumed" "$out/killed.log" ||
  fail "the second attempt did not resume at step $resumed (the newest checkpoint)"
cmp "$out/plain/final.safetensors" "$out/killed/final.safetensors" ||
  fail "the restarted run's weights differ from the uninterrupted run's"
kept=$(find "$out/killed" -maxdepth 1 -name 'step_*' | wc -l)
[[ $kept == 2 ]] || fail "$kept checkpoints kept, not 2: $(ls "$out/killed")"
# The learning rate continued its schedule: every step's line equals the
# uninterrupted run's.
diff <(sed -n 's/^\[rank 0\] \(step .*\)/\1/p' "$out/plain.log") \
  <(sed -n 's/^\[rank 0\] \(step .*\)/\1/p' "$out/killed.log" | awk '!seen[$2]++') ||
  fail "the restarted run's losses or learning rates differ"
unique=$(sed -n 's/^\[rank 0\] \(step .*\)/\1/p' "$out/killed.log" | sort -u | wc -l)
[[ $unique == "$steps" ]] || fail "the replayed steps differ from their first run ($unique distinct lines)"
echo "PASS: restarted after rank $victim died at step $kill_step; weights bit-identical"

# Rank 0 killed, no restarts: the launcher names rank 0 and exits 137.
rc=0
"$launch" --nproc_per_node=2 --master_port=0 "$worker" "$out/rank0" "$steps" 0 3 >"$out/rank0.log" 2>&1 || rc=$?
cat "$out/rank0.log"
[[ $rc == 137 ]] || fail "killing rank 0 made the launcher exit $rc, not 137"
grep -q "launch: rank 0 was killed by signal 9; stopping the other ranks" "$out/rank0.log" ||
  fail "the launcher did not name rank 0"
grep -q "launch: exit 137: rank 0 was killed by signal 9" "$out/rank0.log" || fail "no exit report"
echo "PASS: rank 0's death is reported as rank 0's"
