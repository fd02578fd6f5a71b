/*
 * test-core.c - the core: status and errors, logging, devices and buffer
 * types, parameter structs, contexts and tensors, op validation, views,
 * graphs with several outputs, the graph allocator's reuse, reserve then
 * compute without allocation, allocation failures, and a leak loop.
 */
#include "tsrtest.h"

#include "internal.h"

#include <unistd.h>

/* ---- reference helpers -------------------------------------------------- */

static void ref_mul_mat(const float *a, const float *b, double *c, int64_t k, int64_t m, int64_t n) {
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
            double s = 0;
            for (int64_t l = 0; l < k; l++)
                s += (double)a[i * k + l] * b[j * k + l];
            c[j * m + i] = s;
        }
}

static tsr_backend *new_backend(int n_threads) {
    tsr_backend_params p;
    tsr_backend_params_init(&p, sizeof p);
    p.n_threads = n_threads;
    tsr_backend *b = NULL;
    CHECK_OK(tsr_backend_new(&p, &b));
    return b;
}

/* ---- status, version, logging --------------------------------------------- */

static int n_records;
static char last_msg[128];
static void capture(tsr_log_level level, const char *msg, const tsr_log_field *f, size_t n, void *user) {
    (void)level, (void)f, (void)n, (void)user;
    n_records++;
    snprintf(last_msg, sizeof last_msg, "%s", msg);
}

static void test_basics(void) {
    CHECK(tsr_version() == TSR_VERSION_NUMBER);
    char v[32];
    snprintf(v, sizeof v, "%d.%d.%d", TSR_VERSION_MAJOR, TSR_VERSION_MINOR, TSR_VERSION_PATCH);
    CHECK(strcmp(tsr_version_string(), v) == 0);
    CHECK(strcmp(tsr_status_string(TSR_OK), "ok") == 0);
    for (int s = 0; s <= TSR_E_RANGE; s++)
        CHECK(tsr_status_string((tsr_status)s)[0] != '\0');
    CHECK(strcmp(tsr_status_string((tsr_status)999), "unknown status") == 0);
    tsr_clear_error();
    CHECK(tsr_last_error()[0] == '\0');
    CHECK(tsr_device_by_name("NOPE") == NULL);
    CHECK(strstr(tsr_last_error(), "NOPE") != NULL);

    tsr_log_set(capture, NULL);
    tsr_log_set_level(TSR_LOG_DEBUG);
    CHECK(tsr_log_get_level() == TSR_LOG_DEBUG);
    tsr_backend *b = new_backend(1);
    tsr_backend_log_plan(b);
    CHECK(n_records > 0 && strcmp(last_msg, "memory plan") == 0);
    int before = n_records;
    tsr_log_set_level(TSR_LOG_ERROR);
    tsr_backend_log_plan(b);
    CHECK(n_records == before);
    tsr_log_set(NULL, NULL);
    tsr_log_set_level(TSR_LOG_WARN);
    tsr_backend_free(b);
}

static void test_devices(void) {
    size_t n = tsr_device_count();
    CHECK(n >= 1);
    tsr_device *cpu = tsr_device_get(n - 1);
    CHECK(cpu && strcmp(tsr_device_name(cpu), "CPU") == 0);
    CHECK(tsr_device_kind(cpu) == TSR_DEVICE_CPU);
    CHECK(tsr_device_get(n) == NULL);
    CHECK(tsr_device_by_name("cpu") == cpu);
    CHECK(tsr_device_description(cpu) && tsr_device_description(cpu)[0]);
    size_t free = 0, total = 0;
    CHECK_OK(tsr_device_memory(cpu, &free, &total));
    CHECK(total > 0 && free <= total);
    CHECK_STATUS(tsr_device_memory(NULL, &free, &total), TSR_E_INVALID);
    tsr_buffer_type *bt = tsr_device_buffer_type(cpu);
    CHECK(bt && strcmp(tsr_buffer_type_name(bt), "CPU") == 0);
    CHECK(tsr_buffer_type_by_name("Cpu") == bt);
    CHECK(tsr_buffer_type_device(bt) == cpu);
    CHECK(tsr_device_host_buffer_type(cpu) == NULL);
    CHECK(tsr_buffer_type_by_name("CUDA9") == NULL);
    CHECK(strstr(tsr_last_error(), "CPU") != NULL); /* the error lists valid names */
    CHECK(strstr(tsr_backends_available(), "cpu") != NULL);
    tsr_buffer *buf = NULL;
    CHECK_OK(tsr_buffer_alloc(bt, 1000, &buf));
    CHECK(tsr_buffer_size(buf) == 1000 && tsr_buffer_get_type(buf) == bt);
    tsr_buffer_free(buf);
    tsr_buffer_free(NULL);
    CHECK_STATUS(tsr_buffer_alloc(NULL, 10, &buf), TSR_E_INVALID);
    CHECK(buf == NULL);
}

static void test_params(void) {
    tsr_backend_params p;
    memset(&p, 0x55, sizeof p);
    tsr_backend_params_init(&p, sizeof p);
    CHECK(p.size == sizeof p && p.devices == NULL && p.n_threads == 0 && p.flash_attn == TSR_FLASH_ATTN_AUTO &&
          p.attn_max_batch == 0);
    /* an "older" caller knows only size, devices and n_threads */
    struct {
        size_t size;
        tsr_device *const *devices;
        int n_threads;
    } old;
    tsr_backend_params_init((tsr_backend_params *)&old, sizeof old);
    CHECK(old.size == sizeof old && old.n_threads == 0);
    old.n_threads = 1;
    tsr_backend *b = NULL;
    CHECK_OK(tsr_backend_new((tsr_backend_params *)&old, &b));
    CHECK(b && tsr_backend_n_threads(b) == 1 && tsr_backend_attn_max_batch(b) == 0);
    tsr_backend_free(b);
    CHECK_OK(tsr_backend_new(NULL, &b)); /* NULL params = defaults */
    CHECK(tsr_backend_n_devices(b) >= 1);
    CHECK(tsr_backend_n_threads(b) == tsr__cpu_cores(), "n_threads 0: %d threads, %d cores", tsr_backend_n_threads(b),
          tsr__cpu_cores());
    tsr_backend_free(b);
    /* more threads than cores: clamped to the cores, and said so in the log */
    tsr_log_set(capture, NULL);
    n_records = 0;
    p.n_threads = tsr__cpu_cores() + 62;
    CHECK_OK(tsr_backend_new(&p, &b));
    CHECK(tsr_backend_n_threads(b) == tsr__cpu_cores(), "n_threads %d: %d threads, %d cores", p.n_threads,
          tsr_backend_n_threads(b), tsr__cpu_cores());
    CHECK(n_records == 1 && strstr(last_msg, "cores: using"), "%d records, the last \"%s\"", n_records, last_msg);
    tsr_log_set(NULL, NULL);
    tsr_backend_free(b);
    tsr_backend_free(NULL);
    p.n_threads = -3;
    CHECK_STATUS(tsr_backend_new(&p, &b), TSR_E_INVALID);
    CHECK(b == NULL);
    p.n_threads = 0;
    p.size = 0;
    CHECK_STATUS(tsr_backend_new(&p, &b), TSR_E_INVALID);
}

/* ---- tensors and ops --------------------------------------------------------- */

static void test_tensors(tsr_backend *b) {
    tsr_context *ctx = tsr_context_new(b);
    CHECK(ctx && tsr_context_error(ctx) == NULL && tsr_context_backend(ctx) == b);
    float data[6] = {1, 2, 3, 4, 5, 6};
    int64_t ne[2] = {3, 2};
    tsr_tensor *t = tsr_input(ctx, TSR_TYPE_F32, 2, ne, data);
    CHECK(t && tsr_tensor_ne(t, 0) == 3 && tsr_tensor_ne(t, 1) == 2 && tsr_tensor_ne(t, 3) == 1);
    CHECK(tsr_tensor_n_dims(t) == 2 && tsr_tensor_type(t) == TSR_TYPE_F32 && tsr_tensor_nelements(t) == 6);
    CHECK(tsr_tensor_nbytes(t) == 24 && tsr_tensor_nb(t, 1) == 12 && tsr_tensor_is_contiguous(t));
    CHECK(strcmp(tsr_tensor_name(tsr_set_name(t, "x")), "x") == 0);
    float out[6] = {0};
    CHECK_OK(tsr_tensor_read(t, out, 0, sizeof out));
    CHECK(memcmp(out, data, sizeof out) == 0);
    CHECK_OK(tsr_tensor_read(t, out, 8, 4));
    CHECK(out[0] == 3);
    CHECK_STATUS(tsr_tensor_read(t, out, 20, 8), TSR_E_RANGE);
    CHECK_STATUS(tsr_tensor_read(NULL, out, 0, 4), TSR_E_INVALID);
    float w = 9;
    CHECK_OK(tsr_tensor_write(t, &w, 4, 4));
    CHECK_OK(tsr_tensor_read(t, out, 0, sizeof out));
    CHECK(out[1] == 9);
    /* zero-sized is legal and allocates nothing */
    int64_t z[2] = {0, 5};
    tsr_tensor *e = tsr_input(ctx, TSR_TYPE_F32, 2, z, NULL);
    CHECK(e && tsr_tensor_nbytes(e) == 0);
    tsr_tensor *nt = tsr_new_tensor(ctx, NULL, TSR_TYPE_F16, 2, ne);
    CHECK(nt && tsr_tensor_buffer_type(nt) == tsr_buffer_type_by_name("CPU"));
    uint16_t h[6];
    CHECK_OK(tsr_tensor_read(nt, h, 0, sizeof h));
    CHECK(h[0] == 0 && h[5] == 0);
    /* a non-contiguous view reads in logical order */
    tsr_tensor *tr = tsr_transpose(ctx, t);
    CHECK(tr && tsr_tensor_ne(tr, 0) == 2 && !tsr_tensor_is_contiguous(tr));
    CHECK_OK(tsr_tensor_read(tr, out, 0, sizeof out));
    CHECK(out[0] == 1 && out[1] == 4 && out[2] == 9 && out[3] == 5);
    /* bad leaf arguments */
    int64_t neg[1] = {-1};
    CHECK(tsr_input(ctx, TSR_TYPE_F32, 1, neg, NULL) == NULL);
    CHECK(tsr_context_status(ctx) == TSR_E_INVALID);
    const char *first = tsr_context_error(ctx);
    CHECK(first && strstr(first, "negative"));
    CHECK(tsr_input(ctx, TSR_TYPE_F32, 5, ne, NULL) == NULL);
    CHECK(strstr(tsr_context_error(ctx), "negative")); /* first error wins */
    tsr_context_close(ctx);
    tsr_context_close(NULL);
    CHECK(tsr_context_new(NULL) == NULL);
}

static void test_op_errors(tsr_backend *b) {
    tsr_context *ctx = tsr_context_new(b);
    int64_t na[2] = {4, 3}, nb[2] = {5, 2};
    tsr_tensor *a = tsr_input(ctx, TSR_TYPE_F32, 2, na, NULL);
    tsr_tensor *bb = tsr_input(ctx, TSR_TYPE_F32, 2, nb, NULL);
    CHECK(tsr_mul_mat(ctx, a, bb) == NULL);
    CHECK(tsr_context_error(ctx) && strstr(tsr_context_error(ctx), "mul_mat"));
    CHECK(tsr_add(ctx, NULL, a) == NULL);
    CHECK(tsr_silu(ctx, tsr_mul_mat(ctx, a, bb)) == NULL);
    CHECK(strstr(tsr_context_error(ctx), "mul_mat")); /* still the first */
    tsr_tensor *outs[1] = {a};
    CHECK_STATUS(tsr_compute(ctx, outs, 1), TSR_E_INVALID);
    tsr_context_close(ctx);

    ctx = tsr_context_new(b);
    a = tsr_input(ctx, TSR_TYPE_F32, 2, na, NULL);
    CHECK(tsr_add(ctx, a, tsr_input(ctx, TSR_TYPE_F32, 2, nb, NULL)) == NULL); /* no broadcast */
    tsr_context_close(ctx);
    ctx = tsr_context_new(b);
    a = tsr_input(ctx, TSR_TYPE_F32, 2, na, NULL);
    CHECK(tsr_permute(ctx, a, 0, 0, 1, 2) == NULL);
    tsr_context_close(ctx);
    ctx = tsr_context_new(b);
    a = tsr_input(ctx, TSR_TYPE_F32, 2, na, NULL);
    CHECK(tsr_reshape_2d(ctx, a, 5, 2) == NULL);
    tsr_context_close(ctx);
    ctx = tsr_context_new(b);
    a = tsr_input(ctx, TSR_TYPE_F32, 2, na, NULL);
    CHECK(tsr_view_2d(ctx, a, 4, 4, 16, 0) == NULL); /* past the end */
    CHECK(tsr_context_status(ctx) == TSR_E_RANGE);
    tsr_context_close(ctx);
    ctx = tsr_context_new(b);
    int64_t ni[1] = {2};
    int32_t bad_idx[2] = {0, 7};
    a = tsr_input(ctx, TSR_TYPE_F32, 2, na, NULL);
    CHECK(tsr_get_rows(ctx, a, tsr_input(ctx, TSR_TYPE_I32, 1, ni, bad_idx)) == NULL);
    CHECK(tsr_context_status(ctx) == TSR_E_RANGE);
    tsr_context_close(ctx);
    ctx = tsr_context_new(b);
    CHECK_STATUS(tsr_compute(NULL, outs, 1), TSR_E_INVALID);
    CHECK_STATUS(tsr_compute(ctx, NULL, 1), TSR_E_INVALID);
    CHECK_OK(tsr_compute(ctx, NULL, 0));
    tsr_context_close(ctx);
}

/* mul_mat against the double reference on awkward shapes, with broadcasting. */
static void test_mul_mat(tsr_backend *b) {
    const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {64, 1, 1}, {17, 33, 9}, {0, 4, 3},
                                 {5, 0, 3}, {5, 3, 0}, {256, 130, 70}, {1000, 7, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t k = shapes[s][0], m = shapes[s][1], n = shapes[s][2];
        float *a = malloc(sizeof(float) * (size_t)(k * m + 1)), *bm = malloc(sizeof(float) * (size_t)(k * n + 1));
        float *c = malloc(sizeof(float) * (size_t)(m * n + 1));
        double *ref = malloc(sizeof(double) * (size_t)(m * n + 1));
        tsrtest_fill(a, (size_t)(k * m), (uint64_t)s + 1);
        tsrtest_fill(bm, (size_t)(k * n), (uint64_t)s + 100);
        ref_mul_mat(a, bm, ref, k, m, n);
        tsr_context *ctx = tsr_context_new(b);
        int64_t na[2] = {k, m}, nb[2] = {k, n};
        tsr_tensor *ta = tsr_input(ctx, TSR_TYPE_F32, 2, na, a), *tb = tsr_input(ctx, TSR_TYPE_F32, 2, nb, bm);
        tsr_tensor *tc = tsr_mul_mat(ctx, ta, tb);
        CHECK(tc && tsr_tensor_ne(tc, 0) == m && tsr_tensor_ne(tc, 1) == n);
        CHECK_OK(tsr_compute(ctx, &tc, 1));
        CHECK_OK(tsr_tensor_read(tc, c, 0, sizeof(float) * (size_t)(m * n)));
        double e = tsrtest_nmse(c, ref, (size_t)(m * n));
        if (!(e < 5e-6))
            fprintf(stderr, "mul_mat k=%lld m=%lld n=%lld nmse %g\n", (long long)k, (long long)m, (long long)n, e);
        CHECK(e < 5e-6);
        tsr_context_close(ctx);
        free(a), free(bm), free(c), free(ref);
    }
    /* F16 weights and broadcast over dim 2: a [8, 3, 2], b [8, 4, 6] */
    int64_t k = 8, m = 3, n = 4;
    float a[8 * 3 * 2], bm[8 * 4 * 6], c[3 * 4 * 6];
    double ref[3 * 4 * 6];
    uint16_t ah[8 * 3 * 2];
    tsrtest_fill(a, 48, 7);
    tsrtest_fill(bm, 192, 8);
    for (int i = 0; i < 48; i++) {
        ah[i] = tsr_fp32_to_fp16(a[i]);
        a[i] = tsr_fp16_to_fp32(ah[i]);
    }
    for (int i2 = 0; i2 < 6; i2++)
        ref_mul_mat(a + (i2 / 3) * 24, bm + i2 * 32, ref + i2 * 12, k, m, n);
    tsr_context *ctx = tsr_context_new(b);
    int64_t na[3] = {8, 3, 2}, nb[3] = {8, 4, 6};
    tsr_tensor *tc = tsr_mul_mat(ctx, tsr_input(ctx, TSR_TYPE_F16, 3, na, ah), tsr_input(ctx, TSR_TYPE_F32, 3, nb, bm));
    CHECK(tc && tsr_tensor_ne(tc, 2) == 6);
    CHECK_OK(tsr_compute(ctx, &tc, 1));
    CHECK_OK(tsr_tensor_read(tc, c, 0, sizeof c));
    CHECK(tsrtest_nmse(c, ref, 72) < 1e-6);
    tsr_context_close(ctx);
}

/* Several outputs, views, permute + cont, reshape, chains. */
static void test_graphs(tsr_backend *b) {
    tsr_context *ctx = tsr_context_new(b);
    float x[12], y[3];
    tsrtest_fill(x, 12, 11);
    tsrtest_fill(y, 3, 12);
    int64_t nx[2] = {3, 4}, ny[1] = {3};
    tsr_tensor *tx = tsr_input(ctx, TSR_TYPE_F32, 2, nx, x), *ty = tsr_input(ctx, TSR_TYPE_F32, 1, ny, y);
    tsr_tensor *sum = tsr_add(ctx, tx, ty);               /* broadcast rows */
    tsr_tensor *prod = tsr_mul(ctx, sum, ty);
    tsr_tensor *sc = tsr_scale(ctx, prod, 0.5f);
    tsr_tensor *tr = tsr_cont(ctx, tsr_transpose(ctx, sc));  /* [4, 3] */
    tsr_tensor *row = tsr_view_1d(ctx, sc, 3, 2 * 3 * sizeof(float)); /* row 2 of sc */
    tsr_tensor *rs = tsr_reshape_2d(ctx, tr, 6, 2);
    tsr_tensor *outs[4] = {sum, tr, row, rs};
    CHECK(tsr_context_error(ctx) == NULL);
    CHECK_OK(tsr_compute(ctx, outs, 4));
    float got[12];
    CHECK_OK(tsr_tensor_read(sum, got, 0, sizeof got));
    int bad = 0;
    for (int i = 0; i < 12; i++)
        bad += fabsf(got[i] - (x[i] + y[i % 3])) > 1e-6f;
    CHECK(bad == 0);
    CHECK_OK(tsr_tensor_read(tr, got, 0, sizeof got));
    bad = 0;
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 3; c++)
            bad += fabsf(got[c * 4 + r] - 0.5f * (x[r * 3 + c] + y[c]) * y[c]) > 1e-6f;
    CHECK(bad == 0);
    CHECK(tsr_tensor_ne(rs, 0) == 6);
    CHECK_OK(tsr_tensor_read(rs, got, 0, 12 * sizeof(float)));
    CHECK(fabsf(got[1] - 0.5f * (x[3] + y[0]) * y[0]) < 1e-6f);
    float r2[3];
    CHECK_OK(tsr_tensor_read(row, r2, 0, sizeof r2));
    CHECK(fabsf(r2[1] - 0.5f * (x[7] + y[1]) * y[1]) < 1e-6f);
    /* a new compute on the backend invalidates the old results */
    tsr_tensor *again = tsr_scale(ctx, tx, 2.0f);
    CHECK_OK(tsr_compute(ctx, &again, 1));
    CHECK_STATUS(tsr_tensor_read(sum, got, 0, 4), TSR_E_STATE);
    CHECK_OK(tsr_tensor_read(again, got, 0, 4));
    CHECK(got[0] == 2 * x[0]);
    /* inputs stay readable */
    CHECK_OK(tsr_tensor_read(tx, got, 0, 4));
    tsr_context_close(ctx);
}

/* The allocator reuses memory: a chain of 50 ops on a 1 MiB tensor needs a
 * few tensors' worth, not 50. */
static void test_allocator(tsr_backend *b) {
    tsr_context *ctx = tsr_context_new(b);
    int64_t ne[2] = {1024, 256};
    const size_t n = 1024 * 256;
    float *in = malloc(n * sizeof *in), *got = malloc(n * sizeof *got);
    double *ref = malloc(n * sizeof *ref);
    tsrtest_fill(in, n, 21);
    for (size_t i = 0; i < n; i++)
        ref[i] = in[i];
    tsr_tensor *t = tsr_input(ctx, TSR_TYPE_F32, 2, ne, in);
    tsr_tensor *x = t;
    /* each result overwrites its dying source in place: the values must not suffer */
    for (int i = 0; i < 50; i++) {
        x = (i % 2) ? tsr_silu(ctx, x) : tsr_scale(ctx, x, 0.9f);
        for (size_t e = 0; e < n; e++)
            ref[e] = (i % 2) ? ref[e] / (1.0 + exp(-ref[e])) : ref[e] * 0.9f;
    }
    size_t sizes[8] = {0};
    CHECK_OK(tsr_measure(ctx, &x, 1, sizes));
    size_t cpu = tsr_backend_n_devices(b) - 1, one = 1024 * 256 * 4;
    CHECK(sizes[cpu] >= one && sizes[cpu] <= 2 * one);
    CHECK_OK(tsr_compute(ctx, &x, 1));
    CHECK_OK(tsr_tensor_read(x, got, 0, n * sizeof *got));
    CHECK(tsrtest_nmse(got, ref, n) < 1e-10);
    CHECK_OK(tsr_tensor_read(t, got, 0, n * sizeof *got));
    CHECK(memcmp(got, in, n * sizeof *got) == 0); /* inputs are never overwritten */
    free(in), free(got), free(ref);
    size_t w, kv, comp;
    CHECK_OK(tsr_backend_memory_plan(b, cpu, &w, &kv, &comp));
    CHECK(comp >= sizes[cpu]);
    CHECK_STATUS(tsr_backend_memory_plan(b, 99, &w, &kv, &comp), TSR_E_RANGE);
    tsr_context_close(ctx);
}

/* A result may take over a dying source only when no other source reads
 * that memory through another view: x + transpose(x) must stay correct. */
static void test_inplace_alias(tsr_backend *b) {
    tsr_context *ctx = tsr_context_new(b);
    float in[64], got[64];
    tsrtest_fill(in, 64, 31);
    int64_t ne[2] = {8, 8};
    tsr_tensor *x = tsr_scale(ctx, tsr_input(ctx, TSR_TYPE_F32, 2, ne, in), 2.0f);
    tsr_tensor *y = tsr_add(ctx, x, tsr_transpose(ctx, x));
    tsr_tensor *z = tsr_mul(ctx, tsr_silu(ctx, y), y); /* y read twice by one node */
    CHECK_OK(tsr_compute(ctx, &z, 1));
    CHECK_OK(tsr_tensor_read(z, got, 0, sizeof got));
    int bad = 0;
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 8; c++) {
            double v = 2.0 * in[r * 8 + c] + 2.0 * in[c * 8 + r];
            double want = v / (1.0 + exp(-v)) * v;
            bad += fabs(got[r * 8 + c] - want) > 1e-5 * (1 + fabs(want));
        }
    CHECK(bad == 0);
    tsr_context_close(ctx);
}

/* Reserve a worst case, then compute smaller graphs without any allocation. */
static tsr_tensor *build_mlp(tsr_context *ctx, int64_t n_tokens, const float *w, const float *xin) {
    int64_t nw[2] = {64, 96}, nx[2] = {64, n_tokens};
    tsr_tensor *tw = tsr_input(ctx, TSR_TYPE_F32, 2, nw, w);
    tsr_tensor *tx = tsr_input(ctx, TSR_TYPE_F32, 2, nx, xin);
    tsr_tensor *h = tsr_silu(ctx, tsr_mul_mat(ctx, tw, tx));
    return tsr_rms_norm(ctx, tsr_add(ctx, h, h), 1e-5f);
}

static void test_reserve(tsr_backend *b) {
    static float w[64 * 96], xin[64 * 128];
    tsrtest_fill(w, sizeof w / sizeof *w, 3);
    tsrtest_fill(xin, sizeof xin / sizeof *xin, 4);
    tsr_context *ctx = tsr_context_new(b);
    tsr_tensor *worst = build_mlp(ctx, 128, w, xin);
    CHECK_OK(tsr_reserve(ctx, &worst, 1));
    tsr_context_close(ctx);
    for (int64_t n = 1; n <= 128; n *= 2) {
        ctx = tsr_context_new(b);
        tsr_tensor *out = build_mlp(ctx, n, w, xin);
        uint64_t before = tsr__alloc_count();
        CHECK_OK(tsr_compute(ctx, &out, 1));
        uint64_t after = tsr__alloc_count();
        if (after != before)
            fprintf(stderr, "n_tokens %lld: %llu allocations during compute after reserve\n", (long long)n,
                    (unsigned long long)(after - before));
        CHECK(after == before);
        tsr_context_close(ctx);
    }
}

/* Every allocation failing in turn: errors, never crashes (valgrind/ASan
 * runs of this test show nothing leaks). */
static void test_alloc_failures(tsr_backend *b) {
    for (int64_t nth = 0; nth < 40; nth++) {
        tsr__fail_alloc_after(nth);
        tsr_context *ctx = tsr_context_new(b);
        if (ctx) {
            int64_t ne[2] = {16, 16};
            tsr_tensor *a = tsr_input(ctx, TSR_TYPE_F32, 2, ne, NULL);
            tsr_tensor *c = tsr_mul_mat(ctx, a, tsr_input(ctx, TSR_TYPE_F32, 2, ne, NULL));
            tsr_tensor *d = tsr_new_tensor(ctx, NULL, TSR_TYPE_F32, 2, ne);
            (void)d;
            tsr_status s = tsr_compute(ctx, &c, 1);
            CHECK(s == TSR_OK || s == TSR_E_NOMEM || s == TSR_E_DEVICE_NOMEM || s == TSR_E_INVALID);
            tsr_context_close(ctx);
        } else {
            CHECK(strstr(tsr_last_error(), "memory") != NULL);
        }
        tsr__fail_alloc_after(-1);
    }
    tsr_backend *b2 = NULL;
    for (int64_t nth = 0; nth < 12; nth++) {
        tsr__fail_alloc_after(nth);
        tsr_status s = tsr_backend_new(NULL, &b2);
        tsr__fail_alloc_after(-1);
        CHECK((s == TSR_OK) == (b2 != NULL));
        tsr_backend_free(b2);
        b2 = NULL;
    }
}

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2)
            res = 0;
        fclose(f);
    }
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

static void one_cycle(tsr_backend *b, const float *data) {
    tsr_context *ctx = tsr_context_new(b);
    int64_t ne[2] = {32, 8};
    tsr_tensor *a = tsr_input(ctx, TSR_TYPE_F32, 2, ne, data);
    tsr_tensor *c = tsr_mul_mat(ctx, a, tsr_input(ctx, TSR_TYPE_F32, 2, ne, data));
    tsr_compute(ctx, &c, 1);
    tsr_context_close(ctx);
}

/* Thousands of create/input/compute/close cycles: memory must not grow. */
static void test_leak_loop(tsr_backend *b) {
    float data[256];
    tsrtest_fill(data, 256, 5);
    int n = getenv("TSR_LEAK_CYCLES") ? atoi(getenv("TSR_LEAK_CYCLES")) : 20000;
    for (int i = 0; i < 200; i++)
        one_cycle(b, data); /* warm up */
    long before = rss_kib();
    for (int i = 0; i < n; i++)
        one_cycle(b, data);
    long grown = rss_kib() - before;
    printf("leak loop: %d cycles, resident set grew by %ld KiB\n", n, grown);
    const char *pre = getenv("LD_PRELOAD");
    if (pre && strstr(pre, "valgrind"))
        return; /* valgrind's own memory grows; it checks leaks itself */
#if defined(__SANITIZE_ADDRESS__)
    return; /* so does AddressSanitizer's quarantine */
#endif
    CHECK(grown < 1024);
}

int main(void) {
    test_basics();
    test_devices();
    test_params();
    tsr_backend *b = new_backend(2);
    if (!b)
        return tsrtest_done("test-core");
    test_tensors(b);
    test_op_errors(b);
    test_mul_mat(b);
    test_graphs(b);
    test_allocator(b);
    test_inplace_alias(b);
    test_reserve(b);
    test_alloc_failures(b);
    test_leak_loop(b);
    tsr_backend_free(b);
    return tsrtest_done("test-core");
}
