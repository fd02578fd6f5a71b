/*
 * fattn.cu - fused attention (ggml's flash_attn_ext semantics, as cpu/attn.c):
 * scores q.k * scale + mask, an online softmax in F32, O = softmax V; keys
 * whose mask is -inf are skipped; a fully masked row is zeros. K/V: F32,
 * F16 or Q8_0.
 *  - The tiled kernel (k_fa_tile), for head dimensions whose tile fits the
 *    device's shared memory (256 and more on sm_80+): blocks of 4 or 16
 *    query rows of one K/V head (the heads of a GQA group together) read
 *    each tile of 32 keys once for all their rows; at decode the keys are
 *    split over blocks (about two blocks per multiprocessor, 128 keys or
 *    more each) and the splits merged by k_fa_combine.
 *  - The vector kernel (k_flash_attn), for larger head dimensions: one warp
 *    per query row, the keys in order.
 * TODO (cuda/README.md): tensor cores (mma) for the prompt's tiles.
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

/* ---- the tiled kernel ------------------------------------------------------- */

#define FA_KT 32       /* keys per tile: one per lane */
#define FA_THREADS 128 /* four warps */

/* Rows of one (kv head, sequence): r = iq * group + g for query token iq
 * and head hk * group + g, so heads that share K and V share the tiles.
 * A block takes QT consecutive rows and the keys [j0, j1) of its split;
 * per key tile: the mask (a tile masked for every row is skipped), K and V
 * converted into shared memory, the scores, an online softmax per row (a
 * warp per row, a lane per key) and O = O * corr + P V. One split writes
 * dst; several write their O, max and sum to part (tcu_fa_combine). */
template <int QT>
__global__ void __launch_bounds__(FA_THREADS)
    k_fa_tile(tcu_tensor dst, tcu_tensor q, tcu_tensor k, tcu_tensor v, tcu_tensor mask, int has_mask, float scale,
              int64_t keys_per_split, float *part) {
    extern __shared__ float sh[];
    const int64_t dk = q.ne[0], dv = v.ne[0], n_tok = q.ne[1], n_head = q.ne[2], n_kv = k.ne[1];
    const int64_t group = n_head / k.ne[2], rows_g = n_tok * group, n_qt = (rows_g + QT - 1) / QT;
    const int64_t tiles = n_qt * k.ne[2] * q.ne[3], rows_all = n_tok * n_head * q.ne[3];
    const int idk = (int)dk, idv = (int)dv, ks = idk + 1; /* K rows padded: adjacent keys in distinct banks */
    float *qs = sh, *kt = qs + QT * dk, *vt = kt + FA_KT * ks, *o = vt + FA_KT * dv, *p = o + QT * dv;
    float *mx = p + QT * FA_KT, *lsum = mx + QT, *corr = lsum + QT;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int64_t split = blockIdx.y, j0 = split * keys_per_split;
    const int64_t j1 = j0 + keys_per_split < n_kv ? j0 + keys_per_split : n_kv;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int64_t qt = tile % n_qt, hk = (tile / n_qt) % k.ne[2], s = tile / (n_qt * k.ne[2]);
        const int64_t r0 = qt * QT, sk = s % k.ne[3], sv = s % v.ne[3];
        __syncthreads(); /* the previous tile's rows are written */
        for (int i = tid; i < QT * idk; i += FA_THREADS) {
            const int64_t r = r0 + i / idk;
            const int d = i % idk;
            qs[i] = r < rows_g ? *(const float *)tcu_at(q, d, r / group, hk * group + r % group, s) : 0.0f;
        }
        for (int i = tid; i < QT * idv; i += FA_THREADS) o[i] = 0.0f;
        if (tid < QT) {
            mx[tid] = -INFINITY;
            lsum[tid] = 0.0f;
        }
        for (int64_t jt = j0; jt < j1; jt += FA_KT) {
            __syncthreads(); /* the last tile's P and V are read */
            int any = 0;
            for (int i = tid; i < QT * FA_KT; i += FA_THREADS) {
                const int64_t r = r0 + i / FA_KT, j = jt + i % FA_KT;
                float mv = -INFINITY;
                if (r < rows_g && j < j1) {
                    const int64_t iq = r / group, h = hk * group + r % group;
                    mv = has_mask ? tcu_get(mask, j, iq, h % mask.ne[2], s % mask.ne[3]) : 0.0f;
                }
                p[i] = mv;
                any |= mv != -INFINITY;
            }
            if (!__syncthreads_or(any))
                continue;
            for (int i = tid; i < FA_KT * idk; i += FA_THREADS) {
                const int j = i / idk, d = i % idk;
                kt[j * ks + d] = jt + j < j1
                                     ? tcu_load(k.type, (const unsigned char *)tcu_at(k, 0, jt + j, hk, sk), d, k.nb[0])
                                     : 0.0f;
            }
            for (int i = tid; i < FA_KT * idv; i += FA_THREADS) {
                const int j = i / idv, d = i % idv;
                vt[i] = jt + j < j1 ? tcu_load(v.type, (const unsigned char *)tcu_at(v, 0, jt + j, hk, sv), d, v.nb[0])
                                    : 0.0f;
            }
            __syncthreads();
            for (int i = tid; i < QT * FA_KT; i += FA_THREADS) { /* a warp: one row, a lane per key */
                if (p[i] == -INFINITY)
                    continue;
                const float *qr = qs + (i / FA_KT) * dk, *kr = kt + (i % FA_KT) * ks;
                float dot = 0.0f;
                for (int d = 0; d < idk; d++) dot += qr[d] * kr[d];
                p[i] += dot * scale;
            }
            __syncthreads();
            for (int r = warp; r < QT; r += FA_THREADS / 32) {
                const float sc = p[r * FA_KT + lane], m_old = mx[r];
                const float m_new = fmaxf(m_old, tcu_warp_max(sc));
                const float e = m_new == -INFINITY ? 0.0f : expf(sc - m_new);
                const float c = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
                const float sum = tcu_warp_sum(e);
                p[r * FA_KT + lane] = e;
                if (lane == 0) {
                    mx[r] = m_new;
                    lsum[r] = lsum[r] * c + sum;
                    corr[r] = c;
                }
            }
            __syncthreads();
            for (int i = tid; i < QT * idv; i += FA_THREADS) {
                const int r = i / idv, d = i % idv;
                const float *pr = p + r * FA_KT;
                float acc = o[i] * corr[r];
#pragma unroll 8
                for (int j = 0; j < FA_KT; j++) /* a masked key (p 0) adds nothing, even an inf in V */
                    if (pr[j] != 0.0f)
                        acc += pr[j] * vt[j * idv + d];
                o[i] = acc;
            }
        }
        __syncthreads();
        for (int i = tid; i < QT * idv; i += FA_THREADS) {
            const int64_t r = r0 + i / idv;
            const int d = i % idv;
            if (r >= rows_g)
                continue;
            const int64_t iq = r / group, h = hk * group + r % group;
            const float l = lsum[i / idv];
            if (gridDim.y == 1) {
                *(float *)tcu_at(dst, d, h, iq, s) = l > 0.0f ? o[i] / l : 0.0f;
            } else {
                const int64_t row = iq + n_tok * (h + n_head * s), at = split * rows_all + row;
                part[at * dv + d] = o[i];
                if (d == 0) {
                    float *ml = part + gridDim.y * rows_all * dv;
                    ml[2 * at] = mx[i / idv];
                    ml[2 * at + 1] = l;
                }
            }
        }
    }
}

/* The splits of each row merged: a warp per row (iq, h, s). */
__global__ void k_fa_combine(tcu_tensor dst, const float *part, int64_t n_split, int64_t n_tok, int64_t n_head,
                             int64_t rows_all, int64_t dv) {
    const int lane = threadIdx.x % 32;
    const float *ml = part + n_split * rows_all * dv;
    for (int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; row < rows_all;
         row += (int64_t)gridDim.x * (blockDim.x / 32)) {
        float m = -INFINITY;
        for (int64_t sp = 0; sp < n_split; sp++) m = fmaxf(m, ml[2 * (sp * rows_all + row)]);
        float l = 0.0f;
        for (int64_t sp = 0; sp < n_split; sp++) {
            const float ms = ml[2 * (sp * rows_all + row)];
            if (ms != -INFINITY)
                l += ml[2 * (sp * rows_all + row) + 1] * expf(ms - m);
        }
        const int64_t iq = row % n_tok, h = (row / n_tok) % n_head, s = row / (n_tok * n_head);
        for (int64_t d = lane; d < dv; d += 32) {
            float acc = 0.0f;
            for (int64_t sp = 0; sp < n_split; sp++) {
                const float ms = ml[2 * (sp * rows_all + row)];
                if (ms != -INFINITY)
                    acc += part[(sp * rows_all + row) * dv + d] * expf(ms - m);
            }
            *(float *)tcu_at(dst, d, h, iq, s) = l > 0.0f ? acc / l : 0.0f;
        }
    }
}

static int fa_qt(tcu_tensor q, tcu_tensor k) { return q.ne[1] * (q.ne[2] / k.ne[2]) <= 4 ? 4 : 16; }

static size_t fa_shmem(int qt, int64_t dk, int64_t dv) {
    return sizeof(float) * (size_t)(qt * dk + FA_KT * (dk + 1) + FA_KT * dv + qt * dv + qt * FA_KT + 3 * qt);
}

/* Keys per split: a split per 128 keys or more, only as many as it takes
 * for about two blocks per multiprocessor. */
static int64_t fa_keys_per_split(tcu_tensor q, tcu_tensor k, int n_sm) {
    const int qt = fa_qt(q, k);
    const int64_t rows_g = q.ne[1] * (q.ne[2] / k.ne[2]), n_kv = k.ne[1];
    const int64_t tiles = (rows_g + qt - 1) / qt * k.ne[2] * q.ne[3];
    int64_t n_split = tiles > 0 ? (2 * (int64_t)n_sm + tiles - 1) / tiles : 1;
    const int64_t most = (n_kv + 127) / 128;
    n_split = n_split < most ? n_split : most;
    n_split = n_split < 1 ? 1 : n_split > TCU_MAX_GRID ? TCU_MAX_GRID : n_split;
    const int64_t per = (n_kv + n_split - 1) / n_split;
    return (per + FA_KT - 1) / FA_KT * FA_KT; /* whole tiles */
}

/* Whether the tiled kernel takes these head dimensions on this device. */
static bool fa_tiled_ok(tcu_tensor q, tcu_tensor k, tcu_tensor v, int *max_shmem) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(max_shmem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return k.ne[2] > 0 && q.ne[2] % k.ne[2] == 0 && fa_shmem(fa_qt(q, k), q.ne[0], v.ne[0]) <= (size_t)*max_shmem;
}

/* An upper bound of the splits' scratch for q's rows and at most k's keys:
 * the split count before it is rounded to whole tiles only grows with the
 * keys, and the count after rounding is never more. */
static size_t fa_scratch_bound(tcu_tensor q, tcu_tensor k, tcu_tensor v, int n_sm, int max_shmem) {
    const int qt = fa_qt(q, k);
    if (k.ne[1] == 0 || k.ne[2] <= 0 || q.ne[2] % k.ne[2] != 0 || fa_shmem(qt, q.ne[0], v.ne[0]) > (size_t)max_shmem)
        return 0;
    const int64_t rows_g = q.ne[1] * (q.ne[2] / k.ne[2]);
    const int64_t tiles = (rows_g + qt - 1) / qt * k.ne[2] * q.ne[3];
    int64_t n_split = tiles > 0 ? (2 * (int64_t)n_sm + tiles - 1) / tiles : 1;
    const int64_t most = (k.ne[1] + 127) / 128;
    n_split = n_split < most ? n_split : most;
    n_split = n_split > TCU_MAX_GRID ? TCU_MAX_GRID : n_split;
    if (n_split <= 1)
        return 0;
    return sizeof(float) * (size_t)(n_split * q.ne[1] * q.ne[2] * q.ne[3] * (v.ne[0] + 2));
}

/* Enough for any compute of these nodes or smaller ones: a reserve sees the
 * largest graph (a whole u-batch, every cell), while a decode step (one
 * query row, fewer cells) splits its keys more; so the most over every row
 * count up to q's, for up to k's keys. */
extern "C" size_t tcu_flash_attn_scratch(tcu_tensor q, tcu_tensor k, tcu_tensor v, int n_sm) {
    int dev = 0, max_shmem = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&max_shmem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    size_t most = 0;
    tcu_tensor qn = q;
    for (int64_t n = 1; n <= q.ne[1]; n++) {
        qn.ne[1] = n;
        const size_t x = fa_scratch_bound(qn, k, v, n_sm, max_shmem);
        most = x > most ? x : most;
    }
    return most;
}

template <int QT>
static cudaError_t fa_launch(cudaStream_t s, dim3 grid, size_t shmem, tcu_tensor dst, tcu_tensor q, tcu_tensor k,
                             tcu_tensor v, const tcu_tensor *mask, float scale, int64_t per, float *part) {
    if (shmem > 48 * 1024) { /* once per device and size: more than the default */
        static size_t done[16];
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16)
            return cudaErrorInvalidDevice;
        if (done[dev] < shmem) {
            const cudaError_t e = cudaFuncSetAttribute(k_fa_tile<QT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       (int)shmem);
            if (e != cudaSuccess)
                return e;
            done[dev] = shmem;
        }
    }
    k_fa_tile<QT><<<grid, FA_THREADS, shmem, s>>>(dst, q, k, v, mask ? *mask : q, mask != NULL, scale, per, part);
    return TCU_LAUNCHED();
}

extern "C" cudaError_t tcu_flash_attn(cudaStream_t s, tcu_tensor dst, tcu_tensor q, tcu_tensor k, tcu_tensor v,
                                      const tcu_tensor *mask, float scale, int n_sm, void *scratch,
                                      size_t scratch_size) {
    const int64_t rows = q.ne[1] * q.ne[2] * q.ne[3];
    if (rows == 0 || v.ne[0] == 0)
        return cudaSuccess;
    int max_shmem = 0;
    if (k.ne[1] == 0 || !fa_tiled_ok(q, k, v, &max_shmem)) { /* no keys (zeros) or head dimensions too large */
        const size_t shmem = (size_t)(q.ne[0] + v.ne[0]) * sizeof(float);
        if (shmem > 48 * 1024)
            return cudaErrorInvalidValue;
        k_flash_attn<<<tcu_blocks(rows, 1), 32, shmem, s>>>(dst, q, k, v, mask ? *mask : q, mask != NULL, scale);
        return TCU_LAUNCHED();
    }
    const int qt = fa_qt(q, k);
    const int64_t per = fa_keys_per_split(q, k, n_sm), n_split = (k.ne[1] + per - 1) / per;
    const int64_t rows_g = q.ne[1] * (q.ne[2] / k.ne[2]), tiles = (rows_g + qt - 1) / qt * k.ne[2] * q.ne[3];
    const size_t need = n_split > 1 ? sizeof(float) * (size_t)(n_split * rows * (v.ne[0] + 2)) : 0;
    if (need > scratch_size)
        return cudaErrorInvalidValue; /* reserve sizes it (tcu_flash_attn_scratch) */
    const dim3 grid(tcu_blocks(tiles, 1), (unsigned)n_split);
    const size_t shmem = fa_shmem(qt, q.ne[0], v.ne[0]);
    float *part = (float *)scratch;
    cudaError_t e = qt == 4 ? fa_launch<4>(s, grid, shmem, dst, q, k, v, mask, scale, per, part)
                            : fa_launch<16>(s, grid, shmem, dst, q, k, v, mask, scale, per, part);
    if (e != cudaSuccess || n_split == 1)
        return e;
    k_fa_combine<<<tcu_blocks(rows, 4), 128, 0, s>>>(dst, part, n_split, q.ne[1], q.ne[2], rows, v.ne[0]);
    return TCU_LAUNCHED();
}
