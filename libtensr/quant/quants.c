/*
 * quants.c - reference quantizers and dequantizers of the 32-element block
 * types (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q8_1, IQ4_NL). These are the definition of
 * correct: byte-identical to llama.cpp's reference quantizer (same operation
 * order in float, no FMA contraction: this file is built without -mfma).
 */
#include "quant/quants.h"

#include <math.h>

/* Value of largest magnitude (signed): its sign picks the direction of d so
 * that the extreme maps exactly onto the end of the quant range. */
static float signed_absmax(const float *x, int n, float *amax_out) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    if (amax_out)
        *amax_out = amax;
    return max;
}

/* Q8_0's and Q8_1's value from x * (1 / d): |x| <= max|x| = 127 d makes it
 * at most 127 (and a few ulps); NaN (a NaN value, or an infinity times the
 * multiplier 0 of a block whose max is infinite) and an infinity (a
 * multiplier past FLT_MAX: values below 127 / FLT_MAX) give 0, as the
 * x86 activation quantizers (cpu/avx2/quantize.c) do, where C's conversion
 * would be undefined. */
static inline int8_t q8_round(float p) { return fabsf(p) < 127.5f ? (int8_t)roundf(p) : 0; }

static void min_max(const float *x, int n, float *mn, float *mx) {
    float lo = INFINITY, hi = -INFINITY;
    for (int j = 0; j < n; j++) {
        if (x[j] < lo)
            lo = x[j];
        if (x[j] > hi)
            hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}

void tsr__quantize_q4_0(const float *x, void *vy, int64_t n) {
    tsr_block_q4_0 *y = vy;
    for (int64_t i = 0; i < n / TSR_QK4_0; i++, x += TSR_QK4_0) {
        const float max = signed_absmax(x, TSR_QK4_0, NULL);
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = tsr__fp32_to_fp16(d);
        for (int j = 0; j < TSR_QK4_0 / 2; j++) {
            const float x0 = x[j] * id, x1 = x[TSR_QK4_0 / 2 + j] * id;
            const int a = (int8_t)(x0 + 8.5f), b = (int8_t)(x1 + 8.5f);
            const uint8_t q0 = (uint8_t)(a < 15 ? a : 15), q1 = (uint8_t)(b < 15 ? b : 15);
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void tsr__quantize_q4_1(const float *x, void *vy, int64_t n) {
    tsr_block_q4_1 *y = vy;
    for (int64_t i = 0; i < n / TSR_QK4_1; i++, x += TSR_QK4_1) {
        float mn, mx;
        min_max(x, TSR_QK4_1, &mn, &mx);
        const float d = (mx - mn) / ((1 << 4) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = tsr__fp32_to_fp16(d);
        y[i].m = tsr__fp32_to_fp16(mn);
        for (int j = 0; j < TSR_QK4_1 / 2; j++) {
            const float x0 = (x[j] - mn) * id, x1 = (x[TSR_QK4_1 / 2 + j] - mn) * id;
            const int a = (int8_t)(x0 + 0.5f), b = (int8_t)(x1 + 0.5f);
            const uint8_t q0 = (uint8_t)(a < 15 ? a : 15), q1 = (uint8_t)(b < 15 ? b : 15);
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void tsr__quantize_q5_0(const float *x, void *vy, int64_t n) {
    tsr_block_q5_0 *y = vy;
    for (int64_t i = 0; i < n / TSR_QK5_0; i++, x += TSR_QK5_0) {
        const float max = signed_absmax(x, TSR_QK5_0, NULL);
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        y[i].d = tsr__fp32_to_fp16(d);
        for (int j = 0; j < TSR_QK5_0 / 2; j++) {
            const float x0 = x[j] * id, x1 = x[TSR_QK5_0 / 2 + j] * id;
            const int a = (int8_t)(x0 + 16.5f), b = (int8_t)(x1 + 16.5f);
            const uint8_t q0 = (uint8_t)(a < 31 ? a : 31), q1 = (uint8_t)(b < 31 ? b : 31);
            y[i].qs[j] = (uint8_t)((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= (uint32_t)((q0 & 0x10) >> 4) << j;
            qh |= (uint32_t)((q1 & 0x10) >> 4) << (j + TSR_QK5_0 / 2);
        }
        memcpy(y[i].qh, &qh, sizeof qh);
    }
}

void tsr__quantize_q5_1(const float *x, void *vy, int64_t n) {
    tsr_block_q5_1 *y = vy;
    for (int64_t i = 0; i < n / TSR_QK5_1; i++, x += TSR_QK5_1) {
        float mn, mx;
        min_max(x, TSR_QK5_1, &mn, &mx);
        const float d = (mx - mn) / ((1 << 5) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        y[i].d = tsr__fp32_to_fp16(d);
        y[i].m = tsr__fp32_to_fp16(mn);
        for (int j = 0; j < TSR_QK5_1 / 2; j++) {
            const float x0 = (x[j] - mn) * id, x1 = (x[TSR_QK5_1 / 2 + j] - mn) * id;
            const uint8_t q0 = (uint8_t)(x0 + 0.5f), q1 = (uint8_t)(x1 + 0.5f);
            y[i].qs[j] = (uint8_t)((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= (uint32_t)((q0 & 0x10) >> 4) << j;
            qh |= (uint32_t)((q1 & 0x10) >> 4) << (j + TSR_QK5_1 / 2);
        }
        memcpy(y[i].qh, &qh, sizeof qh);
    }
}

void tsr__quantize_q8_0(const float *x, void *vy, int64_t n) {
    tsr_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / TSR_QK8_0; i++, x += TSR_QK8_0) {
        float amax;
        signed_absmax(x, TSR_QK8_0, &amax);
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = tsr__fp32_to_fp16(d);
        for (int j = 0; j < TSR_QK8_0; j++) y[i].qs[j] = q8_round(x[j] * id);
    }
}

void tsr__quantize_q8_1(const float *x, void *vy, int64_t n) {
    tsr_block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / TSR_QK8_1; i++, x += TSR_QK8_1) {
        float amax;
        signed_absmax(x, TSR_QK8_1, &amax);
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        int sum = 0;
        y[i].d = tsr__fp32_to_fp16(d);
        for (int j = 0; j < TSR_QK8_1; j++) {
            y[i].qs[j] = q8_round(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].s = tsr__fp32_to_fp16((float)sum * d);
    }
}

void tsr__dequantize_q4_0(const void *vx, float *y, int64_t n) {
    const tsr_block_q4_0 *x = vx;
    for (int64_t i = 0; i < n / TSR_QK4_0; i++, y += TSR_QK4_0) {
        const float d = tsr__fp16_to_fp32(x[i].d);
        for (int j = 0; j < TSR_QK4_0 / 2; j++) {
            y[j] = (float)((x[i].qs[j] & 0x0F) - 8) * d;
            y[j + TSR_QK4_0 / 2] = (float)((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

void tsr__dequantize_q4_1(const void *vx, float *y, int64_t n) {
    const tsr_block_q4_1 *x = vx;
    for (int64_t i = 0; i < n / TSR_QK4_1; i++, y += TSR_QK4_1) {
        const float d = tsr__fp16_to_fp32(x[i].d), m = tsr__fp16_to_fp32(x[i].m);
        for (int j = 0; j < TSR_QK4_1 / 2; j++) {
            y[j] = (float)(x[i].qs[j] & 0x0F) * d + m;
            y[j + TSR_QK4_1 / 2] = (float)(x[i].qs[j] >> 4) * d + m;
        }
    }
}

void tsr__dequantize_q5_0(const void *vx, float *y, int64_t n) {
    const tsr_block_q5_0 *x = vx;
    for (int64_t i = 0; i < n / TSR_QK5_0; i++, y += TSR_QK5_0) {
        const float d = tsr__fp16_to_fp32(x[i].d);
        uint32_t qh;
        memcpy(&qh, x[i].qh, sizeof qh);
        for (int j = 0; j < TSR_QK5_0 / 2; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = (float)(((x[i].qs[j] & 0x0F) | h0) - 16) * d;
            y[j + TSR_QK5_0 / 2] = (float)(((x[i].qs[j] >> 4) | h1) - 16) * d;
        }
    }
}

void tsr__dequantize_q5_1(const void *vx, float *y, int64_t n) {
    const tsr_block_q5_1 *x = vx;
    for (int64_t i = 0; i < n / TSR_QK5_1; i++, y += TSR_QK5_1) {
        const float d = tsr__fp16_to_fp32(x[i].d), m = tsr__fp16_to_fp32(x[i].m);
        uint32_t qh;
        memcpy(&qh, x[i].qh, sizeof qh);
        for (int j = 0; j < TSR_QK5_1 / 2; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = (float)((x[i].qs[j] & 0x0F) | h0) * d + m;
            y[j + TSR_QK5_1 / 2] = (float)((x[i].qs[j] >> 4) | h1) * d + m;
        }
    }
}

void tsr__dequantize_q8_0(const void *vx, float *y, int64_t n) {
    const tsr_block_q8_0 *x = vx;
    for (int64_t i = 0; i < n / TSR_QK8_0; i++, y += TSR_QK8_0) {
        const float d = tsr__fp16_to_fp32(x[i].d);
        for (int j = 0; j < TSR_QK8_0; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

void tsr__dequantize_q8_1(const void *vx, float *y, int64_t n) {
    const tsr_block_q8_1 *x = vx;
    for (int64_t i = 0; i < n / TSR_QK8_1; i++, y += TSR_QK8_1) {
        const float d = tsr__fp16_to_fp32(x[i].d);
        for (int j = 0; j < TSR_QK8_1; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

/* The non-linear 4-bit grid of IQ4_NL / IQ4_XS. */
static const int8_t iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

void tsr__dequantize_iq4_nl(const void *vx, float *y, int64_t n) {
    const tsr_block_iq4_nl *x = vx;
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        const float d = tsr__fp16_to_fp32(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)iq4nl_values[x[i].qs[j] & 0xF];
            y[j + 16] = d * (float)iq4nl_values[x[i].qs[j] >> 4];
        }
    }
}

void tsr__dequantize_iq4_xs(const void *vx, float *y, int64_t n) {
    const tsr_block_iq4_xs *x = vx;
    for (int64_t i = 0; i < n / TSR_QK_K; i++) {
        const float d = tsr__fp16_to_fp32(x[i].d);
        const uint8_t *qs = x[i].qs;
        for (int ib = 0; ib < TSR_QK_K / 32; ib++, qs += 16, y += 32) {
            const int ls = ((x[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((x[i].scales_h >> 2 * ib) & 3) << 4);
            const float dl = d * (float)(ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)iq4nl_values[qs[j] & 0xF];
                y[j + 16] = dl * (float)iq4nl_values[qs[j] >> 4];
            }
        }
    }
}
