#!/usr/bin/env bash
# //benchmarks:step_breakdown reads --world, --batch and --steps exactly:
# atoi read --world=4294967297 as world 1 and --world=abc as 0; now each is
# refused (exit 1) with the flag and its range, before anything is measured.
set -euo pipefail
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
source tests/util/expect_refusal.sh
expect_bad() {
  local what="$1"; shift
  expect_refusal 1 "$what" "$bin" "$@"
  if grep -q "FMA peak" "$tmp/out.txt"; then echo "FAIL: $* measured before refusing" >&2; exit 1; fi
}
expect_bad "--world='4294967297' is not a whole number in \[1, 1024\]" --world=4294967297
expect_bad "--world='abc' is not a whole number" --world=abc
expect_bad "--world='-2' is not a whole number" --world=-2
expect_bad "--batch='0' is not a whole number in \[1, 1048576\]" --batch=0
expect_bad "--steps='1x' is not a whole number" --steps=1x
# Every op the models run goes through the timing decorator: a Llama step
# failed with "cross_entropy_rows is not implemented by the cpu op backend"
# once the fused classifier's ops were not forwarded.
if ! "$bin" --models=llama-tiny --modes=FULL_SHARD --world=1 --batch=2 --steps=1 > "$tmp/llama.txt" 2>&1; then
  cat "$tmp/llama.txt" >&2
  echo "FAIL: a llama-tiny step did not run" >&2
  exit 1
fi
for row in rms_norm_fwd swiglu_fwd cross_entropy_mean; do
  grep -q "^  $row " "$tmp/llama.txt" || { cat "$tmp/llama.txt" >&2; echo "FAIL: no $row row" >&2; exit 1; }
done
echo PASS
