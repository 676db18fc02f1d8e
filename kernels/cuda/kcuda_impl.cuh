/* What the kernels/cuda sources share and nobody else sees: the C headers under
 * extern "C", half/bfloat16 loads, warp reductions, and the launch check. */
#ifndef KCUDA_IMPL_CUH
#define KCUDA_IMPL_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "err.h"
#include "kcuda.h"
#include "quant.h"
}

#define KCUDA_FULL_MASK 0xffffffffu

/* After a launch: a bad configuration shows here, a fault in the kernel at the next
 * synchronisation (kcuda_sync). */
#define KCUDA_CHECK_LAUNCH(err) KCUDA_CHECK(cudaGetLastError(), err)

static __device__ __forceinline__ float kc_half(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

static __device__ __forceinline__ float kc_bf16(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

static __device__ __forceinline__ float kc_warp_sum(float v)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(KCUDA_FULL_MASK, v, off);
    return v;
}

static __device__ __forceinline__ float kc_warp_max(float v)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_xor_sync(KCUDA_FULL_MASK, v, off));
    return v;
}

static __device__ __forceinline__ float kc_silu_mul(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

static inline int64_t kc_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

#endif
