#!/usr/bin/env bash
# The multi-GPU suite on a machine with one GPU: several NCCL ranks share it
# (launch --share_gpu: a distinct NCCL_HOSTID per rank; docs/multi_gpu.md).
# Run from the unpacked package (tools/gpu/package.sh):
#
#   gpu-pkg/nccl_suite.sh            # results into $OUT/nccl (or gpu-pkg/report/nccl)
#
# What runs, each bounded by a timeout:
#   1. nccl_train_check at world 2 and 4: every strategy, DDP, hybrid 2x2,
#      bf16, CPU offload and gradient accumulation over NCCL, each against
#      gloo on the CPU in the same processes;
#   2. checkpoints: saved over NCCL at world 4 (sharded and full state
#      dict), resumed at world 2 over NCCL and over gloo on the CPU;
#   3. kill -9 of rank 2 of 4 in the middle of training: the survivors'
#      errors and how long each took (launch --on_failure=wait);
#   4. the C and Rust examples over NCCL at world 2, and capi_nccl_check at world 2:
#      the C ABI's caller collectives on device buffers and an engine's
#      custom optimizer step (Lion) on device-pointer views;
#   5. the NCCL version loaded and its bus bandwidth as a sanity check only
#      (ranks sharing a GPU measure nothing about speed).
# summary.txt lists every line that says PASS, FAIL or ERROR.
set -uo pipefail
PKG=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PKG/report}
DIR=$OUT/nccl
mkdir -p "$DIR"
source "$PKG/libpath.sh"
if [[ "${SK_GPU_SYSTEM_LOADER:-0}" == 1 ]]; then
  run=(env "LD_LIBRARY_PATH=$LIBPATH")
else
  run=("$PKG/lib/ld-linux-x86-64.so.2" --library-path "$LIBPATH")
fi
launch() { "${run[@]}" "$PKG/mp/launch" "$@"; }
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  echo "library path: $LIBPATH"
  for d in ${LIBPATH//:/ }; do ls "$d"/libnccl.so* 2>/dev/null; done | head -3
} > "$DIR/environment.txt"

check() {  # check NAME WORLD TIMEOUT ARGS...
  local name=$1 world=$2 limit=$3
  shift 3
  echo "nccl_suite: $name (world $world)"
  local start=$SECONDS
  timeout -k 5 "$limit" "${run[@]}" "$PKG/mp/launch" --nproc_per_node="$world" --share_gpu=0 \
    --master_port=0 "${run[@]}" "$PKG/mp/nccl_train_check" "$@" > "$DIR/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s" >> "$DIR/rc.txt"
}

# SK_NCCL_CASES=NAME,... limits the training cases (nccl_train_check --cases).
cases=${SK_NCCL_CASES:-all}
check world2 2 200 --steps=5 --cases="$cases"
check world4 4 300 --steps=5 --cases="$cases"
rm -rf "$DIR/ckpt" && mkdir -p "$DIR/ckpt"
check save4 4 90 --save="$DIR/ckpt"
check resume2 2 90 --resume="$DIR/ckpt"

# kill -9 of rank 2 after a few steps; the survivors report and exit.
echo "nccl_suite: kill -9"
piddir=$(mktemp -d)
start=$SECONDS
timeout -k 5 120 "${run[@]}" "$PKG/mp/launch" --nproc_per_node=4 --share_gpu=0 --master_port=0 \
  --on_failure=wait "${run[@]}" "$PKG/mp/nccl_train_check" --train_forever --timeout_ms=30000 \
  --pid_dir="$piddir" > "$DIR/kill.log" 2>&1 &
lpid=$!
for _ in $(seq 600); do
  grep -q "rank 2\] rank 2: step 5 " "$DIR/kill.log" 2>/dev/null && break
  kill -0 "$lpid" 2>/dev/null || break  # the launcher is gone: nothing to wait for
  sleep 0.1
done
victim=$(cat "$piddir/rank2.pid" 2>/dev/null)
if [[ -n "$victim" ]]; then
  echo "nccl_suite: kill -9 rank 2 (pid $victim) at $(date -u +%T.%N)" >> "$DIR/kill.log.note"
  kill -9 "$victim"
  killed_at=$(date +%s.%N)
fi
wait "$lpid"
echo "kill: exit $? in $((SECONDS - start)) s" >> "$DIR/rc.txt"
if [[ -n "${killed_at:-}" ]]; then
  echo "killed at epoch $killed_at" >> "$DIR/kill.log.note"
fi
rm -rf "$piddir"

check bench2 2 60 --bench
check bench4 4 60 --bench

# The C example over NCCL.
if [[ -x "$PKG/mp/train_gpt_nccl" ]]; then
  echo "nccl_suite: examples/c/train_gpt_nccl"
  timeout -k 5 120 "${run[@]}" "$PKG/mp/launch" --nproc_per_node=2 --share_gpu=0 --master_port=0 \
    "${run[@]}" "$PKG/mp/train_gpt_nccl" > "$DIR/c_example.log" 2>&1
  echo "c_example: exit $?" >> "$DIR/rc.txt"
fi

# The Rust example over NCCL (frontends/rust/examples/train_gpt_nccl.rs).
if [[ -x "$PKG/mp/rust_train_gpt_nccl" ]]; then
  echo "nccl_suite: frontends/rust/examples/train_gpt_nccl"
  timeout -k 5 120 "${run[@]}" "$PKG/mp/launch" --nproc_per_node=2 --share_gpu=0 --master_port=0 \
    "${run[@]}" "$PKG/mp/rust_train_gpt_nccl" > "$DIR/rust_example.log" 2>&1
  echo "rust_example: exit $?" >> "$DIR/rc.txt"
fi

# The 0.6.0 C ABI over NCCL: caller collectives and a custom step.
if [[ -x "$PKG/mp/capi_nccl_check" ]]; then
  echo "nccl_suite: capi_nccl_check"
  start=$SECONDS
  timeout -k 5 90 "${run[@]}" "$PKG/mp/launch" --nproc_per_node=2 --share_gpu=0 --master_port=0 \
    "${run[@]}" "$PKG/mp/capi_nccl_check" > "$DIR/capi_nccl_check.log" 2>&1
  echo "capi_nccl_check: exit $? in $((SECONDS - start)) s" >> "$DIR/rc.txt"
fi

grep -h -E "PASS|FAIL|ERROR|passed|failed|did not|dead or hung" "$DIR"/*.log > "$DIR/summary.txt" 2>/dev/null
cat "$DIR/rc.txt" >> "$DIR/summary.txt"
cat "$DIR/summary.txt"
