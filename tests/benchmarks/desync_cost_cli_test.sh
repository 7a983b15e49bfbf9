#!/usr/bin/env bash
# //benchmarks:desync_cost refuses --steps and --iterations it cannot use
# (exit 2, naming the flag): --steps=0 was a division by zero (SIGFPE),
# --steps=-1 printed "inf% of the step", --iterations=2147483647 overflowed
# its loop bound and printed a median of 0.0 us.
set -euo pipefail
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
source tests/util/expect_refusal.sh
expect_bad() { local what="$1"; shift; expect_refusal 2 "$what" "$bin" "$@"; }
expect_bad "--steps must be in \[1, 1000000\], got 0" --steps=0 --iterations=10
expect_bad "--steps must be in \[1, 1000000\], got -1" --steps=-1 --iterations=10
expect_bad "--iterations must be in \[1, 10000000\], got -100" --iterations=-100 --steps=1
expect_bad "--iterations must be in \[1, 10000000\], got 2147483647" --iterations=2147483647 --steps=1
"$bin" --steps=1 --iterations=10 > "$tmp/ok.txt"
grep -q "desync check per step" "$tmp/ok.txt" || { cat "$tmp/ok.txt"; echo "FAIL: no result" >&2; exit 1; }
echo PASS
