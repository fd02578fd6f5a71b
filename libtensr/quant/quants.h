/*
 * quants.h - private: block layouts of the quantized types (bit-compatible
 * with GGUF / llama.cpp) and the reference (de)quantizers of quants.c.
 * Shared by type.c and the CPU backend (cpu/), which adds SIMD variants.
 */
#ifndef TSR_QUANTS_H
#define TSR_QUANTS_H

#include "internal.h"

#define TSR_QK4_0 32
#define TSR_QK4_1 32
#define TSR_QK5_0 32
#define TSR_QK5_1 32
#define TSR_QK8_0 32
#define TSR_QK8_1 32
#define TSR_QK_K 256
#define TSR_K_SCALE_SIZE 12

typedef uint16_t tsr_half;

/* one line per block layout, as GGUF documents them */
// clang-format off
typedef struct { tsr_half d; uint8_t qs[TSR_QK4_0 / 2]; } tsr_block_q4_0;
typedef struct { tsr_half d, m; uint8_t qs[TSR_QK4_1 / 2]; } tsr_block_q4_1;
typedef struct { tsr_half d; uint8_t qh[4]; uint8_t qs[TSR_QK5_0 / 2]; } tsr_block_q5_0;
typedef struct { tsr_half d, m; uint8_t qh[4]; uint8_t qs[TSR_QK5_1 / 2]; } tsr_block_q5_1;
typedef struct { tsr_half d; int8_t qs[TSR_QK8_0]; } tsr_block_q8_0;
/* s = d * sum(qs): lets dot products with Q4_1/Q5_1 apply the min term once. */
typedef struct { tsr_half d, s; int8_t qs[TSR_QK8_1]; } tsr_block_q8_1;
// clang-format on
typedef struct {
    tsr_half d, dmin;
    uint8_t scales[TSR_K_SCALE_SIZE]; /* 8 (scale, min) pairs of 6 bits */
    uint8_t qs[TSR_QK_K / 2];
} tsr_block_q4_K;
typedef struct {
    tsr_half d, dmin;
    uint8_t scales[TSR_K_SCALE_SIZE];
    uint8_t qh[TSR_QK_K / 8];
    uint8_t qs[TSR_QK_K / 2];
} tsr_block_q5_K;
typedef struct {
    uint8_t ql[TSR_QK_K / 2];
    uint8_t qh[TSR_QK_K / 4];
    int8_t scales[TSR_QK_K / 16];
    tsr_half d;
} tsr_block_q6_K;
typedef struct {
    float d;
    int8_t qs[TSR_QK_K];
    int16_t bsums[TSR_QK_K / 16]; /* sums of groups of 16 qs, for the min terms */
} tsr_block_q8_K;
typedef struct {
    uint8_t scales[TSR_QK_K / 16];
    uint8_t qs[TSR_QK_K / 4];
    tsr_half d, dmin;
} tsr_block_q2_K;
typedef struct {
    uint8_t hmask[TSR_QK_K / 8];
    uint8_t qs[TSR_QK_K / 4];
    uint8_t scales[12];
    tsr_half d;
} tsr_block_q3_K;
// clang-format off
typedef struct { tsr_half d; uint8_t qs[16]; } tsr_block_iq4_nl;
// clang-format on
typedef struct {
    tsr_half d;
    uint16_t scales_h;
    uint8_t scales_l[TSR_QK_K / 64];
    uint8_t qs[TSR_QK_K / 2];
} tsr_block_iq4_xs;

_Static_assert(sizeof(tsr_block_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(tsr_block_q4_1) == 20, "q4_1 block");
_Static_assert(sizeof(tsr_block_q5_0) == 22, "q5_0 block");
_Static_assert(sizeof(tsr_block_q5_1) == 24, "q5_1 block");
_Static_assert(sizeof(tsr_block_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(tsr_block_q8_1) == 36, "q8_1 block");
_Static_assert(sizeof(tsr_block_q4_K) == 144, "q4_K block");
_Static_assert(sizeof(tsr_block_q5_K) == 176, "q5_K block");
_Static_assert(sizeof(tsr_block_q6_K) == 210, "q6_K block");
_Static_assert(sizeof(tsr_block_q8_K) == 292, "q8_K block");
_Static_assert(sizeof(tsr_block_q2_K) == 84, "q2_K block");
_Static_assert(sizeof(tsr_block_q3_K) == 110, "q3_K block");
_Static_assert(sizeof(tsr_block_iq4_nl) == 18, "iq4_nl block");
_Static_assert(sizeof(tsr_block_iq4_xs) == 136, "iq4_xs block");

/* Scalar half/bfloat conversions (type.c); the public functions wrap these. */
float tsr__fp16_to_fp32(uint16_t h);
uint16_t tsr__fp32_to_fp16(float f);
static inline float tsr__bf16_to_fp32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline uint16_t tsr__fp32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 64); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);       /* nearest even */
    return (uint16_t)(u >> 16);
}

/* Table-driven half -> float for hot loops (filled by type.c on first use). */
extern float tsr__fp16_table[1 << 16];
void tsr__fp16_table_init(void);
#define TSR_FP16_TO_FP32(h) (tsr__fp16_table[(uint16_t)(h)])

/* Scale/min pair j (0..7) of a Q4_K/Q5_K block's packed 12 bytes. */
static inline void tsr__get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Reference quantizers (n a multiple of the block size). */
void tsr__quantize_q4_0(const float *x, void *y, int64_t n);
void tsr__quantize_q4_1(const float *x, void *y, int64_t n);
void tsr__quantize_q5_0(const float *x, void *y, int64_t n);
void tsr__quantize_q5_1(const float *x, void *y, int64_t n);
void tsr__quantize_q8_0(const float *x, void *y, int64_t n);
void tsr__quantize_q8_1(const float *x, void *y, int64_t n);
void tsr__quantize_q4_K(const float *x, void *y, int64_t n);
void tsr__quantize_q5_K(const float *x, void *y, int64_t n);
void tsr__quantize_q6_K(const float *x, void *y, int64_t n);
void tsr__quantize_q8_K(const float *x, void *y, int64_t n);

/* Reference dequantizers. */
void tsr__dequantize_q4_0(const void *x, float *y, int64_t n);
void tsr__dequantize_q4_1(const void *x, float *y, int64_t n);
void tsr__dequantize_q5_0(const void *x, float *y, int64_t n);
void tsr__dequantize_q5_1(const void *x, float *y, int64_t n);
void tsr__dequantize_q8_0(const void *x, float *y, int64_t n);
void tsr__dequantize_q8_1(const void *x, float *y, int64_t n);
void tsr__dequantize_q2_K(const void *x, float *y, int64_t n);
void tsr__dequantize_q3_K(const void *x, float *y, int64_t n);
void tsr__dequantize_q4_K(const void *x, float *y, int64_t n);
void tsr__dequantize_q5_K(const void *x, float *y, int64_t n);
void tsr__dequantize_q6_K(const void *x, float *y, int64_t n);
void tsr__dequantize_q8_K(const void *x, float *y, int64_t n);
void tsr__dequantize_iq4_nl(const void *x, float *y, int64_t n);
void tsr__dequantize_iq4_xs(const void *x, float *y, int64_t n);

#endif /* TSR_QUANTS_H */
