#!/usr/bin/env bash
# examples/c/framework (issue 34's "done when"): a framework's own model on the
# engine with warmup + cosine, a no-decay group and the loss averaged across
# ranks trains the same at 1 rank and at 2 gloo processes; a checkpoint saved
# at 2 ranks after step 6 resumes at 1 rank at step 7 with the same losses.
#   framework_example_test.sh LAUNCH FRAMEWORK
set -euo pipefail
launch="$1" framework="$2"
out="${TEST_TMPDIR:-$(mktemp -d)}"
steps=15
"$framework" "$steps" >"$out/one.log"
"$launch" --nproc_per_node=2 --master_port=0 "$framework" "$steps" 6 "$out/ckpt" >"$out/two.log" 2>&1 || {
  cat "$out/two.log" >&2; exit 1; }
"$framework" "$steps" resume "$out/ckpt" >"$out/resumed.log"
grep -q '^resumed at step 6 ' "$out/resumed.log" || { echo "FAIL: not resumed at step 6" >&2; cat "$out/resumed.log" >&2; exit 1; }
losses() { sed -n 's/^\(\[rank 0\] \)\{0,1\}step \([0-9]*\) lr \([0-9.]*\) loss \([0-9.]*\)$/\2 \3 \4/p' "$1"; }
losses "$out/one.log" >"$out/one.txt"
losses "$out/two.log" >"$out/two.txt"
losses "$out/resumed.log" >"$out/resumed.txt"
[[ $(wc -l <"$out/one.txt") -eq $steps && $(wc -l <"$out/two.txt") -eq $steps ]] || {
  echo "FAIL: expected $steps steps" >&2; cat "$out"/*.log >&2; exit 1; }
[[ $(wc -l <"$out/resumed.txt") -eq $((steps - 6)) ]] || { echo "FAIL: resumed run" >&2; exit 1; }
# Same step, same rate, losses within rounding of the printed 6 digits.
compare() {
  awk -v what="$3" '
    NR == FNR { lr[$1] = $2; loss[$1] = $3; next }
    { d = loss[$1] - $3
      if (!($1 in lr) || lr[$1] != $2 || d > 2e-6 || -d > 2e-6) { print "FAIL: " what " step " $1 ": " $0; bad = 1 } }
    END { exit bad }' "$1" "$2"
}
compare "$out/one.txt" "$out/two.txt" "1 rank vs 2 gloo ranks"
compare "$out/one.txt" "$out/resumed.txt" "1 rank vs resumed at 1 rank"
# Warmup then decay, and training: the first loss is the largest.
awk 'NR == 1 { first = $3 } END { exit !($3 < first / 2) }' "$out/one.txt" || {
  echo "FAIL: the loss did not fall" >&2; cat "$out/one.txt" >&2; exit 1; }
echo "PASS"
cat "$out/one.txt"
