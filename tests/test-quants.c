/*
 * test-quants.c - the type table and reference (de)quantization:
 * golden blocks produced by the gguf Python package (tests/data/
 * quant-golden.bin, see tests/gen-quant-golden.py) compared byte for byte,
 * quantize/dequantize round trips, half and bfloat16 conversions
 * (exhaustive over halves, NaN/inf/denormals), size functions.
 */
#include "libtensr.h"
#include "tsrtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void) { /* xorshift64*: deterministic across platforms */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) * 0x1p-53;
}
static float nrand(void) { return (float)(sqrt(-2 * log(urand() + 1e-300)) * cos(2 * M_PI * urand())); }

static void *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(n > 0 ? (size_t)n : 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return p;
}

static void test_golden(void) {
    const char *top = getenv("top_srcdir");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/quant-golden.bin", top ? top : ".");
    size_t size, off = 0;
    unsigned char *buf = read_file(path, &size);
    CHECK(buf != NULL, "cannot read %s", path);
    if (!buf) return;
    int n_records = 0;
    while (off + 16 <= size) {
        uint32_t h[4];
        memcpy(h, buf + off, 16);
        off += 16;
        const tsr_type t = (tsr_type)h[0];
        const uint32_t kind = h[1], n = h[2], nbytes = h[3];
        float *ref = malloc(4 * (size_t)n + 4); /* records are not 4-byte aligned in the file */
        memcpy(ref, buf + off, 4 * (size_t)n);
        const unsigned char *bytes = buf + off + 4 * (size_t)n;
        off += 4 * (size_t)n + nbytes;
        CHECK(tsr_row_size(t, n) == nbytes, "%s: row size %zu != %u", tsr_type_name(t), tsr_row_size(t, n), nbytes);
        if (kind == 0) {
            unsigned char *out = calloc(1, nbytes);
            CHECK(tsr_quantize(t, ref, out, n) == TSR_OK, "quantize %s: %s", tsr_type_name(t), tsr_last_error());
            size_t first = nbytes;
            for (size_t i = 0; i < nbytes && first == nbytes; i++)
                if (out[i] != bytes[i]) first = i;
            CHECK(first == nbytes, "quantize %s: byte %zu differs (%02x vs golden %02x)", tsr_type_name(t), first,
                  first < nbytes ? out[first] : 0, first < nbytes ? bytes[first] : 0);
            free(out);
        } else {
            float *out = calloc(n, sizeof *out);
            CHECK(tsr_dequantize(t, bytes, out, n) == TSR_OK, "dequantize %s: %s", tsr_type_name(t), tsr_last_error());
            int bad = 0;
            for (uint32_t i = 0; i < n; i++)
                if (memcmp(&out[i], &ref[i], 4) != 0 && bad++ < 3)
                    CHECK(0, "dequantize %s: element %u = %.9g, golden %.9g", tsr_type_name(t), i, out[i], ref[i]);
            free(out);
        }
        free(ref);
        n_records++;
    }
    CHECK(off == size && n_records >= 15, "golden file: %d records, %zu of %zu bytes used", n_records, off, size);
    printf("golden: %d records compared\n", n_records);
    free(buf);
}

static void test_table(void) {
    static const struct { tsr_type t; const char *name; int64_t bs; size_t bytes; int q; } want[] = {
        {TSR_TYPE_F32, "f32", 1, 4, 0}, {TSR_TYPE_F16, "f16", 1, 2, 0}, {TSR_TYPE_Q4_0, "q4_0", 32, 18, 1},
        {TSR_TYPE_Q4_1, "q4_1", 32, 20, 1}, {TSR_TYPE_Q5_0, "q5_0", 32, 22, 1}, {TSR_TYPE_Q5_1, "q5_1", 32, 24, 1},
        {TSR_TYPE_Q8_0, "q8_0", 32, 34, 1}, {TSR_TYPE_Q8_1, "q8_1", 32, 36, 1}, {TSR_TYPE_Q2_K, "q2_K", 256, 84, 1},
        {TSR_TYPE_Q3_K, "q3_K", 256, 110, 1}, {TSR_TYPE_Q4_K, "q4_K", 256, 144, 1},
        {TSR_TYPE_Q5_K, "q5_K", 256, 176, 1}, {TSR_TYPE_Q6_K, "q6_K", 256, 210, 1},
        {TSR_TYPE_Q8_K, "q8_K", 256, 292, 1}, {TSR_TYPE_IQ2_XXS, "iq2_xxs", 256, 66, 1},
        {TSR_TYPE_IQ2_XS, "iq2_xs", 256, 74, 1}, {TSR_TYPE_IQ3_XXS, "iq3_xxs", 256, 98, 1},
        {TSR_TYPE_IQ1_S, "iq1_s", 256, 50, 1}, {TSR_TYPE_IQ4_NL, "iq4_nl", 32, 18, 1},
        {TSR_TYPE_IQ3_S, "iq3_s", 256, 110, 1}, {TSR_TYPE_IQ2_S, "iq2_s", 256, 82, 1},
        {TSR_TYPE_IQ4_XS, "iq4_xs", 256, 136, 1}, {TSR_TYPE_I8, "i8", 1, 1, 0}, {TSR_TYPE_I16, "i16", 1, 2, 0},
        {TSR_TYPE_I32, "i32", 1, 4, 0}, {TSR_TYPE_I64, "i64", 1, 8, 0}, {TSR_TYPE_F64, "f64", 1, 8, 0},
        {TSR_TYPE_IQ1_M, "iq1_m", 256, 56, 1}, {TSR_TYPE_BF16, "bf16", 1, 2, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const char *name = tsr_type_name(want[i].t);
        CHECK(name && strcmp(name, want[i].name) == 0, "type %d name %s", (int)want[i].t, name ? name : "(null)");
        CHECK(tsr_type_block_size(want[i].t) == want[i].bs, "%s block size", want[i].name);
        CHECK(tsr_type_block_bytes(want[i].t) == want[i].bytes, "%s block bytes", want[i].name);
        CHECK(tsr_type_is_quantized(want[i].t) == want[i].q, "%s quantized", want[i].name);
        tsr_type t = TSR_TYPE_COUNT;
        CHECK(tsr_type_by_name(want[i].name, &t) == TSR_OK && t == want[i].t, "by name %s", want[i].name);
        CHECK(tsr_row_size(want[i].t, want[i].bs * 3) == 3 * want[i].bytes, "%s row size", want[i].name);
        CHECK(tsr_row_size(want[i].t, 0) == 0, "%s row size 0", want[i].name);
        if (want[i].bs > 1) CHECK(tsr_row_size(want[i].t, want[i].bs + 1) == 0, "%s partial block", want[i].name);
    }
    tsr_type t;
    CHECK(tsr_type_by_name("Q4_k", &t) == TSR_OK && t == TSR_TYPE_Q4_K, "case-insensitive name");
    CHECK(tsr_type_by_name("q4_2", &t) == TSR_E_NOT_FOUND, "unknown name");
    CHECK(tsr_type_name((tsr_type)4) == NULL && tsr_type_name((tsr_type)5) == NULL, "types 4/5 do not exist");
    CHECK(tsr_type_name(TSR_TYPE_COUNT) == NULL && tsr_type_name((tsr_type)-1) == NULL, "out of range");
    CHECK(tsr_type_block_size((tsr_type)4) == 0 && tsr_type_block_bytes((tsr_type)99) == 0, "unknown sizes");
    CHECK(tsr_row_size(TSR_TYPE_F32, INT64_MAX) == 0, "row size overflow");
    CHECK(tsr_row_size(TSR_TYPE_F32, -1) == 0, "negative row");
    float x[32] = {0};
    unsigned char q[64];
    CHECK(tsr_quantize(TSR_TYPE_Q4_0, x, q, 31) == TSR_E_INVALID, "partial block rejected");
    CHECK(tsr_quantize(TSR_TYPE_IQ2_XXS, x, q, 0) == TSR_E_UNSUPPORTED, "iq2 quantize unsupported");
    CHECK(tsr_quantize((tsr_type)4, x, q, 32) == TSR_E_INVALID, "type 4 rejected");
    CHECK(tsr_dequantize(TSR_TYPE_Q4_0, NULL, x, 32) == TSR_E_INVALID, "NULL rejected");
    CHECK(tsr_quantize(TSR_TYPE_Q4_0, NULL, NULL, 0) == TSR_OK, "n = 0 is fine");
}

/* Reference half rounding in double: nearest representable, ties to even. */
static uint16_t ref_fp16(float f) {
    if (isnan(f)) return 0x7E00;
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (a >= 65520.0) return sign | 0x7C00;
    double ulp = a < 0x1p-14 ? 0x1p-24 : ldexp(1.0, ilogb(a) - 10);
    double q = a / ulp, fl = floor(q), r = q - fl;
    double m = r > 0.5 ? fl + 1 : r < 0.5 ? fl : (fmod(fl, 2) == 0 ? fl : fl + 1);
    double v = m * ulp;
    if (v == 0) return sign;
    int e = ilogb(v);
    if (v < 0x1p-14) return sign | (uint16_t)(v / 0x1p-24);
    return sign | (uint16_t)(((e + 15) << 10) | (uint16_t)(v / ldexp(1.0, e - 10) - 1024));
}

static void test_half(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = tsr_fp16_to_fp32((uint16_t)h);
        const int exp = (h >> 10) & 0x1F, man = h & 0x3FF;
        double want = exp == 0 ? ldexp(man, -24) : exp == 31 ? (man ? NAN : INFINITY) : ldexp(man + 1024, exp - 25);
        if (h & 0x8000) want = -want;
        if (exp == 31 && man) {
            if (!isnan(f) && bad++ < 3) CHECK(0, "half %04x must be NaN", h);
            continue;
        }
        if ((double)f != want && bad++ < 3) CHECK(0, "half %04x -> %g, want %g", h, f, want);
        if (tsr_fp32_to_fp16(f) != h && bad++ < 3) CHECK(0, "half %04x does not round-trip", h);
    }
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)(urand() * 4294967296.0);
        float f;
        memcpy(&f, &u, 4);
        if (isnan(f)) continue;
        if (tsr_fp32_to_fp16(f) != ref_fp16(f) && bad++ < 3)
            CHECK(0, "fp16(%a) = %04x, want %04x", f, tsr_fp32_to_fp16(f), ref_fp16(f));
    }
    CHECK(tsr_fp32_to_fp16(INFINITY) == 0x7C00 && tsr_fp32_to_fp16(-INFINITY) == 0xFC00, "inf");
    CHECK((tsr_fp32_to_fp16(NAN) & 0x7C00) == 0x7C00 && (tsr_fp32_to_fp16(NAN) & 0x3FF), "NaN stays NaN");
    CHECK(tsr_fp32_to_fp16(65504.0f) == 0x7BFF && tsr_fp32_to_fp16(65519.0f) == 0x7BFF, "max half");
    CHECK(tsr_fp32_to_fp16(65520.0f) == 0x7C00, "65520 rounds to inf");
    CHECK(tsr_fp32_to_fp16(0x1p-25f) == 0 && tsr_fp32_to_fp16(0x1.8p-25f) == 1, "smallest denormal rounding");
    CHECK(tsr_fp32_to_fp16(-0.0f) == 0x8000, "negative zero");
    CHECK(bad == 0, "%d half conversion mismatches", bad);
}

static void test_bf16(void) {
    CHECK(tsr_fp32_to_bf16(1.0f) == 0x3F80 && tsr_bf16_to_fp32(0x3F80) == 1.0f, "bf16 one");
    CHECK(tsr_fp32_to_bf16(INFINITY) == 0x7F80 && tsr_fp32_to_bf16(-INFINITY) == 0xFF80, "bf16 inf");
    const uint16_t n = tsr_fp32_to_bf16(NAN);
    CHECK((n & 0x7F80) == 0x7F80 && (n & 0x7F), "bf16 NaN stays NaN (%04x)", n);
    uint32_t u = 0x7F800001; /* signalling NaN whose payload would be rounded away */
    float snan;
    memcpy(&snan, &u, 4);
    CHECK(isnan(tsr_bf16_to_fp32(tsr_fp32_to_bf16(snan))), "bf16 sNaN stays NaN");
    /* ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 */
    CHECK(tsr_fp32_to_bf16(1.0f + 0x1p-8f) == 0x3F80, "bf16 tie to even (down)");
    CHECK(tsr_fp32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3F82, "bf16 tie to even (up)");
    CHECK(tsr_bf16_to_fp32(0x0001) == 0x1p-133f, "bf16 denormal");
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = tsr_bf16_to_fp32((uint16_t)h);
        if (!isnan(f) && tsr_fp32_to_bf16(f) != h && bad++ < 3) CHECK(0, "bf16 %04x round trip", h);
    }
}

/* Quantize -> dequantize of Gaussian data: relative RMSE under a bound per
 * type (measured values printed; bounds have ~15% headroom). */
static void test_round_trips(void) {
    static const struct { tsr_type t; double max_rel_rmse; } cases[] = {
        {TSR_TYPE_F16, 0.0004}, {TSR_TYPE_BF16, 0.003}, {TSR_TYPE_Q8_0, 0.0062}, {TSR_TYPE_Q8_1, 0.0062},
        {TSR_TYPE_Q4_0, 0.115}, {TSR_TYPE_Q4_1, 0.095}, {TSR_TYPE_Q5_0, 0.058}, {TSR_TYPE_Q5_1, 0.047},
        {TSR_TYPE_Q4_K, 0.085}, {TSR_TYPE_Q5_K, 0.043}, {TSR_TYPE_Q6_K, 0.022}, {TSR_TYPE_Q8_K, 0.0080},
    };
    enum { N = 256 * 64 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    unsigned char *q = malloc(N * 4);
    for (int i = 0; i < N; i++) x[i] = nrand();
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const tsr_type t = cases[c].t;
        CHECK(tsr_quantize(t, x, q, N) == TSR_OK, "quantize %s", tsr_type_name(t));
        CHECK(tsr_dequantize(t, q, y, N) == TSR_OK, "dequantize %s", tsr_type_name(t));
        double e = 0, s = 0;
        for (int i = 0; i < N; i++) {
            e += (double)(x[i] - y[i]) * (x[i] - y[i]);
            s += (double)x[i] * x[i];
        }
        const double rel = sqrt(e / s);
        printf("round trip %-5s rel. RMSE %.5f (bound %.4f)\n", tsr_type_name(t), rel, cases[c].max_rel_rmse);
        CHECK(rel <= cases[c].max_rel_rmse, "%s: relative RMSE %.5f above %.4f", tsr_type_name(t), rel,
              cases[c].max_rel_rmse);
        /* zeros quantize to exact zeros; a constant block is reproduced closely */
        float z[256] = {0}, zy[256];
        CHECK(tsr_quantize(t, z, q, 256) == TSR_OK && tsr_dequantize(t, q, zy, 256) == TSR_OK, "zeros %s",
              tsr_type_name(t));
        for (int i = 0; i < 256; i++) CHECK(zy[i] == 0.0f, "%s: zero block gives %g", tsr_type_name(t), zy[i]);
    }
    free(x);
    free(y);
    free(q);
}

/* llama.cpp's own acceptance check of quantizers (test-quantize-fns): on
 * 0.1 + 2 cos(i), sqrt(sum of squared errors) / n stays under 0.002. */
static void test_llama_criterion(void) {
    static const tsr_type types[] = {TSR_TYPE_Q4_0, TSR_TYPE_Q4_1, TSR_TYPE_Q5_0, TSR_TYPE_Q5_1, TSR_TYPE_Q8_0,
                                     TSR_TYPE_Q4_K, TSR_TYPE_Q5_K, TSR_TYPE_Q6_K, TSR_TYPE_Q8_K};
    enum { N = 32 * 128 };
    static float x[N], y[N];
    static unsigned char q[N * 2];
    for (int i = 0; i < N; i++) x[i] = 0.1f + 2 * cosf((float)i);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        CHECK(tsr_quantize(types[t], x, q, N) == TSR_OK && tsr_dequantize(types[t], q, y, N) == TSR_OK, "%s",
              tsr_type_name(types[t]));
        double sum = 0;
        for (int i = 0; i < N; i++) sum += (double)(x[i] - y[i]) * (x[i] - y[i]);
        const double err = sqrt(sum) / N;
        printf("llama.cpp criterion %-5s %.6f (max 0.002)\n", tsr_type_name(types[t]), err);
        CHECK(err < 0.002, "%s: total quantization error %g", tsr_type_name(types[t]), err);
    }
}

int main(void) {
    test_table();
    test_golden();
    test_half();
    test_bf16();
    test_round_trips();
    test_llama_criterion();
    return tsrtest_done("test-quants");
}
