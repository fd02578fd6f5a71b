/*
 * tsrtest.h - the tiny test helpers shared by the C tests: CHECK macros that
 * count failures and say where, a seeded random generator, and a double
 * precision comparison by normalized mean squared error.
 */
#ifndef TSRTEST_H
#define TSRTEST_H

#include "libtensr.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tsrtest_failures;
static int tsrtest_checks;

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        tsrtest_checks++;                                                                \
        if (!(cond)) {                                                                   \
            tsrtest_failures++;                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
                    tsr_last_error());                                                   \
        }                                                                                \
    } while (0)

#define CHECK_OK(expr)                                                                   \
    do {                                                                                 \
        tsr_status st_ = (expr);                                                         \
        tsrtest_checks++;                                                                \
        if (st_ != TSR_OK) {                                                             \
            tsrtest_failures++;                                                          \
            fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #expr,     \
                    tsr_status_string(st_), tsr_last_error());                           \
        }                                                                                \
    } while (0)

#define CHECK_STATUS(expr, want)                                                         \
    do {                                                                                 \
        tsr_status st_ = (expr);                                                         \
        tsrtest_checks++;                                                                \
        if (st_ != (want)) {                                                             \
            tsrtest_failures++;                                                          \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (%s)\n", __FILE__, __LINE__, #expr, \
                    tsr_status_string(st_), tsr_status_string(want), tsr_last_error());  \
        }                                                                                \
    } while (0)

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

#endif
