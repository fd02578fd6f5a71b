/*
 * test-inject-model.c - allocation failure through a whole workload on the
 * real model (SmolLM2-135M-Instruct Q4_1 in ~/.cache/libtensr, or
 * $TSR_TEST_MODEL; skips when it is absent, fails when it is absent and
 * CI=true). The workload: a backend over the enumerated devices, the model,
 * a session (n_ctx 64, two sequences; tsr_session_new reserves the compute
 * memory), a tokenized prompt decoded on both sequences, a greedy sampler,
 * N_GEN tokens generated for both in batches of two, sequence 1 removed, one
 * more token on sequence 0, the text detokenized, everything freed.
 *
 * For N = 1, 2, ... the Nth allocation through the core's wrappers (host
 * memory and buffers alike: device buffers are tsr__aligned_alloc'ed by the
 * CPU and fake backends) fails, in two modes: "sticky", every allocation
 * after it fails too (tsr__fail_alloc_after: error and cleanup paths that
 * allocate are caught), and "once", only that one (tsr__fail_alloc_once: a
 * caller that recovers goes on, and what it does next is walked). Each
 * time: a non-OK status with tsr_last_error() set, or OK with the very
 * tokens of the reference run (a caller that recovered: in "once" mode the
 * chat template's last allocations, since a model whose template could not
 * be read still loads and tsr_model_chat_format reports why); the live
 * allocations (tsr__alloc_live) back at their baseline once everything is
 * freed; and, after every RERUN_EVERY failures and at the end, the workload
 * again without failure, giving the reference tokens.
 *
 * Three walks:
 *  - enumeration: it happens once per process (pthread_once), so each N
 *    runs in a child process that enumerates with the failure armed, then
 *    makes and frees a backend. Enumeration allocates only to list a
 *    module folder, so the children list a folder of three would-be
 *    modules (empty files: dlopen refuses them, the registry goes on);
 *    an enumeration that runs out of memory skips the folder with a
 *    warning, and the backend is made from the devices it did find;
 *  - the whole workload, on its own backend and model each time (every N
 *    up to the last allocation of the run);
 *  - the workload after the load, on one model loaded outside the walk and
 *    warmed by a first run (so what the backend keeps between sessions is
 *    already there): a failure must leave that model usable, the next run
 *    on it gives the reference tokens.
 * A walk longer than WALK_ALL steps walks every N up to WALK_ALL, then a
 * stride that keeps it near WALK_ALL more; it prints what it covered.
 * TSR_INJECT_ONLY=N walks that N alone (to follow one failure in a debugger);
 * TSR_INJECT_STRIDE=S every Sth N (a sample, for a run under valgrind).
 */
#include "internal.h" /* tsr__fail_alloc_after, tsr__alloc_count, tsr__alloc_live: static link */
#include "tsrtest.h"

#include <errno.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define N_GEN 4
#define RERUN_EVERY 64
#define WALK_ALL 3000

static const char *prompt = "The capital of France is Paris, and";

typedef struct {
    tsr_backend *be;
    tsr_model *m;
    tsr_session *s;
    tsr_sampler *smp;
    int own_model; /* be and m are this run's (else borrowed) */
} handles;

typedef struct {
    int32_t tokens[2][N_GEN + 1];
    char text[256];
} result;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void quiet(tsr_log_level level, const char *msg, const tsr_log_field *f, size_t n, void *user) {
    (void)level, (void)msg, (void)f, (void)n, (void)user;
}

static tsr_status open_model(const char *path, handles *h) {
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = 2;
    tsr_status st = tsr_backend_new(&bp, &h->be);
    if (st == TSR_OK)
        st = tsr_model_load(h->be, path, NULL, &h->m);
    return st;
}

/* Decodes the prompt on both sequences, then N_GEN greedy tokens each in
 * batches of two, removes sequence 1 and decodes one more on sequence 0. */
static tsr_status generate(handles *h, result *r) {
    int32_t ids[32], toks[64], seq[64];
    int8_t want[64] = {0};
    size_t n = 0, len = 0;
    tsr_status st = tsr_model_tokenize(h->m, prompt, strlen(prompt), TSR_TOKENIZE_ADD_SPECIAL, ids, 32, &n);
    if (st != TSR_OK)
        return st;
    for (size_t i = 0; i < 2 * n; i++) {
        toks[i] = ids[i % n];
        seq[i] = (int32_t)(i / n);
        want[i] = i % n == n - 1;
    }
    if ((st = tsr_session_decode(h->s, 2 * n, toks, NULL, seq, want)) != TSR_OK)
        return st;
    const float *last[2] = {tsr_session_logits(h->s, n - 1), tsr_session_logits(h->s, 2 * n - 1)};
    int32_t pair[2], seqs[2] = {0, 1};
    for (int i = 0; i < N_GEN && st == TSR_OK; i++) {
        for (int q = 0; q < 2; q++) r->tokens[q][i] = pair[q] = tsr_sampler_sample(h->smp, last[q]);
        int8_t both[2] = {1, 1};
        st = tsr_session_decode(h->s, 2, pair, NULL, seqs, both);
        last[0] = tsr_session_logits(h->s, 0);
        last[1] = tsr_session_logits(h->s, 1);
    }
    if (st == TSR_OK)
        st = tsr_session_remove(h->s, 1, 0, -1);
    if (st == TSR_OK) {
        r->tokens[0][N_GEN] = tsr_sampler_sample(h->smp, last[0]);
        r->tokens[1][N_GEN] = tsr_session_n_past(h->s, 1); /* 0: removed */
        st = tsr_session_decode(h->s, 1, &r->tokens[0][N_GEN], NULL, NULL, NULL);
    }
    if (st == TSR_OK)
        st = tsr_model_detokenize(h->m, r->tokens[0], N_GEN + 1, 0, r->text, sizeof r->text, &len);
    return st;
}

/* The workload on model (or on its own backend and model when NULL). */
static tsr_status workload(const char *path, tsr_model *model, result *r) {
    handles h = {NULL, model, NULL, NULL, model == NULL};
    memset(r, 0, sizeof *r);
    tsr_status st = model ? TSR_OK : open_model(path, &h);
    tsr_session_params sp;
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 64;
    sp.n_seq_max = 2;
    if (st == TSR_OK)
        st = tsr_session_new(h.m, &sp, &h.s);
    tsr_sampler_params smp;
    tsr_sampler_params_init(&smp, sizeof smp);
    smp.temp = 0.0f;
    if (st == TSR_OK)
        st = tsr_sampler_new(h.m, &smp, &h.smp);
    if (st == TSR_OK)
        st = generate(&h, r);
    tsr_sampler_free(h.smp);
    tsr_session_free(h.s);
    if (h.own_model) {
        tsr_model_free(h.m);
        tsr_backend_free(h.be);
    }
    return st;
}

typedef struct {
    const char *what;
    int once;
    int64_t n_run, n_failed, n_recovered, n_reruns, first, last, stride;
} walk_stats;

/* One step: the nth allocation (1-based) and all after it fail. Returns 0
 * when the workload no longer reaches the nth allocation. */
static int step(const char *path, tsr_model *model, int64_t nth, const result *ref, int64_t live0, walk_stats *w) {
    result r;
    tsr_clear_error();
    uint64_t a0 = tsr__alloc_count();
    if (w->once)
        tsr__fail_alloc_once(nth - 1);
    else
        tsr__fail_alloc_after(nth - 1);
    tsr_status st = workload(path, model, &r);
    tsr__fail_alloc_after(-1);
    int reached = tsr__alloc_count() - a0 >= (uint64_t)nth;
    w->n_run++;
    if (st != TSR_OK) {
        w->n_failed++;
        CHECK(tsr_last_error()[0] != '\0', "%s, allocation %lld: %s without a detail", w->what, (long long)nth,
              tsr_status_string(st));
        CHECK(st == TSR_E_NOMEM || st == TSR_E_DEVICE_NOMEM, "%s, allocation %lld: %s (%s), not out of memory",
              w->what, (long long)nth, tsr_status_string(st), tsr_last_error());
    } else if (reached) {
        w->n_recovered++;
        printf("%s, %s: allocation %lld failed, and the caller recovered\n", w->what, w->once ? "once" : "sticky",
               (long long)nth);
        CHECK(memcmp(r.tokens, ref->tokens, sizeof r.tokens) == 0 && strcmp(r.text, ref->text) == 0,
              "%s, allocation %lld: OK, but generated '%s', not '%s'", w->what, (long long)nth, r.text, ref->text);
    }
    CHECK(tsr__alloc_live() == live0, "%s, allocation %lld (%s): %lld allocations live after freeing, %lld before",
          w->what, (long long)nth, tsr_status_string(st), (long long)tsr__alloc_live(), (long long)live0);
    if (st != TSR_OK && w->n_failed % RERUN_EVERY == 0) {
        w->n_reruns++;
        CHECK_OK(workload(path, model, &r));
        CHECK(strcmp(r.text, ref->text) == 0, "%s, after allocation %lld failed: '%s', not '%s'", w->what,
              (long long)nth, r.text, ref->text);
    }
    return reached;
}

/* Walks nth from 1 over the allocations [first_site, first_site + n_sites). */
static void walk(const char *path, tsr_model *model, const char *what, int once, int64_t n_sites,
                 const result *ref) {
    walk_stats w = {what, once, 0, 0, 0, 0, 1, 0, 1};
    int64_t live0 = tsr__alloc_live();
    double t0 = now();
    if (n_sites > WALK_ALL)
        w.stride = (n_sites - WALK_ALL) / WALK_ALL + 1;
    const char *only = getenv("TSR_INJECT_ONLY"), *sample = getenv("TSR_INJECT_STRIDE");
    int64_t all = WALK_ALL;
    if (sample && atoll(sample) > 1)
        w.stride = atoll(sample), all = 0;
    for (int64_t nth = 1; nth <= n_sites && tsrtest_failures < 20; nth += nth < all ? 1 : w.stride) {
        if (only && *only && nth != atoll(only))
            continue;
        if (!step(path, model, nth, ref, live0, &w))
            break;
        w.last = nth;
    }
    result r;
    w.n_reruns++;
    CHECK_OK(workload(path, model, &r));
    CHECK(strcmp(r.text, ref->text) == 0, "%s: after the walk '%s', not '%s'", what, r.text, ref->text);
    CHECK(tsr__alloc_live() == live0);
    printf("%s, %s: %lld sites; failed allocations 1..%lld%s%lld walked (stride %lld after %d): %lld errors, %lld "
           "recovered, %lld reruns, %.1f s\n",
           what, once ? "once" : "sticky", (long long)n_sites, (long long)w.last, w.stride > 1 ? ", " : " = ", (long long)w.n_run,
           (long long)w.stride, (int)all, (long long)w.n_failed, (long long)w.n_recovered, (long long)w.n_reruns,
           now() - t0);
    fflush(stdout);
}

/* Child for the enumeration walk: 0 when the failure was reached and handled,
 * 1 when a check failed, 2 when enumeration makes fewer than nth allocations. */
static int enumerate_child(int64_t nth, int once) {
    int64_t live0 = tsr__alloc_live();
    uint64_t a0 = tsr__alloc_count();
    if (once)
        tsr__fail_alloc_once(nth - 1);
    else
        tsr__fail_alloc_after(nth - 1);
    size_t n_dev = tsr_device_count();
    tsr__fail_alloc_after(-1);
    if (tsr__alloc_count() - a0 < (uint64_t)nth)
        return 2;
    int64_t live1 = tsr__alloc_live();
    tsr_backend *be = NULL;
    tsr_status st = tsr_backend_new(NULL, &be);
    CHECK(st == TSR_OK || tsr_last_error()[0], "enumeration, allocation %lld: %s without a detail", (long long)nth,
          tsr_status_string(st));
    CHECK(st != TSR_OK || tsr_backend_n_devices(be) > 0, "enumeration, allocation %lld: a backend without devices",
          (long long)nth);
    tsr_backend_free(be);
    CHECK(tsr__alloc_live() == live1, "enumeration, allocation %lld: %lld live after the backend, %lld before",
          (long long)nth, (long long)tsr__alloc_live(), (long long)live1);
    (void)live0, (void)n_dev;
    return tsrtest_failures ? 1 : 0;
}

/* Each N in a child until enumeration no longer reaches it; returns the sites. */
static int64_t walk_enumeration_mode(int once) {
    int64_t nth = 1;
    for (; nth < 10000; nth++) {
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0) {
            CHECK(0, "fork: %s", strerror(errno));
            break;
        }
        if (pid == 0)
            _exit(enumerate_child(nth, once));
        int ws = 0;
        waitpid(pid, &ws, 0);
        if (WIFEXITED(ws) && WEXITSTATUS(ws) == 2)
            break;
        CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "enumeration, %s, allocation %lld: child %s %d",
              once ? "once" : "sticky", (long long)nth, WIFEXITED(ws) ? "exited" : "killed by signal",
              WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
    }
    return nth - 1;
}

static void walk_enumeration(void) {
    char dir[] = "/tmp/tsr-inject-XXXXXX", file[64];
    const char *names[] = {"libtensr-a.so", "libtensr-b.so", "libtensr-c.so"};
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp: %s", strerror(errno));
        return;
    }
    for (int i = 0; i < 3; i++) {
        snprintf(file, sizeof file, "%s/%s", dir, names[i]);
        FILE *f = fopen(file, "w");
        CHECK(f != NULL, "%s: %s", file, strerror(errno));
        if (f)
            fclose(f);
    }
    setenv("TSR_BACKEND_PATH", dir, 1); /* for the children only: the parent enumerates after unsetenv */
    double t0 = now();
    int64_t sticky = walk_enumeration_mode(0), once = walk_enumeration_mode(1);
    printf("enumeration: %lld sites sticky, %lld once, each failed in a child process, %.1f s\n", (long long)sticky,
           (long long)once, now() - t0);
    unsetenv("TSR_BACKEND_PATH");
    for (int i = 0; i < 3; i++) {
        snprintf(file, sizeof file, "%s/%s", dir, names[i]);
        unlink(file);
    }
    rmdir(dir);
}

int main(void) {
    char path[1024];
    if (!tsrtest_model(path, sizeof path))
        return tsrtest_done("test-inject-model");
    tsr_log_set(quiet, NULL); /* thousands of failures would each log */
    walk_enumeration();

    /* the reference runs, counting the allocations: the whole workload on
     * its own backend, then the session part on a model loaded here (its
     * first run also makes what the backend keeps: a stream's work buffer,
     * the scheduler's staging; the second shows what a session alone makes) */
    result ref, again;
    int64_t live0 = tsr__alloc_live();
    uint64_t a0 = tsr__alloc_count();
    CHECK_OK(workload(path, NULL, &ref));
    uint64_t k_all = tsr__alloc_count() - a0;
    CHECK(tsr__alloc_live() == live0, "the reference run leaves %lld allocations live",
          (long long)(tsr__alloc_live() - live0));
    handles h = {NULL, NULL, NULL, NULL, 1};
    a0 = tsr__alloc_count();
    CHECK_OK(open_model(path, &h));
    uint64_t k_load = tsr__alloc_count() - a0;
    a0 = tsr__alloc_count();
    CHECK_OK(workload(path, h.m, &again));
    uint64_t k_first = tsr__alloc_count() - a0;
    a0 = tsr__alloc_count();
    CHECK_OK(workload(path, h.m, &again));
    uint64_t k_session = tsr__alloc_count() - a0;
    CHECK(strcmp(again.text, ref.text) == 0, "on a loaded model: '%s', on its own: '%s'", again.text, ref.text);
    printf("reference: generated '%s'; %llu allocations in all: %llu to load, %llu in the first session, %llu in "
           "the next\n",
           ref.text, (unsigned long long)k_all, (unsigned long long)k_load, (unsigned long long)k_first,
           (unsigned long long)k_session);
    fflush(stdout);

    for (int once = 0; once < 2; once++) {
        walk(path, NULL, "whole workload", once, (int64_t)k_all, &ref);
        walk(path, h.m, "session on a loaded model", once, (int64_t)k_session, &ref);
    }
    tsr_model_free(h.m);
    tsr_backend_free(h.be);
    CHECK(tsr__alloc_live() == live0, "%lld allocations live at the end, %lld after enumeration",
          (long long)tsr__alloc_live(), (long long)live0);
    return tsrtest_done("test-inject-model");
}
