/*
 * rope.cu - rotary position embedding, normal (adjacent pairs) and neox
 * (halves) modes, optional frequency factors, YaRN ramp (ggml's rope_yarn
 * as in cpu/ops.c). One thread per rotated pair, grid-stride over all
 * pairs and copied dims (past n_dims) of all rows.
 */
#include "common.cuh"

/* The rope parameter slots of internal.h (TSR_ROPE_P_*). */
enum { P_N_DIMS, P_MODE, P_N_CTX_ORIG, P_FREQ_BASE, P_FREQ_SCALE, P_EXT, P_ATTN, P_BETA_FAST, P_BETA_SLOW };

typedef struct rope_p {
    int n_dims, neox;
    float theta_scale, freq_scale, ext, attn, lo, hi, mscale_ext;
} rope_p;

/* to_cache: each value (i0, head i1) of the one token also stored at
 * element i0 of row idx[0] of plane i1 of cache (a float type): set_rows of
 * the rotated keys into the KV cache [hd, n_ctx, n_head_kv], in the same
 * launch. */
__global__ void k_rope(tcu_tensor dst, tcu_tensor a, tcu_tensor pos, tcu_tensor ff, int has_ff, rope_p p, int to_cache,
                       tcu_tensor cache, tcu_tensor idx) {
    int64_t crow = -1;
    if (to_cache) {
        const char *ip = idx.data;
        crow = idx.type == TCU_I64 ? *(const int64_t *)ip : (int64_t) * (const int32_t *)ip;
        if (crow >= cache.ne[1])
            crow = -1;
    }
    /* per row: n_dims/2 rotated pairs, then the ne0 - n_dims copied dims */
    const int64_t per_row = p.n_dims / 2 + (dst.ne[0] - p.n_dims);
    const int64_t n = per_row * tcu_nrows(dst);
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = t / per_row, k = t % per_row;
        int64_t i1, i2, i3;
        tcu_row_coords(dst, r, &i1, &i2, &i3);
        const char *x = tcu_at(a, 0, i1, i2, i3);
        float *d = (float *)tcu_at(dst, 0, i1, i2, i3);
        const int64_t s0 = a.nb[0];
        if (k >= p.n_dims / 2) {
            const int64_t i = p.n_dims + (k - p.n_dims / 2);
            d[i] = *(const float *)(x + i * s0);
            if (crow >= 0)
                tcu_store(cache.type, tcu_at(cache, i, crow, i1, 0), d[i]);
            continue;
        }
        const int i0 = (int)(2 * k);
        const float ip = (float)*(const int32_t *)(pos.data + i2 * pos.nb[0]);
        const float theta_extrap = ip * powf(p.theta_scale, (float)k) / (has_ff ? ((const float *)ff.data)[k] : 1.0f);
        float theta = p.freq_scale * theta_extrap, mscale = p.attn;
        if (p.ext != 0.0f) {
            const float y = ((float)k - p.lo) / fmaxf(0.001f, p.hi - p.lo);
            const float ramp = (1 - fminf(1, fmaxf(0, y))) * p.ext;
            theta = theta * (1 - ramp) + theta_extrap * ramp;
            mscale *= p.mscale_ext;
        }
        const float c = cosf(theta) * mscale, sn = sinf(theta) * mscale;
        const int64_t j0 = p.neox ? i0 / 2 : i0, j1 = p.neox ? i0 / 2 + p.n_dims / 2 : i0 + 1;
        const float x0 = *(const float *)(x + j0 * s0), x1 = *(const float *)(x + j1 * s0);
        d[j0] = fmaf(x0, c, -(x1 * sn));
        d[j1] = fmaf(x0, sn, x1 * c);
        if (crow >= 0) {
            tcu_store(cache.type, tcu_at(cache, j0, crow, i1, 0), d[j0]);
            tcu_store(cache.type, tcu_at(cache, j1, crow, i1, 0), d[j1]);
        }
    }
}

static float corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return n_dims * logf(n_ctx_orig / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
}

static float param_f(const int32_t *params, int i) {
    float f;
    memcpy(&f, &params[i], sizeof f);
    return f;
}

extern "C" cudaError_t tcu_rope_set_rows(cudaStream_t s, tcu_tensor dst, tcu_tensor a, tcu_tensor pos,
                                         const tcu_tensor *ff, const int32_t *params, const tcu_tensor *cache,
                                         const tcu_tensor *idx) {
    rope_p p;
    p.n_dims = params[P_N_DIMS];
    p.neox = (params[P_MODE] & 2) != 0;
    const float base = param_f(params, P_FREQ_BASE);
    p.theta_scale = powf(base, -2.0f / p.n_dims);
    p.freq_scale = param_f(params, P_FREQ_SCALE);
    p.ext = param_f(params, P_EXT);
    p.attn = param_f(params, P_ATTN);
    p.lo = p.hi = 0;
    p.mscale_ext = 1.0f + 0.1f * logf(1.0f / p.freq_scale);
    if (p.ext != 0.0f) {
        const int n_ctx_orig = params[P_N_CTX_ORIG];
        p.lo = floorf(corr_dim(p.n_dims, n_ctx_orig, param_f(params, P_BETA_FAST), base));
        p.hi = ceilf(corr_dim(p.n_dims, n_ctx_orig, param_f(params, P_BETA_SLOW), base));
        p.lo = p.lo > 0 ? p.lo : 0;
        p.hi = p.hi < p.n_dims - 1 ? p.hi : p.n_dims - 1;
    }
    const int64_t n = (p.n_dims / 2 + (dst.ne[0] - p.n_dims)) * dst.ne[1] * dst.ne[2] * dst.ne[3];
    if (n == 0)
        return cudaSuccess;
    k_rope<<<tcu_blocks(n, 256), 256, 0, s>>>(dst, a, pos, ff ? *ff : pos, ff != NULL, p, cache != NULL,
                                              cache ? *cache : dst, idx ? *idx : pos);
    return TCU_LAUNCHED();
}

extern "C" cudaError_t tcu_rope(cudaStream_t s, tcu_tensor dst, tcu_tensor a, tcu_tensor pos, const tcu_tensor *ff,
                                const int32_t *params) {
    return tcu_rope_set_rows(s, dst, a, pos, ff, params, NULL, NULL);
}
