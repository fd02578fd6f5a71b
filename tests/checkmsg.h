/*
 * checkmsg.h - the check macro of the model example's tests (tokenizer,
 * sampler, chat): CHECK(cond, fmt, ...) counts checks and failures and says
 * where and why a check failed. These tests use only the example's code, not
 * the library's internals, so they keep their own counters.
 */
#ifndef CHECKMSG_H
#define CHECKMSG_H

#include <stdio.h>

static int n_fail, n_checks;

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        n_checks++;                                                                            \
        if (!(cond)) {                                                                         \
            n_fail++;                                                                          \
            fprintf(stderr, "%s:%d: FAIL %s: ", __FILE__, __LINE__, #cond);                    \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fputc('\n', stderr);                                                               \
        }                                                                                      \
    } while (0)


/* Prints the totals; the exit status of the test. */
static inline int checks_done(void) {
    printf("%d checks, %d failed\n", n_checks, n_fail);
    return n_fail ? 1 : 0;
}

#endif
