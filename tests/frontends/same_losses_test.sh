#!/usr/bin/env bash
# The examples of every language print the same losses, bit for bit: the
# high-level GPT run (FULL_SHARD, 2 local ranks) and the low-level linear
# regression the caller computes itself. C is the reference.
# And the framework example (issue 34): C and Rust print the same losses at
# one rank; Rust's at 2 gloo ranks, and resumed at 1 rank from the checkpoint
# those saved after step 6, are the same within rounding.
#   same_losses_test.sh LIBSHARDKIT LAUNCH
set -euo pipefail
lib="$PWD/$1"
launch="$PWD/$2"
out="${TEST_TMPDIR:-$(mktemp -d)}/outputs"
mkdir -p "$out"

run_all() {  # run_all EXAMPLE: writes $out/EXAMPLE.{c,cpp,lua,rust}
  local ex="$1"
  "examples/c/$ex" >"$out/$ex.c"
  "examples/cpp/$ex" >"$out/$ex.cpp"
  SK_LIB="$lib" LUA_PATH="$PWD/frontends/lua/?.lua;;" luajit "examples/lua/$ex.lua" >"$out/$ex.lua"
  (cd "$CRATE_DIR" && "$CARGO" run --offline --quiet --example "$ex") >"$out/$ex.rust"
}

command -v luajit >/dev/null || { echo "luajit not found (./bazelw installs it)" >&2; exit 1; }
source tests/frontends/cargo_env.sh
export SK_LIB_DIR="$(dirname "$lib")"

status=0
for ex in train_gpt linear_regression; do
  run_all "$ex"
  steps=$(grep -c '^step .* bits 0x' "$out/$ex.c" || true)
  if [[ "$steps" -lt 5 ]]; then
    echo "FAIL: $ex (C) printed $steps loss lines" >&2
    status=1
  fi
  for lang in cpp lua rust; do
    if ! diff -u "$out/$ex.c" "$out/$ex.$lang"; then
      echo "FAIL: $ex in $lang differs from C" >&2
      status=1
    fi
  done
  echo "== $ex: C, C++, Lua and Rust agree on $steps losses bit for bit"
  cat "$out/$ex.c"
done

"examples/c/framework" 15 >"$out/framework.c"
(cd "$CRATE_DIR" && "$CARGO" build --offline --quiet --example framework)
rust_fw="$CARGO_TARGET_DIR/debug/examples/framework"
"$rust_fw" 15 >"$out/framework.rust"
if ! diff -u "$out/framework.c" "$out/framework.rust"; then
  echo "FAIL: the framework example in Rust differs from C" >&2
  status=1
fi
"$launch" --nproc_per_node=2 --master_port=0 "$rust_fw" 15 6 "$out/rust_ckpt" >"$out/framework.rust2" 2>&1 || {
  cat "$out/framework.rust2" >&2; exit 1; }
"$rust_fw" 15 resume "$out/rust_ckpt" >"$out/framework.rust_resumed"
sed -n 's/^\[rank 0\] \(step .*\)/\1/p' "$out/framework.rust2" >"$out/framework.rust2.steps"
grep '^step ' "$out/framework.rust_resumed" >"$out/framework.rust_resumed.steps"
close() {  # close A B WHAT: same steps and rates, losses within 2e-6
  awk -v what="$3" '
    NR == FNR { lr[$2] = $4; loss[$2] = $6; next }
    { d = loss[$2] - $6
      if (!($2 in lr) || lr[$2] != $4 || d > 2e-6 || -d > 2e-6) { print "FAIL: " what ": " $0; bad = 1 } }
    END { exit bad || FNR == 0 }' "$1" "$2"
}
close "$out/framework.c" "$out/framework.rust2.steps" "Rust at 2 gloo ranks vs C at 1" || status=1
close "$out/framework.c" "$out/framework.rust_resumed.steps" "Rust resumed at 1 rank" || status=1
[[ $(wc -l <"$out/framework.rust_resumed.steps") -eq 9 ]] || { echo "FAIL: Rust did not resume at step 6" >&2; status=1; }
echo "== framework: C and Rust agree; Rust at 2 gloo ranks and resumed at 1 match"
exit "$status"
