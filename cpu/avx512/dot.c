/*
 * vec-avx512.c - AVX-512 (F+BW+VL) variants of the float dot products and,
 * with VNNI, of the 8-bit dot products (two 32-element blocks per 512-bit
 * VPDPBUSD). Built with AVX-512 flags; used only when the CPU has them.
 * Anything not here keeps its AVX2 version.
 */
#include "../cpu.h"
#include "../simd.h"

#include <math.h>
#include <stdlib.h>

static inline float hsum512(__m512 v) { return _mm512_reduce_add_ps(v); }

static void dot_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), _mm512_loadu_ps(y + i + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), _mm512_loadu_ps(y + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), a0);
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i), a1);
    }
    *s = hsum512(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

static inline __m512 load_fp16x16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* F16 weights x F16 activations (rounded once per call, as in ggml), summed
 * like ggml's ggml_vec_dot_f16 (see the AVX2 variant); the tail is masked,
 * i.e. zero-padded to 64. */
static void dot_f16_f16(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) /* whole chunks: plain loads */
        for (int q = 0; q < 4; q++)
            a[q] = _mm512_fmadd_ps(load_fp16x16(x + i + 16 * q), load_fp16x16(y + i + 16 * q), a[q]);
    for (; i < n; i += 64)
        for (int q = 0; q < 4; q++) {
            const int64_t o = i + 16 * q, left = n - o;
            const __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
            const __m512 xv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + (left > 0 ? o : 0)));
            const __m512 yv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, y + (left > 0 ? o : 0)));
            a[q] = _mm512_fmadd_ps(xv, yv, a[q]);
        }
    a[0] = _mm512_add_ps(a[0], a[2]);
    a[1] = _mm512_add_ps(a[1], a[3]);
    *s = hsum512(_mm512_add_ps(a[0], a[1]));
}

/* The one-column matmul for F16 weights (kernel table gemv): R rows at a
 * time share each converted activation vector; each row keeps the dot's
 * four accumulators and order (bit for bit dot_f16_f16), and the rows are
 * prefetched GEMV_PF rows ahead (rows read one after another reach about
 * 20 GB/s from DRAM on one thread, the rows' lines requested ahead more). */
#define UNROLL4 _Pragma("GCC unroll 4")
static inline __attribute__((always_inline)) void f16_rows(int R, int64_t n, const char *x, size_t xs, size_t pfo,
                                                           const uint16_t *y, float *s) {
    __m512 a[4][4];
    UNROLL4 for (int r = 0; r < R; r++) UNROLL4 for (int q = 0; q < 4; q++) a[r][q] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512 yv[4];
        UNROLL4 for (int q = 0; q < 4; q++) yv[q] = load_fp16x16(y + i + 16 * q);
        UNROLL4 for (int r = 0; r < R; r++) {
            const uint16_t *xr = (const uint16_t *)(x + (size_t)r * xs) + i;
            if (pfo) {
                _mm_prefetch((const char *)xr + pfo, _MM_HINT_T1);
                _mm_prefetch((const char *)xr + pfo + 64, _MM_HINT_T1);
            }
            UNROLL4 for (int q = 0; q < 4; q++) a[r][q] = _mm512_fmadd_ps(load_fp16x16(xr + 16 * q), yv[q], a[r][q]);
        }
    }
    if (i < n) /* the dot's masked tail */
        UNROLL4 for (int q = 0; q < 4; q++) {
            const int64_t o = i + 16 * q, left = n - o;
            const __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
            const __m512 yv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, y + (left > 0 ? o : 0)));
            UNROLL4 for (int r = 0; r < R; r++) {
                const uint16_t *xr = (const uint16_t *)(x + (size_t)r * xs);
                if (pfo && q % 2 == 0 && left > 0)
                    _mm_prefetch((const char *)(xr + o) + pfo, _MM_HINT_T1);
                const __m512 xv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, xr + (left > 0 ? o : 0)));
                a[r][q] = _mm512_fmadd_ps(xv, yv, a[r][q]);
            }
        }
    UNROLL4 for (int r = 0; r < R; r++) {
        a[r][0] = _mm512_add_ps(a[r][0], a[r][2]);
        a[r][1] = _mm512_add_ps(a[r][1], a[r][3]);
        s[r] = hsum512(_mm512_add_ps(a[r][0], a[r][1]));
    }
}

static void gemv_f16(int64_t k, int64_t m, int64_t ahead, const void *vx, size_t xs, const void *vy, float *s) {
    const char *x = vx;
    const int64_t n = m + (ahead > 0 ? ahead : 0);
    ramp(x, m, xs);
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) f16_rows(4, k, x + (size_t)i * xs, xs, pf_offset(i, 4, n, xs), vy, s + i);
    for (; i < m; i++) f16_rows(1, k, x + (size_t)i * xs, xs, pf_offset(i, 1, n, xs), vy, s + i);
}

#define YROW(T, c) ((const T *)((const char *)vy + (c) * (ystride)))

/* Two 32-byte blocks side by side in one 512-bit vector. */
static inline __m512i pair(const void *a, const void *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}
static inline __m512i pair_nibbles(const uint8_t *a, const uint8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(nibbles32(a)), nibbles32(b), 1);
}
/* sum of x*y for signed bytes: |x| * (y with x's sign) through VPDPBUSD. */
static inline __m512i dot_s8s8_512(__m512i x, __m512i y) {
    const __m512i sy = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), _mm512_setzero_si512(), y);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(x), sy);
}

/* The 8-bit dots below compute the integer sums of two blocks at once in a
 * 512-bit vector, then apply the per-block scales to ONE 256-bit
 * accumulator block after block, exactly as ggml's AVX2 kernels (and
 * tinyBLAS's Q0 kernels) do: same bits as llama.cpp, about half the integer
 * work. A last odd block goes through 256-bit VPDPBUSD. */
static inline __m256 fma_pair(__m256 acc, float d0, float d1, __m512i p) {
    const __m512 f = _mm512_cvtepi32_ps(p);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm512_castps512_ps256(f), acc);
    return _mm256_fmadd_ps(_mm256_set1_ps(d1), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)), acc);
}
static inline __m256 fma_one(__m256 acc, float d, __m256i p) {
    return _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
}
static inline __m256i dot_s8s8_256(__m256i x, __m256i y) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(x), _mm256_sign_epi8(y, x));
}
static inline __m256i dot_u8s8_256(__m256i u, __m256i y) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, y); }
static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
#define F16F(h) TSR_FP16_TO_FP32(h)

/* sum (q - 8) * y = sum q * y - sum 8 * y: both unsigned x signed */
static inline __m512i dot_q4_0_pair(__m512i ux, __m512i qy) {
    return _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ux, qy),
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), qy));
}
static inline __m256i dot_q4_0_one(const uint8_t *qs, const int8_t *yq) {
    return dot_s8s8_256(_mm256_sub_epi8(nibbles32(qs), _mm256_set1_epi8(8)), load256(yq));
}

static void dot_q8_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q8_0 *x = vx, *y = vy;
    const int64_t nb = n / 32;
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2)
        acc = fma_pair(acc, F16F(x[i].d) * F16F(y[i].d), F16F(x[i + 1].d) * F16F(y[i + 1].d),
                       dot_s8s8_512(pair(x[i].qs, x[i + 1].qs), pair(y[i].qs, y[i + 1].qs)));
    if (i < nb)
        acc = fma_one(acc, F16F(x[i].d) * F16F(y[i].d), dot_s8s8_256(load256(x[i].qs), load256(y[i].qs)));
    *s = hsum_ps256(acc);
}

static void dot_q4_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q4_0 *x = vx;
    const tsr_block_q8_0 *y = vy;
    const int64_t nb = n / 32;
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2)
        acc = fma_pair(acc, F16F(x[i].d) * F16F(y[i].d), F16F(x[i + 1].d) * F16F(y[i + 1].d),
                       dot_q4_0_pair(pair_nibbles(x[i].qs, x[i + 1].qs), pair(y[i].qs, y[i + 1].qs)));
    if (i < nb)
        acc = fma_one(acc, F16F(x[i].d) * F16F(y[i].d), dot_q4_0_one(x[i].qs, y[i].qs));
    *s = hsum_ps256(acc);
}

static void dot_q4_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q4_1 *x = vx;
    const tsr_block_q8_1 *y = vy;
    const int64_t nb = n / 32;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        summs += F16F(x[i].m) * F16F(y[i].s); /* one block at a time (ggml's order) */
        summs += F16F(x[i + 1].m) * F16F(y[i + 1].s);
        acc = fma_pair(acc, F16F(x[i].d) * F16F(y[i].d), F16F(x[i + 1].d) * F16F(y[i + 1].d),
                       _mm512_dpbusd_epi32(_mm512_setzero_si512(), pair_nibbles(x[i].qs, x[i + 1].qs),
                                           pair(y[i].qs, y[i + 1].qs)));
    }
    if (i < nb) {
        summs += F16F(x[i].m) * F16F(y[i].s);
        acc = fma_one(acc, F16F(x[i].d) * F16F(y[i].d), dot_u8s8_256(nibbles32(x[i].qs), load256(y[i].qs)));
    }
    *s = hsum_ps256(acc) + summs;
}

/* Four activation rows against one weight row (same order per row). */
static void dot4_q8_0(int64_t n, float s[4], const void *vx, const void *vy, size_t ystride) {
    const tsr_block_q8_0 *x = vx;
    const int64_t nb = n / 32;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i qx = pair(x[i].qs, x[i + 1].qs), ax = _mm512_abs_epi8(qx);
        const __mmask64 neg = _mm512_movepi8_mask(qx);
        const float d0 = F16F(x[i].d), d1 = F16F(x[i + 1].d);
        for (int c = 0; c < 4; c++) {
            const tsr_block_q8_0 *y = YROW(tsr_block_q8_0, c);
            const __m512i qy = pair(y[i].qs, y[i + 1].qs);
            const __m512i sy = _mm512_mask_sub_epi8(qy, neg, _mm512_setzero_si512(), qy);
            acc[c] = fma_pair(acc[c], d0 * F16F(y[i].d), d1 * F16F(y[i + 1].d),
                              _mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, sy));
        }
    }
    for (int c = 0; c < 4; c++) {
        const tsr_block_q8_0 *y = YROW(tsr_block_q8_0, c);
        if (i < nb)
            acc[c] = fma_one(acc[c], F16F(x[i].d) * F16F(y[i].d), dot_s8s8_256(load256(x[i].qs), load256(y[i].qs)));
        s[c] = hsum_ps256(acc[c]);
    }
}

static void dot4_q4_0(int64_t n, float s[4], const void *vx, const void *vy, size_t ystride) {
    const tsr_block_q4_0 *x = vx;
    const int64_t nb = n / 32;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i ux = pair_nibbles(x[i].qs, x[i + 1].qs);
        const float d0 = F16F(x[i].d), d1 = F16F(x[i + 1].d);
        for (int c = 0; c < 4; c++) {
            const tsr_block_q8_0 *y = YROW(tsr_block_q8_0, c);
            acc[c] = fma_pair(acc[c], d0 * F16F(y[i].d), d1 * F16F(y[i + 1].d),
                              dot_q4_0_pair(ux, pair(y[i].qs, y[i + 1].qs)));
        }
    }
    for (int c = 0; c < 4; c++) {
        const tsr_block_q8_0 *y = YROW(tsr_block_q8_0, c);
        if (i < nb)
            acc[c] = fma_one(acc[c], F16F(x[i].d) * F16F(y[i].d), dot_q4_0_one(x[i].qs, y[i].qs));
        s[c] = hsum_ps256(acc[c]);
    }
}

static void dot4_q4_1(int64_t n, float s[4], const void *vx, const void *vy, size_t ystride) {
    const tsr_block_q4_1 *x = vx;
    const int64_t nb = n / 32;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float summs[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i ux = pair_nibbles(x[i].qs, x[i + 1].qs);
        const float d0 = F16F(x[i].d), d1 = F16F(x[i + 1].d);
        const float m0 = F16F(x[i].m), m1 = F16F(x[i + 1].m);
        for (int c = 0; c < 4; c++) {
            const tsr_block_q8_1 *y = YROW(tsr_block_q8_1, c);
            summs[c] += m0 * F16F(y[i].s);
            summs[c] += m1 * F16F(y[i + 1].s);
            acc[c] = fma_pair(acc[c], d0 * F16F(y[i].d), d1 * F16F(y[i + 1].d),
                              _mm512_dpbusd_epi32(_mm512_setzero_si512(), ux, pair(y[i].qs, y[i + 1].qs)));
        }
    }
    for (int c = 0; c < 4; c++) {
        const tsr_block_q8_1 *y = YROW(tsr_block_q8_1, c);
        if (i < nb) {
            summs[c] += F16F(x[i].m) * F16F(y[i].s);
            acc[c] = fma_one(acc[c], F16F(x[i].d) * F16F(y[i].d), dot_u8s8_256(nibbles32(x[i].qs), load256(y[i].qs)));
        }
        s[c] = hsum_ps256(acc[c]) + summs[c];
    }
}

/* ---- fused attention blocks ------------------------------------------------- */

static inline __mmask16 lanes16(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

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

/* e^x for 16 floats, as ggml's AVX-512 ggml_v_expf (its last step scales by
 * 2^n with VSCALEFPS, which rounds differently from the AVX2 variant's
 * k + k*j): the softmax and SiLU of llama.cpp on AVX-512 machines. */
static inline __m512 exp16(__m512 x) {
    const __m512 r = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
    const __m512 n = _mm512_sub_ps(z, r);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                      _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __mmask16 d = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192), _CMP_GT_OQ);
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                        _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
        u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
    const __m512 res = _mm512_scalef_ps(j, n);
    if (!d)
        return res;
    const __m512 alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ),
                                            _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    return _mm512_mask_blend_ps(d, res, alt);
}

/* The online softmax step (see cpu.h) of a row; up to 64 scores stay in
 * registers between the max and the exps. */
static float softmax_step(int64_t n, float *y, float scale, const float *mask, float *m, float slack) {
    const __m512 s = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    if (n > 64) { /* two passes through y */
        __m512 mx = ninf;
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 k = lanes16(n - i);
            __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, y + i), s);
            if (mask)
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, mask + i));
            _mm512_mask_storeu_ps(y + i, k, v);
            mx = _mm512_mask_max_ps(mx, k, mx, v);
        }
        const float x = _mm512_reduce_max_ps(mx);
        if (!tsr__cpu_softmax_max(x, y, n, m, slack))
            return 0;
        const __m512 mv = _mm512_set1_ps(*m);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 k = lanes16(n - i);
            const __m512 e = exp16(_mm512_sub_ps(_mm512_mask_loadu_ps(ninf, k, y + i), mv));
            _mm512_mask_storeu_ps(y + i, k, e);
            acc = _mm512_add_ps(acc, e);
        }
        return _mm512_reduce_add_ps(acc);
    }
    __m512 v[4], mx = ninf;
    UNROLL8 for (int q = 0; q < 4; q++) { /* lanes past n: -inf */
        const __mmask16 k = lanes16(n - 16 * q > 0 ? n - 16 * q : 0);
        v[q] = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, y + 16 * q), s);
        if (mask)
            v[q] = _mm512_add_ps(v[q], _mm512_maskz_loadu_ps(k, mask + 16 * q));
        v[q] = _mm512_mask_mov_ps(ninf, k, v[q]);
        mx = _mm512_max_ps(mx, v[q]);
    }
    const float x = _mm512_reduce_max_ps(mx);
    if (!tsr__cpu_softmax_max(x, y, n, m, slack))
        return 0;
    const __m512 mv = _mm512_set1_ps(*m);
    __m512 acc = _mm512_setzero_ps();
    UNROLL8 for (int q = 0; q < 4; q++) {
        const __mmask16 k = lanes16(n - 16 * q > 0 ? n - 16 * q : 0);
        const __m512 e = exp16(_mm512_sub_ps(v[q], mv));
        _mm512_mask_storeu_ps(y + 16 * q, k, e);
        acc = _mm512_add_ps(acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}

/* y = silu(x) * g (g NULL: silu), as ggml_vec_swiglu_f32 / ggml_v_silu. */
static void silu_mul(int64_t n, float *y, const float *x, const float *g) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = lanes16(n - i);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512 r = _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), v))));
        if (g)
            r = _mm512_mul_ps(r, _mm512_maskz_loadu_ps(m, g + i));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

/* y = gelu(x) * g as the AVX2 variant's: x / (1 + exp(-2u)). */
static void gelu_mul(int64_t n, float *y, const float *x, const float *g) {
    const __m512 c2 = _mm512_set1_ps(-2.0f * TSR_GELU_C), a = _mm512_set1_ps(0.044715f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = lanes16(n - i);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        const __m512 t = _mm512_mul_ps(c2, _mm512_fmadd_ps(_mm512_mul_ps(a, v), _mm512_mul_ps(v, v), v));
        __m512 r = _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(t)));
        if (g)
            r = _mm512_mul_ps(r, _mm512_maskz_loadu_ps(m, g + i));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

/* Softmax exps as ggml_vec_soft_max_f32 on AVX-512: each 16 summed by
 * _mm512_reduce_add_ps in float, the group sums in double; a tail is padded
 * with -inf (llama.cpp's KV rows have none). */
static double exp_sum(int64_t n, float *y, float max) {
    const __m512 mx = _mm512_set1_ps(max);
    double sum = 0;
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = lanes16(n - i);
        const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, y + i);
        const __m512 e = exp16(_mm512_sub_ps(v, mx));
        _mm512_mask_storeu_ps(y + i, m, e);
        sum += (double)_mm512_reduce_add_ps(e);
    }
    return sum;
}

/* y = vop(x, g), 32 at a time, the tail masked. */
#define ROW_OP(name, vop)                                                                                           \
    static void name(int64_t n, float *y, const float *x, const float *g) {                                         \
        int64_t i = 0;                                                                                              \
        for (; i + 32 <= n; i += 32) {                                                                              \
            const __m512 a = vop(_mm512_loadu_ps(x + i), _mm512_loadu_ps(g + i));                                   \
            const __m512 b = vop(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(g + i + 16));                         \
            _mm512_storeu_ps(y + i, a);                                                                             \
            _mm512_storeu_ps(y + i + 16, b);                                                                        \
        }                                                                                                           \
        for (; i < n; i += 16) {                                                                                    \
            const __mmask16 m = lanes16(n - i);                                                                     \
            _mm512_mask_storeu_ps(y + i, m, vop(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, g + i))); \
        }                                                                                                           \
    }
ROW_OP(add, _mm512_add_ps)
ROW_OP(mul, _mm512_mul_ps)

/* The squares in float, summed in double (8 lanes each of two accumulators),
 * the mean and the scale in float as the reference. */
static void rms_norm(int64_t n, float *y, const float *x, float eps) {
    __m512d s0 = _mm512_setzero_pd(), s1 = s0;
    for (int64_t i = 0; i < n; i += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(lanes16(n - i), x + i);
        const __m512 q = _mm512_mul_ps(v, v);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(q)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(q), 1))));
    }
    const double sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    const __m512 scale = _mm512_set1_ps(1.0f / sqrtf((n ? (float)(sum / n) : 0.0f) + eps));
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = lanes16(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), scale));
    }
}

/* The rope rotation (cpu.h), 8 pairs per step (16, neox), the reference's
 * fused multiply-adds: adjacent pairs take x0 (even lanes duplicated) times
 * cs as stored, plus or minus x1 times cs with each pair swapped. */
static void rope(int64_t n_dims, bool neox, float *y, const float *x, const float *cs) {
    if (!neox) {
        const __m512i sign = _mm512_set4_epi32(0, (int)0x80000000u, 0, (int)0x80000000u);
        for (int64_t i = 0; i < n_dims; i += 16) {
            const __mmask16 m = lanes16(n_dims - i);
            const __m512 v = _mm512_maskz_loadu_ps(m, x + i), c = _mm512_maskz_loadu_ps(m, cs + i);
            const __m512 p = _mm512_castsi512_ps(_mm512_xor_si512(
                _mm512_castps_si512(_mm512_mul_ps(_mm512_movehdup_ps(v), _mm512_permute_ps(c, 0xB1))), sign));
            _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(_mm512_moveldup_ps(v), c, p));
        }
        return;
    }
    const int64_t h = n_dims / 2;
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    for (int64_t i = 0; i < h; i += 16) {
        const __mmask16 m = lanes16(h - i);
        const __mmask16 mlo = lanes16(2 * (h - i)), mhi = lanes16(2 * (h - i) > 16 ? 2 * (h - i) - 16 : 0);
        const __m512 a = _mm512_maskz_loadu_ps(mlo, cs + 2 * i), b = _mm512_maskz_loadu_ps(mhi, cs + 2 * i + 16);
        const __m512 c = _mm512_permutex2var_ps(a, ev, b), s = _mm512_permutex2var_ps(a, od, b);
        const __m512 x0 = _mm512_maskz_loadu_ps(m, x + i), x1 = _mm512_maskz_loadu_ps(m, x + h + i);
        const __m512 y0 = _mm512_fmsub_ps(x0, c, _mm512_mul_ps(x1, s));
        const __m512 y1 = _mm512_fmadd_ps(x0, s, _mm512_mul_ps(x1, c));
        _mm512_mask_storeu_ps(y + i, m, y0);
        _mm512_mask_storeu_ps(y + h + i, m, y1);
    }
}

void tsr__cpu_kernels_avx512(tsr_cpu_kernels *k, bool vnni) {
    k->name = vnni ? "avx512_vnni" : "avx512";
    k->vec_dot[TSR_TYPE_F32] = dot_f32;
    k->vec_dot[TSR_TYPE_F16] = dot_f16_f16;
    k->gemv[TSR_TYPE_F16] = gemv_f16;
    k->exp_sum = exp_sum;
    k->silu_mul = silu_mul;
    k->gelu_mul = gelu_mul;
    k->add = add;
    k->mul = mul;
    k->rms_norm = rms_norm;
    k->rope = rope;
    tsr__cpu_gemm_f16_avx512(k);
    k->gemm_f32 = gemm_f32;
    k->gemm_f32_nt = gemm_f32_nt;
    k->softmax_step = softmax_step;
    /* the paired 8-bit dots need VPDPBUSD; they sum in ggml's AVX2 order */
    if (!vnni)
        return;
    k->vec_dot[TSR_TYPE_Q8_0] = dot_q8_0_q8_0;
    k->vec_dot[TSR_TYPE_Q4_0] = dot_q4_0_q8_0;
    k->vec_dot[TSR_TYPE_Q4_1] = dot_q4_1_q8_1;
    k->vec_dot4[TSR_TYPE_Q8_0] = dot4_q8_0;
    /* (batches: the VPDPBUSD gemms of gemm-avx512.c, registered after these;
     * the four-column dots serve mul_mat_id) */
    k->vec_dot4[TSR_TYPE_Q4_0] = dot4_q4_0;
    k->vec_dot4[TSR_TYPE_Q4_1] = dot4_q4_1;
}
