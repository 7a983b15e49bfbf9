#!/usr/bin/env bash
# The examples of every language print the same losses, bit for bit: the
# high-level GPT run (FULL_SHARD, 2 local ranks) and the low-level linear
# regression the caller computes itself. C is the reference.
#   same_losses_test.sh LIBSHARDKIT
set -euo pipefail
lib="$PWD/$1"
out="${TEST_TMPDIR:-$(mktemp -d)}/outputs"
mkdir -p "$out"

run_all() {  # run_all EXAMPLE: writes $out/EXAMPLE.{c,cpp,lua,rust}
  local ex="$1"
  "examples/c/$ex" >"$out/$ex.c"
  "examples/cpp/$ex" >"$out/$ex.cpp"
  SHARDKIT_LIB="$lib" LUA_PATH="$PWD/frontends/lua/?.lua;;" luajit "examples/lua/$ex.lua" >"$out/$ex.lua"
  (cd "$CRATE_DIR" && "$CARGO" run --offline --quiet --example "$ex") >"$out/$ex.rust"
}

command -v luajit >/dev/null || { echo "luajit not found (./bazelw installs it)" >&2; exit 1; }
source tests/frontends/cargo_env.sh
export SHARDKIT_LIB_DIR="$(dirname "$lib")"

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
exit "$status"
