/*
 * avx512/dot.c - AVX-512 dot products: F32 and F16 with any AVX-512, and
 * the paired 8-bit dots (one and four activation rows) with VNNI
 * (VPDPBUSD; they sum in ggml's AVX2 order). Each must agree with its
 * scalar reference in ../ref.c.
 */
#include "../cpu.h"
#include "../simd.h"

#include <math.h>
#include <stdlib.h>

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

/* F16 weights x F16 activations (rounded once per call, as in ggml), summed
 * like ggml's ggml_vec_dot_f16 (see the AVX2 variant and simd.h). */
static void dot_f16_f16(int64_t n, float *s, const void *vx, const void *vy) { *s = dot_f16_512(n, vx, vy); }

#define YROW(T, c) ((const T *)((const char *)vy + (c) * (ystride)))

/* Two 32-byte blocks side by side in one 512-bit vector. */
static inline __m512i pair(const void *a, const void *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}
static inline __m512i pair_nibbles(const uint8_t *a, const uint8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(nibbles32(a)), nibbles32(b), 1);
}
/* sum of x*y for signed bytes: |x| * (y with x's sign) through VPDPBUSD. */
static inline __m512i dot_s8s8_512(__m512i x, __m512i y) {
    const __m512i sy = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), _mm512_setzero_si512(), y);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(x), sy);
}

/* The 8-bit dots below compute the integer sums of two blocks at once in a
 * 512-bit vector, then apply the per-block scales to ONE 256-bit
 * accumulator block after block, exactly as ggml's AVX2 kernels (and
 * tinyBLAS's Q0 kernels) do: same bits as llama.cpp, about half the integer
 * work. A last odd block goes through 256-bit VPDPBUSD. */
static inline __m256 fma_pair(__m256 acc, float d0, float d1, __m512i p) {
    const __m512 f = _mm512_cvtepi32_ps(p);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm512_castps512_ps256(f), acc);
    return _mm256_fmadd_ps(_mm256_set1_ps(d1), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)), acc);
}
static inline __m256 fma_one(__m256 acc, float d, __m256i p) {
    return _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
}
static inline __m256i dot_s8s8_256(__m256i x, __m256i y) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(x), _mm256_sign_epi8(y, x));
}
static inline __m256i dot_u8s8_256(__m256i u, __m256i y) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, y); }
static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
#define F16F(h) TSR_FP16_TO_FP32(h)

/* sum (q - 8) * y = sum q * y - sum 8 * y: both unsigned x signed */
static inline __m512i dot_q4_0_pair(__m512i ux, __m512i qy) {
    return _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ux, qy),
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), qy));
}
static inline __m256i dot_q4_0_one(const uint8_t *qs, const int8_t *yq) {
    return dot_s8s8_256(_mm256_sub_epi8(nibbles32(qs), _mm256_set1_epi8(8)), load256(yq));
}

static void dot_q8_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q8_0 *x = vx, *y = vy;
    const int64_t nb = n / 32;
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2)
        acc = fma_pair(acc, F16F(x[i].d) * F16F(y[i].d), F16F(x[i + 1].d) * F16F(y[i + 1].d),
                       dot_s8s8_512(pair(x[i].qs, x[i + 1].qs), pair(y[i].qs, y[i + 1].qs)));
    if (i < nb)
        acc = fma_one(acc, F16F(x[i].d) * F16F(y[i].d), dot_s8s8_256(load256(x[i].qs), load256(y[i].qs)));
    *s = hsum_ps256(acc);
}

static void dot_q4_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q4_0 *x = vx;
    const tsr_block_q8_0 *y = vy;
    const int64_t nb = n / 32;
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2)
        acc = fma_pair(acc, F16F(x[i].d) * F16F(y[i].d), F16F(x[i + 1].d) * F16F(y[i + 1].d),
                       dot_q4_0_pair(pair_nibbles(x[i].qs, x[i + 1].qs), pair(y[i].qs, y[i + 1].qs)));
    if (i < nb)
        acc = fma_one(acc, F16F(x[i].d) * F16F(y[i].d), dot_q4_0_one(x[i].qs, y[i].qs));
    *s = hsum_ps256(acc);
}

static void dot_q4_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q4_1 *x = vx;
    const tsr_block_q8_1 *y = vy;
    const int64_t nb = n / 32;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        summs += F16F(x[i].m) * F16F(y[i].s); /* one block at a time (ggml's order) */
        summs += F16F(x[i + 1].m) * F16F(y[i + 1].s);
        acc = fma_pair(acc, F16F(x[i].d) * F16F(y[i].d), F16F(x[i + 1].d) * F16F(y[i + 1].d),
                       _mm512_dpbusd_epi32(_mm512_setzero_si512(), pair_nibbles(x[i].qs, x[i + 1].qs),
                                           pair(y[i].qs, y[i + 1].qs)));
    }
    if (i < nb) {
        summs += F16F(x[i].m) * F16F(y[i].s);
        acc = fma_one(acc, F16F(x[i].d) * F16F(y[i].d), dot_u8s8_256(nibbles32(x[i].qs), load256(y[i].qs)));
    }
    *s = hsum_ps256(acc) + summs;
}

/* Four activation rows against one weight row (same order per row). */
static void dot4_q8_0(int64_t n, float s[4], const void *vx, const void *vy, size_t ystride) {
    const tsr_block_q8_0 *x = vx;
    const int64_t nb = n / 32;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i qx = pair(x[i].qs, x[i + 1].qs), ax = _mm512_abs_epi8(qx);
        const __mmask64 neg = _mm512_movepi8_mask(qx);
        const float d0 = F16F(x[i].d), d1 = F16F(x[i + 1].d);
        for (int c = 0; c < 4; c++) {
            const tsr_block_q8_0 *y = YROW(tsr_block_q8_0, c);
            const __m512i qy = pair(y[i].qs, y[i + 1].qs);
            const __m512i sy = _mm512_mask_sub_epi8(qy, neg, _mm512_setzero_si512(), qy);
            acc[c] = fma_pair(acc[c], d0 * F16F(y[i].d), d1 * F16F(y[i + 1].d),
                              _mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, sy));
        }
    }
    for (int c = 0; c < 4; c++) {
        const tsr_block_q8_0 *y = YROW(tsr_block_q8_0, c);
        if (i < nb)
            acc[c] = fma_one(acc[c], F16F(x[i].d) * F16F(y[i].d), dot_s8s8_256(load256(x[i].qs), load256(y[i].qs)));
        s[c] = hsum_ps256(acc[c]);
    }
}

static void dot4_q4_0(int64_t n, float s[4], const void *vx, const void *vy, size_t ystride) {
    const tsr_block_q4_0 *x = vx;
    const int64_t nb = n / 32;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i ux = pair_nibbles(x[i].qs, x[i + 1].qs);
        const float d0 = F16F(x[i].d), d1 = F16F(x[i + 1].d);
        for (int c = 0; c < 4; c++) {
            const tsr_block_q8_0 *y = YROW(tsr_block_q8_0, c);
            acc[c] = fma_pair(acc[c], d0 * F16F(y[i].d), d1 * F16F(y[i + 1].d),
                              dot_q4_0_pair(ux, pair(y[i].qs, y[i + 1].qs)));
        }
    }
    for (int c = 0; c < 4; c++) {
        const tsr_block_q8_0 *y = YROW(tsr_block_q8_0, c);
        if (i < nb)
            acc[c] = fma_one(acc[c], F16F(x[i].d) * F16F(y[i].d), dot_q4_0_one(x[i].qs, y[i].qs));
        s[c] = hsum_ps256(acc[c]);
    }
}

static void dot4_q4_1(int64_t n, float s[4], const void *vx, const void *vy, size_t ystride) {
    const tsr_block_q4_1 *x = vx;
    const int64_t nb = n / 32;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float summs[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i ux = pair_nibbles(x[i].qs, x[i + 1].qs);
        const float d0 = F16F(x[i].d), d1 = F16F(x[i + 1].d);
        const float m0 = F16F(x[i].m), m1 = F16F(x[i + 1].m);
        for (int c = 0; c < 4; c++) {
            const tsr_block_q8_1 *y = YROW(tsr_block_q8_1, c);
            summs[c] += m0 * F16F(y[i].s);
            summs[c] += m1 * F16F(y[i + 1].s);
            acc[c] = fma_pair(acc[c], d0 * F16F(y[i].d), d1 * F16F(y[i + 1].d),
                              _mm512_dpbusd_epi32(_mm512_setzero_si512(), ux, pair(y[i].qs, y[i + 1].qs)));
        }
    }
    for (int c = 0; c < 4; c++) {
        const tsr_block_q8_1 *y = YROW(tsr_block_q8_1, c);
        if (i < nb) {
            summs[c] += F16F(x[i].m) * F16F(y[i].s);
            acc[c] = fma_one(acc[c], F16F(x[i].d) * F16F(y[i].d), dot_u8s8_256(nibbles32(x[i].qs), load256(y[i].qs)));
        }
        s[c] = hsum_ps256(acc[c]) + summs[c];
    }
}

void tsr__cpu_avx512_dot(tsr_cpu_kernels *k, bool vnni) {
    k->vec_dot[TSR_TYPE_F32] = dot_f32;
    k->vec_dot[TSR_TYPE_F16] = dot_f16_f16;
    if (!vnni)
        return;
    k->vec_dot[TSR_TYPE_Q8_0] = dot_q8_0_q8_0;
    k->vec_dot[TSR_TYPE_Q4_0] = dot_q4_0_q8_0;
    k->vec_dot[TSR_TYPE_Q4_1] = dot_q4_1_q8_1;
    k->vec_dot4[TSR_TYPE_Q8_0] = dot4_q8_0;
    /* (batches: the VPDPBUSD gemms of gemm.c; the four-column dots serve mul_mat_id) */
    k->vec_dot4[TSR_TYPE_Q4_0] = dot4_q4_0;
    k->vec_dot4[TSR_TYPE_Q4_1] = dot4_q4_1;
}
