/*
 * avx512/rows.c - AVX-512 row kernels of the element-wise and row ops
 * (exp_sum, silu/gelu (x g), add, mul, rms_norm, rope) and the fused
 * attention's online softmax step. Each must agree with its scalar
 * reference in ../ref.c.
 */
#include "../cpu.h"
#include "../simd.h"

#include <math.h>
#include <string.h>

/* GCC -O2 keeps loops over register arrays as loops, the arrays on the stack. */
#define UNROLL8 _Pragma("GCC unroll 8")

/* e^x for 16 floats, as ggml's AVX-512 ggml_v_expf (its last step scales by
 * 2^n with VSCALEFPS, which rounds differently from the AVX2 variant's
 * k + k*j): the softmax and SiLU of llama.cpp on AVX-512 machines. */
static inline __m512 exp16(__m512 x) {
    const __m512 r = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
    const __m512 n = _mm512_sub_ps(z, r);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                      _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __mmask16 d = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192), _CMP_GT_OQ);
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                        _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
        u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
    const __m512 res = _mm512_scalef_ps(j, n);
    if (!d)
        return res;
    const __m512 alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ),
                                            _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    return _mm512_mask_blend_ps(d, res, alt);
}

/* The online softmax step (see cpu.h) of a row; up to 64 scores stay in
 * registers between the max and the exps. */
static float softmax_step(int64_t n, float *y, float scale, const float *mask, float *m, float slack) {
    const __m512 s = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    if (n > 64) { /* two passes through y */
        __m512 mx = ninf;
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 k = lanes16(n - i);
            __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, y + i), s);
            if (mask)
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, mask + i));
            _mm512_mask_storeu_ps(y + i, k, v);
            mx = _mm512_mask_max_ps(mx, k, mx, v);
        }
        const float x = _mm512_reduce_max_ps(mx);
        if (!tsr__cpu_softmax_max(x, y, n, m, slack))
            return 0;
        const __m512 mv = _mm512_set1_ps(*m);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 k = lanes16(n - i);
            const __m512 e = exp16(_mm512_sub_ps(_mm512_mask_loadu_ps(ninf, k, y + i), mv));
            _mm512_mask_storeu_ps(y + i, k, e);
            acc = _mm512_add_ps(acc, e);
        }
        return _mm512_reduce_add_ps(acc);
    }
    __m512 v[4], mx = ninf;
    UNROLL8 for (int q = 0; q < 4; q++) { /* lanes past n: -inf */
        const __mmask16 k = lanes16(n - 16 * q > 0 ? n - 16 * q : 0);
        v[q] = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, y + 16 * q), s);
        if (mask)
            v[q] = _mm512_add_ps(v[q], _mm512_maskz_loadu_ps(k, mask + 16 * q));
        v[q] = _mm512_mask_mov_ps(ninf, k, v[q]);
        mx = _mm512_max_ps(mx, v[q]);
    }
    const float x = _mm512_reduce_max_ps(mx);
    if (!tsr__cpu_softmax_max(x, y, n, m, slack))
        return 0;
    const __m512 mv = _mm512_set1_ps(*m);
    __m512 acc = _mm512_setzero_ps();
    UNROLL8 for (int q = 0; q < 4; q++) {
        const __mmask16 k = lanes16(n - 16 * q > 0 ? n - 16 * q : 0);
        const __m512 e = exp16(_mm512_sub_ps(v[q], mv));
        _mm512_mask_storeu_ps(y + 16 * q, k, e);
        acc = _mm512_add_ps(acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}

/* y = silu(x) * g (g NULL: silu), as ggml_vec_swiglu_f32 / ggml_v_silu. */
static void silu_mul(int64_t n, float *y, const float *x, const float *g) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = lanes16(n - i);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512 r = _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), v))));
        if (g)
            r = _mm512_mul_ps(r, _mm512_maskz_loadu_ps(m, g + i));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

/* y = gelu(x) * g as the AVX2 variant's: x / (1 + exp(-2u)). */
static void gelu_mul(int64_t n, float *y, const float *x, const float *g) {
    const __m512 c2 = _mm512_set1_ps(-2.0f * TSR_GELU_C), a = _mm512_set1_ps(0.044715f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = lanes16(n - i);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        const __m512 t = _mm512_mul_ps(c2, _mm512_fmadd_ps(_mm512_mul_ps(a, v), _mm512_mul_ps(v, v), v));
        __m512 r = _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(t)));
        if (g)
            r = _mm512_mul_ps(r, _mm512_maskz_loadu_ps(m, g + i));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

/* Softmax exps as ggml_vec_soft_max_f32 on AVX-512: each 16 summed by
 * _mm512_reduce_add_ps in float, the group sums in double; a tail is padded
 * with -inf (llama.cpp's KV rows have none). */
static double exp_sum(int64_t n, float *y, float max) {
    const __m512 mx = _mm512_set1_ps(max);
    double sum = 0;
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = lanes16(n - i);
        const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, y + i);
        const __m512 e = exp16(_mm512_sub_ps(v, mx));
        _mm512_mask_storeu_ps(y + i, m, e);
        sum += (double)_mm512_reduce_add_ps(e);
    }
    return sum;
}

/* y = vop(x, g), 32 at a time, the tail masked. */
#define ROW_OP(name, vop)                                                                                           \
    static void name(int64_t n, float *y, const float *x, const float *g) {                                         \
        int64_t i = 0;                                                                                              \
        for (; i + 32 <= n; i += 32) {                                                                              \
            const __m512 a = vop(_mm512_loadu_ps(x + i), _mm512_loadu_ps(g + i));                                   \
            const __m512 b = vop(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(g + i + 16));                         \
            _mm512_storeu_ps(y + i, a);                                                                             \
            _mm512_storeu_ps(y + i + 16, b);                                                                        \
        }                                                                                                           \
        for (; i < n; i += 16) {                                                                                    \
            const __mmask16 m = lanes16(n - i);                                                                     \
            _mm512_mask_storeu_ps(y + i, m, vop(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, g + i))); \
        }                                                                                                           \
    }
ROW_OP(add, _mm512_add_ps)
ROW_OP(mul, _mm512_mul_ps)

/* The squares in float, summed in double (8 lanes each of two accumulators),
 * the mean and the scale in float as the reference. */
static void rms_norm(int64_t n, float *y, const float *x, float eps) {
    __m512d s0 = _mm512_setzero_pd(), s1 = s0;
    for (int64_t i = 0; i < n; i += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(lanes16(n - i), x + i);
        const __m512 q = _mm512_mul_ps(v, v);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(q)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(q), 1))));
    }
    const double sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    const __m512 scale = _mm512_set1_ps(1.0f / sqrtf((n ? (float)(sum / n) : 0.0f) + eps));
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = lanes16(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), scale));
    }
}

/* The rope rotation (cpu.h), 8 pairs per step (16, neox), the reference's
 * fused multiply-adds: adjacent pairs take x0 (even lanes duplicated) times
 * cs as stored, plus or minus x1 times cs with each pair swapped. */
static void rope(int64_t n_dims, bool neox, float *y, const float *x, const float *cs) {
    if (!neox) {
        const __m512i sign = _mm512_set4_epi32(0, (int)0x80000000u, 0, (int)0x80000000u);
        for (int64_t i = 0; i < n_dims; i += 16) {
            const __mmask16 m = lanes16(n_dims - i);
            const __m512 v = _mm512_maskz_loadu_ps(m, x + i), c = _mm512_maskz_loadu_ps(m, cs + i);
            const __m512 p = _mm512_castsi512_ps(_mm512_xor_si512(
                _mm512_castps_si512(_mm512_mul_ps(_mm512_movehdup_ps(v), _mm512_permute_ps(c, 0xB1))), sign));
            _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(_mm512_moveldup_ps(v), c, p));
        }
        return;
    }
    const int64_t h = n_dims / 2;
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    for (int64_t i = 0; i < h; i += 16) {
        const __mmask16 m = lanes16(h - i);
        const __mmask16 mlo = lanes16(2 * (h - i)), mhi = lanes16(2 * (h - i) > 16 ? 2 * (h - i) - 16 : 0);
        const __m512 a = _mm512_maskz_loadu_ps(mlo, cs + 2 * i), b = _mm512_maskz_loadu_ps(mhi, cs + 2 * i + 16);
        const __m512 c = _mm512_permutex2var_ps(a, ev, b), s = _mm512_permutex2var_ps(a, od, b);
        const __m512 x0 = _mm512_maskz_loadu_ps(m, x + i), x1 = _mm512_maskz_loadu_ps(m, x + h + i);
        const __m512 y0 = _mm512_fmsub_ps(x0, c, _mm512_mul_ps(x1, s));
        const __m512 y1 = _mm512_fmadd_ps(x0, s, _mm512_mul_ps(x1, c));
        _mm512_mask_storeu_ps(y + i, m, y0);
        _mm512_mask_storeu_ps(y + h + i, m, y1);
    }
}

void tsr__cpu_avx512_rows(tsr_cpu_kernels *k) {
    k->exp_sum = exp_sum;
    k->silu_mul = silu_mul;
    k->gelu_mul = gelu_mul;
    k->add = add;
    k->mul = mul;
    k->rms_norm = rms_norm;
    k->rope = rope;
    k->softmax_step = softmax_step;
}
