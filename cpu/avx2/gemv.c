/*
 * avx2/gemv.c - the matrix-vector products of decode (one activation
 * column) with AVX2: 4 weight rows at a time, read in their stored block
 * format, against one activation row in the weight type's dot type (Q8_0,
 * Q8_1, Q8_K). Each result is the same bits as dot.c's dot product of
 * that row (test-cpu-kernels checks it): the same integer lane sums per
 * block (maddubs of unsigned values below 64 with the signed activations,
 * the offset of Q4_0 / Q5_0 taken out in integers, Q8_0 by the sign trick),
 * the same float steps block after block, the same horizontal sum. What the
 * rows share (the activations' loads, scales and offset sums) is done once
 * for all of them, and the rows prefetch GEMV_PF rows ahead (linear_pf).
 * Q8_0, cheap to compute and limited by memory, goes one row at a time.
 */
#include "../cpu.h"
#include "../simd.h"

#include <immintrin.h>
#include <stddef.h>

#define UNROLL _Pragma("GCC unroll 16")
#define INLINE static inline __attribute__((always_inline))

#ifndef GEMV_R
#define GEMV_R 4 /* rows at a time: 8 or 4 (4: Q4_1 +17%, the others the same; 16 registers) */
#endif
#define F16F(h) TSR_FP16_TO_FP32(h)
#ifndef KROWS
#define KROWS _Pragma("GCC unroll 1")
#endif

/* A F16 scale broadcast from the conversion table (a load, no shuffle). */
INLINE __m256 bcast_f16(const void *h) {
    uint16_t v;
    memcpy(&v, h, 2);
    return _mm256_broadcast_ss(&tsr__fp16_table[v]);
}

/* 32 nibbles of 16 bytes: low -> bytes 0..15, high -> 16..31 (one shift of the upper half). */
INLINE __m256i nib32(const uint8_t *qs) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

/* linear_pf: the rows of a pass (R side by side, rows32 and the k-quants'
 * rows) request the R rows GEMV_PF rows ahead as one linear sequence, R
 * blocks' worth per block step (with rows xs apart exactly their size, the
 * usual case, the same bytes as each row requesting its own, in address
 * order; padded rows leave a little unrequested), instead of R sequences
 * one row apart, which the memory side streams worse. Measured (Zen 3, 100
 * matrices of 1536 x 768 in sequence, best of 5, GB/s, before -> after):
 * 1 thread Q4_1 8.7-9.4 -> 12.2-12.8, Q5_0 9.5-10.0 -> 10.8-11.1, Q4_0
 * 7.6-9.8 -> 7.5-12.9, Q4_K 8.9-9.2 -> 9.3-9.4; 2 threads Q4_1 9.8-10.3 ->
 * 11.1-11.6, Q5_0 10.8-11.4 -> 12.0-12.2, Q4_0 and Q4_K +0-5%, Q6_K the
 * same within the noise. */

/* sum of each 32-bit lane's four products of unsigned u and signed y (the
 * 16-bit pair sums saturate as the dots' do: u below 64, or Q8_0's |x|) */
INLINE __m256i dot4(__m256i u, __m256i y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1));
}

/* Q5_0's unsigned values: the nibbles plus 16 where the high bit is set,
 * as nibble - 0xF0 (bytes), so that the nibbles' 0x0F serves twice: with
 * an AND with 0x10 (and bits_to_bytes32's former OR-and-compare form) the
 * four rows' pass spilled an accumulator to the stack (in cache, 1 thread,
 * Zen 3: 6.4-6.9 cycles per row and block, now 3.5-3.6; Q4_0 3.3). */
INLINE __m256i q5_u(const uint8_t *qs, const uint8_t *qh) {
    return _mm256_sub_epi8(nib32(qs), _mm256_andnot_si256(_mm256_set1_epi8(0x0F), bits_to_bytes32(qh)));
}

static inline int64_t blk_bytes(tsr_type t) {
    switch (t) {
    case TSR_TYPE_Q8_0: return sizeof(tsr_block_q8_0);
    case TSR_TYPE_Q4_0: return sizeof(tsr_block_q4_0);
    case TSR_TYPE_Q5_0: return sizeof(tsr_block_q5_0);
    default: return sizeof(tsr_block_q4_1);
    }
}

/* ---- Q8_0, Q4_0, Q5_0 (x Q8_0), Q4_1 (x Q8_1): one block per step -------------- */

/* Block b of a row against the activation values yq (neg: -offset * their
 * lane sums): the integer sums of the lanes, and the block's scale. */
INLINE __m256i blk1(tsr_type t, const char *row, int64_t b, __m256i yq, __m256i neg, __m256 *dx) {
    switch (t) {
    case TSR_TYPE_Q8_0: { /* signed x signed: |x| against y with x's sign */
        const tsr_block_q8_0 *q = (const tsr_block_q8_0 *)row + b;
        *dx = bcast_f16(&q->d);
        const __m256i x = _mm256_loadu_si256((const __m256i *)q->qs);
        return dot4(_mm256_sign_epi8(x, x), _mm256_sign_epi8(yq, x));
    }
    case TSR_TYPE_Q4_0: {
        const tsr_block_q4_0 *q = (const tsr_block_q4_0 *)row + b;
        *dx = bcast_f16(&q->d);
        return _mm256_add_epi32(neg, dot4(nib32(q->qs), yq));
    }
    case TSR_TYPE_Q5_0: {
        const tsr_block_q5_0 *q = (const tsr_block_q5_0 *)row + b;
        *dx = bcast_f16(&q->d);
        const __m256i u = q5_u(q->qs, q->qh);
        return _mm256_add_epi32(neg, dot4(u, yq));
    }
    default: { /* TSR_TYPE_Q4_1 */
        const tsr_block_q4_1 *q = (const tsr_block_q4_1 *)row + b;
        *dx = bcast_f16(&q->d);
        return dot4(nib32(q->qs), yq);
    }
    }
}

INLINE void rows32(tsr_type t, int R, int64_t k, const char *x, size_t xs, size_t pfo, const void *vy, float *s) {
    __m256 acc[8];
    float summs[8];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps(), summs[r] = 0.0f;
    const int off = t == TSR_TYPE_Q4_0 ? 8 : t == TSR_TYPE_Q5_0 ? 16 : 0;
    for (int64_t b = 0; b < k / 32; b++) {
        __m256i yq;
        __m256 dy;
        float sy = 0.0f;
        if (t == TSR_TYPE_Q4_1) {
            const tsr_block_q8_1 *y = (const tsr_block_q8_1 *)vy + b;
            yq = _mm256_loadu_si256((const __m256i *)y->qs), dy = bcast_f16(&y->d), sy = F16F(y->s);
        } else {
            const tsr_block_q8_0 *y = (const tsr_block_q8_0 *)vy + b;
            yq = _mm256_loadu_si256((const __m256i *)y->qs), dy = bcast_f16(&y->d);
        }
        const __m256i neg = off ? _mm256_sub_epi32(_mm256_setzero_si256(), dot4(_mm256_set1_epi8((char)off), yq))
                                : _mm256_setzero_si256();
        UNROLL
        for (int r = 0; r < R; r++) {
            const char *row = x + (size_t)r * xs;
            /* every block, both ends of a block over 32 bytes (one request
             * per new line left Q8_0 at 11 GB/s from DRAM on one thread and
             * Q4_0 at 10, this 18-26 and 15-19, Zen 4), in one linear
             * sequence through the R rows GEMV_PF rows ahead (linear_pf) */
            const char *pf = x + pfo + (b * R + r) * blk_bytes(t);
            _mm_prefetch(pf, _MM_HINT_T1);
            if (blk_bytes(t) > 32)
                _mm_prefetch(pf + blk_bytes(t) - 1, _MM_HINT_T1);
            __m256 dx;
            const __m256i isum = blk1(t, row, b, yq, neg, &dx);
            if (t == TSR_TYPE_Q4_1)
                summs[r] += F16F(((const tsr_block_q4_1 *)row + b)->m) * sy;
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(isum), acc[r]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) s[r] = t == TSR_TYPE_Q4_1 ? hsum_ps256(acc[r]) + summs[r] : hsum_ps256(acc[r]);
}

/* ---- Q4_K and Q6_K (x Q8_K): super-blocks of 256, as dot.c's dots ----------- */

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

/* 16-bit lane k of each 128-bit half of v (the same eight scales in both)
 * in every lane of that half: one in-lane shuffle */
INLINE __m256i bcast16(__m256i v, int k) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(((2 * k + 1) << 8) | (2 * k))));
}

INLINE void rows_k4(bool q5, int R, int64_t k, const char *x, size_t xs, size_t pfo, const void *vy, float *s) {
    const size_t bsz = q5 ? sizeof(tsr_block_q5_K) : sizeof(tsr_block_q4_K);
    __m256 acc[8];
    float accm[8];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps(), accm[r] = 0.0f;
    for (int64_t sb = 0; sb < k / 256; sb++) {
        const tsr_block_q8_K *y = (const tsr_block_q8_K *)vy + sb;
        const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums),
                                          _mm_loadu_si128((const __m128i *)(y->bsums + 8)));
        KROWS
        for (int r = 0; r < R; r++) {
            /* (d, dmin and scales at the same offsets in both) */
            const char *blk = x + (size_t)r * xs + (size_t)sb * bsz;
            const tsr_block_q4_K *q = (const tsr_block_q4_K *)blk;
            const uint8_t *qs = q5 ? ((const tsr_block_q5_K *)blk)->qs : q->qs;
            const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)((const tsr_block_q5_K *)blk)->qh)
                                  : _mm256_setzero_si256();
            const __m128i sm = q4k_scales(q->scales);
            __m128i pm = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)), bs);
            pm = _mm_add_epi32(pm, _mm_shuffle_epi32(pm, 0x4E));
            pm = _mm_add_epi32(pm, _mm_shuffle_epi32(pm, 0xB1));
            accm[r] += y->d * F16F(q->dmin) * (float)_mm_cvtsi128_si32(pm);
            const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
            __m256i sumi = _mm256_setzero_si256();
            UNROLL for (int j = 0; j < 4; j++) {
                if (j < 3)
                    _mm_prefetch(x + pfo + (sb * R + r) * bsz + 64 * j, _MM_HINT_T1); /* linear_pf */
                const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
                __m256i lo = _mm256_and_si256(bits, _mm256_set1_epi8(0x0F));
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), _mm256_set1_epi8(0x0F));
                if (q5)
                    lo = _mm256_or_si256(lo, k5_high(qh, 2 * j)), hi = _mm256_or_si256(hi, k5_high(qh, 2 * j + 1));
                const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(y->qs + 64 * j)));
                const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(y->qs + 64 * j + 32)));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(bcast16(sc, 2 * j), pl));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(bcast16(sc, 2 * j + 1), ph));
            }
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * F16F(q->d)), _mm256_cvtepi32_ps(sumi), acc[r]);
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
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32);
    __m256 acc[8];
    UNROLL
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < k / 256; sb++) {
        const tsr_block_q8_K *y = (const tsr_block_q8_K *)vy + sb;
        KROWS
        for (int r = 0; r < R; r++) {
            const tsr_block_q6_K *q = (const tsr_block_q6_K *)(x + (size_t)r * xs) + sb;
            __m256i sumi = _mm256_setzero_si256();
            UNROLL for (int c = 0; c < 2; c++) {
                const uint8_t *ql = q->ql + 64 * c, *qh = q->qh + 32 * c;
                const int8_t *q8 = y->qs + 128 * c, *sc = q->scales + 8 * c;
                _mm_prefetch(x + pfo + (sb * R + r) * 210 + 128 * c, _MM_HINT_T1); /* linear_pf */
                _mm_prefetch(x + pfo + (sb * R + r) * 210 + 128 * c + 64, _MM_HINT_T1);
                const __m256i b1 = _mm256_loadu_si256((const __m256i *)ql);
                const __m256i b2 = _mm256_loadu_si256((const __m256i *)(ql + 32));
                const __m256i bh = _mm256_loadu_si256((const __m256i *)qh);
                __m256i v[4];
                v[0] = _mm256_or_si256(_mm256_and_si256(b1, m4), _mm256_slli_epi16(_mm256_and_si256(bh, m2), 4));
                v[1] = _mm256_or_si256(_mm256_and_si256(b2, m4),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 2), m2), 4));
                v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 4), m2), 4));
                v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 6), m2), 4));
                /* the half's eight scales as 16 bits in both 128-bit lanes */
                const __m256i sc16 = _mm256_broadcastsi128_si256(
                    _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
                UNROLL for (int g = 0; g < 4; g++) {
                    const __m256i y8 = _mm256_loadu_si256((const __m256i *)(q8 + 32 * g));
                    const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(v[g], y8), _mm256_maddubs_epi16(m32, y8));
                    /* scale 2g in the low lane, 2g + 1 in the high one */
                    const __m256i sv = _mm256_shuffle_epi8(
                        sc16, _mm256_set_m128i(_mm_set1_epi16((short)(((4 * g + 3) << 8) | (4 * g + 2))),
                                               _mm_set1_epi16((short)(((4 * g + 1) << 8) | (4 * g)))));
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(sv, p));
                }
            }
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * F16F(q->d)), _mm256_cvtepi32_ps(sumi), acc[r]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) s[r] = hsum_ps256(acc[r]);
}

GEMV_ROWS_OF

GEMV(gemv_q4_0, TSR_TYPE_Q4_0)

/* Q8_0 one row after another (each row's blocks still prefetched GEMV_PF
 * rows ahead): its blocks are cheap to compute, so what limits it is the
 * stream from memory, which reads faster in one sequence than in four rows
 * side by side. Measured (Zen 3, AVX2, 100 matrices of 1536 x 576 or 2621 x
 * 640 in sequence, best of 5): 1 thread 7.0-8.2 -> 9.7-11.8 GB/s, 2 threads
 * 12.4-13.9 -> 16.6-19.5 GB/s. The 4-bit types compute more per byte and
 * read faster 4 rows at a time (1 thread, Q4_0: 7.8 against 6.9 GB/s). */
static void gemv_q8_0(int64_t k, int64_t m, int64_t ahead, const void *vx, size_t xs, const void *vy, float *s) {
    const char *x = vx;
    const int64_t n = m + (ahead > 0 ? ahead : 0);
    ramp(x, m, xs);
    for (int64_t i = 0; i < m; i++)
        rows32(TSR_TYPE_Q8_0, 1, k, x + (size_t)i * xs, xs, pf_offset(i, 1, n, xs), vy, s + i);
}
GEMV(gemv_q5_0, TSR_TYPE_Q5_0)
GEMV(gemv_q4_1, TSR_TYPE_Q4_1)
GEMV(gemv_q4_k, TSR_TYPE_Q4_K)
GEMV(gemv_q5_k, TSR_TYPE_Q5_K)
GEMV(gemv_q6_k, TSR_TYPE_Q6_K)

/* ---- weights in the 8-row interleaved layout (TSR_FLAG_IL8) ---------------------
 * One 8-row group after another, its blocks in order: per block the 8 rows'
 * scales in one vector and, for each 4-byte group of values, the 8 rows'
 * bytes in one 32-byte vector, multiplied by the activations' 4 bytes
 * broadcast. Each row's blocks are summed in one float lane, the integer
 * sum of a block exact, so a row's result does not depend on m or on its
 * place; it differs from the stored layout's dot product (summed in 8
 * lanes) by rounding only. Measured (Zen 3, 100 matrices of 1536 x 576
 * Q4_0 in sequence, 2 threads, best of 10): 23.6-26.3 GB/s stored, 32-34
 * interleaved. */

/* Q4_0's and Q5_0's offsets: the sums of the activation blocks' values, once per call
 * (up to this many blocks; past that, per block and group). */
#define IL8_YSUM_MAX 512

INLINE int32_t qsum32(const int8_t *q) {
    const __m256i s = dot4(_mm256_set1_epi8(1), _mm256_loadu_si256((const __m256i *)q));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    return _mm_cvtsi128_si32(t);
}

INLINE __m256i bcast32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* The 8 rows' sums of nibbles x values of a block (Q4_0, Q4_1): vector c
 * holds values 4c.. in its low nibbles, 16+4c.. in its high ones; the
 * 16-bit sums of all 8 products stay below 8 * 2 * 15 * 127. */
INLINE __m256i il8_nib(const uint8_t *q, const int8_t *a) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i h = _mm256_setzero_si256();
    UNROLL for (int c = 0; c < 4; c++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
        const __m256i p = _mm256_add_epi16(
            _mm256_maddubs_epi16(_mm256_and_si256(raw, m4), bcast32(a + 4 * c)),
            _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), bcast32(a + 16 + 4 * c)));
        h = c ? _mm256_add_epi16(h, p) : p;
    }
    return _mm256_madd_epi16(h, _mm256_set1_epi16(1));
}

/* The 8 rows' sums of 5-bit values x activations of a Q5_0 block: two
 * 16-bit sums of 4 products pairs each (below 4 * 2 * 31 * 127). */
INLINE __m256i il8_q5(const uint8_t *q, __m256i qh, const int8_t *a) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i h0 = _mm256_setzero_si256(), h1 = h0;
    UNROLL for (int c = 0; c < 4; c++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(raw, m4), il8_q5_bits(qh, c, false));
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), il8_q5_bits(qh, c, true));
        const __m256i p0 = _mm256_maddubs_epi16(lo, bcast32(a + 4 * c)),
                      p1 = _mm256_maddubs_epi16(hi, bcast32(a + 16 + 4 * c));
        h0 = c ? _mm256_add_epi16(h0, p0) : p0;
        h1 = c ? _mm256_add_epi16(h1, p1) : p1;
    }
    return _mm256_add_epi32(_mm256_madd_epi16(h0, _mm256_set1_epi16(1)), _mm256_madd_epi16(h1, _mm256_set1_epi16(1)));
}

/* Q8_0: signed x signed by the sign trick, each vector widened to 32 bits. */
INLINE __m256i il8_s8(const int8_t *q, const int8_t *a) {
    __m256i is = _mm256_setzero_si256();
    UNROLL for (int c = 0; c < 8; c++) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
        const __m256i p = dot4(_mm256_sign_epi8(x, x), _mm256_sign_epi8(bcast32(a + 4 * c), x));
        is = c ? _mm256_add_epi32(is, p) : p;
    }
    return is;
}

INLINE void il8_rows(tsr_type t, int64_t k, int64_t m, int64_t ahead, const char *x, size_t xs, const void *vy,
                     float *s) {
    const int64_t nb = k / 32;
    const size_t bs8 = 8 * (size_t)blk_bytes(t), pfd = (size_t)GEMV_PF * xs;
    const char *end = x + (size_t)(m + (ahead > 0 ? ahead : 0)) * xs;
    int32_t ysum[IL8_YSUM_MAX];
    const bool pre = (t == TSR_TYPE_Q4_0 || t == TSR_TYPE_Q5_0) && nb <= IL8_YSUM_MAX;
    for (int64_t b = 0; pre && b < nb; b++) ysum[b] = qsum32(((const tsr_block_q8_0 *)vy)[b].qs);
    for (int64_t g = 0; g < m / 8; g++) {
        const char *w = x + (size_t)g * 8 * xs;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const char *blk = w + (size_t)b * bs8, *pf = blk + pfd;
            for (size_t o = 0; o < bs8 && pf + o < end; o += 64) _mm_prefetch(pf + o, _MM_HINT_T1);
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
            if (t == TSR_TYPE_Q4_1) {
                const tsr_block_q8_1 *y = (const tsr_block_q8_1 *)vy + b;
                const __m256i is = il8_nib((const uint8_t *)blk + 32, y->qs);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(d, bcast_f16(&y->d)), acc);
                acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16))), bcast_f16(&y->s),
                                      acc);
                continue;
            }
            const tsr_block_q8_0 *y = (const tsr_block_q8_0 *)vy + b;
            __m256i is;
            if (t == TSR_TYPE_Q8_0) {
                is = il8_s8((const int8_t *)blk + 16, y->qs);
            } else if (t == TSR_TYPE_Q5_0) { /* values q - 16 */
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
                is = il8_q5((const uint8_t *)blk + 48, qh, y->qs);
                is = _mm256_sub_epi32(is, _mm256_set1_epi32(16 * (pre ? ysum[b] : qsum32(y->qs))));
            } else { /* Q4_0: values q - 8 */
                is = il8_nib((const uint8_t *)blk + 16, y->qs);
                is = _mm256_sub_epi32(is, _mm256_set1_epi32(8 * (pre ? ysum[b] : qsum32(y->qs))));
            }
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(d, bcast_f16(&y->d)), acc);
        }
        _mm256_storeu_ps(s + 8 * g, acc);
    }
}

/* Q4_K (x Q8_K) interleaved, a super-block of 256 per step: per pair of
 * sub-blocks, 8 vectors of nibbles summed in 16 bits (below 8 * 2 * 15 *
 * 127) and multiplied by each row's 6-bit scale (an in-lane shuffle puts
 * it in both halves of the row's dword); the minimums against the
 * activations' sums of 32 (two 16-bit products per dword). */
/* The pshufb mask taking byte b of each dword into both of its 16-bit halves (zero-extended). */
INLINE __m256i il8_byte16(int b) {
    const __m256i base = _mm256_setr_epi32(0, 0x00040004, 0x00080008, 0x000C000C, 0, 0x00040004, 0x00080008,
                                           0x000C000C);
    return _mm256_add_epi32(base, _mm256_set1_epi32((int)(0x80008000u | (uint32_t)b << 16 | (uint32_t)b)));
}

/* Q5_K (q5 true): the same with the fifth bits (k5_high of the qh vector
 * of the same values) and the 16-bit sums of 4 vectors at a time (below 4 *
 * 2 * 31 * 127). */
INLINE void il8_q4k_rows(bool q5, int64_t k, int64_t m, int64_t ahead, const char *x, size_t xs, const void *vy,
                         float *s) {
    const int64_t nsb = k / 256;
    const size_t bs8 = 8 * (q5 ? sizeof(tsr_block_q5_K) : sizeof(tsr_block_q4_K)), pfd = (size_t)GEMV_PF * xs;
    const size_t qs0 = q5 ? 384 : 128; /* the value vectors (Q5_K: after the 8 qh vectors at 128) */
    const char *end = x + (size_t)(m + (ahead > 0 ? ahead : 0)) * xs;
    const __m256i m4 = _mm256_set1_epi8(0x0F), lo16 = _mm256_set1_epi32(0x00FF00FF);
    for (int64_t g = 0; g < m / 8; g++) {
        const char *w = x + (size_t)g * 8 * xs;
        __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
        for (int64_t sb = 0; sb < nsb; sb++) {
            const char *blk = w + (size_t)sb * bs8, *pf = blk + pfd;
            for (size_t o = 0; o < bs8 && pf + o < end; o += 64) _mm_prefetch(pf + o, _MM_HINT_T1);
            const tsr_block_q8_K *y = (const tsr_block_q8_K *)vy + sb;
            __m256i sc[2], mn[2];
            il8_q4k_scales(blk + 32, sc, mn);
            /* the minimums: sum over sub-blocks j of mn[j] * (bsums[2j] + bsums[2j+1]) */
            int16_t ys[8];
            for (int j = 0; j < 8; j++) ys[j] = (int16_t)(y->bsums[2 * j] + y->bsums[2 * j + 1]);
            __m256i ms = _mm256_setzero_si256();
            UNROLL for (int h = 0; h < 2; h++) {
                const __m256i ye = _mm256_set1_epi32(
                                  (int)(((uint32_t)(uint16_t)ys[4 * h + 2] << 16) | (uint16_t)ys[4 * h])),
                              yo = _mm256_set1_epi32(
                                  (int)(((uint32_t)(uint16_t)ys[4 * h + 3] << 16) | (uint16_t)ys[4 * h + 1]));
                ms = _mm256_add_epi32(ms, _mm256_madd_epi16(_mm256_and_si256(mn[h], lo16), ye));
                ms = _mm256_add_epi32(ms, _mm256_madd_epi16(_mm256_srli_epi16(mn[h], 8), yo));
            }
            __m256i isum = _mm256_setzero_si256();
            UNROLL for (int j = 0; j < 4; j++) {
                __m256i hl[2], hh[2];
                const int8_t *a = y->qs + 64 * j;
                UNROLL for (int c = 0; c < 8; c++) {
                    const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + qs0 + 32 * (8 * j + c)));
                    __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                    if (q5) {
                        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * c));
                        lo = _mm256_or_si256(lo, k5_high(qh, 2 * j)), hi = _mm256_or_si256(hi, k5_high(qh, 2 * j + 1));
                    }
                    const __m256i pl = _mm256_maddubs_epi16(lo, bcast32(a + 4 * c));
                    const __m256i ph = _mm256_maddubs_epi16(hi, bcast32(a + 32 + 4 * c));
                    const int h = q5 ? c / 4 : 0, first = q5 ? c % 4 == 0 : c == 0;
                    hl[h] = first ? pl : _mm256_add_epi16(hl[h], pl);
                    hh[h] = first ? ph : _mm256_add_epi16(hh[h], ph);
                }
                /* sub-blocks 2j and 2j+1: bytes (2j) % 4 and (2j+1) % 4 of sc[j / 2], as 16 bits twice */
                const __m256i s0 = _mm256_shuffle_epi8(sc[j / 2], il8_byte16(2 * j % 4)),
                              s1 = _mm256_shuffle_epi8(sc[j / 2], il8_byte16(2 * j % 4 + 1));
                isum = _mm256_add_epi32(isum,
                                        _mm256_add_epi32(_mm256_madd_epi16(hl[0], s0), _mm256_madd_epi16(hh[0], s1)));
                if (q5)
                    isum = _mm256_add_epi32(
                        isum, _mm256_add_epi32(_mm256_madd_epi16(hl[1], s0), _mm256_madd_epi16(hh[1], s1)));
            }
            const __m256 yd = _mm256_set1_ps(y->d);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum),
                                  _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk)), yd), acc);
            accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms),
                                   _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16))), yd),
                                   accm);
        }
        _mm256_storeu_ps(s + 8 * g, _mm256_sub_ps(acc, accm));
    }
}

static void gemv_il8_q4_k(int64_t k, int64_t m, int64_t ahead, const void *vx, size_t xs, const void *vy, float *s) {
    il8_q4k_rows(false, k, m, ahead, vx, xs, vy, s);
}

static void gemv_il8_q5_k(int64_t k, int64_t m, int64_t ahead, const void *vx, size_t xs, const void *vy, float *s) {
    il8_q4k_rows(true, k, m, ahead, vx, xs, vy, s);
}

#define GEMV_IL8(name, T)                                                                                        \
    static void name(int64_t k, int64_t m, int64_t ahead, const void *vx, size_t xs, const void *vy, float *s) { \
        il8_rows(T, k, m, ahead, vx, xs, vy, s);                                                                 \
    }
GEMV_IL8(gemv_il8_q4_0, TSR_TYPE_Q4_0)
GEMV_IL8(gemv_il8_q4_1, TSR_TYPE_Q4_1)
GEMV_IL8(gemv_il8_q8_0, TSR_TYPE_Q8_0)
GEMV_IL8(gemv_il8_q5_0, TSR_TYPE_Q5_0)

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

void tsr__cpu_avx2_gemv(tsr_cpu_kernels *k) {
    k->gemv[TSR_TYPE_F16] = gemv_f16;
    /* Q8_0: one row at a time with every block prefetched into L2 reads
     * faster than the dot's hardware prefetch alone (Zen 3, 1 thread:
     * 9.7-11.8 against 8.9-9.1 GB/s) and than 4 rows side by side (above). */
    k->gemv[TSR_TYPE_Q8_0] = gemv_q8_0;
    k->gemv[TSR_TYPE_Q4_0] = gemv_q4_0;
    k->gemv[TSR_TYPE_Q5_0] = gemv_q5_0;
    k->gemv[TSR_TYPE_Q4_1] = gemv_q4_1;
    k->gemv[TSR_TYPE_Q4_K] = gemv_q4_k;
    k->gemv[TSR_TYPE_Q5_K] = gemv_q5_k;
    k->gemv[TSR_TYPE_Q6_K] = gemv_q6_k;
    k->gemv_il8[TSR_TYPE_Q4_0] = gemv_il8_q4_0;
    k->gemv_il8[TSR_TYPE_Q4_1] = gemv_il8_q4_1;
    k->gemv_il8[TSR_TYPE_Q8_0] = gemv_il8_q8_0;
    k->gemv_il8[TSR_TYPE_Q5_0] = gemv_il8_q5_0;
    k->gemv_il8[TSR_TYPE_Q4_K] = gemv_il8_q4_k;
    k->gemv_il8[TSR_TYPE_Q5_K] = gemv_il8_q5_k;
}
