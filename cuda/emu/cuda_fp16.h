/*
 * cuda_fp16.h - the emulator's __half: IEEE binary16 bits with the
 * conversions the kernels use, rounding to nearest even (its own code,
 * independent of cuda/quant.h's, so the two check each other). C++ only.
 */
#ifndef TCU_EMU_CUDA_FP16_H
#define TCU_EMU_CUDA_FP16_H

#include <stdint.h>
#include <string.h>

namespace tcu_emu {
static inline float half_bits_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31;
    const int e = (h >> 10) & 31;
    const uint32_t m = h & 1023u;
    float f;
    if (e == 31) {
        const uint32_t b = sign | 0x7f800000u | (m << 13);
        memcpy(&f, &b, 4);
        return f;
    }
    /* value = m * 2^-24 for subnormals, (1024 + m) * 2^(e-25) otherwise: exact in float */
    const float mag = e == 0 ? (float)m * 0x1p-24f : (float)(1024u + m) * __builtin_ldexpf(1.0f, e - 25);
    return sign ? -mag : mag;
}

static inline uint16_t float_to_half_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u); /* a quiet NaN */
    if (ax == 0x7f800000u)
        return (uint16_t)(sign | 0x7c00u);
    float a;
    memcpy(&a, &ax, 4);
    if (a >= 65520.0f) /* half way between the largest half and 2^16 rounds up */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x1p-14f) { /* subnormal: the multiple of 2^-24 nearest, ties to even (float's own rounding) */
        const float q = a * 0x1p24f;
        const float r = __builtin_rintf(q); /* the default mode: nearest even */
        return (uint16_t)(sign | (uint16_t)r);
    }
    int e;
    const float fr = __builtin_frexpf(a, &e);   /* a = fr * 2^e, fr in [0.5, 1) */
    float mant = __builtin_rintf(fr * 2048.0f); /* 11 significant bits */
    if (mant == 2048.0f) {
        mant = 1024.0f;
        e++;
    }
    const int he = e - 1 + 15;
    if (he >= 31)
        return (uint16_t)(sign | 0x7c00u);
    return (uint16_t)(sign | (uint16_t)(he << 10) | (uint16_t)((uint32_t)mant - 1024u));
}
} // namespace tcu_emu

struct __half {
    uint16_t x_;
    __half() = default;
    __half(float f) : x_(tcu_emu::float_to_half_bits(f)) {}
    operator float() const { return tcu_emu::half_bits_to_float(x_); }
};

static inline __half __ushort_as_half(unsigned short u) {
    __half h;
    h.x_ = u;
    return h;
}
static inline unsigned short __half_as_ushort(__half h) { return h.x_; }
static inline float __half2float(__half h) { return tcu_emu::half_bits_to_float(h.x_); }
static inline __half __float2half(float f) { return __ushort_as_half(tcu_emu::float_to_half_bits(f)); }
static inline __half __float2half_rn(float f) { return __float2half(f); }

#endif /* TCU_EMU_CUDA_FP16_H */
