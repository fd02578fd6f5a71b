/*
 * matmul.cu - what the matrix products need besides cuBLAS: a matrix of any
 * readable type dequantized (or converted) to contiguous F16 or F32 for the
 * GEMM of large batches, and the matrix-vector kernel for few columns: each
 * warp takes a row of the weights, its lanes walk the row's elements
 * (dequantizing on the fly, adjacent lanes on adjacent elements) against
 * every column of the activations, converted once to contiguous F32.
 * TODO (cuda/README.md): activations quantized to Q8_1 once and integer
 * dot products (dp4a) per block, as the CPU's dot kernels do.
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

/* grid.x: rows of a in groups of MMV_WARPS (grid-stride); grid.y: the
 * matrices of b (i12 + ne12 * i13). One instance per weight type, so the
 * element loader's type switch and block arithmetic fold at compile time. */
template <int TYPE> __global__ void k_mat_vec(tcu_tensor dst, tcu_tensor a, tcu_tensor b, const float *y) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t k = a.ne[0], m = a.ne[1], ncols = b.ne[1];
    const int64_t mat = blockIdx.y, i12 = mat % b.ne[2], i13 = mat / b.ne[2];
    const int64_t r2 = b.ne[2] / a.ne[2], r3 = b.ne[3] / a.ne[3];
    const float *ym = y + (size_t)mat * (size_t)(ncols * k);
    for (int64_t i = blockIdx.x * (int64_t)MMV_WARPS + warp; i < m; i += (int64_t)gridDim.x * MMV_WARPS) {
        const unsigned char *arow = (const unsigned char *)tcu_at(a, 0, i, i12 / r2, i13 / r3);
        float acc[TCU_MMV_MAX_COLS];
#pragma unroll
        for (int c = 0; c < TCU_MMV_MAX_COLS; c++) acc[c] = 0.0f;
        for (int64_t e = lane; e < k; e += 32) {
            const float w = tcu_load(TYPE, arow, e, a.nb[0]);
#pragma unroll
            for (int c = 0; c < TCU_MMV_MAX_COLS; c++)
                if (c < ncols)
                    acc[c] += w * ym[c * k + e];
        }
#pragma unroll
        for (int c = 0; c < TCU_MMV_MAX_COLS; c++) {
            if (c >= ncols)
                break;
            const float v = tcu_warp_sum(acc[c]);
            if (lane == 0)
                *(float *)tcu_at(dst, i, c, i12, i13) = v;
        }
    }
}

extern "C" cudaError_t tcu_mat_vec(cudaStream_t s, tcu_tensor dst, tcu_tensor a, tcu_tensor b, const float *y) {
    const int64_t mats = b.ne[2] * b.ne[3];
    if (a.ne[1] == 0 || b.ne[1] == 0 || mats == 0)
        return cudaSuccess;
    if (b.ne[1] > TCU_MMV_MAX_COLS || mats > TCU_MAX_GRID)
        return cudaErrorInvalidValue;
    dim3 grid(tcu_blocks(a.ne[1], MMV_WARPS), (unsigned)mats);
    const unsigned nt = 32 * MMV_WARPS;
    switch (a.type) {
    case TCU_F32: k_mat_vec<TCU_F32><<<grid, nt, 0, s>>>(dst, a, b, y); break;
    case TCU_F16: k_mat_vec<TCU_F16><<<grid, nt, 0, s>>>(dst, a, b, y); break;
    case TCU_BF16: k_mat_vec<TCU_BF16><<<grid, nt, 0, s>>>(dst, a, b, y); break;
    case TCU_Q4_0: k_mat_vec<TCU_Q4_0><<<grid, nt, 0, s>>>(dst, a, b, y); break;
    case TCU_Q4_1: k_mat_vec<TCU_Q4_1><<<grid, nt, 0, s>>>(dst, a, b, y); break;
    case TCU_Q5_0: k_mat_vec<TCU_Q5_0><<<grid, nt, 0, s>>>(dst, a, b, y); break;
    case TCU_Q5_1: k_mat_vec<TCU_Q5_1><<<grid, nt, 0, s>>>(dst, a, b, y); break;
    case TCU_Q8_0: k_mat_vec<TCU_Q8_0><<<grid, nt, 0, s>>>(dst, a, b, y); break;
    case TCU_Q4_K: k_mat_vec<TCU_Q4_K><<<grid, nt, 0, s>>>(dst, a, b, y); break;
    case TCU_Q5_K: k_mat_vec<TCU_Q5_K><<<grid, nt, 0, s>>>(dst, a, b, y); break;
    case TCU_Q6_K: k_mat_vec<TCU_Q6_K><<<grid, nt, 0, s>>>(dst, a, b, y); break;
    default: return cudaErrorInvalidValue;
    }
    return TCU_LAUNCHED();
}
