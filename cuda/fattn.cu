/*
 * fattn.cu - fused attention (ggml's flash_attn_ext semantics, as cpu/attn.c):
 * the vector kernel. One warp per query row (token, head, sequence), rows
 * in grid x with a grid-stride loop; for each key in order: the score
 * q.k * scale + mask (lanes over the head dimension, a warp sum), an online
 * softmax in F32, and O = O * correction + p * v in shared memory. Any head
 * dimension (dynamic shared memory of dk + dv floats); keys whose mask is
 * -inf are skipped; a fully masked row is zeros. K/V: F32, F16 or Q8_0.
 * TODO (cuda/README.md): a tiled kernel (tensor cores) for prompts and a
 * split over the keys for long contexts at decode.
 */
#include "common.cuh"

__global__ void k_flash_attn(tcu_tensor dst, tcu_tensor q, tcu_tensor k, tcu_tensor v, tcu_tensor mask, int has_mask,
                             float scale) {
    extern __shared__ float sh[];
    const int64_t dk = q.ne[0], dv = v.ne[0];
    float *qs = sh, *o = sh + dk;
    const int lane = threadIdx.x;
    const int64_t n_tok = q.ne[1], n_head = q.ne[2], rows = n_tok * n_head * q.ne[3];
    const int64_t group = n_head / k.ne[2];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t iq = r % n_tok, h = (r / n_tok) % n_head, s = r / (n_tok * n_head);
        const int64_t hk = h / group, sk = s % k.ne[3], sv = s % v.ne[3];
        __syncwarp();
        for (int64_t d = lane; d < dk; d += 32) qs[d] = *(const float *)tcu_at(q, d, iq, h, s);
        for (int64_t d = lane; d < dv; d += 32) o[d] = 0.0f;
        __syncwarp();
        float mx = -INFINITY, l = 0.0f;
        for (int64_t j = 0; j < k.ne[1]; j++) {
            float mv = 0.0f;
            if (has_mask) {
                mv = tcu_get(mask, j, iq, h % mask.ne[2], s % mask.ne[3]);
                if (mv == -INFINITY)
                    continue;
            }
            const unsigned char *krow = (const unsigned char *)tcu_at(k, 0, j, hk, sk);
            float dot = 0.0f;
            for (int64_t d = lane; d < dk; d += 32) dot += qs[d] * tcu_load(k.type, krow, d, k.nb[0]);
            const float score = tcu_warp_sum(dot) * scale + mv;
            const float m_new = fmaxf(mx, score);
            const float corr = expf(mx - m_new), p = expf(score - m_new);
            l = l * corr + p;
            mx = m_new;
            const unsigned char *vrow = (const unsigned char *)tcu_at(v, 0, j, hk, sv);
            for (int64_t d = lane; d < dv; d += 32) o[d] = o[d] * corr + p * tcu_load(v.type, vrow, d, v.nb[0]);
        }
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int64_t d = lane; d < dv; d += 32) *(float *)tcu_at(dst, d, h, iq, s) = o[d] * inv;
    }
}

extern "C" cudaError_t tcu_flash_attn(cudaStream_t s, tcu_tensor dst, tcu_tensor q, tcu_tensor k, tcu_tensor v,
                                      const tcu_tensor *mask, float scale) {
    const int64_t rows = q.ne[1] * q.ne[2] * q.ne[3];
    if (rows == 0 || v.ne[0] == 0)
        return cudaSuccess;
    const size_t shmem = (size_t)(q.ne[0] + v.ne[0]) * sizeof(float);
    if (shmem > 48 * 1024)
        return cudaErrorInvalidValue;
    k_flash_attn<<<tcu_blocks(rows, 1), 32, shmem, s>>>(dst, q, k, v, mask ? *mask : q, mask != NULL, scale);
    return TCU_LAUNCHED();
}
