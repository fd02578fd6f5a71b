/*
 * test-model-quants.c - the type code on a real model: every tensor of
 * SmolLM2-135M-Instruct (Q4_1 GGUF; Q8_0 embeddings, F32 norms) dequantizes
 * to finite values, and mul_mat of real weight rows (Q4_1, Q8_0 as stored;
 * Q4_K and Q6_K re-quantized from them) matches a double reference on the
 * dequantized weights. Skips (77) when the model file is absent.
 * Model: $TSR_TEST_MODEL or ~/.cache/libtensr/SmolLM2-135M-Instruct.Q4_1.gguf.
 */
#include "libtensr.h"
#include "tsrtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *read_tensor(tsr_gguf *g, int64_t i, size_t *size) {
    *size = tsr_gguf_tensor_size(g, i);
    void *p = malloc(*size ? *size : 1);
    if (p && tsr_gguf_read_tensor(g, i, p, *size) != TSR_OK) {
        fprintf(stderr, "read %s: %s\n", tsr_gguf_tensor_name(g, i), tsr_last_error());
        free(p);
        return NULL;
    }
    return p;
}

/* Every tensor dequantizes to finite values. */
static void check_all_finite(tsr_gguf *g) {
    int64_t n_checked = 0, n_values = 0;
    for (int64_t i = 0; i < tsr_gguf_n_tensors(g); i++) {
        const tsr_type t = tsr_gguf_tensor_type(g, i);
        int64_t n = 1;
        for (int d = 0; d < tsr_gguf_tensor_n_dims(g, i); d++) n *= tsr_gguf_tensor_ne(g, i, d);
        size_t size;
        void *raw = read_tensor(g, i, &size);
        float *f = malloc((size_t)n * sizeof *f);
        CHECK(raw && f && tsr_row_size(t, tsr_gguf_tensor_ne(g, i, 0)) * (size_t)(n / tsr_gguf_tensor_ne(g, i, 0)) == size,
              "%s: size", tsr_gguf_tensor_name(g, i));
        if (raw && f) {
            CHECK(tsr_dequantize(t, raw, f, n) == TSR_OK, "%s (%s): %s", tsr_gguf_tensor_name(g, i), tsr_type_name(t),
                  tsr_last_error());
            int64_t bad = 0;
            for (int64_t j = 0; j < n; j++) bad += !isfinite(f[j]);
            CHECK(bad == 0, "%s: %lld non-finite values", tsr_gguf_tensor_name(g, i), (long long)bad);
            n_checked++;
            n_values += n;
        }
        free(raw);
        free(f);
    }
    printf("dequantized %lld tensors, %lld values, all finite\n", (long long)n_checked, (long long)n_values);
}

/* mul_mat of rows (type t, k x m) with random activations through the public API. */
static void check_mul_mat(tsr_backend *b, const char *what, tsr_type t, const void *rows, int64_t k, int64_t m) {
    const int64_t n = 5;
    float *w = malloc((size_t)(k * m) * sizeof *w), *x = malloc((size_t)(k * n) * sizeof *x);
    float *y = malloc((size_t)(m * n) * sizeof *y);
    tsr_dequantize(t, rows, w, k * m);
    uint64_t s = 1;
    for (int64_t i = 0; i < k * n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 11) * 0x1p-53 * 2 - 1);
    }
    tsr_context *ctx = tsr_context_new(b);
    const int64_t nw[2] = {k, m}, nx[2] = {k, n};
    tsr_tensor *a = tsr_input(ctx, t, 2, nw, rows), *bx = tsr_input(ctx, TSR_TYPE_F32, 2, nx, x);
    tsr_tensor *out = tsr_mul_mat(ctx, a, bx);
    CHECK(out && tsr_compute(ctx, &out, 1) == TSR_OK && tsr_tensor_read(out, y, 0, (size_t)(m * n) * 4) == TSR_OK,
          "%s: mul_mat: %s", what, tsr_last_error());
    double err = 0, mag = 0;
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
            double ref = 0;
            for (int64_t l = 0; l < k; l++) ref += (double)w[i * k + l] * x[j * k + l];
            err += (y[j * m + i] - ref) * (y[j * m + i] - ref);
            mag += ref * ref;
        }
    printf("mul_mat %-28s %-5s k=%lld m=%lld: NMSE %.3g\n", what, tsr_type_name(t), (long long)k, (long long)m,
           err / mag);
    CHECK(err / mag < 5e-4, "%s: NMSE %g", what, err / mag);
    tsr_context_close(ctx);
    free(w), free(x), free(y);
}

static void check_real_rows(tsr_gguf *g, tsr_backend *b) {
    static const char *names[] = {"blk.0.attn_q.weight", "blk.5.ffn_down.weight", "token_embd.weight"};
    for (size_t i = 0; i < 3; i++) {
        const int64_t ti = tsr_gguf_find_tensor(g, names[i]);
        CHECK(ti >= 0, "tensor %s missing", names[i]);
        if (ti < 0) continue;
        size_t size;
        void *raw = read_tensor(g, ti, &size);
        if (!raw) continue;
        const tsr_type t = tsr_gguf_tensor_type(g, ti);
        const int64_t k = tsr_gguf_tensor_ne(g, ti, 0), m = 96; /* the first 96 rows */
        check_mul_mat(b, names[i], t, raw, k, m);
        if (k % 256 == 0) { /* the same rows as K-quants, quantized by libtensr */
            float *f = malloc((size_t)(k * m) * sizeof *f);
            void *q = malloc(tsr_row_size(TSR_TYPE_Q6_K, k) * (size_t)m);
            tsr_dequantize(t, raw, f, k * m);
            const tsr_type kt[] = {TSR_TYPE_Q4_K, TSR_TYPE_Q6_K, TSR_TYPE_Q5_K};
            for (int j = 0; j < 3; j++) {
                CHECK(tsr_quantize(kt[j], f, q, k * m) == TSR_OK, "quantize %s", tsr_type_name(kt[j]));
                check_mul_mat(b, names[i], kt[j], q, k, m);
            }
            free(f);
            free(q);
        }
        free(raw);
    }
}

int main(void) {
    char path[4096];
    const char *env = getenv("TSR_TEST_MODEL"), *home = getenv("HOME");
    if (env) snprintf(path, sizeof path, "%s", env);
    else snprintf(path, sizeof path, "%s/.cache/libtensr/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : "/root");
    if (access(path, R_OK) != 0)
        SKIP("model %s not found", path);
    tsr_gguf *g = NULL;
    const tsr_status st = tsr_gguf_open(path, &g);
    CHECK(st == TSR_OK, "open %s", path);
    if (st != TSR_OK)
        return tsrtest_done("test-model-quants");
    check_all_finite(g);
    tsr_backend *b = NULL;
    CHECK(tsr_backend_new(NULL, &b) == TSR_OK, "backend: %s", tsr_last_error());
    if (b) check_real_rows(g, b);
    tsr_backend_free(b);
    tsr_gguf_close(g);
    return tsrtest_done("test-model-quants");
}
