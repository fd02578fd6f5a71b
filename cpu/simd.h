/*
 * simd.h - small x86 helpers shared by the SIMD kernel files; included only
 * by files compiled with at least -mavx2 -mfma -mf16c.
 */
#ifndef TSR_CPU_SIMD_H
#define TSR_CPU_SIMD_H

#include <immintrin.h>
#include <string.h>

/* tsr__cpu_q8s_finish (cpu.h) with F16C's conversions (round to nearest
 * even: the same bits). */
static inline void q8s_finish_f16c(tsr_cpu_q8s *y, float d, int32_t sum, int32_t lo) {
    const float ds = d * (float)sum;
    const __m128i h = _mm_cvtps_ph(_mm_setr_ps(d, ds, 0.0f, 0.0f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128 r = _mm_cvtph_ps(h);
    y->d = _mm_cvtss_f32(r);
    /* past F16's range (a block summing past 65504): the float */
    y->ds = (_mm_extract_epi16(h, 1) & 0x7C00) != 0x7C00 ? _mm_cvtss_f32(_mm_movehdup_ps(r)) : ds;
    y->c = -128 * sum;
    y->c_lo = -128 * lo;
}

/* tsr__fp32_to_fp16 with F16C (round to nearest even, NaNs quieted: the
 * same bits), inline: a call per block cost more than the block's work. */
static inline uint16_t fp16_f16c(float f) {
    return (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 0);
}

static inline float hsum_ps256(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* 32 nibbles of a 16-byte block: low nibbles -> bytes 0..15, high -> 16..31. */
static inline __m256i nibbles32(const uint8_t *qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    const __m256i b = _mm256_insertf128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
}

/* Byte k = 0xFF where bit k of the 32-bit word is set: byte k holds word
 * byte k / 8, selected by 1 << (k % 8). One constant beside the shuffle's
 * (an OR with the other bits and a compare with -1 takes two): in
 * avx2/gemv.c's four-row Q5_0 pass the second one spilled an accumulator. */
static inline __m256i bits_to_bytes32(const uint8_t *p) {
    uint32_t x;
    memcpy(&x, p, 4);
    const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202,
                                            0x0303030303030303);
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    return _mm256_cmpeq_epi8(_mm256_and_si256(b, sel), sel);
}

/* Sum of products of unsigned bytes u (0..127) and signed bytes s as 8 i32. */
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* Sum of products of two signed byte vectors as 8 i32. */
static inline __m256i dot_s8s8(__m256i x, __m256i y) {
    return dot_u8s8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

static inline __m256 load_fp16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* Stores the first m (<= 8) lanes of v at y (plain stores: VMASKMOVPS
 * stores are microcoded on AMD cores). */
static inline void store_part(float *y, __m256 v, int64_t m) {
    if (m == 8) {
        _mm256_storeu_ps(y, v);
        return;
    }
    float t[8];
    _mm256_storeu_ps(t, v);
    memcpy(y, t, (size_t)m * sizeof(float));
}

/* GCC -O2 keeps a short loop over an array of vectors as a loop, the array
 * on the stack (a store and a load per element); unrolled, it stays in
 * registers. */
#define UNROLL_ALL _Pragma("GCC unroll 8")

/* v[g] = dword g of each of the 8 rows r[0..7] (an 8 x 8 transpose of dwords). */
static inline void transpose8_epi32(const __m256i r[8], __m256i *out) {
    __m256i t[8], u[8];
    UNROLL_ALL for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* t0: r0r1 dwords 0,1 | 4,5; t1: 2,3 | 6,7; t2/t3: r2r3 ... */
    UNROLL_ALL for (int i = 0; i < 2; i++) UNROLL_ALL for (int h = 0; h < 2; h++) {
        u[4 * i + 2 * h] = _mm256_unpacklo_epi64(t[4 * i + h], t[4 * i + 2 + h]);
        u[4 * i + 2 * h + 1] = _mm256_unpackhi_epi64(t[4 * i + h], t[4 * i + 2 + h]);
    }
    /* u0: rows 0-3 dword 0 | dword 4; u1: dword 1 | 5; u2: 2 | 6; u3: 3 | 7; u4..7: rows 4-7 */
    UNROLL_ALL for (int g = 0; g < 4; g++) {
        out[g] = _mm256_permute2x128_si256(u[g], u[4 + g], 0x20);
        out[4 + g] = _mm256_permute2x128_si256(u[g], u[4 + g], 0x31);
    }
}

/* Q5_0's fifth bits for vector c of a block in the 8-row interleaved
 * layout (cpu/repack.c): from the 8 rows' qh words (a dword
 * each), bits 4c..4c+3 (hi: 16+4c..) as 0x10 in bytes 0..3 of each row's
 * dword: the byte that holds them copied to all four, then one bit tested
 * per byte. */
static inline __m256i il8_q5_bits(__m256i qh, int c, bool hi) {
    const int byte = (hi ? 2 : 0) + c / 2;
    const __m256i shuf = _mm256_add_epi8(
        _mm256_set1_epi32(byte * 0x01010101),
        _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404, 0x08080808, 0x0C0C0C0C));
    const __m256i sel = _mm256_set1_epi32(c % 2 ? (int)0x80402010 : 0x08040201);
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(qh, shuf), sel);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, sel), _mm256_set1_epi8(0x10));
}

/* Q5_K's fifth bits of sub-block j (bit j of each qh byte) as 0x10 in each
 * byte: 16-bit shifts carry no other byte's bit to bit 4. */
static inline __m256i k5_high(__m256i qh, int j) {
    const __m256i t = j <= 4 ? _mm256_slli_epi16(qh, 4 - j) : _mm256_srli_epi16(qh, j - 4);
    return _mm256_and_si256(t, _mm256_set1_epi8(0x10));
}

/* Q4_K's packed 6-bit scales and minimums of 8 rows in the interleaved
 * layout (the 3 vectors of their 12 bytes, a row per dword) -> bytes 0..3
 * of each row's dword: sc[0] scales 0..3, sc[1] scales 4..7, mn[0] minimums
 * 0..3, mn[1] minimums 4..7 (avx2/gemv.c's q4k_scales, 8 rows at once). */
static inline void il8_q4k_scales(const char *p, __m256i sc[2], __m256i mn[2]) {
    const __m256i u0 = _mm256_loadu_si256((const __m256i *)p), u1 = _mm256_loadu_si256((const __m256i *)(p + 32)),
                  u2 = _mm256_loadu_si256((const __m256i *)(p + 64));
    const __m256i m6 = _mm256_set1_epi32(0x3f3f3f3f), m4 = _mm256_set1_epi32(0x0f0f0f0f),
                  m2 = _mm256_set1_epi32(0x03030303);
    sc[0] = _mm256_and_si256(u0, m6);
    sc[1] = _mm256_or_si256(_mm256_and_si256(u2, m4),
                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), m2), 4));
    mn[0] = _mm256_and_si256(u1, m6);
    mn[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), m4),
                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), m2), 4));
}

/* The matrix-vector products (avx2/gemv.c, avx512/gemv.c) read several
 * rows side by side, which the hardware prefetchers do not follow: software
 * prefetch GEMV_PF rows ahead. */
#ifndef GEMV_PF /* (overridable for benchmarks) */
#define GEMV_PF 24
#endif
/* The gemms' packs of rows stored plainly read their rows' blocks side by
 * side, more streams than the hardware prefetchers follow: each row's block
 * PACK_PF blocks ahead is requested (AVX-512 VNNI, Zen 4, 2 threads,
 * batch-invariant pp8, alternated against no prefetch: 1B-class Q8_0 91-96
 * -> 120 t/s, SmolLM2 Q4_K_M 979 -> 1036; 4 and 16 blocks gave less, pp512
 * the same; into L2 rather than L1, +2%; AVX2 kernels, compute-bound there:
 * +1-4%). AVX-512's few-column kernels of the interleaved layout (il8_direct)
 * request their two groups' blocks PACK_PF ahead into L2 the same way
 * (1B-class Q4_0 pp8 190 -> 216, Q4_K_M 163-169 -> 180, SmolLM2 Q4_K_M
 * 738-820 -> 855-1008; into L1 the 1B gained more and SmolLM2 lost 4-8%). */
#ifndef PACK_PF /* (overridable for benchmarks) */
#define PACK_PF 8
#endif
/* The first GEMV_PF rows of a call into L2 (the rows then prefetch GEMV_PF rows ahead). */
static inline void ramp(const char *x, int64_t m, size_t xs) {
    const size_t n = (size_t)(m < GEMV_PF ? m : GEMV_PF) * xs;
    for (size_t o = 0; o < n; o += 64) _mm_prefetch(x + o, _MM_HINT_T1);
}

/* The prefetch distance: GEMV_PF rows ahead, within the n rows that may be read. */
static inline size_t pf_offset(int64_t i, int R, int64_t n, size_t xs) {
    const int64_t ahead = n - i - R < GEMV_PF ? n - i - R : GEMV_PF;
    return ahead > 0 ? (size_t)ahead * xs : 0;
}

/* The kernel table's gemv of weight type T from the file's row kernels
 * rows_q4k, rows_q6k and rows32(T, R, k, x, xs, pfo, y, s) (R rows, pfo
 * the prefetch offset): R rows at a time (GEMV_R: 8, or 4), then 2, 1. The
 * rows after the call's m, `ahead` of them, are the caller's next: they
 * are prefetched as the call's own. */
#define GEMV_ROWS_OF                                                                                                   \
    INLINE void rows_of(tsr_type t, int R, int64_t k, const char *x, size_t xs, size_t pfo, const void *y, float *s) { \
        if (t == TSR_TYPE_Q4_K)                                                                                        \
            rows_q4k(R, k, x, xs, pfo, y, s);                                                                          \
        else if (t == TSR_TYPE_Q5_K)                                                                                   \
            rows_q5k(R, k, x, xs, pfo, y, s);                                                                          \
        else if (t == TSR_TYPE_Q6_K)                                                                                   \
            rows_q6k(R, k, x, xs, pfo, y, s);                                                                          \
        else                                                                                                           \
            rows32(t, R, k, x, xs, pfo, y, s);                                                                         \
    }
#define GEMV(name, T)                                                                                            \
    static void name(int64_t k, int64_t m, int64_t ahead, const void *vx, size_t xs, const void *vy, float *s) { \
        const char *x = vx;                                                                                      \
        const int64_t n = m + (ahead > 0 ? ahead : 0);                                                           \
        ramp(x, m, xs);                                                                                          \
        int64_t i = 0;                                                                                           \
        for (; GEMV_R == 8 && i + 8 <= m; i += 8)                                                                \
            rows_of(T, 8, k, x + (size_t)i * xs, xs, pf_offset(i, 8, n, xs), vy, s + i);                         \
        for (; i + 4 <= m; i += 4) rows_of(T, 4, k, x + (size_t)i * xs, xs, pf_offset(i, 4, n, xs), vy, s + i);  \
        if (i + 2 <= m)                                                                                          \
            rows_of(T, 2, k, x + (size_t)i * xs, xs, pf_offset(i, 2, n, xs), vy, s + i), i += 2;                 \
        if (i < m)                                                                                               \
            rows_of(T, 1, k, x + (size_t)i * xs, xs, 0, vy, s + i);                                              \
    }

/* Lanes 0..3 of p[r] summed into lane r of *lo, lanes 4..7 into lane r of *hi. */
static inline __attribute__((always_inline)) void hsum8x8_halves(const __m256i *p, __m256i *lo, __m256i *hi) {
    const __m256i u0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i u1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    *lo = _mm256_permute2x128_si256(u0, u1, 0x20);
    *hi = _mm256_permute2x128_si256(u0, u1, 0x31);
}

/* Lane r: the sum of p[r]'s 8 lanes. */
static inline __attribute__((always_inline)) __m256i hsum8x8(const __m256i *p) {
    __m256i lo, hi;
    hsum8x8_halves(p, &lo, &hi);
    return _mm256_add_epi32(lo, hi);
}

/* The 16 scales of 8 Q6_K super-blocks (a[r]: row r's) side by side:
 * sc[j] holds scale 2j of the 8 rows in its low 8 bytes, 2j + 1 in its high. */
static inline __attribute__((always_inline)) void q6k_scales8(const __m128i a[8], __m128i sc[8]) {
    __m128i b8[8], c8[8];
    for (int r = 0; r < 8; r += 2) {
        b8[r] = _mm_unpacklo_epi8(a[r], a[r + 1]);
        b8[r + 1] = _mm_unpackhi_epi8(a[r], a[r + 1]);
    }
    for (int h = 0; h < 2; h++) { /* rows 4h .. 4h + 3 */
        const __m128i *bb = b8 + 4 * h;
        c8[4 * h + 0] = _mm_unpacklo_epi16(bb[0], bb[2]);
        c8[4 * h + 1] = _mm_unpackhi_epi16(bb[0], bb[2]);
        c8[4 * h + 2] = _mm_unpacklo_epi16(bb[1], bb[3]);
        c8[4 * h + 3] = _mm_unpackhi_epi16(bb[1], bb[3]);
    }
    for (int c = 0; c < 4; c++) {
        sc[2 * c] = _mm_unpacklo_epi32(c8[c], c8[4 + c]);
        sc[2 * c + 1] = _mm_unpackhi_epi32(c8[c], c8[4 + c]);
    }
}

/* Lane mask for the first n (0..8) of 8 floats (rows and the attention's gemms). */
static inline __m256i lanes8(int64_t n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 8 ? n : 8)), idx);
}

#ifdef __AVX512F__
/* The same for 16 floats (n >= 0). */
static inline __mmask16 lanes16(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

static inline float hsum512(__m512 v) { return _mm512_reduce_add_ps(v); }

static inline __m512 load_fp16x16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* F16 x F16 over n values, summed like ggml's ggml_vec_dot_f16 (four
 * accumulators over chunks of 64; the tail masked, i.e. zero-padded to 64):
 * the AVX-512 dot_f16_f16 and, row by row, the F16 gemv. */
static inline __attribute__((always_inline)) float dot_f16_512(int64_t n, const uint16_t *x, const uint16_t *y) {
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) /* whole chunks: plain loads */
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++)
            a[q] = _mm512_fmadd_ps(load_fp16x16(x + i + 16 * q), load_fp16x16(y + i + 16 * q), a[q]);
    for (; i < n; i += 64) { /* the masked tail */
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
            const int64_t o = i + 16 * q, left = n - o;
            const __mmask16 m = left > 0 ? lanes16(left) : 0;
            const __m512 xv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + (left > 0 ? o : 0)));
            const __m512 yv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, y + (left > 0 ? o : 0)));
            a[q] = _mm512_fmadd_ps(xv, yv, a[q]);
        }
    }
    a[0] = _mm512_add_ps(a[0], a[2]);
    a[1] = _mm512_add_ps(a[1], a[3]);
    return hsum512(_mm512_add_ps(a[0], a[1]));
}
#endif

#endif /* TSR_CPU_SIMD_H */
