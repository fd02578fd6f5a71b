/*
 * ops.c - CPU kernels of the element-wise, normalization, rope, softmax,
 * row-gather/scatter and copy ops (semantics: each op's comment in
 * libtensr.h). Each kernel handles general byte strides and splits its rows
 * over the stream's threads (thread ith of nth).
 */
#include "cpu.h"

#include <math.h>

/* A zero-sized tensor may have no data (NULL): no arithmetic on it then. */
static inline char *at(const tsr_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    const int64_t off = i0 * (int64_t)t->nb[0] + i1 * (int64_t)t->nb[1] + i2 * (int64_t)t->nb[2] +
                        i3 * (int64_t)t->nb[3];
    return t->data ? (char *)t->data + off : NULL;
}

/* Row index r (over ne1*ne2*ne3) -> (i1, i2, i3). */
static inline void row_coords(const tsr_tensor *t, int64_t r, int64_t *i1, int64_t *i2, int64_t *i3) {
    *i1 = r % t->ne[1];
    *i2 = (r / t->ne[1]) % t->ne[2];
    *i3 = r / (t->ne[1] * t->ne[2]);
}

static inline float *work_f32(const tsr_compute_params *p, size_t per_thread) {
    return (float *)((char *)p->work + (size_t)p->ith * tsr__pad(per_thread * sizeof(float), TSR_ALIGN));
}

/* Stores v as an element of type t (non-quantized). */
/* one line per type */
// clang-format off
static inline void store_f(tsr_type t, char *p, float v) {
    switch (t) {
    case TSR_TYPE_F32: memcpy(p, &v, 4); break;
    case TSR_TYPE_F16: { uint16_t h = tsr__fp32_to_fp16(v); memcpy(p, &h, 2); break; }
    case TSR_TYPE_BF16: { uint16_t h = tsr__fp32_to_bf16(v); memcpy(p, &h, 2); break; }
    case TSR_TYPE_I32: { int32_t i = v != v ? 0 : v >= 2147483520.0f ? INT32_MAX : v <= -2147483648.0f ? INT32_MIN : (int32_t)lrintf(v); memcpy(p, &i, 4); break; }
    default: break;
    }
}
// clang-format on

/* ---- binary ops --------------------------------------------------------- */

static inline float binop(tsr_op op, float a, float b) {
    switch (op) {
    case TSR_OP_ADD: return a + b;
    case TSR_OP_SUB: return a - b;
    case TSR_OP_MUL: return a * b;
    default: return a / b;
    }
}

void tsr__cpu_op_binary(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *a = dst->src[0], *b = dst->src[1];
    int64_t r0, r1;
    tsr__cpu_split(tsr__nrows(dst), p->ith, p->nth, &r0, &r1);
    const int64_t ne0 = dst->ne[0];
    const bool fast = a->type == TSR_TYPE_F32 && b->type == TSR_TYPE_F32 && a->nb[0] == 4 && b->nb[0] == 4 &&
                      b->ne[0] == ne0;
    const bool scalar_b = a->type == TSR_TYPE_F32 && b->type == TSR_TYPE_F32 && a->nb[0] == 4 && b->ne[0] == 1;
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_coords(dst, r, &i1, &i2, &i3);
        float *d = (float *)at(dst, 0, i1, i2, i3);
        const char *pa = at(a, 0, i1, i2, i3);
        const char *pb = at(b, 0, i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]);
        if (fast) {
            const float *x = (const float *)pa, *y = (const float *)pb;
            switch (dst->op) {
            case TSR_OP_ADD: p->k->add(ne0, d, x, y); break;
            case TSR_OP_SUB:
                for (int64_t i = 0; i < ne0; i++) d[i] = x[i] - y[i];
                break;
            case TSR_OP_MUL: p->k->mul(ne0, d, x, y); break;
            default:
                for (int64_t i = 0; i < ne0; i++) d[i] = x[i] / y[i];
                break;
            }
            continue;
        }
        if (scalar_b) { /* one value of b per row (MoE: each expert's output times its weight) */
            const float *x = (const float *)pa;
            const float y = *(const float *)pb;
            switch (dst->op) {
            case TSR_OP_ADD:
                for (int64_t i = 0; i < ne0; i++) d[i] = x[i] + y;
                break;
            case TSR_OP_SUB:
                for (int64_t i = 0; i < ne0; i++) d[i] = x[i] - y;
                break;
            case TSR_OP_MUL:
                for (int64_t i = 0; i < ne0; i++) d[i] = x[i] * y;
                break;
            default:
                for (int64_t i = 0; i < ne0; i++) d[i] = x[i] / y;
                break;
            }
            continue;
        }
        for (int64_t i = 0; i < ne0; i++) {
            const float x = tsr__cpu_load_f(a->type, pa + i * (int64_t)a->nb[0]);
            const float y = tsr__cpu_load_f(b->type, pb + (i % b->ne[0]) * (int64_t)b->nb[0]);
            d[i] = binop(dst->op, x, y);
        }
    }
}

void tsr__cpu_op_scale(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *a = dst->src[0];
    const float s = tsr__get_f32_param(dst, 0);
    int64_t r0, r1;
    tsr__cpu_split(tsr__nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_coords(dst, r, &i1, &i2, &i3);
        float *d = (float *)at(dst, 0, i1, i2, i3);
        const char *pa = at(a, 0, i1, i2, i3);
        for (int64_t i = 0; i < dst->ne[0]; i++) d[i] = tsr__cpu_load_f(a->type, pa + i * (int64_t)a->nb[0]) * s;
    }
}

/* ---- unary and gated ------------------------------------------------------ */

static inline float silu(float x) { return x / (1.0f + expf(-x)); }
static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float gelu(float x) { /* 0.5 x (1 + tanh u), as the kernel table's gelu_mul */
    return x / (1.0f + expf(-2.0f * TSR_GELU_C * (x + 0.044715f * x * x * x)));
}

/* This thread's part of an element-wise op: rows [r0, r1), and of each
 * row the values [c0, c1): whole rows, or, with fewer rows than threads
 * (decode), a share of every row's values in whole vectors. Each value is
 * computed alone: the same bits whatever the split. */
static void eltwise_split(const tsr_compute_params *p, const tsr_tensor *dst, int64_t *r0, int64_t *r1, int64_t *c0,
                          int64_t *c1) {
    const int64_t nr = tsr__nrows(dst), ne0 = dst->ne[0];
    if (nr >= p->nth || ne0 < 64 * p->nth) {
        tsr__cpu_split(nr, p->ith, p->nth, r0, r1);
        *c0 = 0, *c1 = ne0;
        return;
    }
    int64_t v0, v1;
    tsr__cpu_split((ne0 + 15) / 16, p->ith, p->nth, &v0, &v1);
    *r0 = 0, *r1 = nr;
    *c0 = 16 * v0, *c1 = 16 * v1 < ne0 ? 16 * v1 : ne0;
}

void tsr__cpu_op_unary(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *a = dst->src[0];
    int64_t r0, r1, c0, c1;
    eltwise_split(p, dst, &r0, &r1, &c0, &c1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_coords(dst, r, &i1, &i2, &i3);
        float *d = (float *)at(dst, 0, i1, i2, i3);
        const char *pa = at(a, 0, i1, i2, i3);
        if ((dst->op == TSR_OP_SILU || dst->op == TSR_OP_GELU) && a->type == TSR_TYPE_F32 && a->nb[0] == 4) {
            (dst->op == TSR_OP_SILU ? p->k->silu_mul : p->k->gelu_mul)(c1 - c0, d + c0, (const float *)pa + c0, NULL);
            continue;
        }
        for (int64_t i = c0; i < c1; i++) {
            const float x = tsr__cpu_load_f(a->type, pa + i * (int64_t)a->nb[0]);
            d[i] = dst->op == TSR_OP_SILU ? silu(x) : dst->op == TSR_OP_SIGMOID ? sigmoid(x) : gelu(x);
        }
    }
}

void tsr__cpu_op_glu(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *a = dst->src[0], *b = dst->src[1];
    int64_t r0, r1, c0, c1;
    eltwise_split(p, dst, &r0, &r1, &c0, &c1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_coords(dst, r, &i1, &i2, &i3);
        float *d = (float *)at(dst, 0, i1, i2, i3);
        const char *pa = at(a, 0, i1, i2, i3), *pb = at(b, 0, i1, i2, i3);
        if (a->type == TSR_TYPE_F32 && b->type == TSR_TYPE_F32 && a->nb[0] == 4 && b->nb[0] == 4) {
            (dst->op == TSR_OP_SWIGLU ? p->k->silu_mul : p->k->gelu_mul)(c1 - c0, d + c0, (const float *)pa + c0,
                                                                         (const float *)pb + c0);
            continue;
        }
        for (int64_t i = c0; i < c1; i++) {
            const float x = tsr__cpu_load_f(a->type, pa + i * (int64_t)a->nb[0]);
            const float y = tsr__cpu_load_f(b->type, pb + i * (int64_t)b->nb[0]);
            d[i] = (dst->op == TSR_OP_SWIGLU ? silu(x) : gelu(x)) * y;
        }
    }
}

/* ---- normalization ----------------------------------------------------------- */

void tsr__cpu_op_norm(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *a = dst->src[0];
    const float eps = tsr__get_f32_param(dst, 0);
    const int64_t ne0 = dst->ne[0];
    int64_t r0, r1;
    tsr__cpu_split(tsr__nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_coords(dst, r, &i1, &i2, &i3);
        float *d = (float *)at(dst, 0, i1, i2, i3);
        const float *x = (const float *)at(a, 0, i1, i2, i3);
        if (dst->op == TSR_OP_RMS_NORM) {
            p->k->rms_norm(ne0, d, x, eps);
            continue;
        }
        double mean = 0, sum2 = 0;
        if (dst->op == TSR_OP_NORM) {
            for (int64_t i = 0; i < ne0; i++) mean += x[i];
            mean = ne0 ? mean / ne0 : 0;
        }
        for (int64_t i = 0; i < ne0; i++) sum2 += (x[i] - mean) * (x[i] - mean);
        const float scale = (float)(1.0 / sqrt((ne0 ? sum2 / ne0 : 0) + eps));
        for (int64_t i = 0; i < ne0; i++) d[i] = (float)(x[i] - mean) * scale;
    }
}

/* ---- rope ------------------------------------------------------------------ */

static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return n_dims * logf(n_ctx_orig / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
}

/* cos/sin of every rotated pair for one position (ggml's rope_yarn). */
static void rope_cache(const tsr_tensor *dst, float pos, const float *ff, float *cache) {
    const int n_dims = dst->op_params[TSR_ROPE_P_N_DIMS];
    const int n_ctx_orig = dst->op_params[TSR_ROPE_P_N_CTX_ORIG];
    const float base = tsr__get_f32_param(dst, TSR_ROPE_P_FREQ_BASE);
    const float freq_scale = tsr__get_f32_param(dst, TSR_ROPE_P_FREQ_SCALE);
    const float ext = tsr__get_f32_param(dst, TSR_ROPE_P_EXT_FACTOR);
    const float attn = tsr__get_f32_param(dst, TSR_ROPE_P_ATTN_FACTOR);
    float lo = 0, hi = 0;
    if (ext != 0.0f) {
        lo = floorf(yarn_corr_dim(n_dims, n_ctx_orig, tsr__get_f32_param(dst, TSR_ROPE_P_BETA_FAST), base));
        hi = ceilf(yarn_corr_dim(n_dims, n_ctx_orig, tsr__get_f32_param(dst, TSR_ROPE_P_BETA_SLOW), base));
        lo = lo > 0 ? lo : 0;
        hi = hi < n_dims - 1 ? hi : n_dims - 1;
    }
    /* theta by repeated multiplication with base^(-2/n_dims), in float, as
     * ggml's rope cache does: llama.cpp parity (a per-dimension powf rounds
     * differently from position 1 on) */
    const float theta_scale = powf(base, -2.0f / n_dims);
    float theta_i = pos;
    for (int i0 = 0; i0 < n_dims; i0 += 2, theta_i *= theta_scale) {
        const float theta_extrap = theta_i / (ff ? ff[i0 / 2] : 1.0f);
        float theta = freq_scale * theta_extrap, mscale = attn;
        if (ext != 0.0f) {
            const float y = (i0 / 2 - lo) / fmaxf(0.001f, hi - lo);
            const float ramp = (1 - fminf(1, fmaxf(0, y))) * ext;
            theta = theta * (1 - ramp) + theta_extrap * ramp;
            mscale *= 1.0f + 0.1f * logf(1.0f / freq_scale);
        }
        cache[i0] = cosf(theta) * mscale;
        cache[i0 + 1] = sinf(theta) * mscale;
    }
}

void tsr__cpu_op_rope(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *a = dst->src[0], *pos = dst->src[1], *ffs = dst->src[2];
    const int n_dims = dst->op_params[TSR_ROPE_P_N_DIMS];
    const bool neox = dst->op_params[TSR_ROPE_P_MODE] & 2;
    float *cache = work_f32(p, (size_t)n_dims + 2);
    int64_t cached = -1, r0, r1;
    tsr__cpu_split(tsr__nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_coords(dst, r, &i1, &i2, &i3);
        if (cached != i2) {
            int32_t ip;
            memcpy(&ip, (const char *)pos->data + i2 * (int64_t)pos->nb[0], 4);
            rope_cache(dst, (float)ip, ffs ? (const float *)ffs->data : NULL, cache);
            cached = i2;
        }
        float *d = (float *)at(dst, 0, i1, i2, i3);
        const char *x = at(a, 0, i1, i2, i3);
        const int64_t s0 = (int64_t)a->nb[0];
        if (s0 == 4) {
            p->k->rope(n_dims, neox, d, (const float *)x, cache);
            if (d != (const float *)x)
                memcpy(d + n_dims, x + n_dims * 4, (size_t)(dst->ne[0] - n_dims) * 4);
            continue;
        }
        for (int i0 = 0; i0 < n_dims; i0 += 2) {
            const int64_t j0 = neox ? i0 / 2 : i0, j1 = neox ? i0 / 2 + n_dims / 2 : i0 + 1;
            float x0, x1;
            memcpy(&x0, x + j0 * s0, 4);
            memcpy(&x1, x + j1 * s0, 4);
            /* fused as GCC contracts ggml's rotate_pairs on FMA machines
             * (llama.cpp parity): x0*c - x1*s and x0*s + x1*c */
            d[j0] = fmaf(x0, cache[i0], -(x1 * cache[i0 + 1]));
            d[j1] = fmaf(x0, cache[i0 + 1], x1 * cache[i0]);
        }
        for (int64_t i = n_dims; i < dst->ne[0]; i++) memcpy(&d[i], x + i * s0, 4);
    }
}

/* ---- softmax --------------------------------------------------------------- */

void tsr__cpu_op_softmax(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *a = dst->src[0], *mask = dst->src[1];
    const float scale = tsr__get_f32_param(dst, 0);
    const int64_t ne0 = dst->ne[0];
    int64_t r0, r1;
    tsr__cpu_split(tsr__nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_coords(dst, r, &i1, &i2, &i3);
        float *d = (float *)at(dst, 0, i1, i2, i3);
        const float *x = (const float *)at(a, 0, i1, i2, i3);
        const char *m = mask ? at(mask, 0, i1, i2 % mask->ne[2], i3 % mask->ne[3]) : NULL;
        float max = -INFINITY;
        for (int64_t i = 0; i < ne0; i++) {
            d[i] = x[i] * scale + (m ? tsr__cpu_load_f(mask->type, m + i * (int64_t)mask->nb[0]) : 0.0f);
            if (d[i] > max)
                max = d[i];
        }
        if (max == -INFINITY) { /* fully masked row */
            memset(d, 0, (size_t)ne0 * sizeof *d);
            continue;
        }
        const double sum = p->k->exp_sum(ne0, d, max);
        const float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < ne0; i++) d[i] *= inv;
    }
}

/* ---- sum_rows ------------------------------------------------------------------ */

void tsr__cpu_op_sum_rows(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *a = dst->src[0];
    int64_t r0, r1;
    tsr__cpu_split(tsr__nrows(a), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_coords(a, r, &i1, &i2, &i3);
        const char *x = at(a, 0, i1, i2, i3);
        double sum = 0; /* in order, in double: the same for any thread count */
        for (int64_t k = 0; k < a->ne[0]; k++) {
            float v;
            memcpy(&v, x + k * (int64_t)a->nb[0], 4);
            sum += v;
        }
        *(float *)at(dst, 0, i1, i2, i3) = (float)sum;
    }
}

/* ---- concat / argmax ---------------------------------------------------------- */

void tsr__cpu_op_concat(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *a = dst->src[0], *b = dst->src[1];
    const int dim = dst->op_params[0];
    const size_t es = tsr_type_block_bytes(dst->type);
    int64_t r0, r1;
    tsr__cpu_split(tsr__nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i[4] = {0};
        row_coords(dst, r, &i[1], &i[2], &i[3]);
        char *d = at(dst, 0, i[1], i[2], i[3]);
        if (dim != 0) {
            const bool in_a = i[dim] < a->ne[dim];
            const tsr_tensor *s = in_a ? a : b;
            if (!in_a)
                i[dim] -= a->ne[dim];
            const char *x = at(s, 0, i[1], i[2], i[3]);
            if (s->nb[0] == es)
                memcpy(d, x, (size_t)dst->ne[0] * es);
            else
                for (int64_t k = 0; k < dst->ne[0]; k++) memcpy(d + k * es, x + k * (int64_t)s->nb[0], es);
            continue;
        }
        const char *xa = at(a, 0, i[1], i[2], i[3]), *xb = at(b, 0, i[1], i[2], i[3]);
        if (a->nb[0] == es && b->nb[0] == es) { /* contiguous rows: two block copies */
            memcpy(d, xa, (size_t)a->ne[0] * es);
            memcpy(d + a->ne[0] * (int64_t)es, xb, (size_t)b->ne[0] * es);
            continue;
        }
        for (int64_t k = 0; k < a->ne[0]; k++) memcpy(d + k * es, xa + k * (int64_t)a->nb[0], es);
        for (int64_t k = 0; k < b->ne[0]; k++) memcpy(d + (a->ne[0] + k) * es, xb + k * (int64_t)b->nb[0], es);
    }
}

void tsr__cpu_op_argmax(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *a = dst->src[0];
    int64_t r0, r1;
    tsr__cpu_split(tsr__nrows(a), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_coords(a, r, &i1, &i2, &i3);
        const char *x = at(a, 0, i1, i2, i3);
        float best = -INFINITY;
        int32_t bi = 0;
        for (int64_t k = 0; k < a->ne[0]; k++) {
            float v;
            memcpy(&v, x + k * (int64_t)a->nb[0], 4);
            if (v > best) {
                best = v;
                bi = (int32_t)k;
            }
        }
        memcpy(at(dst, i1, i2, i3, 0), &bi, 4);
    }
}

/* ---- rows ------------------------------------------------------------------ */

static int64_t load_index(const tsr_tensor *idx, int64_t i0, int64_t i1, int64_t i2) {
    const char *q = at(idx, i0, i1, i2, 0);
    if (idx->type == TSR_TYPE_I64) {
        int64_t v;
        memcpy(&v, q, 8);
        return v;
    }
    int32_t v;
    memcpy(&v, q, 4);
    return v;
}

/* A row of any supported type as floats (quantized rows are contiguous). */
static void row_to_float(const tsr_cpu_kernels *k, const tsr_tensor *t, const char *row, float *out) {
    if (tsr_type_is_quantized(t->type) || (t->type == TSR_TYPE_F32 && t->nb[0] == 4)) {
        if (t->type == TSR_TYPE_F32)
            memcpy(out, row, (size_t)t->ne[0] * 4);
        else
            k->to_float[t->type](row, out, t->ne[0]);
        return;
    }
    for (int64_t i = 0; i < t->ne[0]; i++) out[i] = tsr__cpu_load_f(t->type, row + i * (int64_t)t->nb[0]);
}

void tsr__cpu_op_get_rows(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *a = dst->src[0], *idx = dst->src[1];
    int64_t r0, r1;
    tsr__cpu_split(tsr__nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t j, i11, i12;
        row_coords(dst, r, &j, &i11, &i12);
        float *d = (float *)at(dst, 0, j, i11, i12);
        const int64_t row = load_index(idx, j, i11, i12);
        if (row < 0 || row >= a->ne[1]) {
            memset(d, 0, (size_t)dst->ne[0] * sizeof *d);
            continue;
        }
        if (a->flags & TSR_FLAG_IL8) {  /* an interleaved weight (1-D indices: cpu.c): block by block */
            _Alignas(32) char blk[256]; /* (one block: Q4_K 144 bytes) */
            const int64_t bs = tsr_type_block_size(a->type);
            for (int64_t b = 0; b < a->ne[0] / bs; b++) {
                tsr__il8_block(a, row, b, blk);
                p->k->to_float[a->type](blk, d + b * bs, bs);
            }
            continue;
        }
        row_to_float(p->k, a, at(a, 0, row, i11, i12), d);
    }
}

/* Writes n floats as a row of dst's type (quantized rows contiguous). */
static void float_to_row(const tsr_cpu_kernels *k, const tsr_tensor *t, const float *x, char *row, int64_t n) {
    if (tsr_type_is_quantized(t->type) || (t->type != TSR_TYPE_I32 && t->nb[0] == tsr_type_block_bytes(t->type))) {
        /* stored quantized rows: the reference quantizer (the kernel table's
         * 8-bit quantizers round like ggml's SIMD activation quantizers) */
        if (tsr_type_is_quantized(t->type))
            tsr__type_traits(t->type)->from_float(x, row, n);
        else
            k->from_float[t->type](x, row, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) store_f(t->type, row + i * (int64_t)t->nb[0], x[i]);
}

void tsr__cpu_op_set_rows(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *src = dst->src[1], *idx = dst->src[2];
    float *tmp = work_f32(p, (size_t)src->ne[0]);
    /* Threads own target rows (not source rows): rows written twice (repeated
     * indices) are then written in source order by one thread, so the last
     * one wins, as in a sequential loop, and no row is ever torn. */
    for (int64_t r = 0; r < tsr__nrows(src); r++) {
        int64_t j, i12, i13;
        row_coords(src, r, &j, &i12, &i13);
        const int64_t row = load_index(idx, j, i12 % idx->ne[1], i13 % idx->ne[2]);
        if (row < 0 || row >= dst->ne[1])
            continue;
        if ((row + (i12 + i13 * dst->ne[2]) * dst->ne[1]) % p->nth != p->ith)
            continue;
        row_to_float(p->k, src, at(src, 0, j, i12, i13), tmp);
        float_to_row(p->k, dst, tmp, at(dst, 0, row, i12, i13), dst->ne[0]);
    }
}

/* ---- cpy / cont --------------------------------------------------------------- */

/* Copies element-wise in logical row-major order; dst rows are produced one
 * at a time, gathering from src rows (cached in floats) as needed. */
static void copy_rows_float(const tsr_compute_params *p, const tsr_tensor *src, tsr_tensor *dst, int64_t r0,
                            int64_t r1) {
    const size_t per = (size_t)(dst->ne[0] + src->ne[0]);
    float *out = work_f32(p, per), *srow = out + dst->ne[0];
    int64_t cached = -1;
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_coords(dst, r, &i1, &i2, &i3);
        if (src->ne[0] == dst->ne[0]) { /* rows correspond one to one */
            int64_t j1, j2, j3;
            row_coords(src, r, &j1, &j2, &j3);
            row_to_float(p->k, src, at(src, 0, j1, j2, j3), out);
            float_to_row(p->k, dst, out, at(dst, 0, i1, i2, i3), dst->ne[0]);
            continue;
        }
        for (int64_t i = 0; i < dst->ne[0]; i++) {
            const int64_t flat = r * dst->ne[0] + i;
            const int64_t sr = flat / src->ne[0], s0 = flat % src->ne[0];
            if (sr != cached) {
                int64_t j1, j2, j3;
                row_coords(src, sr, &j1, &j2, &j3);
                row_to_float(p->k, src, at(src, 0, j1, j2, j3), srow);
                cached = sr;
            }
            out[i] = srow[s0];
        }
        float_to_row(p->k, dst, out, at(dst, 0, i1, i2, i3), dst->ne[0]);
    }
}

/* Same non-quantized type: byte copies, exact for every type (I32 too). */
static void copy_rows_same(const tsr_tensor *src, tsr_tensor *dst, int64_t r0, int64_t r1) {
    const size_t es = tsr_type_block_bytes(dst->type);
    if (src->ne[0] == dst->ne[0] && src->ne[1] == dst->ne[1] && src->ne[2] == dst->ne[2] &&
        src->ne[3] == dst->ne[3]) { /* the same shape (a permuted view made contiguous): row by row */
        const int64_t n = dst->ne[0], sb = (int64_t)src->nb[0], db = (int64_t)dst->nb[0];
        for (int64_t r = r0; r < r1; r++) {
            int64_t i1, i2, i3;
            row_coords(dst, r, &i1, &i2, &i3);
            char *d = at(dst, 0, i1, i2, i3);
            const char *s = at(src, 0, i1, i2, i3);
            if (sb == (int64_t)es && db == (int64_t)es)
                memcpy(d, s, (size_t)n * es);
            else if (es == 4)
                for (int64_t i = 0; i < n; i++) memcpy(d + i * db, s + i * sb, 4);
            else if (es == 2)
                for (int64_t i = 0; i < n; i++) memcpy(d + i * db, s + i * sb, 2);
            else
                for (int64_t i = 0; i < n; i++) memcpy(d + i * db, s + i * sb, es);
        }
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_coords(dst, r, &i1, &i2, &i3);
        char *d = at(dst, 0, i1, i2, i3);
        for (int64_t i = 0; i < dst->ne[0]; i++) {
            const int64_t flat = r * dst->ne[0] + i;
            int64_t j1, j2, j3;
            row_coords(src, flat / src->ne[0], &j1, &j2, &j3);
            memcpy(d + i * (int64_t)dst->nb[0], at(src, flat % src->ne[0], j1, j2, j3), es);
        }
    }
}

void tsr__cpu_op_cpy(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *src = dst->src[0];
    if (tsr__nelements(dst) == 0)
        return;
    int64_t r0, r1;
    tsr__cpu_split(tsr__nrows(dst), p->ith, p->nth, &r0, &r1);
    if (src->type == dst->type && tsr__is_contiguous(src) && tsr__is_contiguous(dst)) {
        const size_t rb = tsr_row_size(dst->type, dst->ne[0]);
        memcpy((char *)dst->data + r0 * rb, (const char *)src->data + r0 * rb, (size_t)(r1 - r0) * rb);
        return;
    }
    if (src->type == dst->type && !tsr_type_is_quantized(dst->type))
        copy_rows_same(src, dst, r0, r1);
    else
        copy_rows_float(p, src, dst, r0, r1);
}
