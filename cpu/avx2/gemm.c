/*
 * avx2/gemm.c - the batched matmul of the quantized types with AVX2 (no
 * AVX-512, no VNNI: Zen 3 and older): 8 weight rows interleaved x up to 6
 * activation columns per pass, the AVX2 form of avx512/gemm.c.
 *
 * A gemm call repacks its weight rows, 8 at a time, into scratch: per block
 * of 32 values, 8 vectors of 32 bytes, vector g holding values 4g..4g+3 of
 * each of the 8 rows as UNSIGNED bytes u, and per row a float scale d and a
 * float m. VPMADDUBSW of such a vector with a column's 4 activation bytes
 * (broadcast) gives per row two 16-bit sums of two products each; those are
 * summed in 16 bits over as many groups as cannot overflow, then VPMADDWD
 * (with a constant multiplier) widens them to 32 bits. VPMADDUBSW saturates
 * at 32767, so the unsigned values must stay small: 2 * u * 127 per
 * instruction, and the 16-bit sums of several, must fit (activations are
 * tsr_cpu_q8s rows, |qy| <= 127):
 *  - 4-bit u (Q4_0, Q4_1, Q4_K): all 8 groups summed in 16 bits
 *    (16 * 15 * 127 = 30480);
 *  - 5-bit u (Q5_0, Q5_1, Q5_K): two sums of 4 groups;
 *  - Q6_K's 6-bit u (0..63): four sums of 2 groups, two per 16-value half
 *    (the halves have their own scales d and m);
 *  - Q8_0's signed values: the sign trick (|x| against qy with x's sign),
 *    widened after each group.
 * Signed values with a zero point (Q4_0 u = x + 8, Q5_0 u = x + 16, Q6_K
 * u = x + 32) take it back out exactly in integers: the widening multiplier
 * is 128 / zero point (16, 8, 4), which makes the column's c = -128 * sum(qy)
 * (tsr_cpu_q8s) the correction, and the stored scale is d divided by the
 * multiplier (a power of two: exact); then acc += d * dy * isum. Values with
 * a float minimum, d * q + m (Q4_1, Q5_1, Q4_K, Q5_K with each sub-block's
 * scale and minimum), add m * dy * sum(qy) (tsr_cpu_q8s.ds).
 * Per output the blocks are summed in order, the same instructions whatever
 * the number of rows and columns of the call, so that a result does not
 * depend on its place in the tile (test-cpu-kernels checks it bit for bit).
 */
#include "../cpu.h"
#include "../simd.h"
#include "../unpack.h"

#include <immintrin.h>
#include <string.h>

/* Loops over rows, groups and columns unrolled, so that vectors and accumulators live in registers. */
#define UNROLL _Pragma("GCC unroll 8")

typedef struct il8 {
    uint8_t u[256]; /* [group g][row r][4 bytes] */
    float d[8];     /* scale / multiplier (Q6_K: of values 0..15) */
    float m[8];     /* minimum (Q6_K: the scale of values 16..31) */
} il8;

typedef struct il8s { /* Q8_0 */
    uint8_t u[256];   /* |x|, as il8 */
    int8_t x[256];    /* x (its sign) */
    float d[8];
} il8s;
_Static_assert(sizeof(il8) <= 640 && sizeof(il8s) <= 640, "TSR_CPU_GEMM_SCRATCH");

typedef enum { IL_U4, IL_U5, IL_Q6, IL_S8 } il_mode;

/* Block b (32 values) of a row: its bytes as stored, its d and m; the
 * zero points of Q4_0, Q5_0 and Q6_K come out through the widening
 * multiplier (16, 8, 4), so their scales are divided by it. */
static inline __attribute__((always_inline)) __m256i il_row(tsr_type t, const char *row, int64_t b, float *d,
                                                            float *m) {
    const __m256i v = tsr__blk32_bytes(t, row, b, d, m);
    if (t == TSR_TYPE_Q4_0)
        *d *= 1.0f / 16;
    else if (t == TSR_TYPE_Q5_0)
        *d *= 1.0f / 8;
    else if (t == TSR_TYPE_Q6_K)
        *d *= 0.25f, *m *= 0.25f;
    return v;
}

/* Blocks [b0, b1) of rows [0, rows) of x (rows <= 8; the others zero) ->
 * b1 - b0 interleaved blocks. */
static inline __attribute__((always_inline)) void il8_pack(tsr_type t, const char *x, size_t xs, int rows, int64_t b0,
                                                           int64_t b1, bool pf, void *out) {
    il8 *o = out;
    il8s *os = out;
    const size_t per = pf && b1 > 0 ? xs / (size_t)b1 : 0; /* a block's bytes (pf: whole rows, b1 = nb) */
    for (int64_t b = b0; b < b1; b++) {
        if (pf && b + PACK_PF < b1) /* simd.h */
            for (int i = 0; i < rows; i++) _mm_prefetch(x + (size_t)i * xs + (size_t)(b + PACK_PF) * per, _MM_HINT_T0);
        __m256i r[8], v[8];
        float d[8], m[8];
        UNROLL for (int i = 0; i < 8; i++) {
            if (i < rows) {
                r[i] = il_row(t, x + (size_t)i * xs, b, &d[i], &m[i]);
            } else {
                r[i] = _mm256_setzero_si256();
                d[i] = m[i] = 0.0f;
            }
        }
        if (t == TSR_TYPE_Q8_0) {
            transpose8_epi32(r, v);
            UNROLL for (int g = 0; g < 8; g++) _mm256_storeu_si256((__m256i *)(os[b - b0].x + 32 * g), v[g]);
            UNROLL for (int i = 0; i < 8; i++) r[i] = _mm256_sign_epi8(r[i], r[i]);
            transpose8_epi32(r, v);
            UNROLL for (int g = 0; g < 8; g++) _mm256_storeu_si256((__m256i *)(os[b - b0].u + 32 * g), v[g]);
            memcpy(os[b - b0].d, d, sizeof d);
        } else {
            transpose8_epi32(r, v);
            UNROLL for (int g = 0; g < 8; g++) _mm256_storeu_si256((__m256i *)(o[b - b0].u + 32 * g), v[g]);
            memcpy(o[b - b0].d, d, sizeof d);
            memcpy(o[b - b0].m, m, sizeof m);
        }
    }
}

/* An 8-row group of weights in the interleaved layout (TSR_FLAG_IL8,
 * cpu/repack.c) -> the blocks il8_pack makes of the same rows
 * stored plainly, byte for byte: the interleaved vectors already hold each
 * row's 4-byte groups side by side, so no transpose. */
static inline __attribute__((always_inline)) void il8_pack_il8(tsr_type t, const char *x, int64_t b0, int64_t b1,
                                                               void *out) {
    il8 *o = out; /* blocks [b0, b1) (K-quants: whole super-blocks) */
    il8s *os = out;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const size_t bs8 = 8 * (t == TSR_TYPE_Q8_0   ? sizeof(tsr_block_q8_0)
                            : t == TSR_TYPE_Q4_1 ? sizeof(tsr_block_q4_1)
                            : t == TSR_TYPE_Q5_0 ? sizeof(tsr_block_q5_0)
                                                 : sizeof(tsr_block_q4_0));
    if (t == TSR_TYPE_Q4_K ||
        t == TSR_TYPE_Q5_K) { /* super-blocks of 8 sub-blocks: il_row's d = dd * scale, m = -dmin * min */
        const bool q5 = t == TSR_TYPE_Q5_K;
        const size_t qs0 = q5 ? 384 : 128; /* the value vectors (Q5_K: after the 8 qh vectors at 128) */
        for (int64_t sbk = b0 / 8; sbk < b1 / 8; sbk++) {
            const char *blk = x + (size_t)sbk * 8 * (q5 ? sizeof(tsr_block_q5_K) : sizeof(tsr_block_q4_K));
            __m256i sc[2], mn[2];
            il8_q4k_scales(blk + 32, sc, mn);
            const __m256 dd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
            const __m256 ndmin = _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16))),
                                               _mm256_set1_ps(-0.0f));
            UNROLL for (int sb = 0; sb < 8; sb++) {
                il8 *ob = o + (sbk * 8 + sb - b0);
                const int j = sb / 2, sh = 8 * (sb % 4);
                UNROLL for (int g = 0; g < 8; g++) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)(blk + qs0 + 32 * (8 * j + g)));
                    if (sb & 1)
                        v = _mm256_srli_epi16(v, 4);
                    v = _mm256_and_si256(v, m4);
                    if (q5)
                        v = _mm256_or_si256(v, k5_high(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * g)), sb));
                    _mm256_storeu_si256((__m256i *)(ob->u + 32 * g), v);
                }
                const __m256i ff = _mm256_set1_epi32(0xFF);
                _mm256_storeu_ps(
                    ob->d,
                    _mm256_mul_ps(dd, _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(sc[sb / 4], sh), ff))));
                _mm256_storeu_ps(
                    ob->m,
                    _mm256_mul_ps(ndmin, _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(mn[sb / 4], sh), ff))));
            }
        }
        return;
    }
    for (int64_t b = b0; b < b1; b++) {
        const char *blk = x + (size_t)b * bs8;
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
        if (t == TSR_TYPE_Q8_0) {
            UNROLL for (int g = 0; g < 8; g++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * g));
                _mm256_storeu_si256((__m256i *)(os[b - b0].x + 32 * g), v);
                _mm256_storeu_si256((__m256i *)(os[b - b0].u + 32 * g), _mm256_sign_epi8(v, v));
            }
            _mm256_storeu_ps(os[b - b0].d, d);
            continue;
        }
        const char *q = blk + (t == TSR_TYPE_Q4_1 ? 32 : t == TSR_TYPE_Q5_0 ? 48 : 16);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16)); /* (Q5_0) */
        UNROLL for (int c = 0; c < 4; c++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
            __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            if (t == TSR_TYPE_Q5_0)
                lo = _mm256_or_si256(lo, il8_q5_bits(qh, c, false)), hi = _mm256_or_si256(hi, il8_q5_bits(qh, c, true));
            _mm256_storeu_si256((__m256i *)(o[b - b0].u + 32 * c), lo);
            _mm256_storeu_si256((__m256i *)(o[b - b0].u + 32 * (c + 4)), hi);
        }
        if (t == TSR_TYPE_Q4_0 || t == TSR_TYPE_Q5_0) /* as il_row: the zero point comes out through 16 or 8 */
            d = _mm256_mul_ps(d, _mm256_set1_ps(t == TSR_TYPE_Q4_0 ? 1.0f / 16 : 1.0f / 8));
        _mm256_storeu_ps(o[b - b0].d, d);
        _mm256_storeu_ps(o[b - b0].m, t == TSR_TYPE_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16)))
                                                         : _mm256_setzero_ps());
    }
}

/* Keeps v in a register as it is: the 16-bit sums are chains, one per
 * column; GCC would otherwise reassociate them into trees that need all the
 * products at once, and spill. */
#define PIN(v) __asm__("" : "+x"(v))

static inline __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Block b of 8 interleaved rows (xv: its il8 or il8s) x nc columns, added
 * into acc[c]. zp: the values have a zero point (the column's c corrects),
 * else a float minimum (mode IL_U4, IL_U5). */
static inline __attribute__((always_inline)) void il8_blk(il_mode mode, bool zp, int nc, int64_t b, const void *xv,
                                                          const tsr_cpu_q8s *const *yb, __m256 *acc) {
    const __m256i mult = _mm256_set1_epi16(mode == IL_Q6 ? 4 : mode == IL_S8 || !zp ? 1 : mode == IL_U4 ? 16 : 8);
    {
        __m256i h[6], h2[6];
        if (mode == IL_S8) {
            const il8s *w = xv;
            UNROLL
            for (int g = 0; g < 8; g++) {
                const __m256i wu = _mm256_loadu_si256((const __m256i *)(w->u + 32 * g));
                const __m256i wx = _mm256_loadu_si256((const __m256i *)(w->x + 32 * g));
                UNROLL
                for (int c = 0; c < nc; c++) {
                    const __m256i p = _mm256_madd_epi16(
                        _mm256_maddubs_epi16(wu, _mm256_sign_epi8(bcast4(yb[c][b].qs + 4 * g), wx)), mult);
                    h[c] = g ? _mm256_add_epi32(h[c], p) : p;
                    PIN(h[c]);
                }
            }
            const __m256 d = _mm256_loadu_ps(w->d);
            UNROLL
            for (int c = 0; c < nc; c++)
                acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(h[c]), d), _mm256_set1_ps(yb[c][b].d),
                                         acc[c]);
            return;
        }
        const il8 *w = xv;
        if (mode == IL_Q6) {
            __m256 t[6];
            UNROLL
            for (int half = 0; half < 2; half++) {
                UNROLL
                for (int g = 4 * half; g < 4 * half + 4; g++) {
                    const __m256i wv = _mm256_loadu_si256((const __m256i *)(w->u + 32 * g));
                    UNROLL
                    for (int c = 0; c < nc; c++) {
                        const __m256i p = _mm256_maddubs_epi16(wv, bcast4(yb[c][b].qs + 4 * g));
                        if (g % 4 == 0)
                            h[c] = p;
                        else if (g % 4 == 1)
                            h[c] = _mm256_add_epi16(h[c], p);
                        else if (g % 4 == 2)
                            h2[c] = p;
                        else
                            h2[c] = _mm256_add_epi16(h2[c], p);
                        PIN(h[c]);
                        if (g % 4 >= 2)
                            PIN(h2[c]);
                    }
                }
                const __m256 d = _mm256_loadu_ps(half ? w->m : w->d);
                UNROLL
                for (int c = 0; c < nc; c++) {
                    const int32_t corr = half ? yb[c][b].c - yb[c][b].c_lo : yb[c][b].c_lo;
                    const __m256i is = _mm256_add_epi32(
                        _mm256_add_epi32(_mm256_madd_epi16(h[c], mult), _mm256_madd_epi16(h2[c], mult)),
                        _mm256_set1_epi32(corr));
                    t[c] = half ? _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), d, t[c])
                                : _mm256_mul_ps(_mm256_cvtepi32_ps(is), d);
                }
            }
            UNROLL
            for (int c = 0; c < nc; c++) acc[c] = _mm256_fmadd_ps(t[c], _mm256_set1_ps(yb[c][b].d), acc[c]);
            return;
        }
        UNROLL
        for (int g = 0; g < 8; g++) {
            const __m256i wv = _mm256_loadu_si256((const __m256i *)(w->u + 32 * g));
            UNROLL
            for (int c = 0; c < nc; c++) {
                const __m256i p = _mm256_maddubs_epi16(wv, bcast4(yb[c][b].qs + 4 * g));
                if (mode == IL_U5 && g >= 4) {
                    h2[c] = g == 4 ? p : _mm256_add_epi16(h2[c], p);
                    PIN(h2[c]);
                } else {
                    h[c] = g == 0 ? p : _mm256_add_epi16(h[c], p);
                    PIN(h[c]);
                }
            }
        }
        const __m256 d = _mm256_loadu_ps(w->d);
        UNROLL
        for (int c = 0; c < nc; c++) {
            __m256i is = _mm256_madd_epi16(h[c], mult);
            if (mode == IL_U5)
                is = _mm256_add_epi32(is, _mm256_madd_epi16(h2[c], mult));
            if (zp)
                is = _mm256_add_epi32(is, _mm256_set1_epi32(yb[c][b].c));
            acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(is), d), _mm256_set1_ps(yb[c][b].d), acc[c]);
        }
        if (!zp) {
            const __m256 mv = _mm256_loadu_ps(w->m);
            UNROLL
            for (int c = 0; c < nc; c++) acc[c] = _mm256_fmadd_ps(mv, _mm256_set1_ps(yb[c][b].ds), acc[c]);
        }
    }
}

/* The block size of mode's interleaved blocks (il8, il8s). */
#define IL8_BYTES(mode) ((mode) == IL_S8 ? sizeof(il8s) : sizeof(il8))

/* 8 interleaved rows x nc columns over nb blocks; the first m (<= 8) rows of
 * each column stored at s + c * ss. */
static inline __attribute__((always_inline)) void il8_cols(il_mode mode, bool zp, int nc, int64_t nb, const void *xv,
                                                           const char *y, size_t ys, float *s, size_t ss, int m) {
    const tsr_cpu_q8s *yb[6];
    __m256 acc[6];
    UNROLL for (int c = 0; c < nc; c++) yb[c] = (const tsr_cpu_q8s *)(y + (size_t)c * ys), acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) il8_blk(mode, zp, nc, b, (const char *)xv + (size_t)b * IL8_BYTES(mode), yb, acc);
    UNROLL
    for (int c = 0; c < nc; c++) store_part(s + (size_t)c * ss, acc[c], m);
}

/* Columns per pass (registers: 16 ymm). Q8_0 takes 6 although they spill
 * a few registers: measured in cache (1 thread, Zen 3, 512 columns, 4
 * weight shapes, medians of 21-31 alternations), 4 -> 6 columns +3-6%,
 * 3 or 5 columns 3-4% slower than 4; Q5_0 gains nothing from 5 or 6. */
#ifndef NC_U4 /* (overridable for benchmarks) */
#define NC_U4 6
#define NC_U5 4
#define NC_Q6 3
#define NC_S8 6
#endif

#define IL8_COLS(name, mode, zp)                                                                                 \
    static void name(int nc, int64_t nb, const void *xb, const char *y, size_t ys, float *s, size_t ss, int m) { \
        switch (nc) {                                                                                            \
        case 6: il8_cols(mode, zp, 6, nb, xb, y, ys, s, ss, m); break;                                           \
        case 5: il8_cols(mode, zp, 5, nb, xb, y, ys, s, ss, m); break;                                           \
        case 4: il8_cols(mode, zp, 4, nb, xb, y, ys, s, ss, m); break;                                           \
        case 3: il8_cols(mode, zp, 3, nb, xb, y, ys, s, ss, m); break;                                           \
        case 2: il8_cols(mode, zp, 2, nb, xb, y, ys, s, ss, m); break;                                           \
        default: il8_cols(mode, zp, 1, nb, xb, y, ys, s, ss, m); break;                                          \
        }                                                                                                        \
    }
IL8_COLS(cols_u4_zp, IL_U4, true)
IL8_COLS(cols_u4_min, IL_U4, false)
IL8_COLS(cols_u5_zp, IL_U5, true)
IL8_COLS(cols_u5_min, IL_U5, false)
IL8_COLS(cols_q6, IL_Q6, true)
IL8_COLS(cols_s8, IL_S8, true)

typedef void (*il8_cols_fn)(int, int64_t, const void *, const char *, size_t, float *, size_t, int);

static inline __attribute__((always_inline)) void gemm8(tsr_type t, bool il8src, int64_t k, int64_t m, int64_t n,
                                                        const void *vx, size_t xs, const void *vy, size_t ys, float *s,
                                                        size_t ss, void *scratch) {
    const int64_t nb = k / 32;
    il8_cols_fn cols;
    int ncmax;
    switch (t) {
    case TSR_TYPE_Q8_0: cols = cols_s8, ncmax = NC_S8; break;
    case TSR_TYPE_Q4_0: cols = cols_u4_zp, ncmax = NC_U4; break;
    case TSR_TYPE_Q4_1:
    case TSR_TYPE_Q4_K: cols = cols_u4_min, ncmax = NC_U4; break;
    case TSR_TYPE_Q5_0: cols = cols_u5_zp, ncmax = NC_U5; break;
    case TSR_TYPE_Q5_1:
    case TSR_TYPE_Q5_K: cols = cols_u5_min, ncmax = NC_U5; break;
    default: cols = cols_q6, ncmax = NC_Q6; break;
    }
    for (int64_t i = 0; i < m; i += 8) {
        const int rows = m - i < 8 ? (int)(m - i) : 8;
        if (il8src) /* whole groups (m % 8 == 0) */
            il8_pack_il8(t, (const char *)vx + (size_t)i * xs, 0, nb, scratch);
        else
            il8_pack(t, (const char *)vx + (size_t)i * xs, xs, rows, 0, nb, true, scratch);
        for (int64_t j = 0; j < n; j += ncmax) {
            const int nc = n - j < ncmax ? (int)(n - j) : ncmax;
            cols(nc, nb, scratch, (const char *)vy + (size_t)j * ys, ys, s + (size_t)j * ss + (size_t)i, ss, rows);
        }
    }
}

#define GEMM8(name, T)                                                                                              \
    static void name(int64_t k, int64_t m, int64_t n, const void *x, size_t xs, const void *y, size_t ys, float *s, \
                     size_t ss, void *scratch) {                                                                    \
        gemm8(T, false, k, m, n, x, xs, y, ys, s, ss, scratch);                                                     \
    }
#define GEMM8_IL8(name, T)                                                                                          \
    static void name(int64_t k, int64_t m, int64_t n, const void *x, size_t xs, const void *y, size_t ys, float *s, \
                     size_t ss, void *scratch) {                                                                    \
        gemm8(T, true, k, m, n, x, xs, y, ys, s, ss, scratch);                                                      \
    }
GEMM8_IL8(gemm_il8_q8_0, TSR_TYPE_Q8_0)
GEMM8_IL8(gemm_il8_q4_0, TSR_TYPE_Q4_0)
GEMM8_IL8(gemm_il8_q4_1, TSR_TYPE_Q4_1)
GEMM8_IL8(gemm_il8_q5_0, TSR_TYPE_Q5_0)
GEMM8_IL8(gemm_il8_q4_k, TSR_TYPE_Q4_K)
GEMM8_IL8(gemm_il8_q5_k, TSR_TYPE_Q5_K)
GEMM8(gemm_q8_0, TSR_TYPE_Q8_0)
GEMM8(gemm_q4_0, TSR_TYPE_Q4_0)
GEMM8(gemm_q5_0, TSR_TYPE_Q5_0)
GEMM8(gemm_q4_1, TSR_TYPE_Q4_1)
GEMM8(gemm_q5_1, TSR_TYPE_Q5_1)
GEMM8(gemm_q4_k, TSR_TYPE_Q4_K)
GEMM8(gemm_q5_k, TSR_TYPE_Q5_K)
GEMM8(gemm_q6_k, TSR_TYPE_Q6_K)

/* ---- one column with the gemm's bits (gemm1, gemm1_il8: cpu.h) ---------------
 * The batch-invariant decode (tensr-server's default) computes a lone column
 * as the gemm computes any column. gemm8 packs an 8-row group's whole rows
 * into scratch (past L1 for a long row) and reads them back for the one
 * column; these kernels pack ONE_BLOCKS blocks at a time into a buffer that
 * stays in L1 and use them at once, and request the rows GEMV_PF rows ahead
 * as one linear sequence, as the gemvs do. The arithmetic is il8_blk's for
 * one column, block after block in the same order, so each result is the
 * gemm's bits (test-cpu-kernels). */
#define ONE_BLOCKS 8 /* a K-quant's super-block */

static inline __attribute__((always_inline)) void one8(tsr_type t, bool il8src, int64_t k, int64_t m, int64_t ahead,
                                                       const void *vx, size_t xs, const void *vy, float *s) {
    const int64_t nb = k / 32;
    il_mode mode = IL_Q6;
    bool zp = true;
    switch (t) {
    case TSR_TYPE_Q8_0: mode = IL_S8; break;
    case TSR_TYPE_Q4_0: mode = IL_U4; break;
    case TSR_TYPE_Q4_1:
    case TSR_TYPE_Q4_K: mode = IL_U4, zp = false; break;
    case TSR_TYPE_Q5_0: mode = IL_U5; break;
    case TSR_TYPE_Q5_1:
    case TSR_TYPE_Q5_K: mode = IL_U5, zp = false; break;
    default: break;
    }
    _Alignas(32) char buf[ONE_BLOCKS * sizeof(il8s)];
    const tsr_cpu_q8s *yb[1] = {vy};
    const char *end = (const char *)vx + (size_t)(m + (ahead > 0 ? ahead : 0)) * xs;
    const size_t group = 8 * xs; /* an 8-row group's bytes (rows xs apart) */
    for (int64_t i = 0; i < m; i += 8) {
        const int rows = m - i < 8 ? (int)(m - i) : 8;
        const char *x = (const char *)vx + (size_t)i * xs, *pf = x + (size_t)GEMV_PF * xs;
        __m256 acc[1] = {_mm256_setzero_ps()};
        for (int64_t b0 = 0; b0 < nb; b0 += ONE_BLOCKS) {
            const int64_t b1 = nb - b0 < ONE_BLOCKS ? nb : b0 + ONE_BLOCKS;
            /* this chunk's share of the group GEMV_PF rows ahead */
            for (size_t o = group * (size_t)b0 / (size_t)nb & ~(size_t)63, oe = group * (size_t)b1 / (size_t)nb;
                 o < oe && pf + o < end; o += 64)
                _mm_prefetch(pf + o, _MM_HINT_T1);
            if (il8src)
                il8_pack_il8(t, x, b0, b1, buf);
            else
                il8_pack(t, x, xs, rows, b0, b1, false, buf);
            for (int64_t b = b0; b < b1; b++)
                il8_blk(mode, zp, 1, b, buf + (size_t)(b - b0) * IL8_BYTES(mode), yb, acc);
        }
        store_part(s + i, acc[0], rows);
    }
}

#define ONE8(name, T, IL8)                                                                                     \
    static void name(int64_t k, int64_t m, int64_t ahead, const void *x, size_t xs, const void *y, float *s) { \
        one8(T, IL8, k, m, ahead, x, xs, y, s);                                                                \
    }
ONE8(one_q8_0, TSR_TYPE_Q8_0, false)
ONE8(one_q4_0, TSR_TYPE_Q4_0, false)
ONE8(one_q5_0, TSR_TYPE_Q5_0, false)
ONE8(one_q4_1, TSR_TYPE_Q4_1, false)
ONE8(one_q5_1, TSR_TYPE_Q5_1, false)
ONE8(one_q4_k, TSR_TYPE_Q4_K, false)
ONE8(one_q5_k, TSR_TYPE_Q5_K, false)

/* Q6_K as stored, one column: its pack (il_row's unpacking of 32 values and
 * an 8 x 8 transpose per block) cost more than the products (bench/gemv,
 * Zen 4, one thread, AVX2 kernels: 34% of the read bandwidth through one8).
 * Here each row's 32 values of a block go against the column as they lie,
 * and horizontal adds put the 8 rows' sums of each 16-value half side by
 * side (hsum8x8_halves); the integers are exact, so il8_blk's (4 * sum +
 * c_lo, 4 * sum + c - c_lo), and the float steps are its own in its order:
 * t = is_lo * d_lo, t = fma(is_hi, d_hi, t), acc = fma(t, dy, acc), with
 * d = dd * scale * 0.25 as il_row makes it. */
static void one_q6_k(int64_t k, int64_t m, int64_t ahead, const void *vx, size_t xs, const void *vy, float *s) {
    const int64_t nsb = k / 256;
    const tsr_cpu_q8s *y = vy;
    const char *x = vx, *end = x + (size_t)(m + (ahead > 0 ? ahead : 0)) * xs;
    const __m256i ones = _mm256_set1_epi16(1), f4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const size_t group = 8 * xs;
    for (int64_t i = 0; i < m; i += 8) {
        const int rows = m - i < 8 ? (int)(m - i) : 8;
        const tsr_block_q6_K *row[8];
        for (int r = 0; r < 8; r++) row[r] = (const tsr_block_q6_K *)(x + (size_t)(i + (r < rows ? r : rows - 1)) * xs);
        const char *pf = x + (size_t)(i + GEMV_PF) * xs;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t sb = 0; sb < nsb; sb++) {
            for (size_t o = group * (size_t)sb / (size_t)nsb & ~(size_t)63, oe = group * (size_t)(sb + 1) / (size_t)nsb;
                 o < oe && pf + o < end; o += 64)
                _mm_prefetch(pf + o, _MM_HINT_T1);
            uint16_t dh[8];
            __m128i a[8], sc[8];
            UNROLL for (int r = 0; r < 8; r++) {
                memcpy(&dh[r], &row[r][sb].d, 2);
                a[r] = _mm_loadu_si128((const __m128i *)row[r][sb].scales);
            }
            const __m256 dd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));
            q6k_scales8(a, sc);
            for (int j = 0; j < 8; j++) { /* block j: t = j % 4 of the 128-value half j / 4 */
                const int h = j / 4, t = j % 4;
                const tsr_cpu_q8s *yb = y + 8 * sb + j;
                const __m256i qy = _mm256_loadu_si256((const __m256i *)yb->qs);
                __m256i p[8];
                UNROLL for (int r = 0; r < 8; r++) {
                    __m256i lo = _mm256_loadu_si256((const __m256i *)(row[r][sb].ql + 64 * h + 32 * (t & 1)));
                    const __m256i qh = _mm256_loadu_si256((const __m256i *)(row[r][sb].qh + 32 * h));
                    if (t >= 2)
                        lo = _mm256_srli_epi16(lo, 4);
                    /* the two high bits of each value (bits 2t, 2t + 1 of qh) at bits 4, 5 */
                    const __m256i hi = t == 0   ? _mm256_slli_epi16(qh, 4)
                                       : t == 1 ? _mm256_slli_epi16(qh, 2)
                                       : t == 2 ? qh
                                                : _mm256_srli_epi16(qh, 2);
                    const __m256i u = _mm256_or_si256(_mm256_and_si256(lo, f4), _mm256_and_si256(hi, m30));
                    p[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(u, qy), ones);
                }
                __m256i slo, shi;
                hsum8x8_halves(p, &slo, &shi);
                const __m256i il = _mm256_add_epi32(_mm256_slli_epi32(slo, 2), _mm256_set1_epi32(yb->c_lo));
                const __m256i ih = _mm256_add_epi32(_mm256_slli_epi32(shi, 2), _mm256_set1_epi32(yb->c - yb->c_lo));
                const __m256 q = _mm256_set1_ps(0.25f);
                const __m256 d0 = _mm256_mul_ps(_mm256_mul_ps(dd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc[j]))), q);
                const __m256 d1 = _mm256_mul_ps(
                    _mm256_mul_ps(dd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc[j], 8)))), q);
                const __m256 tt = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ih), d1,
                                                  _mm256_mul_ps(_mm256_cvtepi32_ps(il), d0));
                acc = _mm256_fmadd_ps(tt, _mm256_set1_ps(yb->d), acc);
            }
        }
        store_part(s + i, acc, rows);
    }
}
ONE8(one_il8_q8_0, TSR_TYPE_Q8_0, true)
ONE8(one_il8_q4_0, TSR_TYPE_Q4_0, true)
ONE8(one_il8_q4_1, TSR_TYPE_Q4_1, true)
ONE8(one_il8_q5_0, TSR_TYPE_Q5_0, true)
ONE8(one_il8_q4_k, TSR_TYPE_Q4_K, true)
ONE8(one_il8_q5_k, TSR_TYPE_Q5_K, true)

/* Activations -> tsr_cpu_q8s rows: the reference's arithmetic (d = max / 127,
 * values rounded to nearest even of x * 127 / max), 32 values at a time. */
static void q8s_from_float(const float *x, void *vy, int64_t k) {
    tsr_cpu_q8s *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < k / 32; b++, x += 32) {
        __m256 v[4];
        __m256 mx = _mm256_setzero_ps();
        UNROLL for (int q = 0; q < 4; q++) {
            v[q] = _mm256_loadu_ps(x + 8 * q);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[q]));
        }
        __m128 r = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        r = _mm_max_ps(r, _mm_movehl_ps(r, r));
        r = _mm_max_ss(r, _mm_movehdup_ps(r));
        const float amax = _mm_cvtss_f32(r);
        const float d = amax / 127.0f, id = tsr__cpu_q8s_inv(d, amax);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i i32[4];
        UNROLL for (int q = 0; q < 4; q++) i32[q] = _mm256_cvtps_epi32(_mm256_mul_ps(v[q], vid));
        /* the lane sums: values 0..15 in the low half */
        const __m256i s01 = _mm256_add_epi32(i32[0], i32[1]), s23 = _mm256_add_epi32(i32[2], i32[3]);
        const __m256i p01 = _mm256_packs_epi32(i32[0], i32[1]), p23 = _mm256_packs_epi32(i32[2], i32[3]);
        const __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23),
                                                      _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)y[b].qs, p);
        /* A NaN product (a NaN or an infinite value) converts to INT_MIN,
         * packed to -128, which no finite product reaches: the reference's
         * rule for such a block (cpu.h), and its int32 lanes left unsummed. */
        if (__builtin_expect(_mm256_movemask_epi8(_mm256_cmpeq_epi8(p, _mm256_set1_epi8(-128))) != 0, 0)) {
            tsr__cpu_q8s_from_float_ref(x, &y[b], 32);
            continue;
        }
        __m128i lo = _mm_add_epi32(_mm256_castsi256_si128(s01), _mm256_extracti128_si256(s01, 1));
        __m128i hi = _mm_add_epi32(_mm256_castsi256_si128(s23), _mm256_extracti128_si256(s23, 1));
        lo = _mm_hadd_epi32(lo, hi); /* lo0 lo1 hi0 hi1 */
        lo = _mm_hadd_epi32(lo, lo); /* lo hi lo hi */
        const int32_t slo = _mm_cvtsi128_si32(lo), sum = slo + _mm_extract_epi32(lo, 1);
        q8s_finish_f16c(&y[b], d, sum, slo);
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

/* ---- fused attention blocks ------------------------------------------------- */

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

void tsr__cpu_avx2_gemm(tsr_cpu_kernels *k) {
    k->gemm[TSR_TYPE_F16] = gemm_f16;
    k->gemm_type[TSR_TYPE_F16] = TSR_TYPE_F32;
    k->gemm_f32 = gemm_f32;
    k->gemm_f32_nt = gemm_f32_nt;
    static const struct {
        tsr_type t;
        void (*fn)(int64_t, int64_t, int64_t, const void *, size_t, const void *, size_t, float *, size_t, void *);
    } g[] = {{TSR_TYPE_Q8_0, gemm_q8_0}, {TSR_TYPE_Q4_0, gemm_q4_0}, {TSR_TYPE_Q5_0, gemm_q5_0},
             {TSR_TYPE_Q4_1, gemm_q4_1}, {TSR_TYPE_Q5_1, gemm_q5_1}, {TSR_TYPE_Q4_K, gemm_q4_k},
             {TSR_TYPE_Q5_K, gemm_q5_k}, {TSR_TYPE_Q6_K, gemm_q6_k}};
    k->q8s_from_float = q8s_from_float;
    static const struct {
        tsr_type t;
        void (*fn)(int64_t, int64_t, int64_t, const void *, size_t, const void *, float *);
        void (*il8)(int64_t, int64_t, int64_t, const void *, size_t, const void *, float *);
    } one[] = {{TSR_TYPE_Q8_0, one_q8_0, one_il8_q8_0}, {TSR_TYPE_Q4_0, one_q4_0, one_il8_q4_0},
               {TSR_TYPE_Q5_0, one_q5_0, one_il8_q5_0}, {TSR_TYPE_Q4_1, one_q4_1, one_il8_q4_1},
               {TSR_TYPE_Q5_1, one_q5_1, NULL},         {TSR_TYPE_Q4_K, one_q4_k, one_il8_q4_k},
               {TSR_TYPE_Q5_K, one_q5_k, one_il8_q5_k}, {TSR_TYPE_Q6_K, one_q6_k, NULL}};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) tsr__cpu_set_q8s_gemm(k, g[i].t, g[i].fn);
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) {
        k->gemm1[one[i].t] = one[i].fn;
        k->gemm1_il8[one[i].t] = one[i].il8;
    }
    k->gemm_il8[TSR_TYPE_Q8_0] = gemm_il8_q8_0;
    k->gemm_il8[TSR_TYPE_Q4_0] = gemm_il8_q4_0;
    k->gemm_il8[TSR_TYPE_Q4_1] = gemm_il8_q4_1;
    k->gemm_il8[TSR_TYPE_Q5_0] = gemm_il8_q5_0;
    k->gemm_il8[TSR_TYPE_Q4_K] = gemm_il8_q4_k;
    k->gemm_il8[TSR_TYPE_Q5_K] = gemm_il8_q5_k;
}
