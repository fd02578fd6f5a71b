/*
 * gemm-f16-avx512.c - the batched matmul of F16 weights with AVX-512 FMA
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
#include "../cpu.h"

#include <immintrin.h>

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

void tsr__cpu_gemm_f16_avx512(tsr_cpu_kernels *k) {
    k->gemm[TSR_TYPE_F16] = gemm_f16;
    k->gemm_type[TSR_TYPE_F16] = TSR_TYPE_F32;
}
