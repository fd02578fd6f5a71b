/*
 * norm.cu - rms_norm, norm and softmax (scale, optional F32/F16 mask that
 * broadcasts over dims 2 and 3). One block of 256 threads per row, rows in
 * grid x with a grid-stride loop; sums in float by block reduction. A fully
 * masked softmax row is all zeros, as on the CPU.
 */
#include "common.cuh"

/* mul: dst2 = dst * w (w broadcast over dst, F32; dst2 F32 rows of
 * contiguous elements), the rms_norm x weight of a layer in one launch;
 * yq (not NULL): dst2's rows as Q8_1 blocks too, as k_quantize_q8_1 lays
 * them out for the mat-vec (ne0 a multiple of 32). */
__global__ void k_norm(int rms, tcu_tensor dst, tcu_tensor a, float eps, int mul, tcu_tensor dst2, tcu_tensor w,
                       tcu_q8_1 *yq) {
    const int64_t ne0 = dst.ne[0], nrows = tcu_nrows(dst);
    for (int64_t r = blockIdx.x; r < nrows; r += gridDim.x) {
        int64_t i1, i2, i3;
        tcu_row_coords(dst, r, &i1, &i2, &i3);
        const float *x = (const float *)tcu_at(a, 0, i1, i2, i3);
        float *d = (float *)tcu_at(dst, 0, i1, i2, i3);
        float mean = 0.0f;
        if (!rms) {
            float s = 0.0f;
            for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) s += x[i];
            s = tcu_block_reduce(s, false);
            mean = ne0 ? s / (float)ne0 : 0.0f;
        }
        float s2 = 0.0f;
        for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) s2 += (x[i] - mean) * (x[i] - mean);
        s2 = tcu_block_reduce(s2, false);
        const float scale = rsqrtf((ne0 ? s2 / (float)ne0 : 0.0f) + eps);
        if (!mul) {
            for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) d[i] = (x[i] - mean) * scale;
            continue;
        }
        float *d2 = (float *)tcu_at(dst2, 0, i1, i2, i3);
        const int64_t w1 = i1 % w.ne[1], w2 = i2 % w.ne[2], w3 = i3 % w.ne[3];
        for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) {
            const float v = (x[i] - mean) * scale;
            d[i] = v;
            d2[i] = v * tcu_get(w, i % w.ne[0], w1, w2, w3);
        }
        if (!yq)
            continue;
        __syncthreads(); /* the row's values, written by every thread, before a thread reads 32 of them */
        const int64_t nseg = ne0 / 32;
        for (int64_t g = threadIdx.x; g < nseg; g += blockDim.x) tcu_quantize_q8_1(d2 + 32 * g, yq + r * nseg + g);
    }
}

__global__ void k_softmax(tcu_tensor dst, tcu_tensor a, tcu_tensor mask, int has_mask, float scale) {
    const int64_t ne0 = dst.ne[0], nrows = tcu_nrows(dst);
    for (int64_t r = blockIdx.x; r < nrows; r += gridDim.x) {
        int64_t i1, i2, i3;
        tcu_row_coords(dst, r, &i1, &i2, &i3);
        const float *x = (const float *)tcu_at(a, 0, i1, i2, i3);
        float *d = (float *)tcu_at(dst, 0, i1, i2, i3);
        float mx = -INFINITY;
        for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) {
            float v = x[i] * scale;
            if (has_mask)
                v += tcu_get(mask, i, i1, i2 % mask.ne[2], i3 % mask.ne[3]);
            d[i] = v;
            mx = fmaxf(mx, v);
        }
        mx = tcu_block_reduce(mx, true);
        if (mx == -INFINITY) {
            for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) d[i] = 0.0f;
            continue;
        }
        float sum = 0.0f;
        for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) {
            const float e = expf(d[i] - mx);
            d[i] = e;
            sum += e;
        }
        sum = tcu_block_reduce(sum, false);
        const float inv = 1.0f / sum;
        for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) d[i] *= inv;
    }
}

extern "C" cudaError_t tcu_norm(cudaStream_t s, int rms, tcu_tensor dst, tcu_tensor a, float eps) {
    const int64_t n = dst.ne[1] * dst.ne[2] * dst.ne[3];
    if (n == 0)
        return cudaSuccess;
    k_norm<<<tcu_blocks(n, 1), 256, 0, s>>>(rms, dst, a, eps, 0, dst, dst, (tcu_q8_1 *)NULL);
    return TCU_LAUNCHED();
}

extern "C" cudaError_t tcu_norm_mul(cudaStream_t s, int rms, tcu_tensor dst, tcu_tensor a, float eps, tcu_tensor dst2,
                                    tcu_tensor w, void *yq) {
    const int64_t n = dst.ne[1] * dst.ne[2] * dst.ne[3];
    if (n == 0)
        return cudaSuccess;
    if (yq && dst.ne[0] % 32)
        return cudaErrorInvalidValue;
    k_norm<<<tcu_blocks(n, 1), 256, 0, s>>>(rms, dst, a, eps, 1, dst2, w, (tcu_q8_1 *)yq);
    return TCU_LAUNCHED();
}

extern "C" cudaError_t tcu_softmax(cudaStream_t s, tcu_tensor dst, tcu_tensor a, const tcu_tensor *mask, float scale) {
    const int64_t n = dst.ne[1] * dst.ne[2] * dst.ne[3];
    if (n == 0)
        return cudaSuccess;
    k_softmax<<<tcu_blocks(n, 1), 256, 0, s>>>(dst, a, mask ? *mask : a, mask != NULL, scale);
    return TCU_LAUNCHED();
}
