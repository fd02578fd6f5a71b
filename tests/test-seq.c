/*
 * test-seq.c - what the batching scheduler builds on, on the real model
 * (SmolLM2-135M-Instruct Q4_1 in ~/.cache/libtensr, or $TSR_TEST_MODEL;
 * skips when it is absent, fails when it is absent and CI=true):
 *  - a decode of more tokens than the free cells is TSR_E_FULL (not
 *    TSR_E_INVALID for n > n_batch) and changes nothing;
 *  - a sequence copied (whole or a prefix) continues as the original would:
 *    the next token's logits equal, within 1e-4 on the flash path, those of
 *    the same tokens decoded on a fresh sequence in the same calls (within
 *    1.0 on the plain path, whose sums depend on where the cells lie);
 *  - a sequence saved to memory and loaded into another sequence (or
 *    another session) continues the same way (same tolerances: the state
 *    was decoded in other cells than the reference); short buffers, foreign and
 *    damaged states and a session too small give their statuses and change
 *    nothing;
 *  - the sampler's logit bias, frequency and presence penalties, and
 *    log-probabilities against values worked out in double precision.
 */
#include "tsrtest.h"

#define N_PROMPT 20

static int32_t nv;
/* Tolerance for a sequence continued in other cells than its reference:
 * exact on the flash path; on the plain path the cells' place changes the
 * attention's sums (a batch-invariance gap of that path, up to ~0.5 in a
 * logit on this model), while a copy that loses data moves them by 10 or
 * more. */
static float tol_moved;

static int argmax(const float *v) {
    int best = 0;
    for (int32_t i = 1; i < nv; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

static float max_diff(const float *a, const float *b) {
    float d = 0.0f;
    for (int32_t i = 0; i < nv; i++) d = fabsf(a[i] - b[i]) > d ? fabsf(a[i] - b[i]) : d;
    return d;
}

static tsr_session *new_session(tsr_model *m, int64_t n_ctx, int32_t n_seq) {
    tsr_session_params sp;
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = n_ctx;
    sp.n_seq_max = n_seq;
    tsr_session *s = NULL;
    CHECK_OK(tsr_session_new(m, &sp, &s));
    return s;
}

static void full_first(tsr_model *m) {
    tsr_session *s = new_session(m, 64, 1);
    if (!s)
        return;
    int32_t toks[80];
    for (int i = 0; i < 80; i++) toks[i] = 1 + i;
    CHECK_STATUS(tsr_session_decode(s, 65, toks, NULL, NULL, NULL), TSR_E_FULL);
    CHECK_EQ_INT(tsr_session_n_past(s, 0), 0);
    CHECK_OK(tsr_session_decode(s, 40, toks, NULL, NULL, NULL));
    CHECK_STATUS(tsr_session_decode(s, 30, toks, NULL, NULL, NULL), TSR_E_FULL);
    CHECK_EQ_INT(tsr_session_n_past(s, 0), 40);
    CHECK_OK(tsr_session_decode(s, 24, toks, NULL, NULL, NULL)); /* exactly full */
    CHECK_STATUS(tsr_session_decode(s, 1, toks, NULL, NULL, NULL), TSR_E_FULL);
    tsr_session_free(s);
}

/* The logits after decoding x on sequence seq, copied to out. */
static void next(tsr_session *s, int32_t seq, int32_t x, float *out) {
    int32_t q = seq;
    CHECK_OK(tsr_session_decode(s, 1, &x, NULL, &q, NULL));
    const float *l = tsr_session_logits(s, 0);
    CHECK(l != NULL);
    if (l)
        memcpy(out, l, (size_t)nv * sizeof *out);
}

static void prompt(tsr_session *s, int32_t seq, const int32_t *p, size_t n) {
    int32_t q[N_PROMPT];
    for (size_t i = 0; i < n; i++) q[i] = seq;
    CHECK_OK(tsr_session_decode(s, n, p, NULL, q, NULL));
}

static void copy_save_load(tsr_model *m, const int32_t *p) {
    tsr_session *s = new_session(m, 256, 4), *small = new_session(m, 16, 1), *other = new_session(m, 256, 1);
    float *ref = malloc((size_t)nv * sizeof *ref), *got = malloc((size_t)nv * sizeof *got);
    if (!s || !small || !other || !ref || !got)
        goto done;
    const int32_t x = 504;
    /* the reference: the prompt then x on sequence 3, in the same calls */
    prompt(s, 3, p, N_PROMPT);
    next(s, 3, x, ref);
    prompt(s, 0, p, N_PROMPT);
    /* whole copy */
    CHECK_OK(tsr_session_seq_copy(s, 0, 1, 0, -1));
    CHECK_EQ_INT(tsr_session_n_past(s, 1), N_PROMPT);
    next(s, 1, x, got);
    CHECK(max_diff(ref, got) < tol_moved, "copied sequence: logits differ by %g", max_diff(ref, got));
    CHECK_EQ_INT(argmax(ref), argmax(got));
    /* prefix copy, then the rest of the prompt decoded on it */
    CHECK_OK(tsr_session_seq_copy(s, 0, 2, 0, 12));
    CHECK_EQ_INT(tsr_session_n_past(s, 2), 12);
    int32_t q[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) q[i] = 2;
    CHECK_OK(tsr_session_decode(s, N_PROMPT - 12, p + 12, NULL, q, NULL));
    next(s, 2, x, got);
    CHECK(max_diff(ref, got) < tol_moved, "prefix copy + rest: logits differ by %g", max_diff(ref, got));
    CHECK_EQ_INT(argmax(ref), argmax(got));
    /* copy replaces dst; statuses */
    CHECK_OK(tsr_session_seq_copy(s, 0, 2, 0, 5));
    CHECK_EQ_INT(tsr_session_n_past(s, 2), 5);
    CHECK_STATUS(tsr_session_seq_copy(s, 0, 4, 0, -1), TSR_E_INVALID);
    CHECK_STATUS(tsr_session_seq_copy(NULL, 0, 1, 0, -1), TSR_E_INVALID);

    /* save sequence 0 (the prompt) */
    size_t size = 0;
    CHECK_STATUS(tsr_session_seq_save(s, 0, NULL, 0, &size), TSR_E_RANGE);
    CHECK(size > (size_t)N_PROMPT * 1000, "state of %zu bytes for %d cells", size, N_PROMPT);
    char *st = malloc(size), *bad = malloc(size);
    size_t size2 = 0;
    CHECK_OK(tsr_session_seq_save(s, 0, st, size, &size2));
    CHECK_EQ_INT(size2, size);
    /* into sequence 1 of the same session, after it is emptied */
    CHECK_OK(tsr_session_remove(s, 1, 0, -1));
    CHECK_OK(tsr_session_seq_load(s, 1, st, size));
    CHECK_EQ_INT(tsr_session_n_past(s, 1), N_PROMPT);
    next(s, 1, x, got);
    CHECK(max_diff(ref, got) < tol_moved, "loaded sequence: logits differ by %g", max_diff(ref, got));
    /* into another session */
    CHECK_OK(tsr_session_seq_load(other, 0, st, size));
    next(other, 0, x, got);
    CHECK(max_diff(ref, got) < tol_moved, "loaded in another session: logits differ by %g", max_diff(ref, got));
    /* a loaded sequence replaces what the sequence held */
    CHECK_OK(tsr_session_seq_load(other, 0, st, size));
    CHECK_EQ_INT(tsr_session_n_past(other, 0), N_PROMPT);
    /* too small, damaged, truncated: nothing changes */
    CHECK_STATUS(tsr_session_seq_load(small, 0, st, size), TSR_E_FULL);
    CHECK_EQ_INT(tsr_session_n_past(small, 0), 0);
    memcpy(bad, st, size);
    bad[0] ^= 1;
    CHECK_STATUS(tsr_session_seq_load(other, 0, bad, size), TSR_E_MALFORMED);
    CHECK_STATUS(tsr_session_seq_load(other, 0, st, size - 1), TSR_E_MALFORMED);
    CHECK_EQ_INT(tsr_session_n_past(other, 0), N_PROMPT);
    CHECK_STATUS(tsr_session_seq_load(other, 1, st, size), TSR_E_INVALID);
    free(st);
    free(bad);
done:
    free(ref);
    free(got);
    tsr_session_free(s);
    tsr_session_free(small);
    tsr_session_free(other);
}

static tsr_sampler *greedy(tsr_model *m, const tsr_logit_bias *bias, size_t n_bias, float freq, float presence) {
    tsr_sampler_params p;
    tsr_sampler_params_init(&p, sizeof p);
    p.temp = 0.0f;
    p.logit_bias = bias;
    p.n_logit_bias = n_bias;
    p.freq_penalty = freq;
    p.presence_penalty = presence;
    tsr_sampler *s = NULL;
    CHECK_OK(tsr_sampler_new(m, &p, &s));
    return s;
}

static void sampler(tsr_model *m) {
    float *l = calloc((size_t)nv, sizeof *l);
    if (!l)
        return;
    l[7] = 5.0f;
    l[9] = 4.5f;
    l[11] = 3.0f;
    /* bias: a ban and a push */
    tsr_logit_bias ban[1] = {{7, -INFINITY}}, push[2] = {{11, 10.0f}, {7, -1.0f}};
    tsr_sampler *s = greedy(m, ban, 1, 0, 0);
    CHECK_EQ_INT(tsr_sampler_sample(s, l), 9);
    tsr_sampler_free(s);
    s = greedy(m, push, 2, 0, 0);
    CHECK_EQ_INT(tsr_sampler_sample(s, l), 11);
    /* log-probabilities include the bias: 13 for 11, 4 for 7, 4.5 for 9, 0 elsewhere */
    double lse = 0.0;
    for (int32_t i = 0; i < nv; i++) lse += exp(i == 11 ? 13.0 : i == 7 ? 4.0 : i == 9 ? 4.5 : 0.0);
    lse = log(lse);
    float lp = 0, top_lp[4];
    int32_t top[4];
    CHECK_OK(tsr_sampler_logprobs(s, l, 9, &lp, 4, top, top_lp));
    CHECK_NEAR(lp, 4.5 - lse, 1e-4);
    CHECK(top[0] == 11 && top[1] == 9 && top[2] == 7 && top[3] == 0, "top: %d %d %d %d", top[0], top[1], top[2],
          top[3]);
    CHECK_NEAR(top_lp[0], 13.0 - lse, 1e-4);
    CHECK_NEAR(top_lp[2], 4.0 - lse, 1e-4);
    CHECK_NEAR(top_lp[3], -lse, 1e-4);
    tsr_sampler_free(s);
    /* logits spread over [-40, 10] (the exponentials of every magnitude the
     * normalizer sums): against the sum in double */
    s = greedy(m, NULL, 0, 0, 0);
    float *w = calloc((size_t)nv, sizeof *w);
    if (w) {
        double ref = 0.0;
        for (int32_t i = 0; i < nv; i++) {
            w[i] = (float)(25.0 * sin(0.37 * i) - 15.0);
            ref += exp((double)w[i] - 10.0);
        }
        ref = 10.0 + log(ref);
        for (int32_t t = 0; t < nv; t += nv / 7 + 1) {
            CHECK_OK(tsr_sampler_logprobs(s, w, t, &lp, 0, NULL, NULL));
            CHECK_NEAR(lp, w[t] - ref, 2e-6 * (1.0 + fabs(w[t] - ref)));
        }
        free(w);
    }
    CHECK_STATUS(tsr_sampler_logprobs(s, l, nv, &lp, 0, NULL, NULL), TSR_E_INVALID);
    CHECK_STATUS(tsr_sampler_logprobs(s, l, 0, &lp, 2, NULL, top_lp), TSR_E_INVALID);
    tsr_sampler_free(s);
    /* frequency: 7 seen twice costs 2 x 0.3 (5 - 0.6 < 4.5), once only 0.3 */
    s = greedy(m, NULL, 0, 0.3f, 0.0f);
    CHECK_OK(tsr_sampler_accept(s, 7));
    CHECK_EQ_INT(tsr_sampler_sample(s, l), 7); /* 5 - 0.3 > 4.5; now seen twice */
    CHECK_EQ_INT(tsr_sampler_sample(s, l), 9);
    tsr_sampler_free(s);
    /* presence: once, whatever the count */
    s = greedy(m, NULL, 0, 0.0f, 0.4f);
    CHECK_OK(tsr_sampler_accept(s, 7));
    CHECK_OK(tsr_sampler_accept(s, 7));
    CHECK_EQ_INT(tsr_sampler_sample(s, l), 7); /* 4.6 > 4.5 */
    tsr_sampler_free(s);
    s = greedy(m, NULL, 0, 0.0f, 0.6f);
    CHECK_OK(tsr_sampler_accept(s, 7));
    CHECK_EQ_INT(tsr_sampler_sample(s, l), 9);
    tsr_sampler_free(s);
    /* bad values */
    tsr_logit_bias out_of_vocab[1] = {{-1, 1.0f}}, nan_bias[1] = {{3, NAN}};
    tsr_sampler *none = NULL;
    tsr_sampler_params p;
    tsr_sampler_params_init(&p, sizeof p);
    p.logit_bias = out_of_vocab;
    p.n_logit_bias = 1;
    CHECK_STATUS(tsr_sampler_new(m, &p, &none), TSR_E_INVALID);
    p.logit_bias = nan_bias;
    CHECK_STATUS(tsr_sampler_new(m, &p, &none), TSR_E_INVALID);
    p.logit_bias = NULL;
    CHECK_STATUS(tsr_sampler_new(m, &p, &none), TSR_E_INVALID);
    p.n_logit_bias = 0;
    p.freq_penalty = INFINITY;
    CHECK_STATUS(tsr_sampler_new(m, &p, &none), TSR_E_INVALID);
    CHECK(none == NULL);
    free(l);
}

int main(void) {
    char path[1024];
    if (!tsrtest_model(path, sizeof path))
        return tsrtest_done("test-seq");
    for (int flash = 0; flash < 2; flash++) {
        tsr_backend_params bp;
        tsr_backend_params_init(&bp, sizeof bp);
        bp.n_threads = 2;
        bp.flash_attn = flash ? TSR_FLASH_ATTN_ON : TSR_FLASH_ATTN_OFF;
        tsr_backend *be = NULL;
        tsr_model *m = NULL;
        CHECK_OK(tsr_backend_new(&bp, &be));
        CHECK_OK(tsr_model_load(be, path, NULL, &m));
        CHECK_EQ_INT(tsr_backend_flash_attn(be), flash);
        if (m) {
            nv = tsr_model_n_vocab(m);
            tol_moved = flash ? 1e-4f : 1.0f;
            int32_t p[N_PROMPT];
            size_t n = 0;
            const char *text = "The quick brown fox jumps over the lazy dog while the cat";
            CHECK_OK(tsr_model_tokenize(m, text, strlen(text), 0, p, N_PROMPT, &n));
            for (size_t i = n; i < N_PROMPT; i++) p[i] = p[i - n];
            full_first(m);
            copy_save_load(m, p);
            sampler(m);
        }
        tsr_model_free(m);
        tsr_backend_free(be);
    }
    return tsrtest_done("test-seq");
}
