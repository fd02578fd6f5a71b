/*
 * rows.cu - get_rows (any readable type to F32), set_rows (F32 rows into an
 * F32/F16/BF16/Q8_0 tensor, such as the KV cache), cpy/cont (logical
 * row-major order, converting between F32/F16/BF16, reading the quantized
 * types, writing Q8_0), concat (any dimension, any layout) and argmax.
 */
#include "common.cuh"

__device__ __forceinline__ void tcu_coords(const tcu_tensor &t, int64_t i, int64_t c[4]) {
    c[0] = i % t.ne[0];
    i /= t.ne[0];
    c[1] = i % t.ne[1];
    i /= t.ne[1];
    c[2] = i % t.ne[2];
    c[3] = i / t.ne[2];
}

__device__ __forceinline__ int64_t tcu_index(const tcu_tensor &idx, int64_t i0, int64_t i1, int64_t i2) {
    const char *p = tcu_at(idx, i0, i1, i2, 0);
    return idx.type == TCU_I64 ? *(const int64_t *)p : (int64_t) * (const int32_t *)p;
}

/* Element of t at flat logical index f (row-major over t's shape). */
__device__ __forceinline__ float tcu_get_flat(const tcu_tensor &t, int64_t f) {
    int64_t c[4];
    tcu_coords(t, f, c);
    return tcu_get(t, c[0], c[1], c[2], c[3]);
}

static int64_t tcu_nelem(const tcu_tensor &t) { return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]; }

/* ---- get_rows ------------------------------------------------------------ */

__global__ void k_get_rows(tcu_tensor dst, tcu_tensor a, tcu_tensor idx, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t c[4];
        tcu_coords(dst, i, c);
        const int64_t row = tcu_index(idx, c[1], c[2], c[3]);
        float v = 0.0f;
        if (row >= 0 && row < a.ne[1])
            v = tcu_get(a, c[0], row, c[2], c[3]);
        *(float *)tcu_at(dst, c[0], c[1], c[2], c[3]) = v;
    }
}

extern "C" cudaError_t tcu_get_rows(cudaStream_t s, tcu_tensor dst, tcu_tensor a, tcu_tensor idx) {
    const int64_t n = tcu_nelem(dst);
    if (n == 0)
        return cudaSuccess;
    k_get_rows<<<tcu_blocks(n, 256), 256, 0, s>>>(dst, a, idx, n);
    return TCU_LAUNCHED();
}

/* ---- set_rows -------------------------------------------------------------
 * One block per source row (grid-stride). A row whose target a later source
 * row of the same (i12, i13) also writes is skipped, so the last one wins,
 * as in the CPU's sequential order, and no target row is written twice. */

__global__ void k_set_rows(tcu_tensor dst, tcu_tensor src, tcu_tensor idx) {
    const int64_t nrows = tcu_nrows(src);
    const int q8 = dst.type == TCU_Q8_0;
    for (int64_t r = blockIdx.x; r < nrows; r += gridDim.x) {
        int64_t j, i12, i13;
        tcu_row_coords(src, r, &j, &i12, &i13);
        const int64_t row = tcu_index(idx, j, i12 % idx.ne[1], i13 % idx.ne[2]);
        int later = 0;
        for (int64_t j2 = j + 1 + threadIdx.x; j2 < src.ne[1]; j2 += blockDim.x)
            later |= tcu_index(idx, j2, i12 % idx.ne[1], i13 % idx.ne[2]) == row;
        later = __syncthreads_or(later);
        if (later || row < 0 || row >= dst.ne[1])
            continue;
        char *d = tcu_at(dst, 0, row, i12, i13);
        if (q8) {
            for (int64_t b = threadIdx.x; b < dst.ne[0] / 32; b += blockDim.x) {
                float x[32];
                for (int i = 0; i < 32; i++) x[i] = tcu_get(src, b * 32 + i, j, i12, i13);
                tcu_quantize_q8_0(x, (unsigned char *)d + b * 34);
            }
        } else {
            for (int64_t i = threadIdx.x; i < dst.ne[0]; i += blockDim.x)
                tcu_store(dst.type, d + i * dst.nb[0], tcu_get(src, i, j, i12, i13));
        }
    }
}

extern "C" cudaError_t tcu_set_rows(cudaStream_t s, tcu_tensor dst, tcu_tensor src, tcu_tensor idx) {
    const int64_t n = src.ne[1] * src.ne[2] * src.ne[3];
    if (n == 0 || src.ne[0] == 0)
        return cudaSuccess;
    k_set_rows<<<tcu_blocks(n, 1), 128, 0, s>>>(dst, src, idx);
    return TCU_LAUNCHED();
}

/* ---- cpy / cont ------------------------------------------------------------ */

__global__ void k_cpy(tcu_tensor dst, tcu_tensor src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t c[4];
        tcu_coords(dst, i, c);
        char *d = tcu_at(dst, c[0], c[1], c[2], c[3]);
        if (dst.type == TCU_I32) { /* I32 copies only to I32: the bytes */
            int64_t e[4];
            tcu_coords(src, i, e);
            *(int32_t *)d = *(const int32_t *)tcu_at(src, e[0], e[1], e[2], e[3]);
            continue;
        }
        tcu_store(dst.type, d, tcu_get_flat(src, i));
    }
}

/* dst Q8_0: one thread per block of 32 (dst rows are contiguous blocks). */
__global__ void k_cpy_q8_0(tcu_tensor dst, tcu_tensor src, int64_t n_blocks) {
    const int64_t per_row = dst.ne[0] / 32;
    for (int64_t bi = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; bi < n_blocks;
         bi += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = bi / per_row, b = bi % per_row;
        int64_t i1, i2, i3;
        tcu_row_coords(dst, r, &i1, &i2, &i3);
        float x[32];
        const int64_t f0 = r * dst.ne[0] + b * 32;
        for (int i = 0; i < 32; i++) x[i] = tcu_get_flat(src, f0 + i);
        tcu_quantize_q8_0(x, (unsigned char *)tcu_at(dst, 0, i1, i2, i3) + b * 34);
    }
}

extern "C" cudaError_t tcu_cpy(cudaStream_t s, tcu_tensor dst, tcu_tensor src) {
    const int64_t n = tcu_nelem(dst);
    if (n == 0)
        return cudaSuccess;
    if (dst.type == TCU_Q8_0) {
        const int64_t nb = n / 32;
        k_cpy_q8_0<<<tcu_blocks(nb, 128), 128, 0, s>>>(dst, src, nb);
    } else {
        k_cpy<<<tcu_blocks(n, 256), 256, 0, s>>>(dst, src, n);
    }
    return TCU_LAUNCHED();
}

/* ---- concat ------------------------------------------------------------------ */

__global__ void k_concat(tcu_tensor dst, tcu_tensor a, tcu_tensor b, int dim, int es, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t c[4];
        tcu_coords(dst, i, c);
        char *d = tcu_at(dst, c[0], c[1], c[2], c[3]);
        const tcu_tensor *src = &a;
        if (c[dim] >= a.ne[dim]) {
            c[dim] -= a.ne[dim];
            src = &b;
        }
        const char *x = tcu_at(*src, c[0], c[1], c[2], c[3]);
        if (es == 4)
            *(uint32_t *)d = *(const uint32_t *)x;
        else
            *(uint16_t *)d = *(const uint16_t *)x;
    }
}

extern "C" cudaError_t tcu_concat(cudaStream_t s, tcu_tensor dst, tcu_tensor a, tcu_tensor b, int dim) {
    const int64_t n = tcu_nelem(dst);
    if (n == 0)
        return cudaSuccess;
    const int es = dst.type == TCU_F16 || dst.type == TCU_BF16 ? 2 : 4;
    k_concat<<<tcu_blocks(n, 256), 256, 0, s>>>(dst, a, b, dim, es, n);
    return TCU_LAUNCHED();
}

/* ---- argmax: the first index of the largest value (NaN never wins) -------- */

__global__ void k_argmax(tcu_tensor dst, tcu_tensor a) {
    __shared__ float sv[256];
    __shared__ int64_t si[256];
    const int64_t nrows = tcu_nrows(a);
    for (int64_t r = blockIdx.x; r < nrows; r += gridDim.x) {
        int64_t i1, i2, i3;
        tcu_row_coords(a, r, &i1, &i2, &i3);
        const char *x = tcu_at(a, 0, i1, i2, i3);
        float best = -INFINITY;
        int64_t bi = INT64_MAX;
        for (int64_t k = threadIdx.x; k < a.ne[0]; k += blockDim.x) {
            const float v = *(const float *)(x + k * a.nb[0]);
            if (v > best) {
                best = v;
                bi = k;
            }
        }
        __syncthreads();
        sv[threadIdx.x] = best;
        si[threadIdx.x] = bi;
        __syncthreads();
        for (int o = blockDim.x / 2; o > 0; o >>= 1) {
            if ((int)threadIdx.x < o) {
                const float v2 = sv[threadIdx.x + o];
                const int64_t i2b = si[threadIdx.x + o];
                if (v2 > sv[threadIdx.x] || (v2 == sv[threadIdx.x] && i2b < si[threadIdx.x])) {
                    sv[threadIdx.x] = v2;
                    si[threadIdx.x] = i2b;
                }
            }
            __syncthreads();
        }
        if (threadIdx.x == 0)
            *(int32_t *)tcu_at(dst, i1, i2, i3, 0) = sv[0] == -INFINITY ? 0 : (int32_t)si[0];
    }
}

extern "C" cudaError_t tcu_argmax(cudaStream_t s, tcu_tensor dst, tcu_tensor a) {
    const int64_t n = a.ne[1] * a.ne[2] * a.ne[3];
    if (n == 0)
        return cudaSuccess;
    k_argmax<<<tcu_blocks(n, 1), 256, 0, s>>>(dst, a);
    return TCU_LAUNCHED();
}
