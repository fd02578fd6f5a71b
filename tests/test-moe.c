/*
 * test-moe.c - the mixture-of-experts FFN block exactly as an architecture
 * builds it from the public ops, against a double-precision reference:
 *   logits = mul_mat(gate_inp, x)                  [n_expert, n_tokens]
 *   probs  = softmax(logits) or sigmoid(logits)
 *   sel    = top_k(probs, n_used)                  I32 [n_used, n_tokens]
 *   w      = get_rows(reshape_3d(probs, 1, n_expert, n_tokens), sel)   [1, n_used, n_tokens]
 *   w      = w / sum_rows(w)   (optional; the sums broadcast as [1, 1, n_tokens])
 *   up, gate = mul_mat_id(ffn_{up,gate}_exps, reshape_3d(x, n_embd, 1, n_tokens), sel)
 *   down   = mul_mat_id(ffn_down_exps, swiglu(gate, up), sel)           [n_embd, n_used, n_tokens]
 *   out    = sum over the n_used slots of down * w (views + adds)      [n_embd, n_tokens]
 * with F32 and quantized experts, softmax and sigmoid routers, decode and
 * batches; the chosen experts equal the reference's top-k wherever the
 * reference's k-th and (k+1)-th probabilities are apart; and the block's
 * output, and mul_mat_id's alone, are bit-identical with 1 and 2 threads.
 */
#include "tsrtest.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct moe_cfg {
    int64_t n_embd, n_ff, n_expert, n_used, n_tokens;
    tsr_type wtype;
    bool sigmoid, norm_w;
    double tol; /* NMSE of the output */
} moe_cfg;

typedef struct moe_data {
    float *gate_inp, *up, *gate, *down, *x; /* the values the library sees (through wtype) */
    void *qup, *qgate, *qdown;              /* the experts in wtype */
} moe_data;

static uint64_t seed = 1;

/* n floats in rows of len, rounded through type t; returns the bytes of type t. */
static void *make_weights(tsr_type t, float *v, int64_t n, int64_t len, float scale) {
    for (int64_t i = 0; i < n; i++) v[i] = scale * (tsrtest_randf(&seed) * 2 - 1);
    size_t row = tsr_row_size(t, len);
    char *q = malloc(row * (size_t)(n / len));
    for (int64_t r = 0; r < n / len; r++) {
        CHECK_OK(tsr_quantize(t, v + r * len, q + (size_t)r * row, len));
        CHECK_OK(tsr_dequantize(t, q + (size_t)r * row, v + r * len, len));
    }
    return q;
}

static void moe_data_make(const moe_cfg *c, moe_data *d) {
    const int64_t E = c->n_embd, F = c->n_ff, X = c->n_expert;
    d->gate_inp = malloc(sizeof(float) * (size_t)(E * X));
    d->up = malloc(sizeof(float) * (size_t)(E * F * X));
    d->gate = malloc(sizeof(float) * (size_t)(E * F * X));
    d->down = malloc(sizeof(float) * (size_t)(E * F * X));
    d->x = malloc(sizeof(float) * (size_t)(E * c->n_tokens));
    for (int64_t i = 0; i < E * X; i++) d->gate_inp[i] = 0.3f * (tsrtest_randf(&seed) * 2 - 1);
    for (int64_t i = 0; i < E * c->n_tokens; i++) d->x[i] = tsrtest_randf(&seed) * 2 - 1;
    d->qup = make_weights(c->wtype, d->up, E * F * X, E, 0.2f);
    d->qgate = make_weights(c->wtype, d->gate, E * F * X, E, 0.2f);
    d->qdown = make_weights(c->wtype, d->down, E * F * X, F, 0.2f);
}

static void moe_data_free(moe_data *d) {
    free(d->gate_inp), free(d->up), free(d->gate), free(d->down), free(d->x);
    free(d->qup), free(d->qgate), free(d->qdown);
}

/* The block; *sel_out: the chosen experts. */
static tsr_tensor *moe_ffn(tsr_context *ctx, const moe_cfg *c, tsr_tensor *x, tsr_tensor *gate_inp, tsr_tensor *up,
                           tsr_tensor *gate, tsr_tensor *down, tsr_tensor **sel_out) {
    const int64_t T = c->n_tokens, X = c->n_expert, U = c->n_used;
    tsr_tensor *logits = tsr_mul_mat(ctx, gate_inp, x);
    tsr_tensor *probs = c->sigmoid ? tsr_sigmoid(ctx, logits) : tsr_softmax(ctx, logits);
    tsr_tensor *sel = tsr_top_k(ctx, probs, (int)U);
    tsr_tensor *w = tsr_get_rows(ctx, tsr_reshape_3d(ctx, probs, 1, X, T), sel);
    if (c->norm_w)
        w = tsr_div(ctx, w, tsr_reshape_3d(ctx, tsr_sum_rows(ctx, tsr_reshape_2d(ctx, w, U, T)), 1, 1, T));
    tsr_tensor *x3 = tsr_reshape_3d(ctx, x, c->n_embd, 1, T);
    tsr_tensor *u = tsr_mul_mat_id(ctx, up, x3, sel), *g = tsr_mul_mat_id(ctx, gate, x3, sel);
    tsr_tensor *dn = tsr_mul(ctx, tsr_mul_mat_id(ctx, down, tsr_swiglu(ctx, g, u), sel), w);
    if (!dn)
        return NULL;
    const size_t nb1 = tsr_tensor_nb(dn, 1), nb2 = tsr_tensor_nb(dn, 2);
    tsr_tensor *out = tsr_view_2d(ctx, dn, c->n_embd, T, nb2, 0);
    for (int64_t e = 1; e < U; e++) out = tsr_add(ctx, out, tsr_view_2d(ctx, dn, c->n_embd, T, nb2, (size_t)e * nb1));
    *sel_out = sel;
    return U == 1 ? tsr_cont(ctx, out) : out;
}

static tsr_backend *cpu_backend(int n_threads) {
    tsr_backend_params p;
    tsr_backend_params_init(&p, sizeof p);
    p.n_threads = n_threads;
    tsr_backend *b = NULL;
    CHECK_OK(tsr_backend_new(&p, &b));
    return b;
}

/* Runs the block on b: out [n_embd * n_tokens], sel [n_used * n_tokens]. */
static bool run_block(tsr_backend *b, const moe_cfg *c, const moe_data *d, float *out, int32_t *sel) {
    tsr_context *ctx = tsr_context_new(b);
    const int64_t ne_x[2] = {c->n_embd, c->n_tokens}, ne_g[2] = {c->n_embd, c->n_expert};
    const int64_t ne_ug[3] = {c->n_embd, c->n_ff, c->n_expert}, ne_d[3] = {c->n_ff, c->n_embd, c->n_expert};
    tsr_tensor *s = NULL;
    tsr_tensor *y = moe_ffn(ctx, c, tsr_input(ctx, TSR_TYPE_F32, 2, ne_x, d->x),
                            tsr_input(ctx, TSR_TYPE_F32, 2, ne_g, d->gate_inp),
                            tsr_input(ctx, c->wtype, 3, ne_ug, d->qup), tsr_input(ctx, c->wtype, 3, ne_ug, d->qgate),
                            tsr_input(ctx, c->wtype, 3, ne_d, d->qdown), &s);
    bool ok = y != NULL;
    CHECK(ok, "building the block: %s", tsr_context_error(ctx) ? tsr_context_error(ctx) : "");
    tsr_tensor *outs[2] = {y, s};
    if (ok) {
        CHECK_OK(tsr_compute(ctx, outs, 2));
        ok = tsr_tensor_ne(y, 0) == c->n_embd && tsr_tensor_ne(y, 1) == c->n_tokens;
        CHECK(ok, "output shape");
        ok = ok && tsr_tensor_read(y, out, 0, sizeof(float) * (size_t)(c->n_embd * c->n_tokens)) == TSR_OK &&
             tsr_tensor_read(s, sel, 0, sizeof(int32_t) * (size_t)(c->n_used * c->n_tokens)) == TSR_OK;
    }
    tsr_context_close(ctx);
    return ok;
}

static double silu_d(double v) { return v / (1 + exp(-v)); }

/* The reference of the block with the experts `sel` the library chose; checks sel
 * against the reference's own top-k where that is decided by a margin. */
static void reference(const moe_cfg *c, const moe_data *d, const int32_t *sel, double *ref) {
    const int64_t E = c->n_embd, F = c->n_ff, X = c->n_expert, U = c->n_used;
    double *p = malloc(sizeof(double) * (size_t)X), *h = malloc(sizeof(double) * (size_t)F);
    for (int64_t t = 0; t < c->n_tokens; t++) {
        const float *x = d->x + t * E;
        double mx = -INFINITY, sum = 0;
        for (int64_t e = 0; e < X; e++) {
            double l = 0;
            for (int64_t k = 0; k < E; k++) l += (double)d->gate_inp[e * E + k] * x[k];
            p[e] = l;
            mx = fmax(mx, l);
        }
        for (int64_t e = 0; e < X; e++) sum += (p[e] = c->sigmoid ? 1 / (1 + exp(-p[e])) : exp(p[e] - mx));
        if (!c->sigmoid)
            for (int64_t e = 0; e < X; e++) p[e] /= sum;
        /* the reference's choice: the n_used largest, checked where the margin is clear */
        double kth = INFINITY, next = -INFINITY;
        for (int64_t j = 0; j < U; j++) {
            const int32_t id = sel[t * U + j];
            CHECK(id >= 0 && id < X, "sel %d out of range", id);
            kth = fmin(kth, p[id]);
            for (int64_t i = 0; i < j; i++) CHECK(sel[t * U + i] != id, "expert %d chosen twice", id);
            if (j > 0)
                CHECK(p[sel[t * U + j - 1]] >= p[id] - 1e-6, "sel not largest first");
        }
        for (int64_t e = 0; e < X; e++) {
            bool chosen = false;
            for (int64_t j = 0; j < U; j++) chosen |= sel[t * U + j] == e;
            if (!chosen)
                next = fmax(next, p[e]);
        }
        CHECK(next <= kth + 1e-6, "token %lld: an expert left out scores %g above the chosen %g", (long long)t, next,
              kth);
        double wsum = 0, w[64];
        for (int64_t j = 0; j < U; j++) wsum += (w[j] = p[sel[t * U + j]]);
        for (int64_t i = 0; i < E; i++) ref[t * E + i] = 0;
        for (int64_t j = 0; j < U; j++) {
            const int64_t id = sel[t * U + j];
            const double wj = c->norm_w ? w[j] / wsum : w[j];
            for (int64_t f = 0; f < F; f++) {
                double su = 0, sg = 0;
                for (int64_t k = 0; k < E; k++) {
                    su += (double)d->up[(id * F + f) * E + k] * x[k];
                    sg += (double)d->gate[(id * F + f) * E + k] * x[k];
                }
                h[f] = silu_d(sg) * su;
            }
            for (int64_t i = 0; i < E; i++) {
                double s = 0;
                for (int64_t f = 0; f < F; f++) s += (double)d->down[(id * E + i) * F + f] * h[f];
                ref[t * E + i] += wj * s;
            }
        }
    }
    free(p), free(h);
}

static void test_block(const moe_cfg *c, tsr_backend *b1, tsr_backend *b2) {
    moe_data d;
    moe_data_make(c, &d);
    const size_t n_out = (size_t)(c->n_embd * c->n_tokens), n_sel = (size_t)(c->n_used * c->n_tokens);
    float *out = malloc(sizeof(float) * n_out), *out2 = malloc(sizeof(float) * n_out);
    int32_t *sel = malloc(sizeof(int32_t) * n_sel), *sel2 = malloc(sizeof(int32_t) * n_sel);
    double *ref = malloc(sizeof(double) * n_out);
    if (run_block(b1, c, &d, out, sel) && run_block(b2, c, &d, out2, sel2)) {
        reference(c, &d, sel, ref);
        const double nmse = tsrtest_nmse(out, ref, n_out);
        printf("moe block %-5s embd %lld ff %lld experts %lld used %lld tokens %lld %s%s: NMSE %.3g (max %.1g)\n",
               tsr_type_name(c->wtype), (long long)c->n_embd, (long long)c->n_ff, (long long)c->n_expert,
               (long long)c->n_used, (long long)c->n_tokens, c->sigmoid ? "sigmoid" : "softmax",
               c->norm_w ? " norm" : "", nmse, c->tol);
        CHECK(nmse < c->tol, "moe block NMSE %g", nmse);
        CHECK(memcmp(out, out2, sizeof(float) * n_out) == 0 && memcmp(sel, sel2, sizeof(int32_t) * n_sel) == 0,
              "the block differs between 1 and 2 threads");
    }
    free(out), free(out2), free(sel), free(sel2), free(ref);
    moe_data_free(&d);
}

int main(void) {
    tsr_backend *b1 = cpu_backend(1), *b2 = cpu_backend(2);
    if (!b1 || !b2)
        return 1;
    const moe_cfg cfgs[] = {
        {64, 32, 8, 2, 7, TSR_TYPE_F32, false, true, 1e-10},     /* Mixtral-like: softmax, renormalized */
        {64, 32, 8, 2, 33, TSR_TYPE_Q8_0, false, false, 5e-4},   /* Qwen2-MoE-like: no renormalization */
        {256, 256, 16, 4, 130, TSR_TYPE_Q4_K, true, true, 5e-4}, /* sigmoid router, renormalized */
        {96, 64, 60, 4, 33, TSR_TYPE_Q4_0, false, true, 5e-4},
        {64, 32, 3, 1, 1, TSR_TYPE_F16, false, true, 1e-6}, /* decode, one expert a token */
        {64, 32, 1, 1, 7, TSR_TYPE_BF16, false, false, 1e-5}, /* one expert */
        {256, 256, 8, 8, 5, TSR_TYPE_Q6_K, true, false, 5e-4}, /* every expert used */
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof *cfgs; i++) test_block(&cfgs[i], b1, b2);
    tsr_backend_free(b1);
    tsr_backend_free(b2);
    return tsrtest_done("test-moe");
}
