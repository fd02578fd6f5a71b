/*
 * test-session.c - the model layer over a long generation on the real model
 * (SmolLM2-135M-Instruct Q4_1 in ~/.cache/libtensr, or $TSR_TEST_MODEL; skips
 * when it is absent, fails when it is absent and CI=true):
 *  - after tsr_session_new, decode allocates no device or compute memory (the
 *    memory plan and the compute buffers stay as reserved), and a one-token
 *    decode allocates nothing at all once its graph is built (it is run
 *    again, step after step);
 *  - running the kept graph again (on its last plan when nothing else ran
 *    in between) gives the bits of building every graph
 *    (TSR_GRAPH_REUSE=0): two sessions on one backend taking turns, a
 *    prompt of 250 tokens whose generation crosses the 256-cell bound (a
 *    new graph), cells removed and decoded again (the masks rewritten);
 *  - greedy generation is the same for 1, 2 and 3 threads (on fewer than 3
 *    cores the backend clamps 3 to the cores: test-cpu-kernels runs the
 *    threadpool itself with more threads than cores); a sequence decoded
 *    inside mixed batches of two, teacher-forced along its own greedy tokens,
 *    picks the same token wherever its top-2 gap alone is at least 0.5 (the
 *    kernels of a 2-token batch may sum in another order than those of one
 *    token: near-ties may flip, nothing else);
 *  - bad arguments give the statuses the header promises, and change nothing.
 */
#include "internal.h" /* tsr__alloc_count: the test links the static library */
#include "tsrtest.h"

#include <unistd.h>

#define N_GEN 48

static int argmax(const float *v, int32_t n) {
    int best = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

/* Top-1 minus top-2 logit. */
static float gap(const float *v, int32_t n) {
    int best = argmax(v, n);
    float second = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (i != best && v[i] > second)
            second = v[i];
    return v[best] - second;
}

static size_t compute_bytes(const tsr_backend *b) {
    size_t total = 0, c = 0;
    for (size_t i = 0; i < tsr_backend_n_devices(b); i++)
        if (tsr_backend_memory_plan(b, i, NULL, NULL, &c) == TSR_OK)
            total += c;
    return total;
}

/* Greedy tokens of prompt on a fresh backend with n_threads; checks the allocations on the way. */
static void generate(const char *path, int n_threads, const int32_t *prompt, size_t n, int32_t *out, float *gaps,
                     int check_alloc) {
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = n_threads;
    tsr_backend *be = NULL;
    tsr_model *m = NULL;
    tsr_session *s = NULL;
    CHECK_OK(tsr_backend_new(&bp, &be));
    CHECK_OK(tsr_model_load(be, path, NULL, &m));
    tsr_session_params sp;
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 256;
    CHECK_OK(tsr_session_new(m, &sp, &s));
    if (!s) {
        tsr_model_free(m);
        tsr_backend_free(be);
        return;
    }
    const size_t reserved = compute_bytes(be);
    CHECK_OK(tsr_session_decode(s, n, prompt, NULL, NULL, NULL));
    int32_t tok = argmax(tsr_session_logits(s, n - 1), tsr_model_n_vocab(m));
    float g = gap(tsr_session_logits(s, n - 1), tsr_model_n_vocab(m));
    for (int i = 0; i < N_GEN; i++) {
        out[i] = tok;
        gaps[i] = g;
        uint64_t a0 = tsr__alloc_count(), p0 = tsr__plan_count();
        CHECK_OK(tsr_session_decode(s, 1, &tok, NULL, NULL, NULL));
        uint64_t used = tsr__alloc_count() - a0;
        if (check_alloc && i > 0) { /* step 0 builds the one-token graph, the others run it on its plan */
            CHECK(used == 0, "step %d: %llu allocations", i, (unsigned long long)used);
            CHECK(tsr__plan_count() == p0, "step %d: planned again", i);
        }
        tok = argmax(tsr_session_logits(s, 0), tsr_model_n_vocab(m));
        g = gap(tsr_session_logits(s, 0), tsr_model_n_vocab(m));
    }
    if (check_alloc)
        CHECK(compute_bytes(be) == reserved, "compute memory %zu after the generation, %zu reserved",
              compute_bytes(be), reserved);
    tsr_session_free(s);
    tsr_model_free(m);
    tsr_backend_free(be);
}

/* b decoded in batches together with a on sequence 0, teacher-forced along
 * forced[] (b's own greedy tokens alone): out[i] is its argmax at step i. */
static void generate_mixed(const char *path, const int32_t *a, size_t na, const int32_t *b, size_t nb,
                           const int32_t *forced, int32_t *out) {
    tsr_backend *be = NULL;
    tsr_model *m = NULL;
    tsr_session *s = NULL;
    CHECK_OK(tsr_backend_new(NULL, &be));
    CHECK_OK(tsr_model_load(be, path, NULL, &m));
    tsr_session_params sp;
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 256;
    sp.n_seq_max = 2;
    CHECK_OK(tsr_session_new(m, &sp, &s));
    if (!s) {
        tsr_model_free(m);
        tsr_backend_free(be);
        return;
    }
    int32_t toks[128], seq[128];
    int8_t want[128] = {0};
    for (size_t i = 0; i < na + nb; i++) {
        toks[i] = i < na ? a[i] : b[i - na];
        seq[i] = i >= na;
    }
    want[na - 1] = want[na + nb - 1] = 1;
    CHECK_OK(tsr_session_decode(s, na + nb, toks, NULL, seq, want));
    int32_t nv = tsr_model_n_vocab(m);
    int32_t ta = argmax(tsr_session_logits(s, na - 1), nv), tb = argmax(tsr_session_logits(s, na + nb - 1), nv);
    for (int i = 0; i < N_GEN; i++) {
        out[i] = tb;
        int32_t two[2] = {ta, forced[i]}, sq[2] = {0, 1};
        int8_t w[2] = {1, 1};
        CHECK_OK(tsr_session_decode(s, 2, two, NULL, sq, w));
        ta = argmax(tsr_session_logits(s, 0), nv);
        tb = argmax(tsr_session_logits(s, 1), nv);
    }
    tsr_session_free(s);
    tsr_model_free(m);
    tsr_backend_free(be);
}

/* FNV-1a of a logits row: the bits, compared between runs. */
static uint64_t row_hash(const float *v, int32_t n) {
    uint64_t h = 1469598103934665603u;
    const unsigned char *p = (const unsigned char *)v;
    for (size_t i = 0; i < (size_t)n * sizeof *v; i++) h = (h ^ p[i]) * 1099511628211u;
    return h;
}

#define N_TURNS 16
#define N_STEPS (3 * N_TURNS)
#define LONG_PROMPT 250

/* One greedy step of s: token *tok decoded, its logits hashed into h[*k]
 * and the token into h_tok[*k]; *tok becomes the argmax. */
static void step(tsr_session *s, int32_t nv, int32_t *tok, int32_t *h_tok, uint64_t *h, size_t *k) {
    CHECK_OK(tsr_session_decode(s, 1, tok, NULL, NULL, NULL));
    h[*k] = row_hash(tsr_session_logits(s, 0), nv);
    h_tok[(*k)++] = *tok;
    *tok = argmax(tsr_session_logits(s, 0), nv);
}

/* Two sessions of one backend taking turns: s[0] after a LONG_PROMPT-token
 * prompt (its generation crosses 256 cells) two steps a turn, the second
 * run on the last plan (reuse: planned at most once, where 256 is
 * crossed), s[1] after 6 tokens one step; every fifth turn s[0] first
 * removes its last cell and decodes that token again. The hashes of every
 * logits row, in order, go to h. */
static void turns(const char *path, int reuse, int32_t *h_tok, uint64_t *h) {
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = 2;
    tsr_backend *be = NULL;
    tsr_model *m = NULL;
    tsr_session *s[2] = {NULL, NULL};
    CHECK_OK(tsr_backend_new(&bp, &be));
    CHECK_OK(tsr_model_load(be, path, NULL, &m));
    tsr_session_params sp;
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 512;
    for (int i = 0; i < 2; i++) CHECK_OK(tsr_session_new(m, &sp, &s[i]));
    if (!s[0] || !s[1])
        goto done;
    const int32_t nv = tsr_model_n_vocab(m);
    int32_t prompt[LONG_PROMPT], tok[2], last0 = 0;
    for (int i = 0; i < LONG_PROMPT; i++) prompt[i] = 1 + (i * 7919) % (nv - 1);
    CHECK_OK(tsr_session_decode(s[0], LONG_PROMPT, prompt, NULL, NULL, NULL));
    CHECK_OK(tsr_session_decode(s[1], 6, prompt, NULL, NULL, NULL));
    tok[0] = argmax(tsr_session_logits(s[0], LONG_PROMPT - 1), nv);
    tok[1] = argmax(tsr_session_logits(s[1], 5), nv);
    size_t k = 0;
    int replans = 0;
    for (int t = 0; t < N_TURNS; t++) {
        if (t % 5 == 4) { /* the last cell again */
            const int32_t last = tsr_session_n_past(s[0], 0) - 1;
            CHECK_OK(tsr_session_remove(s[0], 0, last, -1));
            int32_t again = last0;
            step(s[0], nv, &again, h_tok, h, &k);
        } else {
            last0 = tok[0];
            step(s[0], nv, &tok[0], h_tok, h, &k);
        }
        const uint64_t p0 = tsr__plan_count();
        last0 = tok[0];
        step(s[0], nv, &tok[0], h_tok, h, &k);
        replans += tsr__plan_count() != p0;
        step(s[1], nv, &tok[1], h_tok, h, &k);
    }
    CHECK(tsr_session_n_past(s[0], 0) > 256, "the generation did not cross 256 cells");
    if (reuse)
        CHECK(replans <= 1, "%d of %d steps after a step of the same session were planned again", replans, N_TURNS);
    else
        CHECK(replans == N_TURNS, "TSR_GRAPH_REUSE=0: %d of %d steps planned", replans, N_TURNS);
done:
    for (int i = 0; i < 2; i++) tsr_session_free(s[i]);
    tsr_model_free(m);
    tsr_backend_free(be);
}

static void reuse(const char *path) {
    int32_t tok[2][N_STEPS];
    uint64_t h[2][N_STEPS];
    memset(h, 0, sizeof h);
    memset(tok, 0, sizeof tok);
    turns(path, 1, tok[0], h[0]);
    setenv("TSR_GRAPH_REUSE", "0", 1);
    turns(path, 0, tok[1], h[1]);
    unsetenv("TSR_GRAPH_REUSE");
    for (int k = 0; k < N_STEPS; k++)
        CHECK(h[0][k] == h[1][k] && tok[0][k] == tok[1][k], "step %d: graphs run again and built anew differ", k);
}

static void statuses(const char *path) {
    tsr_backend *be = NULL;
    tsr_model *m = NULL;
    tsr_session *s = NULL;
    CHECK_OK(tsr_backend_new(NULL, &be));
    CHECK_OK(tsr_model_load(be, path, NULL, &m));
    tsr_model *twice = NULL;
    CHECK_STATUS(tsr_model_load(be, path, NULL, &twice), TSR_E_STATE);
    CHECK(twice == NULL);
    CHECK_OK(tsr_session_new(m, NULL, &s));
    CHECK(tsr_session_n_ctx(s) == tsr_model_n_ctx_train(m));
    int32_t bad = tsr_model_n_vocab(m), ok_tok = 1, seq2 = 1;
    CHECK_STATUS(tsr_session_decode(s, 1, &bad, NULL, NULL, NULL), TSR_E_INVALID);
    CHECK_STATUS(tsr_session_decode(s, 1, &ok_tok, NULL, &seq2, NULL), TSR_E_INVALID); /* n_seq_max 1 */
    CHECK_STATUS(tsr_session_decode(NULL, 1, &ok_tok, NULL, NULL, NULL), TSR_E_INVALID);
    CHECK(tsr_session_n_past(s, 0) == 0);
    CHECK(tsr_session_logits(s, 0) == NULL);
    char piece[4];
    size_t len = 0;
    CHECK_STATUS(tsr_model_token_piece(m, bad, 0, piece, sizeof piece, &len), TSR_E_INVALID);
    CHECK_STATUS(tsr_model_tokenize(m, "x", 1, 8u, NULL, 0, &len), TSR_E_INVALID);
    tsr_chat_message msg = {"user", "Hi"};
    char buf[4];
    CHECK_STATUS(tsr_model_chat_format(m, &msg, 1, 1, buf, sizeof buf, &len), TSR_E_RANGE);
    CHECK(len > sizeof buf);
    tsr_model_free(m); /* with a session open: freed with the session */
    CHECK_OK(tsr_session_decode(s, 1, &ok_tok, NULL, NULL, NULL));
    tsr_session_free(s);
    tsr_backend_free(be);
}

int main(void) {
    char path[1024];
    if (!tsrtest_model(path, sizeof path))
        return tsrtest_done("test-session");
    const int32_t a[] = {1, 504, 3575, 282, 4649, 314}, b[] = {1, 9590, 2056, 253, 655, 28};
    int32_t out[3][N_GEN], mixed[N_GEN], alone[N_GEN];
    float gaps[3][N_GEN], gaps_alone[N_GEN];
    for (int t = 0; t < 3; t++)
        generate(path, t + 1, a, 6, out[t], gaps[t], t == 1);
    CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0, "1 and 2 threads generate differently");
    CHECK(memcmp(out[2], out[1], sizeof out[0]) == 0, "3 and 2 threads generate differently");
    generate(path, 2, b, 6, alone, gaps_alone, 0);
    generate_mixed(path, a, 6, b, 6, alone, mixed);
    int judged = 0;
    for (int i = 0; i < N_GEN; i++) {
        if (gaps_alone[i] < 0.5f)
            continue;
        judged++;
        CHECK(mixed[i] == alone[i], "step %d: inside the mixed batch %d, alone %d (gap %.3f)", i, mixed[i], alone[i],
              gaps_alone[i]);
    }
    CHECK(judged > N_GEN / 2, "only %d of %d steps were not near-ties", judged, N_GEN);
    reuse(path);
    statuses(path);
    return tsrtest_done("test-session");
}
