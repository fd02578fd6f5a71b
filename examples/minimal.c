/*
 * minimal.c - the smallest complete libtensr program in C: create a backend,
 * multiply two matrices with tsr_mul_mat, check the answer against a plain
 * loop, and show how an op with mismatched shapes fails (NULL result, error
 * recorded in the context) without aborting. Exits non-zero on any failure.
 *
 * Build against an installed library:
 *   cc minimal.c $(pkg-config --cflags --libs libtensr)
 */
#include <libtensr.h>

#include <stdio.h>

enum { M = 3, N = 2, K = 4 };

/* No libm needed: the program links with nothing but libtensr. */
static double absd(double x) { return x < 0 ? -x : x; }

/* Prints the failing call, its status and the thread-local detail. */
static int fail(const char *what, tsr_status s)
{
    fprintf(stderr, "minimal: %s: %s: %s\n", what, tsr_status_string(s), tsr_last_error());
    return 1;
}

/* a is [K, M] (M rows of K), b is [K, N]: c[j][i] = sum_k a[i][k] * b[j][k]. */
static int check_result(const float *a, const float *b, const float *c)
{
    for (int j = 0; j < N; j++) {
        for (int i = 0; i < M; i++) {
            double want = 0.0;
            for (int k = 0; k < K; k++)
                want += (double)a[i * K + k] * b[j * K + k];
            if (absd(c[j * M + i] - want) > 1e-5 * (1.0 + absd(want))) {
                fprintf(stderr, "minimal: c[%d][%d] = %g, expected %g\n", j, i, c[j * M + i], want);
                return 1;
            }
        }
    }
    return 0;
}

/* Builds c = a x b in a fresh context, computes it and checks it. */
static int multiply(tsr_backend *be)
{
    float a[M * K], b[N * K], c[N * M];
    for (int i = 0; i < M * K; i++) a[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < N * K; i++) b[i] = 0.5f * (float)(i % 5) - 1.0f;

    tsr_context *ctx = tsr_context_new(be);
    if (!ctx) return fail("tsr_context_new", TSR_E_NOMEM);
    const int64_t ne_a[2] = {K, M}, ne_b[2] = {K, N};
    tsr_tensor *ta = tsr_input(ctx, TSR_TYPE_F32, 2, ne_a, a);
    tsr_tensor *tb = tsr_input(ctx, TSR_TYPE_F32, 2, ne_b, b);
    tsr_tensor *tc = tsr_mul_mat(ctx, ta, tb);
    if (!tc) {
        fprintf(stderr, "minimal: building the graph failed: %s\n", tsr_context_error(ctx));
        tsr_context_close(ctx);
        return 1;
    }
    tsr_status s = tsr_compute(ctx, &tc, 1);
    if (s == TSR_OK) s = tsr_tensor_read(tc, c, 0, sizeof c);
    int rc = s != TSR_OK ? fail("tsr_compute", s) : check_result(a, b, c);
    if (rc == 0)
        printf("c = a x b: [%lld, %lld], c[0][0] = %g: correct\n", (long long)tsr_tensor_ne(tc, 0),
               (long long)tsr_tensor_ne(tc, 1), c[0]);
    tsr_context_close(ctx);
    return rc;
}

/* An op with mismatched shapes returns NULL and records why in the context. */
static int mismatch(tsr_backend *be)
{
    tsr_context *ctx = tsr_context_new(be);
    if (!ctx) return fail("tsr_context_new", TSR_E_NOMEM);
    const int64_t ne_a[2] = {K, M}, ne_b[2] = {K + 1, N};
    tsr_tensor *ta = tsr_input(ctx, TSR_TYPE_F32, 2, ne_a, NULL);
    tsr_tensor *tb = tsr_input(ctx, TSR_TYPE_F32, 2, ne_b, NULL);
    tsr_tensor *tc = tsr_mul_mat(ctx, ta, tb);
    const char *err = tsr_context_error(ctx);
    int rc = 0;
    if (tc != NULL || err == NULL) {
        fprintf(stderr, "minimal: mismatched shapes were accepted\n");
        rc = 1;
    } else {
        printf("mismatched shapes rejected: %s\n", err);
    }
    tsr_context_close(ctx);
    return rc;
}

int main(void)
{
    printf("libtensr %s\n", tsr_version_string());
    tsr_backend_params p;
    tsr_backend_params_init(&p, sizeof p);
    p.n_threads = 2;
    tsr_backend *be = NULL;
    tsr_status s = tsr_backend_new(&p, &be);
    if (s != TSR_OK) return fail("tsr_backend_new", s);
    int rc = multiply(be);
    if (rc == 0) rc = mismatch(be);
    tsr_backend_free(be);
    return rc;
}
