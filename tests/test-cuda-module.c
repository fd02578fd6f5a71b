/*
 * test-cuda-module.c - the CUDA backend module (cuda/libtensr-cuda.so),
 * loaded through TSR_BACKEND_PATH in a child process (the registry
 * enumerates once per process). Without a GPU (or a driver) the module
 * loads, registers no device, and the log says why ("cuda: no CUDA device"
 * with the cudaError); the library goes on with the CPU alone, and no
 * allocation of the library is left behind. With a GPU: CUDA0 is listed
 * before the CPU with a description and its memory, x + w on it is exact,
 * its pinned staging type CUDA0_Host allocates, an allocation larger than
 * the card is TSR_E_DEVICE_NOMEM naming the free memory, and twenty cycles
 * of a backend computing on CUDA0 and of a large buffer give the memory back
 * (within 64 MiB of the free memory after the first computation); CUDA
 * graphs replay a decode-like graph and two graphs in turn with the bits of
 * plain launches (check_graphs).
 * A copy of the module whose NEEDED entry names a CUDA runtime that does not
 * exist (libcudart patched to libcudaRT in its string table) stands for a
 * machine without the CUDA runtime: dlopen fails, the loader logs the
 * module as skipped with dlopen's reason, and the library works on the CPU.
 * Skips (77) when the module is not built (./configure --enable-cuda).
 * TSR_TEST_CUDA_MODULE=PATH runs the first part on another build of the
 * module (tests/test-ops-cuda-emu.sh: the emulated one, whose CUDA0 takes
 * the GPU cases).
 */
#include "tsrtest.h"

#include <math.h>
#include <sys/wait.h>
#include <unistd.h>

static char log_text[16384];

static void capture(tsr_log_level level, const char *msg, const tsr_log_field *fields, size_t n, void *user) {
    (void)user;
    size_t len = strlen(log_text);
    len += (size_t)snprintf(log_text + len, sizeof log_text - len, "%d %s", (int)level, msg);
    for (size_t i = 0; i < n && len < sizeof log_text; i++)
        len += (size_t)snprintf(log_text + len, sizeof log_text - len, " %s=%s", fields[i].key, fields[i].value);
    if (len < sizeof log_text - 1)
        strcat(log_text, "\n");
}

/* The line of the log that mentions both a and b (NULL when none). */
static const char *log_line_with(const char *a, const char *b) {
    for (const char *p = log_text; *p;) {
        const char *end = strchr(p, '\n');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char line[2048];
        snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), p);
        if (strstr(line, a) && strstr(line, b))
            return p;
        p += n + (end != NULL);
    }
    return NULL;
}

/* A backend on dev alone (NULL on failure). */
static tsr_backend *backend_on(tsr_device *dev) {
    tsr_device *devs[2] = {dev, NULL};
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.devices = devs;
    bp.n_threads = 2;
    tsr_backend *b = NULL;
    return tsr_backend_new(&bp, &b) == TSR_OK ? b : NULL;
}

/* x + w with w placed on dev, read back, compared exactly. */
static int add_on(tsr_device *dev) {
    tsr_backend *b = backend_on(dev);
    if (!b)
        return 0;
    tsr_context *ctx = tsr_context_new(b);
    int64_t ne[1] = {1000};
    static float x[1000], y[1000], z[1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)i * 0.5f, y[i] = (float)(i % 7) - 3.0f;
    tsr_tensor *w = tsr_new_tensor(ctx, tsr_device_buffer_type(dev), TSR_TYPE_F32, 1, ne);
    int ok = w && tsr_tensor_write(w, y, 0, sizeof y) == TSR_OK;
    tsr_tensor *out = ok ? tsr_add(ctx, tsr_input(ctx, TSR_TYPE_F32, 1, ne, x), w) : NULL;
    ok = out && tsr_compute(ctx, &out, 1) == TSR_OK && tsr_tensor_read(out, z, 0, sizeof z) == TSR_OK;
    for (int i = 0; ok && i < 1000; i++) ok = z[i] == x[i] + y[i];
    if (!ok)
        fprintf(stderr, "add on %s: %s\n", tsr_device_name(dev), tsr_last_error());
    tsr_context_close(ctx);
    tsr_backend_free(b);
    return ok;
}

/* One decode-like graph (mul_mat_id, rms_norm, mul_mat) computed again
 * with new inputs on dev: from the second compute on the backend replays
 * it as a CUDA graph, which gives the bits of launching every kernel
 * (TSR_CUDA_GRAPHS=0) and the float64 reference's values; a bad expert id
 * in a replay is still TSR_E_RANGE, and the step after it is right. */
static void check_graphs(tsr_device *d) {
    enum { K = 64, M = 48, N = 16, NE = 4, NU = 2, STEPS = 7, BAD = 5 };
    static float w[K * M * NE], w2[M * N], x[STEPS][K], got[2][STEPS][N * NU], turns[2][6][N * NU];
    static int32_t ids[STEPS][NU];
    for (int i = 0; i < K * M * NE; i++) w[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (int i = 0; i < M * N; i++) w2[i] = (float)((i * 53) % 89) / 44.0f - 1.0f;
    for (int s = 0; s < STEPS; s++) {
        for (int k = 0; k < K; k++) x[s][k] = (float)((s * 131 + k * 17) % 97) / 48.0f - 1.0f;
        ids[s][0] = s % NE;
        ids[s][1] = s == BAD ? NE : (s + 1 + s / 2) % NE;
    }
    for (int mode = 0; mode < 2; mode++) {
        setenv("TSR_CUDA_GRAPHS", mode ? "0" : "1", 1);
        log_text[0] = '\0';
        tsr_backend *b = backend_on(d);
        CHECK(b != NULL, "backend on %s: %s", tsr_device_name(d), tsr_last_error());
        if (!b) {
            unsetenv("TSR_CUDA_GRAPHS");
            return;
        }
        tsr_context *ctx = tsr_context_new(b);
        const int64_t ne_w[3] = {K, M, NE}, ne_w2[2] = {M, N}, ne_x[3] = {K, 1, 1}, ne_i[2] = {NU, 1};
        tsr_tensor *W = tsr_new_tensor(ctx, tsr_device_buffer_type(d), TSR_TYPE_F32, 3, ne_w);
        tsr_tensor *W2 = tsr_new_tensor(ctx, tsr_device_buffer_type(d), TSR_TYPE_F32, 2, ne_w2);
        CHECK(W && W2);
        CHECK_OK(tsr_tensor_write(W, w, 0, sizeof w));
        CHECK_OK(tsr_tensor_write(W2, w2, 0, sizeof w2));
        tsr_tensor *X = tsr_input(ctx, TSR_TYPE_F32, 3, ne_x, NULL), *I = tsr_input(ctx, TSR_TYPE_I32, 2, ne_i, NULL);
        tsr_tensor *y = tsr_set_name(tsr_mul_mat_id(ctx, W, X, I), "moe");
        tsr_tensor *out = tsr_mul_mat(ctx, W2, tsr_rms_norm(ctx, y, 1e-5f));
        CHECK(out != NULL);
        for (int s = 0; out && s < STEPS; s++) {
            CHECK_OK(tsr_tensor_write(X, x[s], 0, sizeof x[s]));
            CHECK_OK(tsr_tensor_write(I, ids[s], 0, sizeof ids[s]));
            const tsr_status st = tsr_compute(ctx, &out, 1);
            if (s == BAD) {
                CHECK(st == TSR_E_RANGE && strstr(tsr_last_error(), "expert id 4") && strstr(tsr_last_error(), "moe"),
                      "step %d: status %d (%s)", s, (int)st, tsr_last_error());
                continue;
            }
            CHECK(st == TSR_OK, "step %d (graphs %s): %s", s, mode ? "off" : "on", tsr_last_error());
            CHECK_OK(tsr_tensor_read(out, got[mode][s], 0, sizeof got[mode][s]));
            for (int e = 0; e < NU; e++) { /* the float64 reference */
                double z[M], ss = 0, err = 0, mag = 0;
                for (int i = 0; i < M; i++) {
                    z[i] = 0;
                    for (int k = 0; k < K; k++) z[i] += (double)w[(ids[s][e] * M + i) * K + k] * x[s][k];
                    ss += z[i] * z[i];
                }
                for (int j = 0; j < N; j++) {
                    double r = 0;
                    for (int i = 0; i < M; i++) r += (double)w2[j * M + i] * z[i] / sqrt(ss / M + 1e-5);
                    err += (got[mode][s][e * N + j] - r) * (got[mode][s][e * N + j] - r);
                    mag += r * r;
                }
                CHECK(err <= 1e-8 * mag, "step %d slot %d: NMSE %g", s, e, err / mag);
            }
        }
        /* two graphs taking turns (each its own description, kept side by
         * side): the same bits as plain launches */
        tsr_tensor *out2 = tsr_scale(ctx, tsr_mul_mat(ctx, W2, y), 0.25f);
        CHECK(out2 != NULL);
        CHECK_OK(tsr_tensor_write(X, x[0], 0, sizeof x[0]));
        CHECK_OK(tsr_tensor_write(I, ids[0], 0, sizeof ids[0]));
        for (int i = 0; out2 && i < 6; i++) {
            tsr_tensor *o = i % 2 ? out2 : out;
            CHECK_OK(tsr_compute(ctx, &o, 1));
            CHECK_OK(tsr_tensor_read(o, turns[mode][i], 0, sizeof turns[mode][i]));
        }
        const int captured = log_line_with("cuda: compute captured as a graph", "CUDA0") != NULL;
        CHECK(captured == (mode == 0), "graphs %s: captured %d", mode ? "off" : "on", (int)captured);
        tsr_context_close(ctx);
        tsr_backend_free(b);
    }
    unsetenv("TSR_CUDA_GRAPHS");
    CHECK(memcmp(got[0], got[1], sizeof got[0]) == 0, "graph replays give the bits of plain launches");
    CHECK(memcmp(turns[0], turns[1], sizeof turns[0]) == 0, "two graphs in turn give the bits of plain launches");
    CHECK(memcmp(turns[0][0], got[0][0], sizeof turns[0][0]) == 0 &&
              memcmp(turns[0][0], turns[0][4], sizeof turns[0][0]) == 0,
          "the first graph's result is step 0's in every turn");
}

static void case_no_gpu(void) {
    CHECK(log_line_with("backend module has no device", "libtensr-cuda.so") != NULL);
    CHECK(log_line_with("cuda: no CUDA device", "reason=cudaError") != NULL ||
          log_line_with("cuda: no CUDA device", "reason=cudaGetDeviceCount found no device") != NULL);
    CHECK(tsr_device_count() == 1);
    CHECK(strcmp(tsr_backends_available(), "cpu") == 0);
    CHECK(add_on(tsr_device_by_name("CPU")));
}

static void case_gpu(void) {
    tsr_device *d = tsr_device_by_name("CUDA0");
    CHECK(log_line_with("backend module loaded", "libtensr-cuda") != NULL);
    CHECK(strstr(tsr_backends_available(), "cuda") != NULL);
    CHECK(tsr_device_kind(d) == TSR_DEVICE_GPU);
    CHECK(strstr(tsr_device_description(d), "compute") != NULL);
    printf("CUDA0: %s\n", tsr_device_description(d));
    CHECK(strcmp(tsr_device_name(tsr_device_get(tsr_device_count() - 1)), "CPU") == 0);
    CHECK(add_on(d)); /* the first computation sets up the context and cuBLAS */
    check_graphs(d);
    size_t free0 = 0, total = 0;
    CHECK_OK(tsr_device_memory(d, &free0, &total));
    CHECK(total > 0 && free0 > 0 && free0 <= total);
    tsr_buffer_type *host = tsr_buffer_type_by_name("CUDA0_Host");
    CHECK(host != NULL && host == tsr_device_host_buffer_type(d));
    tsr_buffer *hb = NULL;
    CHECK_OK(tsr_buffer_alloc(host, 1 << 20, &hb));
    tsr_buffer_free(hb);
    /* more than the card: a clean status naming the free memory */
    tsr_buffer *big = NULL;
    const tsr_status st = tsr_buffer_alloc(tsr_device_buffer_type(d), total + ((size_t)1 << 30), &big);
    CHECK(st == TSR_E_DEVICE_NOMEM);
    CHECK(strstr(tsr_last_error(), "free") != NULL && strstr(tsr_last_error(), "CUDA0") != NULL);
    printf("out of memory: %s\n", tsr_last_error());
    /* twenty cycles of a backend on CUDA0 computing (streams, cuBLAS handles,
     * compute buffers) and of a buffer of a quarter of the free memory */
    for (int i = 0; i < 20; i++) {
        CHECK(add_on(d));
        tsr_buffer *q = NULL;
        CHECK_OK(tsr_buffer_alloc(tsr_device_buffer_type(d), free0 / 4, &q));
        tsr_buffer_free(q);
    }
    size_t free1 = 0;
    CHECK_OK(tsr_device_memory(d, &free1, &total));
    CHECK(free1 + ((size_t)64 << 20) >= free0);
    printf("free memory: %.1f MiB before, %.1f MiB after 20 cycles\n", free0 / 1048576.0, free1 / 1048576.0);
}

static void case_no_runtime(void) {
    CHECK(log_line_with("backend module skipped", "libcudaRT") != NULL);
    CHECK(tsr_device_by_name("CUDA0") == NULL);
    CHECK(strcmp(tsr_backends_available(), "cpu") == 0);
    CHECK(add_on(tsr_device_by_name("CPU")));
}

/* Copies the module to dir/libtensr-cuda.so with "libcudart" renamed
 * "libcudaRT" everywhere in it (the NEEDED entry's string); false when the
 * file cannot be read or has no such string. */
static int copy_without_runtime(const char *from, const char *dir, char *out, size_t out_size) {
    FILE *f = fopen(from, "rb");
    if (!f)
        return 0;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n > 0 ? malloc((size_t)n) : NULL;
    int ok = buf && fread(buf, 1, (size_t)n, f) == (size_t)n;
    fclose(f);
    int found = 0;
    for (long i = 0; ok && i + 9 <= n; i++)
        if (memcmp(buf + i, "libcudart", 9) == 0) {
            memcpy(buf + i, "libcudaRT", 9);
            found++;
        }
    snprintf(out, out_size, "%s/libtensr-cuda.so", dir);
    FILE *g = ok && found ? fopen(out, "wb") : NULL;
    ok = g && fwrite(buf, 1, (size_t)n, g) == (size_t)n;
    if (g)
        ok = fclose(g) == 0 && ok;
    free(buf);
    return ok;
}

/* Runs fn in a child with TSR_BACKEND_PATH = path; its exit status. */
static int run_case(const char *name, const char *path, void (*fn)(void)) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("TSR_BACKEND_PATH", path, 1);
        unsetenv("TSR_FAKE_DEVICES");
        tsr_log_set_level(TSR_LOG_DEBUG);
        tsr_log_set(capture, NULL);
        tsr_device_count();
        if (!fn)
            fn = tsr_device_by_name("CUDA0") ? case_gpu : case_no_gpu;
        fn();
        if (tsrtest_failures)
            fprintf(stderr, "case %s, log:\n%s", name, log_text);
        else
            printf("case %s, log:\n%s", name, log_text);
        exit(tsrtest_done(name));
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return 1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(void) {
    const char *top = getenv("top_builddir"), *other = getenv("TSR_TEST_CUDA_MODULE");
    char path[4096];
    if (other) { /* another build of the module (the emulated one): its cases only, it has no CUDA runtime */
        const int rc = run_case("the module", other, NULL);
        printf("test-cuda-module: %s (%s)\n", rc ? "FAILED" : "all cases passed", other);
        return rc ? 1 : 0;
    }
    snprintf(path, sizeof path, "%s/cuda/.libs/libtensr-cuda.so", top ? top : ".");
    if (access(path, R_OK) != 0)
        SKIP("the CUDA module is not built (%s; ./configure --enable-cuda)", path);
    int rc = run_case("the module", path, NULL);
    char dir[] = "/tmp/tsr-cuda-XXXXXX", copy[4200];
    if (!mkdtemp(dir))
        return 99;
    if (copy_without_runtime(path, dir, copy, sizeof copy))
        rc |= run_case("no CUDA runtime", copy, case_no_runtime);
    else
        rc |= 1, fprintf(stderr, "could not copy %s with its CUDA runtime renamed\n", path);
    unlink(copy);
    rmdir(dir);
    printf("test-cuda-module: %s\n", rc ? "FAILED" : "all cases passed");
    return rc ? 1 : 0;
}
