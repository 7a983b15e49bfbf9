#!/usr/bin/env bash
# Installs shardkit into a temporary prefix with //:install, then builds and
# runs, outside Bazel, the programs README.md shows (the fenced blocks marked
# `<!-- install-test: FILE -->`) with exactly the commands its
# commands.sh block prints. Two lines are adapted, and only these: PREFIX
# names the temporary prefix, and `./bazelw run //:install --` becomes a
# direct call of the installer Bazel built (a test cannot run Bazel).
# Also checks the layout: SONAME and symlinks, pkg-config's version, the rpath
# (nothing runs with LD_LIBRARY_PATH).
set -euo pipefail
unset LD_LIBRARY_PATH

root="$PWD"
installer="$root/install"
readme="$root/README.md"
: "${TEST_TMPDIR:=$(mktemp -d)}"
work="$TEST_TMPDIR/work"
prefix="$TEST_TMPDIR/prefix"
rm -rf "$work" "$prefix"
mkdir -p "$work"

# cargo (Debian's or rustup's) on PATH, as a user would have it.
source "$root/tests/frontends/cargo_env.sh"
export PATH="$(dirname "$CARGO"):$PATH"
export HOME="$TEST_TMPDIR/home"
mkdir -p "$HOME"

# The README's marked blocks, each into its file.
awk -v dir="$work" '
  /^<!-- install-test: [^ ]+ -->$/ { name = $3; next }
  name != "" && /^```/ { if (inblock) { close(dir "/" name); name = ""; inblock = 0 } else { inblock = 1 }; next }
  inblock { print > (dir "/" name) }
' "$readme"
for f in train.c train.cc train.lua commands.sh; do
  [[ -s "$work/$f" ]] || { echo "README.md has no install-test block for $f" >&2; exit 1; }
done

# The two adapted lines; every other line runs as printed.
grep -q '^PREFIX=' "$work/commands.sh" || { echo "commands.sh sets no PREFIX" >&2; exit 1; }
grep -q '^\./bazelw run //:install -- ' "$work/commands.sh" || { echo "commands.sh does not install" >&2; exit 1; }
sed -e "s|^PREFIX=.*|PREFIX='$prefix'|" \
    -e "s|^\./bazelw run //:install -- |'$installer' |" "$work/commands.sh" > "$work/run.sh"
echo "--- running (README.md's commands):"
cat "$work/run.sh"
(cd "$work" && bash -euo pipefail run.sh) > "$work/out.txt" 2>&1 || {
  cat "$work/out.txt"; echo "FAIL: the README's commands failed" >&2; exit 1; }
cat "$work/out.txt"

fail() { echo "FAIL: $*" >&2; exit 1; }
# Each language trained: C and C++ print three losses, Lua three, Rust eight.
[[ $(grep -c '^step [0-9] loss [0-9.]*$' "$work/out.txt") -ge 3 ]] || fail "the C program printed no losses"
# The README's C program prints the mean loss over ranks, and it falls every step.
grep '^step [0-9] loss [0-9.]*$' "$work/out.txt" | awk '{ if (NR > 1 && $4 >= prev) bad = 1; prev = $4 } END { exit bad }' ||
  fail "the C program's loss did not fall every step"
[[ $(grep -c '^loss [0-9.]*$' "$work/out.txt") -eq 3 ]] || fail "the C++ program printed no losses"
[[ $(grep -cE '^[0-9]+\s+[0-9.]+$' "$work/out.txt") -eq 3 ]] || fail "the Lua program printed no losses"
[[ $(grep -c '^step [0-9] loss [0-9.]* bits 0x' "$work/out.txt") -eq 8 ]] || fail "the Rust example printed no losses"

# The layout a distribution package takes.
header="$prefix/include/shardkit/shardkit.h"
ver() { sed -n "s/^#define SK_VERSION_$1 \([0-9][0-9]*\)$/\1/p" "$header"; }
version="$(ver MAJOR).$(ver MINOR).$(ver PATCH)"
[[ -f "$prefix/lib/libshardkit.so.$version" ]] || fail "no lib/libshardkit.so.$version"
[[ "$(readlink "$prefix/lib/libshardkit.so.$(ver MAJOR)")" == "libshardkit.so.$version" ]] || fail "bad .so.MAJOR symlink"
[[ "$(readlink "$prefix/lib/libshardkit.so")" == "libshardkit.so.$(ver MAJOR)" ]] || fail "bad .so symlink"
soname="$(objdump -p "$prefix/lib/libshardkit.so.$version" | sed -n 's/^ *SONAME *//p')"
[[ "$soname" == "libshardkit.so.$(ver MAJOR)" ]] || fail "SONAME is '$soname'"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
[[ "$(pkg-config --modversion shardkit)" == "$version" ]] || fail "pkg-config says $(pkg-config --modversion shardkit), header $version"
pkg-config --libs --static shardkit | grep -q -- '-lgloo' || fail "shardkit.pc lists no private dependencies"
[[ -f "$prefix/include/shardkit/shardkit.hpp" ]] || fail "no shardkit.hpp"
# The launcher: installed, runnable, and --help is usage with exit 0.
[[ -x "$prefix/bin/launch" ]] || fail "no bin/launch"
"$prefix/bin/launch" --help > "$work/launch_help.txt" 2>&1 || fail "launch --help exited non-zero"
grep -q "usage: launch --nproc_per_node=N" "$work/launch_help.txt" || fail "launch --help printed no usage"
"$prefix/bin/launch" --nproc_per_node=2 --master_port=0 /bin/sh -c 'echo rank $RANK of $WORLD_SIZE' \
  > "$work/launch_run.txt" 2>&1 || fail "installed launch failed to run two ranks"
grep -q "\[rank 1\] rank 1 of 2" "$work/launch_run.txt" || fail "installed launch: $(cat "$work/launch_run.txt")"
# The C binary found the installed library through its rpath, not by luck.
objdump -p "$work/train" | grep -q "NEEDED *libshardkit.so.$(ver MAJOR)" || fail "train does not need libshardkit.so.MAJOR"
objdump -p "$work/train" | grep -qE "(RPATH|RUNPATH) *$prefix/lib" || fail "train has no rpath to the prefix"
echo "PASS"
