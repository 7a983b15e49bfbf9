#!/usr/bin/env bash
# The paper harness refuses numeric flags it cannot run with (exit 2, naming
# the flag) before making its output folder: --world=0 and --world=-3 ran
# every configuration into an error row, wrote the tables and exited 0;
# --limits=abc was read as 0 (limiter off), and 0 itself meant off where the
# C ABI's 0 means the default.
set -euo pipefail
paper="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
source tests/util/expect_refusal.sh
expect_bad() {
  local what="$1"; shift
  rm -rf "$tmp/out"
  expect_refusal 2 "$what" "$paper" --quick --plots=false --sim_profile= --out="$tmp/out" "$@"
  [[ ! -e "$tmp/out" ]] || { echo "FAIL: $* made the output folder" >&2; exit 1; }
}
expect_bad "paper: --world must be in \[1, 1024\], got 0" --world=0
expect_bad "paper: --world must be in \[1, 1024\], got -3" --world=-3
expect_bad "--warmup must be >= 0" --warmup=-1
expect_bad "--steps must be >= 0" --steps=-2
expect_bad "--batch_size must be >= 0" --batch_size=-1
expect_bad "--comm_ratio must be a finite number" --comm_ratio=nan
expect_bad "--limits: 'abc' is not an all_gather_limit" --limits=abc
# 0 meant off here and the default (2) in the C ABI: refused, naming off.
expect_bad "--limits: '0' is not an all_gather_limit: write off" --limits=off,0
# Valid: only the (empty) simulated part, in well under a second.
"$paper" --measured=false --plots=false --sim_profile= --out="$tmp/ok" > /dev/null
[[ -d "$tmp/ok" ]] || { echo "FAIL: a valid run made no output folder" >&2; exit 1; }
echo PASS
