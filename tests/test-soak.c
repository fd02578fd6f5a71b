/*
 * test-soak.c - 10,045 decode calls (two tokens each) on the real model (SmolLM2-135M-Instruct
 * Q4_1 in ~/.cache/libtensr, or $TSR_TEST_MODEL; skips when it is absent,
 * fails when it is absent and CI=true): 205 rounds of session create, a
 * prompt on two sequences, 48 steps decoding both sequences in one batch
 * with sequence 0 removed and restarted half-way, then a clear and the
 * session freed. Every round must give the tokens of the first, and the
 * resident memory after the warm-up (round 10) may grow by less than 1 MiB
 * to the end. In sanitizer builds (TSR_SANITIZER) 10 rounds run and the
 * memory is not judged (the sanitizers keep freed memory on purpose).
 */
#include "libtensr.h"
#include "tsrtest.h"

#include <unistd.h>

#define STEPS 48

static long rss_kib(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return -1;
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
        resident = -1;
    fclose(f);
    return resident < 0 ? -1 : resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static int32_t argmax(const float *v, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; v && i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

/* One round; tokens of both sequences into out[2 * STEPS]; the decode calls made. */
static int round_once(tsr_model *m, int32_t *out) {
    tsr_session_params sp;
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 256;
    sp.n_seq_max = 2;
    tsr_session *s = NULL;
    int calls = 0;
    CHECK_OK(tsr_session_new(m, &sp, &s));
    if (!s)
        return 0;
    const int32_t prompt[8] = {1, 504, 3575, 282, 4649, 314, 1, 9590}, seq[8] = {0, 0, 0, 0, 0, 0, 1, 1};
    const int8_t want[8] = {0, 0, 0, 0, 0, 1, 0, 1};
    const int32_t nv = tsr_model_n_vocab(m);
    CHECK_OK(tsr_session_decode(s, 8, prompt, NULL, seq, want));
    calls++;
    int32_t t[2] = {argmax(tsr_session_logits(s, 5), nv), argmax(tsr_session_logits(s, 7), nv)};
    for (int i = 0; i < STEPS; i++) {
        out[2 * i] = t[0];
        out[2 * i + 1] = t[1];
        if (i == STEPS / 2) { /* sequence 0 starts again from its prompt's first token */
            CHECK_OK(tsr_session_remove(s, 0, 0, -1));
            t[0] = prompt[0];
        }
        const int32_t sq[2] = {0, 1};
        const int8_t w[2] = {1, 1};
        CHECK_OK(tsr_session_decode(s, 2, t, NULL, sq, w));
        calls++;
        t[0] = argmax(tsr_session_logits(s, 0), nv);
        t[1] = argmax(tsr_session_logits(s, 1), nv);
    }
    CHECK_OK(tsr_session_remove(s, -1, 0, -1));
    CHECK(tsr_session_n_past(s, 0) == 0 && tsr_session_n_past(s, 1) == 0);
    tsr_session_free(s);
    return calls;
}

int main(void) {
    const int sanitizer = getenv("TSR_SANITIZER") && *getenv("TSR_SANITIZER");
    char path[1024];
    if (!tsrtest_model(path, sizeof path))
        return tsrtest_done("test-soak");
    tsr_backend *be = NULL;
    tsr_model *m = NULL;
    CHECK_OK(tsr_backend_new(NULL, &be));
    CHECK_OK(tsr_model_load(be, path, NULL, &m));
    if (!m) {
        tsr_backend_free(be);
        return tsrtest_done("test-soak");
    }
    const int rounds = sanitizer ? 10 : 205, warm = sanitizer ? 1 : 10;
    int32_t first[2 * STEPS], now[2 * STEPS];
    long rss_warm = -1, calls = 0;
    int differ = 0;
    for (int r = 0; r < rounds; r++) {
        calls += round_once(m, r == 0 ? first : now);
        if (r > 0 && memcmp(first, now, sizeof first) != 0)
            differ++;
        if (r + 1 == warm)
            rss_warm = rss_kib();
    }
    const long rss_end = rss_kib();
    CHECK(differ == 0, "%d of %d rounds gave other tokens than the first", differ, rounds);
    printf("test-soak: %d rounds, %ld decode calls (%ld tokens), resident %ld KiB after round %d, %ld KiB at the end\n",
           rounds, calls, calls * 2, rss_warm, warm, rss_end);
    if (!sanitizer)
        CHECK(rss_warm > 0 && rss_end - rss_warm < 1024, "resident memory grew by %ld KiB after the warm-up",
              rss_end - rss_warm);
    tsr_model_free(m);
    tsr_backend_free(be);
    return tsrtest_done("test-soak");
}
