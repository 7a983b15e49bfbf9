#!/usr/bin/env bash
# Installs shardkit into a prefix, in the layout a distribution package takes:
#   include/shardkit/shardkit.h, include/shardkit/shardkit.hpp
#   lib/libshardkit.so.MAJOR.MINOR.PATCH (SONAME libshardkit.so.MAJOR) and the
#     libshardkit.so.MAJOR and libshardkit.so symlinks
#   lib/pkgconfig/shardkit.pc
#   share/lua/5.1/shardkit.lua, shardkit_cdef.lua (generated from the header),
#     shardkit_install.lua (where the module finds the library)
#   share/shardkit/rust/ (the crate's sources: Cargo.toml, build.rs, src, examples)
#   share/shardkit/examples/ (the C, C++ and Lua examples)
#   bin/launch (one process per rank with torchrun's variables; docs/multi_gpu.md)
#
#   bazel run //:install -- --prefix=DIR [--destdir=STAGING]
#
# --destdir stages the files under STAGING/DIR while every recorded path
# (pkg-config, the Lua module's library path) names DIR, as `make install
# DESTDIR=` does. A relative DIR is taken from where `bazel run` was called.
# The files come from this target's runfiles (//:install's data).
set -euo pipefail

usage() { echo "usage: install --prefix=DIR [--destdir=STAGING]" >&2; exit 2; }

prefix="" destdir=""
for a in "$@"; do
  case "$a" in
    --prefix=*) prefix="${a#--prefix=}" ;;
    --destdir=*) destdir="${a#--destdir=}" ;;
    --help|-h) usage ;;
    *) echo "install: unknown argument $a" >&2; usage ;;
  esac
done
[[ -n "$prefix" ]] || { echo "install: --prefix=DIR is required" >&2; usage; }

resolve() {  # an absolute path for $1, relative ones from where bazel run was called
  case "$1" in
    /*) printf '%s' "$1" ;;
    *) printf '%s/%s' "${BUILD_WORKING_DIRECTORY:-$PWD}" "$1" ;;
  esac
}
prefix="$(resolve "$prefix")"
prefix="${prefix%/}"
[[ -n "$destdir" ]] && destdir="$(resolve "$destdir")"
root="${destdir%/}${prefix}"

# The runfiles: beside the binary under `bazel run`, else those of the test
# that carries //:install as data.
if [[ -d "$0.runfiles/shardkit" ]]; then
  cd "$0.runfiles/shardkit"
elif [[ -n "${RUNFILES_DIR:-}" && -d "$RUNFILES_DIR/shardkit" ]]; then
  cd "$RUNFILES_DIR/shardkit"
elif [[ -n "${TEST_SRCDIR:-}" && -d "$TEST_SRCDIR/shardkit" ]]; then
  cd "$TEST_SRCDIR/shardkit"
fi
header=capi/include/shardkit/shardkit.h
hpp=frontends/cpp/shardkit.hpp
lib=capi/libshardkit.so.0
lua=frontends/lua/shardkit.lua
cdef=frontends/lua/shardkit_cdef.lua
pc_in=tools/install/shardkit.pc.in
launcher=tools/launch
for f in "$header" "$hpp" "$lib" "$lua" "$cdef" "$pc_in" "$launcher"; do
  [[ -e "$f" ]] || { echo "install: $f missing from the runfiles in $PWD" >&2; exit 1; }
done

ver() { sed -n "s/^#define SK_VERSION_$1 \([0-9][0-9]*\)$/\1/p" "$header"; }
major="$(ver MAJOR)" minor="$(ver MINOR)" patch="$(ver PATCH)"
[[ -n "$major" && -n "$minor" && -n "$patch" ]] || { echo "install: no SK_VERSION_* in $header" >&2; exit 1; }
version="$major.$minor.$patch"
soname="$(objdump -p "$lib" | sed -n 's/^ *SONAME *//p')"
if [[ "$soname" != "libshardkit.so.$major" ]]; then
  echo "install: $lib has SONAME '$soname', expected libshardkit.so.$major (shardkit.h says $version)" >&2
  exit 1
fi

# put MODE SRC DST: a copy of SRC (links followed) at DST, parents created.
# (Not install(1): under `bazel run` this script itself is named install.)
put() {
  mkdir -p "$(dirname "$3")"
  rm -f "$3"
  cp -L "$2" "$3"
  chmod "$1" "$3"
}
mkdir -p "$root/include/shardkit" "$root/lib/pkgconfig" "$root/share/lua/5.1" "$root/bin" \
         "$root/share/shardkit/rust" "$root/share/shardkit/examples"
put 644 "$header" "$root/include/shardkit/shardkit.h"
put 644 "$hpp" "$root/include/shardkit/shardkit.hpp"
put 755 "$lib" "$root/lib/libshardkit.so.$version"
put 755 "$launcher" "$root/bin/launch"
ln -sfn "libshardkit.so.$version" "$root/lib/libshardkit.so.$major"
ln -sfn "libshardkit.so.$major" "$root/lib/libshardkit.so"
sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" "$pc_in" > "$root/lib/pkgconfig/shardkit.pc"
chmod 644 "$root/lib/pkgconfig/shardkit.pc"

put 644 "$lua" "$root/share/lua/5.1/shardkit.lua"
put 644 "$cdef" "$root/share/lua/5.1/shardkit_cdef.lua"
printf -- '-- Written by bazel run //:install: where shardkit.lua loads the library from.\nreturn {library = "%s"}\n' \
  "$prefix/lib/libshardkit.so.$major" > "$root/share/lua/5.1/shardkit_install.lua"

for f in $(cd frontends/rust && find -L Cargo.toml build.rs src examples -type f | sort); do
  put 644 "frontends/rust/$f" "$root/share/shardkit/rust/$f"
done
for f in $(cd examples && find -L c cpp lua -type f \( -name '*.c' -o -name '*.cc' -o -name '*.lua' \) | sort); do
  put 644 "examples/$f" "$root/share/shardkit/examples/$f"
done

echo "installed shardkit $version into $root"
echo "  headers     $prefix/include/shardkit/"
echo "  library     $prefix/lib/libshardkit.so.$version (SONAME libshardkit.so.$major)"
echo "  pkg-config  $prefix/lib/pkgconfig/shardkit.pc"
echo "  Lua         $prefix/share/lua/5.1/shardkit.lua"
echo "  Rust crate  $prefix/share/shardkit/rust/"
echo "  launcher    $prefix/bin/launch"
