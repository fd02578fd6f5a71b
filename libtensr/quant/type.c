/*
 * type.c - the tensor type table (every GGUF type number: name, block size,
 * bytes per block, reference to_float/from_float) and the public type
 * functions: names, sizes, reference (de)quantization, half/bfloat16.
 */
#include "quant/quants.h"

#include <math.h>
#include <pthread.h>
#include <strings.h>

/* ---- half precision ----------------------------------------------------- */

float tsr__fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
    uint32_t u;
    if (exp == 0x1F) {
        u = sign | 0x7F800000u | (mant << 13); /* inf / NaN (payload kept) */
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        u = sign;
    } else { /* subnormal half: exact as a float */
        float f = (float)mant * 0x1p-24f;
        memcpy(&u, &f, sizeof u);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t tsr__fp32_to_fp16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t abs = u & 0x7FFFFFFFu;
    if (abs > 0x7F800000u)
        return (uint16_t)(sign | 0x7E00u | ((abs >> 13) & 0x3FFu)); /* NaN */
    if (abs >= 0x477FF000u)
        return (uint16_t)(sign | 0x7C00u); /* rounds to >= 65520: inf */
    if (abs < 0x38800000u) {
        /* result is subnormal (or zero): x / 2^-24 rounded to nearest even */
        float a;
        memcpy(&a, &abs, sizeof a);
        float q = a * 0x1p24f; /* exact: a >= 2^-149 scales without loss */
        return (uint16_t)(sign | (uint16_t)lrintf(q));
    }
    /* normal: drop 13 mantissa bits with round to nearest even */
    uint32_t r = abs + 0xFFFu + ((abs >> 13) & 1u);
    return (uint16_t)(sign | (uint16_t)((r - 0x38000000u) >> 13));
}

float tsr__fp16_table[1 << 16];
static pthread_once_t fp16_once = PTHREAD_ONCE_INIT;

static void fp16_table_fill(void) {
    for (uint32_t i = 0; i < (1u << 16); i++) tsr__fp16_table[i] = tsr__fp16_to_fp32((uint16_t)i);
}

void tsr__fp16_table_init(void) { pthread_once(&fp16_once, fp16_table_fill); }

uint16_t tsr_fp32_to_fp16(float f) { return tsr__fp32_to_fp16(f); }
float tsr_fp16_to_fp32(uint16_t h) { return tsr__fp16_to_fp32(h); }
uint16_t tsr_fp32_to_bf16(float f) { return tsr__fp32_to_bf16(f); }
float tsr_bf16_to_fp32(uint16_t h) { return tsr__bf16_to_fp32(h); }

/* ---- plain-type converters ---------------------------------------------- */

static void f32_to_float(const void *s, float *d, int64_t n) { memcpy(d, s, (size_t)n * sizeof *d); }
static void f32_from_float(const float *s, void *d, int64_t n) { memcpy(d, s, (size_t)n * sizeof *s); }
static void f16_to_float(const void *s, float *d, int64_t n) {
    const uint16_t *h = s;
    for (int64_t i = 0; i < n; i++) d[i] = tsr__fp16_to_fp32(h[i]);
}
static void f16_from_float(const float *s, void *d, int64_t n) {
    uint16_t *h = d;
    for (int64_t i = 0; i < n; i++) h[i] = tsr__fp32_to_fp16(s[i]);
}
static void bf16_to_float(const void *s, float *d, int64_t n) {
    const uint16_t *h = s;
    for (int64_t i = 0; i < n; i++) d[i] = tsr__bf16_to_fp32(h[i]);
}
static void bf16_from_float(const float *s, void *d, int64_t n) {
    uint16_t *h = d;
    for (int64_t i = 0; i < n; i++) h[i] = tsr__fp32_to_bf16(s[i]);
}

#define INT_TO_FLOAT(NAME, T)                               \
    static void NAME(const void *s, float *d, int64_t n) {  \
        const T *v = s;                                     \
        for (int64_t i = 0; i < n; i++) d[i] = (float)v[i]; \
    }
INT_TO_FLOAT(i8_to_float, int8_t)
INT_TO_FLOAT(i16_to_float, int16_t)
INT_TO_FLOAT(i32_to_float, int32_t)
INT_TO_FLOAT(i64_to_float, int64_t)
INT_TO_FLOAT(f64_to_float, double)

/* Integer stores round to nearest and saturate: a float that does not fit
 * never invokes undefined behaviour. */
static void i32_from_float(const float *s, void *d, int64_t n) {
    int32_t *v = d;
    for (int64_t i = 0; i < n; i++) {
        float x = s[i];
        v[i] = x != x ? 0 : x >= 2147483520.0f ? INT32_MAX : x <= -2147483648.0f ? INT32_MIN : (int32_t)lrintf(x);
    }
}

/* ---- the table ---------------------------------------------------------- */

#define PLAIN(NAME, BYTES, TO, FROM) \
    { NAME, 1, BYTES, false, TO, FROM }
#define QUANT(NAME, BS, BYTES, TO, FROM) \
    { NAME, BS, BYTES, true, TO, FROM }

static const tsr_type_traits type_traits[TSR_TYPE_COUNT] = {
    [TSR_TYPE_F32] = PLAIN("f32", 4, f32_to_float, f32_from_float),
    [TSR_TYPE_F16] = PLAIN("f16", 2, f16_to_float, f16_from_float),
    [TSR_TYPE_Q4_0] = QUANT("q4_0", 32, 18, tsr__dequantize_q4_0, tsr__quantize_q4_0),
    [TSR_TYPE_Q4_1] = QUANT("q4_1", 32, 20, tsr__dequantize_q4_1, tsr__quantize_q4_1),
    [TSR_TYPE_Q5_0] = QUANT("q5_0", 32, 22, tsr__dequantize_q5_0, tsr__quantize_q5_0),
    [TSR_TYPE_Q5_1] = QUANT("q5_1", 32, 24, tsr__dequantize_q5_1, tsr__quantize_q5_1),
    [TSR_TYPE_Q8_0] = QUANT("q8_0", 32, 34, tsr__dequantize_q8_0, tsr__quantize_q8_0),
    [TSR_TYPE_Q8_1] = QUANT("q8_1", 32, 36, tsr__dequantize_q8_1, tsr__quantize_q8_1),
    [TSR_TYPE_Q2_K] = QUANT("q2_K", 256, 84, tsr__dequantize_q2_K, NULL),
    [TSR_TYPE_Q3_K] = QUANT("q3_K", 256, 110, tsr__dequantize_q3_K, NULL),
    [TSR_TYPE_Q4_K] = QUANT("q4_K", 256, 144, tsr__dequantize_q4_K, tsr__quantize_q4_K),
    [TSR_TYPE_Q5_K] = QUANT("q5_K", 256, 176, tsr__dequantize_q5_K, tsr__quantize_q5_K),
    [TSR_TYPE_Q6_K] = QUANT("q6_K", 256, 210, tsr__dequantize_q6_K, tsr__quantize_q6_K),
    [TSR_TYPE_Q8_K] = QUANT("q8_K", 256, 292, tsr__dequantize_q8_K, tsr__quantize_q8_K),
    [TSR_TYPE_IQ2_XXS] = QUANT("iq2_xxs", 256, 66, NULL, NULL),
    [TSR_TYPE_IQ2_XS] = QUANT("iq2_xs", 256, 74, NULL, NULL),
    [TSR_TYPE_IQ3_XXS] = QUANT("iq3_xxs", 256, 98, NULL, NULL),
    [TSR_TYPE_IQ1_S] = QUANT("iq1_s", 256, 50, NULL, NULL),
    [TSR_TYPE_IQ4_NL] = QUANT("iq4_nl", 32, 18, tsr__dequantize_iq4_nl, NULL),
    [TSR_TYPE_IQ3_S] = QUANT("iq3_s", 256, 110, NULL, NULL),
    [TSR_TYPE_IQ2_S] = QUANT("iq2_s", 256, 82, NULL, NULL),
    [TSR_TYPE_IQ4_XS] = QUANT("iq4_xs", 256, 136, tsr__dequantize_iq4_xs, NULL),
    [TSR_TYPE_I8] = PLAIN("i8", 1, i8_to_float, NULL),
    [TSR_TYPE_I16] = PLAIN("i16", 2, i16_to_float, NULL),
    [TSR_TYPE_I32] = PLAIN("i32", 4, i32_to_float, i32_from_float),
    [TSR_TYPE_I64] = PLAIN("i64", 8, i64_to_float, NULL),
    [TSR_TYPE_F64] = PLAIN("f64", 8, f64_to_float, NULL),
    [TSR_TYPE_IQ1_M] = QUANT("iq1_m", 256, 56, NULL, NULL),
    [TSR_TYPE_BF16] = PLAIN("bf16", 2, bf16_to_float, bf16_from_float),
};

const tsr_type_traits *tsr__type_traits(tsr_type type) {
    if ((unsigned)type >= TSR_TYPE_COUNT || type_traits[type].block_size == 0)
        return NULL;
    return &type_traits[type];
}

const char *tsr_type_name(tsr_type type) {
    const tsr_type_traits *t = tsr__type_traits(type);
    return t ? t->name : NULL;
}

tsr_status tsr_type_by_name(const char *name, tsr_type *out) {
    if (!name || !out)
        return tsr__error(TSR_E_INVALID, "tsr_type_by_name: NULL argument");
    for (int i = 0; i < TSR_TYPE_COUNT; i++) {
        if (type_traits[i].block_size && strcasecmp(type_traits[i].name, name) == 0) {
            *out = (tsr_type)i;
            return TSR_OK;
        }
    }
    return tsr__error(TSR_E_NOT_FOUND, "tsr_type_by_name: no type named '%s'", name);
}

int64_t tsr_type_block_size(tsr_type type) {
    const tsr_type_traits *t = tsr__type_traits(type);
    return t ? t->block_size : 0;
}

size_t tsr_type_block_bytes(tsr_type type) {
    const tsr_type_traits *t = tsr__type_traits(type);
    return t ? t->block_bytes : 0;
}

int tsr_type_is_quantized(tsr_type type) {
    const tsr_type_traits *t = tsr__type_traits(type);
    return t && t->quantized;
}

size_t tsr_row_size(tsr_type type, int64_t n) {
    const tsr_type_traits *t = tsr__type_traits(type);
    size_t size;
    if (!t || n < 0 || n % t->block_size)
        return 0;
    if (tsr__mul_overflow((size_t)(n / t->block_size), t->block_bytes, &size))
        return 0;
    return size;
}

/* Checks shared by tsr_quantize/tsr_dequantize. */
static tsr_status check_conv(const char *fn, tsr_type type, const void *a, const void *b, int64_t n, bool quantize,
                             const tsr_type_traits **out) {
    const tsr_type_traits *t = tsr__type_traits(type);
    if (!t)
        return tsr__error(TSR_E_INVALID, "%s: type %d is not a known type", fn, (int)type);
    if (n < 0)
        return tsr__error(TSR_E_INVALID, "%s: n must be >= 0, found %lld", fn, (long long)n);
    if (n % t->block_size)
        return tsr__error(TSR_E_INVALID, "%s: n must be a multiple of %s's block size %lld, found %lld", fn, t->name,
                          (long long)t->block_size, (long long)n);
    if (n > 0 && (!a || !b))
        return tsr__error(TSR_E_INVALID, "%s: NULL buffer", fn);
    if (!(quantize ? (void *)t->from_float : (void *)t->to_float))
        return tsr__error(TSR_E_UNSUPPORTED, "%s: %s is not supported for type %s", fn,
                          quantize ? "quantization" : "dequantization", t->name);
    *out = t;
    return TSR_OK;
}

tsr_status tsr_quantize(tsr_type type, const float *src, void *dst, int64_t n) {
    const tsr_type_traits *t;
    tsr_status s = check_conv("tsr_quantize", type, src, dst, n, true, &t);
    if (s != TSR_OK)
        return s;
    if (n > 0)
        t->from_float(src, dst, n);
    return TSR_OK;
}

tsr_status tsr_dequantize(tsr_type type, const void *src, float *dst, int64_t n) {
    const tsr_type_traits *t;
    tsr_status s = check_conv("tsr_dequantize", type, src, dst, n, false, &t);
    if (s != TSR_OK)
        return s;
    if (n > 0)
        t->to_float(src, dst, n);
    return TSR_OK;
}
