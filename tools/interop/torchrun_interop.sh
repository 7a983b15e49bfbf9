#!/usr/bin/env bash
# Hand-run interop check: examples/c/train_gpt_gloo (built against
# libshardkit) under real torchrun (standalone, static and c10d rendezvous;
# 2 and 4 processes) and under our launch. Prints a Markdown table for
# benchmarks/results/launch_interop.md. Needs PyTorch (torchrun); no build or
# test runs this.
#   ./bazelw build //examples/c:train_gpt_gloo //examples/c:train_gpt //tools:launch
#   tools/interop/torchrun_interop.sh [TORCHRUN] > /tmp/interop.md
set -uo pipefail
torchrun="${1:-/work/venv/bin/torchrun}"
bin="$(pwd)/bazel-bin"
gloo="$bin/examples/c/train_gpt_gloo" local_run="$bin/examples/c/train_gpt" launch="$bin/tools/launch"
out="$(mktemp -d)"
"$local_run" >"$out/local2.txt"
python="$(dirname "$torchrun")/python"
echo "| launcher | processes | exit status | steps printed per rank |"
echo "|---|---|---|---|"
run() {  # NAME NPROC COMMAND...: runs it, keeps its log as NAME.log, prints a row
  local name="$1" n="$2"
  shift 2
  timeout 300 "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local steps
  steps=$(grep -c "step [0-9]* loss" "$out/$name.log")
  printf '| %s | %s | %s | %s |\n' "$name" "$n" "$rc" "$((steps / n))"
}
# Every rank prints its losses; torchrun (--no-python) does not tag lines with
# the rank, so the check compares the sorted lines of all ranks with launch's.
for n in 2 4; do
  port=$((29600 + n))
  run "launch" "$n" "$launch" --nproc_per_node="$n" --master_port=0 "$gloo"
  sed 's/^\[rank [0-9]*\] //' "$out/launch.log" | grep "^step" | sort >"$out/launch_$n.sorted"
  run "torchrun --standalone" "$n" "$torchrun" --standalone --no-python --nproc_per_node="$n" "$gloo"
  run "torchrun static --master_port" "$n" "$torchrun" --nnodes=1 --rdzv-backend=static --master_addr=127.0.0.1 \
    --master_port="$port" --node_rank=0 --no-python --nproc_per_node="$n" "$gloo"
  run "torchrun c10d rendezvous" "$n" "$torchrun" --nnodes=1 --rdzv-backend=c10d --rdzv-endpoint="127.0.0.1:$((port + 10))" \
    --rdzv-id=interop$n --no-python --nproc_per_node="$n" "$gloo"
  for name in "torchrun --standalone" "torchrun static --master_port" "torchrun c10d rendezvous"; do
    grep "^step" "$out/$name.log" | sort >"$out/t.sorted"
    if cmp -s "$out/t.sorted" "$out/launch_$n.sorted"; then
      echo "- $n processes, $name: every rank's losses equal launch's bit for bit"
    else
      echo "- $n processes, $name: losses DIFFER from launch's"
    fi
  done
done
"$launch" --nproc_per_node=2 --master_port=0 "$gloo" 2>&1 | sed -n 's/^\[rank 0\] \(step .*\)/\1/p' >"$out/launch_r0.txt"
if cmp -s "$out/launch_r0.txt" "$out/local2.txt"; then
  echo "- launch, 2 processes: rank 0's losses equal the 2-rank local session's (train_gpt) bit for bit"
else
  echo "- launch, 2 processes: rank 0's losses DIFFER from train_gpt's"
fi
echo
echo "torch $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null), logs in $out"
