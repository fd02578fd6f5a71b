/*
 * avx512/gemm.c - the batched matmul of the quantized types with VPDPBUSD
 * (AVX-512 VNNI): 16 weight rows interleaved x up to 8 activation columns
 * per pass, or two such packs (32 rows) x up to 6 columns (il32_cols).
 *
 * A gemm call repacks its weight rows, 16 at a time, into scratch: per block
 * of 32 values, 8 vectors of 64 bytes, vector g holding values 4g..4g+3 of
 * each of the 16 rows as UNSIGNED bytes, and per row a float scale d and a
 * float m. One VPDPBUSD of such a vector with a column's 4 activation bytes
 * (broadcast from memory) adds 4 products into each row's 32-bit lane, so a
 * block costs 8 instructions per column for 16 rows; the 8 weight vectors
 * stay in registers while up to 8 columns use them.
 *
 * The bytes are unsigned because VPDPBUSD multiplies unsigned by signed:
 *  - signed values x (Q8_0, Q4_0 - 8, Q5_0 - 16, Q6_K - 32) are stored as
 *    x + 128, and the column's exact -128 * sum(qy) (the c field of tsr_cpu_q8s, cpu/cpu.h) starts
 *    the lane, which leaves sum(x * qy) exact in integers; then
 *    acc += d * dy * sum. Q6_K's two sub-blocks of 16 take two sums, their
 *    scales d and m, and the activations' c_lo and c - c_lo.
 *  - values with a float minimum, d * q + m (Q4_1, Q5_1, Q4_K, Q5_K with
 *    each sub-block's scale and minimum), are stored as q, and
 *    acc += d * dy * sum(q * qy) + m * dy * sum(qy) (tsr_cpu_q8s.ds).
 * Per output the blocks are summed in order, the same instructions whatever
 * the number of rows and columns of the call, so that a result does not
 * depend on its place in the tile (test-cpu-kernels checks it bit for bit).
 */
#include "../cpu.h"
#include "../simd.h"
#include "../unpack.h"

#include <immintrin.h>

typedef struct il16 {
    uint8_t u[512]; /* [group g][row r][4 bytes] */
    float d[16];    /* scale (Q6_K: of values 0..15) */
    float m[16];    /* minimum (Q6_K: the scale of values 16..31) */
} il16;
_Static_assert(2 * sizeof(il16) <= 1280, "TSR_CPU_GEMM_SCRATCH");

typedef enum { IL_ZP, IL_MIN, IL_Q6 } il_mode;

static il_mode il_mode_of(tsr_type t) {
    switch (t) {
    case TSR_TYPE_Q4_1:
    case TSR_TYPE_Q5_1:
    case TSR_TYPE_Q4_K:
    case TSR_TYPE_Q5_K: return IL_MIN;
    case TSR_TYPE_Q6_K: return IL_Q6;
    default: return IL_ZP;
    }
}

/* Block b (32 values) of a row: its bytes as stored (signed values + 128),
 * its d and m. */
static inline __attribute__((always_inline)) __m256i il_row(tsr_type t, const char *row, int64_t b, float *d,
                                                            float *m) {
    const __m256i v = tsr__blk32_bytes(t, row, b, d, m);
    switch (t) {
    case TSR_TYPE_Q8_0: return _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
    case TSR_TYPE_Q4_0: return _mm256_add_epi8(v, _mm256_set1_epi8(120));
    case TSR_TYPE_Q5_0: return _mm256_add_epi8(v, _mm256_set1_epi8(112));
    case TSR_TYPE_Q6_K: return _mm256_add_epi8(v, _mm256_set1_epi8(96));
    default: return v;
    }
}

/* Rows [0, rows) of x (rows <= 16; the others zero) -> nb interleaved blocks. */
static inline __attribute__((always_inline)) void il16_pack(tsr_type t, const char *x, size_t xs, int rows, int64_t nb,
                                                            il16 *out) {
    const size_t per = nb > 0 ? xs / (size_t)nb : 0; /* a block's bytes */
    for (int64_t b = 0; b < nb; b++) {
        __m256i r[16], v[8];
        if (b + PACK_PF < nb)
            for (int i = 0; i < rows; i++) _mm_prefetch(x + (size_t)i * xs + (size_t)(b + PACK_PF) * per, _MM_HINT_T1);
        for (int i = 0; i < 16; i++) {
            if (i < rows) {
                r[i] = il_row(t, x + (size_t)i * xs, b, &out[b].d[i], &out[b].m[i]);
            } else {
                r[i] = _mm256_setzero_si256();
                out[b].d[i] = out[b].m[i] = 0.0f;
            }
        }
        transpose8_epi32(r, v);
        for (int g = 0; g < 8; g++) _mm256_storeu_si256((__m256i *)(out[b].u + 64 * g), v[g]);
        transpose8_epi32(r + 8, v);
        for (int g = 0; g < 8; g++) _mm256_storeu_si256((__m256i *)(out[b].u + 64 * g + 32), v[g]);
    }
}

/* The same packs from weights in the 8-row interleaved layout (repack.c):
 * rows [0, rows) (rows 8 or 16: one or two whole groups) of the groups at
 * x, xs bytes per row (Q4_0, Q4_1, Q5_0, Q4_K, Q5_K). The layout already holds each 4-byte group of a
 * block's values of 8 rows side by side, so a pack vector is two of its
 * vectors put together (no transpose); the scales and minimums are the
 * same floats il_row gives, so a gemm over interleaved rows gives the bits
 * of one over the same rows stored plainly (test-cpu-kernels checks it). */
static inline __attribute__((always_inline)) __m512i il8_pair(const char *a, const char *b) {
    const __m256i lo = _mm256_loadu_si256((const __m256i *)a);
    const __m256i hi = b ? _mm256_loadu_si256((const __m256i *)b) : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* 8 F16 fields (one per row) at a and b (NULL: zeros) as 16 floats */
static inline __attribute__((always_inline)) void il8_f16x16(const char *a, const char *b, float *out) {
    _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)a)));
    _mm256_storeu_ps(out + 8, b ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b)) : _mm256_setzero_ps());
}

static inline __attribute__((always_inline)) void il16_pack_il8(tsr_type t, const char *x, size_t xs, int rows,
                                                                int64_t nb, il16 *out) {
    const char *ga = x, *gb = rows > 8 ? x + 8 * xs : NULL;
    const __m512i f4 = _mm512_set1_epi8(0x0F);
    if (t == TSR_TYPE_Q4_K || t == TSR_TYPE_Q5_K) { /* per super-block: d[8], dmin[8], 3 scale vectors, (Q5_K: 8
                                                       qh vectors,) 32 value vectors */
        const bool q5 = t == TSR_TYPE_Q5_K;
        const size_t qs0 = q5 ? 384 : 128;
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const size_t o = (size_t)sb * 8 * (q5 ? sizeof(tsr_block_q5_K) : sizeof(tsr_block_q4_K));
            const char *a = ga + o, *b = gb ? gb + o : NULL;
            float dd[16], dm[16];
            il8_f16x16(a, b ? b : NULL, dd);
            il8_f16x16(a + 16, b ? b + 16 : NULL, dm);
            for (int r = 0; r < 16; r++) {
                const char *g = r < 8 ? a : b;
                uint8_t sc[12];
                for (int c = 0; c < 3 && g; c++) memcpy(sc + 4 * c, g + 32 + 32 * c + 4 * (r % 8), 4);
                for (int j = 0; j < 8; j++) {
                    if (!g) {
                        out[8 * sb + j].d[r] = out[8 * sb + j].m[r] = 0.0f;
                        continue;
                    }
                    uint8_t s, mn;
                    tsr__get_scale_min_k4(j, sc, &s, &mn);
                    out[8 * sb + j].d[r] = dd[r] * s;
                    out[8 * sb + j].m[r] = -dm[r] * mn;
                }
            }
            for (int j = 0; j < 8; j++)
                for (int g = 0; g < 8; g++) {
                    const size_t v = qs0 + 32 * (size_t)(8 * (j / 2) + g);
                    __m512i u = il8_pair(a + v, b ? b + v : NULL);
                    if (j & 1)
                        u = _mm512_srli_epi16(u, 4);
                    u = _mm512_and_si512(u, f4);
                    if (q5) { /* bit j of the qh bytes of the same values, at bit 4 */
                        const __m512i h = il8_pair(a + 128 + 32 * g, b ? b + 128 + 32 * g : NULL);
                        const __m512i t5 = j <= 4 ? _mm512_slli_epi16(h, 4 - j) : _mm512_srli_epi16(h, j - 4);
                        u = _mm512_or_si512(u, _mm512_and_si512(t5, _mm512_set1_epi8(0x10)));
                    }
                    _mm512_storeu_si512((void *)(out[8 * sb + j].u + 64 * g), u);
                }
        }
        return;
    }
    const size_t bs = t == TSR_TYPE_Q5_0   ? sizeof(tsr_block_q5_0)
                      : t == TSR_TYPE_Q4_1 ? sizeof(tsr_block_q4_1)
                                           : sizeof(tsr_block_q4_0);
    const int nf = t == TSR_TYPE_Q4_1 ? 2 : 1;
    /* Q5_0: byte 4r + j of a lane of 4 bytes gets the bit j of its row's qh word (shifted) */
    const __m512i rep = _mm512_set_epi8(12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0, 12, 12, 12, 12, 8, 8, 8, 8,
                                        4, 4, 4, 4, 0, 0, 0, 0, 12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0, 12,
                                        12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0);
    const __m512i bit = _mm512_set1_epi32(0x08040201);
    for (int64_t blk = 0; blk < nb; blk++) {
        const size_t o = (size_t)blk * 8 * bs;
        const char *a = ga + o, *b = gb ? gb + o : NULL;
        il16 *w = out + blk;
        il8_f16x16(a, b, w->d);
        if (nf == 2)
            il8_f16x16(a + 16, b ? b + 16 : NULL, w->m);
        else
            memset(w->m, 0, sizeof w->m);
        const size_t v0 = 16 * (size_t)nf;
        /* Q4_0, Q4_1, Q5_0: vector c holds values 4c.. (low nibbles) and 16 + 4c.. (high) */
        const size_t q0 = v0 + (t == TSR_TYPE_Q5_0 ? 32 : 0);
        const __m512i qh = t == TSR_TYPE_Q5_0 ? il8_pair(a + v0, b ? b + v0 : NULL) : _mm512_setzero_si512();
        const __m512i off = _mm512_set1_epi8(t == TSR_TYPE_Q4_0 ? 120 : t == TSR_TYPE_Q5_0 ? 112 : 0);
        for (int c = 0; c < 4; c++) {
            const __m512i v = il8_pair(a + q0 + 32 * c, b ? b + q0 + 32 * c : NULL);
            for (int h = 0; h < 2; h++) {
                const int g = c + 4 * h;
                __m512i u = _mm512_add_epi8(_mm512_and_si512(h ? _mm512_srli_epi16(v, 4) : v, f4), off);
                if (t == TSR_TYPE_Q5_0) {
                    const __m512i hb = _mm512_shuffle_epi8(_mm512_srli_epi32(qh, 4 * g), rep);
                    u = _mm512_mask_add_epi8(u, _mm512_test_epi8_mask(hb, bit), u, _mm512_set1_epi8(16));
                }
                _mm512_storeu_si512((void *)(w->u + 64 * g), u);
            }
        }
    }
}

/* The column and group loops unrolled, so that the accumulators live in registers. */
#define UNROLL _Pragma("GCC unroll 8")

static inline __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* 16 interleaved rows x nc (<= 8) columns over nb blocks; the first m (<= 16)
 * rows of each column stored at s + c * ss. */
static inline __attribute__((always_inline)) void il16_cols(il_mode mode, int nc, int64_t nb, const il16 *xb,
                                                            const char *y, size_t ys, float *s, size_t ss, int m) {
    __m512 acc[8];
    const tsr_cpu_q8s *yb[8];
    UNROLL
    for (int c = 0; c < nc; c++) {
        acc[c] = _mm512_setzero_ps();
        yb[c] = (const tsr_cpu_q8s *)(y + (size_t)c * ys);
    }
    for (int64_t b = 0; b < nb; b++) {
        const il16 *w = xb + b;
        __m512i wv[8], isum[8];
        UNROLL
        for (int g = 0; g < 8; g++) wv[g] = _mm512_loadu_si512((const void *)(w->u + 64 * g));
        if (mode == IL_Q6) {
            UNROLL
            for (int c = 0; c < nc; c++) isum[c] = _mm512_set1_epi32(yb[c][b].c_lo);
            UNROLL
            for (int g = 0; g < 4; g++) {
                UNROLL
                for (int c = 0; c < nc; c++) isum[c] = _mm512_dpbusd_epi32(isum[c], wv[g], bcast4(yb[c][b].qs + 4 * g));
            }
            const __m512 d = _mm512_loadu_ps(w->d);
            UNROLL
            for (int c = 0; c < nc; c++)
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(d, _mm512_set1_ps(yb[c][b].d)),
                                         acc[c]);
            UNROLL
            for (int c = 0; c < nc; c++) isum[c] = _mm512_set1_epi32(yb[c][b].c - yb[c][b].c_lo);
            UNROLL
            for (int g = 4; g < 8; g++) {
                UNROLL
                for (int c = 0; c < nc; c++) isum[c] = _mm512_dpbusd_epi32(isum[c], wv[g], bcast4(yb[c][b].qs + 4 * g));
            }
            const __m512 d2 = _mm512_loadu_ps(w->m);
            UNROLL
            for (int c = 0; c < nc; c++)
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(d2, _mm512_set1_ps(yb[c][b].d)),
                                         acc[c]);
            continue;
        }
        UNROLL
        for (int c = 0; c < nc; c++) isum[c] = mode == IL_ZP ? _mm512_set1_epi32(yb[c][b].c) : _mm512_setzero_si512();
        UNROLL
        for (int g = 0; g < 8; g++) {
            UNROLL
            for (int c = 0; c < nc; c++) isum[c] = _mm512_dpbusd_epi32(isum[c], wv[g], bcast4(yb[c][b].qs + 4 * g));
        }
        const __m512 d = _mm512_loadu_ps(w->d);
        UNROLL
        for (int c = 0; c < nc; c++)
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(d, _mm512_set1_ps(yb[c][b].d)), acc[c]);
        if (mode == IL_MIN) {
            const __m512 mv = _mm512_loadu_ps(w->m);
            UNROLL
            for (int c = 0; c < nc; c++) acc[c] = _mm512_fmadd_ps(mv, _mm512_set1_ps(yb[c][b].ds), acc[c]);
        }
    }
    const __mmask16 mask = (__mmask16)((1u << m) - 1);
    UNROLL
    for (int c = 0; c < nc; c++) _mm512_mask_storeu_ps(s + (size_t)c * ss, mask, acc[c]);
}

#define IL16_COLS(mode)                                                                                             \
    static void il16_cols_##mode(int nc, int64_t nb, const il16 *xb, const char *y, size_t ys, float *s, size_t ss, \
                                 int m) {                                                                           \
        switch (nc) {                                                                                               \
        case 8: il16_cols(mode, 8, nb, xb, y, ys, s, ss, m); break;                                                 \
        case 7: il16_cols(mode, 7, nb, xb, y, ys, s, ss, m); break;                                                 \
        case 6: il16_cols(mode, 6, nb, xb, y, ys, s, ss, m); break;                                                 \
        case 5: il16_cols(mode, 5, nb, xb, y, ys, s, ss, m); break;                                                 \
        case 4: il16_cols(mode, 4, nb, xb, y, ys, s, ss, m); break;                                                 \
        case 3: il16_cols(mode, 3, nb, xb, y, ys, s, ss, m); break;                                                 \
        case 2: il16_cols(mode, 2, nb, xb, y, ys, s, ss, m); break;                                                 \
        default: il16_cols(mode, 1, nb, xb, y, ys, s, ss, m); break;                                                \
        }                                                                                                           \
    }
IL16_COLS(IL_ZP)
IL16_COLS(IL_MIN)
IL16_COLS(IL_Q6)

/* 32 rows (two interleaved 16-row packs, a and b) x nc (<= 6) columns over
 * nb blocks, modes IL_ZP and IL_MIN: each column's 4 activation bytes
 * broadcast once for two VPDPBUSD (the 16-row pass broadcasts them for one,
 * and its loads, not its VPDPBUSD, bound it). Per output the arithmetic of
 * il16_cols, instruction for instruction, so that a row's results are the
 * same bits in a 32-row pass as in a 16-row one. */
static inline __attribute__((always_inline)) void il32_cols(il_mode mode, int nc, int64_t nb, const il16 *xa,
                                                            const il16 *xb, const char *y, size_t ys, float *s,
                                                            size_t ss) {
    __m512 acc[2][6];
    const tsr_cpu_q8s *yb[6];
    UNROLL
    for (int c = 0; c < nc; c++) {
        acc[0][c] = acc[1][c] = _mm512_setzero_ps();
        yb[c] = (const tsr_cpu_q8s *)(y + (size_t)c * ys);
    }
    for (int64_t b = 0; b < nb; b++) {
        const il16 *w[2] = {xa + b, xb + b};
        __m512i isum[2][6];
        UNROLL
        for (int c = 0; c < nc; c++)
            isum[0][c] = isum[1][c] = mode == IL_ZP ? _mm512_set1_epi32(yb[c][b].c) : _mm512_setzero_si512();
        UNROLL
        for (int g = 0; g < 8; g++) {
            const __m512i w0 = _mm512_loadu_si512((const void *)(w[0]->u + 64 * g));
            const __m512i w1 = _mm512_loadu_si512((const void *)(w[1]->u + 64 * g));
            UNROLL
            for (int c = 0; c < nc; c++) {
                const __m512i q = bcast4(yb[c][b].qs + 4 * g);
                isum[0][c] = _mm512_dpbusd_epi32(isum[0][c], w0, q);
                isum[1][c] = _mm512_dpbusd_epi32(isum[1][c], w1, q);
            }
        }
        UNROLL
        for (int h = 0; h < 2; h++) {
            const __m512 d = _mm512_loadu_ps(w[h]->d);
            UNROLL
            for (int c = 0; c < nc; c++)
                acc[h][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[h][c]),
                                            _mm512_mul_ps(d, _mm512_set1_ps(yb[c][b].d)), acc[h][c]);
            if (mode == IL_MIN) {
                const __m512 mv = _mm512_loadu_ps(w[h]->m);
                UNROLL
                for (int c = 0; c < nc; c++) acc[h][c] = _mm512_fmadd_ps(mv, _mm512_set1_ps(yb[c][b].ds), acc[h][c]);
            }
        }
    }
    UNROLL
    for (int c = 0; c < nc; c++) {
        _mm512_storeu_ps(s + (size_t)c * ss, acc[0][c]);
        _mm512_storeu_ps(s + (size_t)c * ss + 16, acc[1][c]);
    }
}

#define IL32_COLS(mode)                                                                                        \
    static void il32_cols_##mode(int nc, int64_t nb, const il16 *xa, const il16 *xb, const char *y, size_t ys, \
                                 float *s, size_t ss) {                                                        \
        switch (nc) {                                                                                          \
        case 6: il32_cols(mode, 6, nb, xa, xb, y, ys, s, ss); break;                                           \
        case 5: il32_cols(mode, 5, nb, xa, xb, y, ys, s, ss); break;                                           \
        case 4: il32_cols(mode, 4, nb, xa, xb, y, ys, s, ss); break;                                           \
        case 3: il32_cols(mode, 3, nb, xa, xb, y, ys, s, ss); break;                                           \
        case 2: il32_cols(mode, 2, nb, xa, xb, y, ys, s, ss); break;                                           \
        default: il32_cols(mode, 1, nb, xa, xb, y, ys, s, ss); break;                                          \
        }                                                                                                      \
    }
IL32_COLS(IL_ZP)
IL32_COLS(IL_MIN)

/* Few columns (n <= 8: decode of a batch-invariant stream, or of a few
 * sequences) from the interleaved layout without a pack: each block's
 * vectors, scales and minimums made in registers, as il16_pack_il8 makes
 * them, then il16_cols's arithmetic, instruction for instruction, so that
 * the results are the bits of the packed path (test-cpu-kernels). Rows
 * [0, rows) (8 or 16) of the groups at x. */
/* Two 8-float halves as one vector (AVX-512F only: no DQ's insertf32x8). */
static inline __attribute__((always_inline)) __m512 ps16_of(__m256 lo, __m256 hi) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

static inline __attribute__((always_inline)) __m512 il8_f16x16v(const char *a, const char *b) {
    const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)a));
    const __m256 hi = b ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b)) : _mm256_setzero_ps();
    return ps16_of(lo, hi);
}

/* Byte j % 4 of each row's dword of v (8 rows) as 8 floats. */
static inline __attribute__((always_inline)) __m256 il8_byte_ps(__m256i v, int j) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 8 * (j % 4)), _mm256_set1_epi32(0xFF)));
}

static inline __attribute__((always_inline)) void il8_direct(tsr_type t, il_mode mode, int nc, int64_t nb,
                                                             const char *x, size_t xs, int rows, const char *y,
                                                             size_t ys, float *s, size_t ss) {
    const char *ga = x, *gb = rows > 8 ? x + 8 * xs : NULL;
    const bool kq = t == TSR_TYPE_Q4_K || t == TSR_TYPE_Q5_K, q5k = t == TSR_TYPE_Q5_K;
    const size_t bs = t == TSR_TYPE_Q5_0   ? sizeof(tsr_block_q5_0)
                      : t == TSR_TYPE_Q4_1 ? sizeof(tsr_block_q4_1)
                      : t == TSR_TYPE_Q4_K ? sizeof(tsr_block_q4_K)
                      : t == TSR_TYPE_Q5_K ? sizeof(tsr_block_q5_K)
                                           : sizeof(tsr_block_q4_0);
    const __m512i f4 = _mm512_set1_epi8(0x0F);
    __m512 acc[8];
    const tsr_cpu_q8s *yb[8];
    UNROLL
    for (int c = 0; c < nc; c++) {
        acc[c] = _mm512_setzero_ps();
        yb[c] = (const tsr_cpu_q8s *)(y + (size_t)c * ys);
    }
    __m512 dd = _mm512_setzero_ps(), ndm = _mm512_setzero_ps();
    __m256i sca[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, mna[2] = {sca[0], sca[0]},
            scb[2] = {sca[0], sca[0]}, mnb[2] = {sca[0], sca[0]};
    const size_t blk8 = kq ? bs : 8 * bs; /* an 8-row group's bytes per block of 32 */
    for (int64_t b = 0; b < nb; b++) {
        __m512i wv[8];
        __m512 d, mv = _mm512_setzero_ps();
        if (b + PACK_PF < nb) /* the two groups' blocks PACK_PF ahead (simd.h) */
            for (size_t o = 0; o < blk8; o += 64) {
                _mm_prefetch(ga + (size_t)(b + PACK_PF) * blk8 + o, _MM_HINT_T1);
                if (gb)
                    _mm_prefetch(gb + (size_t)(b + PACK_PF) * blk8 + o, _MM_HINT_T1);
            }
        if (kq) {
            const int j = (int)(b % 8);
            const size_t o = (size_t)(b / 8) * 8 * bs;
            const char *a = ga + o, *bp = gb ? gb + o : NULL;
            if (j == 0) {
                dd = il8_f16x16v(a, bp);
                ndm = _mm512_castsi512_ps(_mm512_xor_si512(
                    _mm512_castps_si512(il8_f16x16v(a + 16, bp ? bp + 16 : NULL)), _mm512_set1_epi32(INT32_MIN)));
                il8_q4k_scales(a + 32, sca, mna);
                if (bp)
                    il8_q4k_scales(bp + 32, scb, mnb);
                else
                    scb[0] = scb[1] = mnb[0] = mnb[1] = _mm256_setzero_si256();
            }
            const __m512 sc = ps16_of(il8_byte_ps(sca[j / 4], j), il8_byte_ps(scb[j / 4], j));
            const __m512 mn = ps16_of(il8_byte_ps(mna[j / 4], j), il8_byte_ps(mnb[j / 4], j));
            d = _mm512_mul_ps(dd, sc);
            mv = _mm512_mul_ps(ndm, mn);
            const size_t qs0 = q5k ? 384 : 128;
            UNROLL
            for (int g = 0; g < 8; g++) {
                const size_t v = qs0 + 32 * (size_t)(8 * (j / 2) + g);
                __m512i u = il8_pair(a + v, bp ? bp + v : NULL);
                if (j & 1)
                    u = _mm512_srli_epi16(u, 4);
                u = _mm512_and_si512(u, f4);
                if (q5k) {
                    const __m512i h = il8_pair(a + 128 + 32 * g, bp ? bp + 128 + 32 * g : NULL);
                    const __m512i t5 = j <= 4 ? _mm512_slli_epi16(h, 4 - j) : _mm512_srli_epi16(h, j - 4);
                    u = _mm512_or_si512(u, _mm512_and_si512(t5, _mm512_set1_epi8(0x10)));
                }
                wv[g] = u;
            }
        } else {
            const size_t o = (size_t)b * 8 * bs;
            const char *a = ga + o, *bp = gb ? gb + o : NULL;
            d = il8_f16x16v(a, bp);
            if (t == TSR_TYPE_Q4_1)
                mv = il8_f16x16v(a + 16, bp ? bp + 16 : NULL);
            const int nf = t == TSR_TYPE_Q4_1 ? 2 : 1;
            const size_t v0 = 16 * (size_t)nf, q0 = v0 + (t == TSR_TYPE_Q5_0 ? 32 : 0);
            const __m512i qh = t == TSR_TYPE_Q5_0 ? il8_pair(a + v0, bp ? bp + v0 : NULL) : _mm512_setzero_si512();
            const __m512i off = _mm512_set1_epi8(t == TSR_TYPE_Q4_0 ? 120 : t == TSR_TYPE_Q5_0 ? 112 : 0);
            const __m512i rep = _mm512_set_epi8(12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0, 12, 12, 12, 12, 8,
                                                8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0, 12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4,
                                                0, 0, 0, 0, 12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0);
            UNROLL
            for (int c = 0; c < 4; c++) {
                const __m512i v = il8_pair(a + q0 + 32 * c, bp ? bp + q0 + 32 * c : NULL);
                UNROLL
                for (int h = 0; h < 2; h++) {
                    const int g = c + 4 * h;
                    __m512i u = _mm512_add_epi8(_mm512_and_si512(h ? _mm512_srli_epi16(v, 4) : v, f4), off);
                    if (t == TSR_TYPE_Q5_0) {
                        const __m512i hb = _mm512_shuffle_epi8(_mm512_srli_epi32(qh, 4 * g), rep);
                        u = _mm512_mask_add_epi8(u, _mm512_test_epi8_mask(hb, _mm512_set1_epi32(0x08040201)), u,
                                                 _mm512_set1_epi8(16));
                    }
                    wv[g] = u;
                }
            }
        }
        /* il16_cols's steps */
        __m512i isum[8];
        UNROLL
        for (int c = 0; c < nc; c++) isum[c] = mode == IL_ZP ? _mm512_set1_epi32(yb[c][b].c) : _mm512_setzero_si512();
        UNROLL
        for (int g = 0; g < 8; g++) {
            UNROLL
            for (int c = 0; c < nc; c++) isum[c] = _mm512_dpbusd_epi32(isum[c], wv[g], bcast4(yb[c][b].qs + 4 * g));
        }
        UNROLL
        for (int c = 0; c < nc; c++)
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(d, _mm512_set1_ps(yb[c][b].d)), acc[c]);
        if (mode == IL_MIN) {
            UNROLL
            for (int c = 0; c < nc; c++) acc[c] = _mm512_fmadd_ps(mv, _mm512_set1_ps(yb[c][b].ds), acc[c]);
        }
    }
    const __mmask16 mask = (__mmask16)((1u << rows) - 1);
    UNROLL
    for (int c = 0; c < nc; c++) _mm512_mask_storeu_ps(s + (size_t)c * ss, mask, acc[c]);
}

#define IL8_DIRECT(name, T, mode)                                                                                \
    static void name(int nc, int64_t nb, const char *x, size_t xs, int rows, const char *y, size_t ys, float *s, \
                     size_t ss) {                                                                                \
        switch (nc) {                                                                                            \
        case 8: il8_direct(T, mode, 8, nb, x, xs, rows, y, ys, s, ss); break;                                    \
        case 7: il8_direct(T, mode, 7, nb, x, xs, rows, y, ys, s, ss); break;                                    \
        case 6: il8_direct(T, mode, 6, nb, x, xs, rows, y, ys, s, ss); break;                                    \
        case 5: il8_direct(T, mode, 5, nb, x, xs, rows, y, ys, s, ss); break;                                    \
        case 4: il8_direct(T, mode, 4, nb, x, xs, rows, y, ys, s, ss); break;                                    \
        case 3: il8_direct(T, mode, 3, nb, x, xs, rows, y, ys, s, ss); break;                                    \
        case 2: il8_direct(T, mode, 2, nb, x, xs, rows, y, ys, s, ss); break;                                    \
        default: il8_direct(T, mode, 1, nb, x, xs, rows, y, ys, s, ss); break;                                   \
        }                                                                                                        \
    }
IL8_DIRECT(direct_q4_0, TSR_TYPE_Q4_0, IL_ZP)
IL8_DIRECT(direct_q5_0, TSR_TYPE_Q5_0, IL_ZP)
IL8_DIRECT(direct_q4_1, TSR_TYPE_Q4_1, IL_MIN)
IL8_DIRECT(direct_q4_k, TSR_TYPE_Q4_K, IL_MIN)
IL8_DIRECT(direct_q5_k, TSR_TYPE_Q5_K, IL_MIN)

typedef void (*il8_direct_fn)(int, int64_t, const char *, size_t, int, const char *, size_t, float *, size_t);

static il8_direct_fn il8_direct_of(tsr_type t) {
    switch (t) {
    case TSR_TYPE_Q4_0: return direct_q4_0;
    case TSR_TYPE_Q5_0: return direct_q5_0;
    case TSR_TYPE_Q4_1: return direct_q4_1;
    case TSR_TYPE_Q4_K: return direct_q4_k;
    case TSR_TYPE_Q5_K: return direct_q5_k;
    default: return NULL;
    }
}

/* ---- one column with the gemm's bits (gemm1, gemm1_il8: cpu.h) ---------------
 * The batch-invariant decode of tensr-server computes a lone column as the
 * gemm computes any column, and gemm16 packs 16 weight rows per call for it
 * (Zen 4, one thread, bench/gemv: Q8_0 32%, Q6_K 18%, interleaved Q4_0 55%,
 * Q4_K 56% of the read bandwidth; with these kernels 77%, 58%, 94%, 86%).
 * These kernels read the weights as the gemvs do instead, 8 rows side by
 * side with no pack, prefetching GEMV_PF rows ahead, and keep the gemm's
 * arithmetic: a row's integer sum over a block is exact however it is formed
 * (here VPDPBUSD of the unsigned values, their offsets taken out through the
 * q8s fields: c = -128 * sum(qy), so -8 * sum(qy) = c / 16), and its float
 * steps are il16_cols's for that row in the same order (acc = fma(sum, d *
 * dy, acc) per block, per half block for Q6_K; then acc = fma(m, ds, acc)
 * for the minimum formats); so each result is the packed path's bits (test-
 * cpu-kernels). The plain layout's rows are summed per row in 8 lanes and
 * put side by side by horizontal adds (hsum8x8). */
static inline __attribute__((always_inline)) __m256i bc4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static inline __attribute__((always_inline)) __m256i ld256(const void *p) {
    return _mm256_loadu_si256((const __m256i *)p);
}

/* Interleaved rows (Q4_0, Q4_1, Q5_0, Q4_K, Q5_K): whole 8-row groups, nc
 * (<= 4) columns ys bytes apart, results ss floats apart. */
static inline __attribute__((always_inline)) void one_il8(tsr_type t, int nc, int64_t k, int64_t m, int64_t ahead,
                                                          const char *x, size_t xs, const void *vy, size_t ys, float *s,
                                                          size_t ss) {
    const int64_t nb = k / 32;
    const tsr_cpu_q8s *yc[4];
    UNROLL
    for (int c = 0; c < nc; c++) yc[c] = (const tsr_cpu_q8s *)((const char *)vy + (size_t)c * ys);
    const bool kq = t == TSR_TYPE_Q4_K || t == TSR_TYPE_Q5_K, q5k = t == TSR_TYPE_Q5_K;
    const size_t bs = t == TSR_TYPE_Q5_0   ? sizeof(tsr_block_q5_0)
                      : t == TSR_TYPE_Q4_1 ? sizeof(tsr_block_q4_1)
                      : t == TSR_TYPE_Q4_K ? sizeof(tsr_block_q4_K)
                      : t == TSR_TYPE_Q5_K ? sizeof(tsr_block_q5_K)
                                           : sizeof(tsr_block_q4_0);
    const size_t step = 8 * bs, pfd = (size_t)GEMV_PF * xs; /* bytes of 8 rows' block (super-block) */
    const char *end = x + (size_t)(m + (ahead > 0 ? ahead : 0)) * xs;
    const __m256i f4 = _mm256_set1_epi8(0x0F);
    ramp(x, m, xs);
    for (int64_t g = 0; g < m / 8; g++) {
        const char *w = x + (size_t)g * 8 * xs;
        __m256 acc[4];
        UNROLL
        for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
        for (int64_t blk = 0; blk < (kq ? nb / 8 : nb); blk++) {
            const char *a = w + (size_t)blk * step, *pf = a + pfd;
            for (size_t o = 0; o < step && pf + o < end; o += 64) _mm_prefetch(pf + o, _MM_HINT_T1);
            __m256i u[8];
            if (kq) {
                const __m256 dd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)a));
                const __m256 ndm = _mm256_castsi256_ps(
                    _mm256_xor_si256(_mm256_castps_si256(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + 16)))),
                                     _mm256_set1_epi32(INT32_MIN)));
                __m256i sc[2], mn[2];
                il8_q4k_scales(a + 32, sc, mn);
                const size_t qs0 = q5k ? 384 : 128;
                for (int jp = 0; jp < 4; jp++) {
                    __m256i v[8];
                    UNROLL
                    for (int gg = 0; gg < 8; gg++) v[gg] = ld256(a + qs0 + 32 * (size_t)(8 * jp + gg));
                    UNROLL
                    for (int h = 0; h < 2; h++) {
                        const int j = 2 * jp + h;
                        UNROLL
                        for (int gg = 0; gg < 8; gg++) {
                            u[gg] = _mm256_and_si256(h ? _mm256_srli_epi16(v[gg], 4) : v[gg], f4);
                            if (q5k) {
                                const __m256i hq = ld256(a + 128 + 32 * gg);
                                const __m256i t5 = j <= 4 ? _mm256_slli_epi16(hq, 4 - j) : _mm256_srli_epi16(hq, j - 4);
                                u[gg] = _mm256_or_si256(u[gg], _mm256_and_si256(t5, _mm256_set1_epi8(0x10)));
                            }
                        }
                        const __m256 d = _mm256_mul_ps(dd, il8_byte_ps(sc[j / 4], j));
                        const __m256 mv = _mm256_mul_ps(ndm, il8_byte_ps(mn[j / 4], j));
                        UNROLL
                        for (int c = 0; c < nc; c++) {
                            const tsr_cpu_q8s *yb = yc[c] + 8 * blk + j;
                            __m256i is = _mm256_setzero_si256();
                            UNROLL
                            for (int gg = 0; gg < 8; gg++) is = _mm256_dpbusd_epi32(is, u[gg], bc4(yb->qs + 4 * gg));
                            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(d, _mm256_set1_ps(yb->d)),
                                                     acc[c]);
                            acc[c] = _mm256_fmadd_ps(mv, _mm256_set1_ps(yb->ds), acc[c]);
                        }
                    }
                }
                continue;
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)a));
            const int nf = t == TSR_TYPE_Q4_1 ? 2 : 1;
            const size_t v0 = 16 * (size_t)nf, q0 = v0 + (t == TSR_TYPE_Q5_0 ? 32 : 0);
            const __m256i qh = t == TSR_TYPE_Q5_0 ? ld256(a + v0) : _mm256_setzero_si256();
            const __m256i rep = _mm256_set_epi8(12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0, 12, 12, 12, 12, 8,
                                                8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0);
            UNROLL
            for (int cv = 0; cv < 4; cv++) {
                const __m256i v = ld256(a + q0 + 32 * cv);
                UNROLL
                for (int h = 0; h < 2; h++) {
                    const int gg = cv + 4 * h;
                    u[gg] = _mm256_and_si256(h ? _mm256_srli_epi16(v, 4) : v, f4);
                    if (t == TSR_TYPE_Q5_0) {
                        const __m256i hb = _mm256_shuffle_epi8(_mm256_srli_epi32(qh, 4 * gg), rep);
                        u[gg] = _mm256_mask_add_epi8(u[gg], _mm256_test_epi8_mask(hb, _mm256_set1_epi32(0x08040201)),
                                                     u[gg], _mm256_set1_epi8(16));
                    }
                }
            }
            const __m256 m4 = t == TSR_TYPE_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + 16)))
                                                 : _mm256_setzero_ps();
            UNROLL
            for (int c = 0; c < nc; c++) {
                const tsr_cpu_q8s *yb = yc[c] + blk;
                /* the offsets: Q4_0 -8 * sum(qy), Q5_0 -16 * sum(qy) */
                __m256i is = _mm256_set1_epi32(t == TSR_TYPE_Q4_0 ? yb->c / 16 : t == TSR_TYPE_Q5_0 ? yb->c / 8 : 0);
                UNROLL
                for (int gg = 0; gg < 8; gg++) is = _mm256_dpbusd_epi32(is, u[gg], bc4(yb->qs + 4 * gg));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(d, _mm256_set1_ps(yb->d)), acc[c]);
                if (t == TSR_TYPE_Q4_1)
                    acc[c] = _mm256_fmadd_ps(m4, _mm256_set1_ps(yb->ds), acc[c]);
            }
        }
        UNROLL
        for (int c = 0; c < nc; c++) _mm256_storeu_ps(s + (size_t)c * ss + 8 * g, acc[c]);
    }
}

/* Plain rows, 8 at a time (the last ones of m repeated, their results not
 * stored), nc (<= 2) columns: Q8_0, and Q6_K with its two half-block sums
 * (one column: two blocks at once, those of the same ql bytes). */
static inline __attribute__((always_inline)) void one_plain(tsr_type t, int nc, int64_t k, int64_t m, int64_t ahead,
                                                            const char *x, size_t xs, const void *vy, size_t ys,
                                                            float *s, size_t ss) {
    const int64_t nb = k / 32, n = m + (ahead > 0 ? ahead : 0);
    const tsr_cpu_q8s *yc[2];
    UNROLL
    for (int c = 0; c < nc; c++) yc[c] = (const tsr_cpu_q8s *)((const char *)vy + (size_t)c * ys);
    ramp(x, m, xs);
    for (int64_t i = 0; i < m; i += 8) {
        const int R = m - i < 8 ? (int)(m - i) : 8;
        const size_t pfo = pf_offset(i, R, n, xs);
        const char *row[8];
        for (int r = 0; r < 8; r++) row[r] = x + (size_t)(i + (r < R ? r : R - 1)) * xs;
        __m256 acc[2];
        UNROLL
        for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
        if (t == TSR_TYPE_Q8_0) {
            for (int64_t b = 0; b < nb; b++) {
                __m256i p[2][8];
                uint16_t dh[8];
                UNROLL
                for (int r = 0; r < 8; r++) {
                    const tsr_block_q8_0 *q = (const tsr_block_q8_0 *)row[r] + b;
                    if (pfo)
                        _mm_prefetch((const char *)q + pfo, _MM_HINT_T1);
                    const __m256i u = _mm256_xor_si256(ld256(q->qs), _mm256_set1_epi8((char)0x80));
                    UNROLL
                    for (int c = 0; c < nc; c++)
                        p[c][r] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, ld256(yc[c][b].qs));
                    memcpy(&dh[r], &q->d, 2);
                }
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));
                UNROLL
                for (int c = 0; c < nc; c++) {
                    const __m256i is = _mm256_add_epi32(hsum8x8(p[c]), _mm256_set1_epi32(yc[c][b].c));
                    acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(d, _mm256_set1_ps(yc[c][b].d)),
                                             acc[c]);
                }
            }
        } else { /* Q6_K: per super-block the rows' d and their 16 scales side by side */
            for (int64_t sb = 0; sb < nb / 8; sb++) {
                const tsr_block_q6_K *q[8];
                uint16_t dh[8];
                __m128i a[8];
                UNROLL
                for (int r = 0; r < 8; r++) {
                    q[r] = (const tsr_block_q6_K *)row[r] + sb;
                    memcpy(&dh[r], &q[r]->d, 2);
                    a[r] = _mm_loadu_si128((const __m128i *)q[r]->scales);
                }
                const __m256 dd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));
                __m128i sc[8];
                q6k_scales8(a, sc);
                /* per half h, block by block (tt: 0..3) or two at once (one column: tt and tt + 2, the low
                 * and high nibbles of the same ql bytes); their float steps in block order */
                for (int h = 0; h < 2; h++) {
                    __m256i lo[2][4], hi[2][4];
                    for (int e = 0; e < (nc == 1 ? 2 : 4); e++) {
                        const int ta = e, tb = e + 2; /* (tb: one column only) */
                        __m256i pa[2][8], pb[8];
                        UNROLL
                        for (int r = 0; r < 8; r++) {
                            if (pfo)
                                _mm_prefetch((const char *)q[r] + pfo + 64 * (2 * h + (e & 1)), _MM_HINT_T1);
                            const __m256i ql = ld256(q[r]->ql + 64 * h + 32 * (ta & 1)), qh = ld256(q[r]->qh + 32 * h);
                            const __m256i m30 = _mm256_set1_epi8(0x30), f4 = _mm256_set1_epi8(0x0F);
                            /* the two high bits of value l: bits 2 * tt, 2 * tt + 1 of qh[l], at bits 4, 5 */
                            const __m256i ha = ta == 0   ? _mm256_slli_epi16(qh, 4)
                                               : ta == 1 ? _mm256_slli_epi16(qh, 2)
                                               : ta == 2 ? qh
                                                         : _mm256_srli_epi16(qh, 2);
                            const __m256i la = ta >= 2 ? _mm256_srli_epi16(ql, 4) : ql;
                            const __m256i va = _mm256_or_si256(_mm256_and_si256(la, f4), _mm256_and_si256(ha, m30));
                            UNROLL
                            for (int c = 0; c < nc; c++)
                                pa[c][r] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), va,
                                                               ld256(yc[c][8 * sb + 4 * h + ta].qs));
                            if (nc == 1) {
                                const __m256i hb = ta ? _mm256_srli_epi16(qh, 2) : qh;
                                const __m256i vb = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql, 4), f4),
                                                                   _mm256_and_si256(hb, m30));
                                pb[r] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), vb,
                                                            ld256(yc[0][8 * sb + 4 * h + tb].qs));
                            }
                        }
                        UNROLL
                        for (int c = 0; c < nc; c++) hsum8x8_halves(pa[c], &lo[c][ta], &hi[c][ta]);
                        if (nc == 1)
                            hsum8x8_halves(pb, &lo[0][tb], &hi[0][tb]);
                    }
                    for (int tt = 0; tt < 4; tt++) {
                        const int j = 4 * h + tt;
                        const __m256 d0 = _mm256_mul_ps(dd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc[j])));
                        const __m256 d1 = _mm256_mul_ps(
                            dd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc[j], 8))));
                        UNROLL
                        for (int c = 0; c < nc; c++) {
                            const tsr_cpu_q8s *yb = yc[c] + 8 * sb + j;
                            /* values 0..15 and 16..31 of each row, offsets -32 * sum(qy): c_lo / 4, (c - c_lo) / 4 */
                            const __m256i il = _mm256_add_epi32(lo[c][tt], _mm256_set1_epi32(yb->c_lo / 4));
                            const __m256i ih = _mm256_add_epi32(hi[c][tt], _mm256_set1_epi32((yb->c - yb->c_lo) / 4));
                            const __m256 dy = _mm256_set1_ps(yb->d);
                            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(il), _mm256_mul_ps(d0, dy), acc[c]);
                            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ih), _mm256_mul_ps(d1, dy), acc[c]);
                        }
                    }
                }
            }
        }
        UNROLL
        for (int c = 0; c < nc; c++) _mm256_mask_storeu_ps(s + (size_t)c * ss + i, (__mmask8)((1u << R) - 1), acc[c]);
    }
}

#define ONE(name, fn, T)                                                                                       \
    static void name(int64_t k, int64_t m, int64_t ahead, const void *x, size_t xs, const void *y, float *s) { \
        fn(T, 1, k, m, ahead, (const char *)x, xs, y, 0, s, 0);                                                \
    }
ONE(one_q8_0, one_plain, TSR_TYPE_Q8_0)
ONE(one_q6_k, one_plain, TSR_TYPE_Q6_K)
ONE(one_q4_0_il8, one_il8, TSR_TYPE_Q4_0)
ONE(one_q4_1_il8, one_il8, TSR_TYPE_Q4_1)
ONE(one_q5_0_il8, one_il8, TSR_TYPE_Q5_0)
ONE(one_q4_k_il8, one_il8, TSR_TYPE_Q4_K)
ONE(one_q5_k_il8, one_il8, TSR_TYPE_Q5_K)

/* A gemm16 call of few columns without a pack: the interleaved types
 * 1..4 columns at once, Q8_0 and Q6_K 1..4 in passes of 1 or 2 (their 8
 * rows' sums of 2 columns fill the registers); the packed path's bits. */
#define FEW_COLS 4
static bool few_cols(tsr_type t, bool il8, int64_t n) {
    if (n > FEW_COLS || n < 1)
        return false;
    if (il8)
        return t == TSR_TYPE_Q4_0 || t == TSR_TYPE_Q4_1 || t == TSR_TYPE_Q5_0 || t == TSR_TYPE_Q4_K ||
               t == TSR_TYPE_Q5_K;
    return t == TSR_TYPE_Q8_0 || t == TSR_TYPE_Q6_K;
}

static void few_il8(tsr_type t, int nc, int64_t k, int64_t m, const char *x, size_t xs, const void *y, size_t ys,
                    float *s, size_t ss) {
#define FEW_IL8(T)                                                   \
    case T:                                                          \
        switch (nc) {                                                \
        case 4: one_il8(T, 4, k, m, 0, x, xs, y, ys, s, ss); break;  \
        case 3: one_il8(T, 3, k, m, 0, x, xs, y, ys, s, ss); break;  \
        case 2: one_il8(T, 2, k, m, 0, x, xs, y, ys, s, ss); break;  \
        default: one_il8(T, 1, k, m, 0, x, xs, y, ys, s, ss); break; \
        }                                                            \
        break;
    switch (t) {
        FEW_IL8(TSR_TYPE_Q4_0)
        FEW_IL8(TSR_TYPE_Q4_1)
        FEW_IL8(TSR_TYPE_Q5_0)
        FEW_IL8(TSR_TYPE_Q4_K)
        FEW_IL8(TSR_TYPE_Q5_K)
    default: break;
    }
#undef FEW_IL8
}

static void few_plain(tsr_type t, int64_t n, int64_t k, int64_t m, const char *x, size_t xs, const char *y, size_t ys,
                      float *s, size_t ss) {
    for (int64_t j = 0; j < n; j += 2) {
        const bool two = n - j >= 2;
        if (t == TSR_TYPE_Q8_0)
            two ? one_plain(TSR_TYPE_Q8_0, 2, k, m, 0, x, xs, y + (size_t)j * ys, ys, s + (size_t)j * ss, ss)
                : one_plain(TSR_TYPE_Q8_0, 1, k, m, 0, x, xs, y + (size_t)j * ys, ys, s + (size_t)j * ss, ss);
        else
            two ? one_plain(TSR_TYPE_Q6_K, 2, k, m, 0, x, xs, y + (size_t)j * ys, ys, s + (size_t)j * ss, ss)
                : one_plain(TSR_TYPE_Q6_K, 1, k, m, 0, x, xs, y + (size_t)j * ys, ys, s + (size_t)j * ss, ss);
    }
}

static inline __attribute__((always_inline)) void gemm16(tsr_type t, bool il8, int64_t k, int64_t m, int64_t n,
                                                         const void *vx, size_t xs, const void *vy, size_t ys, float *s,
                                                         size_t ss, void *scratch) {
    const int64_t nb = k / 32;
    il16 *xb = (il16 *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    const il_mode mode = il_mode_of(t);
    if (few_cols(t, il8, n)) { /* few columns: no pack, 8 rows side by side */
        if (il8)
            few_il8(t, (int)n, k, m, (const char *)vx, xs, vy, ys, s, ss);
        else
            few_plain(t, n, k, m, (const char *)vx, xs, (const char *)vy, ys, s, ss);
        return;
    }
    if (il8 && n <= 8) { /* few columns: no pack (m % 8 == 0) */
        const il8_direct_fn direct = il8_direct_of(t);
        for (int64_t i = 0; i < m; i += 16)
            direct((int)n, nb, (const char *)vx + (size_t)i * xs, xs, m - i < 16 ? (int)(m - i) : 16, vy, ys, s + i,
                   ss);
        return;
    }
    int64_t i = 0;
    if (mode != IL_Q6) /* 32 rows at a time */
        for (; i + 32 <= m; i += 32) {
            if (il8) {
                il16_pack_il8(t, (const char *)vx + (size_t)i * xs, xs, 16, nb, xb);
                il16_pack_il8(t, (const char *)vx + (size_t)(i + 16) * xs, xs, 16, nb, xb + nb);
            } else {
                il16_pack(t, (const char *)vx + (size_t)i * xs, xs, 16, nb, xb);
                il16_pack(t, (const char *)vx + (size_t)(i + 16) * xs, xs, 16, nb, xb + nb);
            }
            for (int64_t j = 0; j < n; j += 6) {
                const int nc = n - j < 6 ? (int)(n - j) : 6;
                const char *y = (const char *)vy + (size_t)j * ys;
                float *o = s + (size_t)j * ss + (size_t)i;
                if (mode == IL_ZP)
                    il32_cols_IL_ZP(nc, nb, xb, xb + nb, y, ys, o, ss);
                else
                    il32_cols_IL_MIN(nc, nb, xb, xb + nb, y, ys, o, ss);
            }
        }
    for (; i < m; i += 16) {
        const int rows = m - i < 16 ? (int)(m - i) : 16;
        if (il8) /* (m % 8 == 0: rows is 8 or 16) */
            il16_pack_il8(t, (const char *)vx + (size_t)i * xs, xs, rows, nb, xb);
        else
            il16_pack(t, (const char *)vx + (size_t)i * xs, xs, rows, nb, xb);
        for (int64_t j = 0; j < n; j += 8) {
            const int nc = n - j < 8 ? (int)(n - j) : 8;
            const char *y = (const char *)vy + (size_t)j * ys;
            float *o = s + (size_t)j * ss + (size_t)i;
            if (mode == IL_ZP)
                il16_cols_IL_ZP(nc, nb, xb, y, ys, o, ss, rows);
            else if (mode == IL_MIN)
                il16_cols_IL_MIN(nc, nb, xb, y, ys, o, ss, rows);
            else
                il16_cols_IL_Q6(nc, nb, xb, y, ys, o, ss, rows);
        }
    }
}

#define GEMM16(name, T)                                                                                             \
    static void name(int64_t k, int64_t m, int64_t n, const void *x, size_t xs, const void *y, size_t ys, float *s, \
                     size_t ss, void *scratch) {                                                                    \
        gemm16(T, false, k, m, n, x, xs, y, ys, s, ss, scratch);                                                    \
    }
#define GEMM16_IL8(name, T)                                                                                     \
    static void name##_il8(int64_t k, int64_t m, int64_t n, const void *x, size_t xs, const void *y, size_t ys, \
                           float *s, size_t ss, void *scratch) {                                                \
        gemm16(T, true, k, m, n, x, xs, y, ys, s, ss, scratch);                                                 \
    }
GEMM16(gemm_q8_0, TSR_TYPE_Q8_0)
GEMM16(gemm_q4_0, TSR_TYPE_Q4_0)
GEMM16(gemm_q5_0, TSR_TYPE_Q5_0)
GEMM16(gemm_q4_1, TSR_TYPE_Q4_1)
GEMM16(gemm_q5_1, TSR_TYPE_Q5_1)
GEMM16(gemm_q4_k, TSR_TYPE_Q4_K)
GEMM16(gemm_q5_k, TSR_TYPE_Q5_K)
GEMM16(gemm_q6_k, TSR_TYPE_Q6_K)
GEMM16_IL8(gemm_q4_0, TSR_TYPE_Q4_0)
GEMM16_IL8(gemm_q5_0, TSR_TYPE_Q5_0)
GEMM16_IL8(gemm_q4_1, TSR_TYPE_Q4_1)
GEMM16_IL8(gemm_q4_k, TSR_TYPE_Q4_K)
GEMM16_IL8(gemm_q5_k, TSR_TYPE_Q5_K)

/* Activations -> tsr_cpu_q8s rows: the reference's arithmetic (d = max / 127,
 * values rounded to nearest even of x * 127 / max), 32 values at a time. */
/* Per 128-bit lane j of the result, the 4 lanes alike: the reduction (max
 * or add) of all 16 lanes of v[j], j < 4. */
#define REDUCE4(T, op, sh, perm, v, out)                              \
    do {                                                              \
        const T t01 = op(sh(v[0], v[1], 0x44), sh(v[0], v[1], 0xEE)); \
        const T t23 = op(sh(v[2], v[3], 0x44), sh(v[2], v[3], 0xEE)); \
        const T u = op(sh(t01, t23, 0x88), sh(t01, t23, 0xDD));       \
        const T u2 = op(u, perm(u, 0x4E));                            \
        (out) = op(u2, perm(u2, 0xB1));                               \
    } while (0)
#define SHUF_PS _mm512_shuffle_f32x4
#define SHUF_EPI _mm512_shuffle_i32x4
#define PERM_PS _mm512_permute_ps
#define PERM_EPI(v, imm) _mm512_shuffle_epi32(v, (_MM_PERM_ENUM)(imm))

/* Four blocks at once: their maxima, scales and sums reduced side by side,
 * the F16 roundings of d and d * sum by F16C (round to nearest even, the
 * reference's tsr__fp32_to_fp16), so the same bits as one block at a time. */
_Static_assert(offsetof(tsr_cpu_q8s, c_lo) == 12 && offsetof(tsr_cpu_q8s, qs) == 16, "q8s_from_float4's header");
static bool q8s_from_float4(const float *x, tsr_cpu_q8s *y) {
    __m512 v[8], a[4];
    UNROLL
    for (int j = 0; j < 8; j++) v[j] = _mm512_loadu_ps(x + 16 * j);
    UNROLL
    for (int j = 0; j < 4; j++) a[j] = _mm512_max_ps(_mm512_abs_ps(v[2 * j]), _mm512_abs_ps(v[2 * j + 1]));
    __m512 amax;
    REDUCE4(__m512, _mm512_max_ps, SHUF_PS, PERM_PS, a, amax);
    const __m512 d = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
    __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_UQ), _mm512_set1_ps(127.0f),
                                    amax);
    id = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(id, _mm512_set1_ps(0x1.fffffep127f), _CMP_LE_OQ),
                             id); /* tsr__cpu_q8s_inv */
    __m512i lo[4], all[4];
    __mmask16 nan = 0; /* lanes of NaN products (a NaN or an infinite value) */
    UNROLL
    for (int j = 0; j < 4; j++) {
        const __m512 s = _mm512_permutexvar_ps(_mm512_set1_epi32(4 * j), id); /* block j's id in every lane */
        const __m512 p0 = _mm512_mul_ps(v[2 * j], s), p1 = _mm512_mul_ps(v[2 * j + 1], s);
        nan |= _mm512_cmp_ps_mask(p0, p1, _CMP_UNORD_Q);
        const __m512i q0 = _mm512_cvtps_epi32(p0), q1 = _mm512_cvtps_epi32(p1);
        _mm_storeu_si128((__m128i *)y[j].qs, _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(y[j].qs + 16), _mm512_cvtsepi32_epi8(q1));
        lo[j] = q0;
        all[j] = _mm512_add_epi32(q0, q1);
    }
    __m512i slo, sall;
    REDUCE4(__m512i, _mm512_add_epi32, SHUF_EPI, PERM_EPI, lo, slo);
    REDUCE4(__m512i, _mm512_add_epi32, SHUF_EPI, PERM_EPI, all, sall);
    /* lanes 0, 4, 8, 12 -> 0..3 */
    const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12);
    const __m128 d4 = _mm512_castps512_ps128(_mm512_permutexvar_ps(first, d));
    const __m128i sum4 = _mm512_castsi512_si128(_mm512_permutexvar_epi32(first, sall));
    const __m128i lo4 = _mm512_castsi512_si128(_mm512_permutexvar_epi32(first, slo));
    __m128 r0 = _mm_cvtph_ps(_mm_cvtps_ph(d4, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m128 ds4 = _mm_mul_ps(d4, _mm_cvtepi32_ps(sum4));
    const __m128i h4 = _mm_cvtps_ph(ds4, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128i e4 = _mm_and_si128(_mm_cvtepu16_epi32(h4), _mm_set1_epi32(0x7C00));
    /* past F16's range: the float */
    __m128 r1 = _mm_blendv_ps(_mm_cvtph_ps(h4), ds4, _mm_castsi128_ps(_mm_cmpeq_epi32(e4, _mm_set1_epi32(0x7C00))));
    __m128 r2 = _mm_castsi128_ps(_mm_mullo_epi32(sum4, _mm_set1_epi32(-128)));
    __m128 r3 = _mm_castsi128_ps(_mm_mullo_epi32(lo4, _mm_set1_epi32(-128)));
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3); /* block j: d, ds, c, c_lo */
    _mm_storeu_ps((float *)&y[0], r0);
    _mm_storeu_ps((float *)&y[1], r1);
    _mm_storeu_ps((float *)&y[2], r2);
    _mm_storeu_ps((float *)&y[3], r3);
    return nan == 0;
}

static void q8s_from_float(const float *x, void *vy, int64_t k) {
    tsr_cpu_q8s *y = vy;
    int64_t b = 0;
    /* A NaN product (a NaN or an infinite value) would convert to INT_MIN
     * and its sums overflow: such blocks are the reference's (cpu.h). */
    for (; b + 4 <= k / 32; b += 4, x += 128)
        if (__builtin_expect(!q8s_from_float4(x, y + b), 0))
            tsr__cpu_q8s_from_float_ref(x, y + b, 128);
    for (; b < k / 32; b++, x += 32) {
        const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float d = amax / 127.0f, id = tsr__cpu_q8s_inv(d, amax);
        const __m512 vid = _mm512_set1_ps(id), p0 = _mm512_mul_ps(v0, vid), p1 = _mm512_mul_ps(v1, vid);
        if (__builtin_expect(_mm512_cmp_ps_mask(p0, p1, _CMP_UNORD_Q) != 0, 0)) {
            tsr__cpu_q8s_from_float_ref(x, &y[b], 32);
            continue;
        }
        const __m512i q0 = _mm512_cvtps_epi32(p0), q1 = _mm512_cvtps_epi32(p1);
        _mm_storeu_si128((__m128i *)y[b].qs, _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(y[b].qs + 16), _mm512_cvtsepi32_epi8(q1));
        const int32_t lo = _mm512_reduce_add_epi32(q0), sum = lo + _mm512_reduce_add_epi32(q1);
        q8s_finish_f16c(&y[b], d, sum, lo);
    }
}

/* ---- fused attention blocks ------------------------------------------------- */

/* The loops over the accumulator arrays must be unrolled, or GCC -O2 keeps
 * the arrays on the stack (a load and a store around every FMA). */
#define UNROLL8 _Pragma("GCC unroll 8")
#define UNROLL16 _Pragma("GCC unroll 16")

/* mr rows x up to 16 * nv columns of C (nv 2 or 4), the mr * nv accumulators
 * in registers over the whole k loop; each B row is loaded once per mr
 * rows. Each element sums over k in order, whatever the tile. */
static inline __attribute__((always_inline)) void gemm_tile(int mr, int nv, int64_t n, int64_t k, const float *a,
                                                            int64_t lda, const void *vb, bool b_f16, int64_t ldb,
                                                            float *c, int64_t ldc, bool acc) {
    __mmask16 mk[4];
    __m512 cc[8][4];
    UNROLL8 for (int v = 0; v < nv; v++) mk[v] = lanes16(n > 16 * v ? n - 16 * v : 0);
    UNROLL8 for (int i = 0; i < mr; i++) UNROLL8 for (int v = 0; v < nv; v++)
        cc[i][v] = acc ? _mm512_maskz_loadu_ps(mk[v], c + i * ldc + 16 * v) : _mm512_setzero_ps();
    for (int64_t l = 0; l < k; l++) {
        __m512 bv[4];
        UNROLL8 for (int v = 0; v < nv; v++)
            bv[v] = b_f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk[v], (const uint16_t *)vb + l * ldb + 16 * v))
                          : _mm512_maskz_loadu_ps(mk[v], (const float *)vb + l * ldb + 16 * v);
        UNROLL8 for (int i = 0; i < mr; i++) {
            const __m512 av = _mm512_set1_ps(a[i * lda + l]);
            UNROLL8 for (int v = 0; v < nv; v++) cc[i][v] = _mm512_fmadd_ps(av, bv[v], cc[i][v]);
        }
    }
    UNROLL8 for (int i = 0; i < mr; i++) UNROLL8 for (int v = 0; v < nv; v++)
        _mm512_mask_storeu_ps(c + i * ldc + 16 * v, mk[v], cc[i][v]);
}

/* The tile for the rows left with B's type a constant, so that the k loop
 * has no branch: 8 rows x 32 columns, or 6 x 64 where 48 or more columns
 * are left (each B load then serves 6 rows of 4 vectors). */
#define GEMM_TILES(f16)                                                              \
    if (nv == 4)                                                                     \
        switch (m - i < 6 ? m - i : 6) {                                             \
        case 1: gemm_tile(1, 4, nj, k, ai, lda, bj, f16, ldb, ci, ldc, acc); break;  \
        case 2: gemm_tile(2, 4, nj, k, ai, lda, bj, f16, ldb, ci, ldc, acc); break;  \
        case 3: gemm_tile(3, 4, nj, k, ai, lda, bj, f16, ldb, ci, ldc, acc); break;  \
        case 4: gemm_tile(4, 4, nj, k, ai, lda, bj, f16, ldb, ci, ldc, acc); break;  \
        case 5: gemm_tile(5, 4, nj, k, ai, lda, bj, f16, ldb, ci, ldc, acc); break;  \
        default: gemm_tile(6, 4, nj, k, ai, lda, bj, f16, ldb, ci, ldc, acc); break; \
        }                                                                            \
    else                                                                             \
        switch (m - i < 8 ? m - i : 8) {                                             \
        case 1: gemm_tile(1, 2, nj, k, ai, lda, bj, f16, ldb, ci, ldc, acc); break;  \
        case 2: gemm_tile(2, 2, nj, k, ai, lda, bj, f16, ldb, ci, ldc, acc); break;  \
        case 3: gemm_tile(3, 2, nj, k, ai, lda, bj, f16, ldb, ci, ldc, acc); break;  \
        case 4: gemm_tile(4, 2, nj, k, ai, lda, bj, f16, ldb, ci, ldc, acc); break;  \
        case 5: gemm_tile(5, 2, nj, k, ai, lda, bj, f16, ldb, ci, ldc, acc); break;  \
        case 6: gemm_tile(6, 2, nj, k, ai, lda, bj, f16, ldb, ci, ldc, acc); break;  \
        case 7: gemm_tile(7, 2, nj, k, ai, lda, bj, f16, ldb, ci, ldc, acc); break;  \
        default: gemm_tile(8, 2, nj, k, ai, lda, bj, f16, ldb, ci, ldc, acc); break; \
        }

static void gemm_f32(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b, bool b_f16,
                     int64_t ldb, float *c, int64_t ldc, bool acc) {
    for (int64_t j = 0; j < n;) {
        const int nv = n - j >= 48 && m <= 6 ? 4 : 2;
        const int64_t nj = n - j < 16 * nv ? n - j : 16 * nv;
        const int rows = nv == 4 ? 6 : 8;
        for (int64_t i = 0; i < m; i += rows) {
            const float *ai = a + i * lda;
            const void *bj = b_f16 ? (const void *)((const uint16_t *)b + j) : (const void *)((const float *)b + j);
            float *ci = c + i * ldc + j;
            if (b_f16)
                GEMM_TILES(true)
            else
                GEMM_TILES(false)
        }
        j += nj;
    }
}
#undef GEMM_TILES

/* The 16 sums of v[0..16) (each over its 16 lanes) as one vector, in the
 * lane order out[4k + t] = sum(v[4t + k]): halves, quarters, pairs, then
 * neighbours added in the same order for every vector. */
static inline __m512 sum16x16(const __m512 *v) {
    __m512 w[8], y[4], z[2];
    UNROLL8 for (int i = 0; i < 8; i++) w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                                                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    UNROLL8 for (int i = 0; i < 4; i++) y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                                                             _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD));
    UNROLL8 for (int i = 0; i < 2; i++) z[i] = _mm512_add_ps(_mm512_shuffle_ps(y[2 * i], y[2 * i + 1], 0x44),
                                                             _mm512_shuffle_ps(y[2 * i], y[2 * i + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], 0x88), _mm512_shuffle_ps(z[0], z[1], 0xDD));
}

/* Transposes the 16 x 16 block r (in place): four rounds, each swapping one
 * bit of the row index with the same bit of the column index. */
static inline void transpose16(__m512 *r) {
    UNROLL8 for (int s = 0; s < 4; s++) {
        const int bit = 1 << s;
        int lo[16], hi[16];
        for (int c = 0; c < 16; c++) {
            lo[c] = c & bit ? 16 + c - bit : c;
            hi[c] = c & bit ? 16 + c : c + bit;
        }
        const __m512i il = _mm512_loadu_si512(lo), ih = _mm512_loadu_si512(hi);
        UNROLL16 for (int i = 0; i < 16; i++) {
            if (i & bit)
                continue;
            const __m512 x = r[i], y = r[i + bit];
            r[i] = _mm512_permutex2var_ps(x, il, y);
            r[i + bit] = _mm512_permutex2var_ps(x, ih, y);
        }
    }
}

/* Rows [j, j + 16) of B (past n: the last row again), elements [l, l + 16)
 * (past k: zeros), as F32. */
static inline void load_b16(__m512 *r, const void *b, bool b_f16, int64_t ldb, int64_t j, int64_t nj, int64_t l,
                            int64_t k) {
    const __mmask16 ml = lanes16(k - l);
    UNROLL16 for (int t = 0; t < 16; t++) {
        const int64_t at = (j + (t < nj ? t : nj - 1)) * ldb + l;
        r[t] = b_f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(ml, (const uint16_t *)b + at))
                     : _mm512_maskz_loadu_ps(ml, (const float *)b + at);
    }
}

/* C[m x n] = A[m x k] * B^T for B n rows of k.
 *  - Few rows (m < NT_TILE_M): 16 rows of B at a time are packed (F16
 *    converted) as 16 x 16 floats per 16 of k, then per row of A 16
 *    accumulators of 16 lanes over k and one sum16x16.
 *  - Else 32 rows of B are packed transposed (k x 32, 16 x 16 blocks turned
 *    in registers) and gemm_tile runs on them: no lane sums, each B value
 *    loaded once per 8 rows of A.
 * Each result is summed in the same order whatever its place in the tile
 * and n (the order depends on k, and on m only through the choice above). */
#define NT_KMAX 128 /* k per pass: the pack (k x 32 floats, on the stack) stays at 16 KiB */
#define NT_TILE_M 8
static void gemm_f32_nt(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b, bool b_f16,
                        int64_t ldb, float *c, int64_t ldc) {
    _Alignas(64) float pk[NT_KMAX * 32];
    if (m >= NT_TILE_M) {
        for (int64_t j = 0; j < n; j += 32) {
            const int64_t nj = n - j < 32 ? n - j : 32;
            for (int64_t l0 = 0; l0 == 0 || l0 < k; l0 += NT_KMAX) { /* k > NT_KMAX: the rest added to C */
                const int64_t kc = k - l0 < NT_KMAX ? k - l0 : NT_KMAX;
                for (int h = 0; h < 2; h++)
                    for (int64_t l = 0; l < kc; l += 16) {
                        __m512 r[16];
                        load_b16(r, b, b_f16, ldb, nj > 16 * h ? j + 16 * h : j + nj - 1, /* past n: the last row */
                                 nj > 16 * h ? nj - 16 * h : 1, l0 + l, k);
                        transpose16(r);
                        UNROLL16 for (int d = 0; d < 16; d++) _mm512_store_ps(pk + (l + d) * 32 + 16 * h, r[d]);
                    }
                const float *al = a + l0;
                for (int64_t i = 0; i < m; i += 8) {
                    const float *ai = al + i * lda;
                    float *ci = c + i * ldc + j;
                    const bool acc = l0 > 0;
                    switch (m - i < 8 ? m - i : 8) {
                    case 1: gemm_tile(1, 2, nj, kc, ai, lda, pk, false, 32, ci, ldc, acc); break;
                    case 2: gemm_tile(2, 2, nj, kc, ai, lda, pk, false, 32, ci, ldc, acc); break;
                    case 3: gemm_tile(3, 2, nj, kc, ai, lda, pk, false, 32, ci, ldc, acc); break;
                    case 4: gemm_tile(4, 2, nj, kc, ai, lda, pk, false, 32, ci, ldc, acc); break;
                    case 5: gemm_tile(5, 2, nj, kc, ai, lda, pk, false, 32, ci, ldc, acc); break;
                    case 6: gemm_tile(6, 2, nj, kc, ai, lda, pk, false, 32, ci, ldc, acc); break;
                    case 7: gemm_tile(7, 2, nj, kc, ai, lda, pk, false, 32, ci, ldc, acc); break;
                    default: gemm_tile(8, 2, nj, kc, ai, lda, pk, false, 32, ci, ldc, acc); break;
                    }
                }
            }
        }
        return;
    }
    for (int64_t j = 0; j < n; j += 16) {
        const int64_t nj = n - j < 16 ? n - j : 16;
        for (int64_t l0 = 0; l0 == 0 || l0 < k; l0 += NT_KMAX) { /* k > NT_KMAX: partial sums in C */
            const int64_t kc = k - l0 < NT_KMAX ? k - l0 : NT_KMAX, nc = (kc + 15) / 16;
            for (int64_t q = 0; q < nc; q++) { /* keys in order (a steady stride per load) */
                const __mmask16 ml = lanes16(kc - 16 * q);
                float *dst = pk + q * 256;
                UNROLL16 for (int t = 0; t < 16; t++) { /* key t: accumulator (t % 4) * 4 + t / 4 (sum16x16's order) */
                    const int64_t at = (j + (t < nj ? t : nj - 1)) * ldb + l0 + 16 * q;
                    const __m512 v = b_f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(ml, (const uint16_t *)b + at))
                                           : _mm512_maskz_loadu_ps(ml, (const float *)b + at);
                    _mm512_store_ps(dst + ((t % 4) * 4 + t / 4) * 16, v);
                }
            }
            for (int64_t i = 0; i < m; i++) {
                const float *ai = a + i * lda + l0;
                __m512 acc[16];
                UNROLL16 for (int p = 0; p < 16; p++) acc[p] = _mm512_setzero_ps();
                for (int64_t q = 0; q < nc; q++) {
                    const __m512 av = _mm512_maskz_loadu_ps(lanes16(kc - 16 * q), ai + 16 * q);
                    const float *bq = pk + q * 256;
                    UNROLL16 for (int p = 0; p < 16; p++)
                        acc[p] = _mm512_fmadd_ps(av, _mm512_load_ps(bq + p * 16), acc[p]);
                }
                __m512 r = sum16x16(acc);
                if (l0 > 0)
                    r = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes16(nj), c + i * ldc + j), r);
                _mm512_mask_storeu_ps(c + i * ldc + j, lanes16(nj), r);
            }
        }
    }
}

/*
 * ---- F16: the batched matmul of F16 weights with AVX-512 FMA
 * (kernel table gemm[TSR_TYPE_F16]), against F32 activations (gemm_type:
 * matmul.c converts them once per call).
 *
 * A pass computes 4 weight rows x up to 6 activation columns: 24 16-lane
 * accumulators in registers over k in steps of 16; each step converts the 4
 * rows' 16 F16 values with VCVTPH2PS (used by the 6 columns) and loads the 6
 * columns' 16 floats (used by the 4 rows): 10 loads per 24 FMAs, FMA-bound.
 * A tail of k % 16 values is one more step with masked (zeroed) lanes.
 * Then each column's 4 accumulators are summed together by one transposing
 * tree (lanes i + 8, then i + 4, then pairs), so a horizontal sum costs
 * about a quarter of a full reduction; every result takes the same tree
 * whatever its row in the pass, and rows past m repeat the last row (their
 * sums are not stored), so a result does not depend on its place in the
 * tile (test-cpu-kernels checks it bit for bit against 1 x 1 calls).
 */
#define GEMM_RM 4 /* weight rows per pass */
#define GEMM_RN 6 /* activation columns per pass */

/* GCC -O2 keeps small loops over register arrays as loops, the arrays on the stack. */
#define UNROLL _Pragma("GCC unroll 8")

/* The sums of the 16 lanes of a0..a3, in this order in 4 lanes. */
static inline __m128 hsum4x16(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    /* lanes i + (i + 8): quarters 0-1 of a0 (a2), 2-3 of a1 (a3) */
    const __m512 t01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_f32x4(a0, a1, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 t23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_f32x4(a2, a3, _MM_SHUFFLE(3, 2, 3, 2)));
    /* partials i + (i + 4): quarter r holds a_r's four */
    __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(t01, t23, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(t01, t23, _MM_SHUFFLE(3, 1, 3, 1)));
    /* (0 + 1) + (2 + 3) within each quarter, into its lane 0 */
    u = _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(2, 3, 0, 1)));
    u = _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm512_castps512_ps128(
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), u));
}

/* One pass: rows x[0..3] (rows past m repeat the last), columns y + c * ys
 * for c < rn; the first m (<= 4) sums of column c stored at s + c * ss. */
static inline __attribute__((always_inline)) void gemm_pass(int rn, int m, int64_t k, const char *x, size_t xs,
                                                            const char *y, size_t ys, float *s, size_t ss) {
    const uint16_t *xr[GEMM_RM];
    const float *yc[GEMM_RN];
    UNROLL
    for (int r = 0; r < GEMM_RM; r++) xr[r] = (const uint16_t *)(x + (size_t)(r < m ? r : m - 1) * xs);
    UNROLL
    for (int c = 0; c < rn; c++) yc[c] = (const float *)(y + (size_t)c * ys);
    __m512 acc[GEMM_RM][GEMM_RN];
    UNROLL
    for (int r = 0; r < GEMM_RM; r++) {
        UNROLL
        for (int c = 0; c < rn; c++) acc[r][c] = _mm512_setzero_ps();
    }
    int64_t l = 0;
    for (; l + 16 <= k; l += 16) {
        __m512 yv[GEMM_RN];
        UNROLL
        for (int c = 0; c < rn; c++) yv[c] = _mm512_loadu_ps(yc[c] + l);
        UNROLL
        for (int r = 0; r < GEMM_RM; r++) {
            const __m512 xv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(xr[r] + l)));
            UNROLL
            for (int c = 0; c < rn; c++) acc[r][c] = _mm512_fmadd_ps(xv, yv[c], acc[r][c]);
        }
    }
    if (l < k) { /* the tail: lanes past k are 0 x 0 */
        const __mmask16 t = (__mmask16)((1u << (k - l)) - 1);
        __m512 yv[GEMM_RN];
        UNROLL
        for (int c = 0; c < rn; c++) yv[c] = _mm512_maskz_loadu_ps(t, yc[c] + l);
        UNROLL
        for (int r = 0; r < GEMM_RM; r++) {
            const __m512 xv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(t, xr[r] + l));
            UNROLL
            for (int c = 0; c < rn; c++) acc[r][c] = _mm512_fmadd_ps(xv, yv[c], acc[r][c]);
        }
    }
    const __mmask8 rows = (__mmask8)((1u << m) - 1);
    UNROLL
    for (int c = 0; c < rn; c++)
        _mm_mask_storeu_ps(s + (size_t)c * ss, rows, hsum4x16(acc[0][c], acc[1][c], acc[2][c], acc[3][c]));
}

static void gemm_f16(int64_t k, int64_t m, int64_t n, const void *vx, size_t xs, const void *vy, size_t ys, float *s,
                     size_t ss, void *scratch) {
    (void)scratch;
    /* columns outside: a pass's 6 activation rows stay in L1 while the
     * (half as large) F16 weight rows of the call stream past them */
    for (int64_t j = 0; j < n; j += GEMM_RN) {
        const char *y = (const char *)vy + (size_t)j * ys;
        const int rn = n - j < GEMM_RN ? (int)(n - j) : GEMM_RN;
        for (int64_t i = 0; i < m; i += GEMM_RM) {
            const char *x = (const char *)vx + (size_t)i * xs;
            float *o = s + (size_t)j * ss + (size_t)i;
            const int rm = m - i < GEMM_RM ? (int)(m - i) : GEMM_RM;
            switch (rn) { /* constant column counts: the accumulators stay in registers */
            case 6: gemm_pass(6, rm, k, x, xs, y, ys, o, ss); break;
            case 5: gemm_pass(5, rm, k, x, xs, y, ys, o, ss); break;
            case 4: gemm_pass(4, rm, k, x, xs, y, ys, o, ss); break;
            case 3: gemm_pass(3, rm, k, x, xs, y, ys, o, ss); break;
            case 2: gemm_pass(2, rm, k, x, xs, y, ys, o, ss); break;
            default: gemm_pass(1, rm, k, x, xs, y, ys, o, ss); break;
            }
        }
    }
}

void tsr__cpu_avx512_gemm(tsr_cpu_kernels *k, bool vnni) {
    k->gemm[TSR_TYPE_F16] = gemm_f16;
    k->gemm_type[TSR_TYPE_F16] = TSR_TYPE_F32;
    k->gemm_f32 = gemm_f32;
    k->gemm_f32_nt = gemm_f32_nt;
    if (!vnni)
        return;
    static const struct {
        tsr_type t;
        void (*fn)(int64_t, int64_t, int64_t, const void *, size_t, const void *, size_t, float *, size_t, void *);
    } g[] = {{TSR_TYPE_Q8_0, gemm_q8_0}, {TSR_TYPE_Q4_0, gemm_q4_0}, {TSR_TYPE_Q5_0, gemm_q5_0},
             {TSR_TYPE_Q4_1, gemm_q4_1}, {TSR_TYPE_Q5_1, gemm_q5_1}, {TSR_TYPE_Q4_K, gemm_q4_k},
             {TSR_TYPE_Q5_K, gemm_q5_k}, {TSR_TYPE_Q6_K, gemm_q6_k}};
    k->q8s_from_float = q8s_from_float;
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) tsr__cpu_set_q8s_gemm(k, g[i].t, g[i].fn);
    /* The interleaved layout's (decode reads it with avx2/gemv.c's gemv_il8).
     * Not Q8_0's: this folder's gemv reads its stored layout faster (bench/gemv,
     * Zen 4, one thread: 82% of the read bandwidth, interleaved 70%). */
    k->gemv_il8[TSR_TYPE_Q8_0] = NULL;
    k->gemm_il8[TSR_TYPE_Q8_0] = NULL;
    k->gemm_il8[TSR_TYPE_Q4_0] = gemm_q4_0_il8;
    k->gemm_il8[TSR_TYPE_Q4_1] = gemm_q4_1_il8;
    k->gemm_il8[TSR_TYPE_Q5_0] = gemm_q5_0_il8;
    k->gemm_il8[TSR_TYPE_Q4_K] = gemm_q4_k_il8;
    k->gemm_il8[TSR_TYPE_Q5_K] = gemm_q5_k_il8;
    k->gemm1[TSR_TYPE_Q8_0] = one_q8_0;
    k->gemm1[TSR_TYPE_Q6_K] = one_q6_k;
    k->gemm1_il8[TSR_TYPE_Q4_0] = one_q4_0_il8;
    k->gemm1_il8[TSR_TYPE_Q4_1] = one_q4_1_il8;
    k->gemm1_il8[TSR_TYPE_Q5_0] = one_q5_0_il8;
    k->gemm1_il8[TSR_TYPE_Q4_K] = one_q4_k_il8;
    k->gemm1_il8[TSR_TYPE_Q5_K] = one_q5_k_il8;
}
