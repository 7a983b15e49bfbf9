#!/usr/bin/env bash
# The fine-tuning example (docs/finetune.md) at 2 gloo processes, against
# transformers + torch.optim.AdamW doing the same (examples/data/finetune,
# made by tools/hf_fixtures/make_finetune_fixture.py): the eval loss before and
# after and every step's loss within 1e-6 relative, the exported directory's
# weights within 2e-6 of PyTorch's (training moved them by far more). Every
# frontend's example prints C's lines bit for bit and exports the same bytes.
#   finetune_test.sh LIBSHARDKIT LAUNCH COMPARE_WEIGHTS
set -euo pipefail
lib="$PWD/$1"
launch="$PWD/$2"
compare="$PWD/$3"
data="$PWD/examples/data/finetune"
out="${TEST_TMPDIR:-$(mktemp -d)}/finetune"
rm -rf "$out"
mkdir -p "$out"

run() {  # run LANG PROGRAM...: rank 0's lines in $out/LANG.txt, the export in $out/LANG/
  local lang="$1"
  shift
  "$launch" --nproc_per_node=2 --master_port=0 "$@" "$data/llama" "$data/train.jsonl" "$data/eval.jsonl" \
    "$out/$lang" >"$out/$lang.log" 2>&1 || {
    cat "$out/$lang.log" >&2
    echo "FAIL: the $lang example failed" >&2
    exit 1
  }
  sed -n 's/^\[rank 0\] \(\(step\|eval\) .*\)/\1/p' "$out/$lang.log" >"$out/$lang.txt"
}

status=0
run c examples/c/finetune
[[ $(wc -l <"$out/c.txt") -eq 10 ]] || { cat "$out/c.log" >&2; echo "FAIL: C printed $(wc -l <"$out/c.txt") lines" >&2; exit 1; }
awk '
  NR == FNR { key = $1 " " $2; want[key] = $4; next }
  { key = $1 " " $2
    if (!(key in want)) { print "FAIL: no reference for: " $0; bad = 1; next }
    d = ($4 - want[key]) / want[key]; if (d < 0) d = -d
    printf "%-12s shardkit %s transformers %s relative %.2g\n", key, $4, want[key], d
    if (d > 1e-6) { print "FAIL: " key " differs from transformers by " d; bad = 1 }
    seen++ }
  END { exit bad || seen != 10 }' "$data/reference.txt" "$out/c.txt" || status=1
"$compare" "$out/c" "$data/reference_final.safetensors" 2e-6 "$data/llama/model.safetensors" || status=1
echo "== C at 2 gloo ranks matches transformers + AdamW"

command -v luajit >/dev/null || { echo "luajit not found (./bazelw installs it)" >&2; exit 1; }
source tests/frontends/cargo_env.sh
export SK_LIB_DIR="$(dirname "$lib")"
(cd "$CRATE_DIR" && "$CARGO" build --offline --quiet --example finetune)
run cpp examples/cpp/finetune
SK_LIB="$lib" LUA_PATH="$PWD/frontends/lua/?.lua;;" run lua luajit examples/lua/finetune.lua
run rust "$CARGO_TARGET_DIR/debug/examples/finetune"
for lang in cpp lua rust; do
  if ! diff -u "$out/c.txt" "$out/$lang.txt"; then
    echo "FAIL: the $lang example prints other losses than C's" >&2
    status=1
  else
    # The export is one file per unit with an index: every file the same.
    (cd "$out/c" && ls) > "$out/c.files"
    (cd "$out/$lang" && ls) > "$out/$lang.files"
    if ! diff -u "$out/c.files" "$out/$lang.files"; then
      echo "FAIL: the $lang example exports other files than C's" >&2
      status=1
    fi
    for f in "$out"/c/*.safetensors "$out"/c/*.json; do
      if ! cmp "$f" "$out/$lang/$(basename "$f")"; then
        echo "FAIL: the $lang example exports other weights than C's ($(basename "$f"))" >&2
        status=1
      fi
    done
  fi
done
echo "== C++, Lua and Rust print C's losses bit for bit and export the same weights"
cat "$out/c.txt"

exit "$status"
