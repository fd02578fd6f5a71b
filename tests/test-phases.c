/*
 * test-phases.c - the CPU runner's phases (cpu/cpu.c plan_phases: nodes
 * independent of each other between the same two barriers, one-column
 * matmuls of one activation sharing its conversion) and the graph's
 * clusters (libtensr/graph/graph.c: matmuls of one activation made
 * neighbours). Every graph is computed with TSR_CPU_PHASES=0 (a barrier
 * after every node) on one thread and with phases on 1 and 2 threads: the
 * same bits. A decode-like graph (one column and three: Q4_0, Q8_0, Q4_K
 * and F16 weights on one activation, a set_rows into a cache) is also
 * checked against a double reference; a matmul the outputs' order puts
 * after an in-place write into its activation must see the write (not be
 * moved before it); and random graphs of matmuls, element-wise ops and
 * in-place writes, whose intermediates the graph allocator packs into
 * reused memory, must agree bit for bit. Then the plan itself: a residual
 * add, the norm of it and the multiply by its weights share a phase (the
 * same rows on the same threads); a row op reading another row, one row
 * for all, or the transpose of the op before it does not; nor does an op reading a
 * one-column matmul; Q, K and V share one, K sharing Q's conversion. Links
 * the static library (the CPU stream).
 */
#include "internal.h"
#include "tsrtest.h"

#include <stdbool.h>

#define K 256 /* activation length (a Q4_K block) */
#define M 64  /* rows of each weight */

static tsr_backend *backend(int threads, bool phases) {
    setenv("TSR_CPU_PHASES", phases ? "1" : "0", 1); /* read when the stream is made */
    tsr_device *list[2] = {tsr_device_by_name("CPU"), NULL};
    tsr_backend_params p;
    tsr_backend_params_init(&p, sizeof p);
    p.devices = list;
    p.n_threads = threads;
    tsr_backend *b = NULL;
    CHECK_OK(tsr_backend_new(&p, &b));
    unsetenv("TSR_CPU_PHASES");
    return b;
}

/* The configurations every graph runs on; [0] is the plain one. */
#define N_CONF 3
static const struct {
    int threads;
    bool phases;
} CONF[N_CONF] = {{1, false}, {1, true}, {2, true}};

/* ---- a decode-like graph against a double reference ------------------------- */

#define N_W 5
static const tsr_type WT[N_W] = {TSR_TYPE_Q4_0, TSR_TYPE_Q8_0, TSR_TYPE_Q4_K, TSR_TYPE_F16, TSR_TYPE_Q4_0};
static void *wbytes[N_W];
static float wvals[N_W][M * K]; /* dequantized */

static void make_weights(void) {
    static float f[M * K];
    for (int i = 0; i < N_W; i++) {
        tsrtest_fill(f, M * K, 100 + (uint64_t)i);
        wbytes[i] = malloc(tsr_row_size(WT[i], K) * M);
        CHECK_OK(tsr_quantize(WT[i], f, wbytes[i], M * K));
        CHECK_OK(tsr_dequantize(WT[i], wbytes[i], wvals[i], M * K));
    }
}

#define CACHE_ROWS 6
static void decode_graph(tsr_backend *b, int T, const float *x, float *y, float *cache_out) {
    tsr_context *ctx = tsr_context_new(b);
    const int64_t nx[2] = {K, T}, nw[2] = {K, M}, nc[2] = {M, CACHE_ROWS}, ni[1] = {T};
    tsr_tensor *w[N_W];
    for (int i = 0; i < N_W; i++) w[i] = tsr_input(ctx, WT[i], 2, nw, wbytes[i]);
    int32_t idx[3] = {4, 1, 5};
    tsr_tensor *tx = tsr_input(ctx, TSR_TYPE_F32, 2, nx, NULL), *ti = tsr_input(ctx, TSR_TYPE_I32, 1, ni, idx);
    tsr_tensor *cache = tsr_input(ctx, TSR_TYPE_F32, 2, nc, NULL);
    /* h = rms_norm(x); a = silu(W0 h) * (W1 h); c = set_rows(cache, W2 h + W3 h);
     * y = a + W4 h, the matmuls interleaved with the ops that read them */
    tsr_tensor *h = tsr_rms_norm(ctx, tx, 1e-5f);
    tsr_tensor *a = tsr_mul(ctx, tsr_silu(ctx, tsr_mul_mat(ctx, w[0], h)), tsr_mul_mat(ctx, w[1], h));
    tsr_tensor *c = tsr_set_rows(ctx, cache, tsr_add(ctx, tsr_mul_mat(ctx, w[2], h), tsr_mul_mat(ctx, w[3], h)), ti);
    tsr_tensor *ty = tsr_add(ctx, a, tsr_mul_mat(ctx, w[4], h));
    tsr_tensor *outs[2] = {ty, c};
    CHECK_OK(tsr_compute(ctx, outs, 2));
    /* again on new inputs: the scheduler's last plan, the CPU's last phases */
    float x2[K * 3];
    for (int i = 0; i < K * T; i++) x2[i] = -0.5f * x[(i + 7) % (K * T)];
    CHECK_OK(tsr_tensor_write(tx, x2, 0, (size_t)K * T * sizeof(float)));
    CHECK_OK(tsr_compute(ctx, outs, 2));
    CHECK_OK(tsr_tensor_write(tx, x, 0, (size_t)K * T * sizeof(float)));
    CHECK_OK(tsr_compute(ctx, outs, 2));
    CHECK_OK(tsr_tensor_read(ty, y, 0, (size_t)M * T * sizeof(float)));
    CHECK_OK(tsr_tensor_read(c, cache_out, 0, (size_t)M * CACHE_ROWS * sizeof(float)));
    tsr_context_close(ctx);
}

static void check_decode(int T) {
    float x[K * 3];
    tsrtest_fill(x, (size_t)K * T, 7 + (uint64_t)T);
    double ry[M * 3], rc[M * CACHE_ROWS] = {0};
    const int32_t idx[3] = {4, 1, 5};
    for (int t = 0; t < T; t++) {
        double ss = 0, hn[K], mm[N_W][M];
        for (int k = 0; k < K; k++) ss += (double)x[t * K + k] * x[t * K + k];
        for (int k = 0; k < K; k++) hn[k] = x[t * K + k] / sqrt(ss / K + 1e-5);
        for (int i = 0; i < N_W; i++)
            for (int r = 0; r < M; r++) {
                double s = 0;
                for (int k = 0; k < K; k++) s += (double)wvals[i][r * K + k] * hn[k];
                mm[i][r] = s;
            }
        for (int r = 0; r < M; r++) {
            ry[t * M + r] = mm[0][r] / (1 + exp(-mm[0][r])) * mm[1][r] + mm[4][r];
            rc[idx[t] * M + r] = mm[2][r] + mm[3][r];
        }
    }
    float got[N_CONF][M * 3], cache[N_CONF][M * CACHE_ROWS];
    for (int c = 0; c < N_CONF; c++) {
        tsr_backend *b = backend(CONF[c].threads, CONF[c].phases);
        decode_graph(b, T, x, got[c], cache[c]);
        tsr_backend_free(b);
        const double ey = tsrtest_nmse(got[c], ry, (size_t)M * T), ec = tsrtest_nmse(cache[c], rc, M * CACHE_ROWS);
        CHECK(ey < 1e-3 && ec < 1e-3, "T=%d conf %d: nmse %.3g (y), %.3g (cache)", T, c, ey, ec);
        CHECK(memcmp(got[c], got[0], (size_t)M * T * sizeof(float)) == 0 &&
                  memcmp(cache[c], cache[0], sizeof cache[0]) == 0,
              "T=%d: %d threads with phases differ from one without", T, CONF[c].threads);
    }
}

/* ---- a matmul after an in-place write into its activation ------------------- */

/* outs {a, s, b}: a = W0 x, s = set_rows(x, r, {0}) writes x's first row,
 * b = W1 x reads x after it (the outputs' order); b must not move up to a. */
static void check_after_write(void) {
    float x[K * 2], row[K];
    tsrtest_fill(x, 2 * K, 11), tsrtest_fill(row, K, 12);
    double ra[M * 2], rb[M * 2];
    for (int t = 0; t < 2; t++)
        for (int r = 0; r < M; r++) {
            double sa = 0, sb = 0;
            for (int k = 0; k < K; k++) {
                sa += (double)wvals[3][r * K + k] * x[t * K + k];
                sb += (double)wvals[3][r * K + k] * (t == 0 ? row[k] : x[t * K + k]);
            }
            ra[t * M + r] = sa;
            rb[t * M + r] = sb;
        }
    for (int c = 0; c < N_CONF; c++)
        for (int T = 1; T <= 2; T++) {
            tsr_backend *b = backend(CONF[c].threads, CONF[c].phases);
            tsr_context *ctx = tsr_context_new(b);
            const int64_t nx[2] = {K, T}, nw[2] = {K, M}, nr[2] = {K, 1}, ni[1] = {1};
            int32_t zero = 0;
            tsr_tensor *w = tsr_input(ctx, WT[3], 2, nw, wbytes[3]);
            tsr_tensor *tx = tsr_input(ctx, TSR_TYPE_F32, 2, nx, x);
            tsr_tensor *a = tsr_mul_mat(ctx, w, tx);
            tsr_tensor *s = tsr_set_rows(ctx, tx, tsr_input(ctx, TSR_TYPE_F32, 2, nr, row),
                                         tsr_input(ctx, TSR_TYPE_I32, 1, ni, &zero));
            tsr_tensor *bb = tsr_mul_mat(ctx, w, tx);
            tsr_tensor *outs[3] = {a, s, bb};
            CHECK_OK(tsr_compute(ctx, outs, 3));
            float ga[M * 2], gb[M * 2];
            CHECK_OK(tsr_tensor_read(a, ga, 0, (size_t)M * T * sizeof(float)));
            CHECK_OK(tsr_tensor_read(bb, gb, 0, (size_t)M * T * sizeof(float)));
            const double ea = tsrtest_nmse(ga, ra, (size_t)M * T), eb = tsrtest_nmse(gb, rb, (size_t)M * T);
            CHECK(ea < 1e-4 && eb < 1e-4, "conf %d, T=%d: the matmul before the write %.3g, after it %.3g", c, T, ea,
                  eb);
            tsr_context_close(ctx);
            tsr_backend_free(b);
        }
}

/* ---- random graphs ---------------------------------------------------------- */

#define POOL 24
#define STEPS 40

/* A random graph over [M, T] F32 tensors (seeded): matmuls by M x M weights
 * of the types above (often several of one activation), adds, muls, silu,
 * scale, rms_norm, and set_rows writing into an input some later nodes
 * read; outputs: the last three tensors and the written input. */
static void random_graph(tsr_backend *b, uint64_t seed, int T, float *out, size_t *n_out) {
    uint64_t rs = seed;
    tsr_context *ctx = tsr_context_new(b);
    const int64_t nw[2] = {M, M}, nt[2] = {M, T}, nb[2] = {M, 8}, ni[1] = {T};
    static float f[M * M];
    static unsigned char wq[N_W][M * M * 2];
    tsr_tensor *w[N_W];
    for (int i = 0; i < N_W; i++) {
        tsrtest_fill(f, M * M, seed * 10 + (uint64_t)i);
        if (WT[i] == TSR_TYPE_Q4_K) { /* rows of 64 are not Q4_K rows: F32 instead */
            w[i] = tsr_input(ctx, TSR_TYPE_F32, 2, nw, f);
            continue;
        }
        CHECK_OK(tsr_quantize(WT[i], f, wq[i], M * M));
        w[i] = tsr_input(ctx, WT[i], 2, nw, wq[i]);
    }
    float x0[M * 3], side[M * 8];
    tsrtest_fill(x0, (size_t)M * T, seed + 1), tsrtest_fill(side, M * 8, seed + 2);
    tsr_tensor *pool[POOL + STEPS];
    int np = 0;
    pool[np++] = tsr_input(ctx, TSR_TYPE_F32, 2, nt, x0);
    tsr_tensor *buf = tsr_input(ctx, TSR_TYPE_F32, 2, nb, side); /* written in place */
    tsr_tensor *bufv = buf;
    int32_t idx[3];
    for (int s = 0; s < STEPS; s++) {
        const int r = (int)(tsrtest_rand_u64(&rs) % 10);
        tsr_tensor *a = pool[np - 1 - (int)(tsrtest_rand_u64(&rs) % (np < 4 ? np : 4))];
        tsr_tensor *c = pool[np - 1 - (int)(tsrtest_rand_u64(&rs) % (np < 6 ? np : 6))];
        tsr_tensor *t;
        if (r < 4) { /* one to three matmuls of a */
            t = tsr_mul_mat(ctx, w[tsrtest_rand_u64(&rs) % N_W], a);
            for (int e = (int)(tsrtest_rand_u64(&rs) % 3); e > 0 && np < POOL + STEPS - 1; e--) {
                pool[np++] = t;
                t = tsr_mul_mat(ctx, w[tsrtest_rand_u64(&rs) % N_W], a);
            }
        } else if (r == 4) {
            t = tsr_add(ctx, a, c);
        } else if (r == 5) {
            t = tsr_mul(ctx, a, tsr_scale(ctx, c, 0.25f));
        } else if (r == 6) {
            t = tsr_silu(ctx, a);
        } else if (r == 7) {
            t = tsr_rms_norm(ctx, a, 1e-5f);
        } else if (r == 8) { /* rows of a into buf, read later through the result */
            for (int j = 0; j < T; j++) idx[j] = (int32_t)(tsrtest_rand_u64(&rs) % 8);
            for (int j = 1; j < T; j++)
                if (idx[j] == idx[0])
                    idx[j] = (idx[0] + j) % 8;
            bufv = tsr_set_rows(ctx, bufv, a, tsr_input(ctx, TSR_TYPE_I32, 1, ni, idx));
            t = tsr_add(ctx, tsr_view_2d(ctx, bufv, M, T, (size_t)M * sizeof(float), 0), c);
        } else {
            t = tsr_scale(ctx, tsr_add(ctx, a, a), 0.5f);
        }
        pool[np++] = t;
        if (np >= POOL + STEPS - 1)
            break;
    }
    tsr_tensor *outs[4] = {pool[np - 3], pool[np - 2], pool[np - 1], bufv};
    CHECK_OK(tsr_compute(ctx, outs, 4));
    *n_out = 0;
    for (int o = 0; o < 4; o++) {
        const size_t nbytes = tsr_tensor_nbytes(outs[o]);
        CHECK_OK(tsr_tensor_read(outs[o], out + *n_out, 0, nbytes));
        *n_out += nbytes / sizeof(float);
    }
    tsr_context_close(ctx);
}

static void check_random(void) {
    static float got[N_CONF][M * 8 * 4];
    size_t n[N_CONF];
    int bad = 0;
    for (uint64_t seed = 1; seed <= 40; seed++) {
        const int T = 1 + (int)(seed % 3);
        for (int c = 0; c < N_CONF; c++) {
            tsr_backend *b = backend(CONF[c].threads, CONF[c].phases);
            random_graph(b, seed, T, got[c], &n[c]);
            tsr_backend_free(b);
            if (n[c] != n[0] || memcmp(got[c], got[0], n[0] * sizeof(float)) != 0)
                bad++;
            CHECK(n[c] == n[0] && memcmp(got[c], got[0], n[0] * sizeof(float)) == 0,
                  "seed %llu, T=%d: %d threads with phases differ from one without", (unsigned long long)seed, T,
                  CONF[c].threads);
        }
        if (bad > 3)
            break;
    }
}

/* ---- the plan itself ---------------------------------------------------------- */

/* Which of nodes[0..n) end a phase, planned on a 2-thread stream (the
 * tensors bound by a compute of all of them: each its own memory). */
static void plan_of(tsr_tensor **nodes, int n, bool *barrier, bool *conv_ready) {
    tsr_stream *s = NULL;
    CHECK_OK(tsr__cpu_stream_new(NULL, 2, &s));
    if (!s)
        return;
    CHECK_OK(tsr__cpu_reserve(s, nodes, (size_t)n));
    for (int i = 0; i < n; i++) {
        barrier[i] = s->plan[i].barrier;
        conv_ready[i] = s->plan[i].conv_ready;
    }
    tsr__cpu_stream_free(s);
}

static void check_plan(void) {
    tsr_backend *b = backend(2, true);
    tsr_context *ctx = tsr_context_new(b);
    const int T = 3;
    const int64_t nx[2] = {K, T}, nx1[2] = {K, 1}, nw[2] = {K, M}, ng[1] = {K};
    float x[K * 3], g[K];
    tsrtest_fill(x, K * 3, 21), tsrtest_fill(g, K, 22);
    tsr_tensor *ta = tsr_input(ctx, TSR_TYPE_F32, 2, nx, x), *tg = tsr_input(ctx, TSR_TYPE_F32, 1, ng, g);
    tsr_tensor *t1 = tsr_input(ctx, TSR_TYPE_F32, 2, nx1, x);
    tsr_tensor *w0 = tsr_input(ctx, WT[0], 2, nw, wbytes[0]), *w1 = tsr_input(ctx, WT[1], 2, nw, wbytes[1]);
    tsr_tensor *w2 = tsr_input(ctx, WT[2], 2, nw, wbytes[2]);
    tsr_tensor *res = tsr_add(ctx, ta, ta);          /* 0 */
    tsr_tensor *nrm = tsr_rms_norm(ctx, res, 1e-5f); /* 1: its rows of res */
    tsr_tensor *mul = tsr_mul(ctx, nrm, tg);         /* 2: its rows of nrm */
    tsr_tensor *shifted = tsr_add(ctx, tsr_view_2d(ctx, nrm, K, T - 1, K * sizeof(float), K * sizeof(float)),
                                  tsr_view_2d(ctx, ta, K, T - 1, K * sizeof(float), 0)); /* 3: the next row's */
    tsr_tensor *one = tsr_rms_norm(ctx, t1, 1e-5f);                                      /* 4 */
    tsr_tensor *bcast = tsr_add(ctx, ta, one);                                           /* 5: one row for all */
    tsr_tensor *h = tsr_rms_norm(ctx, t1, 1e-6f);                                        /* 6 */
    tsr_tensor *q = tsr_mul_mat(ctx, w0, h), *k = tsr_mul_mat(ctx, w1, h), *v = tsr_mul_mat(ctx, w2, h); /* 7-9 */
    tsr_tensor *sq = tsr_scale(ctx, q, 2.0f); /* 10: reads a one-column matmul */
    const int64_t nsq[2] = {M, M};
    tsr_tensor *tsq = tsr_input(ctx, TSR_TYPE_F32, 2, nsq, NULL);
    tsr_tensor *sqn = tsr_rms_norm(ctx, tsq, 1e-5f);             /* 11 */
    tsr_tensor *tr = tsr_add(ctx, tsr_transpose(ctx, sqn), tsq); /* 12: its rows' columns, the same shape */
    tsr_tensor *nodes[13] = {res, nrm, mul, shifted, one, bcast, h, q, k, v, sq, sqn, tr};
    CHECK_OK(tsr_compute(ctx, nodes, 13)); /* binds them all, none over another */
    bool bar[13], cr[13];
    plan_of(nodes, 3, bar, cr); /* the residual add, the norm of it, the multiply by weights */
    CHECK(!bar[0] && !bar[1] && bar[2], "add, norm, mul of the same rows: one phase (%d %d %d)", bar[0], bar[1],
          bar[2]);
    tsr_tensor *n2[2] = {nrm, shifted};
    plan_of(n2, 2, bar, cr);
    CHECK(bar[0], "a row op reading the next row of the one before shares its phase");
    tsr_tensor *n3[2] = {one, bcast};
    plan_of(n3, 2, bar, cr);
    CHECK(bar[0], "a row op reading one row for all of its rows shares the phase of that row's op");
    tsr_tensor *n5[2] = {sqn, tr};
    plan_of(n5, 2, bar, cr);
    CHECK(bar[0], "a row op reading the transpose of the one before (its shape) shares its phase");
    tsr_tensor *n4[5] = {h, q, k, v, sq};
    plan_of(n4, 5, bar, cr);
    CHECK(bar[0] && !bar[1] && !bar[2] && bar[3] && bar[4], "norm | q k v | scale: %d %d %d %d %d", bar[0], bar[1],
          bar[2], bar[3], bar[4]);
    CHECK(!cr[1] && cr[2] && !cr[3], "k shares q's conversion (both Q8_0), v (Q8_K) converts its own: %d %d %d", cr[1],
          cr[2], cr[3]);
    tsr_context_close(ctx);
    tsr_backend_free(b);
}

int main(void) {
    setenv("TSR_THREADPOOL_ADAPTIVE", "0", 1); /* every job on all threads */
    make_weights();
    check_decode(1);
    check_decode(3);
    check_after_write();
    check_random();
    check_plan();
    for (int i = 0; i < N_W; i++) free(wbytes[i]);
    return tsrtest_done("test-phases");
}
