/*
 * avx512/gemv.c - the matrix-vector products of decode (one activation
 * column) with VPDPBUSD (AVX-512 VNNI): 8 weight rows at a time, read in
 * their stored block format (no repacking), against one activation row in
 * the weight type's dot type (Q8_0, Q8_1, Q8_K, as for the dots).
 *
 * Each result is the same bits as the kernel table's dot product of that
 * row (test-cpu-kernels checks it), so decode gives what the dots gave (the
 * order of ggml's AVX2 kernels): per block the exact integer sums of
 * each 32-bit lane's four products, then in float, block after block, one
 * 256-bit accumulator acc += (dx * dy) * sums (for Q4_1 a separate sum of
 * m * s; for Q4_K / Q6_K the sub-block scales applied in integers, one
 * float step per super-block), and the horizontal sum of hsum_ps256.
 * What the rows share is done once for all of them (the activations'
 * loads, scales and offset sums), the rows' instructions are independent
 * (8 accumulators in registers; Q4_K / Q6_K go row after row within a
 * super-block, their scales and sums would spill), and the rows prefetch
 * GEMV_PF rows ahead: several rows read side by side defeat the hardware
 * prefetcher (without it 6-11 GB/s from DRAM on one thread, with it 25-45).
 *
 * The integers: two 32-value blocks fill a 512-bit vector; the weights
 * become UNSIGNED bytes u (the nibbles, 5- or 6-bit values, or Q8_0's
 * bytes + 128), and the offset of the signed formats (Q4_0: 8, Q5_0: 16,
 * Q6_K: 32, Q8_0: 128) comes back out exactly: the lanes start from
 * -offset * the sum of their four activations.
 */
#include "../cpu.h"
#include "../simd.h"

#include <immintrin.h>

#define UNROLL _Pragma("GCC unroll 16")
#define INLINE static inline __attribute__((always_inline))
#define F16F(h) TSR_FP16_TO_FP32(h)
#define GEMV_R 8 /* rows at a time */

INLINE __m512i load2x256(const void *a, const void *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}
INLINE __m512i load1x256(const void *a) { return _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)a)); }

/* -off * the sum of each lane's four values */
INLINE __m512i neg_sums(int off, __m512i q) {
    return off ? _mm512_sub_epi32(_mm512_setzero_si512(),
                                  _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)off), q))
               : _mm512_setzero_si512();
}

/* The dots' float steps: two blocks (the halves of p) in order, or one;
 * d0, d1 the products dx * dy broadcast. */
INLINE __m256 fma_pair(__m256 acc, __m256 d0, __m256 d1, __m512i p) {
    const __m512 f = _mm512_cvtepi32_ps(p);
    acc = _mm256_fmadd_ps(d0, _mm512_castps512_ps256(f), acc);
    return _mm256_fmadd_ps(d1, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)), acc);
}
INLINE __m256 fma_one(__m256 acc, __m256 d, __m512i p) {
    return _mm256_fmadd_ps(d, _mm512_castps512_ps256(_mm512_cvtepi32_ps(p)), acc);
}

/* A F16 scale broadcast from the conversion table (a load, no shuffle). */
INLINE __m256 bcast_f16(const void *h) {
    uint16_t v;
    memcpy(&v, h, 2);
    return _mm256_broadcast_ss(&tsr__fp16_table[v]);
}

/* 16 nibble bytes of two blocks -> [lo q0, hi q0 | lo q1, hi q1] as values 0..15 (q1 NULL: zeros). */
INLINE __m512i nib2(const uint8_t *q0, const uint8_t *q1) {
    static const int64_t il[8] = {0, 1, 8, 9, 2, 3, 10, 11};
    const __m128i a = _mm_loadu_si128((const __m128i *)q0);
    const __m256i t = q1 ? _mm256_inserti128_si256(_mm256_castsi128_si256(a), _mm_loadu_si128((const __m128i *)q1), 1)
                         : _mm256_zextsi128_si256(a);
    const __m512i u = _mm512_permutex2var_epi64(_mm512_castsi256_si512(t), _mm512_loadu_si512(il),
                                                _mm512_castsi256_si512(_mm256_srli_epi16(t, 4)));
    return _mm512_and_si512(u, _mm512_set1_epi8(0x0F));
}

/* ---- the 32-value block formats: Q8_0, Q4_0, Q5_0 (x Q8_0), Q4_1 (x Q8_1) ------- */

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

/* A row's blocks b, b + 1 (two false: b only) as unsigned values; their scales. */
INLINE __m512i blk2(tsr_type t, const char *row, int64_t b, bool two, __m256 *d0, __m256 *d1) {
    switch (t) {
    case TSR_TYPE_Q8_0: {
        const tsr_block_q8_0 *q = (const tsr_block_q8_0 *)row + b;
        *d0 = bcast_f16(&q[0].d), *d1 = two ? bcast_f16(&q[1].d) : _mm256_setzero_ps();
        return _mm512_xor_si512(two ? load2x256(q[0].qs, q[1].qs) : load1x256(q[0].qs), _mm512_set1_epi8((char)0x80));
    }
    case TSR_TYPE_Q4_0: {
        const tsr_block_q4_0 *q = (const tsr_block_q4_0 *)row + b;
        *d0 = bcast_f16(&q[0].d), *d1 = two ? bcast_f16(&q[1].d) : _mm256_setzero_ps();
        return nib2(q[0].qs, two ? q[1].qs : NULL);
    }
    case TSR_TYPE_Q5_0: {
        const tsr_block_q5_0 *q = (const tsr_block_q5_0 *)row + b;
        *d0 = bcast_f16(&q[0].d), *d1 = two ? bcast_f16(&q[1].d) : _mm256_setzero_ps();
        uint32_t h0, h1 = 0;
        memcpy(&h0, q[0].qh, 4);
        if (two)
            memcpy(&h1, q[1].qh, 4);
        const __m512i u = nib2(q[0].qs, two ? q[1].qs : NULL);
        return _mm512_mask_add_epi8(u, _cvtu64_mask64(h0 | (uint64_t)h1 << 32), u, _mm512_set1_epi8(16));
    }
    default: { /* TSR_TYPE_Q4_1 */
        const tsr_block_q4_1 *q = (const tsr_block_q4_1 *)row + b;
        *d0 = bcast_f16(&q[0].d), *d1 = two ? bcast_f16(&q[1].d) : _mm256_setzero_ps();
        return nib2(q[0].qs, two ? q[1].qs : NULL);
    }
    }
}

/* Blocks b, b + 1 (two false: b only) of R rows into their accumulators. */
INLINE void pair32(tsr_type t, int R, const char *x, size_t xs, size_t pfo, const void *vy, int64_t b, bool two,
                   __m256 *acc, float *summs) {
    __m512i q;
    __m256 dy0, dy1 = _mm256_setzero_ps();
    float sy0 = 0.0f, sy1 = 0.0f;
    if (t == TSR_TYPE_Q4_1) {
        const tsr_block_q8_1 *y = (const tsr_block_q8_1 *)vy + b;
        q = two ? load2x256(y[0].qs, y[1].qs) : load1x256(y[0].qs);
        dy0 = bcast_f16(&y[0].d), sy0 = F16F(y[0].s);
        if (two)
            dy1 = bcast_f16(&y[1].d), sy1 = F16F(y[1].s);
    } else {
        const tsr_block_q8_0 *y = (const tsr_block_q8_0 *)vy + b;
        q = two ? load2x256(y[0].qs, y[1].qs) : load1x256(y[0].qs);
        dy0 = bcast_f16(&y[0].d);
        if (two)
            dy1 = bcast_f16(&y[1].d);
    }
    const __m512i neg = neg_sums(zp_offset(t), q);
    UNROLL
    for (int r = 0; r < R; r++) {
        const char *row = x + (size_t)r * xs;
        const char *pf = row + pfo + b * blk_bytes(t);
        _mm_prefetch(pf, _MM_HINT_T1);
        if (2 * blk_bytes(t) > 64)
            _mm_prefetch(pf + 64, _MM_HINT_T1);
        __m256 d0, d1;
        const __m512i p = _mm512_dpbusd_epi32(neg, blk2(t, row, b, two, &d0, &d1), q);
        if (t == TSR_TYPE_Q4_1) { /* one block at a time (ggml's order) */
            const tsr_block_q4_1 *w = (const tsr_block_q4_1 *)row + b;
            summs[r] += F16F(w[0].m) * sy0;
            if (two)
                summs[r] += F16F(w[1].m) * sy1;
        }
        acc[r] = two ? fma_pair(acc[r], _mm256_mul_ps(d0, dy0), _mm256_mul_ps(d1, dy1), p)
                     : fma_one(acc[r], _mm256_mul_ps(d0, dy0), p);
    }
}

INLINE void rows32(tsr_type t, int R, int64_t k, const char *x, size_t xs, size_t pfo, const void *y, float *s) {
    const int64_t nb = k / 32;
    __m256 acc[8];
    float summs[8];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps(), summs[r] = 0.0f;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) pair32(t, R, x, xs, pfo, y, b, true, acc, summs);
    if (b < nb)
        pair32(t, R, x, xs, pfo, y, b, false, acc, summs);
    UNROLL
    for (int r = 0; r < R; r++) s[r] = t == TSR_TYPE_Q4_1 ? hsum_ps256(acc[r]) + summs[r] : hsum_ps256(acc[r]);
}

/* ---- Q4_K and Q6_K (x Q8_K): super-blocks of 256 -------------------------------- */

/* The 8 six-bit scales (bytes 0..7) and minimums (8..15). */
INLINE __m128i q4k_scales(const uint8_t *sc) {
    uint32_t u[3], w[4];
    memcpy(u, sc, 12);
    const uint32_t m6 = 0x3f3f3f3fu, m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    w[0] = u[0] & m6;
    w[1] = (u[2] & m4) | (((u[0] >> 6) & m2) << 4);
    w[2] = u[1] & m6;
    w[3] = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4);
    return _mm_loadu_si128((const __m128i *)w);
}

/* Lanes of a vector of 16 scales: Q4_K [2p x 8 | 2p + 1 x 8], Q6_K groups of 4 lanes. */
static const int32_t idx_k4[4][16] = {{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
                                      {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
                                      {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5},
                                      {6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7}};
static const int32_t idx_k6[4][16] = {{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3},
                                      {4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7},
                                      {8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11},
                                      {12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15}};

/* The two 256-bit halves of the super-block's lanes added. */
INLINE __m256 fold_cvt(__m512i v) {
    return _mm256_cvtepi32_ps(_mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)));
}

/* Row by row within a super-block (the activations reloaded from L1): the
 * rows' scales and sums do not fit in registers all at once. */
INLINE void rows_k4(bool q5, int R, int64_t k, const char *x, size_t xs, size_t pfo, const void *vy, float *s) {
    const size_t bsz = q5 ? sizeof(tsr_block_q5_K) : sizeof(tsr_block_q4_K);
    __m256 acc[8];
    float accm[8];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps(), accm[r] = 0.0f;
    for (int64_t sb = 0; sb < k / 256; sb++) {
        const tsr_block_q8_K *y = (const tsr_block_q8_K *)vy + sb;
        /* the sub-blocks' sums of the activations, for the minimums */
        const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums),
                                          _mm_loadu_si128((const __m128i *)(y->bsums + 8)));
        UNROLL
        for (int r = 0; r < R; r++) {
            /* (d, dmin and scales at the same offsets in both) */
            const char *blk = x + (size_t)r * xs + (size_t)sb * bsz;
            const tsr_block_q4_K *q = (const tsr_block_q4_K *)blk;
            const uint8_t *qs = q5 ? ((const tsr_block_q5_K *)blk)->qs : q->qs;
            const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)((const tsr_block_q5_K *)blk)->qh)
                                  : _mm256_setzero_si256();
            const __m128i sm = q4k_scales(q->scales);
            const __m512i sc = _mm512_cvtepu8_epi32(sm);
            __m128i pm = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)), bs);
            pm = _mm_add_epi32(pm, _mm_shuffle_epi32(pm, 0x4E));
            pm = _mm_add_epi32(pm, _mm_shuffle_epi32(pm, 0xB1));
            accm[r] += y->d * F16F(q->dmin) * (float)_mm_cvtsi128_si32(pm);
            __m512i sumi = _mm512_setzero_si512();
            UNROLL
            for (int p = 0; p < 4; p++) {
                if (p < 3)
                    _mm_prefetch(x + (size_t)r * xs + pfo + sb * bsz + 64 * p, _MM_HINT_T1);
                const __m256i t = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
                __m512i u = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(t), _mm256_srli_epi16(t, 4), 1),
                                             _mm512_set1_epi8(0x0F));
                if (q5)
                    u = _mm512_or_si512(
                        u, _mm512_inserti64x4(_mm512_castsi256_si512(k5_high(qh, 2 * p)), k5_high(qh, 2 * p + 1), 1));
                const __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u,
                                                      _mm512_loadu_si512((const void *)(y->qs + 64 * p)));
                /* |d| < 2^15: one 16 x 16-bit product per lane */
                sumi = _mm512_add_epi32(
                    sumi, _mm512_madd_epi16(d, _mm512_permutexvar_epi32(_mm512_loadu_si512(idx_k4[p]), sc)));
            }
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * F16F(q->d)), fold_cvt(sumi), acc[r]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) s[r] = hsum_ps256(acc[r]) - accm[r];
}

/* Q5_K: Q4_K's sums with each value's fifth bit (qh: bit j of byte b is the
 * high bit of value b of sub-block j) at bit 4 of its nibble byte. */
INLINE void rows_q4k(int R, int64_t k, const char *x, size_t xs, size_t pfo, const void *vy, float *s) {
    rows_k4(false, R, k, x, xs, pfo, vy, s);
}
INLINE void rows_q5k(int R, int64_t k, const char *x, size_t xs, size_t pfo, const void *vy, float *s) {
    rows_k4(true, R, k, x, xs, pfo, vy, s);
}

INLINE void rows_q6k(int R, int64_t k, const char *x, size_t xs, size_t pfo, const void *vy, float *s) {
    __m256 acc[8];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < k / 256; sb++) {
        const tsr_block_q8_K *y = (const tsr_block_q8_K *)vy + sb;
        __m512i neg[4]; /* -32 * the activations' lane sums */
        UNROLL
        for (int p = 0; p < 4; p++) neg[p] = neg_sums(32, _mm512_loadu_si512((const void *)(y->qs + 64 * p)));
        UNROLL
        for (int r = 0; r < R; r++) {
            const tsr_block_q6_K *q = (const tsr_block_q6_K *)(x + (size_t)r * xs) + sb;
            /* the scales as 16-bit values in 32-bit lanes (the upper halves zero) */
            const __m512i sc = _mm512_and_si512(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q->scales)),
                                                _mm512_set1_epi32(0xFFFF));
            __m512i sumi = _mm512_setzero_si512();
            UNROLL
            for (int p = 0; p < 4; p++) { /* values 64p .. 64p + 63: blocks 2 (p % 2), + 1 of the half p / 2 */
                const int h = p / 2;
                _mm_prefetch(x + (size_t)r * xs + pfo + sb * 210 + 64 * p, _MM_HINT_T1);
                __m512i lo = _mm512_loadu_si512((const void *)(q->ql + 64 * h));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(q->qh + 32 * h));
                __m256i h0, h1; /* the two high bits of each block's values, at bits 4..5 */
                if (p % 2 == 0) {
                    h0 = _mm256_slli_epi16(qh, 4), h1 = _mm256_slli_epi16(qh, 2);
                } else {
                    lo = _mm512_srli_epi16(lo, 4);
                    h0 = qh, h1 = _mm256_srli_epi16(qh, 2);
                }
                const __m512i hi = _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1);
                const __m512i u = _mm512_ternarylogic_epi32(_mm512_and_si512(lo, _mm512_set1_epi8(0x0F)), hi,
                                                            _mm512_set1_epi8(0x30), 0xF8); /* a | (b & c) */
                const __m512i d = _mm512_dpbusd_epi32(neg[p], u, _mm512_loadu_si512((const void *)(y->qs + 64 * p)));
                /* |d| <= 4 * 32 * 128: one 16 x 16-bit product per lane */
                sumi = _mm512_add_epi32(
                    sumi, _mm512_madd_epi16(d, _mm512_permutexvar_epi32(_mm512_loadu_si512(idx_k6[p]), sc)));
            }
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * F16F(q->d)), fold_cvt(sumi), acc[r]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) s[r] = hsum_ps256(acc[r]);
}

/* ---- entry points: the rows 8 at a time, then 4, 2, 1 ------------------------ */

GEMV_ROWS_OF

GEMV(gemv_q8_0, TSR_TYPE_Q8_0)
GEMV(gemv_q4_0, TSR_TYPE_Q4_0)
GEMV(gemv_q5_0, TSR_TYPE_Q5_0)
GEMV(gemv_q4_1, TSR_TYPE_Q4_1)
GEMV(gemv_q4_k, TSR_TYPE_Q4_K)
GEMV(gemv_q5_k, TSR_TYPE_Q5_K)
GEMV(gemv_q6_k, TSR_TYPE_Q6_K)

/* The one-column matmul for F16 weights (kernel table gemv): one row
 * after another through dot_f16_512 (simd.h), the dot's own code, so each
 * row is bit for bit dot_f16_f16; left to the hardware's prefetch: a single stream read in order
 * is what Zen 4's prefetchers follow best. bench/gemv, 1 thread: 93-98% of
 * the plain read, against 80-83% for the former kernel (4 rows side by
 * side, requested GEMV_PF rows ahead), 59% for 4 rows without requests
 * and 84% for one row with them. At the model level (1B-class F16, tg64,
 * alternated on a noisy host) 1 thread 10.7-11.9 -> 11.5-13.6 t/s, 2
 * threads the same or better; requesting the call's first rows (ramp)
 * lost 10-15% there, and requests 2-8 KiB ahead in the stream lost up to
 * 40% (16 KiB: no better than none). Converting the activations again for
 * each row costs nothing from memory: the dot runs at twice the read in
 * L1 (59 GB/s, 1 thread). */
static void gemv_f16(int64_t k, int64_t m, int64_t ahead, const void *vx, size_t xs, const void *vy, float *s) {
    (void)ahead;
    for (int64_t r = 0; r < m; r++) s[r] = dot_f16_512(k, (const uint16_t *)((const char *)vx + (size_t)r * xs), vy);
}

void tsr__cpu_avx512_gemv(tsr_cpu_kernels *k, bool vnni) {
    k->gemv[TSR_TYPE_F16] = gemv_f16;
    if (!vnni)
        return;
    k->gemv[TSR_TYPE_Q8_0] = gemv_q8_0;
    k->gemv[TSR_TYPE_Q4_0] = gemv_q4_0;
    k->gemv[TSR_TYPE_Q5_0] = gemv_q5_0;
    k->gemv[TSR_TYPE_Q4_1] = gemv_q4_1;
    k->gemv[TSR_TYPE_Q4_K] = gemv_q4_k;
    k->gemv[TSR_TYPE_Q5_K] = gemv_q5_k;
    k->gemv[TSR_TYPE_Q6_K] = gemv_q6_k;
}
