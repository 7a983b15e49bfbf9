#!/usr/bin/env bash
# Builds the GPU suite on this (development) machine and packs it, with every
# shared library it needs except the GPU driver's and the CUDA toolkit's big
# libraries, into one small self-contained directory for the GPU machine.
#
#   tools/gpu/package.sh [PKG_DIR]      # default: gpu-pkg/ at the repository root
#
# The GPU machine gets a copy of the repository's working tree plus ignored
# paths carried explicitly (64 MiB in all), and has no Bazel and no package
# registry: carry PKG_DIR.tar.xz (git-ignored; the unpacked directory is
# too big) and run `tar xf gpu-pkg.tar.xz && gpu-pkg/run.sh` there
# (docs/cuda.md). What goes in:
#   bin/   the test and benchmark binaries, stripped;
#   cpu/   the simulator's CPU calibration and validation (CPU programs:
#          run.sh runs calibrate, then sim_validate with the fresh profile);
#   lib/   their shared libraries from `ldd` here (Debian's libstdc++, glibc and
#          its loader, glog, gflags, gloo, oneDNN, OpenBLAS, gtest, benchmark,
#          libcudart...), so the binaries run on a machine not provisioned
#          from Debian: run.sh starts each through the packed loader;
#   run.sh, MANIFEST (the commit, the build, every file's size);
#   gpu_vs_torch.sh (shardkit against PyTorch FSDP2 on the GPU) and
#   torch_compare.sh (the same on the CPU), with their Python in extra/;
#   kernel_sweep.sh (the simulator profiles' kernel efficiencies, torch only).
# Left out on purpose: the driver (libcuda, libnvidia-*: the GPU machine's
# own must be used), and cuBLAS/cuBLASLt/NCCL/cuDNN (hundreds of MiB; the GPU
# machine has the CUDA libraries, and run.sh finds them there).
set -euo pipefail
cd "$(dirname "$0")/../.."
PKG=${1:-gpu-pkg}
LIMIT_MIB=48  # leaves room under the 64 MiB carry limit

# Binaries of the GPU suite: label -> name in bin/. Every test skips cleanly
# without a GPU, so run.sh can also be tried here.
TESTS=(
  //tests/ops:conformance_test
  //tests/ops:sdpa_plan_test
  //tests/ops:cuda_handles_test
  //tests/ops:init_test
  //tests/comm:local_cuda_test
  //tests/comm:nccl_test
  //tests/comm:local_stream_ordered_test
  //tests/cuda:fsdp_equivalence_cuda_test
  //tests/cuda:engine_stream_cuda_test
  //tests/cuda:packed_documents_cuda_test
  //tests/cuda:trainer_oom_cuda_test
  # CPU tests that matter on the GPU host: its CPU has bf16 hardware (AMX),
  # so oneDNN's bf16 matmul runs there, the CPU reference of the bf16
  # equivalence cases; the development machines have none.
  //tests/ops:cpu_kernels_test
  //tests/train:bf16_determinism_test
  //tests/frontends:cpp_frontend_test
)
BENCHES=(
  //benchmarks/gpu:gpu_gemm
  //benchmarks/gpu:gpu_train
)
# CPU tools packed into extra/ for measurements on the GPU host's 16 cores
# (AMX and avx512_bf16, which the development machines lack); run.sh does not
# run them: the device call names what it wants, e.g.
#   gpu-pkg/extra.sh step_breakdown --models=gpt-10m --param_dtype=bf16
EXTRAS=(
  //benchmarks/micro:step_breakdown
)
# CPU programs with their own flags, which run.sh runs after the suite (not
# Google Benchmark): the simulator's cpu-local calibration and its validation
# against real CPU training (docs/planner.md, "How far to trust it"), for the
# GPU host's idle many-core CPU.
CPU_BENCHES=(
  //benchmarks/sim:calibrate
  //benchmarks/sim:sim_validate
)

# The multi-GPU suite (nccl_suite.sh): the launcher and the programs it
# starts, one process per rank, packed into mp/ (run.sh does not run them).
MULTI_PROCESS=(
  //tools:launch
  //tests/cuda:nccl_train_check
  //tests/cuda:capi_nccl_check
  //examples/c:train_gpt_nccl
)

# The C ABI library and the Lua frontend's generated cdef, for the frontends'
# tests (below).
FRONTEND_TARGETS=(//capi:libshardkit.so //frontends/lua:shardkit_cdef)

echo "package: building ${#TESTS[@]} tests and ${#BENCHES[@]} benchmarks with --config=cuda -c opt"
./bazelw build --config=cuda -c opt "${TESTS[@]}" "${BENCHES[@]}" "${EXTRAS[@]}" "${CPU_BENCHES[@]}" \
  "${MULTI_PROCESS[@]}" "${FRONTEND_TARGETS[@]}"
BIN_DIR=$(./bazelw info --config=cuda -c opt bazel-bin 2>/dev/null)

rm -rf "$PKG"
mkdir -p "$PKG/bin" "$PKG/lib"
binaries=()
mkdir -p "$PKG/extra" "$PKG/cpu" "$PKG/mp"
pack() {  # pack LABEL DIR
  local rel=${1#//}
  local path="$BIN_DIR/${rel/://}"
  [[ -x "$path" ]] || { echo "package: $1 did not produce $path" >&2; exit 1; }
  local name=${rel##*:}
  cp -L "$path" "$PKG/$2/$name"
  chmod u+w "$PKG/$2/$name"
  # Debug info out, the symbol table kept: a hung binary's stacks (run.sh
  # attaches cuda-gdb) then name its functions.
  strip --strip-debug "$PKG/$2/$name"
  binaries+=("$path")  # ldd'd in place: Bazel's solib RPATHs resolve there
}
for label in "${TESTS[@]}" "${BENCHES[@]}"; do pack "$label" bin; done
for label in "${EXTRAS[@]}"; do pack "$label" extra; done
for label in "${CPU_BENCHES[@]}"; do pack "$label" cpu; done
for label in "${MULTI_PROCESS[@]}"; do pack "$label" mp; done

# The frontends on the GPU: the Rust crate's test binaries (cargo test
# --no-run here, linked against the CUDA build of libshardkit.so) and the Lua
# frontend with its test under LuaJIT (Debian's luajit links only glibc). The
# GPU machine has neither cargo nor LuaJIT; run.sh runs both there against
# the packed lib/libshardkit.so, and their CUDA tests train on the GPU.
mkdir -p "$PKG/frontends/rust" "$PKG/frontends/lua"
PKG_ABS=$(cd "$PKG" && pwd)
cp -L "$BIN_DIR/capi/libshardkit.so" "$PKG/lib/libshardkit.so"
chmod u+w "$PKG/lib/libshardkit.so"
binaries+=("$BIN_DIR/capi/libshardkit.so")
cp frontends/lua/shardkit.lua "$BIN_DIR/frontends/lua/shardkit_cdef.lua" \
   tests/frontends/lua_frontend_test.lua "$PKG/frontends/lua/"
cp -L "$(command -v luajit)" "$PKG/frontends/lua/luajit"
(
  export TEST_TMPDIR
  TEST_TMPDIR=$(mktemp -d)
  trap 'rm -rf "$TEST_TMPDIR"' EXIT
  source tests/frontends/cargo_env.sh
  export SK_LIB_DIR="$BIN_DIR/capi"
  cd "$CRATE_DIR"
  "$CARGO" test --offline --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        kind, name = m["target"]["kind"], m["target"]["name"]
        if kind == ["test"] or (kind == ["example"] and name == "train_gpt_nccl"):
            print(kind[0], name, m["executable"])
' > "$TEST_TMPDIR/rust_tests"
  grep -q "^test " "$TEST_TMPDIR/rust_tests" || { echo "package: cargo built no Rust test binary" >&2; exit 1; }
  grep -q "^example " "$TEST_TMPDIR/rust_tests" || { echo "package: cargo built no train_gpt_nccl example" >&2; exit 1; }
  # Tests into frontends/rust (run.sh runs them); the NCCL example into mp/
  # beside the C one (nccl_suite.sh starts it under the launcher).
  while read -r kind name exe; do
    dest="$PKG_ABS/frontends/rust/$name"
    [[ "$kind" == example ]] && dest="$PKG_ABS/mp/rust_$name"
    cp "$exe" "$dest"
    strip --strip-debug "$dest"
  done < "$TEST_TMPDIR/rust_tests"
)
cp capi/include/shardkit/shardkit.h capi/abi_layout.h "$PKG/frontends/rust/"

# Shared libraries, by the paths this machine resolves them to.
skip_re='^(libcuda\.|libnvidia-|libcublas|libcublasLt|libnccl|libcudnn)'
declare -A seen=()
for b in "${binaries[@]}"; do
  while read -r name path; do
    [[ "$name" =~ $skip_re || -n "${seen[$name]:-}" ]] && continue
    if [[ "$path" != /* ]]; then
      echo "package: $b needs $name, which does not resolve here" >&2
      exit 1
    fi
    seen[$name]=1
    cp -L "$path" "$PKG/lib/$name"
    chmod u+w "$PKG/lib/$name"
    strip --strip-unneeded "$PKG/lib/$name" 2>/dev/null || true
  done < <(ldd "$b" | awk '$2 == "=>" {print $1, $3}')
done
# The loader itself (ldd lists it by its absolute path).
loader=$(ldd "${binaries[0]}" | awk '/ld-linux/ {print ($3 ? $3 : $1)}' | head -1)
cp -L "$loader" "$PKG/lib/ld-linux-x86-64.so.2"

cp tools/gpu/run.sh tools/gpu/extra.sh tools/gpu/libpath.sh tools/gpu/report.py \
  tools/gpu/torch_env.sh tools/gpu/torch_compare.sh tools/gpu/gpu_vs_torch.sh tools/gpu/nccl_suite.sh \
  tools/gpu/probe.sh tools/gpu/epilogue_ab.sh tools/gpu/kernel_sweep.sh "$PKG/"
chmod +x "$PKG/run.sh" "$PKG/extra.sh" "$PKG/torch_compare.sh" "$PKG/gpu_vs_torch.sh" "$PKG/nccl_suite.sh" \
  "$PKG/probe.sh" "$PKG/epilogue_ab.sh" "$PKG/kernel_sweep.sh"
# The optional PyTorch comparisons, for a host whose Python has torch, with
# their shared helpers (the C ABI through ctypes, the GPT in PyTorch):
# torch_compare.sh runs compare.py on the CPU, gpu_vs_torch.sh runs
# gpu_vs_torch.py on the GPU, both against lib/libshardkit.so.
cp benchmarks/torch_compare/{compare,gpu_vs_torch,sk_abi,torch_gpt}.py "$PKG/extra/"
# The simulator's kernel efficiency sweep (kernel_sweep.sh; torch only).
cp tools/gpu/kernel_sweep.py "$PKG/extra/"
{
  echo "commit: $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%FT%TZ) on $(uname -n) with $(/usr/local/cuda/bin/nvcc --version | tail -1)"
  echo "config: --config=cuda -c opt (sm_80, sm_90)"
  echo "files:"
  (cd "$PKG" && find . -type f -printf '  %P %s\n' | sort)
} > "$PKG/MANIFEST"

size_kib=$(du -sk "$PKG" | cut -f1)
echo "package: $PKG is $((size_kib / 1024)) MiB (${#binaries[@]} binaries, $(ls "$PKG/lib" | wc -l) libraries)"
# oneDNN and OpenBLAS alone are ~75 MiB: what travels is the xz archive.
tar -cf - -C "$(dirname "$PKG")" "$(basename "$PKG")" | xz -T0 -6 > "$PKG.tar.xz"
archive_kib=$(du -k "$PKG.tar.xz" | cut -f1)
echo "package: $PKG.tar.xz is $((archive_kib / 1024)) MiB: carry it and run: tar xf $(basename "$PKG").tar.xz && $(basename "$PKG")/run.sh"
if ((archive_kib > LIMIT_MIB * 1024)); then
  echo "package: larger than $LIMIT_MIB MiB: too big to carry to the GPU machine" >&2
  exit 1
fi
