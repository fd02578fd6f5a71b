/*
 * avx2/quantize.c - AVX2+FMA+F16C activation quantizers (from_float:
 * Q8_0, Q8_1, Q8_K, F16) and F16's dequantizer. Each must give the bits of
 * its scalar reference in libtensr/quant/quants.c.
 */
#include "../cpu.h"
#include "../simd.h"

#include <math.h>
#include <string.h>

/* ---- activation quantizers --------------------------------------------------- */

/* GCC -O2 keeps a loop over a small register array as a loop, the array on
 * the stack (a store and a load per element): unrolled, it stays in registers. */
#define UNROLL4 _Pragma("GCC unroll 4")

static inline float absmax32(const float *x, __m256 v[4]) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    UNROLL4 for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        m = _mm256_max_ps(_mm256_andnot_ps(sign, v[k]), m); /* (a NaN operand first: the other is kept) */
    }
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    r = _mm_max_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* 32 floats * id rounded to int8, half to even: ggml's x86 activation
 * quantizers (which the references were recorded with) round this way,
 * unlike its reference quantizers (roundf). A product that is NaN (a NaN,
 * or an infinity times the multiplier 0 of its block) or infinite (a
 * multiplier past FLT_MAX: a block of values below 127 / FLT_MAX) converts
 * to INT_MIN, packed to -128, which no other product reaches: 0 instead,
 * as the references (libtensr/quant/quants.c). */
static inline __m256i quant32(__m256 v[4], float id) {
    const __m256 mul = _mm256_set1_ps(id);
    __m256i i32[4];
    UNROLL4 for (int k = 0; k < 4; k++) i32[k] = _mm256_cvtps_epi32(
        _mm256_round_ps(_mm256_mul_ps(v[k], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256i p01 = _mm256_packs_epi32(i32[0], i32[1]), p23 = _mm256_packs_epi32(i32[2], i32[3]);
    __m256i p = _mm256_packs_epi16(p01, p23);
    p = _mm256_andnot_si256(_mm256_cmpeq_epi8(p, _mm256_set1_epi8(-128)), p);
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The scale is max / 127 and the multiplier 127 / max (not 1 / d), as in
 * ggml's x86 quantize_row_q8_0/q8_1: the multiplier decides the rounding. */
static void quantize_q8_0(const float *x, void *vy, int64_t n) {
    tsr_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        __m256 v[4];
        const float amax = absmax32(x, v);
        y[i].d = fp16_f16c(amax / 127.0f);
        _mm256_storeu_si256((__m256i *)y[i].qs, quant32(v, amax != 0.0f ? 127.0f / amax : 0.0f));
    }
}

static void quantize_q8_1(const float *x, void *vy, int64_t n) {
    tsr_block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        __m256 v[4];
        const float amax = absmax32(x, v), d = amax / 127.0f;
        const __m256i q = quant32(v, amax != 0.0f ? 127.0f / amax : 0.0f);
        _mm256_storeu_si256((__m256i *)y[i].qs, q);
        const __m256i s = dot_s8s8(_mm256_set1_epi8(1), q);
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
        y[i].d = fp16_f16c(d);
        y[i].s = fp16_f16c(d * (float)_mm_cvtsi128_si32(t));
    }
}

/* Q8_K (the activations of the K-quant dots) bit for bit as the reference
 * tsr__quantize_q8_K: the value of largest magnitude (the first of equal
 * ones; NaNs ignored) maps to -127, the products rounded half to even (the
 * default MXCSR rounding of VCVTPS2DQ, as the reference's magic number),
 * products that are not finite or past 2^22 (an infinite multiplier: the
 * block's largest magnitude infinite, or below 127 / FLT_MAX) 0 as there;
 * 16-value sums. The reference's scalar loops cost 7-8 cycles a value and
 * every thread converts the whole row of a decode matmul. */
static void quantize_q8_K(const float *x, void *vy, int64_t n) {
    tsr_block_q8_K *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(0x1p22f);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < n / TSR_QK_K; i++, x += TSR_QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < TSR_QK_K; j += 8) /* (a NaN operand first: the other is kept) */
            m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), m);
        __m128 r = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        r = _mm_max_ps(r, _mm_movehl_ps(r, r));
        r = _mm_max_ss(r, _mm_movehdup_ps(r));
        const float amax = _mm_cvtss_f32(r);
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float max = 0.0f;
        const __m256 av = _mm256_set1_ps(amax);
        for (int j = 0; j < TSR_QK_K; j += 8) {
            const int hit = _mm256_movemask_ps(
                _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), av, _CMP_EQ_OQ));
            if (hit) {
                max = x[j + __builtin_ctz((unsigned)hit)];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 mul = _mm256_set1_ps(iscale);
        for (int j = 0; j < TSR_QK_K; j += 32) {
            __m256i q32[4];
            UNROLL4 for (int k = 0; k < 4; k++) {
                const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), mul);
                const __m256 ok = _mm256_cmp_ps(_mm256_andnot_ps(sign, p), big, _CMP_LT_OQ);
                q32[k] = _mm256_cvtps_epi32(_mm256_and_ps(p, ok));
            }
            const __m256i q = _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(_mm256_packs_epi32(q32[0], q32[1]), _mm256_packs_epi32(q32[2], q32[3])),
                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(y[i].qs + j), q);
            __m256i t = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16); /* sums of 4, 16 values a half */
            t = _mm256_hadd_epi32(t, t);
            t = _mm256_hadd_epi32(t, t);
            y[i].bsums[j / 16] = (int16_t)_mm256_extract_epi32(t, 0);
            y[i].bsums[j / 16 + 1] = (int16_t)_mm256_extract_epi32(t, 4);
        }
        y[i].d = 1 / iscale;
    }
}

static void f16_from_float(const float *x, void *vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = tsr__fp32_to_fp16(x[i]);
}

static void f16_to_float(const void *vx, float *y, int64_t n) {
    const uint16_t *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_fp16x8(x + i));
    for (; i < n; i++) y[i] = TSR_FP16_TO_FP32(x[i]);
}

void tsr__cpu_avx2_quantize(tsr_cpu_kernels *k) {
    k->from_float[TSR_TYPE_Q8_0] = quantize_q8_0;
    k->from_float[TSR_TYPE_Q8_1] = quantize_q8_1;
    k->from_float[TSR_TYPE_Q8_K] = quantize_q8_K;
    k->from_float[TSR_TYPE_F16] = f16_from_float;
    k->to_float[TSR_TYPE_F16] = f16_to_float;
}
