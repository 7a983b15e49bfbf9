#!/usr/bin/env bash
# //benchmarks:collectives refuses bad flag values with a message naming the
# flag (exit 1) before it measures anything. They used to abort with an
# uncaught exception (--ranks=abc, --ranks=-1, --sizes=abc, --memcpy_bytes=-1),
# crash (--sizes=-1, --iters and --warmup at 2^31 - 1: SIGSEGV), allocate
# gigabytes (--ranks=64: 5.9 GB, then std::bad_alloc) or measure the wrong
# size (--sizes=1e9 ran 0 bytes).
set -euo pipefail
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
source tests/util/expect_refusal.sh
expect_bad() { local what="$1"; shift; expect_refusal 1 "$what" "$bin" "$@"; }
quick=(--backends=local --ops=all_reduce --sizes=4096 --memcpy_bytes=1024)
expect_bad "--ranks: 'abc' is not a rank count" "${quick[@]}" --ranks=abc
expect_bad "--ranks: '-1' is not a rank count" "${quick[@]}" --ranks=-1
expect_bad "--ranks: '0' is not a rank count" "${quick[@]}" --ranks=0
expect_bad "--ranks: '100000' is not a rank count in \[1, 256\]" "${quick[@]}" --ranks=100000
expect_bad "--sizes: '1e9' is not a byte count" --backends=local --ranks=2 --memcpy_bytes=1024 --sizes=1e9
expect_bad "--sizes: '-1' is not a byte count" --backends=local --ranks=2 --memcpy_bytes=1024 --sizes=-1
expect_bad "--sizes: 'abc' is not a byte count" --backends=local --ranks=2 --memcpy_bytes=1024 --sizes=abc
expect_bad "--memcpy_bytes=-1 must be >= 0" --backends=local --ranks=2 --sizes=4096 --memcpy_bytes=-1
expect_bad "--memcpy_bytes=100000000000" --backends=local --ranks=2 --sizes=4096 --memcpy_bytes=100000000000
expect_bad "--memcpy_bytes=67108864 must be >= 0 and at most 16777216 with --ranks up to 64" \
  --backends=local --ranks=64 --sizes=4096
expect_bad "--iters must be in" "${quick[@]}" --ranks=2 --iters=2147483647 --warmup=2147483647
expect_bad "--backends: unknown backend 'foo'" "${quick[@]}" --ranks=2 --backends=foo
expect_bad "--ops: unknown collective 'foo'" "${quick[@]}" --ranks=2 --ops=foo
expect_bad "--network_model" "${quick[@]}" --ranks=2 --network_model=garbage
# Valid flags still measure.
"$bin" "${quick[@]}" --ranks=2 --iters=1 --warmup=0 > "$tmp/ok.txt"
grep -q "^all_reduce  *4096 " "$tmp/ok.txt" || { cat "$tmp/ok.txt"; echo "FAIL: no all_reduce row" >&2; exit 1; }
echo PASS
