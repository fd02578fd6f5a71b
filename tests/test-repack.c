/*
 * test-repack.c - CPU matmul weights in the 8-row interleaved layout
 * (cpu/repack.c, tsr__cpu_il8_prepare). Weights loaded from a
 * GGUF (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K) are multiplied (one column: the
 * matrix-vector kernels; several: the gemm) beside the same bytes held in a
 * context's input, which keeps the stored layout: one column within 1e-5
 * of the products' magnitude, several (2 and more) the same bits. Then:
 * the weight's bytes read back as stored, and the weight stays stored; a
 * gather (get_rows, a tied embedding) of a rearranged weight sees the
 * right rows and leaves the layout; a view of it gives the right results
 * and puts it back to stored for good; matrices that cannot take the
 * layout (rows not a multiple of 8) keep theirs; TSR_CPU_REPACK=0 turns it
 * off. Links the static library (the tensor flags).
 */
#include "internal.h"
#include "tsrtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define N_W 7
static const struct {
    const char *name;
    tsr_type type;
    int64_t k, m;
    bool fits; /* can take the layout */
} W[N_W] = {
    {"blk.0.attn_q.weight", TSR_TYPE_Q4_0, 96, 24, true},    {"blk.0.ffn_up.weight", TSR_TYPE_Q4_1, 256, 16, true},
    {"blk.0.ffn_down.weight", TSR_TYPE_Q8_0, 64, 40, true},  {"blk.0.attn_k.weight", TSR_TYPE_Q4_0, 64, 12, false},
    {"blk.0.ffn_gate.weight", TSR_TYPE_Q5_0, 160, 32, true}, {"blk.1.ffn_down.weight", TSR_TYPE_Q4_K, 512, 16, true},
    {"token_embd.weight", TSR_TYPE_Q8_0, 64, 16, true},
};

static uint64_t rng = 0x243F6A8885A308D3ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1p-53) * 2.0f - 1.0f;
}

static void *bytes[N_W];
static float *vals[N_W]; /* the dequantized values */

static void make_weights(void) {
    for (int i = 0; i < N_W; i++) {
        const int64_t n = W[i].k * W[i].m;
        float *f = malloc((size_t)n * sizeof *f);
        for (int64_t j = 0; j < n; j++) f[j] = frand() * (1.0f + (float)(j % 7));
        bytes[i] = malloc(tsr_row_size(W[i].type, W[i].k) * (size_t)W[i].m);
        vals[i] = malloc((size_t)n * sizeof *f);
        CHECK_OK(tsr_quantize(W[i].type, f, bytes[i], n));
        CHECK_OK(tsr_dequantize(W[i].type, bytes[i], vals[i], n));
        free(f);
    }
}

static void write_model(const char *path) {
    tsr_gguf_writer *w = NULL;
    CHECK_OK(tsr_gguf_writer_new(&w));
    CHECK_OK(tsr_gguf_writer_set_str(w, "general.architecture", "llama"));
    for (int i = 0; i < N_W; i++) {
        const int64_t ne[2] = {W[i].k, W[i].m};
        CHECK_OK(tsr_gguf_writer_add_tensor(w, W[i].name, W[i].type, 2, ne, bytes[i]));
    }
    CHECK_OK(tsr_gguf_writer_write_file(w, path));
    tsr_gguf_writer_free(w);
}

static tsr_backend *load(const char *path) {
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = 2;
    tsr_backend *b = NULL;
    CHECK_OK(tsr_backend_new(&bp, &b));
    CHECK_OK(tsr_backend_load_gguf(b, path, NULL));
    return b;
}

static bool il8_kernels(tsr_type t) { return tsr__cpu_kernels()->gemv_il8[t] && tsr__cpu_kernels()->gemm_il8[t]; }

/* W[i] x (one column and n columns) as the weight and as an input of the
 * same bytes: returns false when the two disagree. */
static bool multiply(tsr_backend *b, int i, int n) {
    tsr_tensor *w = tsr_backend_weight(b, W[i].name);
    tsr_context *ctx = tsr_context_new(b);
    const int64_t k = W[i].k, m = W[i].m, nw[2] = {k, m}, nx[2] = {k, n}, n1[2] = {k, 1};
    float *x = malloc((size_t)(k * n) * sizeof *x);
    for (int64_t j = 0; j < k * n; j++) x[j] = frand() * 2.0f;
    tsr_tensor *wi = tsr_input(ctx, W[i].type, 2, nw, bytes[i]);
    tsr_tensor *xn = tsr_input(ctx, TSR_TYPE_F32, 2, nx, x), *x1 = tsr_input(ctx, TSR_TYPE_F32, 2, n1, x);
    tsr_tensor *outs[4] = {tsr_mul_mat(ctx, w, x1), tsr_mul_mat(ctx, w, xn), tsr_mul_mat(ctx, wi, x1),
                           tsr_mul_mat(ctx, wi, xn)};
    CHECK(tsr_context_error(ctx) == NULL, "%s: %s", W[i].name, tsr_context_error(ctx));
    CHECK_OK(tsr_compute(ctx, outs, 4));
    float *r = malloc((size_t)(m * (2 + 2 * n)) * sizeof *r);
    float *g1 = r, *gn = r + m, *p1 = gn + m * n, *pn = p1 + m;
    CHECK_OK(tsr_tensor_read(outs[0], g1, 0, (size_t)m * sizeof *r));
    CHECK_OK(tsr_tensor_read(outs[1], gn, 0, (size_t)(m * n) * sizeof *r));
    CHECK_OK(tsr_tensor_read(outs[2], p1, 0, (size_t)m * sizeof *r));
    CHECK_OK(tsr_tensor_read(outs[3], pn, 0, (size_t)(m * n) * sizeof *r));
    bool ok = true;
    for (int64_t row = 0; row < m && ok; row++) {
        double mag = 0;
        for (int64_t j = 0; j < k; j++) mag += fabs((double)vals[i][row * k + j] * x[j]);
        ok = fabs(g1[row] - p1[row]) <= 1e-5 * mag + 1e-6;
        CHECK(ok, "%s row %lld, one column: %.7g, the stored layout %.7g", W[i].name, (long long)row, g1[row], p1[row]);
    }
    ok = ok && memcmp(gn, pn, (size_t)(m * n) * sizeof *r) == 0;
    CHECK(ok, "%s, %d columns: not the stored layout's results", W[i].name, n);
    free(r);
    free(x);
    tsr_context_close(ctx);
    return ok;
}

/* get_rows of the weight: the rows' values. */
static void gather(tsr_backend *b, int i) {
    tsr_tensor *w = tsr_backend_weight(b, W[i].name);
    tsr_context *ctx = tsr_context_new(b);
    const int32_t idx[3] = {(int32_t)W[i].m - 1, 0, 9};
    const int64_t ni[1] = {3};
    tsr_tensor *out = tsr_get_rows(ctx, w, tsr_input(ctx, TSR_TYPE_I32, 1, ni, idx));
    CHECK_OK(tsr_compute(ctx, &out, 1));
    float *r = malloc((size_t)(3 * W[i].k) * sizeof *r);
    CHECK_OK(tsr_tensor_read(out, r, 0, (size_t)(3 * W[i].k) * sizeof *r));
    for (int q = 0; q < 3; q++)
        CHECK(memcmp(r + q * W[i].k, vals[i] + idx[q] * W[i].k, (size_t)W[i].k * sizeof *r) == 0,
              "%s: get_rows row %d is not the row's values", W[i].name, idx[q]);
    free(r);
    tsr_context_close(ctx);
}

/* Rows 8..15 of the weight through a view, multiplied: the same values
 * as those rows of the stored bytes. */
static void through_view(tsr_backend *b, int i) {
    tsr_tensor *w = tsr_backend_weight(b, W[i].name);
    tsr_context *ctx = tsr_context_new(b);
    const int64_t k = W[i].k, nx[2] = {k, 1};
    const size_t rs = tsr_row_size(W[i].type, k);
    float *x = malloc((size_t)k * sizeof *x), got[8];
    for (int64_t j = 0; j < k; j++) x[j] = frand();
    tsr_tensor *out = tsr_mul_mat(ctx, tsr_view_2d(ctx, w, k, 8, rs, 8 * rs), tsr_input(ctx, TSR_TYPE_F32, 2, nx, x));
    CHECK_OK(tsr_compute(ctx, &out, 1));
    CHECK_OK(tsr_tensor_read(out, got, 0, sizeof got));
    for (int r = 0; r < 8; r++) {
        double want = 0, mag = 0;
        for (int64_t j = 0; j < k; j++) {
            want += (double)vals[i][(8 + r) * k + j] * x[j];
            mag += fabs((double)vals[i][(8 + r) * k + j] * x[j]);
        }
        CHECK(fabs(got[r] - want) <= 2e-2 * mag + 1e-4, "%s through a view, row %d: %.7g, expected about %.7g",
              W[i].name, 8 + r, got[r], want);
    }
    free(x);
    tsr_context_close(ctx);
}

static uint32_t flags(tsr_backend *b, int i) { return tsr_backend_weight(b, W[i].name)->flags; }

int main(void) {
    char path[] = "/tmp/test-repack-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    make_weights();
    write_model(path);

    tsr_backend *b = load(path);
    for (int i = 0; i < N_W; i++) {
        multiply(b, i, 5);
        const bool want = W[i].fits && il8_kernels(W[i].type);
        CHECK(((flags(b, i) & TSR_FLAG_IL8) != 0) == want, "%s: interleaved %d, expected %d", W[i].name,
              (flags(b, i) & TSR_FLAG_IL8) != 0, want);
        multiply(b, i, 3); /* again, rearranged */
    }
    /* the bytes read back as stored; the weight then stays so */
    for (int i = 0; i < N_W; i++) {
        tsr_tensor *w = tsr_backend_weight(b, W[i].name);
        const size_t size = tsr_tensor_nbytes(w);
        char *got = malloc(size);
        CHECK_OK(tsr_tensor_read(w, got, 0, size));
        CHECK(memcmp(got, bytes[i], size) == 0, "%s: the bytes read back are not the stored ones", W[i].name);
        CHECK(!(flags(b, i) & TSR_FLAG_IL8), "%s: still interleaved after a read", W[i].name);
        free(got);
        if (i == 0)
            multiply(b, i, 2);
    }
    CHECK(!(flags(b, 0) & TSR_FLAG_IL8), "%s: rearranged again after a read", W[0].name);
    tsr_backend_free(b);

    /* a gather (a tied embedding) reads the layout; a view does not: the
     * weight goes back to the stored layout for good */
    b = load(path);
    const int g = N_W - 1;
    const bool il8 = il8_kernels(W[g].type);
    gather(b, g);
    CHECK(!(flags(b, g) & TSR_FLAG_IL8), "%s: rearranged by a gather alone", W[g].name);
    multiply(b, g, 4);
    gather(b, g);
    CHECK(((flags(b, g) & TSR_FLAG_IL8) != 0) == il8, "%s: after get_rows, flags %#x", W[g].name,
          (unsigned)flags(b, g));
    through_view(b, g);
    CHECK((flags(b, g) & (TSR_FLAG_IL8 | TSR_FLAG_NOREPACK)) == TSR_FLAG_NOREPACK, "%s: after a view, flags %#x",
          W[g].name, (unsigned)flags(b, g));
    multiply(b, g, 2);
    gather(b, g);
    CHECK(!(flags(b, g) & TSR_FLAG_IL8), "%s: rearranged again after a view", W[g].name);
    tsr_backend_free(b);

    /* turned off */
    setenv("TSR_CPU_REPACK", "0", 1);
    b = load(path);
    for (int i = 0; i < N_W; i++) {
        multiply(b, i, 2);
        CHECK(!(flags(b, i) & TSR_FLAG_IL8), "%s: interleaved with TSR_CPU_REPACK=0", W[i].name);
    }
    tsr_backend_free(b);
    unsetenv("TSR_CPU_REPACK");

    for (int i = 0; i < N_W; i++) free(bytes[i]), free(vals[i]);
    unlink(path);
    return tsrtest_done("test-repack");
}
