/*
 * gemm-avx512.c - the batched matmul of the quantized types with VPDPBUSD
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
    for (int64_t b = 0; b < nb; b++) {
        __m256i r[16], v[8];
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

static inline __attribute__((always_inline)) void gemm16(tsr_type t, int64_t k, int64_t m, int64_t n, const void *vx,
                                                         size_t xs, const void *vy, size_t ys, float *s, size_t ss,
                                                         void *scratch) {
    const int64_t nb = k / 32;
    il16 *xb = (il16 *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    const il_mode mode = il_mode_of(t);
    int64_t i = 0;
    if (mode != IL_Q6) /* 32 rows at a time */
        for (; i + 32 <= m; i += 32) {
            il16_pack(t, (const char *)vx + (size_t)i * xs, xs, 16, nb, xb);
            il16_pack(t, (const char *)vx + (size_t)(i + 16) * xs, xs, 16, nb, xb + nb);
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
        gemm16(T, k, m, n, x, xs, y, ys, s, ss, scratch);                                                           \
    }
GEMM16(gemm_q8_0, TSR_TYPE_Q8_0)
GEMM16(gemm_q4_0, TSR_TYPE_Q4_0)
GEMM16(gemm_q5_0, TSR_TYPE_Q5_0)
GEMM16(gemm_q4_1, TSR_TYPE_Q4_1)
GEMM16(gemm_q5_1, TSR_TYPE_Q5_1)
GEMM16(gemm_q4_k, TSR_TYPE_Q4_K)
GEMM16(gemm_q5_k, TSR_TYPE_Q5_K)
GEMM16(gemm_q6_k, TSR_TYPE_Q6_K)

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

void tsr__cpu_gemm_avx512_vnni(tsr_cpu_kernels *k) {
    static const struct {
        tsr_type t;
        void (*fn)(int64_t, int64_t, int64_t, const void *, size_t, const void *, size_t, float *, size_t, void *);
    } g[] = {{TSR_TYPE_Q8_0, gemm_q8_0}, {TSR_TYPE_Q4_0, gemm_q4_0}, {TSR_TYPE_Q5_0, gemm_q5_0},
             {TSR_TYPE_Q4_1, gemm_q4_1}, {TSR_TYPE_Q5_1, gemm_q5_1}, {TSR_TYPE_Q4_K, gemm_q4_k},
             {TSR_TYPE_Q5_K, gemm_q5_k}, {TSR_TYPE_Q6_K, gemm_q6_k}};
    k->q8s_from_float = q8s_from_float;
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) tsr__cpu_set_q8s_gemm(k, g[i].t, g[i].fn);
}
