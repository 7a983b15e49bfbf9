#pragma once

// SK_ISA_TARGET_BEGIN("avx2,fma") ... SK_ISA_TARGET_END compiles the
// functions between them for that instruction set, whatever the build's
// -march: GCC's `#pragma GCC target`, or clang's `#pragma clang attribute`
// (clang ignores GCC's pragma, and the AVX-512 intrinsics then fail to
// inline: capi/fuzz/build_libfuzzer.sh builds these files with clang).
// Which function runs is chosen at run time (simd.h's dispatch).

#define SK_ISA_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define SK_ISA_TARGET_BEGIN(isa) \
  SK_ISA_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define SK_ISA_TARGET_END SK_ISA_PRAGMA(clang attribute pop)
#else
#define SK_ISA_TARGET_BEGIN(isa) SK_ISA_PRAGMA(GCC push_options) SK_ISA_PRAGMA(GCC target(isa))
#define SK_ISA_TARGET_END SK_ISA_PRAGMA(GCC pop_options)
#endif
