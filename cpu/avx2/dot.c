/*
 * vec-avx2.c - AVX2+FMA+F16C variants of the dot products and activation
 * quantizers (built with -mavx2 -mfma -mf16c, used only when the CPU has
 * them). Each must agree with its scalar reference in vec.c / quants.c.
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

/* The one-column matmul for F16 weights (kernel table gemv): each row bit
 * for bit dot_f16_f16, the rows of the call requested GEMV_PF rows ahead
 * (and the first ones at once) instead of left to the hardware's prefetch,
 * which stops at each row's end. The activations are widened to F32 once
 * per group of GEMV_F16_ROWS rows and chunk of GEMV_F16_CHUNK values (an
 * exact conversion) instead of once per row: VCVTPH2PS, not the memory,
 * bounds a row's dot in cache (Zen 3: one conversion per weight vector,
 * 1 thread, 1.8x the values per second). The rows' accumulators wait on
 * the stack between chunks. */
#define GEMV_F16_CHUNK 2048 /* values, a multiple of 64 */
#define GEMV_F16_ROWS 8
static void gemv_f16(int64_t k, int64_t m, int64_t ahead, const void *vx, size_t xs, const void *vy, float *s) {
    const char *x = vx;
    const uint16_t *y = vy;
    const int64_t n = m + (ahead > 0 ? ahead : 0), kb = k / 64 * 64;
    _Alignas(32) float yf[GEMV_F16_CHUNK];
    __m256 acc[GEMV_F16_ROWS][8];
    ramp(x, m, xs);
    for (int64_t r0 = 0; r0 < m; r0 += GEMV_F16_ROWS) {
        const int rn = m - r0 < GEMV_F16_ROWS ? (int)(m - r0) : GEMV_F16_ROWS;
        for (int64_t c0 = 0; c0 < kb; c0 += GEMV_F16_CHUNK) {
            const int64_t cn = kb - c0 < GEMV_F16_CHUNK ? kb - c0 : GEMV_F16_CHUNK;
            for (int64_t i = 0; i < cn; i += 32) {
                _mm256_store_ps(yf + i, load_fp16x8(y + c0 + i));
                _mm256_store_ps(yf + i + 8, load_fp16x8(y + c0 + i + 8));
                _mm256_store_ps(yf + i + 16, load_fp16x8(y + c0 + i + 16));
                _mm256_store_ps(yf + i + 24, load_fp16x8(y + c0 + i + 24));
            }
            for (int r = 0; r < rn; r++) {
                const uint16_t *xr = (const uint16_t *)(x + (size_t)(r0 + r) * xs) + c0;
                const size_t pfo = pf_offset(r0 + r, 1, n, xs);
                __m256 a[8];
                UNROLL_ALL
                for (int q = 0; q < 8; q++) a[q] = c0 ? acc[r][q] : _mm256_setzero_ps();
                for (int64_t i = 0; i < cn; i += 64) {
                    if (pfo) {
                        _mm_prefetch((const char *)(xr + i) + pfo, _MM_HINT_T1);
                        _mm_prefetch((const char *)(xr + i) + pfo + 64, _MM_HINT_T1);
                    }
                    UNROLL_ALL
                    for (int q = 0; q < 8; q++)
                        a[q] = _mm256_fmadd_ps(load_fp16x8(xr + i + 8 * q), _mm256_load_ps(yf + i + 8 * q), a[q]);
                }
                UNROLL_ALL
                for (int q = 0; q < 8; q++) acc[r][q] = a[q];
            }
        }
        for (int r = 0; r < rn; r++) {
            __m256 *a = acc[r];
            if (kb == 0)
                for (int q = 0; q < 8; q++) a[q] = _mm256_setzero_ps();
            if (kb < k) { /* the dot's zero-padded tail */
                const uint16_t *xr = (const uint16_t *)(x + (size_t)(r0 + r) * xs);
                uint16_t tx[64] = {0}, ty[64] = {0};
                memcpy(tx, xr + kb, (size_t)(k - kb) * 2), memcpy(ty, y + kb, (size_t)(k - kb) * 2);
                for (int q = 0; q < 8; q++)
                    a[q] = _mm256_fmadd_ps(load_fp16x8(tx + 8 * q), load_fp16x8(ty + 8 * q), a[q]);
            }
            for (int h = 0; h < 2; h++) {
                a[h] = _mm256_add_ps(a[h], a[4 + h]);
                a[2 + h] = _mm256_add_ps(a[2 + h], a[6 + h]);
                a[h] = _mm256_add_ps(a[h], a[2 + h]);
            }
            s[r0 + r] = hsum_ps256(_mm256_add_ps(a[1], a[0]));
        }
    }
}

/* ---- register-tiled matmul (batches) ---------------------------------------- */

/* F16 weights x F32 activations: rm (<= 4) weight rows x rn (<= 3)
 * activation rows, 12 accumulators of 8 lanes in registers over k in steps
 * of 8; each weight vector is converted by F16C once and used for rn
 * columns, each activation vector loaded once for rm rows (7 loads per 12
 * FMAs). Per result: the 8 lanes, their horizontal sum, then the k % 8 tail
 * in order - the same for every rm, rn. */
#define UNROLL_F16 _Pragma("GCC unroll 4") /* GCC -O2 would keep acc[][] on the stack */
static inline __attribute__((always_inline)) void gemm_f16_tile(int rm, int rn, int64_t k, const char *x, size_t xs,
                                                                const char *y, size_t ys, float *s, size_t ss) {
    __m256 acc[4][3];
    UNROLL_F16
    for (int r = 0; r < rm; r++) {
        UNROLL_F16
        for (int c = 0; c < rn; c++) acc[r][c] = _mm256_setzero_ps();
    }
    int64_t l = 0;
    for (; l + 8 <= k; l += 8) {
        __m256 yv[3];
        UNROLL_F16
        for (int c = 0; c < rn; c++) yv[c] = _mm256_loadu_ps((const float *)(y + (size_t)c * ys) + l);
        UNROLL_F16
        for (int r = 0; r < rm; r++) {
            const __m256 xv = load_fp16x8((const uint16_t *)(x + (size_t)r * xs) + l);
            UNROLL_F16
            for (int c = 0; c < rn; c++) acc[r][c] = _mm256_fmadd_ps(xv, yv[c], acc[r][c]);
        }
    }
    UNROLL_F16
    for (int r = 0; r < rm; r++) {
        UNROLL_F16
        for (int c = 0; c < rn; c++) {
            const uint16_t *xr = (const uint16_t *)(x + (size_t)r * xs);
            const float *yc = (const float *)(y + (size_t)c * ys);
            float sum = hsum_ps256(acc[r][c]);
            for (int64_t t = l; t < k; t++) sum += TSR_FP16_TO_FP32(xr[t]) * yc[t];
            s[(size_t)c * ss + (size_t)r] = sum;
        }
    }
}

static void gemm_f16(int64_t k, int64_t m, int64_t n, const void *vx, size_t xs, const void *vy, size_t ys, float *s,
                     size_t ss, void *scratch) {
    (void)scratch;
    for (int64_t j = 0; j < n; j += 3) {
        const char *y = (const char *)vy + (size_t)j * ys;
        const int rn = n - j < 3 ? (int)(n - j) : 3;
        for (int64_t i = 0; i < m; i += 4) {
            const char *x = (const char *)vx + (size_t)i * xs;
            float *o = s + (size_t)j * ss + (size_t)i;
            const int rm = m - i < 4 ? (int)(m - i) : 4;
            switch (rm * 4 + rn) { /* constant shapes: the tile stays in registers */
            case 4 * 4 + 3: gemm_f16_tile(4, 3, k, x, xs, y, ys, o, ss); break;
            case 4 * 4 + 2: gemm_f16_tile(4, 2, k, x, xs, y, ys, o, ss); break;
            case 4 * 4 + 1: gemm_f16_tile(4, 1, k, x, xs, y, ys, o, ss); break;
            case 3 * 4 + 3: gemm_f16_tile(3, 3, k, x, xs, y, ys, o, ss); break;
            case 3 * 4 + 2: gemm_f16_tile(3, 2, k, x, xs, y, ys, o, ss); break;
            case 3 * 4 + 1: gemm_f16_tile(3, 1, k, x, xs, y, ys, o, ss); break;
            case 2 * 4 + 3: gemm_f16_tile(2, 3, k, x, xs, y, ys, o, ss); break;
            case 2 * 4 + 2: gemm_f16_tile(2, 2, k, x, xs, y, ys, o, ss); break;
            case 2 * 4 + 1: gemm_f16_tile(2, 1, k, x, xs, y, ys, o, ss); break;
            case 1 * 4 + 3: gemm_f16_tile(1, 3, k, x, xs, y, ys, o, ss); break;
            case 1 * 4 + 2: gemm_f16_tile(1, 2, k, x, xs, y, ys, o, ss); break;
            default: gemm_f16_tile(1, 1, k, x, xs, y, ys, o, ss); break;
            }
        }
    }
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

/* ---- fused attention blocks ------------------------------------------------- */

/* Lane mask for the first n (0..8) of 8 floats. */
static inline __m256i lanes8(int64_t n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 8 ? n : 8)), idx);
}

/* The first n (may be <= 0) of 8 F16 values, the rest 0. */
static inline __m256 load_fp16_part(const uint16_t *p, int64_t n) {
    uint16_t t[8] = {0};
    for (int64_t i = 0; i < n && i < 8; i++) t[i] = p[i];
    return load_fp16x8(t);
}

/* The loops over the accumulator arrays must be unrolled, or GCC -O2 keeps
 * the arrays on the stack (a load and a store around every FMA). */
#define UNROLL8 _Pragma("GCC unroll 8")

/* MR rows x up to 16 columns of C: the 2*MR accumulators stay in registers
 * over the whole k loop, each B row loaded once per MR rows. b_f16 and full
 * (n == 16) are constants where it is inlined, so the k loop has no branch. */
static inline __attribute__((always_inline)) void gemm_tile(int mr, int64_t n, int64_t k, const float *a, int64_t lda,
                                                            const void *vb, bool b_f16, bool full, int64_t ldb,
                                                            float *c, int64_t ldc, bool acc) {
    const __m256i m0 = lanes8(n), m1 = lanes8(n > 8 ? n - 8 : 0);
    __m256 c0[6], c1[6];
    UNROLL8 for (int i = 0; i < mr; i++) {
        if (!acc)
            c0[i] = c1[i] = _mm256_setzero_ps();
        else if (full)
            c0[i] = _mm256_loadu_ps(c + i * ldc), c1[i] = _mm256_loadu_ps(c + i * ldc + 8);
        else
            c0[i] = _mm256_maskload_ps(c + i * ldc, m0), c1[i] = _mm256_maskload_ps(c + i * ldc + 8, m1);
    }
    for (int64_t l = 0; l < k; l++) {
        __m256 b0, b1;
        if (b_f16) { /* F16C: whole 8-lane loads only where all 8 are in the row */
            const uint16_t *bl = (const uint16_t *)vb + l * ldb;
            b0 = full || n >= 8 ? load_fp16x8(bl) : load_fp16_part(bl, n);
            b1 = full || n >= 16 ? load_fp16x8(bl + 8) : load_fp16_part(bl + 8, n - 8);
        } else {
            const float *bl = (const float *)vb + l * ldb;
            b0 = full ? _mm256_loadu_ps(bl) : _mm256_maskload_ps(bl, m0);
            b1 = full ? _mm256_loadu_ps(bl + 8) : _mm256_maskload_ps(bl + 8, m1);
        }
        UNROLL8 for (int i = 0; i < mr; i++) {
            const __m256 av = _mm256_broadcast_ss(a + i * lda + l);
            c0[i] = _mm256_fmadd_ps(av, b0, c0[i]);
            c1[i] = _mm256_fmadd_ps(av, b1, c1[i]);
        }
    }
    UNROLL8 for (int i = 0; i < mr; i++) {
        if (full) {
            _mm256_storeu_ps(c + i * ldc, c0[i]);
            _mm256_storeu_ps(c + i * ldc + 8, c1[i]);
        } else {
            _mm256_maskstore_ps(c + i * ldc, m0, c0[i]);
            _mm256_maskstore_ps(c + i * ldc + 8, m1, c1[i]);
        }
    }
}

#define GEMM_TILES(f16, full)                                                       \
    switch (m - i < 6 ? m - i : 6) {                                                \
    case 1: gemm_tile(1, nj, k, ai, lda, bj, f16, full, ldb, ci, ldc, acc); break;  \
    case 2: gemm_tile(2, nj, k, ai, lda, bj, f16, full, ldb, ci, ldc, acc); break;  \
    case 3: gemm_tile(3, nj, k, ai, lda, bj, f16, full, ldb, ci, ldc, acc); break;  \
    case 4: gemm_tile(4, nj, k, ai, lda, bj, f16, full, ldb, ci, ldc, acc); break;  \
    case 5: gemm_tile(5, nj, k, ai, lda, bj, f16, full, ldb, ci, ldc, acc); break;  \
    default: gemm_tile(6, nj, k, ai, lda, bj, f16, full, ldb, ci, ldc, acc); break; \
    }

static void gemm_f32(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b, bool b_f16,
                     int64_t ldb, float *c, int64_t ldc, bool acc) {
    for (int64_t j = 0; j < n; j += 16) {
        const int64_t nj = n - j < 16 ? n - j : 16;
        for (int64_t i = 0; i < m; i += 6) {
            const float *ai = a + i * lda;
            const void *bj = b_f16 ? (const void *)((const uint16_t *)b + j) : (const void *)((const float *)b + j);
            float *ci = c + i * ldc + j;
            if (b_f16 && nj == 16)
                GEMM_TILES(true, true)
            else if (b_f16)
                GEMM_TILES(true, false)
            else if (nj == 16)
                GEMM_TILES(false, true)
            else
                GEMM_TILES(false, false)
        }
    }
}
#undef GEMM_TILES

/* The same on B packed as 16 floats per row (gemm_f32_nt). */
#define GEMM_TILES_PK(full)                                                           \
    switch (m - i < 6 ? m - i : 6) {                                                  \
    case 1: gemm_tile(1, nj, kc, ai, lda, pk, false, full, 16, ci, ldc, acc); break;  \
    case 2: gemm_tile(2, nj, kc, ai, lda, pk, false, full, 16, ci, ldc, acc); break;  \
    case 3: gemm_tile(3, nj, kc, ai, lda, pk, false, full, 16, ci, ldc, acc); break;  \
    case 4: gemm_tile(4, nj, kc, ai, lda, pk, false, full, 16, ci, ldc, acc); break;  \
    case 5: gemm_tile(5, nj, kc, ai, lda, pk, false, full, 16, ci, ldc, acc); break;  \
    default: gemm_tile(6, nj, kc, ai, lda, pk, false, full, 16, ci, ldc, acc); break; \
    }

/* The 8 sums of v[0..8) (each over its 8 lanes) as one vector, in order:
 * neighbours, pairs, then halves added alike for every vector. */
static inline __m256 sum8x8(const __m256 *v) {
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* Transposes the 8 x 8 block r in place. */
static inline void transpose8(__m256 *r) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* Rows [j, j + 8) of B (past n: the last row again), elements [l, l + 8)
 * (past k: zeros), as F32. */
static inline void load_b8(__m256 *r, const void *b, bool b_f16, int64_t ldb, int64_t j, int64_t nj, int64_t l,
                           int64_t k) {
    for (int t = 0; t < 8; t++) {
        const int64_t at = (j + (t < nj ? t : nj - 1)) * ldb + l;
        if (b_f16)
            r[t] = k - l >= 8 ? load_fp16x8((const uint16_t *)b + at) : load_fp16_part((const uint16_t *)b + at, k - l);
        else
            r[t] = _mm256_maskload_ps((const float *)b + at, lanes8(k - l));
    }
}

/* C[m x n] = A[m x k] * B^T for B n rows of k.
 *  - Few rows (m < NT_TILE_M): 8 rows of B at a time are packed (F16
 *    converted) as 8 x 8 floats per 8 of k, then per row of A 8
 *    accumulators of 8 lanes over k and one sum8x8.
 *  - Else 16 rows of B are packed transposed (k x 16, 8 x 8 blocks turned in
 *    registers) and gemm_tile runs on them: no lane sums, each B value
 *    loaded once per 6 rows of A.
 * Each result is summed in the same order whatever its place in the tile
 * and n (the order depends on k, and on m only through the choice above). */
#define NT_KMAX 256 /* k per pass: the pack (k x 16 floats, on the stack) stays at 16 KiB */
#define NT_TILE_M 6
static void gemm_f32_nt(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b, bool b_f16,
                        int64_t ldb, float *c, int64_t ldc) {
    _Alignas(32) float pk[NT_KMAX * 16];
    if (m >= NT_TILE_M) {
        for (int64_t j = 0; j < n; j += 16) {
            const int64_t nj = n - j < 16 ? n - j : 16;
            for (int64_t l0 = 0; l0 == 0 || l0 < k; l0 += NT_KMAX) { /* k > NT_KMAX: the rest added to C */
                const int64_t kc = k - l0 < NT_KMAX ? k - l0 : NT_KMAX;
                for (int h = 0; h < 2; h++)
                    for (int64_t l = 0; l < kc; l += 8) {
                        __m256 r[8];
                        load_b8(r, b, b_f16, ldb, nj > 8 * h ? j + 8 * h : j + nj - 1, /* past n: the last row */
                                nj > 8 * h ? nj - 8 * h : 1, l0 + l, k);
                        transpose8(r);
                        for (int d = 0; d < 8; d++) _mm256_store_ps(pk + (l + d) * 16 + 8 * h, r[d]);
                    }
                const float *al = a + l0;
                const bool acc = l0 > 0, full = nj == 16;
                for (int64_t i = 0; i < m; i += 6) {
                    const float *ai = al + i * lda;
                    float *ci = c + i * ldc + j;
                    if (full)
                        GEMM_TILES_PK(true)
                    else
                        GEMM_TILES_PK(false)
                }
            }
        }
        return;
    }
    for (int64_t j = 0; j < n; j += 8) {
        const int64_t nj = n - j < 8 ? n - j : 8;
        for (int64_t l0 = 0; l0 == 0 || l0 < k; l0 += NT_KMAX) { /* k > NT_KMAX: partial sums in C */
            const int64_t kc = k - l0 < NT_KMAX ? k - l0 : NT_KMAX, nc = (kc + 7) / 8;
            const int64_t nfull = kc / 8, left = kc - 8 * nfull;
            int64_t at[8];
            for (int p = 0; p < 8; p++) at[p] = (j + (p < nj ? p : nj - 1)) * ldb + l0;
            for (int64_t q = 0; q < nfull; q++) /* keys in order (a steady stride per load) */
                UNROLL8 for (int p = 0; p < 8; p++)
                    _mm256_store_ps(pk + q * 64 + p * 8, b_f16 ? load_fp16x8((const uint16_t *)b + at[p] + 8 * q)
                                                               : _mm256_loadu_ps((const float *)b + at[p] + 8 * q));
            if (left)
                for (int p = 0; p < 8; p++)
                    _mm256_store_ps(pk + nfull * 64 + p * 8,
                                    b_f16 ? load_fp16_part((const uint16_t *)b + at[p] + 8 * nfull, left)
                                          : _mm256_maskload_ps((const float *)b + at[p] + 8 * nfull, lanes8(left)));
            for (int64_t i = 0; i < m; i++) {
                const float *ai = a + i * lda + l0;
                __m256 acc[8];
                UNROLL8 for (int p = 0; p < 8; p++) acc[p] = _mm256_setzero_ps();
                for (int64_t q = 0; q < nc; q++) {
                    const int64_t left = kc - 8 * q;
                    const __m256 av = left >= 8 ? _mm256_loadu_ps(ai + 8 * q)
                                                : _mm256_maskload_ps(ai + 8 * q, lanes8(left));
                    const float *bq = pk + q * 64;
                    UNROLL8 for (int p = 0; p < 8; p++)
                        acc[p] = _mm256_fmadd_ps(av, _mm256_load_ps(bq + p * 8), acc[p]);
                }
                __m256 r = sum8x8(acc);
                if (nj == 8) { /* plain: a masked store is microcoded and slow on AMD cores */
                    if (l0 > 0)
                        r = _mm256_add_ps(_mm256_loadu_ps(c + i * ldc + j), r);
                    _mm256_storeu_ps(c + i * ldc + j, r);
                    continue;
                }
                const __m256i mj = lanes8(nj);
                if (l0 > 0)
                    r = _mm256_add_ps(_mm256_maskload_ps(c + i * ldc + j, mj), r);
                _mm256_maskstore_ps(c + i * ldc + j, mj, r);
            }
        }
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

void tsr__cpu_kernels_avx2(tsr_cpu_kernels *k) {
    k->exp_sum = exp_sum;
    k->silu_mul = silu_mul;
    k->gelu_mul = gelu_mul;
    k->add = add;
    k->mul = mul;
    k->rms_norm = rms_norm;
    k->rope = rope;
    k->gemm_f32 = gemm_f32;
    k->gemm_f32_nt = gemm_f32_nt;
    k->softmax_step = softmax_step;
    k->name = "avx2";
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
    k->gemv[TSR_TYPE_F16] = gemv_f16;
    k->gemm[TSR_TYPE_F16] = gemm_f16;
    k->gemm_type[TSR_TYPE_F16] = TSR_TYPE_F32;
    k->vec_dot4[TSR_TYPE_Q8_0] = dot4_q8_0;
    k->vec_dot4[TSR_TYPE_Q4_0] = dot4_q4_0;
    k->vec_dot4[TSR_TYPE_Q4_1] = dot4_q4_1;
    k->vec_dot4[TSR_TYPE_Q5_0] = dot4_q5_0;
    k->vec_dot4[TSR_TYPE_Q5_1] = dot4_q5_1;
    k->vec_dot4[TSR_TYPE_Q4_K] = dot4_q4_K;
    k->vec_dot4[TSR_TYPE_Q5_K] = dot4_q5_K;
    k->vec_dot4[TSR_TYPE_Q6_K] = dot4_q6_K;
    k->from_float[TSR_TYPE_Q8_0] = quantize_q8_0;
    k->from_float[TSR_TYPE_Q8_1] = quantize_q8_1;
    k->from_float[TSR_TYPE_Q8_K] = quantize_q8_K;
    k->from_float[TSR_TYPE_F16] = f16_from_float;
    k->to_float[TSR_TYPE_F16] = f16_to_float;
    tsr__cpu_gemm_avx2(k); /* the quantized gemms (gemm-avx2.c) */
}
