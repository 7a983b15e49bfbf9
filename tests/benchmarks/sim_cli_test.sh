#!/usr/bin/env bash
# //benchmarks:sim_collectives and //benchmarks:sim_validate read world sizes
# exactly: --ranks=4294967304 ran as 8 ranks, --worlds=4294967297 as world 1
# and --worlds=abc as world 0 (every configuration failed, exit 0).
set -euo pipefail
sim_collectives="$1"
sim_validate="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
source tests/util/expect_refusal.sh
expect_refusal 1 "--ranks: '4294967304' is not an integer in \[1, 1048576\]" \
  "$sim_collectives" --ranks=4294967304 --sizes=65536 --ops=all_reduce
expect_refusal 1 "--ranks: '99999999999999999999' is not an integer" \
  "$sim_collectives" --ranks=99999999999999999999 --sizes=65536 --ops=all_reduce
expect_refusal 1 "--sizes: 'x' is not an integer" "$sim_collectives" --ranks=8 --sizes=x --ops=all_reduce
"$sim_collectives" --ranks=8 --sizes=65536 --ops=all_reduce > "$tmp/ok.txt"
grep -q "^     8      1 all_reduce  *65536 " "$tmp/ok.txt" || { cat "$tmp/ok.txt"; echo "FAIL: no row" >&2; exit 1; }
expect_refusal 2 "--worlds: 'abc' is not a world size in \[1, 1024\]" "$sim_validate" --worlds=abc --models=gpt-1m --steps=1
expect_refusal 2 "--worlds: '4294967297' is not a world size" "$sim_validate" --worlds=4294967297 --models=gpt-1m --steps=1
expect_refusal 2 "--worlds: '0' is not a world size" "$sim_validate" --worlds=0 --models=gpt-1m --steps=1
# A --csv or --report that cannot be written fails the run (it printed
# "cannot write" and exited 0).
expect_refusal 1 "sim_validate: cannot write --csv=/nonexistent-dir/v.csv" \
  "$sim_validate" --worlds=1 --models=gpt-1m --steps=1 --csv=/nonexistent-dir/v.csv
echo PASS
