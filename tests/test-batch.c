/*
 * test-batch.c - the batching scheduler (tsr_batcher) on the real model
 * (SmolLM2-135M-Instruct Q4_1 in ~/.cache/libtensr, or $TSR_TEST_MODEL;
 * skips when it is absent, fails when it is absent and CI=true):
 *  - batch invariance: N_REQ greedy requests of prompts from 3 to 70 tokens
 *    (prefill in chunks of 16), submitted in a random order between steps,
 *    some cancelled while queued, in prefill or in decode (by
 *    tsr_batcher_cancel or by their callback), run on 4 slots; every
 *    request that finishes gives exactly the tokens of its run alone on a
 *    fresh batcher, a cancelled one a prefix of them; the events' text is
 *    the detokenized tokens, every chunk whole UTF-8;
 *  - prefix reuse: a prompt that extends a finished one is decoded from the
 *    common prefix (n_cached) and still gives its tokens alone;
 *  - stop strings, max_tokens, statuses (a prompt too long for a slot, a
 *    full queue, unknown ids, releasing a running request).
 * TSR_TEST_BATCH_REQ sets N_REQ (valgrind runs use fewer).
 *
 * The backend is batch invariant (tsr_backend_params.batch_invariant): with
 * the AVX2 and AVX-512 kernels an ordinary backend converts the
 * activations of one column (gemv) and of several (gemm) to different
 * types and plans attention by its rows, so a token's logits change with
 * the number of columns in its batch (SmolLM2 Q4_1, AVX-512: 1, 2 and >= 3
 * columns give three different rows), and TSR_TEST_BATCH_VARIANT=1 (an
 * ordinary backend) makes this test fail there. The scheduler and the
 * cache (each slot's cells together, per_seq_cells) are batch invariant
 * by themselves.
 */
#include "tsrtest.h"

#define MAX_GEN 16
#define MAX_REQ 64

static int n_req = 12;
static uint64_t rng = 0x5EEDull;
#define tsrtest_rand() tsrtest_rand_u64(&rng)

typedef struct run {
    int32_t prompt[80];
    size_t n_prompt;
    int64_t max_tokens;
    int32_t alone[MAX_GEN];
    size_t n_alone;
    int alone_finish;
    /* in the mixed run */
    uint64_t id;
    int cancel_at; /* -1 none; 0 queued; 1 prefill (after one step); 2 decode (callback after 2 tokens) */
    int32_t got[MAX_GEN + 1];
    size_t n_got;
    int finish, events, bad_utf8;
    int64_t n_cached;
    char text[4096];
    size_t n_text;
} run;

static run runs[MAX_REQ];

static tsr_batcher *new_batcher(tsr_model *m) {
    tsr_batcher_params p;
    tsr_batcher_params_init(&p, sizeof p);
    p.n_slots = 4;
    p.n_ctx_slot = 128;
    p.n_batch = 40;
    p.n_ubatch = 16;
    tsr_batcher *b = NULL;
    CHECK_OK(tsr_batcher_new(m, &p, &b));
    return b;
}

static int utf8_whole(const char *t, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)t[i];
        size_t need = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
        if (need == 0 || i + need > n)
            return 0;
        i += need;
    }
    return 1;
}

static int on_event(void *user, const tsr_batch_event *ev) {
    run *r = user;
    r->events++;
    if (ev->token >= 0 && r->n_got < MAX_GEN + 1)
        r->got[r->n_got++] = ev->token;
    if (!utf8_whole(ev->text, ev->text_len))
        r->bad_utf8++;
    if (ev->text_len && r->n_text + ev->text_len < sizeof r->text) {
        memcpy(r->text + r->n_text, ev->text, ev->text_len);
        r->n_text += ev->text_len;
    }
    if (ev->finish) {
        r->finish = ev->finish;
        r->n_cached = ev->n_cached;
    }
    return r->cancel_at == 2 && r->n_got >= 2 && !ev->finish;
}

static void drain(tsr_batcher *b) {
    size_t active = 1;
    for (int i = 0; i < 10000 && active; i++) CHECK_OK(tsr_batcher_step(b, &active));
    CHECK_EQ_INT(active, 0);
}

static void alone(tsr_model *m, run *r) {
    tsr_batcher *b = new_batcher(m);
    if (!b)
        return;
    tsr_request_params rp;
    tsr_request_params_init(&rp, sizeof rp);
    rp.tokens = r->prompt;
    rp.n_tokens = r->n_prompt;
    rp.max_tokens = r->max_tokens;
    uint64_t id = 0;
    CHECK_OK(tsr_batcher_submit(b, &rp, &id));
    drain(b);
    CHECK_OK(tsr_batcher_poll(b, id, r->alone, MAX_GEN, &r->n_alone, &r->alone_finish));
    CHECK(r->alone_finish == TSR_FINISH_STOP || r->alone_finish == TSR_FINISH_LENGTH, "finish %d", r->alone_finish);
    CHECK_OK(tsr_batcher_release(b, id));
    tsr_batcher_free(b);
}

static void submit(tsr_batcher *b, run *r) {
    tsr_request_params rp;
    tsr_request_params_init(&rp, sizeof rp);
    rp.tokens = r->prompt;
    rp.n_tokens = r->n_prompt;
    rp.max_tokens = r->max_tokens;
    rp.callback = on_event;
    rp.user = r;
    CHECK_OK(tsr_batcher_submit(b, &rp, &r->id));
    if (r->cancel_at == 0)
        CHECK_OK(tsr_batcher_cancel(b, r->id));
}

static void mixed(tsr_model *m) {
    tsr_batcher *b = new_batcher(m);
    if (!b)
        return;
    int order[MAX_REQ];
    for (int i = 0; i < n_req; i++) order[i] = i;
    for (int i = n_req - 1; i > 0; i--) {
        int j = (int)(tsrtest_rand() % (uint64_t)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    int next = 0, prefill_cancel[MAX_REQ] = {0};
    size_t active = 1;
    for (int step = 0; step < 10000 && (active || next < n_req); step++) {
        int k = (int)(tsrtest_rand() % 3); /* 0..2 submissions between steps */
        for (; k > 0 && next < n_req; k--) {
            run *r = &runs[order[next++]];
            submit(b, r);
            prefill_cancel[r - runs] = r->cancel_at == 1;
        }
        CHECK_OK(tsr_batcher_step(b, &active));
        for (int i = 0; i < n_req; i++) /* in prefill after a step: its prompt is longer than a chunk */
            if (prefill_cancel[i] && runs[i].n_got == 0 && !runs[i].finish) {
                CHECK_OK(tsr_batcher_cancel(b, runs[i].id));
                prefill_cancel[i] = 0;
            }
    }
    CHECK_EQ_INT(active, 0);
    for (int i = 0; i < n_req; i++) {
        run *r = &runs[i];
        CHECK(r->bad_utf8 == 0, "request %d: %d events split a UTF-8 character", i, r->bad_utf8);
        if (r->cancel_at < 0) {
            CHECK(r->finish == r->alone_finish, "request %d: finish %d, alone %d", i, r->finish, r->alone_finish);
            size_t d = 0;
            while (d < r->n_got && d < r->n_alone && r->got[d] == r->alone[d]) d++;
            CHECK(r->n_got == r->n_alone && d == r->n_got,
                  "request %d (%zu prompt tokens): %zu tokens, %zu alone; the first difference at %zu", i, r->n_prompt,
                  r->n_got, r->n_alone, d);
            char want[4096];
            size_t len = 0;
            CHECK_OK(tsr_model_detokenize(m, r->alone, r->n_alone, 0, want, sizeof want, &len));
            CHECK(len == r->n_text && memcmp(want, r->text, len) == 0, "request %d: the events' text differs", i);
        } else {
            CHECK(r->finish == TSR_FINISH_CANCELLED || (r->cancel_at == 1 && r->finish != TSR_FINISH_NONE),
                  "request %d cancelled at phase %d: finish %d", i, r->cancel_at, r->finish);
            CHECK(r->n_got <= r->n_alone && memcmp(r->got, r->alone, r->n_got * sizeof *r->got) == 0,
                  "request %d cancelled: its %zu tokens are no prefix of its run alone", i, r->n_got);
            if (r->cancel_at == 0)
                CHECK(r->n_got == 0 && r->events == 1, "request %d cancelled while queued: %zu tokens, %d events", i,
                      r->n_got, r->events);
            if (r->cancel_at == 2)
                CHECK(r->n_got == 2, "request %d cancelled by its callback after 2 tokens: %zu", i, r->n_got);
        }
    }
    size_t running = 9, waiting = 9;
    tsr_batcher_counts(b, &running, &waiting, NULL);
    CHECK(running == 0 && waiting == 0, "%zu running, %zu waiting at the end", running, waiting);
    CHECK_STATUS(tsr_batcher_cancel(b, runs[0].id), TSR_E_NOT_FOUND); /* callback requests are forgotten */
    tsr_batcher_free(b);
}

/* *ext: base's prompt and 5 more tokens, 10 to generate, its tokens alone known. */
static void extend(tsr_model *m, const run *base, run *ext) {
    memset(ext, 0, sizeof *ext);
    memcpy(ext->prompt, base->prompt, base->n_prompt * sizeof *ext->prompt);
    ext->n_prompt = base->n_prompt;
    for (int i = 0; i < 5; i++) ext->prompt[ext->n_prompt++] = 300 + i;
    ext->max_tokens = 10;
    ext->cancel_at = -1;
    alone(m, ext);
}

/* r as a new request of its prompt: not cancelled, nothing received yet. */
static run fresh(const run *r) {
    run f = *r;
    f.cancel_at = -1;
    f.n_got = f.n_text = 0;
    return f;
}

/* A prompt that extends a finished one reuses its cells. */
static void reuse(tsr_model *m, const run *base) {
    run ext;
    extend(m, base, &ext);
    tsr_batcher *b = new_batcher(m);
    if (!b)
        return;
    run first = fresh(base);
    submit(b, &first);
    drain(b);
    submit(b, &ext);
    drain(b);
    CHECK(ext.n_cached == (int64_t)base->n_prompt, "n_cached %lld, the common prefix is %zu", (long long)ext.n_cached,
          base->n_prompt);
    CHECK(ext.n_got == ext.n_alone && memcmp(ext.got, ext.alone, ext.n_got * sizeof *ext.got) == 0,
          "the prompt decoded after a cached prefix generates otherwise than alone");
    /* the same prompt again: all but its last token cached */
    run again = fresh(&ext);
    submit(b, &again);
    drain(b);
    CHECK_EQ_INT(again.n_cached, (int64_t)ext.n_prompt - 1);
    CHECK(again.n_got == ext.n_alone && memcmp(again.got, ext.alone, again.n_got * sizeof *again.got) == 0);
    tsr_batcher_free(b);
}

/* Slots keep their prompts for later requests: a prompt that shares
 * little with every free slot takes the slot used least recently, not the
 * first one; and a prompt whose prefix a running request's slot holds is
 * copied from there into a free slot (tsr_session_seq_copy), not decoded
 * again. Either way its tokens are its run's alone. */
static void slot_choice(tsr_model *m, const run *base) {
    run ext;
    extend(m, base, &ext);
    tsr_batcher *b = new_batcher(m); /* 4 slots */
    if (!b)
        return;
    run first = fresh(base);
    submit(b, &first);
    drain(b);
    for (int k = 0; k < 3; k++) { /* prompts that share nothing with it: the 3 other slots */
        run o;
        memset(&o, 0, sizeof o);
        for (int j = 0; j < 6; j++) o.prompt[j] = 500 + 10 * k + j;
        o.n_prompt = 6;
        o.max_tokens = 2;
        o.cancel_at = -1;
        submit(b, &o);
        drain(b);
    }
    run e1 = fresh(&ext);
    submit(b, &e1);
    drain(b);
    CHECK(e1.n_cached == (int64_t)base->n_prompt, "after 3 other prompts: n_cached %lld, the prefix is %zu",
          (long long)e1.n_cached, base->n_prompt);
    CHECK(e1.n_got == ext.n_alone && memcmp(e1.got, ext.alone, e1.n_got * sizeof *e1.got) == 0,
          "after 3 other prompts: not the tokens alone");
    run busy = fresh(base); /* the slot holding the prefix runs this one */
    busy.max_tokens = MAX_GEN;
    submit(b, &busy);
    size_t active = 0;
    CHECK_OK(tsr_batcher_step(b, &active));
    run e2 = fresh(&ext);
    submit(b, &e2);
    drain(b);
    CHECK(e2.n_cached == (int64_t)base->n_prompt, "beside a running request on the prefix: n_cached %lld, want %zu",
          (long long)e2.n_cached, base->n_prompt);
    CHECK(e2.n_got == ext.n_alone && memcmp(e2.got, ext.alone, e2.n_got * sizeof *e2.got) == 0,
          "the prefix copied from a running slot: not the tokens alone");
    tsr_batcher_free(b);
}

static void stops_and_statuses(tsr_model *m, const run *base) {
    tsr_batcher_params p;
    tsr_batcher_params_init(&p, sizeof p);
    p.n_slots = 1;
    p.n_ctx_slot = 128;
    p.n_queue_max = 1;
    tsr_batcher *b = NULL;
    CHECK_OK(tsr_batcher_new(m, &p, &b));
    if (!b)
        return;
    /* the text alone decides a stop string: take the 2nd..4th bytes of the text alone */
    char full[4096];
    size_t len = 0;
    CHECK_OK(tsr_model_detokenize(m, base->alone, base->n_alone, 0, full, sizeof full, &len));
    tsr_request_params rp;
    tsr_request_params_init(&rp, sizeof rp);
    rp.tokens = base->prompt;
    rp.n_tokens = base->n_prompt;
    rp.max_tokens = base->max_tokens;
    uint64_t id = 0, id2 = 0, id3 = 0;
    (void)id3;
    char stop[4] = {0};
    if (len >= 6) {
        memcpy(stop, full + 3, 3);
        const char *stops[2] = {"\x01never", stop};
        rp.stop = stops;
        rp.n_stop = 2;
        CHECK_OK(tsr_batcher_submit(b, &rp, &id));
        CHECK_STATUS(tsr_batcher_step(b, NULL), TSR_OK); /* id admitted to the one slot */
        /* the queue holds one */
        rp.stop = NULL;
        rp.n_stop = 0;
        CHECK_OK(tsr_batcher_submit(b, &rp, &id2));
        CHECK_STATUS(tsr_batcher_submit(b, &rp, &id3), TSR_E_FULL);
        size_t running = 0, waiting = 0;
        tsr_batcher_counts(b, &running, &waiting, NULL);
        CHECK(running == 1 && waiting == 1, "%zu running, %zu waiting", running, waiting);
        CHECK_STATUS(tsr_batcher_release(b, id), TSR_E_STATE);
        drain(b);
        char text[4096];
        size_t tl = 0;
        int fin = 0;
        size_t nt = 0;
        CHECK_OK(tsr_batcher_text(b, id, text, sizeof text, &tl));
        CHECK_OK(tsr_batcher_poll(b, id, NULL, 0, &nt, &fin));
        const char *at = strstr(full, stop);
        CHECK(fin == TSR_FINISH_STOP && at && tl == (size_t)(at - full) && memcmp(text, full, tl) == 0,
              "stop \"%s\": finish %d, text \"%.*s\" of \"%s\"", stop, fin, (int)tl, text, full);
        CHECK_OK(tsr_batcher_poll(b, id2, NULL, 0, &nt, &fin));
        CHECK(fin == base->alone_finish && nt == base->n_alone, "queued request: finish %d, %zu tokens", fin, nt);
        CHECK_OK(tsr_batcher_release(b, id));
        CHECK_OK(tsr_batcher_release(b, id2));
    }
    /* statuses */
    int32_t longp[128] = {0};
    rp.tokens = longp;
    rp.n_tokens = 128;
    CHECK_STATUS(tsr_batcher_submit(b, &rp, &id), TSR_E_RANGE);
    rp.n_tokens = 0;
    CHECK_STATUS(tsr_batcher_submit(b, &rp, &id), TSR_E_INVALID);
    longp[0] = tsr_model_n_vocab(m);
    rp.n_tokens = 1;
    CHECK_STATUS(tsr_batcher_submit(b, &rp, &id), TSR_E_INVALID);
    rp.tokens = NULL;
    CHECK_STATUS(tsr_batcher_submit(b, &rp, &id), TSR_E_INVALID);
    rp.text = "Hello";
    CHECK_OK(tsr_batcher_submit(b, &rp, &id));
    CHECK_OK(tsr_batcher_cancel(b, id));
    drain(b);
    int fin = 0;
    size_t nt = 9;
    CHECK_OK(tsr_batcher_poll(b, id, NULL, 0, &nt, &fin));
    CHECK(fin == TSR_FINISH_CANCELLED && nt == 0, "cancelled while queued: finish %d, %zu tokens", fin, nt);
    CHECK_OK(tsr_batcher_release(b, id));
    CHECK_STATUS(tsr_batcher_release(b, id), TSR_E_NOT_FOUND);
    CHECK_STATUS(tsr_batcher_poll(b, 12345, NULL, 0, &nt, NULL), TSR_E_NOT_FOUND);
    tsr_batcher_free(b);
    tsr_batcher_free(NULL);
}

/* The bits of a token's logits decoded alone are its bits decoded beside
 * 1, 2, 7 and 12 columns of another sequence (both sides of the kernels'
 * few-column paths: one column, n <= 8, packed), each sequence in cells of
 * its own: what the greedy tokens above can hide, a last bit. */
static void logit_bits(tsr_model *m, const int32_t *toks, size_t nt) {
    tsr_session_params sp;
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 288;
    sp.n_seq_max = 3;
    sp.per_seq_cells = 1;
    sp.n_outputs_max = 16;
    tsr_session *s = NULL;
    CHECK_OK(tsr_session_new(m, &sp, &s));
    if (!s || nt < 16) {
        CHECK(nt >= 16, "%zu prompt tokens", nt);
        tsr_session_free(s);
        return;
    }
    const int32_t nv = tsr_model_n_vocab(m);
    int32_t t[16], q[16];
    int8_t w[16];
    for (int32_t sq = 0; sq < 3; sq++) { /* prompts: the same on 0 and 1, another on 2 */
        int32_t seq[16];
        for (int i = 0; i < 12; i++) {
            t[i] = toks[((sq == 2 ? 7 : 0) + i) % nt];
            seq[i] = sq;
            w[i] = i == 11;
        }
        CHECK_OK(tsr_session_decode(s, 12, t, NULL, seq, w));
    }
    static const int others[] = {1, 2, 7, 12};
    size_t q2 = 3; /* seq 2's next token: toks[q2 % nt] */
    for (int r = 0; r < 4; r++) {
        const int32_t tok = toks[(12 + r) % nt];
        int32_t seq[16];
        w[0] = 1;
        CHECK_OK(tsr_session_decode(s, 1, &tok, NULL, (int32_t[]){0}, w));
        float *alone = malloc((size_t)nv * sizeof *alone);
        if (alone)
            memcpy(alone, tsr_session_logits(s, 0), (size_t)nv * sizeof *alone);
        q[0] = tok, seq[0] = 1;
        for (int i = 1; i <= others[r]; i++) {
            q[i] = toks[q2++ % nt];
            seq[i] = 2;
            w[i] = i == others[r];
        }
        CHECK_OK(tsr_session_decode(s, 1 + others[r], q, NULL, seq, w));
        const float *beside = tsr_session_logits(s, 0);
        CHECK(alone && beside && memcmp(alone, beside, (size_t)nv * sizeof *alone) == 0,
              "a token's logits beside %d other columns are not its bits alone", others[r]);
        free(alone);
    }
    tsr_session_free(s);
}

int main(void) {
    char path[1024];
    if (!tsrtest_model(path, sizeof path))
        return tsrtest_done("test-batch");
    const char *env = getenv("TSR_TEST_BATCH_REQ");
    if (env && atoi(env) > 0 && atoi(env) <= MAX_REQ)
        n_req = atoi(env);
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = 2;
    bp.flash_attn = TSR_FLASH_ATTN_ON;                      /* the path whose sums do not depend on where cells lie */
    bp.batch_invariant = !getenv("TSR_TEST_BATCH_VARIANT"); /* (set: shows the test can fail) */
    tsr_backend *be = NULL;
    tsr_model *m = NULL;
    CHECK_OK(tsr_backend_new(&bp, &be));
    CHECK_OK(tsr_model_load(be, path, NULL, &m));
    if (m) {
        const char *text = "Once upon a time, in a small village by the sea, there lived an old fisherman who told "
                           "stories about the stars, the tides and the strange lights he saw far out at night.";
        int32_t toks[80];
        size_t nt = 0;
        CHECK_OK(tsr_model_tokenize(m, text, strlen(text), TSR_TOKENIZE_ADD_SPECIAL, toks, 80, &nt));
        for (int i = 0; i < n_req; i++) {
            run *r = &runs[i];
            r->n_prompt = 3 + (size_t)(tsrtest_rand() % 48);
            for (size_t j = 0; j < r->n_prompt; j++) r->prompt[j] = toks[(j + (size_t)i * 3) % nt];
            r->max_tokens = 4 + (int64_t)(tsrtest_rand() % (MAX_GEN - 4));
            r->cancel_at = i % 4 == 3 ? (int)(tsrtest_rand() % 3) : -1;
            alone(m, r);
        }
        mixed(m);
        logit_bits(m, toks, nt);
        reuse(m, &runs[0]);
        slot_choice(m, &runs[2]);
        stops_and_statuses(m, &runs[1]);
    }
    tsr_model_free(m);
    tsr_backend_free(be);
    return tsrtest_done("test-batch");
}
