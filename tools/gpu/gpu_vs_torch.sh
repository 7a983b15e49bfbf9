#!/usr/bin/env bash
# shardkit against PyTorch FSDP2 on the GPU, side by side in one call
# (benchmarks/torch_compare/gpu_vs_torch.py, packed in extra/ with its
# helpers), against the package's lib/libshardkit.so, in the host's Python
# that has torch (torch_env.sh):
#
#   gpu-pkg/gpu_vs_torch.sh                         # gpt-150m and gpt-1.3b, ~4 min on an H100
#   gpu-pkg/gpu_vs_torch.sh --quick --models gpt-150m
#
# Writes gpu_vs_torch.json and gpu_vs_torch.md into $OUT (the device tool's
# returned folder) or --out. Only the shardkit processes get the package's
# libraries on their LD_LIBRARY_PATH; PyTorch's run on the host's own.
set -euo pipefail
PKG=$(cd "$(dirname "$0")" && pwd)
source "$PKG/torch_env.sh"  # sets TORCH_PY, SK_HOST_LIBDIR, SK_HOST_LIBPATH
trap 'rm -rf "$SK_HOST_LIBDIR"' EXIT
SK_SHARDKIT_LD_LIBRARY_PATH="$SK_HOST_LIBPATH" "$TORCH_PY" "$PKG/extra/gpu_vs_torch.py" \
  --lib "$PKG/lib/libshardkit.so" --manifest "$PKG/MANIFEST" "$@"
