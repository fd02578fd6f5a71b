/*
 * avx2/rows.c - AVX2+FMA+F16C row kernels of the element-wise and row ops
 * (exp_sum of softmax, silu/gelu (x g), add, mul, rms_norm, rope) and the
 * fused attention's online softmax step. Each must agree with its scalar
 * reference in ../ref.c.
 */
#include "../cpu.h"
#include "../simd.h"

#include <math.h>
#include <string.h>

/* GCC -O2 keeps loops over register arrays as loops, the arrays on the stack. */
#define UNROLL8 _Pragma("GCC unroll 8")

/* e^x for 8 floats, ggml's ggml_v_expf step for step (the references were
 * recorded with it; any other exp, however accurate, rounds some values
 * the other way, and the F16 rounding of the probabilities and the 8-bit
 * activation quantization downstream turn one ulp into visible logit
 * differences). -inf gives 0, overflow inf. */
static inline __m256 exp8(__m256 x) {
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
    const __m256 c = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n), _mm256_set1_ps(126), _CMP_GT_OQ);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    if (!_mm256_movemask_ps(c))
        return _mm256_fmadd_ps(j, k, k);
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 d = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n), _mm256_set1_ps(192), _CMP_GT_OQ);
    return _mm256_or_ps(
        _mm256_and_ps(d, _mm256_mul_ps(s1, s1)),
        _mm256_andnot_ps(d, _mm256_or_ps(_mm256_and_ps(c, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                                         _mm256_andnot_ps(c, _mm256_fmadd_ps(k, j, k)))));
}

/* Loads lanes [0, m) of 8 (m <= 8), the rest `fill`. */
static inline __m256 load_part(const float *x, int64_t m, float fill) {
    float t[8];
    for (int q = 0; q < 8; q++) t[q] = q < m ? x[q] : fill;
    return _mm256_loadu_ps(t);
}

/* Like ggml's AVX-512 softmax: the exps of each 16 elements are summed in
 * float (the _mm512_reduce_add_ps tree), the group sums in double. The tail
 * goes through the same exp and tree, padded with -inf (llama.cpp pads its
 * KV rows with masked cells, so its rows have no tail). */
static double exp_sum(int64_t n, float *y, float max) {
    const __m256 m = _mm256_set1_ps(max);
    double sum = 0;
    for (int64_t i = 0; i < n; i += 16) {
        __m256 e[2];
        for (int h = 0; h < 2; h++) {
            const int64_t o = i + 8 * h, left = n - o;
            if (left >= 8) {
                e[h] = exp8(_mm256_sub_ps(_mm256_loadu_ps(y + o), m));
                _mm256_storeu_ps(y + o, e[h]);
            } else if (left > 0) {
                e[h] = exp8(_mm256_sub_ps(load_part(y + o, left, -INFINITY), m));
                float t[8];
                _mm256_storeu_ps(t, e[h]);
                memcpy(y + o, t, (size_t)left * sizeof(float));
            } else {
                e[h] = _mm256_setzero_ps();
            }
        }
        sum += (double)hsum_ps256(_mm256_add_ps(e[1], e[0]));
    }
    return sum;
}

static void silu_mul(int64_t n, float *y, const float *x, const float *g) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        const int64_t left = n - i < 8 ? n - i : 8;
        const __m256 v = left == 8 ? _mm256_loadu_ps(x + i) : load_part(x + i, left, 0.0f);
        __m256 r = _mm256_div_ps(v, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, v))));
        if (g)
            r = _mm256_mul_ps(r, left == 8 ? _mm256_loadu_ps(g + i) : load_part(g + i, left, 0.0f));
        store_part(y + i, r, left);
    }
}

/* y = gelu(x) * g as x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3)
 * (0.5 x (1 + tanh u) without its cancellation for x < 0). */
static void gelu_mul(int64_t n, float *y, const float *x, const float *g) {
    const __m256 one = _mm256_set1_ps(1.0f), c2 = _mm256_set1_ps(-2.0f * TSR_GELU_C), a = _mm256_set1_ps(0.044715f);
    for (int64_t i = 0; i < n; i += 8) {
        const int64_t left = n - i < 8 ? n - i : 8;
        const __m256 v = left == 8 ? _mm256_loadu_ps(x + i) : load_part(x + i, left, 0.0f);
        const __m256 t = _mm256_mul_ps(c2, _mm256_fmadd_ps(_mm256_mul_ps(a, v), _mm256_mul_ps(v, v), v));
        __m256 r = _mm256_div_ps(v, _mm256_add_ps(one, exp8(t)));
        if (g)
            r = _mm256_mul_ps(r, left == 8 ? _mm256_loadu_ps(g + i) : load_part(g + i, left, 0.0f));
        store_part(y + i, r, left);
    }
}

/* The online softmax step (see cpu.h) of a row; up to 64 scores stay in
 * registers between the max and the exps. */
static float softmax_step(int64_t n, float *y, float scale, const float *mask, float *m, float slack) {
    const __m256 s = _mm256_set1_ps(scale);
    if (n > 64) { /* two passes through y */
        float mx = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            y[i] = y[i] * scale + (mask ? mask[i] : 0.0f);
            mx = y[i] > mx ? y[i] : mx;
        }
        if (!tsr__cpu_softmax_max(mx, y, n, m, slack))
            return 0;
        const __m256 mv = _mm256_set1_ps(*m);
        __m256 acc = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(y + i), mv));
            _mm256_storeu_ps(y + i, e);
            acc = _mm256_add_ps(acc, e);
        }
        if (i < n) {
            const __m256 e = exp8(_mm256_sub_ps(load_part(y + i, n - i, -INFINITY), mv));
            _mm256_maskstore_ps(y + i, lanes8(n - i), e);
            acc = _mm256_add_ps(acc, e);
        }
        return hsum_ps256(acc);
    }
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 v[8], mx = ninf;
    const int nv = (int)((n + 7) / 8);
    UNROLL8 for (int q = 0; q < 8; q++) {
        v[q] = ninf;
        if (q < nv && n - 8 * q >= 8) { /* whole vectors: plain loads */
            v[q] = _mm256_mul_ps(_mm256_loadu_ps(y + 8 * q), s);
            if (mask)
                v[q] = _mm256_add_ps(v[q], _mm256_loadu_ps(mask + 8 * q));
            mx = _mm256_max_ps(mx, v[q]);
        } else if (q < nv) { /* lanes past n: -inf */
            const __m256i k = lanes8(n - 8 * q);
            v[q] = _mm256_mul_ps(_mm256_maskload_ps(y + 8 * q, k), s);
            if (mask)
                v[q] = _mm256_add_ps(v[q], _mm256_maskload_ps(mask + 8 * q, k));
            v[q] = _mm256_blendv_ps(ninf, v[q], _mm256_castsi256_ps(k));
            mx = _mm256_max_ps(mx, v[q]);
        }
    }
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    r = _mm_max_ss(r, _mm_movehdup_ps(r));
    const float x = _mm_cvtss_f32(r);
    if (!tsr__cpu_softmax_max(x, y, n, m, slack))
        return 0;
    const __m256 mv = _mm256_set1_ps(*m);
    __m256 acc = _mm256_setzero_ps();
    UNROLL8 for (int q = 0; q < 8; q++) {
        if (q < nv) {
            const __m256 e = exp8(_mm256_sub_ps(v[q], mv));
            acc = _mm256_add_ps(acc, e);
            if (n - 8 * q >= 8) /* (a masked store is microcoded and slow on AMD cores) */
                _mm256_storeu_ps(y + 8 * q, e);
            else
                _mm256_maskstore_ps(y + 8 * q, lanes8(n - 8 * q), e);
        }
    }
    return hsum_ps256(acc);
}

/* ---- element-wise rows ------------------------------------------------------- */

/* y = x OP g, 16 at a time, the tail one by one. */
#define ROW_OP(name, vop, op)                                                             \
    static void name(int64_t n, float *y, const float *x, const float *g) {               \
        int64_t i = 0;                                                                    \
        for (; i + 16 <= n; i += 16) {                                                    \
            const __m256 a = vop(_mm256_loadu_ps(x + i), _mm256_loadu_ps(g + i));         \
            const __m256 b = vop(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(g + i + 8)); \
            _mm256_storeu_ps(y + i, a);                                                   \
            _mm256_storeu_ps(y + i + 8, b);                                               \
        }                                                                                 \
        for (; i < n; i++) y[i] = x[i] op g[i];                                           \
    }
ROW_OP(add, _mm256_add_ps, +)
ROW_OP(mul, _mm256_mul_ps, *)

/* The squares in float, summed in double (4 lanes each of two
 * accumulators), the mean and the scale in float as the reference. */
static void rms_norm(int64_t n, float *y, const float *x, float eps) {
    __m256d s0 = _mm256_setzero_pd(), s1 = s0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i), q = _mm256_mul_ps(v, v);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(q)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(q, 1)));
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(s0, s1));
    double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < n; i++) sum += (double)(x[i] * x[i]);
    const float sc = 1.0f / sqrtf((n ? (float)(sum / n) : 0.0f) + eps);
    const __m256 scale = _mm256_set1_ps(sc);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), scale));
    for (; i < n; i++) y[i] = x[i] * sc;
}

/* The rope rotation (cpu.h), 4 pairs per step (8, neox), the rest with
 * the reference's arithmetic. */
static void rope(int64_t n_dims, bool neox, float *y, const float *x, const float *cs) {
    if (!neox) {
        const __m256 sign = _mm256_castsi256_ps(
            _mm256_setr_epi32((int)0x80000000u, 0, (int)0x80000000u, 0, (int)0x80000000u, 0, (int)0x80000000u, 0));
        int64_t i = 0;
        for (; i + 8 <= n_dims; i += 8) {
            const __m256 v = _mm256_loadu_ps(x + i), c = _mm256_loadu_ps(cs + i);
            const __m256 p = _mm256_xor_ps(_mm256_mul_ps(_mm256_movehdup_ps(v), _mm256_permute_ps(c, 0xB1)), sign);
            _mm256_storeu_ps(y + i, _mm256_fmadd_ps(_mm256_moveldup_ps(v), c, p));
        }
        if (i < n_dims)
            tsr__cpu_rope_ref(n_dims - i, false, y + i, x + i, cs + i);
        return;
    }
    const int64_t h = n_dims / 2;
    int64_t i = 0;
    for (; i + 8 <= h; i += 8) {
        const __m256 a = _mm256_loadu_ps(cs + 2 * i), b = _mm256_loadu_ps(cs + 2 * i + 8);
        /* (c0 c1 c4 c5 | c2 c3 c6 c7) -> in order */
        const __m256 c = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
        const __m256 s = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
        const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + h + i);
        const __m256 y0 = _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s));
        const __m256 y1 = _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c));
        _mm256_storeu_ps(y + i, y0);
        _mm256_storeu_ps(y + h + i, y1);
    }
    for (; i < h; i++) {
        const float x0 = x[i], x1 = x[h + i];
        y[i] = fmaf(x0, cs[2 * i], -(x1 * cs[2 * i + 1]));
        y[h + i] = fmaf(x0, cs[2 * i + 1], x1 * cs[2 * i]);
    }
}

void tsr__cpu_avx2_rows(tsr_cpu_kernels *k) {
    k->exp_sum = exp_sum;
    k->silu_mul = silu_mul;
    k->gelu_mul = gelu_mul;
    k->add = add;
    k->mul = mul;
    k->rms_norm = rms_norm;
    k->rope = rope;
    k->softmax_step = softmax_step;
}
