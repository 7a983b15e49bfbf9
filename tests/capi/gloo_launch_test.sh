#!/usr/bin/env bash
# Two processes, one rank each, over gloo from the launcher's environment:
# rank 0's losses equal the 2-rank local session's bit for bit.
#   gloo_launch_test.sh LAUNCH TRAIN_GPT_GLOO TRAIN_GPT
set -euo pipefail
launch="$1" gloo="$2" local_run="$3"
out="${TEST_TMPDIR:-$(mktemp -d)}"
"$launch" --nproc_per_node=2 --master_port=0 "$gloo" >"$out/gloo.log" 2>&1 || {
  cat "$out/gloo.log" >&2
  exit 1
}
sed -n 's/^\[rank 0\] \(step .*\)/\1/p' "$out/gloo.log" >"$out/rank0.txt"
"$local_run" >"$out/local.txt"
if [[ $(wc -l <"$out/rank0.txt") -ne 8 ]]; then
  echo "FAIL: rank 0 printed $(wc -l <"$out/rank0.txt") steps" >&2
  cat "$out/gloo.log" >&2
  exit 1
fi
diff -u "$out/local.txt" "$out/rank0.txt"
echo "PASS: gloo (2 processes) and local (2 threads) agree bit for bit"
cat "$out/rank0.txt"
