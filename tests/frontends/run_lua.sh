#!/usr/bin/env bash
# Runs a Lua script under LuaJIT with the frontend on LUA_PATH and the built
# libshardkit.so.   run_lua.sh LIBSHARDKIT SCRIPT [ARGS...]
set -euo pipefail
lib="$1"
shift
if ! command -v luajit >/dev/null; then
  echo "luajit not found: install Debian's luajit (./bazelw installs it)" >&2
  exit 1
fi
export SK_LIB="$PWD/$lib"
export LUA_PATH="$PWD/frontends/lua/?.lua;;"
exec luajit "$@"
