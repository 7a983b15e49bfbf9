#!/usr/bin/env bash
# Runs the packed GPU suite (built by tools/gpu/package.sh) in one call and
# writes a report. On the GPU machine:
#
#   gpu-pkg/run.sh                 # report into $OUT if set, else gpu-pkg/report
#
# Every test binary runs (GoogleTest JSON per binary), then every benchmark
# (Google Benchmark JSON), the frontends' tests, then the simulator's CPU
# check: cpu/calibrate measures this machine into $OUT/sim/cpu-local.json and
# cpu/sim_validate runs real CPU training against the simulator with that
# profile ($OUT/sim/calibrate.md, sim_validate.md, sim_validate.csv); then
# report.py writes report.md: tests passed / failed / skipped per binary, the
# benchmarks' numbers and the simulator's reports. Without a GPU the tests
# skip and the report says so, which is how the package is checked on the
# development machine.
#
# SK_GPU_TESTS='conformance_test|nccl_test' runs only the test and benchmark
# binaries whose names match (and not the frontends' tests).
# SK_GPU_SKIP_BENCH=1 skips the benchmarks (tools/gpu/device_run.sh runs
# them alone on the GPU after the tests).
# SK_GPU_SUITE=gpu runs only the tests and benchmarks, SK_GPU_SUITE=cpu-sim
# only the calibration and validation (minutes of single-threaded timing:
# run it when nothing else runs on the machine); default: all.
#
# Libraries: the package's lib/ first (started through the packed loader, so
# the host's glibc does not matter), then the host's CUDA libraries (cuBLAS,
# cuBLASLt, NCCL of CUDA 13) found under $CUDA_HOME, /usr/local/cuda*, or a
# Python environment's nvidia-* wheels (PyTorch's), then the driver.
# SK_GPU_SYSTEM_LOADER=1 starts the binaries with the host's own loader.
set -uo pipefail
PKG=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PKG/report}
mkdir -p "$OUT/tests" "$OUT/bench"
TEST_TIMEOUT=${SK_GPU_TEST_TIMEOUT:-900}

source "$PKG/libpath.sh"  # sets LIBPATH

if [[ "${SK_GPU_SYSTEM_LOADER:-0}" == 1 ]]; then
  launch=(env "LD_LIBRARY_PATH=$LIBPATH")
else
  launch=("$PKG/lib/ld-linux-x86-64.so.2" --library-path "$LIBPATH")
fi

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -n) $(uname -r)"
  echo "library path: $LIBPATH"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  else
    echo "nvidia-smi: not found (no GPU driver on this machine)"
  fi
} > "$OUT/environment.txt" 2>&1
cp "$PKG/MANIFEST" "$OUT/MANIFEST" 2>/dev/null

# gpu_train's simulator column prices the same step on the profile of the
# card it runs on (an explicit SK_GPU_TRAIN_SIM_PROFILE wins; other cards:
# gpu_train's default, h100-80g).
if [[ -z "${SK_GPU_TRAIN_SIM_PROFILE:-}" ]] && command -v nvidia-smi >/dev/null; then
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H200*) export SK_GPU_TRAIN_SIM_PROFILE=h200-141g ;;
    *H100*) export SK_GPU_TRAIN_SIM_PROFILE=h100-80g ;;
    *A100*80GB*) export SK_GPU_TRAIN_SIM_PROFILE=a100-80g ;;
  esac
fi

# Runs "$@" with its output in $LOG, killed after $TEST_TIMEOUT seconds; a
# program still running then gets its threads' stacks appended to $LOG first
# (cuda-gdb, on the GPU machine, attaches to programs without GPU code too),
# so a hang names where it waits. The exit status is timeout(1)'s: 124.
run_bounded() {
  "$@" > "$LOG" 2>&1 &
  local pid=$! waited=0
  while kill -0 "$pid" 2>/dev/null && ((waited < TEST_TIMEOUT)); do
    sleep 1
    waited=$((waited + 1))
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "run.sh: still running after ${TEST_TIMEOUT} s: stacks follow, then it is killed" >> "$LOG"
    for dbg in cuda-gdb gdb; do
      if command -v "$dbg" >/dev/null; then
        timeout 60 "$dbg" -p "$pid" -batch -ex "thread apply all bt 30" >> "$LOG" 2>&1
        break
      fi
    done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    return 124
  fi
  wait "$pid"
}

SUITE=${SK_GPU_SUITE:-all}
for bin in "$PKG"/bin/*; do
  [[ "$SUITE" == cpu-sim ]] && break
  name=$(basename "$bin")
  if [[ -n "${SK_GPU_TESTS:-}" && ! "$name" =~ ^(${SK_GPU_TESTS})$ ]]; then continue; fi
  case "$name" in
    *_test)
      echo "run: $name"
      LOG="$OUT/tests/$name.log" run_bounded "${launch[@]}" "$bin" --gtest_output="json:$OUT/tests/$name.json"
      echo "$?" > "$OUT/tests/$name.rc"
      ;;
    *)
      [[ "${SK_GPU_SKIP_BENCH:-0}" == 1 ]] && continue
      echo "bench: $name"
      LOG="$OUT/bench/$name.log" run_bounded "${launch[@]}" "$bin" --benchmark_out="$OUT/bench/$name.json" \
        --benchmark_out_format=json ${SK_GPU_BENCH_ARGS:-}
      echo "$?" > "$OUT/bench/$name.rc"
      ;;
  esac
done

# The frontends' tests (their own harnesses, not GoogleTest: report.py reads
# the summary lines). Rust: the crate's test binaries against the packed
# libshardkit.so. Lua: LuaJIT with the frontend, its generated cdef and the
# test script from the package.
for bin in "$PKG"/frontends/rust/*; do
  [[ "$SUITE" == cpu-sim || -n "${SK_GPU_TESTS:-}" ]] && break
  name=$(basename "$bin")
  [[ -x "$bin" && "$name" != *.h ]] || continue
  echo "run: rust $name"
  LOG="$OUT/tests/rust_$name.log" SHARDKIT_HEADER="$PKG/frontends/rust/shardkit.h" \
    SHARDKIT_LAYOUT="$PKG/frontends/rust/abi_layout.h" \
    run_bounded "${launch[@]}" "$bin" --test-threads=1
  echo "$?" > "$OUT/tests/rust_$name.rc"
done
if [[ "$SUITE" != cpu-sim && -z "${SK_GPU_TESTS:-}" && -x "$PKG/frontends/lua/luajit" ]]; then
  echo "run: lua lua_frontend_test"
  (cd "$PKG/frontends/lua" &&
    LOG="$OUT/tests/lua_frontend_test.log" SK_LIB="$PKG/lib/libshardkit.so" \
      LUA_PATH="$PKG/frontends/lua/?.lua;;" \
      run_bounded "${launch[@]}" ./luajit lua_frontend_test.lua)
  echo "$?" > "$OUT/tests/lua_frontend_test.rc"
fi

# The simulator's CPU check: one rank thread per core, one GEMM thread per
# rank (the programs' defaults); calibrate first, then validate with the
# profile it wrote.
if [[ "$SUITE" != gpu && -x "$PKG/cpu/calibrate" ]]; then
  mkdir -p "$OUT/sim"
  echo "cpu-sim: calibrate"
  LOG="$OUT/sim/calibrate.log" run_bounded "${launch[@]}" "$PKG/cpu/calibrate" \
    --out="$OUT/sim/cpu-local.json" --save_hot="$OUT/sim/cpu-local-hot.json" \
    --report="$OUT/sim/calibrate.md" ${SK_GPU_CALIBRATE_ARGS:-}
  echo "$?" > "$OUT/sim/calibrate.rc"
  if [[ -s "$OUT/sim/cpu-local.json" ]]; then
    echo "cpu-sim: sim_validate"
    LOG="$OUT/sim/sim_validate.log" run_bounded "${launch[@]}" "$PKG/cpu/sim_validate" \
      --profile="$OUT/sim/cpu-local.json" --report="$OUT/sim/sim_validate.md" \
      --csv="$OUT/sim/sim_validate.csv" ${SK_GPU_VALIDATE_ARGS:-}
    echo "$?" > "$OUT/sim/sim_validate.rc"
  fi
fi

if command -v python3 >/dev/null; then
  python3 "$PKG/report.py" "$OUT" && echo "report: $OUT/report.md"
else
  echo "report: no python3 here; raw results are in $OUT" >&2
fi
# Exit status: 0 when every test binary passed (skips count as passes) and
# the simulator's programs, when they ran, exited 0.
failed=0
shopt -s nullglob
for rc in "$OUT"/tests/*.rc "$OUT"/sim/*.rc; do [[ "$(cat "$rc")" == 0 ]] || failed=1; done
exit $failed
