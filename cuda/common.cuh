/*
 * common.cuh - what every kernel file shares: the launchers' C interface,
 * the element loaders of cuda/quant.h, addressing of tcu_tensor elements
 * with 64-bit arithmetic, grid sizing (no dimension over 65,535 blocks)
 * and warp/block reductions.
 */
#ifndef TCU_COMMON_CUH
#define TCU_COMMON_CUH

#include "kernels.h"
#include "quant.h"

#include <cuda_fp16.h>
#include <math.h>

/* Address of element (i0, i1, i2, i3). */
/* silu, as swiglu and silu compute it (elementwise.cu) and the mat-vec's
 * gate epilogue (matmul.cu): the same float operations. */
__device__ __forceinline__ float tcu_silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ char *tcu_at(const tcu_tensor &t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return t.data + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

__device__ __forceinline__ int64_t tcu_nrows(const tcu_tensor &t) { return t.ne[1] * t.ne[2] * t.ne[3]; }

/* Row r (over ne1*ne2*ne3) -> (i1, i2, i3). */
__device__ __forceinline__ void tcu_row_coords(const tcu_tensor &t, int64_t r, int64_t *i1, int64_t *i2, int64_t *i3) {
    *i1 = r % t.ne[1];
    *i2 = (r / t.ne[1]) % t.ne[2];
    *i3 = r / (t.ne[1] * t.ne[2]);
}

/* Element i0 of the row at (i1, i2, i3) as float (any readable type). */
__device__ __forceinline__ float tcu_get(const tcu_tensor &t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return tcu_load(t.type, (const unsigned char *)tcu_at(t, 0, i1, i2, i3), i0, t.nb[0]);
}

/* Stores v as an element of a non-quantized type. */
__device__ __forceinline__ void tcu_store(int type, char *p, float v) {
    switch (type) {
    case TCU_F32: *(float *)p = v; break;
    case TCU_F16: *(uint16_t *)p = tcu_float_to_half(v); break;
    case TCU_BF16: *(uint16_t *)p = tcu_float_to_bf16(v); break;
    default: break;
    }
}

/* Blocks for n items of per_block each, capped at the grid limit. */
static inline unsigned tcu_blocks(int64_t n, int64_t per_block) {
    int64_t b = (n + per_block - 1) / per_block;
    if (b < 1)
        b = 1;
    return (unsigned)(b > TCU_MAX_GRID ? TCU_MAX_GRID : b);
}

__device__ __forceinline__ float tcu_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float tcu_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum (or max) over the block; every thread gets the result. blockDim.x is
 * a multiple of 32, at most 1024. */
__device__ __forceinline__ float tcu_block_reduce(float v, bool is_max) {
    __shared__ float part[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    v = is_max ? tcu_warp_max(v) : tcu_warp_sum(v);
    __syncthreads(); /* part[] may still be read by a previous reduction */
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : (is_max ? -INFINITY : 0.0f);
    return is_max ? tcu_warp_max(v) : tcu_warp_sum(v);
}

/* After each kernel launch: counted (tcu_count_launch, backend.c: the
 * launches per compute of TSR_PROFILE), and the launch's error. */
#define TCU_LAUNCHED() (tcu_count_launch(), cudaGetLastError())

#endif /* TCU_COMMON_CUH */
