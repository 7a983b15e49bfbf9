#!/usr/bin/env bash
# //benchmarks:calibrate checks its flags before the minutes of measurement
# (exit 2, naming the flag): --threads=0 aborted in a CHECK (SIGABRT), and
# --in_step=nonexist:1 measured for 39 s (1.3 GB) and then wrote a profile
# without the in-step correction, exit 0.
set -euo pipefail
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
source tests/util/expect_refusal.sh
REFUSAL_TIMEOUT=10
expect_bad() { local what="$1"; shift; expect_refusal 2 "$what" "$bin" "$@"; }
expect_bad "--threads must be in \[1, 1024\], got 0" --threads=0
expect_bad "--threads must be in \[1, 1024\], got 2147483647" --threads=2147483647
expect_bad "--in_step: NOT_FOUND: no model config named 'nonexist'" --in_step=nonexist:1
expect_bad "--held_out: NOT_FOUND: no model config named 'nope'" --held_out=nope
expect_bad "--in_step: batch 'abc' of gpt-50m" --in_step=gpt-50m:abc
expect_bad "--in_step_steps must be >= 1" --in_step_steps=0
expect_bad "--budget_ms must be a finite number" --budget_ms=nan
# --attention_only updates an existing measured profile: it needs one.
expect_bad "--attention_only needs --out=PATH" --attention_only
echo '{"name": "x"}' > "$tmp/not_measured.json"
expect_bad "not a measured profile (no compute.op_rates)" --attention_only --out="$tmp/not_measured.json"
expect_bad "missing.json" --attention_only --out="$tmp/missing.json"
echo PASS
