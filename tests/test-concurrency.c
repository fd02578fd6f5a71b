/*
 * test-concurrency.c - the thread model of libtensr.h on the real model
 * (SmolLM2-135M-Instruct Q4_1 in ~/.cache/libtensr, or $TSR_TEST_MODEL; skips
 * when it is absent, fails when it is absent and CI=true), through the
 * public API only:
 *  - two backends, each with its own model and session, generating in two
 *    threads at once give exactly the greedy tokens each gives alone;
 *  - one backend (one model, a session per thread) used from two threads in
 *    turn, serialized by a mutex as the thread model asks (one thread at a
 *    time per backend), gives the same tokens again;
 *  - each thread's last error is its own (tsr_last_error is thread-local).
 * CI runs it under ThreadSanitizer too (.ci/run): a data race in the
 * library fails it there. The checks run on the main thread only (the
 * harness counters are not atomic); the threads record what they saw.
 */
#include "tsrtest.h"

#include <pthread.h>
#include <unistd.h>

#define N_GEN 16
#define N_THREADS 2 /* CPU threads per backend */

typedef struct job {
    const char *path;
    const int32_t *prompt;
    size_t n_prompt;
    int32_t out[N_GEN];
    tsr_status status;   /* the first failure, TSR_OK when none */
    char error[256];     /* its tsr_last_error() */
    int32_t bad;         /* a token outside the vocabulary, one per thread */
    char bad_error[256]; /* tsr_last_error() after decoding it (TSR_E_INVALID) */
} job;

static int argmax(const float *v, int32_t n) {
    int best = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

static int fail(job *j, tsr_status s) {
    if (s != TSR_OK && j->status == TSR_OK) {
        j->status = s;
        snprintf(j->error, sizeof j->error, "%s", tsr_last_error());
    }
    return s != TSR_OK;
}

/* Greedy N_GEN tokens of j->prompt on a backend, model and session of its own. */
static void *generate(void *arg) {
    job *j = arg;
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = N_THREADS;
    tsr_backend *be = NULL;
    tsr_model *m = NULL;
    tsr_session *s = NULL;
    tsr_session_params sp;
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 128;
    if (fail(j, tsr_backend_new(&bp, &be)) || fail(j, tsr_model_load(be, j->path, NULL, &m)) ||
        fail(j, tsr_session_new(m, &sp, &s)) ||
        fail(j, tsr_session_decode(s, j->n_prompt, j->prompt, NULL, NULL, NULL)))
        goto done;
    int32_t tok = argmax(tsr_session_logits(s, j->n_prompt - 1), tsr_model_n_vocab(m));
    for (int i = 0; i < N_GEN; i++) {
        j->out[i] = tok;
        if (fail(j, tsr_session_decode(s, 1, &tok, NULL, NULL, NULL)))
            goto done;
        tok = argmax(tsr_session_logits(s, 0), tsr_model_n_vocab(m));
    }
    /* a deliberate error: its detail must name this thread's token */
    if (j->bad && tsr_session_decode(s, 1, &j->bad, NULL, NULL, NULL) == TSR_E_INVALID)
        snprintf(j->bad_error, sizeof j->bad_error, "%s", tsr_last_error());
done:
    tsr_session_free(s);
    tsr_model_free(m);
    tsr_backend_free(be);
    return NULL;
}

/* ---- one backend, two threads in turn -------------------------------------- */

typedef struct shared {
    pthread_mutex_t lock; /* the caller's lock: one thread at a time in the backend */
    pthread_cond_t turn_changed;
    int turn; /* whose step it is (strict alternation, so the threads interleave) */
    tsr_model *model;
} shared;

typedef struct turn_job {
    shared *sh;
    int me;
    job j;
} turn_job;

static void *take_turns(void *arg) {
    turn_job *t = arg;
    shared *sh = t->sh;
    job *j = &t->j;
    tsr_session *s = NULL;
    tsr_session_params sp;
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 128;
    int32_t tok = -1;
    int stop = 0;
    for (int step = -2; step < N_GEN; step++) { /* -2: a session, -1: the prompt */
        pthread_mutex_lock(&sh->lock);
        while (sh->turn != t->me) pthread_cond_wait(&sh->turn_changed, &sh->lock);
        if (!stop) {
            if (step == -2) {
                stop = fail(j, tsr_session_new(sh->model, &sp, &s));
            } else if (step == -1) {
                stop = fail(j, tsr_session_decode(s, j->n_prompt, j->prompt, NULL, NULL, NULL));
                if (!stop)
                    tok = argmax(tsr_session_logits(s, j->n_prompt - 1), tsr_model_n_vocab(sh->model));
            } else {
                j->out[step] = tok;
                stop = fail(j, tsr_session_decode(s, 1, &tok, NULL, NULL, NULL));
                if (!stop)
                    tok = argmax(tsr_session_logits(s, 0), tsr_model_n_vocab(sh->model));
            }
        }
        sh->turn = 1 - t->me;
        pthread_cond_broadcast(&sh->turn_changed);
        pthread_mutex_unlock(&sh->lock);
    }
    pthread_mutex_lock(&sh->lock);
    tsr_session_free(s);
    pthread_mutex_unlock(&sh->lock);
    return NULL;
}

static void check_job(const job *j, const char *what) {
    CHECK(j->status == TSR_OK, "%s: %s (%s)", what, tsr_status_string(j->status), j->error);
}

static void print_tokens(const char *what, const int32_t *t) {
    printf("%-28s", what);
    for (int i = 0; i < N_GEN; i++) printf(" %d", t[i]);
    printf("\n");
}

int main(void) {
    char path[1024];
    if (!tsrtest_model(path, sizeof path))
        return tsrtest_done("test-concurrency");
    static const int32_t pa[] = {1, 504, 3575, 282, 4649, 314}, pb[] = {1, 9590, 2056, 253, 655, 28};
    const int32_t *prompts[2] = {pa, pb};
    const size_t n_prompts[2] = {sizeof pa / sizeof *pa, sizeof pb / sizeof *pb};

    /* Two backends in two threads at once, first: the process's first
     * backends, so the one-time set-ups (device registry, kernel selection,
     * log level) race too. */
    static job both[2], alone[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        both[i] = (job){.path = path, .prompt = prompts[i], .n_prompt = n_prompts[i], .bad = -1000 - i};
        CHECK(pthread_create(&th[i], NULL, generate, &both[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    /* then each alone, one after the other */
    for (int i = 0; i < 2; i++) {
        alone[i] = (job){.path = path, .prompt = prompts[i], .n_prompt = n_prompts[i]};
        generate(&alone[i]);
        check_job(&alone[i], "alone");
        print_tokens(i ? "alone, prompt b:" : "alone, prompt a:", alone[i].out);
    }
    CHECK(memcmp(alone[0].out, alone[1].out, sizeof alone[0].out) != 0, "the two prompts generate the same tokens");
    for (int i = 0; i < 2; i++) {
        check_job(&both[i], "two backends at once");
        print_tokens(i ? "at once, prompt b:" : "at once, prompt a:", both[i].out);
        CHECK(memcmp(both[i].out, alone[i].out, sizeof alone[i].out) == 0,
              "prompt %c: two backends at once generate differently from one alone", 'a' + i);
        /* the detail of the other thread's deliberate error never shows here */
        char want[32];
        snprintf(want, sizeof want, "id %d ", both[i].bad);
        CHECK(strstr(both[i].bad_error, want) != NULL, "thread %d: its last error is \"%s\", not about %d", i,
              both[i].bad_error, both[i].bad);
    }
    if (tsrtest_failures)
        return tsrtest_done("test-concurrency");

    /* one backend from two threads in turn, under the caller's mutex */
    shared sh = {.turn = 0};
    pthread_mutex_init(&sh.lock, NULL);
    pthread_cond_init(&sh.turn_changed, NULL);
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = N_THREADS;
    tsr_backend *be = NULL;
    CHECK_OK(tsr_backend_new(&bp, &be));
    CHECK_OK(tsr_model_load(be, path, NULL, &sh.model));
    if (sh.model) {
        static turn_job tj[2];
        for (int i = 0; i < 2; i++) {
            tj[i] = (turn_job){.sh = &sh, .me = i, .j = {.path = path, .prompt = prompts[i], .n_prompt = n_prompts[i]}};
            CHECK(pthread_create(&th[i], NULL, take_turns, &tj[i]) == 0, "pthread_create");
        }
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < 2; i++) {
            check_job(&tj[i].j, "one backend in turn");
            print_tokens(i ? "in turn, prompt b:" : "in turn, prompt a:", tj[i].j.out);
            CHECK(memcmp(tj[i].j.out, alone[i].out, sizeof alone[i].out) == 0,
                  "prompt %c: one backend from two threads in turn generates differently", 'a' + i);
        }
    }
    tsr_model_free(sh.model);
    tsr_backend_free(be);
    pthread_cond_destroy(&sh.turn_changed);
    pthread_mutex_destroy(&sh.lock);
    return tsrtest_done("test-concurrency");
}
