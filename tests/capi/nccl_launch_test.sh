#!/usr/bin/env bash
# examples/c/train_gpt_nccl under the launcher, two processes. With a GPU
# and a CUDA build it trains (rank 0 prints 8 steps, ranks sharing the GPU
# through launch --share_gpu); elsewhere every rank fails cleanly, saying
# why: UNAVAILABLE "built without CUDA" without --config=cuda, "not a usable
# GPU" on a CUDA build without a GPU. Never a crash or a hang.
#   nccl_launch_test.sh LAUNCH TRAIN_GPT_NCCL
set -uo pipefail
launch="$1" program="$2"
out="${TEST_TMPDIR:-$(mktemp -d)}/nccl.log"
timeout 120 "$launch" --nproc_per_node=2 --share_gpu=0 --master_port=0 "$program" >"$out" 2>&1
rc=$?
if [[ $rc == 0 ]]; then
  steps=$(grep -c '^\[rank 0\] step [0-9]* global loss' "$out")
  [[ $steps == 8 ]] || { echo "FAIL: rank 0 printed $steps steps" >&2; cat "$out" >&2; exit 1; }
  echo "PASS: trained over NCCL"
  exit 0
fi
if [[ $rc != 1 ]]; then
  echo "FAIL: launch exited $rc (a crash, a signal or a hang), not 1" >&2
  cat "$out" >&2
  exit 1
fi
if grep -q "UNAVAILABLE: sk_process_group_create_nccl: this libshardkit was built without CUDA" "$out" ||
   grep -q "UNAVAILABLE: nccl group: cuda:0 is not a usable GPU" "$out"; then
  echo "PASS: refused cleanly: $(grep -m1 UNAVAILABLE "$out")"
  exit 0
fi
echo "FAIL: no clear UNAVAILABLE message" >&2
cat "$out" >&2
exit 1
