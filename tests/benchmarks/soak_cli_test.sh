#!/usr/bin/env bash
# //benchmarks:soak refuses flags that cannot give a slope before training
# (exit 2): --every=2^63-1 overflowed the "steps >= 2 * every" check and
# trained all --steps (over a minute) before failing; --steps=300 --every=100
# --warmup=250 trained 300 steps to report "fewer than two samples";
# --max_slope=nan made every run GROWING.
set -euo pipefail
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
source tests/util/expect_refusal.sh
REFUSAL_TIMEOUT=10
expect_bad() {
  local what="$1"; shift
  expect_refusal 2 "$what" "$bin" "$@"
  if grep -q "^rss " "$tmp/out.txt"; then echo "FAIL: $* trained before refusing" >&2; exit 1; fi
}
expect_bad "need steps >= 2 \* every" --steps=10000 --every=9223372036854775807
expect_bad "leave 1 RSS sample(s) past the warm-up" --steps=300 --every=100 --warmup=250
expect_bad "--max_slope must be a finite number" --steps=20 --every=10 --warmup=0 --max_slope=nan
# A negative bound called every run GROWING and printed as 300 digits.
expect_bad "bytes per step >= 0, got -1e+300" --steps=20 --every=10 --warmup=0 --max_slope=-1e300
"$bin" --steps=30 --every=10 --warmup=0 --max_slope=1e12 > "$tmp/ok.txt"
grep -q "^soak: 30 steps of gpt-tiny.*FLAT" "$tmp/ok.txt" || { cat "$tmp/ok.txt"; echo "FAIL: no verdict" >&2; exit 1; }
# Fault injection (issue 35): 200 trials, each running one random rank out of
# memory at a random allocation of a step; every trial must be clean.
expect_bad "need 1 <= --oom_trials <= 100000" --oom_trials=-1
expect_bad "2 <= --oom_world <= 8" --oom_trials=5 --oom_world=1
"$bin" --oom_trials=200 --oom_seed=35 > "$tmp/oom.txt" || { cat "$tmp/oom.txt"; echo "FAIL: out-of-memory trials" >&2; exit 1; }
grep -q "^oom: 200 trials, local group of 2, seed 35: 200 clean.*that did not fail: 0; errors not naming the rank that ran out: 0; stuck trainers: 0; hangs: 0;" "$tmp/oom.txt" \
  || { cat "$tmp/oom.txt"; echo "FAIL: out-of-memory trials not all clean" >&2; exit 1; }
# Peer faults (issue 35, defect 5): one gloo rank process stopped (4 ranks)
# or killed while loading a checkpoint (3 ranks); every survivor's error must
# name it and no healthy rank (before, errors named no rank or the live ranks
# it held up as well).
expect_bad "need 1 <= --fault_trials <= 10000" --fault_trials=-1
expect_bad "--fault_signal=kill|stop" --fault_trials=1 --fault_signal=bogus
"$bin" --fault_trials=2 --fault_world=4 --fault_signal=stop --fault_timeout_ms=3000 > "$tmp/stop.txt" \
  || { cat "$tmp/stop.txt"; echo "FAIL: stopped-rank trials" >&2; exit 1; }
grep -q "^fault: 2 trials, 4 gloo ranks, stop during step, seed 1: 6 survivor errors; naming the signalled rank: 6; naming a healthy rank: 0; naming no rank: 0; hangs: 0;" "$tmp/stop.txt" \
  || { cat "$tmp/stop.txt"; echo "FAIL: stopped-rank trials not all named exactly" >&2; exit 1; }
"$bin" --fault_trials=2 --fault_world=3 --fault_signal=kill --fault_phase=load --fault_timeout_ms=3000 > "$tmp/kill.txt" \
  || { cat "$tmp/kill.txt"; echo "FAIL: killed-rank trials" >&2; exit 1; }
grep -q "^fault: 2 trials, 3 gloo ranks, kill during load, seed 1: 4 survivor errors; naming the signalled rank: 4; naming a healthy rank: 0; naming no rank: 0; hangs: 0;" "$tmp/kill.txt" \
  || { cat "$tmp/kill.txt"; echo "FAIL: killed-rank trials not all named exactly" >&2; exit 1; }
# Issue 47, item 6: the same with each rank on a machine of its own (no /proc
# judgement: a killed peer is named from its liveness link).
"$bin" --fault_trials=2 --fault_world=3 --fault_signal=kill --fault_distinct_machines --fault_timeout_ms=3000 > "$tmp/kill_machines.txt" \
  || { cat "$tmp/kill_machines.txt"; echo "FAIL: killed-rank trials on distinct machines" >&2; exit 1; }
grep -q "^fault: 2 trials, 3 gloo ranks (each on a machine of its own), kill during step, seed 1: 4 survivor errors; naming the signalled rank: 4; naming a healthy rank: 0; naming no rank: 0; hangs: 0;" "$tmp/kill_machines.txt" \
  || { cat "$tmp/kill_machines.txt"; echo "FAIL: killed-rank trials on distinct machines not all named exactly" >&2; exit 1; }
echo PASS
