/*
 * profile.c - the per-token profile (TSR_PROFILE=1 in the environment):
 * process-wide counters of where decode time goes - building the graph
 * (model layer), planning it (scheduler: placement, allocation, splits),
 * running it on the devices, and on the CPU the time every thread spends in
 * each op's kernels and waiting at barriers. Counters are relaxed atomic
 * adds; with the variable unset nothing is timed. The totals, per call and
 * per token, are printed to stderr at exit (tsr__prof_print).
 */
#include "internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static atomic_int_fast64_t prof_ns[TSR_PROF_OP0 + TSR_OP_COUNT];
static atomic_int_fast64_t prof_calls[TSR_PROF_OP0 + TSR_OP_COUNT];
static atomic_int_fast64_t prof_tokens, prof_ubatches;
static atomic_int prof_state; /* 0 unknown, 1 off, 2 on */

static void prof_atexit(void) { tsr__prof_print(stderr); }

bool tsr__prof_on(void) {
    int s = atomic_load_explicit(&prof_state, memory_order_relaxed);
    if (s == 0) {
        const char *e = getenv("TSR_PROFILE");
        int want = e && *e && strcmp(e, "0") ? 2 : 1, expect = 0;
        if (atomic_compare_exchange_strong(&prof_state, &expect, want) && want == 2)
            atexit(prof_atexit);
        s = atomic_load(&prof_state);
    }
    return s == 2;
}

int64_t tsr__prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void tsr__prof_add(int slot, int64_t ns) {
    if (slot < 0 || slot >= TSR_PROF_OP0 + TSR_OP_COUNT)
        return;
    atomic_fetch_add_explicit(&prof_ns[slot], ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&prof_calls[slot], 1, memory_order_relaxed);
}

void tsr__prof_tokens(int64_t n) {
    atomic_fetch_add_explicit(&prof_tokens, n, memory_order_relaxed);
    atomic_fetch_add_explicit(&prof_ubatches, 1, memory_order_relaxed);
}

void tsr__prof_print(FILE *f) {
    if (!tsr__prof_on() || !f)
        return;
    const int64_t tok = atomic_load(&prof_tokens), ub = atomic_load(&prof_ubatches);
    const double per = tok > 0 ? 1e-3 / (double)tok : 0; /* ns -> us per token */
    static const char *const names[TSR_PROF_OP0] = {"graph build", "planning", "device run", "barrier wait"};
    fprintf(f, "libtensr profile (TSR_PROFILE): %lld tokens in %lld micro-batches\n", (long long)tok, (long long)ub);
    fprintf(f, "| part | total ms | us/token | calls |\n| --- | ---: | ---: | ---: |\n");
    for (int i = 0; i < TSR_PROF_OP0 + TSR_OP_COUNT; i++) {
        int64_t ns = atomic_load(&prof_ns[i]), n = atomic_load(&prof_calls[i]);
        if (i == TSR_PROF_PLAN) /* the scheduler's time holds the devices' */
            ns -= atomic_load(&prof_ns[TSR_PROF_RUN]);
        if (!n)
            continue;
        if (i < TSR_PROF_OP0)
            fprintf(f, "| %s%s |", names[i], i == TSR_PROF_BARRIER ? " (all threads)" : "");
        else
            fprintf(f, "| kernel %s (all threads) |", tsr__op_name((tsr_op)(i - TSR_PROF_OP0)));
        fprintf(f, " %.2f | %.2f | %lld |\n", 1e-6 * (double)ns, per * (double)ns, (long long)n);
    }
}
