/*
 * test-cpu-kernels.c - the CPU backend's kernel variants against their
 * references: every dot product of every variant this CPU can run
 * (scalar, avx2, avx512) against a double-precision dot of the
 * dequantized rows, the activation quantizers against the reference
 * quantizers, and the threadpool's barrier under many short jobs.
 * Links the static library (internal functions).
 */
#include "internal.h"
#include "tsrtest.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1p-53) * 2.0f - 1.0f;
}

static const tsr_type dot_types[] = {TSR_TYPE_F32,  TSR_TYPE_F16,  TSR_TYPE_BF16, TSR_TYPE_Q4_0,
                                     TSR_TYPE_Q4_1, TSR_TYPE_Q5_0, TSR_TYPE_Q5_1, TSR_TYPE_Q8_0,
                                     TSR_TYPE_Q4_K, TSR_TYPE_Q5_K, TSR_TYPE_Q6_K};

/* One variant: each weight type's dot product of n elements, compared with
 * a double dot of the dequantized weight row and dequantized activations. */
static void check_variant(const tsr_cpu_kernels *k, int64_t n) {
    float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4), *xd = malloc((size_t)n * 4),
          *yd = malloc((size_t)n * 4);
    void *qx = malloc((size_t)n * 4 + 64), *qy = malloc((size_t)n * 4 + 64);
    for (int64_t i = 0; i < n; i++) {
        x[i] = frand();
        y[i] = frand() * 3.0f;
    }
    for (size_t t = 0; t < sizeof dot_types / sizeof dot_types[0]; t++) {
        const tsr_type wt = dot_types[t], dt = k->dot_type[wt];
        if (n % tsr_type_block_size(wt) || !k->vec_dot[wt])
            continue;
        tsr__type_traits(wt)->from_float(x, qx, n);
        tsr__type_traits(wt)->to_float(qx, xd, n);
        k->from_float[dt](y, qy, n);
        tsr__type_traits(dt)->to_float(qy, yd, n);
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < n; i++) {
            ref += (double)xd[i] * yd[i];
            mag += fabs((double)xd[i] * yd[i]);
        }
        float got = -1;
        k->vec_dot[wt](n, &got, qx, qy);
        /* Q8_1's stored sum is rounded to half: allow for it */
        const double tol = 1e-5 * mag + (dt == TSR_TYPE_Q8_1 ? 2e-3 * mag / sqrt((double)n + 1) : 0) + 1e-6;
        CHECK(fabs(got - ref) <= tol, "%s %s n=%lld: dot %.7g, reference %.7g (tol %.3g)", k->name, tsr_type_name(wt),
              (long long)n, got, ref, tol);
        if (k->vec_dot4[wt]) { /* four columns at once = four single dots */
            const size_t rb = tsr_row_size(dt, n);
            unsigned char *y4 = malloc(4 * rb + 64);
            float *tmp = malloc((size_t)n * 4 + 4), s4[4];
            for (int c = 0; c < 4; c++) {
                for (int64_t i = 0; i < n; i++) tmp[i] = y[(i + 7 * c) % n] * (c + 1);
                k->from_float[dt](tmp, y4 + c * rb, n);
            }
            k->vec_dot4[wt](n, s4, qx, y4, rb);
            for (int c = 0; c < 4; c++) {
                float one;
                k->vec_dot[wt](n, &one, qx, y4 + c * rb);
                CHECK(fabs(s4[c] - one) <= 1e-5 * (fabs(one) + mag * (c + 1)) + 1e-6,
                      "%s %s n=%lld: dot4 column %d %.7g, single %.7g", k->name, tsr_type_name(wt), (long long)n, c,
                      s4[c], one);
            }
            free(y4);
            free(tmp);
        }
    }
    /* activation quantizers agree with the reference within one step */
    for (int q = 0; q < 3; q++) {
        const tsr_type at = q == 0 ? TSR_TYPE_Q8_0 : q == 1 ? TSR_TYPE_Q8_1 : TSR_TYPE_F16;
        if (n % 32)
            continue;
        k->from_float[at](y, qx, n);
        tsr__type_traits(at)->from_float(y, qy, n);
        tsr__type_traits(at)->to_float(qx, xd, n);
        tsr__type_traits(at)->to_float(qy, yd, n);
        double e = 0;
        for (int64_t i = 0; i < n; i++) e = fmax(e, fabs((double)xd[i] - yd[i]));
        CHECK(e <= 3.0 / 127 + 1e-6, "%s from_float %s: max diff %g", k->name, tsr_type_name(at), e);
    }
    if (n % 32 == 0 && n > 0) { /* the integer gemms' activations: sums exact, values within a step */
        tsr_cpu_q8s *a = malloc(TSR_CPU_Q8S_ROW(n)), *r = malloc(TSR_CPU_Q8S_ROW(n));
        k->q8s_from_float(y, a, n);
        tsr__cpu_q8s_from_float_ref(y, r, n);
        int bad = 0;
        for (int64_t b = 0; b < n / 32; b++) {
            int32_t sum = 0, lo = 0;
            for (int j = 0; j < 32; j++) {
                sum += a[b].qs[j], lo += j < 16 ? a[b].qs[j] : 0;
                bad |= fabs((double)a[b].d * a[b].qs[j] - (double)r[b].d * r[b].qs[j]) > 1.01 * r[b].d;
            }
            bad |= a[b].c != -128 * sum || a[b].c_lo != -128 * lo || fabs(a[b].d - r[b].d) > 1e-6 * r[b].d ||
                   fabs(a[b].ds - (double)a[b].d * sum) > 1e-3 * fabs((double)a[b].d * sum);
            bad |= memcmp(&a[b], &r[b], sizeof a[b]) != 0; /* every variant: the reference's bits */
        }
        CHECK(!bad, "%s q8s_from_float n=%lld: sums or values off", k->name, (long long)n);
        /* blocks of zeros, of values too small for 127 / max to be finite, of
         * subnormals, then mixed with ordinary ones */
        static const float tiny[4] = {0.0f, 1e-38f, 3e-45f, 2e-37f};
        for (int64_t b = 0; b < n / 32 && b < 4; b++)
            for (int j = 0; j < 32; j++) y[32 * b + j] = tiny[b] * (float)(j % 3 - 1);
        k->q8s_from_float(y, a, n);
        tsr__cpu_q8s_from_float_ref(y, r, n);
        bad = memcmp(a, r, TSR_CPU_Q8S_ROW(n)) != 0;
        for (int64_t b = 0; b < n / 32 && b < 2; b++)
            for (int j = 0; j < 32; j++) bad |= r[b].qs[j] != 0; /* zeros, not rounded infinities */
        CHECK(!bad, "%s q8s_from_float n=%lld: tiny blocks", k->name, (long long)n);
        /* blocks whose sum is past F16's range (d * sum > 65504): ds stays
         * the float (finite), the same in every variant */
        for (int64_t i = 0; i < n; i++) y[i] = (i / 32 % 2 ? -3000.0f : 3000.0f) + (float)(i % 7);
        k->q8s_from_float(y, a, n);
        tsr__cpu_q8s_from_float_ref(y, r, n);
        bad = memcmp(a, r, TSR_CPU_Q8S_ROW(n)) != 0;
        for (int64_t b = 0; b < n / 32; b++)
            bad |= !isfinite(r[b].ds) || fabs(r[b].ds) < 65504.0f ||
                   fabs(r[b].ds - (double)r[b].d * (-r[b].c / 128)) > 1e-3 * fabs(r[b].ds);
        CHECK(!bad, "%s q8s_from_float n=%lld: blocks past F16's range", k->name, (long long)n);
        free(a), free(r);
    }
    free(x), free(y), free(xd), free(yd), free(qx), free(qy);
}

/* The batched matmul kernels (gemm) at awkward shapes: m weight rows and n
 * activation rows not multiples of the register tile, k not a multiple of
 * the vector width or of the block; each result against a double dot of the
 * dequantized rows, and bit for bit equal to the same element computed
 * alone (1 x 1), so that results cannot depend on the tiling or threads. */
static void check_gemm(const tsr_cpu_kernels *k) {
    static const int64_t ms[] = {1, 6, 7, 17, 32, 33, 49}, ns[] = {1, 2, 4, 5, 6, 7, 13, 33},
                         ks[] = {7, 64, 100, 256, 512, 576, 1536};
    for (int wt = 0; wt < TSR_TYPE_COUNT; wt++) {
        if (!k->gemm[wt])
            continue;
        const tsr_type gt = k->gemm_type[wt];
        const bool q8s = k->gemm_q8s[wt]; /* activations: tsr_cpu_q8s rows */
        const bool has_min = wt == TSR_TYPE_Q4_1 || wt == TSR_TYPE_Q5_1 || wt == TSR_TYPE_Q4_K || wt == TSR_TYPE_Q5_K;
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            const int64_t kk = ks[ki];
            if (kk % tsr_type_block_size((tsr_type)wt) || (q8s ? kk % 32 : kk % tsr_type_block_size(gt)))
                continue;
            const size_t xs = tsr_row_size((tsr_type)wt, kk) + 16,
                         ys = tsr__pad(q8s ? TSR_CPU_Q8S_ROW(kk) : tsr_row_size(gt, kk), 4) + 8;
            const int64_t mmax = 49, nmax = 33;
            char *qx = calloc((size_t)mmax, xs), *qy = calloc((size_t)nmax, ys);
            float *f = malloc((size_t)kk * 4), *xd = malloc((size_t)(mmax * kk) * 4),
                  *yd = malloc((size_t)(nmax * kk) * 4);
            float *out = malloc((size_t)(mmax * nmax) * 4);
            void *scratch = aligned_alloc(32, tsr__pad(TSR_CPU_GEMM_SCRATCH(kk), 32));
            for (int64_t i = 0; i < mmax; i++) {
                for (int64_t l = 0; l < kk; l++) f[l] = frand();
                tsr__type_traits((tsr_type)wt)->from_float(f, qx + (size_t)i * xs, kk);
                tsr__type_traits((tsr_type)wt)->to_float(qx + (size_t)i * xs, xd + i * kk, kk);
            }
            for (int64_t j = 0; j < nmax; j++) {
                for (int64_t l = 0; l < kk; l++) f[l] = frand() * 2.0f;
                if (q8s) {
                    k->q8s_from_float(f, qy + (size_t)j * ys, kk);
                    tsr__cpu_q8s_to_float(qy + (size_t)j * ys, yd + j * kk, kk);
                } else {
                    k->from_float[gt](f, qy + (size_t)j * ys, kk);
                    tsr__type_traits(gt)->to_float(qy + (size_t)j * ys, yd + j * kk, kk);
                }
            }
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
                for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                    const int64_t m = ms[mi], n = ns[ni];
                    for (int64_t q = 0; q < mmax * nmax; q++) out[q] = NAN;
                    k->gemm[wt](kk, m, n, qx, xs, qy, ys, out, (size_t)mmax, scratch);
                    int bad = 0;
                    for (int64_t j = 0; j < n && !bad; j++)
                        for (int64_t i = 0; i < m && !bad; i++) {
                            /* q8s's d * sum(qy) is rounded to F16 (half a unit in
                             * 2^-11) and meets each block's minimum (|m| <= max|x|) */
                            double ref = 0, mag = 0, mins = 0, xmax = 0, ysum = 0;
                            for (int64_t l = 0; l < kk; l++) {
                                ref += (double)xd[i * kk + l] * yd[j * kk + l];
                                mag += fabs((double)xd[i * kk + l] * yd[j * kk + l]);
                                xmax = fmax(xmax, fabs(xd[i * kk + l]));
                                ysum += fabs(yd[j * kk + l]);
                                if (l % 32 == 31 || l == kk - 1)
                                    mins += xmax * ysum, xmax = ysum = 0;
                            }
                            float one = NAN;
                            k->gemm[wt](kk, 1, 1, qx + (size_t)i * xs, xs, qy + (size_t)j * ys, ys, &one, 1, scratch);
                            const float got = out[j * mmax + i];
                            const double tol = 1e-5 * mag +
                                               (gt == TSR_TYPE_Q8_1 && !q8s ? 2e-3 * mag / sqrt((double)kk) : 0) +
                                               (q8s && has_min ? mins / 2048 : 0) + 1e-6;
                            if (!(fabs(got - ref) <= tol) || memcmp(&got, &one, sizeof got))
                                bad = 1;
                            CHECK(fabs(got - ref) <= tol,
                                  "%s gemm %s k=%lld m=%lld n=%lld (%lld,%lld): %.7g, reference %.7g", k->name,
                                  tsr_type_name((tsr_type)wt), (long long)kk, (long long)m, (long long)n, (long long)i,
                                  (long long)j, got, ref);
                            CHECK(memcmp(&got, &one, sizeof got) == 0,
                                  "%s gemm %s k=%lld m=%lld n=%lld (%lld,%lld): %.9g in the tile, %.9g alone", k->name,
                                  tsr_type_name((tsr_type)wt), (long long)kk, (long long)m, (long long)n, (long long)i,
                                  (long long)j, got, one);
                        }
                    if (k->gemm1[wt]) /* one column at a time: the bits of the gemm */
                        for (int64_t j = 0; j < n; j++) {
                            float col[50];
                            for (int64_t i = 0; i <= m; i++) col[i] = NAN;
                            k->gemm1[wt](kk, m, mmax - m, qx, xs, qy + (size_t)j * ys, col);
                            CHECK(memcmp(col, out + j * mmax, (size_t)m * 4) == 0 && isnan(col[m]),
                                  "%s gemm1 %s k=%lld m=%lld column %lld: not the gemm's bits (or wrote past m)",
                                  k->name, tsr_type_name((tsr_type)wt), (long long)kk, (long long)m, (long long)j);
                        }
                    /* nothing written outside the m x n results */
                    int outside = 0;
                    for (int64_t j = 0; j < nmax; j++)
                        for (int64_t i = 0; i < mmax; i++)
                            if ((i >= m || j >= n) && !isnan(out[j * mmax + i]))
                                outside = 1;
                    CHECK(!outside, "%s gemm %s k=%lld m=%lld n=%lld wrote outside its results", k->name,
                          tsr_type_name((tsr_type)wt), (long long)kk, (long long)m, (long long)n);
                }
            free(qx), free(qy), free(f), free(xd), free(yd), free(out), free(scratch);
        }
    }
}

/* The integer gemms' overflow limits: weight rows with every quant at its
 * largest (all bits set; Q8_0 -128), scales 1, against activations all at
 * +-127 (and alternating), so that 16-bit sums that could saturate or wrap
 * would show; each result against a double dot of the dequantized rows. */
static void check_gemm_extremes(const tsr_cpu_kernels *k) {
    enum { KK = 512, NC = 3 };
    for (int wt = 0; wt < TSR_TYPE_COUNT; wt++) {
        if (!k->gemm[wt] || !k->gemm_q8s[wt] || KK % tsr_type_block_size((tsr_type)wt))
            continue;
        const size_t xs = tsr_row_size((tsr_type)wt, KK), ys = TSR_CPU_Q8S_ROW(KK),
                     bs = tsr_row_size((tsr_type)wt, tsr_type_block_size((tsr_type)wt));
        const int64_t nb = KK / tsr_type_block_size((tsr_type)wt);
        char *qx = malloc(xs), *qy = malloc(ys * NC);
        float *xd = malloc(KK * sizeof(float)), *yd = malloc(KK * NC * sizeof(float)), *f = malloc(KK * sizeof(float));
        void *scratch = aligned_alloc(32, tsr__pad(TSR_CPU_GEMM_SCRATCH(KK), 32));
        const tsr_half one = tsr__fp32_to_fp16(1.0f);
        memset(qx, wt == TSR_TYPE_Q8_0 ? 0x80 : 0xFF, xs);
        for (int64_t b = 0; b < nb; b++) { /* the fp16 scales (and minimums) to 1 */
            char *blk = qx + (size_t)b * bs;
            const size_t off = wt == TSR_TYPE_Q6_K ? offsetof(tsr_block_q6_K, d) : 0;
            memcpy(blk + off, &one, sizeof one);
            if (wt == TSR_TYPE_Q4_1 || wt == TSR_TYPE_Q5_1 || wt == TSR_TYPE_Q4_K || wt == TSR_TYPE_Q5_K)
                memcpy(blk + 2, &one, sizeof one);
        }
        tsr__type_traits((tsr_type)wt)->to_float(qx, xd, KK);
        for (int c = 0; c < NC; c++) {
            for (int64_t l = 0; l < KK; l++) f[l] = c == 0 ? 1.0f : c == 1 ? -1.0f : (l & 1 ? -1.0f : 1.0f);
            k->q8s_from_float(f, qy + (size_t)c * ys, KK);
            tsr__cpu_q8s_to_float(qy + (size_t)c * ys, yd + c * KK, KK);
        }
        float out[NC];
        k->gemm[wt](KK, 1, NC, qx, xs, qy, ys, out, 1, scratch);
        for (int c = 0; c < NC; c++) {
            double ref = 0, mag = 0;
            for (int64_t l = 0; l < KK; l++) {
                ref += (double)xd[l] * yd[c * KK + l];
                mag += fabs((double)xd[l] * yd[c * KK + l]);
            }
            CHECK(fabs(out[c] - ref) <= 1e-5 * mag + 1e-6, "%s gemm %s extremes column %d: %.7g, reference %.7g",
                  k->name, tsr_type_name((tsr_type)wt), c, out[c], ref);
        }
        free(qx), free(qy), free(xd), free(yd), free(f), free(scratch);
    }
}

/* The matrix-vector products (gemv) at awkward shapes: m = 1..17 weight
 * rows (not multiples of the kernels' row groups), k from one block to
 * 1536, k not a multiple of 64 or 256 where the type allows, a row stride
 * that is not the row size; each result against a double dot of the
 * dequantized rows, and bit for bit equal to the table's dot product of
 * the same row (vec_dot), so that decode's results are the dots' and do not
 * depend on the tiling or threads. */
static void check_gemv(const tsr_cpu_kernels *k) {
    /* 33, 100: F16 with a tail; 4160: more than a chunk of gemv_f16 (avx2/gemv.c) */
    static const int64_t ks[] = {32, 33, 64, 96, 100, 256, 320, 512, 576, 768, 1536, 4160};
    enum { MMAX = 17 };
    const uint64_t saved = rng; /* its own random data: the other checks see the same as without it */
    for (int wt = 0; wt < TSR_TYPE_COUNT; wt++) {
        if (!k->gemv[wt])
            continue;
        const tsr_type dt = k->dot_type[wt];
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            const int64_t kk = ks[ki];
            if (kk % tsr_type_block_size((tsr_type)wt) || kk % tsr_type_block_size(dt))
                continue;
            const size_t xs = tsr_row_size((tsr_type)wt, kk) + 16;
            char *qx = calloc(MMAX, xs), *qy = malloc(tsr_row_size(dt, kk));
            float *f = malloc((size_t)kk * 4), *scratch = malloc((size_t)kk * 8);
            float out[MMAX + 1], ref[MMAX], dot[MMAX];
            double mag[MMAX];
            for (int64_t i = 0; i < MMAX; i++) {
                for (int64_t l = 0; l < kk; l++) f[l] = frand() * (1.0f + (float)i);
                tsr__type_traits((tsr_type)wt)->from_float(f, qx + (size_t)i * xs, kk);
            }
            for (int64_t l = 0; l < kk; l++) f[l] = frand() * 2.0f;
            k->from_float[dt](f, qy, kk);
            tsr__cpu_gemm_ref((tsr_type)wt, dt, kk, MMAX, 1, qx, xs, qy, 0, ref, 1, scratch);
            for (int64_t i = 0; i < MMAX; i++) { /* the magnitude of the products, for the tolerance */
                float *xd = scratch, *yd = scratch + kk;
                tsr__type_traits((tsr_type)wt)->to_float(qx + (size_t)i * xs, xd, kk);
                tsr__type_traits(dt)->to_float(qy, yd, kk);
                mag[i] = 0;
                for (int64_t l = 0; l < kk; l++) mag[i] += fabs((double)xd[l] * yd[l]);
                k->vec_dot[wt](kk, &dot[i], qx + (size_t)i * xs, qy);
            }
            for (int64_t m = 1; m <= MMAX; m++) {
                for (int q = 0; q <= MMAX; q++) out[q] = NAN;
                /* odd m: the rows after m readable, as the matmul's claims pass them (prefetch only) */
                k->gemv[wt](kk, m, m % 2 ? MMAX - m : 0, qx, xs, qy, out);
                int bad = 0;
                for (int64_t i = 0; i < m && !bad; i++) {
                    /* Q8_1's stored sum is rounded to half: allow for it */
                    const double tol = 1e-5 * mag[i] +
                                       (dt == TSR_TYPE_Q8_1 ? 2e-3 * mag[i] / sqrt((double)kk + 1) : 0) + 1e-6;
                    bad = !(fabs(out[i] - ref[i]) <= tol) || memcmp(&out[i], &dot[i], sizeof dot[i]);
                    CHECK(fabs(out[i] - ref[i]) <= tol, "%s gemv %s k=%lld m=%lld row %lld: %.7g, reference %.7g",
                          k->name, tsr_type_name((tsr_type)wt), (long long)kk, (long long)m, (long long)i, out[i],
                          ref[i]);
                    CHECK(memcmp(&out[i], &dot[i], sizeof dot[i]) == 0,
                          "%s gemv %s k=%lld m=%lld row %lld: %.9g, the dot %.9g", k->name, tsr_type_name((tsr_type)wt),
                          (long long)kk, (long long)m, (long long)i, out[i], dot[i]);
                }
                CHECK(isnan(out[m]), "%s gemv %s k=%lld m=%lld wrote past its results", k->name,
                      tsr_type_name((tsr_type)wt), (long long)kk, (long long)m);
            }
            free(qx), free(qy), free(f), free(scratch);
        }
    }
    rng = saved;
}

/* Weights in the 8-row interleaved layout (TSR_FLAG_IL8): a matrix of
 * 8..48 rows (whole groups) stored plainly, rearranged by tsr__il8_repack,
 * must give gemv_il8 results within 1e-5 of the products' magnitude of the
 * stored layout's gemv (checked against the reference above: they differ
 * in the order of the float sums only), the same whatever the rows of the
 * call, and gemm_il8 exactly
 * the stored layout's gemm; tsr__il8_canonical gives the stored bytes back.
 * Random values, then every value at its largest magnitude; rows longer
 * than the kernels' table of activation sums. Matrices that cannot take
 * the layout (rows not a multiple of 8, padded rows, outside host memory)
 * are refused and left as they are. */
static void check_il8(const tsr_cpu_kernels *k) {
    /* 16640: more blocks of 32 than the kernels' table of activation sums
     * (avx2/gemv.c IL8_YSUM_MAX) */
    static const int64_t ks[] = {32, 64, 96, 256, 576, 1536, 16640};
    static const int64_t ms[] = {8, 16, 24, 48};
    const uint64_t saved = rng;
    tsr_buffer_type host_buft = {.is_host = true}, dev_buft = {.is_host = false};
    tsr_buffer host = {.buft = &host_buft}, dev = {.buft = &dev_buft};
    for (int wt = 0; wt < TSR_TYPE_COUNT; wt++) {
        if (!k->gemv_il8[wt] && !k->gemm_il8[wt])
            continue;
        CHECK(k->gemv_il8[wt] && k->gemm_il8[wt] && tsr__il8_type((tsr_type)wt), "%s: il8 kernels of %s come in pairs",
              k->name, tsr_type_name((tsr_type)wt));
        const tsr_type dt = k->dot_type[wt];
        /* ext: every value at the largest magnitude, weights and activations
         * of the same signs (the kernels' 16-bit partial sums at their most) */
        for (int ext = 0; ext < 2; ext++)
            for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                    /* columns: both sides of the few-column path (avx512/gemm.c: n <= 8) */
                    static const int64_t ns[] = {1, 3, 7, 8, 9, 13};
                    const int64_t kk = ks[ki], m = ms[mi], n = ns[(ki + mi + (size_t)ext) % 6];
                    if (kk % tsr_type_block_size((tsr_type)wt) || kk % tsr_type_block_size(dt) || (kk > 1536 && m > 16))
                        continue;
                    const size_t xs = tsr_row_size((tsr_type)wt, kk);
                    char *qx = malloc((size_t)m * xs), *keep = malloc((size_t)m * xs),
                         *qy = malloc(tsr_row_size(dt, kk));
                    const size_t ys = TSR_CPU_Q8S_ROW(kk);
                    char *qys = malloc(ys * (size_t)n);
                    float *f = malloc((size_t)kk * 4), *scratch = malloc(TSR_CPU_GEMM_SCRATCH(kk) + (size_t)kk * 8);
                    float *plain = malloc((size_t)m * 4), *out = malloc((size_t)(m + 1) * 4),
                          *g0 = malloc((size_t)(m * n) * 4), *g1 = malloc((size_t)(m * n) * 4);
                    double *mag = calloc((size_t)m, sizeof *mag);
#define IL8_SIGN(l) ((l) % 3 ? -1.0f : 1.0f)
                    for (int64_t i = 0; i < m; i++) {
                        for (int64_t l = 0; l < kk; l++) f[l] = (ext ? IL8_SIGN(l) : frand()) * (1.0f + (float)(i % 5));
                        tsr__type_traits((tsr_type)wt)->from_float(f, qx + (size_t)i * xs, kk);
                    }
                    for (int64_t l = 0; l < kk; l++) f[l] = (ext ? IL8_SIGN(l) : frand()) * 2.0f;
                    k->from_float[dt](f, qy, kk);
                    for (int64_t j = 0; j < n; j++) {
                        for (int64_t l = 0; l < kk; l++) f[l] = frand() * 3.0f;
                        k->q8s_from_float(f, qys + (size_t)j * ys, kk);
                    }
                    for (int64_t i = 0; i < m; i++) {
                        float *xd = scratch, *yd = scratch + kk;
                        tsr__type_traits((tsr_type)wt)->to_float(qx + (size_t)i * xs, xd, kk);
                        tsr__type_traits(dt)->to_float(qy, yd, kk);
                        for (int64_t l = 0; l < kk; l++) mag[i] += fabs((double)xd[l] * yd[l]);
                    }
                    k->gemm[wt](kk, m, n, qx, xs, qys, ys, g0, (size_t)m, scratch);
                    k->gemv[wt](kk, m, 0, qx, xs, qy, plain);
                    memcpy(keep, qx, (size_t)m * xs);
                    tsr_tensor t;
                    memset(&t, 0, sizeof t);
                    t.type = (tsr_type)wt, t.n_dims = 2, t.ne[0] = kk, t.ne[1] = m, t.ne[2] = t.ne[3] = 1;
                    t.nb[0] = tsr__type_traits((tsr_type)wt)->block_bytes, t.nb[1] = xs,
                    t.nb[2] = t.nb[3] = xs * (size_t)m;
                    t.data = qx;
                    snprintf(t.name, sizeof t.name, "w");
                    t.buffer = &dev; /* memory the CPU cannot rearrange */
                    CHECK(!tsr__il8_repack(&t) && !t.flags && memcmp(qx, keep, (size_t)m * xs) == 0,
                          "%s il8 %s: a weight outside host memory taken", k->name, tsr_type_name((tsr_type)wt));
                    t.buffer = &host;
                    CHECK(tsr__il8_repack(&t) && (t.flags & TSR_FLAG_IL8), "%s il8 %s k=%lld m=%lld: repack refused",
                          k->name, tsr_type_name((tsr_type)wt), (long long)kk, (long long)m);
                    for (int64_t rows = 8; rows <= m; rows += 8) { /* calls of whole groups from the start */
                        for (int64_t q = 0; q <= m; q++) out[q] = NAN;
                        k->gemv_il8[wt](kk, rows, m - rows, qx, xs, qy, out);
                        int bad = 0;
                        for (int64_t i = 0; i < rows && !bad; i++) {
                            bad = !(fabs(out[i] - plain[i]) <= 1e-5 * mag[i] + 1e-6);
                            CHECK(!bad, "%s gemv_il8 %s k=%lld rows %lld of %lld, row %lld: %.7g, stored layout %.7g",
                                  k->name, tsr_type_name((tsr_type)wt), (long long)kk, (long long)rows, (long long)m,
                                  (long long)i, out[i], plain[i]);
                        }
                        CHECK(isnan(out[rows]), "%s gemv_il8 %s wrote past its results", k->name,
                              tsr_type_name((tsr_type)wt));
                    }
                    if (m >= 16) { /* the second group alone: the same bits as in the whole call */
                        float whole[48], part[8];
                        k->gemv_il8[wt](kk, m, 0, qx, xs, qy, whole);
                        k->gemv_il8[wt](kk, 8, 0, qx + 8 * xs, xs, qy, part);
                        CHECK(memcmp(whole + 8, part, sizeof part) == 0,
                              "%s gemv_il8 %s k=%lld: a group's rows depend "
                              "on the call",
                              k->name, tsr_type_name((tsr_type)wt), (long long)kk);
                    }
                    if (k->gemm1_il8[wt]) /* one column, the whole call and its last group alone */
                        for (int64_t j = 0; j < n; j++) {
                            k->gemm1_il8[wt](kk, m, 0, qx, xs, qys + (size_t)j * ys, out);
                            CHECK(memcmp(out, g0 + j * m, (size_t)m * 4) == 0,
                                  "%s gemm1_il8 %s k=%lld m=%lld column %lld: not the gemm's bits", k->name,
                                  tsr_type_name((tsr_type)wt), (long long)kk, (long long)m, (long long)j);
                            k->gemm1_il8[wt](kk, 8, 0, qx + (size_t)(m - 8) * xs, xs, qys + (size_t)j * ys, out);
                            CHECK(memcmp(out, g0 + j * m + m - 8, 8 * 4) == 0,
                                  "%s gemm1_il8 %s k=%lld m=%lld column %lld: a group's bits depend on the call",
                                  k->name, tsr_type_name((tsr_type)wt), (long long)kk, (long long)m, (long long)j);
                        }
                    k->gemm_il8[wt](kk, m, n, qx, xs, qys, ys, g1, (size_t)m, scratch);
                    CHECK(memcmp(g0, g1, (size_t)(m * n) * 4) == 0,
                          "%s gemm_il8 %s k=%lld m=%lld: not the stored "
                          "layout's bits",
                          k->name, tsr_type_name((tsr_type)wt), (long long)kk, (long long)m);
                    CHECK(tsr__il8_canonical(&t) == TSR_OK && !(t.flags & TSR_FLAG_IL8) &&
                              (t.flags & TSR_FLAG_NOREPACK) && memcmp(qx, keep, (size_t)m * xs) == 0,
                          "%s il8 %s k=%lld m=%lld: the stored bytes did not come back", k->name,
                          tsr_type_name((tsr_type)wt), (long long)kk, (long long)m);
                    t.flags = 0, t.ne[1] = m - 1, t.nb[2] = t.nb[3] = xs * (size_t)(m - 1);
                    CHECK(!tsr__il8_repack(&t) && !t.flags, "%s il8 %s: %lld rows taken", k->name,
                          tsr_type_name((tsr_type)wt), (long long)(m - 1));
                    t.ne[1] = m / 2, t.nb[1] = 2 * xs, t.nb[2] = t.nb[3] = 2 * xs * (size_t)(m / 2);
                    CHECK(!tsr__il8_repack(&t) && !t.flags && memcmp(qx, keep, (size_t)m * xs) == 0,
                          "%s il8 %s: padded rows taken", k->name, tsr_type_name((tsr_type)wt));
                    free(qx);
                    free(keep), free(qy), free(qys), free(f), free(scratch), free(plain), free(out), free(g0), free(g1);
                    free(mag);
                }
    }
    rng = saved;
}

/* The fused attention's block matmuls: C = A * B (gemm_f32, with and
 * without accumulating into C) and C = A * B^T (gemm_f32_nt), B F32 or F16
 * rows wider than used, against double sums; every result must also be the
 * one a 1 x 1 call gives (gemm_f32_nt: a call for the same rows and that key
 * alone): no dependence on the place in the tile. */
static void check_attn_gemm(const tsr_cpu_kernels *k) {
    const uint64_t rng0 = rng; /* the other checks see the numbers they always did */
    static const int64_t ms[] = {1, 3, 8, 9, 17}, ns[] = {1, 15, 16, 17, 33, 64}, ks[] = {0, 1, 7, 16, 64, 100, 1100};
    enum { MMAX = 17, NMAX = 64, KMAX = 1100, PAD = 5 };
    float *a = malloc(sizeof(float) * MMAX * KMAX), *bf = malloc(sizeof(float) * KMAX * (KMAX + PAD));
    uint16_t *bh = malloc(sizeof(uint16_t) * KMAX * (KMAX + PAD));
    float *c = malloc(sizeof(float) * MMAX * (NMAX + PAD)), *c0 = malloc(sizeof(float) * MMAX * (NMAX + PAD));
    for (int64_t i = 0; i < MMAX * KMAX; i++) a[i] = frand();
    for (int64_t i = 0; i < KMAX * (KMAX + PAD); i++) {
        bh[i] = tsr__fp32_to_fp16(frand());
        bf[i] = TSR_FP16_TO_FP32(bh[i]);
    }
    for (int nt = 0; nt < 2; nt++)
        for (int f16 = 0; f16 < 2; f16++)
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
                for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
                        const int64_t m = ms[mi], n = ns[ni], kk = ks[ki], ldc = n + PAD;
                        const int64_t ldb = nt ? kk + PAD : n + PAD; /* B rows: keys (nt) or k (plain) */
                        const void *b = f16 ? (const void *)bh : (const void *)bf;
                        const int acc = !nt && kk % 2; /* accumulate into C for some shapes */
                        bool bad = false;
                        for (int64_t i = 0; i < MMAX * ldc; i++) c[i] = c0[i] = (float)(i % 7) - 3.0f;
                        if (nt) { /* B exactly n rows long: a read past them shows under ASan */
                            const size_t bytes = (f16 ? 2 : 4) * (size_t)((n - 1) * ldb + kk);
                            void *bx = malloc(bytes ? bytes : 1);
                            memcpy(bx, b, bytes);
                            k->gemm_f32_nt(m, n, kk, a, kk, bx, f16, ldb, c, ldc);
                            free(bx);
                        } else
                            k->gemm_f32(m, n, kk, a, kk, b, f16, ldb, c, ldc, acc);
                        for (int64_t i = 0; i < MMAX && !bad; i++)
                            for (int64_t j = 0; j < ldc && !bad; j++) {
                                const float got = c[i * ldc + j];
                                if (i >= m || j >= n) {
                                    bad = got != c0[i * ldc + j];
                                    CHECK(!bad, "%s gemm_f32%s m=%lld n=%lld k=%lld wrote outside C", k->name,
                                          nt ? "_nt" : "", (long long)m, (long long)n, (long long)kk);
                                    continue;
                                }
                                double ref = acc ? c0[i * ldc + j] : 0, mag = fabs(ref);
                                for (int64_t l = 0; l < kk; l++) {
                                    const double x = (double)a[i * kk + l] * (nt ? bf[j * ldb + l] : bf[l * ldb + j]);
                                    ref += x, mag += fabs(x);
                                }
                                float one = c0[i * ldc + j], col[MMAX];
                                if (nt) { /* the same rows against key j alone (the order may depend on m) */
                                    k->gemm_f32_nt(m, 1, kk, a, kk,
                                                   f16 ? (const void *)(bh + j * ldb) : (const void *)(bf + j * ldb),
                                                   f16, ldb, col, 1);
                                    one = col[i];
                                } else
                                    k->gemm_f32(1, 1, kk, a + i * kk, kk,
                                                f16 ? (const void *)(bh + j) : (const void *)(bf + j), f16, ldb, &one,
                                                1, acc);
                                bad = !(fabs(got - ref) <= 1e-5 * mag + 1e-6) || memcmp(&got, &one, sizeof got) != 0;
                                CHECK(fabs(got - ref) <= 1e-5 * mag + 1e-6,
                                      "%s gemm_f32%s%s m=%lld n=%lld k=%lld (%lld,%lld): %.7g, reference %.7g", k->name,
                                      nt ? "_nt" : "", f16 ? " f16" : "", (long long)m, (long long)n, (long long)kk,
                                      (long long)i, (long long)j, got, ref);
                                CHECK(memcmp(&got, &one, sizeof got) == 0,
                                      "%s gemm_f32%s%s m=%lld n=%lld k=%lld (%lld,%lld): %.9g in the tile, %.9g alone",
                                      k->name, nt ? "_nt" : "", f16 ? " f16" : "", (long long)m, (long long)n,
                                      (long long)kk, (long long)i, (long long)j, got, one);
                            }
                    }
    free(a), free(bf), free(bh), free(c), free(c0);
    rng = rng0;
}

/* The fused attention's online softmax step against a double reference:
 * lengths around the 64 kept in registers, masks with -inf (also whole
 * rows), and running maxes below, inside and above the slack. */
static void check_softmax_step(const tsr_cpu_kernels *k) {
    const uint64_t rng0 = rng; /* the other checks see the numbers they always did */
    static const int64_t ns[] = {0, 1, 7, 8, 15, 16, 17, 33, 63, 64, 65, 100};
    static const float m0s[] = {-INFINITY, -3.0f, 0.5f, 9.0f};
    enum { N = 100 };
    float y[N + 4], mask[N], x[N];
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (int mk = 0; mk < 4; mk++) /* no mask, zeros, some -inf, all -inf */
            for (size_t mi = 0; mi < sizeof m0s / sizeof m0s[0]; mi++) {
                const int64_t n = ns[ni];
                const float scale = 0.125f, slack = 2.0f;
                for (int64_t i = 0; i < n; i++) {
                    x[i] = frand() * 40.0f;
                    mask[i] = mk == 1 ? 0.0f : mk == 3 || (mk == 2 && i % 3 == 1) ? -INFINITY : frand();
                }
                for (int64_t i = 0; i < N + 4; i++) y[i] = i < n ? x[i] : 7.0f;
                float m = m0s[mi];
                const float sum = k->softmax_step(n, y, scale, mk ? mask : NULL, &m, slack);
                double mx = -INFINITY;
                for (int64_t i = 0; i < n; i++) {
                    const double v = (double)x[i] * scale + (mk ? mask[i] : 0.0);
                    mx = v > mx ? v : mx;
                }
                const double want_m = mx == -INFINITY                                ? m0s[mi]
                                      : m0s[mi] == -INFINITY || mx > m0s[mi] + slack ? mx
                                                                                     : m0s[mi];
                CHECK(m == (float)want_m, "%s softmax_step n=%lld mask %d m0 %g: max %g, want %g", k->name,
                      (long long)n, mk, m0s[mi], m, want_m);
                double ref = 0;
                bool bad = false, past = false;
                for (int64_t i = 0; i < n; i++) {
                    const double v = (double)x[i] * scale + (mk ? mask[i] : 0.0);
                    const double e = mx == -INFINITY || v == -INFINITY ? 0.0 : exp(v - want_m);
                    /* float rounding of the exponent: about an ulp of |v| and of |v - m| */
                    const double tol = (e > 0 ? e * (4e-7 + 1.2e-7 * (fabs(v) + fabs(v - want_m))) : 0) + 1e-30;
                    ref += e;
                    if (!bad) {
                        bad = !(fabs(y[i] - e) <= tol);
                        CHECK(!bad, "%s softmax_step n=%lld mask %d m0 %g: y[%lld] %g, want %g", k->name, (long long)n,
                              mk, m0s[mi], (long long)i, y[i], e);
                    }
                }
                for (int64_t i = n; i < N + 4; i++) past |= y[i] != 7.0f;
                CHECK(!past, "%s softmax_step n=%lld: wrote past the row", k->name, (long long)n);
                CHECK(fabs(sum - ref) <= 1e-5 * ref, "%s softmax_step n=%lld mask %d m0 %g: sum %.7g, want %.7g",
                      k->name, (long long)n, mk, m0s[mi], sum, ref);
            }
    rng = rng0;
}

/* Non-finite and extreme activations through every activation quantizer of
 * the variant (tsr_cpu_q8s, Q8_0, Q8_1, F16): NaNs, infinities of both
 * signs, FLT_MAX, values past F16's range, subnormals, each at several
 * lanes and, rotated block by block, through the four-block and one-block
 * paths. The rule (cpu/cpu.h, libtensr/quant/quants.c): NaNs are left out
 * of the max and quantize to 0, a block with an infinity is all zeros,
 * |q| <= 127, the sums exact; tsr_cpu_q8s rows the reference's bits. Under
 * UBSan a sum of INT_MIN lanes (what a NaN converts to) fails here. */
static void check_q8_extremes(const tsr_cpu_kernels *k) {
    enum { NB = 14, N = 32 * NB };
    static float base[N], x[N];
    for (int i = 0; i < N; i++) base[i] = frand() * 4.0f;
    base[32 * 1 + 0] = NAN;                                                /* 1: a NaN first */
    base[32 * 2 + 31] = -NAN;                                              /* 2: a NaN last */
    base[32 * 3 + 5] = INFINITY;                                           /* 3: +inf */
    base[32 * 4 + 20] = -INFINITY;                                         /* 4: -inf */
    for (int j = 0; j < 32; j++) base[32 * 5 + j] = NAN;                   /* 5: all NaN */
    base[32 * 6 + 3] = FLT_MAX, base[32 * 6 + 30] = -FLT_MAX;              /* 6: FLT_MAX */
    for (int j = 0; j < 32; j++) base[32 * 7 + j] = (j & 1 ? -3e38f : 3e38f) * ((float)(1 + j) / 32); /* 7: huge */
    base[32 * 8 + 9] = NAN, base[32 * 8 + 10] = -INFINITY;                 /* 8: both */
    for (int j = 0; j < 32; j++) base[32 * 10 + j] = (float)(j % 3 - 1) * 1e-40f; /* 10: subnormal */
    base[32 * 11 + 1] = 5.0f, base[32 * 11 + 9] = NAN, base[32 * 11 + 17] = NAN; /* 11: NaNs in the max's lane */
    base[32 * 11 + 25] = -6.0f;
    base[32 * 12 + 7] = INFINITY, base[32 * 12 + 8] = -INFINITY;           /* 12: both infinities */
    for (int j = 0; j < 32; j++) base[32 * 13 + j] = (j % 2 ? 70000.0f : 65000.0f); /* 13: past F16 */
    base[32 * 13 + 16] = NAN;
    static tsr_cpu_q8s a[NB], r[NB];
    static tsr_block_q8_0 a0[NB], r0[NB];
    static tsr_block_q8_1 a1[NB], r1[NB];
    static uint16_t ah[N], rh[N];
    for (int rot = 0; rot < 4; rot++) { /* block b of base is block (b + rot) % NB */
        for (int i = 0; i < N; i++) x[(i + 32 * rot) % N] = base[i];
        memset(a, 0x5A, sizeof a);
        k->q8s_from_float(x, a, N);
        tsr__cpu_q8s_from_float_ref(x, r, N);
        for (int b = 0; b < NB; b++) {
            const float *xb = x + 32 * b;
            int bad = memcmp(&a[b], &r[b], sizeof a[b]) != 0, inf = 0;
            int32_t sum = 0, lo = 0;
            for (int j = 0; j < 32; j++) {
                inf |= isinf(xb[j]);
                sum += r[b].qs[j], lo += j < 16 ? r[b].qs[j] : 0;
                bad |= r[b].qs[j] == -128 || (isnan(xb[j]) && r[b].qs[j] != 0);
            }
            for (int j = 0; j < 32 && inf; j++) bad |= r[b].qs[j] != 0 || !isinf(r[b].d);
            bad |= r[b].c != -128 * sum || r[b].c_lo != -128 * lo;
            CHECK(!bad, "%s q8s_from_float, extreme block %d (rotated %d): d %g/%g c %d/%d", k->name,
                  (b + NB - rot) % NB, rot, a[b].d, r[b].d, a[b].c, r[b].c);
        }
        /* Q8_0 and Q8_1 (the dots' activations): the variant's rounding may
         * differ from the reference's by one step, the rule not */
        for (int q = 0; q < 2; q++) {
            const tsr_type t = q ? TSR_TYPE_Q8_1 : TSR_TYPE_Q8_0;
            void *av = q ? (void *)a1 : (void *)a0, *rv = q ? (void *)r1 : (void *)r0;
            memset(av, 0x5A, q ? sizeof a1 : sizeof a0);
            k->from_float[t](x, av, N);
            tsr__type_traits(t)->from_float(x, rv, N);
            for (int b = 0; b < NB; b++) {
                const float *xb = x + 32 * b;
                const int8_t *qa = q ? a1[b].qs : a0[b].qs, *qr = q ? r1[b].qs : r0[b].qs;
                const uint16_t da = q ? a1[b].d : a0[b].d, dr = q ? r1[b].d : r0[b].d;
                int bad = da != dr, inf = 0, sum = 0;
                for (int j = 0; j < 32; j++) inf |= isinf(xb[j]);
                for (int j = 0; j < 32; j++) {
                    sum += qa[j];
                    bad |= qa[j] == -128 || qr[j] == -128 || abs(qa[j] - qr[j]) > 1;
                    bad |= (isnan(xb[j]) || inf) && (qa[j] != 0 || qr[j] != 0);
                }
                if (q) { /* s = d * sum rounded to F16 (infinite past its range): NaN alike (inf * 0) */
                    const float sa = tsr__fp16_to_fp32(a1[b].s), sr = tsr__fp16_to_fp32(r1[b].s),
                                d = tsr__fp16_to_fp32(a1[b].d);
                    bad |= isnan(sa) != isnan(sr) ||
                           (!isnan(sa) && sa != sr && fabsf(sa - d * sum) > 1e-3f * fabsf(d * sum) + 1e-6f);
                }
                CHECK(!bad, "%s from_float %s, extreme block %d (rotated %d)", k->name, tsr_type_name(t),
                      (b + NB - rot) % NB, rot);
            }
        }
        k->from_float[TSR_TYPE_F16](x, ah, N);
        tsr__type_traits(TSR_TYPE_F16)->from_float(x, rh, N);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            const float fa = tsr__fp16_to_fp32(ah[i]), fr = tsr__fp16_to_fp32(rh[i]);
            bad |= isnan(fa) != isnan(fr) || (!isnan(fa) && ah[i] != rh[i]);
        }
        CHECK(!bad, "%s from_float f16 of extreme values (rotated %d)", k->name, rot);
    }
}

/* Q8_K activations (the K-quant dots') bit for bit as the reference: random
 * rows, ties of the largest magnitude in both signs (the first wins), zero
 * blocks, values too small for a finite multiplier, infinities and NaNs. */
static void check_q8_K(const tsr_cpu_kernels *k) {
    enum { NB = 12, N = NB * 256 };
    static float x[N];
    static tsr_block_q8_K a[NB], r[NB];
    uint32_t s = 12345;
    for (int i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (float)(1 + i / 256);
    }
    for (int i = 0; i < 256; i++) x[256 + i] = (float)((i * 37) % 9) - 4.0f; /* block 1: -4 first, +4 at i = 8 */
    x[512 + 200] = 3.0f, x[512 + 100] = -3.0f;                                /* block 2 (rest below 1.5): -3 first */
    for (int i = 0; i < 256; i++) x[768 + i] = 0.0f;                          /* block 3: zeros */
    for (int i = 0; i < 256; i++) x[1024 + i] = (i % 3 - 1) * 1e-38f;         /* block 4: multiplier infinite */
    x[1280 + 17] = INFINITY;                                                  /* block 5 */
    x[1536 + 40] = NAN, x[1536 + 41] = -NAN;                                  /* block 6: NaNs ignored by the max */
    for (int i = 0; i < 256; i++) x[1792 + i] = NAN;                          /* block 7: all NaN */
    x[2048 + 255] = -1e30f;                                                   /* block 8: the last value largest */
    for (int i = 0; i < 256; i++) x[2304 + i] = (i & 1) ? 2.5f : -2.5f;      /* block 9: all equal magnitudes */
    tsr__type_traits(TSR_TYPE_Q8_K)->from_float(x, r, N);
    memset(a, 0x5A, sizeof a);
    k->from_float[TSR_TYPE_Q8_K](x, a, N);
    for (int b = 0; b < NB; b++)
        CHECK(!memcmp(&a[b], &r[b], sizeof a[b]), "%s q8_K block %d differs from the reference (d %g vs %g)", k->name,
              b, a[b].d, r[b].d);
}

/* exp/silu helpers over their whole range, -inf and overflow included. */
static void check_math(const tsr_cpu_kernels *k) {
    enum { N = 2003 };
    float y[N], x[N], z[N];
    for (int i = 0; i < N; i++) x[i] = y[i] = -100.0f + 190.0f * i / (N - 1);
    y[0] = x[0] = -INFINITY;
    k->exp_sum(N, y, 0.0f);
    for (int i = 0; i < N; i++) {
        const double want = exp((double)x[i]);
        const double rel = want > 1e-37 && isfinite((float)want) ? fabs(y[i] - want) / want : 0;
        CHECK(rel < 4e-7 && (x[i] > -87.3f || y[i] == 0.0f || fabs(y[i] - want) < 1e-37), "%s exp(%g) = %g, want %g",
              k->name, x[i], y[i], want);
        if (rel >= 4e-7)
            break;
    }
    k->silu_mul(N, z, x, NULL);
    for (int i = 1; i < N; i++) {
        const double want = x[i] / (1 + exp(-(double)x[i]));
        CHECK(fabs(z[i] - want) <= 1e-6 * fabs(want) + 1e-30, "%s silu(%g) = %g, want %g", k->name, x[i], z[i], want);
        if (fabs(z[i] - want) > 1e-6 * fabs(want) + 1e-30)
            break;
    }
    /* GELU (tanh form) against double, times g, at lengths with tails: the
     * float argument u carries a relative error of a few ulps, which exp
     * turns into about |2u| ulps of the result for x < 0 */
    for (int i = 0; i < N; i++) y[i] = 1.0f + (float)(i % 13) / 4.0f;
    for (int pass = 0; pass < 2; pass++) {
        const int n = pass ? N - 1 : N - 4;
        k->gelu_mul(n, z, x + 1, pass ? y : NULL);
        for (int i = 0; i < n; i++) {
            const double v = x[i + 1], u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
            const double want = v / (1 + exp(-2 * u)) * (pass ? y[i] : 1.0); /* 0.5 v (1 + tanh u) */
            const double tol = 2e-7 * (4 + fabs(2 * u)) * fabs(want) + 1e-30;
            CHECK(fabs(z[i] - want) <= tol, "%s gelu(%g)%s = %.9g, want %.9g", k->name, v, pass ? " * g" : "", z[i],
                  want);
            if (fabs(z[i] - want) > tol)
                break;
        }
    }
    float big[3] = {INFINITY, -1e30f, 1e30f}, out[3];
    k->gelu_mul(3, out, big, NULL);
    CHECK(out[0] == INFINITY && out[1] == 0.0f && out[2] == 1e30f, "%s gelu(inf, -1e30, 1e30) = %g, %g, %g", k->name,
          out[0], out[1], out[2]);
}

/* The element-wise rows against the scalar table at awkward lengths, in
 * place too: add and mul exact, rms_norm within float rounding of a double
 * reference, rope the reference's bits (both pairings). */
static void check_rows(const tsr_cpu_kernels *k) {
    enum { N = 300 };
    static const int64_t ns[] = {0, 1, 2, 6, 7, 8, 14, 15, 16, 17, 30, 31, 32, 33, 64, 100, 128, 130, 300};
    const uint64_t rng0 = rng; /* the later checks see the same data with or without this one */
    tsr_cpu_kernels ref;
    tsr__cpu_kernels_select(&ref, "scalar");
    float x[N + 8], g[N + 8], y[N + 8], want[N + 8], cs[N + 8];
    for (int i = 0; i < N + 8; i++) x[i] = 4 * frand() - 2, g[i] = 4 * frand() - 2;
    for (int i = 0; i + 1 < N + 8; i += 2) {
        const float th = 37.0f * frand();
        cs[i] = cosf(th) * 1.1f, cs[i + 1] = sinf(th) * 1.1f;
    }
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        const int64_t n = ns[t];
        for (int op = 0; op < 2; op++) {
            for (int i = 0; i < N + 8; i++) y[i] = 7.0f;
            (op ? k->mul : k->add)(n, y, x, g);
            bool bad = false;
            for (int64_t i = 0; i < n && !bad; i++) bad = y[i] != (op ? x[i] * g[i] : x[i] + g[i]);
            for (int64_t i = n; i < N + 8 && !bad; i++) bad = y[i] != 7.0f;
            CHECK(!bad, "%s %s n=%lld", k->name, op ? "mul" : "add", (long long)n);
            memcpy(y, x, sizeof y);
            (op ? k->mul : k->add)(n, y, y, g); /* in place, over either source */
            for (int64_t i = 0; i < n && !bad; i++) bad = y[i] != (op ? x[i] * g[i] : x[i] + g[i]);
            memcpy(y, g, sizeof y);
            (op ? k->mul : k->add)(n, y, x, y);
            for (int64_t i = 0; i < n && !bad; i++) bad = y[i] != (op ? x[i] * g[i] : x[i] + g[i]);
            CHECK(!bad, "%s %s in place n=%lld", k->name, op ? "mul" : "add", (long long)n);
        }
        for (int i = 0; i < N + 8; i++) y[i] = 7.0f;
        k->rms_norm(n, y, x, 1e-5f);
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
        const double sc = 1.0 / sqrt((n ? ss / n : 0) + 1e-5);
        bool bad = false;
        for (int64_t i = 0; i < n && !bad; i++) bad = !(fabs(y[i] - x[i] * sc) <= 3e-7 * fabs(x[i] * sc) + 1e-30);
        for (int64_t i = n; i < N + 8 && !bad; i++) bad = y[i] != 7.0f;
        CHECK(!bad, "%s rms_norm n=%lld", k->name, (long long)n);
        if (n % 2)
            continue;
        for (int neox = 0; neox < 2; neox++) {
            for (int i = 0; i < N + 8; i++) y[i] = want[i] = 7.0f;
            ref.rope(n, neox, want, x, cs);
            k->rope(n, neox, y, x, cs);
            bad = memcmp(y, want, sizeof y) != 0;
            memcpy(y, x, sizeof y);
            k->rope(n, neox, y, y, cs); /* in place */
            for (int64_t i = 0; i < n && !bad; i++) bad = memcmp(&y[i], &want[i], 4) != 0;
            CHECK(!bad, "%s rope n_dims=%lld neox %d: not the reference's bits", k->name, (long long)n, neox);
        }
    }
    rng = rng0;
}

/* A hand-built contiguous host tensor (the kernels' view of a tensor). */
static void host_tensor(tsr_tensor *t, tsr_type type, int64_t n0, int64_t n1, void *data) {
    memset(t, 0, sizeof *t);
    t->type = type;
    t->n_dims = 2;
    t->ne[0] = n0, t->ne[1] = n1, t->ne[2] = t->ne[3] = 1;
    t->nb[0] = tsr_type_block_bytes(type);
    t->nb[1] = tsr_row_size(type, n0);
    t->nb[2] = t->nb[3] = t->nb[1] * (size_t)n1;
    t->data = data;
}

/* Out-of-range indices, which the core cannot always see at build time:
 * get_rows writes zero rows, set_rows skips the row. */
static void check_bad_indices(void) {
    tsr_stream *s;
    CHECK(tsr__cpu_stream_new(NULL, 2, &s) == TSR_OK, "stream");
    float src[4 * 3], out[4 * 3], rows[4 * 2];
    int32_t idx[3] = {1, -1, 3}, sidx[2] = {7, 0};
    for (int i = 0; i < 12; i++) src[i] = (float)(i + 1), out[i] = NAN;
    for (int i = 0; i < 8; i++) rows[i] = -(float)(i + 1);
    tsr_tensor a, ix, g, r, si, sr;
    host_tensor(&a, TSR_TYPE_F32, 4, 3, src);
    host_tensor(&ix, TSR_TYPE_I32, 3, 1, idx);
    host_tensor(&g, TSR_TYPE_F32, 4, 3, out);
    g.op = TSR_OP_GET_ROWS, g.src[0] = &a, g.src[1] = &ix;
    host_tensor(&r, TSR_TYPE_F32, 4, 2, rows);
    host_tensor(&si, TSR_TYPE_I32, 2, 1, sidx);
    host_tensor(&sr, TSR_TYPE_F32, 4, 3, src);
    sr.op = TSR_OP_SET_ROWS, sr.src[0] = &a, sr.src[1] = &r, sr.src[2] = &si;
    tsr_tensor *nodes[2] = {&g, &sr};
    CHECK(tsr__cpu_run_nodes(s, nodes, 2) == TSR_OK, "run: %s", tsr_last_error());
    for (int i = 0; i < 4; i++) {
        CHECK(out[i] == (float)(4 + i + 1), "get_rows row 0 [%d] = %g", i, out[i]);
        CHECK(out[4 + i] == 0.0f && out[8 + i] == 0.0f, "get_rows: out-of-range rows must be zero");
        CHECK(src[i] == -(float)(4 + i + 1), "set_rows: row 0 from source row 1");
        CHECK(src[4 + i] == (float)(4 + i + 1) && src[8 + i] == (float)(8 + i + 1), "set_rows: other rows kept");
    }
    tsr__cpu_stream_free(s);
}

typedef struct {
    tsr_threadpool *tp;
    atomic_int counter;
    int rounds;
    int bad;
    int nth; /* threads the pool ran the job on */
} tp_job;

static void tp_fn(void *arg, int ith, int nth) {
    tp_job *j = arg;
    if (ith == 0)
        j->nth = nth;
    for (int r = 0; r < j->rounds; r++) {
        atomic_fetch_add(&j->counter, 1);
        tsr__tp_barrier(j->tp);
        if (atomic_load(&j->counter) != (r + 1) * nth)
            j->bad = 1;
        tsr__tp_barrier(j->tp);
    }
}

static void check_threadpool(int n) {
    tsr_threadpool *tp;
    setenv("TSR_THREADPOOL_ADAPTIVE", "0", 1); /* every job on all n threads: the barriers are what is tested */
    CHECK(tsr__tp_new(n, &tp) == TSR_OK, "threadpool %d", n);
    for (int job = 0; job < 200; job++) {
        tp_job j = {.tp = tp, .rounds = 20};
        atomic_init(&j.counter, 0);
        tsr__tp_run(tp, tp_fn, &j);
        CHECK(j.nth == n, "threadpool %d: job %d ran on %d threads", n, job, j.nth);
        CHECK(!j.bad && atomic_load(&j.counter) == 20 * j.nth, "threadpool %d: barrier broken in job %d", n, job);
        if (j.bad)
            break;
    }
    tsr__tp_free(tp);
}

int main(void) {
    static const char *caps[] = {"scalar", "avx2", "avx512"};
    static const int64_t sizes[] = {0, 32, 256, 512, 4096, 96, 7, 160, 576};
    for (size_t c = 0; c < 3; c++) {
        tsr_cpu_kernels k;
        tsr__cpu_kernels_select(&k, caps[c]);
        if (c > 0 && strncmp(k.name, caps[c], strlen(caps[c])) != 0) {
            printf("variant %s: not available on this CPU/build (best is %s), skipped\n", caps[c], k.name);
            continue;
        }
        printf("variant %s\n", k.name);
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) check_variant(&k, sizes[s]);
        check_math(&k);
        check_q8_K(&k);
        check_q8_extremes(&k);
        check_rows(&k);
        check_gemm(&k);
        check_gemm_extremes(&k);
        check_gemv(&k);
        check_il8(&k);
        check_attn_gemm(&k);
        check_softmax_step(&k);
    }
    check_bad_indices();
    check_threadpool(1);
    check_threadpool(2);
    check_threadpool(5); /* more threads than cores: the futex path */
    return tsrtest_done("test-cpu-kernels");
}
