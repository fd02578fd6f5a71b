/*
 * test-kquant-ref.c - libtensr's quantizers against llama.cpp's own ggml:
 * tests/data/kquant-ref.bin (written once by tests/gen-kquant-ref.py from
 * libggml-base.so) holds float arrays, ggml's reference-quantized bytes, its
 * dequantized values and its RMSE. Checks: Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 bytes are
 * identical; Q4_K/Q5_K/Q6_K reach an RMSE no worse than llama.cpp's + 1%;
 * tsr_dequantize of ggml's bytes equals ggml's dequantized floats bit for bit.
 * Prints the table of RMSE ratios (ours / llama.cpp) per type and array.
 */
#include "libtensr.h"
#include "tsrtest.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ARRAYS 16

struct reader {
    const unsigned char *p;
    size_t size, off;
    int bad;
};

/* Bounds-checked copy out of the file; sets bad instead of reading past it. */
static int take(struct reader *r, void *dst, size_t n) {
    if (r->bad || n > r->size - r->off) {
        r->bad = 1;
        return 0;
    }
    memcpy(dst, r->p + r->off, n);
    r->off += n;
    return 1;
}

static uint32_t take_u32(struct reader *r) {
    uint32_t v = 0;
    take(r, &v, 4);
    return v;
}

static unsigned char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *p = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n > 0 && fseek(f, 0, SEEK_SET) == 0 && (p = malloc((size_t)n)) != NULL &&
            fread(p, 1, (size_t)n, f) != (size_t)n) {
            free(p);
            p = NULL;
        }
        *size = n > 0 ? (size_t)n : 0;
    }
    fclose(f);
    return p;
}

static double rmse(const float *x, const float *y, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)y[i] - (double)x[i];
        s += d * d;
    }
    return n ? sqrt(s / (double)n) : 0.0;
}

static int is_k_quant(tsr_type t) {
    return t == TSR_TYPE_Q4_K || t == TSR_TYPE_Q5_K || t == TSR_TYPE_Q6_K;
}

struct array {
    char name[17];
    uint32_t n;
    float *x;
};

/* Worst ratio and identity count per type, for the summary line. */
struct type_summary {
    double worst;
    int identical, total;
};

/* One record: quantize the array ourselves, compare bytes / RMSE, and
 * dequantize ggml's bytes. Returns 0 when the record is malformed. */
static int check_record(struct reader *r, const struct array *arrays, uint32_t n_arrays,
                        struct type_summary *sum) {
    const uint32_t tnum = take_u32(r), ai = take_u32(r), nbytes = take_u32(r);
    double ref_rmse = 0;
    take(r, &ref_rmse, 8);
    if (r->bad || ai >= n_arrays || tnum >= TSR_TYPE_COUNT) return 0;
    const tsr_type t = (tsr_type)tnum;
    const struct array *a = &arrays[ai];
    if (tsr_row_size(t, a->n) != nbytes) return 0;
    unsigned char *ref_q = malloc(nbytes ? nbytes : 1), *our_q = calloc(1, nbytes ? nbytes : 1);
    float *ref_y = malloc(4 * (size_t)a->n + 4), *our_y = malloc(4 * (size_t)a->n + 4);
    int ok = ref_q && our_q && ref_y && our_y && take(r, ref_q, nbytes) && take(r, ref_y, 4 * (size_t)a->n);
    if (ok) {
        const char *tn = tsr_type_name(t);
        CHECK(tsr_quantize(t, a->x, our_q, a->n) == TSR_OK, "quantize %s: %s", tn, tsr_last_error());
        const int same = memcmp(our_q, ref_q, nbytes) == 0;
        CHECK(tsr_dequantize(t, our_q, our_y, a->n) == TSR_OK, "dequantize %s", tn);
        const double ours = rmse(a->x, our_y, a->n), theirs = rmse(a->x, ref_y, a->n);
        CHECK(fabs(theirs - ref_rmse) <= 1e-12 * (1 + ref_rmse), "%s %s: stored rmse %.9g != %.9g", tn,
              a->name, ref_rmse, theirs);
        const double ratio = theirs > 0 ? ours / theirs : (ours > 0 ? INFINITY : 1.0);
        printf("  %-5s %-11s ours %.6e  llama.cpp %.6e  ratio %.4f  bytes %s\n", tn, a->name, ours, theirs,
               ratio, same ? "identical" : "differ");
        if (is_k_quant(t))
            CHECK(ours <= theirs * 1.01, "%s %s: rmse %.6e worse than llama.cpp's %.6e + 1%%", tn, a->name,
                  ours, theirs);
        else
            CHECK(same, "%s %s: quantized bytes differ from llama.cpp's", tn, a->name);
        /* ggml's bytes through our dequantizer: bit-exact floats. */
        CHECK(tsr_dequantize(t, ref_q, our_y, a->n) == TSR_OK, "dequantize %s", tn);
        size_t first = a->n;
        for (size_t i = 0; i < a->n && first == a->n; i++)
            if (memcmp(&our_y[i], &ref_y[i], 4) != 0) first = i;
        CHECK(first == a->n, "%s %s: dequantized element %zu is %.9g, ggml %.9g", tn, a->name, first,
              first < a->n ? our_y[first] : 0.f, first < a->n ? ref_y[first] : 0.f);
        if (ratio > sum[t].worst) sum[t].worst = ratio;
        sum[t].identical += same;
        sum[t].total++;
    }
    free(ref_q);
    free(our_q);
    free(ref_y);
    free(our_y);
    return ok;
}

static int read_arrays(struct reader *r, struct array *arrays, uint32_t n_arrays) {
    for (uint32_t i = 0; i < n_arrays; i++) {
        memset(arrays[i].name, 0, sizeof arrays[i].name);
        take(r, arrays[i].name, 16);
        arrays[i].n = take_u32(r);
        if (r->bad || arrays[i].n > (1u << 24) || arrays[i].n > (r->size - r->off) / 4) return 0;
        arrays[i].x = malloc(4 * (size_t)arrays[i].n + 4);
        if (!arrays[i].x || !take(r, arrays[i].x, 4 * (size_t)arrays[i].n)) return 0;
    }
    return 1;
}

int main(void) {
    const char *top = getenv("top_srcdir");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/kquant-ref.bin", top ? top : ".");
    size_t size = 0;
    unsigned char *buf = read_file(path, &size);
    CHECK(buf, "cannot read %s", path);
    if (!buf)
        return tsrtest_done("test-kquant-ref");
    struct reader r = {buf, size, 0, 0};
    char magic[8], version[65] = {0};
    take(&r, magic, 8);
    const uint32_t format = take_u32(&r);
    take(&r, version, 64);
    const uint32_t n_arrays = take_u32(&r), n_records = take_u32(&r);
    CHECK(!r.bad && memcmp(magic, "TSRKQREF", 8) == 0 && format == 1, "%s: bad header", path);
    CHECK(n_arrays <= MAX_ARRAYS, "%s: %u arrays", path, n_arrays);
    struct array arrays[MAX_ARRAYS] = {{{0}, 0, NULL}};
    struct type_summary sum[TSR_TYPE_COUNT] = {{0, 0, 0}};
    if (!tsrtest_failures) {
        printf("reference: llama.cpp %s\n", version);
        CHECK(read_arrays(&r, arrays, n_arrays), "%s: truncated arrays", path);
        uint32_t i = 0;
        while (!r.bad && i < n_records && check_record(&r, arrays, n_arrays, sum)) i++;
        CHECK(i == n_records, "%s: record %u malformed", path, i);
        CHECK(!r.bad && r.off == r.size, "%s: truncated or %zu trailing bytes", path, r.size - r.off);
    }
    for (int t = 0; t < TSR_TYPE_COUNT; t++)
        if (sum[t].total)
            printf("%-5s worst rmse ratio %.4f, bytes identical %d/%d\n", tsr_type_name((tsr_type)t),
                   sum[t].worst, sum[t].identical, sum[t].total);
    for (uint32_t i = 0; i < n_arrays && i < MAX_ARRAYS; i++) free(arrays[i].x);
    free(buf);
    return tsrtest_done("test-kquant-ref");
}
