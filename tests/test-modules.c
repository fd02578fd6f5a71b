/*
 * test-modules.c - run-time backend modules, without CUDA: the fake test
 * backend built as a module (tests/libtensr-fake.so) is loaded through
 * TSR_BACKEND_PATH and computes on its device; its twin that claims a wrong
 * ABI version (tests/libtensr-fakebadabi.so) is refused with a log line; a
 * missing path and a file that is no module are logged and skipped; the
 * library works in every case. The registry enumerates once per process,
 * so each case runs in a child process with its own environment.
 */
#include "tsrtest.h"

#include <stdarg.h>
#include <sys/wait.h>
#include <unistd.h>

static char log_text[16384];

/* Keeps every record as "level msg k=v k=v\n". */
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

/* x + y on device dev (weights placed there with tsr_new_tensor), read back. */
static int add_on(const char *dev_name) {
    tsr_device *dev = tsr_device_by_name(dev_name);
    if (!dev)
        return 0;
    tsr_device *devs[2] = {dev, NULL};
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.devices = devs;
    bp.n_threads = 2;
    tsr_backend *b = NULL;
    if (tsr_backend_new(&bp, &b) != TSR_OK)
        return 0;
    tsr_context *ctx = tsr_context_new(b);
    int64_t ne[1] = {5};
    float x[5] = {1, 2, 3, 4, 5}, y[5] = {10, 20, 30, 40, 50}, z[5] = {0};
    tsr_tensor *w = tsr_new_tensor(ctx, tsr_device_buffer_type(dev), TSR_TYPE_F32, 1, ne);
    int ok = w && tsr_tensor_write(w, y, 0, sizeof y) == TSR_OK;
    tsr_tensor *out = ok ? tsr_add(ctx, tsr_input(ctx, TSR_TYPE_F32, 1, ne, x), w) : NULL;
    ok = out && tsr_compute(ctx, &out, 1) == TSR_OK && tsr_tensor_read(out, z, 0, sizeof z) == TSR_OK;
    for (int i = 0; ok && i < 5; i++)
        ok = z[i] == x[i] + y[i];
    tsr_context_close(ctx);
    tsr_backend_free(b);
    return ok;
}

static void case_dir(const char *libs) {
    CHECK(tsr_device_count() >= 2);
    CHECK(tsr_device_by_name("FAKEMOD0") != NULL);
    CHECK(strstr(tsr_backends_available(), "fake-module") != NULL);
    CHECK(log_line_with("backend module loaded", "libtensr-fake.so") != NULL);
    CHECK(log_line_with("backend module skipped", "libtensr-fakebadabi.so") != NULL);
    CHECK(log_line_with("libtensr-fakebadabi.so", "backend ABI version 2, this library has version 1") != NULL);
    /* the module's device is listed before the CPU, which stays last */
    CHECK(strcmp(tsr_device_name(tsr_device_get(tsr_device_count() - 1)), "CPU") == 0);
    CHECK(add_on("FAKEMOD0"));
    CHECK(add_on("CPU"));
    (void)libs;
}

static void case_bad_abi(void) {
    CHECK(tsr_device_by_name("FAKEMOD0") == NULL);
    CHECK(log_line_with("2 backend module skipped", "libtensr-fakebadabi.so") != NULL); /* a warning */
    CHECK(strcmp(tsr_backends_available(), "cpu") == 0);
    CHECK(add_on("CPU"));
}

static void case_missing(void) {
    CHECK(log_line_with("backend module skipped", "/nonexistent/libtensr-x.so") != NULL);
    CHECK(log_line_with("/nonexistent/libtensr-x.so", "No such file") != NULL);
    CHECK(log_line_with("backend module skipped", "not-a-module.so") != NULL);
    CHECK(tsr_device_count() == 1);
    CHECK(add_on("CPU"));
}

static void case_none(void) {
    CHECK(tsr_device_count() == 1);
    CHECK(strstr(log_text, "module") == NULL);
    CHECK(add_on("CPU"));
}

/* Runs one case in a child with TSR_BACKEND_PATH = path; its exit status. */
static int run_case(const char *name, const char *path, const char *libs, void (*fn)(void), int with_libs) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("TSR_BACKEND_PATH", path, 1);
        unsetenv("TSR_FAKE_DEVICES");
        unsetenv("TSR_FAKE_MODULE_DEVICES");
        tsr_log_set_level(TSR_LOG_DEBUG);
        tsr_log_set(capture, NULL);
        tsr_device_count(); /* enumerates: loads the modules */
        if (with_libs)
            case_dir(libs);
        else
            fn();
        if (tsrtest_failures)
            fprintf(stderr, "case %s (TSR_BACKEND_PATH=%s), log:\n%s", name, path, log_text);
        exit(tsrtest_done(name));
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return 1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(void) {
    const char *top = getenv("top_builddir");
    char libs[4096], bad[4200], missing[4400], tmp[] = "/tmp/tsr-mod-XXXXXX";
    snprintf(libs, sizeof libs, "%s/tests/.libs", top ? top : ".");
    snprintf(bad, sizeof bad, "%s/libtensr-fakebadabi.so", libs);
    if (access(bad, R_OK) != 0)
        SKIP("the test modules are not built in %s", libs);
    int fd = mkstemp(tmp);
    if (fd < 0 || write(fd, "not an ELF file\n", 16) != 16)
        return 99;
    close(fd);
    char fake_file[64];
    snprintf(fake_file, sizeof fake_file, "%s-not-a-module.so", tmp);
    if (rename(tmp, fake_file) != 0)
        return 99;
    snprintf(missing, sizeof missing, "/nonexistent/libtensr-x.so:%s", fake_file);
    int rc = 0;
    rc |= run_case("module folder", libs, libs, NULL, 1);
    rc |= run_case("wrong ABI", bad, libs, case_bad_abi, 0);
    rc |= run_case("missing and non-module", missing, libs, case_missing, 0);
    rc |= run_case("no modules", "", libs, case_none, 0);
    unlink(fake_file);
    printf("test-modules: %s\n", rc ? "FAILED" : "all cases passed");
    return rc ? 1 : 0;
}
