#!/usr/bin/env bash
# //tools:plan as a user runs it: the same request twice prints the same
# bytes (table and JSON), the header says what was simulated, --trace writes
# a trace, and bad flags fail with a message naming them (exit 2).
set -euo pipefail
plan="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
source tests/util/expect_refusal.sh
args=(--model=gpt-1m --gpus=16 --gpus_per_node=8 --profile=a100-80g --batch=2
      --strategies=DDP,FULL_SHARD,HYBRID_SHARD --dtypes=bf16 --checkpointing=off --offload=off
      --forward_prefetch=off --rate_limits=2)
"$plan" "${args[@]}" > "$tmp/a.txt" 2> "$tmp/a.err"
"$plan" "${args[@]}" > "$tmp/b.txt" 2> /dev/null
cmp "$tmp/a.txt" "$tmp/b.txt" || { echo "FAIL: two runs of the same plan differ" >&2; exit 1; }
grep -q "gpt-1m on 16 GPUs (2 nodes x 8), batch 2 per GPU; simulated, profile a100-80g" "$tmp/a.txt" ||
  { cat "$tmp/a.txt"; echo "FAIL: header" >&2; exit 1; }
grep -q "^recommended: " "$tmp/a.txt" || { echo "FAIL: no recommendation" >&2; exit 1; }
grep -q "^planned .* candidates in" "$tmp/a.err" || { echo "FAIL: no timing on stderr" >&2; exit 1; }
"$plan" "${args[@]}" --json > "$tmp/a.json" 2> /dev/null
"$plan" "${args[@]}" --json > "$tmp/b.json" 2> /dev/null
cmp "$tmp/a.json" "$tmp/b.json" || { echo "FAIL: two JSON runs differ" >&2; exit 1; }
grep -q '"simulated": true' "$tmp/a.json" || { echo "FAIL: JSON" >&2; exit 1; }
"$plan" "${args[@]}" --trace="$tmp/trace.json" > /dev/null 2>&1
[[ -s "$tmp/trace.json" ]] || { echo "FAIL: no trace written" >&2; exit 1; }
# Selective checkpointing is searched when listed, labelled sel-ckpt.
"$plan" "${args[@]/--checkpointing=off/--checkpointing=off,selective}" > "$tmp/sel.txt" 2> /dev/null
grep -q "FULL_SHARD .*sel-ckpt" "$tmp/sel.txt" || { cat "$tmp/sel.txt"; echo "FAIL: no sel-ckpt candidate" >&2; exit 1; }
if grep -q "sel-ckpt" "$tmp/a.txt"; then echo "FAIL: selective in a plan that did not ask" >&2; exit 1; fi
# Selective with the attention recomputed too: sel-ckpt+attn.
"$plan" "${args[@]/--checkpointing=off/--checkpointing=selective_attention}" --top=0 > "$tmp/attn.txt" 2> /dev/null
grep -q "FULL_SHARD .*sel-ckpt+attn" "$tmp/attn.txt" ||
  { cat "$tmp/attn.txt"; echo "FAIL: no sel-ckpt+attn candidate" >&2; exit 1; }
# --help lists the planner's flags under its usage line, not glog's.
set +e
"$plan" --help > "$tmp/help.txt" 2>&1
set -e
grep -q -- "-model (model config name" "$tmp/help.txt" || { cat "$tmp/help.txt"; echo "FAIL: --help lacks --model" >&2; exit 1; }
grep -q "^plan: plan --model=NAME" "$tmp/help.txt" || { echo "FAIL: --help lacks the usage line" >&2; exit 1; }
if grep -q "alsologtoemail" "$tmp/help.txt"; then echo "FAIL: --help lists glog's flags" >&2; exit 1; fi
expect_bad() { local what="$1"; shift; expect_refusal 2 "$what" "$plan" "$@"; }
expect_bad "--model is required" --gpus=8
expect_bad "ZERO4" --model=gpt-1m --strategies=ZERO4
expect_bad "rate_limits" --model=gpt-1m --rate_limits=two
expect_bad "--checkpointing: 'partial' is not off, on, selective, selective_attention or selective_matmuls" --model=gpt-1m --checkpointing=partial
expect_bad "gpus_per_node" --model=gpt-1m --gpus=12 --gpus_per_node=8
expect_bad "no-such-model" --model=no-such-model
# 2^31 - 1 steps recommended "0.000 s/step" in a hundredth of a second.
expect_bad "steps must be in \[1, 1000\]" --model=gpt-1m --steps=2147483647
expect_bad "warmup_steps must be in \[0, 1000\]" --model=gpt-1m --warmup_steps=2147483647
# Out of int's range is said so (it read "is not a number").
expect_bad "'99999999999' is out of range" --model=gpt-1m --shard_group_sizes=99999999999
echo PASS
