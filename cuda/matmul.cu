/*
 * matmul.cu - what the matrix products need besides cuBLAS: a matrix of any
 * readable type dequantized (or converted) to contiguous F16 or F32 for the
 * GEMM of large batches, and the matrix-vector kernels for few columns,
 * against activations converted once: for the integer types to Q8_1 blocks
 * (32 values, a scale and the scaled sum), met by integer dot products
 * (dp4a, cuda/quant.h, checked on the host); for the float types to
 * contiguous F32. k_mat_vec (the decode products): a block of MMV_WARPS
 * warps per weight row, its threads over the row in 4-byte words (four
 * threads per 32-value segment, adjacent threads on adjacent words), the
 * warps' sums added in shared memory; one instance per weight type and
 * column count. k_mat_vec_id (the experts'): a warp per weight row, a lane
 * per segment.
 */
#include "common.cuh"

template <typename T> __global__ void k_matrix_to(T *out, tcu_tensor a, int64_t i2, int64_t i3, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i0 = i % a.ne[0], i1 = i / a.ne[0];
        const float v = tcu_get(a, i0, i1, i2, i3);
        if constexpr (sizeof(T) == 2)
            out[i] = __float2half(v);
        else
            out[i] = v;
    }
}

extern "C" cudaError_t tcu_matrix_to_f16(cudaStream_t s, void *out, tcu_tensor a, int64_t i2, int64_t i3) {
    const int64_t n = a.ne[0] * a.ne[1];
    if (n == 0)
        return cudaSuccess;
    k_matrix_to<__half><<<tcu_blocks(n, 256), 256, 0, s>>>((__half *)out, a, i2, i3, n);
    return TCU_LAUNCHED();
}

extern "C" cudaError_t tcu_matrix_to_f32(cudaStream_t s, float *out, tcu_tensor a, int64_t i2, int64_t i3) {
    const int64_t n = a.ne[0] * a.ne[1];
    if (n == 0)
        return cudaSuccess;
    k_matrix_to<float><<<tcu_blocks(n, 256), 256, 0, s>>>(out, a, i2, i3, n);
    return TCU_LAUNCHED();
}

#define MMV_WARPS 4

/* Types whose weights meet Q8_1 activations in integer dot products, and
 * their 32-value segments per block. */
template <int TYPE> struct tcu_qdot {
    static constexpr bool yes = TYPE == TCU_Q4_0 || TYPE == TCU_Q4_1 || TYPE == TCU_Q5_0 || TYPE == TCU_Q5_1 ||
                                TYPE == TCU_Q8_0 || TYPE == TCU_Q4_K || TYPE == TCU_Q5_K || TYPE == TCU_Q6_K;
    static constexpr int spb = TYPE == TCU_Q4_K || TYPE == TCU_Q5_K || TYPE == TCU_Q6_K ? 8 : 1;
};

/* A lane's part of the dots of weight row arow with ncols columns of y
 * (k_mat_vec_id's warp per row): Q8_1 blocks (nseg = k / 32 per column)
 * for the integer types, each lane on whole segments (adjacent lanes on
 * adjacent blocks); F32 values (k per column) for the float types,
 * adjacent lanes on adjacent elements. */
template <int TYPE>
__device__ __forceinline__ void tcu_row_dots(const unsigned char *arow, int64_t k, int64_t nb0, const void *y,
                                             int ncols, float *acc, int lane) {
    if constexpr (tcu_qdot<TYPE>::yes) {
        const tcu_q8_1 *yq = (const tcu_q8_1 *)y;
        const int64_t nseg = k / 32;
        const int bb = tcu_block_bytes(TYPE);
        for (int64_t g = lane; g < nseg; g += 32) {
            const unsigned char *blk = arow + (g / tcu_qdot<TYPE>::spb) * bb;
            const int sub = (int)(g % tcu_qdot<TYPE>::spb);
#pragma unroll
            for (int c = 0; c < TCU_MMV_MAX_COLS; c++)
                if (c < ncols)
                    acc[c] += tcu_dot_q8_1(TYPE, blk, sub, yq + c * nseg + g);
        }
    } else {
        const float *yf = (const float *)y;
        for (int64_t e = lane; e < k; e += 32) {
            const float w = tcu_load(TYPE, arow, e, nb0);
#pragma unroll
            for (int c = 0; c < TCU_MMV_MAX_COLS; c++)
                if (c < ncols)
                    acc[c] += w * yf[c * k + e];
        }
    }
}

/* Values per column of y: segments (Q8_1) or elements (F32). */
template <int TYPE> __device__ __forceinline__ int64_t tcu_ycol(int64_t k) { return tcu_qdot<TYPE>::yes ? k / 32 : k; }

#define MMV_THREADS (32 * MMV_WARPS)
#define MMV_PARTS 4 /* threads per 32-value segment: two 4-value groups (4-byte words) each */

/* A thread's part (tid of MMV_THREADS) of the dots of weight row arow with
 * the NCOLS columns of y (cs values from a column to the next): for the
 * integer types four threads per 32-value segment, two 4-byte words of the
 * weights and of the Q8_1 values each, so a warp reads 8 segments' words
 * in order; F16 and BF16 rows (contiguous, 4-byte aligned) two elements a
 * thread, one 4-byte word; else an element a thread. */
template <int TYPE, int NCOLS>
__device__ __forceinline__ void tcu_row_dots_block(const unsigned char *arow, int64_t k, int64_t nb0, const void *y,
                                                   int64_t cs, float *acc, int tid) {
    if constexpr (tcu_qdot<TYPE>::yes) {
        const tcu_q8_1 *yq = (const tcu_q8_1 *)y;
        const int64_t nseg = k / 32, units = nseg * MMV_PARTS;
        const int bb = tcu_block_bytes(TYPE);
        for (int64_t u = tid; u < units; u += MMV_THREADS) {
            const int64_t g = u / MMV_PARTS;
            const int p = (int)(u % MMV_PARTS);
            const unsigned char *blk = arow + (g / tcu_qdot<TYPE>::spb) * bb;
            const int sub = (int)(g % tcu_qdot<TYPE>::spb);
#pragma unroll
            for (int c = 0; c < NCOLS; c++)
                acc[c] += tcu_dot_q8_1_part(TYPE, blk, sub, yq + c * nseg + g, 2 * p, 2 * p + 2);
        }
    } else {
        const float *yf = (const float *)y;
        int64_t e0 = 0;
        if constexpr (TYPE == TCU_F16 || TYPE == TCU_BF16) {
            if (nb0 == 2 && !((uintptr_t)arow & 3)) {
                const int64_t npair = k / 2;
                for (int64_t e2 = tid; e2 < npair; e2 += MMV_THREADS) {
                    const uint32_t w2 = ((const uint32_t *)arow)[e2];
                    const uint16_t lo = (uint16_t)(w2 & 0xffffu), hi = (uint16_t)(w2 >> 16);
                    const float w0 = TYPE == TCU_F16 ? tcu_half_to_float(lo) : tcu_bf16_to_float(lo);
                    const float w1 = TYPE == TCU_F16 ? tcu_half_to_float(hi) : tcu_bf16_to_float(hi);
#pragma unroll
                    for (int c = 0; c < NCOLS; c++) acc[c] += w0 * yf[c * cs + 2 * e2] + w1 * yf[c * cs + 2 * e2 + 1];
                }
                e0 = 2 * npair;
            }
        }
        for (int64_t e = e0 + tid; e < k; e += MMV_THREADS) {
            const float w = tcu_load(TYPE, arow, e, nb0);
#pragma unroll
            for (int c = 0; c < NCOLS; c++) acc[c] += w * yf[c * cs + e];
        }
    }
}

/* grid.x: rows of a, a block per row (grid-stride); grid.y: the matrices
 * of b (i12 + ne12 * i13). One instance per weight type and column count,
 * so the loader's type switch, the block arithmetic and the column loops
 * fold at compile time. With TCU_EPI_SWIGLU_PAIR the block does the same
 * row of epi.a2 too (gate and up of one input in one launch). Each
 * column's sum runs in an order that does not depend on NCOLS. */
template <int TYPE, int NCOLS>
__global__ void k_mat_vec(tcu_tensor dst, tcu_tensor a, tcu_tensor b, const void *y, tcu_mmv_epi epi) {
    __shared__ float part[2][MMV_WARPS][NCOLS];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int nmat = epi.mode == TCU_EPI_SWIGLU_PAIR ? 2 : 1;
    const int64_t k = a.ne[0], m = a.ne[1];
    const int64_t mat = blockIdx.y, i12 = mat % b.ne[2], i13 = mat / b.ne[2];
    const int64_t r2 = b.ne[2] / a.ne[2], r3 = b.ne[3] / a.ne[3];
    const size_t ybytes = tcu_qdot<TYPE>::yes ? sizeof(tcu_q8_1) : sizeof(float);
    /* y NULL (float weights): b's F32 rows read in place through its strides */
    const char *ym = y ? (const char *)y + (size_t)mat * (size_t)(NCOLS * tcu_ycol<TYPE>(k)) * ybytes
                       : (const char *)tcu_at(b, 0, 0, i12, i13);
    const int64_t ycs = y ? tcu_ycol<TYPE>(k) : b.nb[1] / (int64_t)sizeof(float);
    for (int64_t i = blockIdx.x; i < m; i += gridDim.x) {
        float acc[2][NCOLS];
#pragma unroll
        for (int c = 0; c < NCOLS; c++) acc[0][c] = acc[1][c] = 0.0f;
        for (int mi = 0; mi < nmat; mi++) {
            const tcu_tensor &w = mi ? epi.a2 : a;
            tcu_row_dots_block<TYPE, NCOLS>((const unsigned char *)tcu_at(w, 0, i, i12 / r2, i13 / r3), k, w.nb[0], ym,
                                            ycs, acc[mi], tid);
        }
        for (int mi = 0; mi < nmat; mi++)
#pragma unroll
            for (int c = 0; c < NCOLS; c++) {
                const float v = tcu_warp_sum(acc[mi][c]);
                if (lane == 0)
                    part[mi][warp][c] = v;
            }
        __syncthreads();
        if (warp == MMV_WARPS - 1 && lane < NCOLS) { /* the last warp adds the warps' sums */
            const int c = lane;
            float v = 0.0f, u = 0.0f;
#pragma unroll
            for (int w = 0; w < MMV_WARPS; w++) {
                v += part[0][w][c];
                if (nmat == 2)
                    u += part[1][w][c];
            }
            *(float *)tcu_at(dst, i, c, i12, i13) = v;
            if (epi.mode == TCU_EPI_SWIGLU_PAIR) {
                *(float *)tcu_at(epi.x, i, c, i12, i13) = u;
                *(float *)tcu_at(epi.dst, i, c, i12, i13) = tcu_silu(v) * u;
            } else if (epi.mode != TCU_EPI_NONE) {
                const float x = *(const float *)tcu_at(epi.x, i, c, i12, i13);
                *(float *)tcu_at(epi.dst, i, c, i12, i13) = epi.mode == TCU_EPI_ADD        ? v + x
                                                            : epi.mode == TCU_EPI_SWIGLU_A ? tcu_silu(v) * x
                                                                                           : tcu_silu(x) * v;
            }
        }
        __syncthreads(); /* part[] is read before the next row's sums overwrite it */
    }
}

/* Every row of b (rows in order i1, i2, i3) as Q8_1 blocks: a thread per
 * 32 values (tcu_quantize_q8_1, the function the host test checks). */
__global__ void k_quantize_q8_1(tcu_q8_1 *out, tcu_tensor b, int64_t n) {
    const int64_t nseg = b.ne[0] / 32;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / nseg, g = i % nseg;
        const int64_t i1 = r % b.ne[1], i2 = (r / b.ne[1]) % b.ne[2], i3 = r / (b.ne[1] * b.ne[2]);
        float x[32];
#pragma unroll
        for (int e = 0; e < 32; e++) x[e] = tcu_get(b, 32 * g + e, i1, i2, i3);
        tcu_quantize_q8_1(x, out + i);
    }
}

extern "C" cudaError_t tcu_activations(cudaStream_t s, void *y, tcu_tensor b, int wtype) {
    if (!tcu_dot_q8_1_type(wtype))
        return tcu_tensor_to_f32(s, (float *)y, b);
    if (b.ne[0] % 32)
        return cudaErrorInvalidValue;
    const int64_t n = b.ne[0] / 32 * b.ne[1] * b.ne[2] * b.ne[3];
    if (n == 0)
        return cudaSuccess;
    k_quantize_q8_1<<<tcu_blocks(n, 128), 128, 0, s>>>((tcu_q8_1 *)y, b, n);
    return TCU_LAUNCHED();
}

/* The integer dots' two-byte reads need even weight addresses and strides. */
static bool tcu_even(const tcu_tensor &a) {
    return !tcu_dot_q8_1_type(a.type) || !(((uintptr_t)a.data | (uint64_t)(a.nb[1] | a.nb[2] | a.nb[3])) & 1);
}

template <int TYPE>
static void tcu_mmv_cols(cudaStream_t s, dim3 grid, int64_t ncols, const tcu_tensor &dst, const tcu_tensor &a,
                         const tcu_tensor &b, const void *y, const tcu_mmv_epi &epi) {
    switch (ncols) {
    case 1: k_mat_vec<TYPE, 1><<<grid, MMV_THREADS, 0, s>>>(dst, a, b, y, epi); break;
    case 2: k_mat_vec<TYPE, 2><<<grid, MMV_THREADS, 0, s>>>(dst, a, b, y, epi); break;
    case 3: k_mat_vec<TYPE, 3><<<grid, MMV_THREADS, 0, s>>>(dst, a, b, y, epi); break;
    case 4: k_mat_vec<TYPE, 4><<<grid, MMV_THREADS, 0, s>>>(dst, a, b, y, epi); break;
    case 5: k_mat_vec<TYPE, 5><<<grid, MMV_THREADS, 0, s>>>(dst, a, b, y, epi); break;
    case 6: k_mat_vec<TYPE, 6><<<grid, MMV_THREADS, 0, s>>>(dst, a, b, y, epi); break;
    case 7: k_mat_vec<TYPE, 7><<<grid, MMV_THREADS, 0, s>>>(dst, a, b, y, epi); break;
    default: k_mat_vec<TYPE, 8><<<grid, MMV_THREADS, 0, s>>>(dst, a, b, y, epi); break;
    }
}

extern "C" cudaError_t tcu_mat_vec(cudaStream_t s, tcu_tensor dst, tcu_tensor a, tcu_tensor b, const void *y,
                                   const tcu_mmv_epi *epi_p) {
    tcu_mmv_epi epi;
    if (epi_p)
        epi = *epi_p;
    else
        epi.mode = TCU_EPI_NONE, epi.dst = epi.x = epi.a2 = dst;
    const bool pair = epi.mode == TCU_EPI_SWIGLU_PAIR;
    if (!tcu_even(a) || (pair && (!tcu_even(epi.a2) || epi.a2.type != a.type)))
        return cudaErrorInvalidValue;
    for (int d = 0; pair && d < 4; d++)
        if (epi.a2.ne[d] != a.ne[d])
            return cudaErrorInvalidValue;
    const int64_t mats = b.ne[2] * b.ne[3];
    if (a.ne[1] == 0 || b.ne[1] == 0 || mats == 0)
        return cudaSuccess;
    if (b.ne[1] > TCU_MMV_MAX_COLS || mats > TCU_MAX_GRID)
        return cudaErrorInvalidValue;
    const dim3 grid(tcu_blocks(a.ne[1], 1), (unsigned)mats);
    const int64_t nc = b.ne[1];
    switch (a.type) {
    case TCU_F32: tcu_mmv_cols<TCU_F32>(s, grid, nc, dst, a, b, y, epi); break;
    case TCU_F16: tcu_mmv_cols<TCU_F16>(s, grid, nc, dst, a, b, y, epi); break;
    case TCU_BF16: tcu_mmv_cols<TCU_BF16>(s, grid, nc, dst, a, b, y, epi); break;
    case TCU_Q4_0: tcu_mmv_cols<TCU_Q4_0>(s, grid, nc, dst, a, b, y, epi); break;
    case TCU_Q4_1: tcu_mmv_cols<TCU_Q4_1>(s, grid, nc, dst, a, b, y, epi); break;
    case TCU_Q5_0: tcu_mmv_cols<TCU_Q5_0>(s, grid, nc, dst, a, b, y, epi); break;
    case TCU_Q5_1: tcu_mmv_cols<TCU_Q5_1>(s, grid, nc, dst, a, b, y, epi); break;
    case TCU_Q8_0: tcu_mmv_cols<TCU_Q8_0>(s, grid, nc, dst, a, b, y, epi); break;
    case TCU_Q4_K: tcu_mmv_cols<TCU_Q4_K>(s, grid, nc, dst, a, b, y, epi); break;
    case TCU_Q5_K: tcu_mmv_cols<TCU_Q5_K>(s, grid, nc, dst, a, b, y, epi); break;
    case TCU_Q6_K: tcu_mmv_cols<TCU_Q6_K>(s, grid, nc, dst, a, b, y, epi); break;
    default: return cudaErrorInvalidValue;
    }
    return TCU_LAUNCHED();
}

/* ---- mul_mat_id: the experts' matrix products ------------------------------ */

/* Records the first expert id outside 0..n_expert-1 of a compute in the
 * stream's status words (flag, node, id, token, slot); the host reads them
 * when it synchronizes. */
__device__ __forceinline__ void tcu_bad_id(int *status, int node, int id, int64_t t, int64_t slot) {
    if (atomicCAS(&status[0], 0, 1) == 0) {
        status[1] = node;
        status[2] = id;
        status[3] = (int)t;
        status[4] = (int)slot;
    }
}

/* Few tokens: grid.y walks the (token, slot) pairs, grid.x the weight rows
 * of the pair's expert (a warp per row, as k_mat_vec with one column). A
 * pair with a bad id gets zeros and is recorded. */
template <int TYPE>
__global__ void k_mat_vec_id(tcu_tensor dst, tcu_tensor as, tcu_tensor ids, const void *y, int64_t n_b, int node,
                             int *status) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t k = as.ne[0], m = as.ne[1], n_used = ids.ne[0], n_pairs = n_used * ids.ne[1];
    const size_t ybytes = tcu_qdot<TYPE>::yes ? sizeof(tcu_q8_1) : sizeof(float);
    for (int64_t p = blockIdx.y; p < n_pairs; p += gridDim.y) {
        const int64_t t = p / n_used, slot = p % n_used;
        const int id = *(const int *)tcu_at(ids, slot, t, 0, 0);
        const bool ok = id >= 0 && id < as.ne[2];
        if (!ok && blockIdx.x == 0 && threadIdx.x == 0)
            tcu_bad_id(status, node, id, t, slot);
        const char *ym = (const char *)y + (size_t)((slot % n_b) + n_b * t) * (size_t)tcu_ycol<TYPE>(k) * ybytes;
        for (int64_t i = blockIdx.x * (int64_t)MMV_WARPS + warp; i < m; i += (int64_t)gridDim.x * MMV_WARPS) {
            float acc[TCU_MMV_MAX_COLS] = {0.0f};
            if (ok)
                tcu_row_dots<TYPE>((const unsigned char *)tcu_at(as, 0, i, id, 0), k, as.nb[0], ym, 1, acc, lane);
            const float v = tcu_warp_sum(acc[0]);
            if (lane == 0)
                *(float *)tcu_at(dst, i, slot, t, 0) = v;
        }
    }
}

extern "C" cudaError_t tcu_mat_vec_id(cudaStream_t s, tcu_tensor dst, tcu_tensor as, tcu_tensor ids, const void *y,
                                      int64_t n_b, int node, int *status) {
    const int64_t n_pairs = ids.ne[0] * ids.ne[1];
    if (!tcu_even(as))
        return cudaErrorInvalidValue;
    if (as.ne[1] == 0 || n_pairs == 0)
        return cudaSuccess;
    dim3 grid(tcu_blocks(as.ne[1], MMV_WARPS), (unsigned)(n_pairs < TCU_MAX_GRID ? n_pairs : TCU_MAX_GRID));
    const unsigned nt = 32 * MMV_WARPS;
#define TCU_MMVID(T) k_mat_vec_id<T><<<grid, nt, 0, s>>>(dst, as, ids, y, n_b, node, status)
    switch (as.type) {
    case TCU_F32: TCU_MMVID(TCU_F32); break;
    case TCU_F16: TCU_MMVID(TCU_F16); break;
    case TCU_BF16: TCU_MMVID(TCU_BF16); break;
    case TCU_Q4_0: TCU_MMVID(TCU_Q4_0); break;
    case TCU_Q4_1: TCU_MMVID(TCU_Q4_1); break;
    case TCU_Q5_0: TCU_MMVID(TCU_Q5_0); break;
    case TCU_Q5_1: TCU_MMVID(TCU_Q5_1); break;
    case TCU_Q8_0: TCU_MMVID(TCU_Q8_0); break;
    case TCU_Q4_K: TCU_MMVID(TCU_Q4_K); break;
    case TCU_Q5_K: TCU_MMVID(TCU_Q5_K); break;
    case TCU_Q6_K: TCU_MMVID(TCU_Q6_K); break;
    default: return cudaErrorInvalidValue;
    }
#undef TCU_MMVID
    return TCU_LAUNCHED();
}

/* Every element of a (any readable type, any strides) into contiguous F32,
 * rows in order (i1, then i2, then i3). */
__global__ void k_tensor_to_f32(float *out, tcu_tensor a, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i0 = i % a.ne[0], r = i / a.ne[0];
        out[i] = tcu_get(a, i0, r % a.ne[1], (r / a.ne[1]) % a.ne[2], r / (a.ne[1] * a.ne[2]));
    }
}

extern "C" cudaError_t tcu_tensor_to_f32(cudaStream_t s, float *out, tcu_tensor a) {
    const int64_t n = a.ne[0] * a.ne[1] * a.ne[2] * a.ne[3];
    if (n == 0)
        return cudaSuccess;
    k_tensor_to_f32<<<tcu_blocks(n, 256), 256, 0, s>>>(out, a, n);
    return TCU_LAUNCHED();
}

/* Row g of out (F16 or F32, k wide) = the row of b that pair pairs[g]
 * (t * n_used + slot) reads: b's row slot % n_b of token t. */
template <typename T>
__global__ void k_mmid_gather(T *out, tcu_tensor b, const int *pairs, int64_t n_pairs, int64_t n_used) {
    const int64_t k = b.ne[0], n = k * n_pairs;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t g = i / k, e = i % k, p = pairs[g];
        const float v = tcu_get(b, e, (p % n_used) % b.ne[1], p / n_used, 0);
        if constexpr (sizeof(T) == 2)
            out[i] = __float2half(v);
        else
            out[i] = v;
    }
}

extern "C" cudaError_t tcu_mmid_gather(cudaStream_t s, void *out, int f16, tcu_tensor b, const int *pairs,
                                       int64_t n_pairs, int64_t n_used) {
    const int64_t n = b.ne[0] * n_pairs;
    if (n == 0)
        return cudaSuccess;
    if (f16)
        k_mmid_gather<__half><<<tcu_blocks(n, 256), 256, 0, s>>>((__half *)out, b, pairs, n_pairs, n_used);
    else
        k_mmid_gather<float><<<tcu_blocks(n, 256), 256, 0, s>>>((float *)out, b, pairs, n_pairs, n_used);
    return TCU_LAUNCHED();
}

/* dst's row (slot, t) of pair pairs[g] = row g of c (contiguous, m wide). */
__global__ void k_mmid_scatter(tcu_tensor dst, const float *c, const int *pairs, int64_t n_pairs, int64_t n_used) {
    const int64_t m = dst.ne[0], n = m * n_pairs;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t g = i / m, r = i % m, p = pairs[g];
        *(float *)tcu_at(dst, r, p % n_used, p / n_used, 0) = c[i];
    }
}

extern "C" cudaError_t tcu_mmid_scatter(cudaStream_t s, tcu_tensor dst, const float *c, const int *pairs,
                                        int64_t n_pairs, int64_t n_used) {
    const int64_t n = dst.ne[0] * n_pairs;
    if (n == 0)
        return cudaSuccess;
    k_mmid_scatter<<<tcu_blocks(n, 256), 256, 0, s>>>(dst, c, pairs, n_pairs, n_used);
    return TCU_LAUNCHED();
}
