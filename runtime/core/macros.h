// Portability macros shared by host and CUDA code.
#ifndef SHARDKIT_RUNTIME_CORE_MACROS_H_
#define SHARDKIT_RUNTIME_CORE_MACROS_H_

// Functions whose arithmetic is shared between CPU kernels and CUDA kernels are
// marked SK_HOST_DEVICE, so host tests exercise exactly what a GPU runs.
#if defined(__CUDACC__)
#define SK_HOST_DEVICE __host__ __device__
#define SK_INLINE __forceinline__
#else
#define SK_HOST_DEVICE
#define SK_INLINE inline
#endif

#define SK_CONCAT_INNER(a, b) a##b
#define SK_CONCAT(a, b) SK_CONCAT_INNER(a, b)

#endif  // SHARDKIT_RUNTIME_CORE_MACROS_H_
