/*
 * tsrtest.h - the one harness of the C tests. Every check counts; a failed
 * one says where (file:line), what (the condition as written), why (the
 * optional printf-style message) and the library's tsr_last_error().
 *
 *   CHECK(cond);                     CHECK(cond, "got %d", v);
 *   CHECK_OK(expr);                  expr returns TSR_OK
 *   CHECK_STATUS(expr, want);        expr returns the tsr_status want
 *   CHECK_EQ_INT(a, b);              a == b as integers; prints both
 *   CHECK_NEAR(a, b, tol);           |a - b| <= tol as doubles; prints both
 *                                    (a NaN never passes)
 *   SKIP("no %s here", what);        prints the reason, exits 77 (automake's
 *                                    skip); exits 1 if a check already failed
 *   return tsrtest_done("test-x");   prints the totals; 0 or 1
 *
 * A message's arguments are evaluated only when the check fails. The
 * counters tsrtest_checks and tsrtest_failures may be read by a test (to
 * stop early, say). Also: a seeded random generator and a normalized mean
 * squared error against a double reference.
 *
 * Tests that reach the library's internals include "internal.h" (this
 * directory's) as well.
 */
#ifndef TSRTEST_H
#define TSRTEST_H

#include "libtensr.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__GNUC__)
#define TSRTEST_PRINTF_(f, a) __attribute__((format(printf, f, a)))
#else
#define TSRTEST_PRINTF_(f, a)
#endif

static int tsrtest_failures;
static int tsrtest_checks;

/* The condition of CHECK's stringized argument list "cond, fmt, args":
 * up to the first comma outside parentheses and literals, as the
 * preprocessor split it. */
static inline int tsrtest_cond_len_(const char *s) {
    const char *p = s;
    int depth = 0;
    char quote = 0;
    for (; *p; p++) {
        if (quote) {
            if (*p == '\\' && p[1]) p++;
            else if (*p == quote) quote = 0;
        } else if (*p == '"' || *p == '\'') {
            quote = *p;
        } else if (*p == '(') {
            depth++;
        } else if (*p == ')') {
            depth--;
        } else if (*p == ',' && depth == 0) {
            break;
        }
    }
    return (int)(p - s);
}

/* file:line: WHAT failed: TEXT[: message] (last error: ...) */
static inline void tsrtest_report_(const char *file, int line, const char *what, const char *text, int text_len,
                                   const char *fmt, va_list *ap) {
    const char *err = tsr_last_error();
    tsrtest_failures++;
    fprintf(stderr, "%s:%d: %s failed: %.*s", file, line, what, text_len, text);
    if (fmt && *fmt) {
        fputs(": ", stderr);
        vfprintf(stderr, fmt, *ap);
    }
    if (err && *err) fprintf(stderr, " (last error: %s)", err);
    fputc('\n', stderr);
}

TSRTEST_PRINTF_(4, 5)
static inline void tsrtest_fail_(const char *file, int line, const char *args, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tsrtest_report_(file, line, "CHECK", args, tsrtest_cond_len_(args), fmt, &ap);
    va_end(ap);
}

static inline void tsrtest_fail0_(const char *file, int line, const char *args) {
    tsrtest_report_(file, line, "CHECK", args, tsrtest_cond_len_(args), NULL, NULL);
}

/* CHECK(cond) or CHECK(cond, fmt, ...): TSRTEST_PICK_ counts the arguments
 * (up to 32: the condition, the format and 30 values) and picks the form.
 * #__VA_ARGS__ is the text as written, before any macro in it expands. */
#define TSRTEST_PICK_(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19,  \
                      a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, name, ...)             \
    name
#define CHECK(...)                                                                                         \
    TSRTEST_PICK_(__VA_ARGS__, TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECKF_,         \
                  TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECKF_,     \
                  TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECKF_,     \
                  TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECKF_,     \
                  TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECKF_,     \
                  TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECKF_,     \
                  TSRTEST_CHECKF_, TSRTEST_CHECKF_, TSRTEST_CHECK1_, ~)(#__VA_ARGS__, __VA_ARGS__)
#define TSRTEST_CHECK1_(text, cond)                                                                        \
    do {                                                                                                   \
        tsrtest_checks++;                                                                                  \
        if (!(cond)) tsrtest_fail0_(__FILE__, __LINE__, text);                                             \
    } while (0)
#define TSRTEST_CHECKF_(text, cond, ...)                                                                   \
    do {                                                                                                   \
        tsrtest_checks++;                                                                                  \
        if (!(cond)) tsrtest_fail_(__FILE__, __LINE__, text, __VA_ARGS__);                                 \
    } while (0)

/* CHECK_OK and CHECK_STATUS (said_want: name the expected status too). */
static inline void tsrtest_status_(const char *file, int line, const char *expr, tsr_status got, tsr_status want,
                                   int said_want) {
    tsrtest_checks++;
    if (got == want) return;
    tsrtest_failures++;
    if (said_want)
        fprintf(stderr, "%s:%d: %s returned %s, expected %s (%s)\n", file, line, expr, tsr_status_string(got),
                tsr_status_string(want), tsr_last_error());
    else
        fprintf(stderr, "%s:%d: %s returned %s: %s\n", file, line, expr, tsr_status_string(got), tsr_last_error());
}
#define CHECK_OK(expr) tsrtest_status_(__FILE__, __LINE__, #expr, (expr), TSR_OK, 0)
#define CHECK_STATUS(expr, want) tsrtest_status_(__FILE__, __LINE__, #expr, (expr), (want), 1)

TSRTEST_PRINTF_(5, 6)
static inline void tsrtest_failv_(const char *file, int line, const char *what, const char *text, const char *fmt,
                                  ...) {
    va_list ap;
    va_start(ap, fmt);
    tsrtest_report_(file, line, what, text, (int)strlen(text), fmt, &ap);
    va_end(ap);
}

static inline void tsrtest_eq_int_(const char *file, int line, const char *text, long long a, long long b) {
    tsrtest_checks++;
    if (a != b) tsrtest_failv_(file, line, "CHECK_EQ_INT", text, "%lld != %lld", a, b);
}
#define CHECK_EQ_INT(a, b) tsrtest_eq_int_(__FILE__, __LINE__, #a " == " #b, (long long)(a), (long long)(b))

static inline void tsrtest_near_(const char *file, int line, const char *text, double a, double b, double tol) {
    tsrtest_checks++;
    if (!(fabs(a - b) <= tol))
        tsrtest_failv_(file, line, "CHECK_NEAR", text, "%.10g vs %.10g: difference %.3g, tolerance %.3g", a, b,
                       fabs(a - b), tol);
}
#define CHECK_NEAR(a, b, tol)                                                                              \
    tsrtest_near_(__FILE__, __LINE__, #a " ~ " #b " within " #tol, (double)(a), (double)(b), (double)(tol))

/* SKIP(fmt, ...): the reason is printed on stdout, into the test's log. */
TSRTEST_PRINTF_(1, 2)
static inline _Noreturn void tsrtest_skip_(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("SKIP: ", stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    if (tsrtest_failures) {
        printf("not skipped: %d of %d checks failed before the skip\n", tsrtest_failures, tsrtest_checks);
        exit(1);
    }
    exit(77);
}
#define SKIP(...) tsrtest_skip_(__VA_ARGS__)

/* The totals; the test's exit status. */
static inline int tsrtest_done(const char *name) {
    printf("%s: %d checks, %d failed\n", name, tsrtest_checks, tsrtest_failures);
    return tsrtest_failures ? 1 : 0;
}

/* xorshift64*: deterministic across platforms. */
static inline uint64_t tsrtest_rand_u64(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}

/* Uniform in [-1, 1). */
static inline float tsrtest_randf(uint64_t *s) {
    return (float)((tsrtest_rand_u64(s) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

static inline void tsrtest_fill(float *x, size_t n, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (size_t i = 0; i < n; i++)
        x[i] = tsrtest_randf(&s);
}

/* Normalized mean squared error of got against a double reference. */
static inline double tsrtest_nmse(const float *got, const double *ref, size_t n) {
    double err = 0, norm = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) != isnan(ref[i]) || isinf(got[i]) != isinf(ref[i]))
            return INFINITY;
        if (isnan(ref[i]) || isinf(ref[i]))
            continue;
        double d = got[i] - ref[i];
        err += d * d;
        norm += ref[i] * ref[i];
    }
    return norm > 0 ? err / norm : err;
}


/* The real model's path into path: $TSR_TEST_MODEL, else where
 * examples/get-model.sh caches it. When it is absent: SKIP, or under CI=true
 * a failed check and 0 (CI must have it: make run fetched it). 1 when present. */
static inline int tsrtest_model(char *path, size_t size) {
    const char *env = getenv("TSR_TEST_MODEL"), *home = getenv("HOME"), *ci = getenv("CI");
    if (env && *env)
        snprintf(path, size, "%s", env);
    else
        snprintf(path, size, "%s/.cache/libtensr/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : "/root");
    if (access(path, R_OK) == 0)
        return 1;
    if (!ci || strcmp(ci, "true") != 0)
        SKIP("model %s is absent (make run fetches it)", path);
    CHECK(0, "model %s is absent (make run fetches it); CI=true requires it", path);
    return 0;
}

#endif
