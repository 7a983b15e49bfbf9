# Sourced by the Rust tests: finds cargo (Debian's, or a rustup install when
# the sandbox hides $HOME), and copies the crate to a writable place (cargo
# writes Cargo.lock next to the manifest; runfiles are read-only).
#   sets: CARGO (the binary), CRATE_DIR (the copy), CARGO_TARGET_DIR
find_cargo() {
  local c
  for c in "${CARGO:-}" "$(command -v cargo || true)" /usr/bin/cargo /root/.cargo/bin/cargo \
           "${HOME:-/nonexistent}/.cargo/bin/cargo"; do
    if [[ -n "$c" && -x "$c" ]]; then
      CARGO="$c"
      # A rustup proxy needs to know where rustup keeps its toolchains.
      if [[ "$c" == */.cargo/bin/cargo ]]; then
        local home="${c%/.cargo/bin/cargo}"
        export CARGO_HOME="${CARGO_HOME:-$home/.cargo}"
        export RUSTUP_HOME="${RUSTUP_HOME:-$home/.rustup}"
        export PATH="$home/.cargo/bin:$PATH"
      fi
      return 0
    fi
  done
  echo "cargo not found: install Debian's cargo and rustc (1.63 or newer)" >&2
  return 1
}

find_cargo
: "${TEST_TMPDIR:=$(mktemp -d)}"
CRATE_DIR="$TEST_TMPDIR/shardkit-crate"
rm -rf "$CRATE_DIR"
mkdir -p "$CRATE_DIR"
cp -rL frontends/rust/. "$CRATE_DIR/"
chmod -R u+w "$CRATE_DIR"
export CARGO_TARGET_DIR="$TEST_TMPDIR/cargo-target"
export CARGO_NET_OFFLINE=true
