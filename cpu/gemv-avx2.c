/*
 * gemv-avx2.c - the matrix-vector products of decode (one activation
 * column) with AVX2: several weight rows at a time, read in their stored
 * block format, against one row of tsr_cpu_q8s activations; and the AVX2
 * q8s_from_float.
 *
 * One 32-value block per 256-bit vector: the weights as UNSIGNED bytes u
 * below 64 (the stored nibbles, 5- or 6-bit values), multiplied with the
 * signed activation bytes by VPMADDUBSW (pairs summed into 16 bits: at most
 * 2 * 63 * 127, no saturation) and VPMADDWD (into 32-bit lanes of four
 * products); the offset of the signed formats (Q4_0: 8, Q5_0: 16, Q6_K: 32)
 * comes back out in integers, each lane starting from -offset * the sum of
 * its four activations, computed once per block for all the rows. Q8_0's
 * signed bytes go through the sign trick instead (|x| * sign(y, x): at most
 * 2 * 128 * 127). Then per lane, in float, acc += sum * (dx * dy), and for
 * formats with a minimum (Q4_1, Q4_K) acc += m * dy * sum(qy). Each row ends
 * in one horizontal sum; the rows of a call go through the same
 * instructions whatever their number and place, so results do not depend on
 * the tiling or the threads.
 */
#include "cpu.h"
#include "simd.h"

#include <immintrin.h>

#define UNROLL _Pragma("GCC unroll 16")
#define INLINE static inline __attribute__((always_inline))

/* Activations -> tsr_cpu_q8s rows: the reference's arithmetic (d = max / 127,
 * values rounded to nearest even of x * 127 / max), 32 values at a time. */
static void q8s_from_float(const float *x, void *vy, int64_t k) {
    tsr_cpu_q8s *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < k / 32; b++, x += 32) {
        __m256 v[4], mx = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 8 * i);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f, id = d ? 127.0f / amax : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));
        /* sums: of values 0..15 and of all */
        const __m256i s01 = _mm256_add_epi32(q[0], q[1]), s23 = _mm256_add_epi32(q[2], q[3]);
        __m128i lo = _mm_add_epi32(_mm256_castsi256_si128(s01), _mm256_extracti128_si256(s01, 1));
        lo = _mm_hadd_epi32(lo, lo);
        lo = _mm_hadd_epi32(lo, lo);
        __m128i hi = _mm_add_epi32(_mm256_castsi256_si128(s23), _mm256_extracti128_si256(s23, 1));
        hi = _mm_hadd_epi32(hi, hi);
        hi = _mm_hadd_epi32(hi, hi);
        const int32_t slo = _mm_cvtsi128_si32(lo), sum = slo + _mm_cvtsi128_si32(hi);
        /* packs interleave the 128-bit lanes: put them back in order */
        const __m256i p16a = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
        const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
        _mm256_storeu_si256((__m256i *)y[b].qs,
                            _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        y[b].d = d;
        y[b].ds = d * (float)sum;
        y[b].c = -128 * sum;
        y[b].c_lo = -128 * slo;
    }
}

#ifndef GEMV_PF
#define GEMV_PF 24 /* rows ahead to prefetch */
#endif

/* A F16 scale at p broadcast. */
INLINE __m256 half1(const void *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

/* sum of each 32-bit lane's four products of unsigned u (below 64) and signed y */
INLINE __m256i dot4(__m256i u, __m256i y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1));
}

/* One activation block. */
typedef struct yblk {
    __m256i q;   /* values */
    __m256 d;    /* scale */
    __m256i neg; /* -offset * the sum of each lane's four values */
    __m256 ds;   /* d * sum / 8 (formats with a minimum) */
} yblk;

INLINE yblk yblk_load(const tsr_cpu_q8s *y, int off, bool mins) {
    yblk b;
    b.q = _mm256_loadu_si256((const __m256i *)y->qs);
    b.d = _mm256_set1_ps(y->d);
    b.neg = off ? _mm256_sub_epi32(_mm256_setzero_si256(), dot4(_mm256_set1_epi8((char)off), b.q))
                : _mm256_setzero_si256();
    b.ds = mins ? _mm256_set1_ps(y->ds * 0.125f) : _mm256_setzero_ps();
    return b;
}

INLINE __m256 step(__m256 acc, __m256i isum, const yblk *y, __m256 dx) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dx, y->d), acc);
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
    case TSR_TYPE_Q4_0: return 8;
    case TSR_TYPE_Q5_0: return 16;
    case TSR_TYPE_Q6_K: return 32;
    default: return 0; /* Q8_0: the sign trick */
    }
}

/* Block b of a row against y: the integer sums per lane, scale and minimum. */
INLINE __m256i blk1(tsr_type t, const char *row, int64_t b, const yblk *y, __m256 *dx, __m256 *mx) {
    switch (t) {
    case TSR_TYPE_Q8_0: {
        const tsr_block_q8_0 *q = (const tsr_block_q8_0 *)row + b;
        *dx = half1(&q->d);
        const __m256i v = _mm256_loadu_si256((const __m256i *)q->qs);
        return dot4(_mm256_sign_epi8(v, v), _mm256_sign_epi8(y->q, v));
    }
    case TSR_TYPE_Q4_0: {
        const tsr_block_q4_0 *q = (const tsr_block_q4_0 *)row + b;
        *dx = half1(&q->d);
        return _mm256_add_epi32(y->neg, dot4(nibbles32(q->qs), y->q));
    }
    case TSR_TYPE_Q5_0: {
        const tsr_block_q5_0 *q = (const tsr_block_q5_0 *)row + b;
        *dx = half1(&q->d);
        const __m256i u = _mm256_or_si256(nibbles32(q->qs),
                                          _mm256_and_si256(bits_to_bytes32(q->qh), _mm256_set1_epi8(0x10)));
        return _mm256_add_epi32(y->neg, dot4(u, y->q));
    }
    default: { /* TSR_TYPE_Q4_1 */
        const tsr_block_q4_1 *q = (const tsr_block_q4_1 *)row + b;
        uint32_t w;
        memcpy(&w, &q->d, 4); /* d, m */
        const __m256 f = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi32_si128((int)w)));
        *dx = _mm256_permutevar8x32_ps(f, _mm256_setzero_si256());
        *mx = _mm256_permutevar8x32_ps(f, _mm256_set1_epi32(1));
        return dot4(nibbles32(q->qs), y->q);
    }
    }
}

INLINE void rows32(tsr_type t, int R, int64_t k, const char *x, size_t xs, size_t pfo, const tsr_cpu_q8s *y, float *s) {
    const bool mins = t == TSR_TYPE_Q4_1;
    __m256 acc[8];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < k / 32; b++) {
        const yblk yb = yblk_load(y + b, zp_offset(t), mins);
        UNROLL
        for (int r = 0; r < R; r++) {
            if ((b * blk_bytes(t)) % 64 < blk_bytes(t)) /* a new cache line */
                _mm_prefetch(x + (size_t)r * xs + pfo + b * blk_bytes(t) + 64, _MM_HINT_T0);
            __m256 dx, mx = _mm256_setzero_ps();
            const __m256i isum = blk1(t, x + (size_t)r * xs, b, &yb, &dx, &mx);
            acc[r] = step(acc[r], isum, &yb, dx);
            if (mins)
                acc[r] = _mm256_fmadd_ps(mx, yb.ds, acc[r]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) s[r] = hsum_ps256(acc[r]);
}

/* ---- Q4_K and Q6_K: super-blocks of 256 -------------------------------------- */

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

INLINE void rows_q4k(int R, int64_t k, const char *x, size_t xs, size_t pfo, const tsr_cpu_q8s *y, float *s) {
    __m256 acc[8];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < k / 256; sb++) {
        const tsr_cpu_q8s *yb = y + 8 * sb;
        const __m256 yds = _mm256_i32gather_ps(&yb[0].ds, _mm256_setr_epi32(0, 12, 24, 36, 48, 60, 72, 84), 4);
        __m256 sc[8];
        UNROLL
        for (int r = 0; r < R; r++) {
            const tsr_block_q4_K *q = (const tsr_block_q4_K *)(x + (size_t)r * xs) + sb;
            const __m128i sm = q4k_scales(q->scales);
            sc[r] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm)), half1(&q->d));
            const __m256 m8 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8))),
                                            half1(&q->dmin));
            acc[r] = _mm256_fnmadd_ps(m8, yds, acc[r]);
        }
        UNROLL
        for (int j = 0; j < 8; j++) {
            const yblk yq = yblk_load(yb + j, 0, false);
            UNROLL
            for (int r = 0; r < R; r++) {
                const tsr_block_q4_K *q = (const tsr_block_q4_K *)(x + (size_t)r * xs) + sb;
                if (j < 3)
                    _mm_prefetch(x + (size_t)r * xs + pfo + sb * 144 + 64 * j, _MM_HINT_T0);
                __m256i v = _mm256_loadu_si256((const __m256i *)(q->qs + 32 * (j / 2)));
                if (j & 1)
                    v = _mm256_srli_epi16(v, 4);
                const __m256i u = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
                acc[r] = step(acc[r], dot4(u, yq.q), &yq, _mm256_permutevar8x32_ps(sc[r], _mm256_set1_epi32(j)));
            }
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) s[r] = hsum_ps256(acc[r]);
}

INLINE void rows_q6k(int R, int64_t k, const char *x, size_t xs, size_t pfo, const tsr_cpu_q8s *y, float *s) {
    __m256 acc[8];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < k / 256; sb++) {
        const tsr_cpu_q8s *yb = y + 8 * sb;
        __m256 sc[8][2];
        UNROLL
        for (int r = 0; r < R; r++) {
            const tsr_block_q6_K *q = (const tsr_block_q6_K *)(x + (size_t)r * xs) + sb;
            const __m128i v = _mm_loadu_si128((const __m128i *)q->scales);
            const __m256 d = half1(&q->d);
            sc[r][0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), d);
            sc[r][1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))), d);
        }
        UNROLL
        for (int j = 0; j < 8; j++) { /* block j = t of the 128-value half h */
            const yblk yq = yblk_load(yb + j, 32, false);
            const int h = j / 4, t = j % 4;
            const __m256i idx = _mm256_setr_epi32(2 * j % 8, 2 * j % 8, 2 * j % 8, 2 * j % 8, (2 * j + 1) % 8,
                                                  (2 * j + 1) % 8, (2 * j + 1) % 8, (2 * j + 1) % 8);
            UNROLL
            for (int r = 0; r < R; r++) {
                const tsr_block_q6_K *q = (const tsr_block_q6_K *)(x + (size_t)r * xs) + sb;
                if (j < 4)
                    _mm_prefetch(x + (size_t)r * xs + pfo + sb * 210 + 64 * j, _MM_HINT_T0);
                __m256i lo = _mm256_loadu_si256((const __m256i *)(q->ql + 64 * h + 32 * (t & 1)));
                if (t >= 2)
                    lo = _mm256_srli_epi16(lo, 4);
                __m256i hb = _mm256_loadu_si256((const __m256i *)(q->qh + 32 * h));
                hb = 2 * t >= 4 ? _mm256_srli_epi16(hb, 2 * t - 4) : _mm256_slli_epi16(hb, 4 - 2 * t);
                const __m256i u = _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi8(0x0F)),
                                                  _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
                acc[r] = step(acc[r], _mm256_add_epi32(yq.neg, dot4(u, yq.q)), &yq,
                              _mm256_permutevar8x32_ps(sc[r][j / 4], idx));
            }
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) s[r] = hsum_ps256(acc[r]);
}

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

void tsr__cpu_gemv_avx2(tsr_cpu_kernels *k) {
    k->q8s_from_float = q8s_from_float;
    k->gemv[TSR_TYPE_Q8_0] = gemv_q8_0;
    k->gemv[TSR_TYPE_Q4_0] = gemv_q4_0;
    k->gemv[TSR_TYPE_Q5_0] = gemv_q5_0;
    k->gemv[TSR_TYPE_Q4_1] = gemv_q4_1;
    k->gemv[TSR_TYPE_Q4_K] = gemv_q4_k;
    k->gemv[TSR_TYPE_Q6_K] = gemv_q6_k;
}
