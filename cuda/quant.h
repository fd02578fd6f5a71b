/*
 * quant.h - one element of a stored row of any type the CUDA kernels read
 * (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), and the
 * Q8_0 block quantizer the cache writes use. Plain C that nvcc compiles for
 * the device too (TCU_HD), so tests/test-cuda-quant.c checks these very
 * functions against the library's reference dequantizers on a machine
 * without a GPU. Block layouts are ggml's (libtensr/quant/quants.h). On
 * the device, F16 conversions and float loads use the hardware's (the
 * same values; only the host paths are checked without a GPU).
 */
#ifndef TCU_QUANT_H
#define TCU_QUANT_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define TCU_HD __host__ __device__ __forceinline__
#else
#define TCU_HD static inline
#endif

/* The type numbers of libtensr.h (tsr_type), repeated so this header needs
 * nothing else; tests/test-cuda-quant.c checks that they agree. */
enum {
    TCU_F32 = 0,
    TCU_F16 = 1,
    TCU_Q4_0 = 2,
    TCU_Q4_1 = 3,
    TCU_Q5_0 = 6,
    TCU_Q5_1 = 7,
    TCU_Q8_0 = 8,
    TCU_Q4_K = 12,
    TCU_Q5_K = 13,
    TCU_Q6_K = 14,
    TCU_I32 = 26,
    TCU_I64 = 27,
    TCU_BF16 = 30
};

TCU_HD float tcu_half_to_float(uint16_t h) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h)); /* the same value, by the hardware */
#endif
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400u)) {
                mant <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even, as the library's tsr__fp32_to_fp16. */
TCU_HD uint16_t tcu_float_to_half(float f) {
#ifdef __CUDA_ARCH__
    return __half_as_ushort(__float2half_rn(f)); /* round to nearest even, as below */
#endif
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf, nan */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (ax < 0x33000000u)
            return sign;
        const uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e; /* 14 .. 24 */
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((ax >> 13) - ((127 - 15) << 10)) & 0xffffu;
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

TCU_HD float tcu_bf16_to_float(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

TCU_HD uint16_t tcu_float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 64); /* quiet nan */
    return (uint16_t)((x + (0x7fffu + ((x >> 16) & 1))) >> 16);
}

TCU_HD uint16_t tcu_u16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* Elements per block and bytes per block of a type the kernels read (0: not one). */
TCU_HD int tcu_block_size(int type) {
    switch (type) {
    case TCU_F32:
    case TCU_F16:
    case TCU_BF16:
    case TCU_I32: return 1;
    case TCU_Q4_0:
    case TCU_Q4_1:
    case TCU_Q5_0:
    case TCU_Q5_1:
    case TCU_Q8_0: return 32;
    case TCU_Q4_K:
    case TCU_Q5_K:
    case TCU_Q6_K: return 256;
    default: return 0;
    }
}

TCU_HD int tcu_block_bytes(int type) {
    switch (type) {
    case TCU_F32:
    case TCU_I32: return 4;
    case TCU_F16:
    case TCU_BF16: return 2;
    case TCU_Q4_0: return 18;
    case TCU_Q4_1: return 20;
    case TCU_Q5_0: return 22;
    case TCU_Q5_1: return 24;
    case TCU_Q8_0: return 34;
    case TCU_Q4_K: return 144;
    case TCU_Q5_K: return 176;
    case TCU_Q6_K: return 210;
    default: return 0;
    }
}

/* (scale, min) pair j of a Q4_K/Q5_K block's 12 packed scale bytes. */
TCU_HD void tcu_scale_min_k4(int j, const unsigned char *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Element e of a quantized row (blocks contiguous from row). */
TCU_HD float tcu_load_q(int type, const unsigned char *row, int64_t e) {
    const int bs = tcu_block_size(type);
    const unsigned char *b = row + (e / bs) * tcu_block_bytes(type);
    const int j = (int)(e % bs);
    switch (type) {
    case TCU_Q4_0: {
        const int q = j < 16 ? (b[2 + j] & 0xF) : (b[2 + j - 16] >> 4);
        return tcu_half_to_float(tcu_u16(b)) * (float)(q - 8);
    }
    case TCU_Q4_1: {
        const int q = j < 16 ? (b[4 + j] & 0xF) : (b[4 + j - 16] >> 4);
        return tcu_half_to_float(tcu_u16(b)) * (float)q + tcu_half_to_float(tcu_u16(b + 2));
    }
    case TCU_Q5_0:
    case TCU_Q5_1: {
        const int off = type == TCU_Q5_0 ? 2 : 4;
        const uint32_t qh = (uint32_t)b[off] | ((uint32_t)b[off + 1] << 8) | ((uint32_t)b[off + 2] << 16) |
                            ((uint32_t)b[off + 3] << 24);
        const unsigned char *qs = b + off + 4;
        const int q = j < 16 ? ((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10))
                             : ((qs[j - 16] >> 4) | ((qh >> (j - 16 + 12)) & 0x10));
        const float d = tcu_half_to_float(tcu_u16(b));
        return type == TCU_Q5_0 ? d * (float)(q - 16) : d * (float)q + tcu_half_to_float(tcu_u16(b + 2));
    }
    case TCU_Q8_0: return tcu_half_to_float(tcu_u16(b)) * (float)(signed char)b[2 + j];
    case TCU_Q4_K:
    case TCU_Q5_K: {
        const int g = j / 64, hi = (j % 64) / 32, l = j % 32;
        int sc, m;
        tcu_scale_min_k4(2 * g + hi, b + 4, &sc, &m);
        const unsigned char *qs = b + 4 + 12 + (type == TCU_Q5_K ? 32 : 0);
        int q = hi ? (qs[32 * g + l] >> 4) : (qs[32 * g + l] & 0xF);
        if (type == TCU_Q5_K)
            q += ((b[16 + l] >> (2 * g + hi)) & 1) << 4;
        return tcu_half_to_float(tcu_u16(b)) * (float)sc * (float)q - tcu_half_to_float(tcu_u16(b + 2)) * (float)m;
    }
    case TCU_Q6_K: {
        const unsigned char *ql = b, *qh = b + 128;
        const signed char *scales = (const signed char *)(b + 192);
        const int h = j / 128, w = j % 128, quarter = w / 32, l = w % 32;
        const unsigned char *qlp = ql + 64 * h, *qhp = qh + 32 * h;
        const int lo = (quarter & 1) ? qlp[l + 32] : qlp[l];
        const int q = (((quarter & 2) ? lo >> 4 : lo & 0xF) | (((qhp[l] >> (2 * quarter)) & 3) << 4)) - 32;
        const int is = 8 * h + l / 16 + 2 * quarter;
        return tcu_half_to_float(tcu_u16(b + 208)) * (float)scales[is] * (float)q;
    }
    default: return 0.0f;
    }
}

/* Element e of a row of any readable type; nb0 is the element stride of
 * the non-quantized types (quantized rows are contiguous). */
TCU_HD float tcu_load(int type, const unsigned char *row, int64_t e, int64_t nb0) {
#ifdef __CUDA_ARCH__
    /* on the device: plain loads (tensor data is aligned to its element size) */
    switch (type) {
    case TCU_F32: return *(const float *)(row + e * nb0);
    case TCU_F16: return tcu_half_to_float(*(const uint16_t *)(row + e * nb0));
    case TCU_BF16: return tcu_bf16_to_float(*(const uint16_t *)(row + e * nb0));
    default: return tcu_load_q(type, row, e);
    }
#endif
    switch (type) {
    case TCU_F32: {
        float f;
        memcpy(&f, row + e * nb0, 4);
        return f;
    }
    case TCU_F16: {
        uint16_t h;
        memcpy(&h, row + e * nb0, 2);
        return tcu_half_to_float(h);
    }
    case TCU_BF16: {
        uint16_t h;
        memcpy(&h, row + e * nb0, 2);
        return tcu_bf16_to_float(h);
    }
    default: return tcu_load_q(type, row, e);
    }
}

/* The 8-bit quantizers' scale of 32 floats: absmax / 127 (*inv its inverse, 0 for 0). */
TCU_HD float tcu_scale32(const float *x, float *inv) {
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) {
        const float a = x[i] < 0 ? -x[i] : x[i];
        if (a > amax)
            amax = a;
    }
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    *inv = id < 3.402823466e38f ? id : 3.402823466e38f; /* a subnormal d: 1/d is inf, and x * inf no integer */
    return d;
}

/* Rounded to nearest, halves away from zero. */
TCU_HD int tcu_round(float v) { return v < 0 ? -(int)(-v + 0.5f) : (int)(v + 0.5f); }

/* Quantizes 32 floats into one Q8_0 block (as the library's reference:
 * d = absmax / 127, q = round(x / d)). */
TCU_HD void tcu_quantize_q8_0(const float *x, unsigned char *out) {
    float id;
    const float d = tcu_scale32(x, &id);
    const uint16_t dh = tcu_float_to_half(d);
    out[0] = (unsigned char)(dh & 0xff);
    out[1] = (unsigned char)(dh >> 8);
    for (int i = 0; i < 32; i++) out[2 + i] = (unsigned char)(signed char)tcu_round(x[i] * id);
}

/* ---- activations quantized once: Q8_1 and integer dot products ------------ */

/* 32 activations: x ~ d * qs, s = d * (sum of qs) (the offset terms of the
 * weight types use it). */
typedef struct tcu_q8_1 {
    float d, s;
    signed char qs[32];
} tcu_q8_1;

/* Quantizes 32 floats (d = absmax / 127, q = round(x / d), as Q8_0). */
TCU_HD void tcu_quantize_q8_1(const float *x, tcu_q8_1 *out) {
    float id;
    const float d = tcu_scale32(x, &id);
    int sum = 0;
    for (int i = 0; i < 32; i++) {
        const int q = tcu_round(x[i] * id);
        out->qs[i] = (signed char)q;
        sum += q;
    }
    out->d = d;
    out->s = d * (float)sum;
}

/* Four bytes at p (p even: every quantized field the dots read is). */
TCU_HD uint32_t tcu_u32(const unsigned char *p) {
#ifdef __CUDA_ARCH__
    const uint16_t *h = (const uint16_t *)p;
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
#else
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
#endif
}

/* c + the dot product of a's and b's four signed bytes (__dp4a). */
TCU_HD int tcu_dp4a(uint32_t a, uint32_t b, int c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
    return __dp4a((int)a, (int)b, c);
#else /* the host, and GPUs before sm_61 */
    for (int i = 0; i < 4; i++) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
#endif
}

/* Word i (values 4i..4i+3) of y's values: one 4-byte load on the device
 * (a Q8_1 block is 40 bytes, its values at offset 8). */
TCU_HD uint32_t tcu_yq(const tcu_q8_1 *y, int i) {
#ifdef __CUDA_ARCH__
    return ((const uint32_t *)y->qs)[i];
#else
    return tcu_u32((const unsigned char *)y->qs + 4 * i);
#endif
}

/* Spreads bits b..b+3 of qh to bit 4 of four bytes. */
TCU_HD uint32_t tcu_qh4(uint32_t qh, int b) {
    const uint32_t v = qh >> b;
    return ((v & 1u) << 4) | ((v & 2u) << 11) | ((v & 4u) << 18) | ((v & 8u) << 25);
}

/* Part of segment sub (32 values) of the weight block wb against y: the
 * float dot product of the dequantized weights with y's values (y.d *
 * y.qs) over the segment's 4-value groups w0..w1-1 (of 8; 0, 8 is the whole
 * segment), the offset terms (y.s) in the part with w0 == 0. A 4-value group
 * is one 4-byte word of y and of the weights' low bits: the nibble types'
 * group w is the low (w even) or high nibbles of qs word w / 2, so the
 * mat-vec's threads that take two groups each read adjacent words. The
 * 32-value types have one segment per block, the K types eight. The parts
 * of a segment add up to its whole (integer sums exact, the scales the same). */
TCU_HD float tcu_dot_q8_1_part(int type, const unsigned char *wb, int sub, const tcu_q8_1 *y, int w0, int w1) {
    const int first = w0 == 0;
    switch (type) {
    case TCU_Q4_0:
    case TCU_Q4_1:
    case TCU_Q5_0:
    case TCU_Q5_1: {
        const int q5 = type == TCU_Q5_0 || type == TCU_Q5_1, off = type == TCU_Q4_0 || type == TCU_Q5_0 ? 2 : 4;
        const unsigned char *qs = wb + off + (q5 ? 4 : 0);
        const uint32_t qh = q5 ? tcu_u32(wb + off) : 0;
        int sum = 0;
        for (int w = w0; w < w1; w++) {
            const int j = (w & 1) * 4 + w / 2; /* y's word: values 4j..4j+3 */
            const uint32_t v = tcu_u32(qs + 4 * (w / 2));
            uint32_t q = (w & 1) ? (v >> 4) & 0x0F0F0F0Fu : v & 0x0F0F0F0Fu;
            if (q5)
                q |= tcu_qh4(qh, 4 * j);
            sum = tcu_dp4a(q, tcu_yq(y, j), sum);
        }
        const float d = tcu_half_to_float(tcu_u16(wb));
        if (type == TCU_Q4_0 || type == TCU_Q5_0)
            return d * (y->d * (float)sum - (first ? (type == TCU_Q4_0 ? 8.0f : 16.0f) * y->s : 0.0f));
        return d * y->d * (float)sum + (first ? tcu_half_to_float(tcu_u16(wb + 2)) * y->s : 0.0f);
    }
    case TCU_Q8_0: {
        int sum = 0;
        for (int j = w0; j < w1; j++) sum = tcu_dp4a(tcu_u32(wb + 2 + 4 * j), tcu_yq(y, j), sum);
        return tcu_half_to_float(tcu_u16(wb)) * y->d * (float)sum;
    }
    case TCU_Q4_K:
    case TCU_Q5_K: {
        int sc, m;
        tcu_scale_min_k4(sub, wb + 4, &sc, &m);
        const int g = sub / 2, hi = sub % 2;
        const unsigned char *qs = wb + 4 + 12 + (type == TCU_Q5_K ? 32 : 0) + 32 * g;
        int sum = 0;
        for (int j = w0; j < w1; j++) {
            const uint32_t v = tcu_u32(qs + 4 * j);
            uint32_t q = hi ? (v >> 4) & 0x0F0F0F0Fu : v & 0x0F0F0F0Fu;
            if (type == TCU_Q5_K) /* bit `sub` of qh[l] is bit 4 of value l */
                q |= ((tcu_u32(wb + 16 + 4 * j) >> sub) & 0x01010101u) << 4;
            sum = tcu_dp4a(q, tcu_yq(y, j), sum);
        }
        return tcu_half_to_float(tcu_u16(wb)) * (float)sc * y->d * (float)sum -
               (first ? tcu_half_to_float(tcu_u16(wb + 2)) * (float)m * y->s : 0.0f);
    }
    case TCU_Q6_K: { /* segment sub = 4 * h + quarter: values l = 0..31 */
        const int h = sub / 4, quarter = sub % 4;
        const unsigned char *ql = wb + 64 * h + ((quarter & 1) ? 32 : 0), *qh = wb + 128 + 32 * h;
        const signed char *scales = (const signed char *)(wb + 192) + 8 * h + 2 * quarter;
        int part[2] = {0, 0}, ysum[2] = {0, 0}; /* (q - 32) . y = q . y - 32 (sum of y), per 16 values */
        for (int j = w0; j < w1; j++) {
            const uint32_t lo = tcu_u32(ql + 4 * j), hb = tcu_u32(qh + 4 * j);
            const uint32_t q4 = (quarter & 2) ? (lo >> 4) & 0x0F0F0F0Fu : lo & 0x0F0F0F0Fu;
            const uint32_t q = q4 | (((hb >> (2 * quarter)) & 0x03030303u) << 4);
            part[j / 4] = tcu_dp4a(q, tcu_yq(y, j), part[j / 4]);
            ysum[j / 4] = tcu_dp4a(0x01010101u, tcu_yq(y, j), ysum[j / 4]);
        }
        return tcu_half_to_float(tcu_u16(wb + 208)) * y->d *
               ((float)scales[0] * (float)(part[0] - 32 * ysum[0]) +
                (float)scales[1] * (float)(part[1] - 32 * ysum[1]));
    }
    default: return 0.0f;
    }
}

/* The whole segment. */
TCU_HD float tcu_dot_q8_1(int type, const unsigned char *wb, int sub, const tcu_q8_1 *y) {
    return tcu_dot_q8_1_part(type, wb, sub, y, 0, 8);
}

/* Whether the matrix-vector kernels take type's weights with Q8_1 activations. */
TCU_HD int tcu_dot_q8_1_type(int type) {
    switch (type) {
    case TCU_Q4_0:
    case TCU_Q4_1:
    case TCU_Q5_0:
    case TCU_Q5_1:
    case TCU_Q8_0:
    case TCU_Q4_K:
    case TCU_Q5_K:
    case TCU_Q6_K: return 1;
    default: return 0;
    }
}

#endif /* TCU_QUANT_H */
