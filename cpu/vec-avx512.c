/*
 * vec-avx512.c - AVX-512 (F+BW+VL) variants of the float dot products and,
 * with VNNI, of the 8-bit dot products (two 32-element blocks per 512-bit
 * VPDPBUSD). Built with AVX-512 flags; used only when the CPU has them.
 * Anything not here keeps its AVX2 version.
 */
#include "cpu.h"
#include "simd.h"

static inline float hsum512(__m512 v) { return _mm512_reduce_add_ps(v); }

static void dot_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), _mm512_loadu_ps(y + i + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), _mm512_loadu_ps(y + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), a0);
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i), a1);
    }
    *s = hsum512(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

static inline __m512 load_fp16x16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* F16 weights x F32 activations (the dot type of F16 from AVX2 up). */
static void dot_f16_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx;
    const float *y = vy;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(load_fp16x16(x + i), _mm512_loadu_ps(y + i), a0);
        a1 = _mm512_fmadd_ps(load_fp16x16(x + i + 16), _mm512_loadu_ps(y + i + 16), a1);
        a2 = _mm512_fmadd_ps(load_fp16x16(x + i + 32), _mm512_loadu_ps(y + i + 32), a2);
        a3 = _mm512_fmadd_ps(load_fp16x16(x + i + 48), _mm512_loadu_ps(y + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(load_fp16x16(x + i), _mm512_loadu_ps(y + i), a0);
    float sum = hsum512(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    for (; i < n; i++) sum += TSR_FP16_TO_FP32(x[i]) * y[i];
    *s = sum;
}

#define YROW(T, c) ((const T *)((const char *)vy + (c) * ystride))

/* Two 32-byte blocks side by side in one 512-bit vector. */
static inline __m512i pair(const void *a, const void *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}
static inline __m512i pair_nibbles(const uint8_t *a, const uint8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(nibbles32(a)), nibbles32(b), 1);
}
static inline __m512 pair_scale(float a, float b) {
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(a)), _mm256_castps_pd(_mm256_set1_ps(b)), 1));
}
/* sum of x*y for signed bytes: |x| * (y with x's sign) through VPDPBUSD. */
static inline __m512i dot_s8s8_512(__m512i x, __m512i y) {
    const __m512i sy = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), _mm512_setzero_si512(), y);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(x), sy);
}

static void dot_q8_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q8_0 *x = vx, *y = vy;
    const int64_t nb = n / 32;
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512 d = pair_scale(TSR_FP16_TO_FP32(x[i].d) * TSR_FP16_TO_FP32(y[i].d),
                                    TSR_FP16_TO_FP32(x[i + 1].d) * TSR_FP16_TO_FP32(y[i + 1].d));
        const __m512i p = dot_s8s8_512(pair(x[i].qs, x[i + 1].qs), pair(y[i].qs, y[i + 1].qs));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
    }
    float sum = hsum512(acc);
    for (; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < 32; j++) sumi += x[i].qs[j] * y[i].qs[j];
        sum += (float)sumi * TSR_FP16_TO_FP32(x[i].d) * TSR_FP16_TO_FP32(y[i].d);
    }
    *s = sum;
}

static void dot_q4_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q4_0 *x = vx;
    const tsr_block_q8_0 *y = vy;
    const int64_t nb = n / 32;
    const __m512i eight = _mm512_set1_epi8(8);
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512 d = pair_scale(TSR_FP16_TO_FP32(x[i].d) * TSR_FP16_TO_FP32(y[i].d),
                                    TSR_FP16_TO_FP32(x[i + 1].d) * TSR_FP16_TO_FP32(y[i + 1].d));
        const __m512i qy = pair(y[i].qs, y[i + 1].qs);
        /* sum (q - 8) * y = sum q * y - sum 8 * y, both unsigned x signed */
        const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), pair_nibbles(x[i].qs, x[i + 1].qs), qy);
        const __m512i o = _mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, qy);
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(p, o)), acc);
    }
    float sum = hsum512(acc);
    for (; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += ((x[i].qs[j] & 0xF) - 8) * y[i].qs[j] + ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
        sum += (float)sumi * TSR_FP16_TO_FP32(x[i].d) * TSR_FP16_TO_FP32(y[i].d);
    }
    *s = sum;
}

static void dot_q4_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q4_1 *x = vx;
    const tsr_block_q8_1 *y = vy;
    const int64_t nb = n / 32;
    __m512 acc = _mm512_setzero_ps();
    float summs = 0;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        summs += TSR_FP16_TO_FP32(x[i].m) * TSR_FP16_TO_FP32(y[i].s) +
                 TSR_FP16_TO_FP32(x[i + 1].m) * TSR_FP16_TO_FP32(y[i + 1].s);
        const __m512 d = pair_scale(TSR_FP16_TO_FP32(x[i].d) * TSR_FP16_TO_FP32(y[i].d),
                                    TSR_FP16_TO_FP32(x[i + 1].d) * TSR_FP16_TO_FP32(y[i + 1].d));
        const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), pair_nibbles(x[i].qs, x[i + 1].qs),
                                              pair(y[i].qs, y[i + 1].qs));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
    }
    float sum = hsum512(acc) + summs;
    for (; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) sumi += (x[i].qs[j] & 0xF) * y[i].qs[j] + (x[i].qs[j] >> 4) * y[i].qs[j + 16];
        sum += (float)sumi * TSR_FP16_TO_FP32(x[i].d) * TSR_FP16_TO_FP32(y[i].d) +
               TSR_FP16_TO_FP32(x[i].m) * TSR_FP16_TO_FP32(y[i].s);
    }
    *s = sum;
}

/* Four activation rows against one weight row, two blocks per VPDPBUSD.
 * ux: the weight values as unsigned bytes; off: a per-block offset applied
 * as -off * sum(y) (8 for Q4_0, 0 otherwise); signed weights (Q8_0) use the
 * sign trick instead. */
static void dot4_q8_0(int64_t n, float s[4], const void *vx, const void *vy, size_t ystride) {
    const tsr_block_q8_0 *x = vx;
    const int64_t nb = n / 32;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i qx = pair(x[i].qs, x[i + 1].qs), ax = _mm512_abs_epi8(qx);
        const __mmask64 neg = _mm512_movepi8_mask(qx);
        const float d0 = TSR_FP16_TO_FP32(x[i].d), d1 = TSR_FP16_TO_FP32(x[i + 1].d);
        for (int c = 0; c < 4; c++) {
            const tsr_block_q8_0 *y = YROW(tsr_block_q8_0, c);
            const __m512i qy = pair(y[i].qs, y[i + 1].qs);
            const __m512i sy = _mm512_mask_sub_epi8(qy, neg, _mm512_setzero_si512(), qy);
            const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, sy);
            acc[c] = _mm512_fmadd_ps(pair_scale(d0 * TSR_FP16_TO_FP32(y[i].d), d1 * TSR_FP16_TO_FP32(y[i + 1].d)),
                                     _mm512_cvtepi32_ps(p), acc[c]);
        }
    }
    for (int c = 0; c < 4; c++) {
        s[c] = hsum512(acc[c]);
        if (i < nb) {
            float t;
            dot_q8_0_q8_0(32, &t, x + i, YROW(tsr_block_q8_0, c) + i);
            s[c] += t;
        }
    }
}

static void dot4_q4_0(int64_t n, float s[4], const void *vx, const void *vy, size_t ystride) {
    const tsr_block_q4_0 *x = vx;
    const int64_t nb = n / 32;
    const __m512i eight = _mm512_set1_epi8(8);
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i ux = pair_nibbles(x[i].qs, x[i + 1].qs);
        const float d0 = TSR_FP16_TO_FP32(x[i].d), d1 = TSR_FP16_TO_FP32(x[i + 1].d);
        for (int c = 0; c < 4; c++) {
            const tsr_block_q8_0 *y = YROW(tsr_block_q8_0, c);
            const __m512i qy = pair(y[i].qs, y[i + 1].qs);
            const __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ux, qy),
                                               _mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, qy));
            acc[c] = _mm512_fmadd_ps(pair_scale(d0 * TSR_FP16_TO_FP32(y[i].d), d1 * TSR_FP16_TO_FP32(y[i + 1].d)),
                                     _mm512_cvtepi32_ps(p), acc[c]);
        }
    }
    for (int c = 0; c < 4; c++) {
        s[c] = hsum512(acc[c]);
        if (i < nb) {
            float t;
            dot_q4_0_q8_0(32, &t, x + i, YROW(tsr_block_q8_0, c) + i);
            s[c] += t;
        }
    }
}

static void dot4_q4_1(int64_t n, float s[4], const void *vx, const void *vy, size_t ystride) {
    const tsr_block_q4_1 *x = vx;
    const int64_t nb = n / 32;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    float summs[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i ux = pair_nibbles(x[i].qs, x[i + 1].qs);
        const float d0 = TSR_FP16_TO_FP32(x[i].d), d1 = TSR_FP16_TO_FP32(x[i + 1].d);
        const float m0 = TSR_FP16_TO_FP32(x[i].m), m1 = TSR_FP16_TO_FP32(x[i + 1].m);
        for (int c = 0; c < 4; c++) {
            const tsr_block_q8_1 *y = YROW(tsr_block_q8_1, c);
            summs[c] += m0 * TSR_FP16_TO_FP32(y[i].s) + m1 * TSR_FP16_TO_FP32(y[i + 1].s);
            const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ux, pair(y[i].qs, y[i + 1].qs));
            acc[c] = _mm512_fmadd_ps(pair_scale(d0 * TSR_FP16_TO_FP32(y[i].d), d1 * TSR_FP16_TO_FP32(y[i + 1].d)),
                                     _mm512_cvtepi32_ps(p), acc[c]);
        }
    }
    for (int c = 0; c < 4; c++) {
        s[c] = hsum512(acc[c]) + summs[c];
        if (i < nb) {
            float t;
            dot_q4_1_q8_1(32, &t, x + i, YROW(tsr_block_q8_1, c) + i);
            s[c] += t;
        }
    }
}

void tsr__cpu_kernels_avx512(tsr_cpu_kernels *k, bool vnni) {
    k->name = vnni ? "avx512_vnni" : "avx512";
    k->vec_dot[TSR_TYPE_F32] = dot_f32;
    k->vec_dot[TSR_TYPE_F16] = dot_f16_f32; /* dot type F32, as set by the AVX2 table */
    if (!vnni) return;
    k->vec_dot[TSR_TYPE_Q8_0] = dot_q8_0_q8_0;
    k->vec_dot[TSR_TYPE_Q4_0] = dot_q4_0_q8_0;
    k->vec_dot[TSR_TYPE_Q4_1] = dot_q4_1_q8_1;
    k->vec_dot4[TSR_TYPE_Q8_0] = dot4_q8_0;
    k->vec_dot4[TSR_TYPE_Q4_0] = dot4_q4_0;
    k->vec_dot4[TSR_TYPE_Q4_1] = dot4_q4_1;
}
