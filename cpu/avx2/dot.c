/*
 * avx2/dot.c - AVX2+FMA+F16C dot products: one weight row with one
 * activation row (vec_dot) and with four (vec_dot4, batched matmuls).
 * Each must agree with its scalar reference in ../ref.c.
 */
#include "../cpu.h"
#include "../simd.h"

#include <math.h>
#include <string.h>
#include <stddef.h>

static void dot_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
    float sum = hsum_ps256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) sum += x[i] * y[i];
    *s = sum;
}

static inline __m256 load_bf16x8(const uint16_t *p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

static void dot_bf16(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx;
    const float *y = vy;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(load_bf16x8(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(load_bf16x8(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
    }
    float sum = hsum_ps256(_mm256_add_ps(a0, a1));
    for (; i < n; i++) sum += tsr__bf16_to_fp32(x[i]) * y[i];
    *s = sum;
}

static void dot_q4_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q4_0 *x = vx;
    const tsr_block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    const __m256i off = _mm256_set1_epi8(8);
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256 d = _mm256_set1_ps(TSR_FP16_TO_FP32(x[i].d) * TSR_FP16_TO_FP32(y[i].d));
        const __m256i qx = _mm256_sub_epi8(nibbles32(x[i].qs), off);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_s8s8(qx, qy)), acc);
    }
    *s = hsum_ps256(acc);
}

static void dot_q4_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q4_1 *x = vx;
    const tsr_block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        summs += TSR_FP16_TO_FP32(x[i].m) * TSR_FP16_TO_FP32(y[i].s);
        const __m256 d = _mm256_set1_ps(TSR_FP16_TO_FP32(x[i].d) * TSR_FP16_TO_FP32(y[i].d));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_u8s8(nibbles32(x[i].qs), qy)), acc);
    }
    *s = hsum_ps256(acc) + summs;
}

static void dot_q5_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q5_0 *x = vx;
    const tsr_block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256 d = _mm256_set1_ps(TSR_FP16_TO_FP32(x[i].d) * TSR_FP16_TO_FP32(y[i].d));
        /* q - 16 == q | 0xF0 as a signed byte when the 5th bit is clear */
        const __m256i hi = _mm256_andnot_si256(bits_to_bytes32(x[i].qh), _mm256_set1_epi8((char)0xF0));
        const __m256i qx = _mm256_or_si256(nibbles32(x[i].qs), hi);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_s8s8(qx, qy)), acc);
    }
    *s = hsum_ps256(acc);
}

static void dot_q5_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q5_1 *x = vx;
    const tsr_block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        summs += TSR_FP16_TO_FP32(x[i].m) * TSR_FP16_TO_FP32(y[i].s);
        const __m256 d = _mm256_set1_ps(TSR_FP16_TO_FP32(x[i].d) * TSR_FP16_TO_FP32(y[i].d));
        const __m256i hi = _mm256_and_si256(bits_to_bytes32(x[i].qh), _mm256_set1_epi8(0x10));
        const __m256i qx = _mm256_or_si256(nibbles32(x[i].qs), hi);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_u8s8(qx, qy)), acc);
    }
    *s = hsum_ps256(acc) + summs;
}

static void dot_q8_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q8_0 *x = vx, *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256 d = _mm256_set1_ps(TSR_FP16_TO_FP32(x[i].d) * TSR_FP16_TO_FP32(y[i].d));
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_s8s8(qx, qy)), acc);
    }
    *s = hsum_ps256(acc);
}

/* Unpacks the 12 scale bytes of Q4_K/Q5_K into 8 scales then 8 mins. */
static inline void unpack_k4_scales(const uint8_t *q, uint8_t out[16]) {
    /* byte-parallel form of tsr__get_scale_min_k4 on 32-bit words: scales
     * 0..3 and mins 0..3 are the low 6 bits of bytes 0..7; scales/mins 4..7
     * take their low 4 bits from bytes 8..11 and their top 2 bits from the
     * top of bytes 0..3 / 4..7 */
    uint32_t u[3], w[4];
    memcpy(u, q, 12);
    const uint32_t m6 = 0x3f3f3f3fu, m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    w[0] = u[0] & m6;
    w[1] = (u[2] & m4) | (((u[0] >> 6) & m2) << 4);
    w[2] = u[1] & m6;
    w[3] = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4);
    memcpy(out, w, 16);
}

/* Broadcast 16-bit lane k of a 128-bit vector to a 256-bit one. */
static inline __m256i bcast16(__m128i v, int k) {
    const __m128i m = _mm_set1_epi16((short)(((2 * k + 1) << 8) | (2 * k)));
    const __m128i b = _mm_shuffle_epi8(v, m);
    return _mm256_set_m128i(b, b);
}

/* Min term of Q4_K/Q5_K: sum_j m_j * (bsums[2j] + bsums[2j+1]). */
static inline int k4_min_term(const uint8_t *mins, const int16_t *bsums) {
    const __m128i b = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bsums),
                                     _mm_loadu_si128((const __m128i *)(bsums + 8)));
    const __m128i m = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mins));
    __m128i p = _mm_madd_epi16(m, b);
    p = _mm_add_epi32(p, _mm_shuffle_epi32(p, 0x4E));
    p = _mm_add_epi32(p, _mm_shuffle_epi32(p, 0xB1));
    return _mm_cvtsi128_si32(p);
}

static void dot_q4_K_q8_K(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q4_K *x = vx;
    const tsr_block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0;
    for (int64_t i = 0; i < n / TSR_QK_K; i++) {
        uint8_t sm[16];
        unpack_k4_scales(x[i].scales, sm);
        const float d = y[i].d * TSR_FP16_TO_FP32(x[i].d), dmin = y[i].d * TSR_FP16_TO_FP32(x[i].dmin);
        accm += dmin * (float)k4_min_term(sm + 8, y[i].bsums);
        const __m128i sc = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sm));
        __m256i sumi = _mm256_setzero_si256();
        const uint8_t *q4 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        for (int j = 0; j < 4; j++, q4 += 32, q8 += 64) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)q4);
            const __m256i lo = _mm256_and_si256(bits, m4), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8));
            const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(bcast16(sc, 2 * j), pl));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(bcast16(sc, 2 * j + 1), ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum_ps256(acc) - accm;
}

static void dot_q5_K_q8_K(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q5_K *x = vx;
    const tsr_block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0;
    for (int64_t i = 0; i < n / TSR_QK_K; i++) {
        uint8_t sm[16];
        unpack_k4_scales(x[i].scales, sm);
        const float d = y[i].d * TSR_FP16_TO_FP32(x[i].d), dmin = y[i].d * TSR_FP16_TO_FP32(x[i].dmin);
        accm += dmin * (float)k4_min_term(sm + 8, y[i].bsums);
        const __m128i sc = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sm));
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m256i sumi = _mm256_setzero_si256();
        const uint8_t *q5 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        for (int j = 0; j < 4; j++, q5 += 32, q8 += 64) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)q5);
            const __m128i sh0 = _mm_cvtsi32_si128(2 * j), sh1 = _mm_cvtsi32_si128(2 * j + 1);
            const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hbits, sh0), one), 4);
            const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hbits, sh1), one), 4);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(bits, m4), h0);
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), h1);
            const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8));
            const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(bcast16(sc, 2 * j), pl));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(bcast16(sc, 2 * j + 1), ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum_ps256(acc) - accm;
}

/* Scale vector for 32 Q6_K elements: 16-element halves use sc[0] / sc[1]. */
static inline __m256i q6_scales(const int8_t *sc) {
    return _mm256_set_m128i(_mm_set1_epi16(sc[1]), _mm_set1_epi16(sc[0]));
}

static void dot_q6_K_q8_K(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q6_K *x = vx;
    const tsr_block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / TSR_QK_K; i++) {
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *q8 = y[i].qs, *sc = x[i].scales;
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++, ql += 64, qh += 32, q8 += 128, sc += 8) {
            const __m256i b1 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i b2 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i bh = _mm256_loadu_si256((const __m256i *)qh);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(b1, m4), _mm256_slli_epi16(_mm256_and_si256(bh, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(b2, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 2), m2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 4), m2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 6), m2), 4));
            for (int g = 0; g < 4; g++) {
                const __m256i y8 = _mm256_loadu_si256((const __m256i *)(q8 + 32 * g));
                const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q[g], y8), _mm256_maddubs_epi16(m32, y8));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(q6_scales(sc + 2 * g), p));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * TSR_FP16_TO_FP32(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum_ps256(acc);
}

/* ---- one weight row x four activation rows (batched matmul) ----------------- */

#define YROW(T, c) ((const T *)((const char *)vy + (c) * (ystride)))

static inline void store4(float s[4], __m256 acc[4]) {
    for (int c = 0; c < 4; c++) s[c] = hsum_ps256(acc[c]);
}

/* F16 weights against F16 activations (rounded to F16 once per call, F16's
 * dot type, as in ggml), summed like ggml's AVX-512 ggml_vec_dot_f16: chunks
 * of 64 into four 16-lane accumulators (here two 8-lane halves each),
 * reduced (a0 + a2) + (a1 + a3), then the _mm512_reduce_add_ps tree; a tail
 * counts as zero-padded to 64 (llama.cpp's KV rows are padded). */
static void dot_f16_f16(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    __m256 a[8];
    for (int q = 0; q < 8; q++) a[q] = _mm256_setzero_ps();
    uint16_t tx[64], ty[64];
    for (int64_t i = 0; i < n; i += 64) {
        const uint16_t *px = x + i, *py = y + i;
        if (n - i < 64) {
            memset(tx, 0, sizeof tx), memset(ty, 0, sizeof ty);
            memcpy(tx, px, (size_t)(n - i) * 2), memcpy(ty, py, (size_t)(n - i) * 2);
            px = tx, py = ty;
        }
        for (int q = 0; q < 8; q++) a[q] = _mm256_fmadd_ps(load_fp16x8(px + 8 * q), load_fp16x8(py + 8 * q), a[q]);
    }
    for (int h = 0; h < 2; h++) { /* accumulator j = halves a[2j], a[2j+1] */
        a[h] = _mm256_add_ps(a[h], a[4 + h]);
        a[2 + h] = _mm256_add_ps(a[2 + h], a[6 + h]);
        a[h] = _mm256_add_ps(a[h], a[2 + h]);
    }
    *s = hsum_ps256(_mm256_add_ps(a[1], a[0]));
}

/* Shared by Q4_0 and Q8_0 weights: signed 8-bit values qx per block. */
static inline void dot4_s8_block(__m256i qx, float dx, const tsr_block_q8_0 *const yb[4], int64_t i, __m256 acc[4]) {
    const __m256i ax = _mm256_sign_epi8(qx, qx);
    for (int c = 0; c < 4; c++) {
        const __m256i qy = _mm256_loadu_si256((const __m256i *)yb[c][i].qs);
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(qy, qx)), _mm256_set1_epi16(1));
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dx * TSR_FP16_TO_FP32(yb[c][i].d)), _mm256_cvtepi32_ps(p), acc[c]);
    }
}

static void dot4_q8_0(int64_t n, float s[4], const void *vx, const void *vy, size_t ystride) {
    const tsr_block_q8_0 *x = vx;
    const tsr_block_q8_0 *const yb[4] = {YROW(tsr_block_q8_0, 0), YROW(tsr_block_q8_0, 1), YROW(tsr_block_q8_0, 2),
                                         YROW(tsr_block_q8_0, 3)};
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < n / 32; i++)
        dot4_s8_block(_mm256_loadu_si256((const __m256i *)x[i].qs), TSR_FP16_TO_FP32(x[i].d), yb, i, acc);
    store4(s, acc);
}

static void dot4_q4_0(int64_t n, float s[4], const void *vx, const void *vy, size_t ystride) {
    const tsr_block_q4_0 *x = vx;
    const tsr_block_q8_0 *const yb[4] = {YROW(tsr_block_q8_0, 0), YROW(tsr_block_q8_0, 1), YROW(tsr_block_q8_0, 2),
                                         YROW(tsr_block_q8_0, 3)};
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < n / 32; i++)
        dot4_s8_block(_mm256_sub_epi8(nibbles32(x[i].qs), _mm256_set1_epi8(8)), TSR_FP16_TO_FP32(x[i].d), yb, i, acc);
    store4(s, acc);
}

static void dot4_q5_0(int64_t n, float s[4], const void *vx, const void *vy, size_t ystride) {
    const tsr_block_q5_0 *x = vx;
    const tsr_block_q8_0 *const yb[4] = {YROW(tsr_block_q8_0, 0), YROW(tsr_block_q8_0, 1), YROW(tsr_block_q8_0, 2),
                                         YROW(tsr_block_q8_0, 3)};
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i hi = _mm256_andnot_si256(bits_to_bytes32(x[i].qh), _mm256_set1_epi8((char)0xF0));
        dot4_s8_block(_mm256_or_si256(nibbles32(x[i].qs), hi), TSR_FP16_TO_FP32(x[i].d), yb, i, acc);
    }
    store4(s, acc);
}

static void dot4_q5_1(int64_t n, float s[4], const void *vx, const void *vy, size_t ystride) {
    const tsr_block_q5_1 *x = vx;
    const tsr_block_q8_1 *const yb[4] = {YROW(tsr_block_q8_1, 0), YROW(tsr_block_q8_1, 1), YROW(tsr_block_q8_1, 2),
                                         YROW(tsr_block_q8_1, 3)};
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float summs[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i hi = _mm256_and_si256(bits_to_bytes32(x[i].qh), _mm256_set1_epi8(0x10));
        const __m256i qx = _mm256_or_si256(nibbles32(x[i].qs), hi);
        const float dx = TSR_FP16_TO_FP32(x[i].d), mx = TSR_FP16_TO_FP32(x[i].m);
        for (int c = 0; c < 4; c++) {
            const __m256i qy = _mm256_loadu_si256((const __m256i *)yb[c][i].qs);
            summs[c] += mx * TSR_FP16_TO_FP32(yb[c][i].s);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dx * TSR_FP16_TO_FP32(yb[c][i].d)),
                                     _mm256_cvtepi32_ps(dot_u8s8(qx, qy)), acc[c]);
        }
    }
    store4(s, acc);
    for (int c = 0; c < 4; c++) s[c] += summs[c];
}

static void dot4_q4_1(int64_t n, float s[4], const void *vx, const void *vy, size_t ystride) {
    const tsr_block_q4_1 *x = vx;
    const tsr_block_q8_1 *const yb[4] = {YROW(tsr_block_q8_1, 0), YROW(tsr_block_q8_1, 1), YROW(tsr_block_q8_1, 2),
                                         YROW(tsr_block_q8_1, 3)};
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float summs[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i qx = nibbles32(x[i].qs);
        const float dx = TSR_FP16_TO_FP32(x[i].d), mx = TSR_FP16_TO_FP32(x[i].m);
        for (int c = 0; c < 4; c++) {
            const __m256i qy = _mm256_loadu_si256((const __m256i *)yb[c][i].qs);
            summs[c] += mx * TSR_FP16_TO_FP32(yb[c][i].s);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dx * TSR_FP16_TO_FP32(yb[c][i].d)),
                                     _mm256_cvtepi32_ps(dot_u8s8(qx, qy)), acc[c]);
        }
    }
    store4(s, acc);
    for (int c = 0; c < 4; c++) s[c] += summs[c];
}

/* The 8 groups of 32 unsigned 4/5-bit values of a Q4_K/Q5_K block (qh NULL for Q4_K). */
static inline void unpack_k4_quants(const uint8_t *qs, const uint8_t *qh, __m256i q[8]) {
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    const __m256i hbits = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
        q[2 * j] = _mm256_and_si256(bits, m4);
        q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        if (qh) {
            const __m128i sh0 = _mm_cvtsi32_si128(2 * j), sh1 = _mm_cvtsi32_si128(2 * j + 1);
            q[2 * j] = _mm256_or_si256(q[2 * j],
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hbits, sh0), one), 4));
            q[2 * j + 1] = _mm256_or_si256(q[2 * j + 1],
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hbits, sh1), one), 4));
        }
    }
}

/* Q4_K/Q5_K weight row x four Q8_K rows; the row is unpacked once per block. */
static inline void dot4_k4(int64_t nb, float s[4], const uint8_t *x0, size_t xbytes, size_t qs_off, ptrdiff_t qh_off,
                           const void *vy, size_t ystride) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float accm[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *blk = x0 + (size_t)i * xbytes; /* d, dmin, scales[12] lead both layouts */
        uint8_t sm[16];
        unpack_k4_scales(blk + 4, sm);
        const __m128i sc = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sm));
        __m256i q[8], scv[8];
        unpack_k4_quants(blk + qs_off, qh_off >= 0 ? blk + qh_off : NULL, q);
        for (int g = 0; g < 8; g++) scv[g] = bcast16(sc, g);
        uint16_t hd, hm;
        memcpy(&hd, blk, 2);
        memcpy(&hm, blk + 2, 2);
        const float dx = TSR_FP16_TO_FP32(hd), mx = TSR_FP16_TO_FP32(hm);
        for (int c = 0; c < 4; c++) {
            const tsr_block_q8_K *y = YROW(tsr_block_q8_K, c) + i;
            __m256i sumi = _mm256_setzero_si256();
            for (int g = 0; g < 8; g++) {
                const __m256i p = _mm256_maddubs_epi16(q[g], _mm256_loadu_si256((const __m256i *)(y->qs + 32 * g)));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(scv[g], p));
            }
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * dx), _mm256_cvtepi32_ps(sumi), acc[c]);
            accm[c] += y->d * mx * (float)k4_min_term(sm + 8, y->bsums);
        }
    }
    store4(s, acc);
    for (int c = 0; c < 4; c++) s[c] -= accm[c];
}

static void dot4_q4_K(int64_t n, float s[4], const void *vx, const void *vy, size_t ystride) {
    dot4_k4(n / TSR_QK_K, s, vx, sizeof(tsr_block_q4_K), offsetof(tsr_block_q4_K, qs), -1, vy, ystride);
}

static void dot4_q5_K(int64_t n, float s[4], const void *vx, const void *vy, size_t ystride) {
    dot4_k4(n / TSR_QK_K, s, vx, sizeof(tsr_block_q5_K), offsetof(tsr_block_q5_K, qs),
            (ptrdiff_t)offsetof(tsr_block_q5_K, qh), vy, ystride);
}

static void dot4_q6_K(int64_t n, float s[4], const void *vx, const void *vy, size_t ystride) {
    const tsr_block_q6_K *x = vx;
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < n / TSR_QK_K; i++) {
        __m256i sumi[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                           _mm256_setzero_si256()};
        for (int ch = 0; ch < 2; ch++) {
            const uint8_t *ql = x[i].ql + 64 * ch, *qh = x[i].qh + 32 * ch;
            const int8_t *sc = x[i].scales + 8 * ch;
            const __m256i b1 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i b2 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i bh = _mm256_loadu_si256((const __m256i *)qh);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(b1, m4), _mm256_slli_epi16(_mm256_and_si256(bh, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(b2, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 2), m2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 4), m2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 6), m2), 4));
            for (int c = 0; c < 4; c++) {
                const int8_t *q8 = (YROW(tsr_block_q8_K, c) + i)->qs + 128 * ch;
                for (int g = 0; g < 4; g++) {
                    const __m256i y8 = _mm256_loadu_si256((const __m256i *)(q8 + 32 * g));
                    const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q[g], y8), _mm256_maddubs_epi16(m32, y8));
                    sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(q6_scales(sc + 2 * g), p));
                }
            }
        }
        const float dx = TSR_FP16_TO_FP32(x[i].d);
        for (int c = 0; c < 4; c++)
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps((YROW(tsr_block_q8_K, c) + i)->d * dx), _mm256_cvtepi32_ps(sumi[c]),
                                     acc[c]);
    }
    store4(s, acc);
}

void tsr__cpu_avx2_dot(tsr_cpu_kernels *k) {
    k->vec_dot[TSR_TYPE_F32] = dot_f32;
    k->vec_dot[TSR_TYPE_BF16] = dot_bf16;
    k->vec_dot[TSR_TYPE_Q4_0] = dot_q4_0_q8_0;
    k->vec_dot[TSR_TYPE_Q4_1] = dot_q4_1_q8_1;
    k->vec_dot[TSR_TYPE_Q5_0] = dot_q5_0_q8_0;
    k->vec_dot[TSR_TYPE_Q5_1] = dot_q5_1_q8_1;
    k->vec_dot[TSR_TYPE_Q8_0] = dot_q8_0_q8_0;
    k->vec_dot[TSR_TYPE_Q4_K] = dot_q4_K_q8_K;
    k->vec_dot[TSR_TYPE_Q5_K] = dot_q5_K_q8_K;
    k->vec_dot[TSR_TYPE_Q6_K] = dot_q6_K_q8_K;
    k->vec_dot[TSR_TYPE_F16] = dot_f16_f16;
    k->vec_dot4[TSR_TYPE_Q8_0] = dot4_q8_0;
    k->vec_dot4[TSR_TYPE_Q4_0] = dot4_q4_0;
    k->vec_dot4[TSR_TYPE_Q4_1] = dot4_q4_1;
    k->vec_dot4[TSR_TYPE_Q5_0] = dot4_q5_0;
    k->vec_dot4[TSR_TYPE_Q5_1] = dot4_q5_1;
    k->vec_dot4[TSR_TYPE_Q4_K] = dot4_q4_K;
    k->vec_dot4[TSR_TYPE_Q5_K] = dot4_q5_K;
    k->vec_dot4[TSR_TYPE_Q6_K] = dot4_q6_K;
}
