/*
 * gemv-avx512.c - the matrix-vector products of decode (one activation
 * column) with VPDPBUSD (AVX-512 VNNI): several weight rows at a time,
 * read in their stored block format (no repacking), against one row of
 * tsr_cpu_q8s activations.
 *
 * Two 32-value blocks fill one 512-bit vector: each row's weights are
 * turned into UNSIGNED bytes u (the stored nibbles, 5- or 6-bit values, or
 * Q8_0's bytes + 128), the activation bytes laid out to match (block b in
 * lanes 0..7, block b + 1 in lanes 8..15), and VPDPBUSD sums four products
 * per 32-bit lane. The offset of signed formats (Q4_0: 8, Q5_0: 16, Q6_K:
 * 32, Q8_0: 128) comes back out in integers: the lanes start from
 * -offset * (the lane's four activations summed), computed once per block
 * pair for all the rows. Then per lane, in float, acc += sum * (dx * dy)
 * (dx a block's or sub-block's scale, dy the activations'), and for formats
 * with a minimum (Q4_1, Q4_K) acc += m * dy * sum(qy) (tsr_cpu_q8s.ds),
 * applied once per block pair (Q4_K: once per super-block, its eight
 * sub-blocks' minimums at once). Each row ends in one horizontal sum.
 *
 * The rows of a call go through the same instructions whatever their
 * number and place (the row loop is unrolled over independent
 * accumulators), so a row's result is the same bits in any call: results
 * do not depend on the tiling or the threads (test-cpu-kernels checks it).
 */
#include "cpu.h"
#include "simd.h"

#include <immintrin.h>

#define UNROLL _Pragma("GCC unroll 16")
#define INLINE static inline __attribute__((always_inline))
#ifndef GEMV_PF
#define GEMV_PF 24
#endif

/* [a x 8 | b x 8] */
INLINE __m512 bcast2(float a, float b) {
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(a)), _mm256_castps_pd(_mm256_set1_ps(b)), 1));
}

INLINE __m512i load2x256(const void *a, const void *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

/* Lanes 0..7 from float f[0], 8..15 from f[1] (a and b: lanes of f). */
static const int32_t idx_h2[16] = {0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2};
static const int32_t idx_h2m[16] = {1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3};
static const int32_t idx_h2s[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};

/* Two F16 scales -> [f0 x 8 | f1 x 8]. */
INLINE __m512 half2(const void *p0, const void *p1) {
    uint16_t a, b;
    memcpy(&a, p0, 2);
    memcpy(&b, p1, 2);
    const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)(a | (uint32_t)b << 16)));
    return _mm512_permutexvar_ps(_mm512_loadu_si512(idx_h2s), _mm512_castps128_ps512(f));
}

/* 16 nibble bytes of two blocks -> [lo q0, hi q0, lo q1, hi q1] as values 0..15
 * (q1 NULL: zeros). */
INLINE __m512i nib2(const uint8_t *q0, const uint8_t *q1) {
    static const int64_t il[8] = {0, 1, 8, 9, 2, 3, 10, 11};
    const __m128i a = _mm_loadu_si128((const __m128i *)q0);
    const __m256i t = q1 ? _mm256_inserti128_si256(_mm256_castsi128_si256(a), _mm_loadu_si128((const __m128i *)q1), 1)
                         : _mm256_zextsi128_si256(a);
    const __m512i u = _mm512_permutex2var_epi64(_mm512_castsi256_si512(t), _mm512_loadu_si512(il),
                                                _mm512_castsi256_si512(_mm256_srli_epi16(t, 4)));
    return _mm512_and_si512(u, _mm512_set1_epi8(0x0F));
}

/* One pair of activation blocks (the second may be missing: zeros). */
typedef struct ypair {
    __m512i q;   /* values */
    __m512 d;    /* [d0 x 8 | d1 x 8] */
    __m512i neg; /* -offset * the sum of each lane's four values */
    __m512 ds;   /* [ds0 / 8 x 8 | ds1 / 8 x 8] (formats with a minimum) */
} ypair;

INLINE ypair ypair_load(const tsr_cpu_q8s *y, bool two, int off, bool mins) {
    ypair p;
    p.q = two ? load2x256(y[0].qs, y[1].qs) : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)y[0].qs));
    p.d = bcast2(y[0].d, two ? y[1].d : 0.0f);
    p.neg = off ? _mm512_sub_epi32(_mm512_setzero_si512(),
                                   _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)off), p.q))
                : _mm512_setzero_si512();
    p.ds = mins ? bcast2(y[0].ds * 0.125f, two ? y[1].ds * 0.125f : 0.0f) : _mm512_setzero_ps();
    return p;
}

INLINE __m512 step(__m512 acc, __m512i neg, __m512i u, const ypair *y, __m512 dx) {
    const __m512i s = _mm512_dpbusd_epi32(neg, u, y->q);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dx, y->d), acc);
}

/* ---- the 32-value block formats: Q8_0, Q4_0, Q5_0, Q4_1 ----------------------- */

/* Row r's blocks b, b + 1 (two false: b only): unsigned values, scales, minimums. */
INLINE __m512i blk2(tsr_type t, const char *row, int64_t b, bool two, __m512 *dx, __m512 *mx) {
    switch (t) {
    case TSR_TYPE_Q8_0: {
        const tsr_block_q8_0 *q = (const tsr_block_q8_0 *)row + b;
        const tsr_half zero = 0;
        *dx = half2(&q[0].d, two ? &q[1].d : &zero);
        const __m512i v = two ? load2x256(q[0].qs, q[1].qs)
                              : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)q[0].qs));
        return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
    }
    case TSR_TYPE_Q4_0: {
        const tsr_block_q4_0 *q = (const tsr_block_q4_0 *)row + b;
        const tsr_half zero = 0;
        *dx = half2(&q[0].d, two ? &q[1].d : &zero);
        return nib2(q[0].qs, two ? q[1].qs : NULL);
    }
    case TSR_TYPE_Q5_0: {
        const tsr_block_q5_0 *q = (const tsr_block_q5_0 *)row + b;
        const tsr_half zero = 0;
        *dx = half2(&q[0].d, two ? &q[1].d : &zero);
        uint32_t h0, h1 = 0;
        memcpy(&h0, q[0].qh, 4);
        if (two)
            memcpy(&h1, q[1].qh, 4);
        const __m512i u = nib2(q[0].qs, two ? q[1].qs : NULL);
        return _mm512_mask_add_epi8(u, _cvtu64_mask64(h0 | (uint64_t)h1 << 32), u, _mm512_set1_epi8(16));
    }
    default: { /* TSR_TYPE_Q4_1 */
        const tsr_block_q4_1 *q = (const tsr_block_q4_1 *)row + b;
        uint32_t w0, w1 = 0;
        memcpy(&w0, &q[0].d, 4); /* d, m */
        if (two)
            memcpy(&w1, &q[1].d, 4);
        const __m512 f = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_set_epi32(0, 0, (int)w1, (int)w0)));
        *dx = _mm512_permutexvar_ps(_mm512_loadu_si512(idx_h2), f);
        *mx = _mm512_permutexvar_ps(_mm512_loadu_si512(idx_h2m), f);
        return nib2(q[0].qs, two ? q[1].qs : NULL);
    }
    }
}

static inline int64_t blk_bytes(tsr_type t) {
    switch (t) {
    case TSR_TYPE_Q8_0: return sizeof(tsr_block_q8_0);
    case TSR_TYPE_Q4_0: return sizeof(tsr_block_q4_0);
    case TSR_TYPE_Q5_0: return sizeof(tsr_block_q5_0);
    default: return sizeof(tsr_block_q4_1);
    }
}

static int zp_offset(tsr_type t) {
    switch (t) {
    case TSR_TYPE_Q8_0: return 128;
    case TSR_TYPE_Q4_0: return 8;
    case TSR_TYPE_Q5_0: return 16;
    case TSR_TYPE_Q6_K: return 32;
    default: return 0;
    }
}

/* Blocks b, b + 1 (two false: b only) of R rows into their accumulators. */
INLINE void pair32(tsr_type t, int R, const char *x, size_t xs, size_t pfo, const tsr_cpu_q8s *y, int64_t b, bool two,
                   __m512 *acc) {
    const bool mins = t == TSR_TYPE_Q4_1;
    const ypair yp = ypair_load(y + b, two, zp_offset(t), mins);
    UNROLL
    for (int r = 0; r < R; r++) {
        __m512 dx, mx = _mm512_setzero_ps();
        const char *pf = x + (size_t)r * xs + pfo + b * blk_bytes(t);
        _mm_prefetch(pf, _MM_HINT_T0);
        if (2 * blk_bytes(t) > 64)
            _mm_prefetch(pf + 64, _MM_HINT_T0);
        const __m512i u = blk2(t, x + (size_t)r * xs, b, two, &dx, &mx);
        acc[r] = step(acc[r], yp.neg, u, &yp, dx);
        if (mins)
            acc[r] = _mm512_fmadd_ps(mx, yp.ds, acc[r]);
    }
}

INLINE void rows32(tsr_type t, int R, int64_t k, const char *x, size_t xs, size_t pfo, const tsr_cpu_q8s *y, float *s) {
    const int64_t nb = k / 32;
    __m512 acc[8];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) pair32(t, R, x, xs, pfo, y, b, true, acc);
    if (b < nb)
        pair32(t, R, x, xs, pfo, y, b, false, acc);
    UNROLL
    for (int r = 0; r < R; r++) s[r] = _mm512_reduce_add_ps(acc[r]);
}

/* ---- Q4_K: super-blocks of 8 sub-blocks of 32 --------------------------------- */

/* The 8 six-bit scales (bytes 0..7) and minimums (8..15), as ggml unpacks them. */
INLINE __m128i q4k_scales(const uint8_t *sc) {
    uint32_t u[4];
    memcpy(u, sc, 12);
    u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
    const uint32_t a = u[1] & 0x3f3f3f3f;
    u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
    u[2] = a;
    u[0] &= 0x3f3f3f3f;
    return _mm_loadu_si128((const __m128i *)u);
}

static const int32_t idx_k4[4][16] = {{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
                                      {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
                                      {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5},
                                      {6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7}};
static const int32_t idx_k6[4][16] = {{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3},
                                      {4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7},
                                      {8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11},
                                      {12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15}};

INLINE void rows_q4k(int R, int64_t k, const char *x, size_t xs, size_t pfo, const tsr_cpu_q8s *y, float *s) {
    const int64_t nsb = k / 256;
    __m512 acc[8];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
        const tsr_cpu_q8s *yb = y + 8 * sb;
        /* the eight sub-blocks' d * sum(qy), for the minimums */
        const __m512 yds = _mm512_zextps256_ps512(
            _mm256_i32gather_ps(&yb[0].ds, _mm256_setr_epi32(0, 12, 24, 36, 48, 60, 72, 84), 4));
        __m512 sc[8];
        UNROLL
        for (int r = 0; r < R; r++) {
            const tsr_block_q4_K *q = (const tsr_block_q4_K *)(x + (size_t)r * xs) + sb;
            const __m128i sm = q4k_scales(q->scales);
            sc[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sm)), _mm512_set1_ps(TSR_FP16_TO_FP32(q->d)));
            const __m512 m8 = _mm512_zextps256_ps512(
                _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8))),
                              _mm256_set1_ps(TSR_FP16_TO_FP32(q->dmin))));
            acc[r] = _mm512_fnmadd_ps(m8, yds, acc[r]);
        }
        UNROLL
        for (int p = 0; p < 4; p++) {
            const ypair yp = ypair_load(yb + 2 * p, true, 0, false);
            const __m512i idx = _mm512_loadu_si512(idx_k4[p]);
            UNROLL
            for (int r = 0; r < R; r++) {
                const tsr_block_q4_K *q = (const tsr_block_q4_K *)(x + (size_t)r * xs) + sb;
                if (p < 3)
                    _mm_prefetch(x + (size_t)r * xs + pfo + sb * 144 + 64 * p, _MM_HINT_T0);
                const __m256i t = _mm256_loadu_si256((const __m256i *)(q->qs + 32 * p));
                const __m512i u = _mm512_and_si512(
                    _mm512_inserti64x4(_mm512_castsi256_si512(t), _mm256_srli_epi16(t, 4), 1), _mm512_set1_epi8(0x0F));
                acc[r] = step(acc[r], _mm512_setzero_si512(), u, &yp, _mm512_permutexvar_ps(idx, sc[r]));
            }
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) s[r] = _mm512_reduce_add_ps(acc[r]);
}

/* ---- Q6_K: super-blocks of 256, a scale per 16 values ------------------------- */

INLINE void rows_q6k(int R, int64_t k, const char *x, size_t xs, size_t pfo, const tsr_cpu_q8s *y, float *s) {
    const int64_t nsb = k / 256;
    __m512 acc[8];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
        const tsr_cpu_q8s *yb = y + 8 * sb;
        __m512 sc[8];
        UNROLL
        for (int r = 0; r < R; r++) {
            const tsr_block_q6_K *q = (const tsr_block_q6_K *)(x + (size_t)r * xs) + sb;
            sc[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q->scales))),
                                  _mm512_set1_ps(TSR_FP16_TO_FP32(q->d)));
        }
        UNROLL
        for (int p = 0; p < 4; p++) {
            const ypair yp = ypair_load(yb + 2 * p, true, 32, false);
            const __m512i idx = _mm512_loadu_si512(idx_k6[p]);
            const int h = p / 2;
            UNROLL
            for (int r = 0; r < R; r++) {
                const tsr_block_q6_K *q = (const tsr_block_q6_K *)(x + (size_t)r * xs) + sb;
                _mm_prefetch(x + (size_t)r * xs + pfo + sb * 210 + 64 * p, _MM_HINT_T0);
                __m512i lo = _mm512_loadu_si512((const void *)(q->ql + 64 * h));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(q->qh + 32 * h));
                __m256i h0, h1; /* the two high bits of values 0..31 of each block, at bits 4..5 */
                if (p % 2 == 0) {
                    h0 = _mm256_slli_epi16(qh, 4), h1 = _mm256_slli_epi16(qh, 2);
                } else {
                    lo = _mm512_srli_epi16(lo, 4);
                    h0 = qh, h1 = _mm256_srli_epi16(qh, 2);
                }
                const __m512i hi = _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1);
                const __m512i u = _mm512_ternarylogic_epi32(_mm512_and_si512(lo, _mm512_set1_epi8(0x0F)), hi,
                                                            _mm512_set1_epi8(0x30), 0xF8); /* a | (b & c) */
                acc[r] = step(acc[r], yp.neg, u, &yp, _mm512_permutexvar_ps(idx, sc[r]));
            }
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) s[r] = _mm512_reduce_add_ps(acc[r]);
}

/* ---- entry points: the rows 8 at a time, then 4, 2, 1 ------------------------ */

INLINE void rows_of(tsr_type t, int R, int64_t k, const char *x, size_t xs, size_t pfo, const tsr_cpu_q8s *y,
                    float *s) {
    if (t == TSR_TYPE_Q4_K)
        rows_q4k(R, k, x, xs, pfo, y, s);
    else if (t == TSR_TYPE_Q6_K)
        rows_q6k(R, k, x, xs, pfo, y, s);
    else
        rows32(t, R, k, x, xs, pfo, y, s);
}

/* The first GEMV_PF rows of a call into L2 (the rows then prefetch GEMV_PF rows ahead). */
static inline void ramp(const char *x, int64_t m, size_t xs) {
    const size_t n = (size_t)(m < GEMV_PF ? m : GEMV_PF) * xs;
    for (size_t o = 0; o < n; o += 64) _mm_prefetch(x + o, _MM_HINT_T1);
}

/* The prefetch distance: GEMV_PF rows ahead, within the call's rows. */
static inline size_t pf_offset(int64_t i, int R, int64_t m, size_t xs) {
    const int64_t ahead = m - i - R < GEMV_PF ? m - i - R : GEMV_PF;
    return ahead > 0 ? (size_t)ahead * xs : 0;
}

#define GEMV(name, T)                                                                                           \
    static void name(int64_t k, int64_t m, const void *vx, size_t xs, const void *vy, float *s) {               \
        const char *x = vx;                                                                                     \
        ramp(x, m, xs);                                                                                         \
        int64_t i = 0;                                                                                          \
        for (; i + 8 <= m; i += 8) rows_of(T, 8, k, x + (size_t)i * xs, xs, pf_offset(i, 8, m, xs), vy, s + i); \
        if (i + 4 <= m)                                                                                         \
            rows_of(T, 4, k, x + (size_t)i * xs, xs, pf_offset(i, 4, m, xs), vy, s + i), i += 4;                \
        if (i + 2 <= m)                                                                                         \
            rows_of(T, 2, k, x + (size_t)i * xs, xs, pf_offset(i, 2, m, xs), vy, s + i), i += 2;                \
        if (i < m)                                                                                              \
            rows_of(T, 1, k, x + (size_t)i * xs, xs, 0, vy, s + i);                                             \
    }
GEMV(gemv_q8_0, TSR_TYPE_Q8_0)
GEMV(gemv_q4_0, TSR_TYPE_Q4_0)
GEMV(gemv_q5_0, TSR_TYPE_Q5_0)
GEMV(gemv_q4_1, TSR_TYPE_Q4_1)
GEMV(gemv_q4_k, TSR_TYPE_Q4_K)
GEMV(gemv_q6_k, TSR_TYPE_Q6_K)

void tsr__cpu_gemv_avx512_vnni(tsr_cpu_kernels *k) {
    k->gemv[TSR_TYPE_Q8_0] = gemv_q8_0;
    k->gemv[TSR_TYPE_Q4_0] = gemv_q4_0;
    k->gemv[TSR_TYPE_Q5_0] = gemv_q5_0;
    k->gemv[TSR_TYPE_Q4_1] = gemv_q4_1;
    k->gemv[TSR_TYPE_Q4_K] = gemv_q4_k;
    k->gemv[TSR_TYPE_Q6_K] = gemv_q6_k;
}
