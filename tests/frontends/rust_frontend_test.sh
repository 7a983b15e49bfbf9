#!/usr/bin/env bash
# cargo test --offline of the Rust crate against the libshardkit.so Bazel just
# built (the test binaries find it through an rpath set by build.rs) and the
# header it was built from (tests/header.rs checks sys.rs against it and
# against the layout the library pins, capi/abi_layout.h).
#   rust_frontend_test.sh LIBSHARDKIT HEADER LAYOUT
set -euo pipefail
lib="$PWD/$1"
header="$PWD/$2"
layout="$PWD/$3"
source tests/frontends/cargo_env.sh
export SK_LIB_DIR="$(dirname "$lib")"
export SHARDKIT_HEADER="$header"
export SHARDKIT_LAYOUT="$layout"
"$CARGO" --version
cd "$CRATE_DIR"
"$CARGO" test --offline --quiet 2>&1
