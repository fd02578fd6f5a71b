/*
 * quants-k.c - reference quantizers and dequantizers of the 256-element
 * "K" block types (Q2_K Q3_K dequantize only; Q4_K Q5_K Q6_K Q8_K both ways).
 * The quantizers follow llama.cpp's reference search for scales (weighted
 * least squares over a few candidate scales), so files they write are as
 * accurate as llama.cpp's; dequantization is bit-exact.
 */
#include "quant/quants.h"

#include <math.h>

/* Round half to even, as llama.cpp's nearest_int (magic-number trick). */
static inline int nearest_int(float fval) {
    float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Fit x ~ scale * L + min (L in 0..nmax, min <= 0) by weighted least squares
 * over nstep candidate scales; returns scale, *the_min = -min. */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                              uint8_t *Laux, float rmin, float rdelta, int nstep) {
    float min = x[0], max = x[0];
    float sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min)
            min = x[i];
        if (x[i] > max)
            max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_mad = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
        L[i] = (uint8_t)l;
        float diff = scale * l + min - x[i];
        best_mad += weights[i] * diff * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float mad = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                mad += weights[i] * diff * diff;
            }
            if (mad < best_mad) {
                memcpy(L, Laux, (size_t)n);
                best_mad = mad;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Symmetric fit x ~ scale * (L - nmax) weighting by x^2 (rmse_type 1),
 * trying 18 perturbations of the scale around the max. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0)
            continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
                L[i] = (int8_t)(nmax + l);
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Packs 8 6-bit (scale, min) pairs into 12 bytes (the Q4_K/Q5_K layout). */
static void pack_scale_min_k4(uint8_t *q, const uint8_t *ls, const uint8_t *lm) {
    memset(q, 0, TSR_K_SCALE_SIZE);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            q[j] = ls[j];
            q[j + 4] = lm[j];
        } else {
            q[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            q[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            q[j - 0] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

/* Shared by Q4_K (nmax 15) and Q5_K (nmax 31): per sub-block scale/min fit,
 * 6-bit super-scales, then requantization with the rounded scales. */
static void quantize_k4_block(const float *x, int nmax, float rmin, int nstep, uint8_t *L, tsr_half *dd, tsr_half *dmin,
                              uint8_t *packed) {
    float mins[8], scales[8], weights[32];
    uint8_t Laux[32], ls[8], lm[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; j++) {
        int a = nearest_int(inv_scale * scales[j]), b = nearest_int(inv_min * mins[j]);
        ls[j] = (uint8_t)(a < 63 ? a : 63);
        lm[j] = (uint8_t)(b < 63 ? b : 63);
    }
    pack_scale_min_k4(packed, ls, lm);
    *dd = tsr__fp32_to_fp16(max_scale / 63.f);
    *dmin = tsr__fp32_to_fp16(max_min / 63.f);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        tsr__get_scale_min_k4(j, packed, &sc, &m);
        const float d = tsr__fp16_to_fp32(*dd) * sc;
        if (!d)
            continue;
        const float dm = tsr__fp16_to_fp32(*dmin) * m;
        for (int ii = 0; ii < 32; ii++)
            L[32 * j + ii] = (uint8_t)clampi(nearest_int((x[32 * j + ii] + dm) / d), 0, nmax);
    }
}

void tsr__quantize_q4_K(const float *x, void *vy, int64_t n) {
    tsr_block_q4_K *y = vy;
    uint8_t L[TSR_QK_K];
    for (int64_t i = 0; i < n / TSR_QK_K; i++, x += TSR_QK_K) {
        quantize_k4_block(x, 15, -1.f, 20, L, &y[i].d, &y[i].dmin, y[i].scales);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < TSR_QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

void tsr__quantize_q5_K(const float *x, void *vy, int64_t n) {
    tsr_block_q5_K *y = vy;
    uint8_t L[TSR_QK_K];
    for (int64_t i = 0; i < n / TSR_QK_K; i++, x += TSR_QK_K) {
        quantize_k4_block(x, 31, -0.5f, 15, L, &y[i].d, &y[i].dmin, y[i].scales);
        uint8_t *qh = y[i].qh, *ql = y[i].qs;
        memset(qh, 0, TSR_QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int j = 0; j < TSR_QK_K; j += 64, ql += 32, m1 <<= 2, m2 <<= 2) {
            for (int l = 0; l < 32; l++) {
                int l1 = L[j + l], l2 = L[j + l + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[l] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    qh[l] |= m2;
                }
                ql[l] = (uint8_t)(l1 | (l2 << 4));
            }
        }
    }
}

static void pack_q6_K(const int8_t *L, uint8_t *ql, uint8_t *qh) {
    for (int j = 0; j < TSR_QK_K; j += 128, ql += 64, qh += 32) {
        for (int l = 0; l < 32; l++) {
            const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
            const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
            ql[l] = (uint8_t)(q1 | (q3 << 4));
            ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
            qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                              ((L[j + l + 96] >> 4) << 6));
        }
    }
}

void tsr__quantize_q6_K(const float *x, void *vy, int64_t n) {
    tsr_block_q6_K *y = vy;
    int8_t L[TSR_QK_K];
    float scales[TSR_QK_K / 16];
    for (int64_t i = 0; i < n / TSR_QK_K; i++, x += TSR_QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < TSR_QK_K / 16; ib++) {
            const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            if (fabsf(scale) > max_abs_scale) {
                max_abs_scale = fabsf(scale);
                max_scale = scale;
            }
        }
        if (max_abs_scale < 1e-15f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float iscale = -128.f / max_scale;
        y[i].d = tsr__fp32_to_fp16(1 / iscale);
        for (int ib = 0; ib < TSR_QK_K / 16; ib++) {
            int v = nearest_int(iscale * scales[ib]);
            y[i].scales[ib] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < TSR_QK_K / 16; j++) {
            const float d = tsr__fp16_to_fp32(y[i].d) * y[i].scales[j];
            if (!d)
                continue;
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] = (int8_t)(clampi(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
        }
        pack_q6_K(L, y[i].ql, y[i].qh);
    }
}

void tsr__quantize_q8_K(const float *x, void *vy, int64_t n) {
    tsr_block_q8_K *y = vy;
    for (int64_t i = 0; i < n / TSR_QK_K; i++, x += TSR_QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < TSR_QK_K; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < TSR_QK_K; j++) {
            int v = nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < TSR_QK_K / 16; j++) {
            int sum = 0;
            for (int ii = 0; ii < 16; ii++) sum += y[i].qs[j * 16 + ii];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

void tsr__dequantize_q2_K(const void *vx, float *y, int64_t n) {
    const tsr_block_q2_K *x = vx;
    for (int64_t i = 0; i < n / TSR_QK_K; i++) {
        const float d = tsr__fp16_to_fp32(x[i].d), min = tsr__fp16_to_fp32(x[i].dmin);
        const uint8_t *q = x[i].qs;
        int is = 0;
        for (int nn = 0; nn < TSR_QK_K; nn += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int half = 0; half < 2; half++) {
                    const uint8_t sc = x[i].scales[is++];
                    const float dl = d * (sc & 0xF), ml = min * (sc >> 4);
                    for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
                }
            }
        }
    }
}

/* 6-bit signed scale i of a Q3_K block: low 4 bits from bytes 0..7, high 2
 * bits from bytes 8..11. */
static int q3_K_scale(const uint8_t *s, int i) {
    const int lo = i < 8 ? (s[i] & 0xF) : (s[i - 8] >> 4);
    const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

void tsr__dequantize_q3_K(const void *vx, float *y, int64_t n) {
    const tsr_block_q3_K *x = vx;
    for (int64_t i = 0; i < n / TSR_QK_K; i++) {
        const float d_all = tsr__fp16_to_fp32(x[i].d);
        const uint8_t *q = x[i].qs, *hm = x[i].hmask;
        uint8_t m = 1;
        int is = 0;
        for (int nn = 0; nn < TSR_QK_K; nn += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
                for (int half = 0; half < 2; half++) {
                    const float dl = d_all * (float)q3_K_scale(x[i].scales, is++);
                    for (int l = 16 * half; l < 16 * half + 16; l++)
                        *y++ = dl * (float)(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
                }
            }
        }
    }
}

void tsr__dequantize_q4_K(const void *vx, float *y, int64_t n) {
    const tsr_block_q4_K *x = vx;
    for (int64_t i = 0; i < n / TSR_QK_K; i++) {
        const float d = tsr__fp16_to_fp32(x[i].d), min = tsr__fp16_to_fp32(x[i].dmin);
        const uint8_t *q = x[i].qs;
        for (int j = 0, is = 0; j < TSR_QK_K; j += 64, q += 32, is += 2) {
            uint8_t sc, m;
            tsr__get_scale_min_k4(is + 0, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            tsr__get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

void tsr__dequantize_q5_K(const void *vx, float *y, int64_t n) {
    const tsr_block_q5_K *x = vx;
    for (int64_t i = 0; i < n / TSR_QK_K; i++) {
        const float d = tsr__fp16_to_fp32(x[i].d), min = tsr__fp16_to_fp32(x[i].dmin);
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0, is = 0; j < TSR_QK_K; j += 64, ql += 32, is += 2, u1 <<= 2, u2 <<= 2) {
            uint8_t sc, m;
            tsr__get_scale_min_k4(is + 0, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            tsr__get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

void tsr__dequantize_q6_K(const void *vx, float *y, int64_t n) {
    const tsr_block_q6_K *x = vx;
    for (int64_t i = 0; i < n / TSR_QK_K; i++) {
        const float d = tsr__fp16_to_fp32(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int nn = 0; nn < TSR_QK_K; nn += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

void tsr__dequantize_q8_K(const void *vx, float *y, int64_t n) {
    const tsr_block_q8_K *x = vx;
    for (int64_t i = 0; i < n / TSR_QK_K; i++)
        for (int j = 0; j < TSR_QK_K; j++) *y++ = x[i].d * x[i].qs[j];
}
