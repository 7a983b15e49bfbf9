#!/usr/bin/env bash
# The A/B of the CUDA backend's fused GEMM epilogues (docs/cuda.md,
# SK_CUDA_FUSED_EPILOGUES) in one device call: gpu_train's bf16 world-1 rows
# with the per-op device-time breakdown (SK_GPU_TRAIN_OP_BREAKDOWN=1), run
# fused (SK_CUDA_FUSED_EPILOGUES=1), unfused (=0, the default), then fused
# again, so drift between runs shows beside the difference.
#
#   gpu-pkg/epilogue_ab.sh ['BENCHMARK_FILTER']   # default 'w1/(fsdp|ddp)/bf16/iter'
#
# Writes $OUT/epilogue_ab/{fused,unfused,fused_again}.txt (gpu_train's
# console table and each row's breakdown), or under gpu-pkg/report without
# $OUT. SK_GPU_TRAIN_STEPS and SK_GPU_TRAIN_SIM_PROFILE pass through.
set -uo pipefail
PKG=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PKG/report}
dir="$OUT/epilogue_ab"
mkdir -p "$dir"
filter=${1:-'w1/(fsdp|ddp)/bf16/iter'}
source "$PKG/libpath.sh"  # sets LIBPATH
launch=("$PKG/lib/ld-linux-x86-64.so.2" --library-path "$LIBPATH")
status=0
# SK_AB_RUNS: the runs, as NAME:SWITCH words (default all three).
for run in ${SK_AB_RUNS:-fused:1 unfused:0 fused_again:1}; do  # (unset = unfused since 27 Nov)
  name=${run%%:*}
  echo "epilogue_ab: $name (SK_CUDA_FUSED_EPILOGUES=${run##*:})"
  SK_CUDA_FUSED_EPILOGUES=${run##*:} SK_GPU_TRAIN_OP_BREAKDOWN=1 \
    "${launch[@]}" "$PKG/bin/gpu_train" --benchmark_filter="$filter" > "$dir/$name.txt" 2>&1 ||
    status=$?
done
exit "$status"
