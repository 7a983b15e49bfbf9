#!/usr/bin/env bash
# //tools:train refuses flag values it cannot run with a message naming
# the flag (exit 1), quickly and without growing: --log_every=0 was a
# division by zero (SIGFPE), --batch_size=2147483647 an uncaught
# std::bad_alloc, --synthetic_tokens=1000000000 took 28 s and 7.9 GB, and
# --gemm_threads=2147483647 made libgomp exit with "Out of memory".
set -euo pipefail
train="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
source tests/util/expect_refusal.sh
expect_bad() { local what="$1"; shift; expect_refusal 1 "$what" "$train" "$@"; }
expect_bad "--log_every must be >= 1" --log_every=0 --steps=2
expect_bad "--steps must be >= 0" --steps=-1
expect_bad "--synthetic_tokens must be in \[0, 67108864\]" --synthetic_tokens=1000000000 --steps=1
expect_bad "--batch_size must be >= 1" --batch_size=0
expect_bad "does not fit in host memory" --batch_size=2147483647 --steps=1
expect_bad "GEMM thread count must be in \[1, 1024\]" --gemm_threads=2147483647 --steps=1
expect_bad "--gemm_threads must be >= 0" --gemm_threads=-1 --steps=1
expect_bad "--checkpointing: 'sometimes' is not off, on" --checkpointing=sometimes --steps=1
# Selective checkpointing where the model has none (T5) or without selective.
expect_bad "does not implement selective" --model=t5-tiny --checkpointing=selective --steps=1
expect_bad "recompute_attention applies only" --model=gpt-tiny --recompute_attention --steps=1
# Datasets read in order (docs/data.md): bad flags and files name themselves.
printf '{"input_ids": [1, 2, 3, 4], "labels": [-100, 2, 3, 4]}\n{"input_ids": [5, 6]}\n' > "$tmp/sft.jsonl"
printf '{"input_ids": [1, 2\n' > "$tmp/broken.jsonl"
expect_bad "give --data or --dataset" --data=x.bin --dataset="$tmp/sft.jsonl" --steps=1
expect_bad "--dataset_format must be tokens or jsonl" --dataset="$tmp/sft.jsonl" --dataset_format=csv --steps=1
expect_bad "broken.jsonl' line 1 is not valid JSON" --model=gpt-tiny --dataset="$tmp/broken.jsonl" \
  --dataset_format=jsonl --steps=1
expect_bad "decoder-only" --model=t5-tiny --dataset="$tmp/sft.jsonl" --dataset_format=jsonl --steps=1
"$train" --model=gpt-tiny --dataset="$tmp/sft.jsonl" --dataset_format=jsonl --eos_id=0 --batch_size=2 \
  --steps=2 --log_every=1 > "$tmp/sft.txt"
grep -q "^dataset: 2 documents, 2 samples per epoch" "$tmp/sft.txt" || { cat "$tmp/sft.txt"; echo "FAIL: dataset" >&2; exit 1; }
grep -q "^step     2  loss" "$tmp/sft.txt" || { cat "$tmp/sft.txt"; echo "FAIL: no dataset step" >&2; exit 1; }
# Valid flags still train; every checkpointing policy computes the same loss.
for policy in off on selective selective_matmuls; do
  "$train" --model=llama-tiny --steps=2 --log_every=1 --checkpointing=$policy > "$tmp/$policy.txt"
  grep "^step" "$tmp/$policy.txt" | sed 's/tokens.*//' > "$tmp/$policy.loss"
done
"$train" --model=llama-tiny --steps=2 --log_every=1 --checkpointing=selective --recompute_attention |
  grep "^step" | sed 's/tokens.*//' > "$tmp/attention.loss"
for policy in on selective selective_matmuls attention; do
  cmp "$tmp/off.loss" "$tmp/$policy.loss" || { cat "$tmp/off.loss" "$tmp/$policy.loss"; echo "FAIL: $policy" >&2; exit 1; }
done
grep -q "^step     2  loss" "$tmp/off.loss" || { cat "$tmp/off.txt"; echo "FAIL: no step 2 line" >&2; exit 1; }
"$train" --model=gpt-tiny --steps=2 --log_every=1 > "$tmp/ok.txt"
grep -q "^step     2  loss" "$tmp/ok.txt" || { cat "$tmp/ok.txt"; echo "FAIL: no step 2 line" >&2; exit 1; }
echo PASS
