/*
 * sort.cu - sum_rows, argsort and top_k (a MoE router's expert choice), one
 * block per row over a grid-stride loop. argsort and top_k sort the row's
 * (value, index) pairs in shared memory with a bitonic network in the CPU's
 * order (cpu/sort.c): by value, NaN above every number, equal values by
 * index, so the result is the CPU's stable sort; rows of up to
 * TCU_SORT_MAX values (cuda/cuda.c leaves longer ones to the CPU).
 */
#include "common.cuh"

/* ---- sum_rows: in double, as the CPU ------------------------------------- */

__global__ void k_sum_rows(tcu_tensor dst, tcu_tensor a) {
    __shared__ double part[32];
    const int64_t nrows = tcu_nrows(a);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    for (int64_t r = blockIdx.x; r < nrows; r += gridDim.x) {
        int64_t i1, i2, i3;
        tcu_row_coords(a, r, &i1, &i2, &i3);
        const char *x = tcu_at(a, 0, i1, i2, i3);
        double v = 0;
        for (int64_t k = threadIdx.x; k < a.ne[0]; k += blockDim.x) v += *(const float *)(x + k * a.nb[0]);
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        __syncthreads(); /* part[] of the previous row has been read */
        if (lane == 0)
            part[warp] = v;
        __syncthreads();
        if (threadIdx.x == 0) {
            double sum = 0;
            for (int w = 0; w < nw; w++) sum += part[w];
            *(float *)tcu_at(dst, 0, i1, i2, i3) = (float)sum;
        }
    }
}

extern "C" cudaError_t tcu_sum_rows(cudaStream_t s, tcu_tensor dst, tcu_tensor a) {
    const int64_t nrows = a.ne[1] * a.ne[2] * a.ne[3];
    if (nrows == 0)
        return cudaSuccess;
    k_sum_rows<<<tcu_blocks(nrows, 1), 256, 0, s>>>(dst, a);
    return TCU_LAUNCHED();
}

/* ---- argsort, top_k ----------------------------------------------------- */

/* a above b in descending order: NaN above every number (cpu/sort.c). */
__device__ __forceinline__ bool tcu_above(float a, float b) { return isnan(a) ? !isnan(b) : !isnan(b) && a > b; }

/* Pair i goes before pair j in the wanted order; padding (index >= n) last. */
__device__ __forceinline__ bool tcu_before(float vi, int ii, float vj, int ij, int n, bool desc) {
    if (ii >= n || ij >= n)
        return ii < ij;
    const bool gt = tcu_above(vi, vj), lt = tcu_above(vj, vi);
    if (!gt && !lt)
        return ii < ij; /* equal: index order */
    return desc ? gt : lt;
}

/* Rows of n = a.ne[0] <= blockDim.x (a power of two) values; the first k
 * indices of each sorted row into dst (I32). Blocks of up to TCU_SORT_MAX
 * (1024) threads: the bound caps the registers so that such a block can
 * launch (without it, the launch may fail with too many resources). */
__global__ void __launch_bounds__(TCU_SORT_MAX) k_argsort(tcu_tensor dst, tcu_tensor a, int desc, int k) {
    __shared__ float sv[TCU_SORT_MAX];
    __shared__ int si[TCU_SORT_MAX];
    const int n = (int)a.ne[0], t = threadIdx.x, size = blockDim.x;
    const int64_t nrows = tcu_nrows(a);
    for (int64_t r = blockIdx.x; r < nrows; r += gridDim.x) {
        int64_t i1, i2, i3;
        tcu_row_coords(a, r, &i1, &i2, &i3);
        const char *x = tcu_at(a, 0, i1, i2, i3);
        __syncthreads(); /* the previous row's results have been read */
        sv[t] = t < n ? *(const float *)(x + t * a.nb[0]) : 0.0f;
        si[t] = t;
        __syncthreads();
        for (int len = 2; len <= size; len <<= 1)
            for (int j = len >> 1; j > 0; j >>= 1) {
                const int p = t ^ j;
                if (p > t) {
                    const bool up = (t & len) == 0; /* this run in the wanted order, else reversed */
                    const bool swap = up ? tcu_before(sv[p], si[p], sv[t], si[t], n, desc)
                                         : tcu_before(sv[t], si[t], sv[p], si[p], n, desc);
                    if (swap) {
                        const float fv = sv[t];
                        const int fi = si[t];
                        sv[t] = sv[p], si[t] = si[p];
                        sv[p] = fv, si[p] = fi;
                    }
                }
                __syncthreads();
            }
        if (t < k)
            *(int32_t *)tcu_at(dst, t, i1, i2, i3) = si[t];
    }
}

extern "C" cudaError_t tcu_argsort(cudaStream_t s, tcu_tensor dst, tcu_tensor a, int desc, int k) {
    const int64_t nrows = a.ne[1] * a.ne[2] * a.ne[3];
    if (nrows == 0 || a.ne[0] == 0)
        return cudaSuccess;
    if (a.ne[0] > TCU_SORT_MAX || k > a.ne[0])
        return cudaErrorInvalidValue;
    int size = 32; /* a whole warp at least */
    while (size < a.ne[0]) size <<= 1;
    k_argsort<<<tcu_blocks(nrows, 1), size, 0, s>>>(dst, a, desc, k);
    return TCU_LAUNCHED();
}
