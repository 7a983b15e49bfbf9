#!/usr/bin/env bash
# The one prepared call for a lent GPU machine: everything the open GPU
# issues need proven, inside a time budget, results under $OUT.
#
#   tools/gpu/device_run.sh [PACKAGE.tar.xz]     # default: gpu-pkg.tar.xz at the repository root
#
# Order (each phase bounded; a phase that runs out of time is cut and says so):
#   0. versions: the GPU, driver, the NCCL and cuDNN the binaries load;
#   1. in parallel: the multi-GPU suite (nccl_suite.sh: NCCL ranks sharing
#      the GPU, and capi_nccl_check: the C ABI's caller collectives and a
#      custom optimizer step over NCCL; mostly host-bound) and the
#      single-process GPU tests (run.sh's test binaries: the whole
#      conformance suite, sdpa_plan_test, equivalence, stream interop,
#      packed documents: packed_documents_cuda_test and the conformance
#      suite's PackedDocuments and Rope-at-positions cases, never run yet);
#      about 4 minutes;
#   2. alone on the GPU: the PyTorch side-by-side (gpu_vs_torch.sh), about
#      4 minutes;
#   3. alone on the GPU: the conformance suite's epilogue cases (GEMM +
#      bias, + residual, + GELU, GELU's gradient) with the fused epilogues
#      on, then gpu_train's gpt-1.3b and llama3.2-1b FULL_SHARD bf16 rows
#      with the per-op device-time breakdown, fused epilogues on and off
#      (epilogue_ab.sh; SK_AB_FILTER, SK_AB_RUNS), about 3 minutes.
# Each part fits one device call: SK_DEVICE_PHASES=0,1 then 2 then 3 (a
# retry runs only what failed); all of them by default.
# SK_NCCL_BUDGET, SK_TESTS_BUDGET, SK_TORCH_BUDGET, SK_AB_BUDGET bound the
# phases in seconds; SK_TORCH_ARGS passes flags to gpu_vs_torch (--quick
# --models ...).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ARCHIVE=${1:-$ROOT/gpu-pkg.tar.xz}
OUT=${OUT:-$ROOT/device-out}
PHASES=${SK_DEVICE_PHASES:-0,1,2,3}
mkdir -p "$OUT"
T0=$SECONDS
stamp() { echo "[$((SECONDS - T0)) s] $*"; }

WORK=$(mktemp -d /tmp/skgpu.XXXXXX)
tar -xJf "$ARCHIVE" -C "$WORK" || { echo "device_run: cannot unpack $ARCHIVE" >&2; exit 1; }
PKG=$WORK/gpu-pkg
cp "$PKG/MANIFEST" "$OUT/MANIFEST"
stamp "unpacked $(head -1 "$PKG/MANIFEST")"

if [[ ",$PHASES," == *",0,"* ]]; then
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    source "$PKG/libpath.sh"
    echo "LIBPATH=$LIBPATH"
    # The NCCL and cuDNN the binaries load: the first of each on LIBPATH,
    # with the file its soname link resolves to (the version is in its name).
    for lib in libnccl.so.2 libcudnn.so.9; do
      for d in ${LIBPATH//:/ }; do
        [[ -e "$d/$lib" ]] && { echo "$lib -> $(readlink -f "$d/$lib")"; break; }
      done
    done
    # PyTorch's own (torch_env.sh's choice of Python: its venv first).
    for py in ${SK_TORCH_PYTHON:-} /opt/torch/.venv/bin/python python3; do
      command -v "$py" >/dev/null || continue
      "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "nccl", torch.cuda.nccl.version())' 2>/dev/null && break
    done
  } > "$OUT/versions.txt" 2>&1
  stamp "versions"; cat "$OUT/versions.txt"
fi

if [[ ",$PHASES," == *",1,"* ]]; then
  ( OUT=$OUT timeout -k 10 ${SK_NCCL_BUDGET:-240} "$PKG/nccl_suite.sh" > "$OUT/nccl_suite.log" 2>&1
    echo "nccl_suite exit $?" >> "$OUT/phases.txt" ) &
  nccl_pid=$!
  ( OUT=$OUT SK_GPU_SUITE=gpu SK_GPU_TEST_TIMEOUT=${SK_TEST_BUDGET:-200} SK_GPU_SKIP_BENCH=1 \
      timeout -k 10 ${SK_TESTS_BUDGET:-260} "$PKG/run.sh" > "$OUT/run_tests.log" 2>&1
    echo "run.sh tests exit $?" >> "$OUT/phases.txt" ) &
  tests_pid=$!
  wait "$nccl_pid" "$tests_pid"
  stamp "phase 1 done"; cat "$OUT/phases.txt"; cat "$OUT/nccl/summary.txt" 2>/dev/null | tail -40
fi

if [[ ",$PHASES," == *",2,"* ]]; then
  if [[ -x "$PKG/gpu_vs_torch.sh" ]]; then
    budget=${SK_TORCH_BUDGET:-220}
    # shellcheck disable=SC2086  # SK_TORCH_ARGS is a list of flags
    OUT=$OUT timeout -k 10 "$budget" "$PKG/gpu_vs_torch.sh" --deadline $((budget - 20)) ${SK_TORCH_ARGS:-} \
      > "$OUT/gpu_vs_torch.log" 2>&1
    echo "gpu_vs_torch exit $?" >> "$OUT/phases.txt"
    stamp "side-by-side done"; tail -30 "$OUT/gpu_vs_torch.log"
  fi
fi

if [[ ",$PHASES," == *",3,"* && -x "$PKG/epilogue_ab.sh" ]]; then
  # The fused epilogues' conformance cases with the switch on (phase 1 ran
  # the suite with it off): bias, bias + residual, GELU forward and
  # backward; a failure message names the two-rounding candidate.
  source "$PKG/libpath.sh"  # sets LIBPATH
  SK_CUDA_FUSED_EPILOGUES=1 timeout -k 5 90 "$PKG/lib/ld-linux-x86-64.so.2" --library-path "$LIBPATH" \
    "$PKG/bin/conformance_test" --gtest_filter='*GemmBias*:*Gelu*' > "$OUT/conformance_fused.log" 2>&1
  echo "conformance_test with SK_CUDA_FUSED_EPILOGUES=1 exit $?" >> "$OUT/phases.txt"
  grep -E "^\[  (PASSED|FAILED) |Failure|would give" "$OUT/conformance_fused.log" | head -20
  # The fused CUDA epilogues against the unfused path (SK_CUDA_FUSED_EPILOGUES),
  # with the per-op device-time breakdown, on gpt-1.3b and the Llama row.
  OUT=$OUT SK_GPU_TRAIN_STEPS=${SK_GPU_TRAIN_STEPS:-5} SK_AB_RUNS=${SK_AB_RUNS:-fused:1 unfused:0} \
    timeout -k 10 ${SK_AB_BUDGET:-170} "$PKG/epilogue_ab.sh" \
    "${SK_AB_FILTER:-(gpt-1.3b|llama3.2-1b)/w1/fsdp/bf16/iter}" > "$OUT/epilogue_ab.log" 2>&1
  echo "epilogue_ab exit $?" >> "$OUT/phases.txt"
  stamp "epilogue A/B done"
  grep -h -E "BM_Train|op breakdown|sum_of_squares|adamw_update" "$OUT"/epilogue_ab/*.txt 2>/dev/null | head -30
fi
cp "$OUT/nccl/summary.txt" "$OUT/nccl_summary.txt" 2>/dev/null
# The device tool returns only a few files: everything goes into one
# archive (checkpoints left out), with the tables beside it.
tar czf "$WORK/results.tgz" -C "$OUT" --exclude=./nccl/ckpt . 2>/dev/null
find "$OUT" -mindepth 1 -maxdepth 1 ! -name gpu_vs_torch.md ! -name gpu_vs_torch.json ! -name report.md \
  ! -name nccl_summary.txt -exec rm -rf {} +
mv "$WORK/results.tgz" "$OUT/results.tgz"
stamp "end: $OUT/results.tgz"
