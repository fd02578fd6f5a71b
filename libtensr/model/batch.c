/* batch.c - tsr_batcher: continuous batching of requests over one session
 * (libtensr.h has the contract and the thread model).
 *
 * A request is queued, then admitted to a slot (a sequence of the
 * session), prefilled in chunks and decoded one token a step until it
 * finishes; a step runs one tsr_session_decode for every request at once.
 * Requests live in one list (submission order, which is also the queue's
 * order) guarded by a mutex; the session, the slots' token records and the
 * samplers are the stepping thread's, except that the mutex is held while
 * a step changes a request's state, so that poll, text and cancel from
 * other threads see whole states. The decode itself runs unlocked. */
#include "model.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { REQ_QUEUED, REQ_PREFILL, REQ_DECODE, REQ_DONE };

typedef struct breq {
    struct breq *next;
    uint64_t id;
    int state, finish, cancel;
    int32_t slot;
    int32_t *prompt;
    int64_t n_prompt, n_done, n_cached; /* n_done: prompt tokens in the slot's cells */
    int32_t *gen;                       /* generated tokens (EOG excluded) */
    int64_t n_gen, max_tokens;
    int32_t last; /* the token to decode next (REQ_DECODE) */
    char *text;   /* generated text; text[0..n_sent) went out in events */
    size_t n_text, cap_text, n_sent;
    char **stop;
    size_t n_stop, max_stop;
    tsr_sampler *smp;
    tsr_batch_callback cb;
    void *user;
    int32_t n_top; /* top log-probabilities asked for (0..TOP_MAX) */
} breq;

enum { TOP_MAX = 20 };

typedef struct bslot {
    int32_t *toks; /* the tokens in the slot's cells, by position */
    int64_t n_held;
    breq *req;     /* NULL: free */
    uint64_t used; /* when a request last took it (0: never) */
} bslot;

struct tsr_batcher {
    tsr_model *m;
    tsr_batcher_params p;
    tsr_session *s;
    bslot *slots;
    breq *reqs; /* every request not released, in submission order */
    uint64_t next_id;
    uint64_t tick; /* admissions so far (bslot.used) */
    size_t n_waiting;
    pthread_mutex_t mu;
    /* the step's batch: n_batch entries */
    int32_t *b_tok, *b_pos, *b_seq;
    int8_t *b_want;
    breq **b_req;
};

void tsr_batcher_params_init(tsr_batcher_params *p, size_t size) {
    if (!p || size < sizeof(size_t))
        return;
    tsr_batcher_params d;
    memset(&d, 0, sizeof d);
    d.n_slots = 4;
    d.n_ctx_slot = 2048;
    d.n_batch = 512;
    d.n_ubatch = 512;
    d.type_k = d.type_v = TSR_TYPE_F16;
    d.size = size < sizeof d ? size : sizeof d;
    memcpy(p, &d, d.size);
    p->size = size;
}

void tsr_request_params_init(tsr_request_params *p, size_t size) {
    if (!p || size < sizeof(size_t))
        return;
    tsr_request_params d;
    memset(&d, 0, sizeof d);
    d.size = size < sizeof d ? size : sizeof d;
    memcpy(p, &d, d.size);
    p->size = size;
}

/* The caller's struct over the defaults (only the bytes it knows). */
static void read_params(void *dst, size_t dst_size, const void *src) {
    size_t n = src ? *(const size_t *)src : 0;
    if (n > sizeof(size_t))
        memcpy((char *)dst + sizeof(size_t), (const char *)src + sizeof(size_t),
               (n < dst_size ? n : dst_size) - sizeof(size_t));
    *(size_t *)dst = dst_size;
}

static tsr_status settle(const tsr_model *m, tsr_batcher_params *p) {
    if (p->n_ctx_slot > tsr_model_n_ctx_train(m))
        p->n_ctx_slot = tsr_model_n_ctx_train(m);
    if (p->n_slots > 0 && p->n_ctx_slot > 0 && p->n_ctx_slot <= INT32_MAX / 2 / p->n_slots &&
        p->n_batch > p->n_ctx_slot * p->n_slots)
        p->n_batch = p->n_ctx_slot * p->n_slots;
    if (p->n_ubatch > p->n_batch)
        p->n_ubatch = p->n_batch;
    if (p->n_slots <= 0 || p->n_slots > 1024 || p->n_ctx_slot < 2 || p->n_batch < p->n_slots || p->n_ubatch <= 0 ||
        p->n_queue_max < 0 || p->n_ctx_slot > INT32_MAX / 2 / p->n_slots)
        return tsr__error(TSR_E_INVALID,
                          "tsr_batcher_new: n_slots %d (1..1024), n_ctx_slot %lld (>= 2), n_batch %lld (>= n_slots), "
                          "n_ubatch %lld (> 0), n_queue_max %lld (>= 0)",
                          p->n_slots, (long long)p->n_ctx_slot, (long long)p->n_batch, (long long)p->n_ubatch,
                          (long long)p->n_queue_max);
    return TSR_OK;
}

static tsr_status make_session(tsr_batcher *b) {
    tsr_session_params sp;
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = b->p.n_ctx_slot * b->p.n_slots;
    sp.n_batch = b->p.n_batch;
    sp.n_ubatch = b->p.n_ubatch;
    sp.n_seq_max = b->p.n_slots;
    sp.n_outputs_max = b->p.n_slots;
    sp.type_k = b->p.type_k;
    sp.type_v = b->p.type_v;
    sp.per_seq_cells = 1; /* a slot's cells together: its attention sums do not depend on the others */
    return tsr_session_new(b->m, &sp, &b->s);
}

static tsr_status alloc_batcher(tsr_batcher *b) {
    size_t nb = (size_t)b->p.n_batch, ns = (size_t)b->p.n_slots;
    b->slots = tsr__calloc(ns, sizeof *b->slots);
    b->b_tok = tsr__malloc(nb * sizeof *b->b_tok);
    b->b_pos = tsr__malloc(nb * sizeof *b->b_pos);
    b->b_seq = tsr__malloc(nb * sizeof *b->b_seq);
    b->b_want = tsr__malloc(nb * sizeof *b->b_want);
    b->b_req = tsr__malloc(nb * sizeof *b->b_req);
    if (!b->slots || !b->b_tok || !b->b_pos || !b->b_seq || !b->b_want || !b->b_req)
        return tsr__error(TSR_E_NOMEM, "tsr_batcher_new: out of host memory");
    for (size_t i = 0; i < ns; i++)
        if (!(b->slots[i].toks = tsr__malloc((size_t)b->p.n_ctx_slot * sizeof(int32_t))))
            return tsr__error(TSR_E_NOMEM, "tsr_batcher_new: out of host memory for %zu slots", ns);
    return TSR_OK;
}

tsr_status tsr_batcher_new(tsr_model *m, const tsr_batcher_params *p, tsr_batcher **out) {
    if (out)
        *out = NULL;
    if (!m || !out)
        return tsr__error(TSR_E_INVALID, "tsr_batcher_new: NULL %s", m ? "out" : "model");
    tsr_batcher *b = tsr__calloc(1, sizeof *b);
    if (!b)
        return tsr__error(TSR_E_NOMEM, "tsr_batcher_new: out of host memory");
    b->m = m;
    b->next_id = 1;
    tsr_batcher_params_init(&b->p, sizeof b->p);
    read_params(&b->p, sizeof b->p, p);
    if (pthread_mutex_init(&b->mu, NULL) != 0) {
        tsr__free(b);
        return tsr__error(TSR_E_NOMEM, "tsr_batcher_new: no mutex");
    }
    tsr_status st = settle(m, &b->p);
    if (st == TSR_OK)
        st = alloc_batcher(b);
    if (st == TSR_OK && (st = make_session(b)) != TSR_OK)
        st = tsr__error(st, "tsr_batcher_new: %s", tsr_last_error());
    if (st != TSR_OK) {
        tsr_batcher_free(b);
        return st;
    }
    *out = b;
    return TSR_OK;
}

static void req_free(breq *r) {
    if (!r)
        return;
    for (size_t i = 0; i < r->n_stop; i++) tsr__free(r->stop[i]);
    tsr__free(r->stop);
    tsr_sampler_free(r->smp);
    tsr__free(r->prompt);
    tsr__free(r->gen);
    tsr__free(r->text);
    tsr__free(r);
}

void tsr_batcher_free(tsr_batcher *b) {
    if (!b)
        return;
    while (b->reqs) {
        breq *r = b->reqs;
        b->reqs = r->next;
        req_free(r);
    }
    for (int32_t i = 0; b->slots && i < b->p.n_slots; i++) tsr__free(b->slots[i].toks);
    tsr__free(b->slots);
    tsr__free(b->b_tok);
    tsr__free(b->b_pos);
    tsr__free(b->b_seq);
    tsr__free(b->b_want);
    tsr__free(b->b_req);
    tsr_session_free(b->s);
    pthread_mutex_destroy(&b->mu);
    tsr__free(b);
}

/* ---- submit ---------------------------------------------------------------- */

static tsr_status req_prompt(tsr_batcher *b, const tsr_request_params *rp, breq *r) {
    if (rp->tokens) {
        if (!(r->prompt = tsr__malloc((rp->n_tokens ? rp->n_tokens : 1) * sizeof(int32_t))))
            return tsr__error(TSR_E_NOMEM, "out of host memory");
        memcpy(r->prompt, rp->tokens, rp->n_tokens * sizeof(int32_t));
        r->n_prompt = (int64_t)rp->n_tokens;
    } else {
        size_t len = strlen(rp->text), n = 0;
        unsigned fl = TSR_TOKENIZE_ADD_SPECIAL | TSR_TOKENIZE_PARSE_SPECIAL;
        tsr_status st = tsr_model_tokenize(b->m, rp->text, len, fl, NULL, 0, &n);
        if (st != TSR_OK && st != TSR_E_RANGE)
            return st;
        if (!(r->prompt = tsr__malloc((n ? n : 1) * sizeof(int32_t))))
            return tsr__error(TSR_E_NOMEM, "out of host memory");
        if ((st = tsr_model_tokenize(b->m, rp->text, len, fl, r->prompt, n, &n)) != TSR_OK)
            return st;
        r->n_prompt = (int64_t)n;
    }
    const int32_t nv = tsr_model_n_vocab(b->m);
    for (int64_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= nv)
            return tsr__error(TSR_E_INVALID, "prompt token %lld: id %d is outside the vocabulary", (long long)i,
                              r->prompt[i]);
    if (r->n_prompt == 0)
        return tsr__error(TSR_E_INVALID, "the prompt is empty");
    if (r->n_prompt >= b->p.n_ctx_slot)
        return tsr__error(TSR_E_RANGE, "a prompt of %lld tokens leaves no room in a slot of %lld cells",
                          (long long)r->n_prompt, (long long)b->p.n_ctx_slot);
    return TSR_OK;
}

static tsr_status req_stops(const tsr_request_params *rp, breq *r) {
    if (rp->n_stop == 0)
        return TSR_OK;
    if (!rp->stop || !(r->stop = tsr__calloc(rp->n_stop, sizeof *r->stop)))
        return tsr__error(rp->stop ? TSR_E_NOMEM : TSR_E_INVALID, "stop: %s",
                          rp->stop ? "out of host memory" : "NULL with n_stop > 0");
    for (size_t i = 0; i < rp->n_stop; i++) {
        if (!rp->stop[i] || !rp->stop[i][0])
            return tsr__error(TSR_E_INVALID, "stop[%zu] is NULL or empty", i);
        if (!(r->stop[i] = tsr__strdup(rp->stop[i])))
            return tsr__error(TSR_E_NOMEM, "out of host memory");
        r->n_stop = i + 1;
        size_t l = strlen(r->stop[i]);
        r->max_stop = l > r->max_stop ? l : r->max_stop;
    }
    return TSR_OK;
}

static tsr_status req_make(tsr_batcher *b, const tsr_request_params *rp, breq *r) {
    if (!rp->tokens && !rp->text)
        return tsr__error(TSR_E_INVALID, "no prompt (tokens and text are NULL)");
    if (rp->n_top_logprobs < 0 || rp->n_top_logprobs > TOP_MAX)
        return tsr__error(TSR_E_INVALID, "n_top_logprobs %d is not within 0..%d", (int)rp->n_top_logprobs, TOP_MAX);
    r->n_top = rp->n_top_logprobs;
    tsr_status st = req_prompt(b, rp, r);
    if (st == TSR_OK)
        st = req_stops(rp, r);
    tsr_sampler_params sp;
    tsr_sampler_params_init(&sp, sizeof sp);
    sp.temp = 0.0f;
    if (st == TSR_OK && (st = tsr_sampler_new(b->m, rp->sampling ? rp->sampling : &sp, &r->smp)) != TSR_OK)
        return st;
    r->max_tokens = rp->max_tokens > 0 ? rp->max_tokens : b->p.n_ctx_slot;
    if (st == TSR_OK && !(r->gen = tsr__malloc((size_t)b->p.n_ctx_slot * sizeof *r->gen)))
        st = tsr__error(TSR_E_NOMEM, "out of host memory");
    r->cb = rp->callback;
    r->user = rp->user;
    r->slot = -1;
    return st;
}

static size_t n_queued(const tsr_batcher *b) {
    size_t n = 0;
    for (const breq *r = b->reqs; r; r = r->next) n += r->state == REQ_QUEUED;
    return n;
}

tsr_status tsr_batcher_submit(tsr_batcher *b, const tsr_request_params *r, uint64_t *id) {
    if (!b || !r || !id)
        return tsr__error(TSR_E_INVALID, "tsr_batcher_submit: NULL %s", !b ? "batcher" : !r ? "request" : "id");
    *id = 0;
    tsr_request_params rp;
    tsr_request_params_init(&rp, sizeof rp);
    read_params(&rp, sizeof rp, r);
    breq *q = tsr__calloc(1, sizeof *q);
    if (!q)
        return tsr__error(TSR_E_NOMEM, "tsr_batcher_submit: out of host memory");
    tsr_status st = req_make(b, &rp, q);
    if (st != TSR_OK) {
        req_free(q);
        return tsr__error(st, "tsr_batcher_submit: %s", tsr_last_error());
    }
    pthread_mutex_lock(&b->mu);
    if (b->p.n_queue_max > 0 && n_queued(b) >= (size_t)b->p.n_queue_max) {
        pthread_mutex_unlock(&b->mu);
        req_free(q);
        return tsr__error(TSR_E_FULL, "tsr_batcher_submit: %lld requests already wait", (long long)b->p.n_queue_max);
    }
    q->id = b->next_id++;
    breq **tail = &b->reqs;
    while (*tail) tail = &(*tail)->next;
    *tail = q;
    *id = q->id;
    pthread_mutex_unlock(&b->mu);
    return TSR_OK;
}

static breq *find(const tsr_batcher *b, uint64_t id) {
    for (breq *r = b->reqs; r; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

tsr_status tsr_batcher_cancel(tsr_batcher *b, uint64_t id) {
    if (!b)
        return tsr__error(TSR_E_INVALID, "tsr_batcher_cancel: NULL batcher");
    pthread_mutex_lock(&b->mu);
    breq *r = find(b, id);
    if (r)
        r->cancel = 1;
    pthread_mutex_unlock(&b->mu);
    return r ? TSR_OK : tsr__error(TSR_E_NOT_FOUND, "tsr_batcher_cancel: no request %llu", (unsigned long long)id);
}

tsr_status tsr_batcher_poll(tsr_batcher *b, uint64_t id, int32_t *tokens, size_t cap, size_t *n_tokens, int *finish) {
    if (!b || !n_tokens || (cap > 0 && !tokens))
        return tsr__error(TSR_E_INVALID, "tsr_batcher_poll: NULL argument");
    pthread_mutex_lock(&b->mu);
    breq *r = find(b, id);
    if (r) {
        *n_tokens = (size_t)r->n_gen;
        const size_t n = (size_t)r->n_gen < cap ? (size_t)r->n_gen : cap;
        if (n) /* (tokens may be NULL with cap 0) */
            memcpy(tokens, r->gen, n * sizeof *tokens);
        if (finish)
            *finish = r->finish;
    }
    pthread_mutex_unlock(&b->mu);
    return r ? TSR_OK : tsr__error(TSR_E_NOT_FOUND, "tsr_batcher_poll: no request %llu", (unsigned long long)id);
}

tsr_status tsr_batcher_text(tsr_batcher *b, uint64_t id, char *buf, size_t cap, size_t *len) {
    if (!b || !len || (cap > 0 && !buf))
        return tsr__error(TSR_E_INVALID, "tsr_batcher_text: NULL argument");
    pthread_mutex_lock(&b->mu);
    breq *r = find(b, id);
    tsr_status st = r ? TSR_OK
                      : tsr__error(TSR_E_NOT_FOUND, "tsr_batcher_text: no request %llu", (unsigned long long)id);
    if (r) {
        /* a running request's text ends where its events do (a stop string may be pending) */
        size_t n = r->state == REQ_DONE ? r->n_text : r->n_sent;
        *len = n;
        if (n < cap) {
            if (n) /* (no text yet: r->text may be NULL) */
                memcpy(buf, r->text, n);
            buf[n] = '\0';
        } else {
            st = tsr__error(TSR_E_RANGE, "tsr_batcher_text: %zu bytes, the buffer holds %zu", n + 1, cap);
        }
    }
    pthread_mutex_unlock(&b->mu);
    return st;
}

static void unlink_req(tsr_batcher *b, breq *r) {
    for (breq **p = &b->reqs; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            return;
        }
}

tsr_status tsr_batcher_release(tsr_batcher *b, uint64_t id) {
    if (!b)
        return tsr__error(TSR_E_INVALID, "tsr_batcher_release: NULL batcher");
    pthread_mutex_lock(&b->mu);
    breq *r = find(b, id);
    tsr_status st = TSR_OK;
    if (!r)
        st = tsr__error(TSR_E_NOT_FOUND, "tsr_batcher_release: no request %llu", (unsigned long long)id);
    else if (r->state != REQ_DONE)
        st = tsr__error(TSR_E_STATE, "tsr_batcher_release: request %llu is still running", (unsigned long long)id);
    else
        unlink_req(b, r);
    pthread_mutex_unlock(&b->mu);
    if (st == TSR_OK)
        req_free(r);
    return st;
}

void tsr_batcher_counts(tsr_batcher *b, size_t *running, size_t *waiting, int64_t *cells_used) {
    size_t run = 0, wait = 0;
    int64_t cells = 0;
    if (b) {
        pthread_mutex_lock(&b->mu);
        for (const breq *r = b->reqs; r; r = r->next) {
            run += r->state == REQ_PREFILL || r->state == REQ_DECODE;
            wait += r->state == REQ_QUEUED;
        }
        for (int32_t i = 0; i < b->p.n_slots; i++) cells += b->slots[i].n_held;
        pthread_mutex_unlock(&b->mu);
    }
    if (running)
        *running = run;
    if (waiting)
        *waiting = wait;
    if (cells_used)
        *cells_used = cells;
}

/* ---- events and text ------------------------------------------------------- */

/* Bytes at the end of t[0..n) that begin an unfinished UTF-8 character. */
static size_t utf8_partial(const char *t, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char c = (unsigned char)t[n - k];
        if ((c & 0xC0) == 0x80)
            continue; /* a continuation byte: look further back */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > k ? k : 0;
    }
    return 0;
}

/* The longest end of t[0..n) that begins some stop string (held back). */
static size_t stop_prefix(const breq *r, size_t n) {
    size_t best = 0;
    for (size_t i = 0; i < r->n_stop; i++) {
        size_t l = strlen(r->stop[i]);
        for (size_t k = l - 1 < n ? l - 1 : n; k > best; k--)
            if (memcmp(r->text + n - k, r->stop[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

/* The first stop string in the text that ends after byte `from`: its start, or -1. */
static int64_t find_stop(const breq *r, size_t from) {
    int64_t at = -1;
    size_t start = from > r->max_stop ? from - r->max_stop : 0;
    for (size_t i = 0; i < r->n_stop; i++) {
        size_t l = strlen(r->stop[i]);
        for (size_t p = start; l > 0 && p + l <= r->n_text; p++)
            if (memcmp(r->text + p, r->stop[i], l) == 0) {
                if (at < 0 || (int64_t)p < at)
                    at = (int64_t)p;
                break;
            }
    }
    return at;
}

static int append_text(breq *r, const char *s, size_t n) {
    if (n == 0) /* (an empty piece: nothing to copy, r->text may still be NULL) */
        return 1;
    if (r->n_text + n > r->cap_text) {
        size_t cap = r->cap_text ? r->cap_text * 2 : 256;
        while (cap < r->n_text + n) cap *= 2;
        char *t = tsr__realloc(r->text, cap);
        if (!t)
            return 0;
        r->text = t;
        r->cap_text = cap;
    }
    memcpy(r->text + r->n_text, s, n);
    r->n_text += n;
    return 1;
}

/* Sends an event with the text that may go out now (all of it once the
 * request finishes); a non-zero return of the callback cancels. */
static void emit_top(breq *r, int32_t token, float logprob, size_t n_top, const int32_t *top_tokens,
                     const float *top_logprobs) {
    size_t end = r->n_text;
    if (r->finish == TSR_FINISH_NONE) {
        end -= stop_prefix(r, end);
        end -= utf8_partial(r->text, end);
    }
    if (end < r->n_sent)
        end = r->n_sent;
    tsr_batch_event ev;
    memset(&ev, 0, sizeof ev);
    ev.size = sizeof ev;
    ev.id = r->id;
    ev.token = token;
    ev.logprob = logprob;
    ev.text = r->text ? r->text + r->n_sent : "";
    ev.text_len = end - r->n_sent;
    ev.finish = r->finish;
    ev.n_prompt = r->n_prompt;
    ev.n_cached = r->n_cached;
    ev.n_generated = r->n_gen;
    ev.n_top = n_top;
    ev.top_tokens = n_top ? top_tokens : NULL;
    ev.top_logprobs = n_top ? top_logprobs : NULL;
    r->n_sent = end;
    if (r->cb && r->cb(r->user, &ev) != 0 && r->finish == TSR_FINISH_NONE)
        r->cancel = 1;
}

static void emit(breq *r, int32_t token, float logprob) { emit_top(r, token, logprob, 0, NULL, NULL); }

/* Ends r with reason f: frees its slot (the cells stay for the next
 * prompt with the same prefix) and sends the last event. */
static void finish(tsr_batcher *b, breq *r, int f) {
    if (r->slot >= 0)
        b->slots[r->slot].req = NULL;
    r->state = REQ_DONE;
    r->finish = f;
    emit(r, -1, 0.0f);
}

/* Samples r's next token from logits and sends it. */
static void take_token(tsr_batcher *b, breq *r, const float *logits) {
    int32_t tok = tsr_sampler_sample(r->smp, logits);
    float lp = 0.0f, top_lp[TOP_MAX];
    int32_t top_tok[TOP_MAX];
    size_t n_top = (size_t)r->n_top;
    if (tsr_sampler_logprobs(r->smp, logits, tok, &lp, n_top, top_tok, top_lp) != TSR_OK)
        n_top = 0;
    if (tsr_model_token_is_eog(b->m, tok)) {
        finish(b, r, TSR_FINISH_STOP);
        return;
    }
    r->gen[r->n_gen++] = tok;
    r->last = tok;
    char piece[256];
    size_t len = 0, from = r->n_text;
    if (tsr_model_token_piece(b->m, tok, 0, piece, sizeof piece, &len) != TSR_OK || !append_text(r, piece, len)) {
        finish(b, r, TSR_FINISH_ERROR);
        return;
    }
    int64_t at = find_stop(r, from);
    if (at >= 0) {
        r->n_text = (size_t)at;
        r->finish = TSR_FINISH_STOP; /* the token's event carries the finish */
        r->state = REQ_DONE;
        b->slots[r->slot].req = NULL;
        emit_top(r, tok, lp, n_top, top_tok, top_lp);
        return;
    }
    emit_top(r, tok, lp, n_top, top_tok, top_lp);
    const bslot *sl = &b->slots[r->slot];
    if (r->n_gen >= r->max_tokens || sl->n_held + 1 >= b->p.n_ctx_slot)
        finish(b, r, TSR_FINISH_LENGTH);
}

/* ---- step ------------------------------------------------------------------ */

static int64_t common_prefix(const bslot *sl, const breq *r) {
    int64_t n = 0;
    while (n < sl->n_held && n < r->n_prompt && sl->toks[n] == r->prompt[n]) n++;
    return n;
}

/* Puts r into a free slot; false when none is free. The slot is the free
 * one holding the longest common prefix with the prompt when that is at
 * least half of it (llama-server's slot similarity), else the free slot
 * used least recently, so that the other slots keep their prompts for
 * later requests; then, when another slot, free or running, holds a
 * longer prefix, its cells are copied in (tsr_session_seq_copy: a prompt
 * shared by several requests, or asked again while its first slot was
 * taken, is decoded once). At least one prompt token is decoded again,
 * for its logits. */
static bool admit(tsr_batcher *b, breq *r) {
    int32_t best = -1, lru = -1, src = -1;
    int64_t best_n = -1, src_n = 0;
    for (int32_t i = 0; i < b->p.n_slots; i++) {
        const bslot *sl = &b->slots[i];
        const int64_t n = common_prefix(sl, r);
        if (n > src_n)
            src = i, src_n = n;
        if (sl->req)
            continue;
        if (n > best_n)
            best = i, best_n = n;
        if (lru < 0 || sl->used < b->slots[lru].used)
            lru = i;
    }
    if (best < 0)
        return false;
    if (2 * best_n < r->n_prompt)
        best = lru, best_n = common_prefix(&b->slots[lru], r);
    bslot *sl = &b->slots[best];
    const int64_t cap = r->n_prompt - 1; /* (the last prompt token is decoded again) */
    int64_t keep = best_n < cap ? best_n : cap;
    if (src >= 0 && src != best && (src_n < cap ? src_n : cap) > keep) {
        const int64_t n = src_n < cap ? src_n : cap;
        if (tsr_session_seq_copy(b->s, src, best, 0, (int32_t)n) == TSR_OK) {
            memcpy(sl->toks, b->slots[src].toks, (size_t)n * sizeof *sl->toks);
            sl->n_held = keep = n;
        }
    }
    tsr_session_remove(b->s, best, (int32_t)keep, -1);
    sl->n_held = keep;
    sl->req = r;
    sl->used = ++b->tick;
    r->slot = best;
    r->n_done = r->n_cached = keep;
    r->state = REQ_PREFILL;
    return true;
}

/* Cancelled requests end; queued ones take free slots (in order). */
static void settle_requests(tsr_batcher *b) {
    for (breq *r = b->reqs; r; r = r->next)
        if (r->cancel && r->state != REQ_DONE)
            finish(b, r, TSR_FINISH_CANCELLED);
    for (breq *r = b->reqs; r; r = r->next)
        if (r->state == REQ_QUEUED && !admit(b, r))
            break;
}

static void add(tsr_batcher *b, size_t *n, breq *r, int32_t tok, int8_t want) {
    bslot *sl = &b->slots[r->slot];
    b->b_tok[*n] = tok;
    b->b_pos[*n] = (int32_t)sl->n_held;
    b->b_seq[*n] = r->slot;
    b->b_want[*n] = want;
    b->b_req[*n] = r;
    sl->toks[sl->n_held++] = tok;
    (*n)++;
}

/* The step's batch: every decode first (one token each), then prompt
 * chunks within what is left of n_batch. */
static size_t build(tsr_batcher *b) {
    size_t n = 0, cap = (size_t)b->p.n_batch;
    for (breq *r = b->reqs; r; r = r->next)
        if (r->state == REQ_DECODE)
            add(b, &n, r, r->last, 1);
    for (breq *r = b->reqs; r && n < cap; r = r->next) {
        if (r->state != REQ_PREFILL)
            continue;
        int64_t chunk = r->n_prompt - r->n_done;
        chunk = chunk < b->p.n_ubatch ? chunk : b->p.n_ubatch;
        chunk = chunk < (int64_t)(cap - n) ? chunk : (int64_t)(cap - n);
        for (int64_t i = 0; i < chunk; i++) {
            int64_t k = r->n_done++;
            add(b, &n, r, r->prompt[k], r->n_done == r->n_prompt);
        }
    }
    return n;
}

/* After the decode: each row wanted gives its request a token. Requests
 * cancelled meanwhile end without one. */
static void collect(tsr_batcher *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        breq *r = b->b_req[i];
        if (!b->b_want[i] || r->state == REQ_DONE)
            continue;
        if (r->cancel) {
            finish(b, r, TSR_FINISH_CANCELLED);
            continue;
        }
        r->state = REQ_DECODE;
        take_token(b, r, tsr_session_logits(b->s, i));
    }
}

/* A failed decode: its cells are forgotten (the session did), so are the
 * slots' records of them; the requests in it end with an error. */
static void fail(tsr_batcher *b, size_t n) {
    for (size_t i = n; i-- > 0;) {
        bslot *sl = &b->slots[b->b_seq[i]];
        if (sl->n_held > b->b_pos[i])
            sl->n_held = b->b_pos[i];
        if (b->b_req[i]->state != REQ_DONE)
            finish(b, b->b_req[i], TSR_FINISH_ERROR);
    }
}

/* Requests that wait can be made to, or that run: what is left to do. */
static size_t active(const tsr_batcher *b) {
    size_t n = 0;
    for (const breq *r = b->reqs; r; r = r->next) n += r->state != REQ_DONE;
    return n;
}

/* Callback requests are forgotten once done (their results went out). */
static void drop_done(tsr_batcher *b) {
    for (breq **p = &b->reqs; *p;) {
        breq *r = *p;
        if (r->state == REQ_DONE && r->cb) {
            *p = r->next;
            req_free(r);
        } else {
            p = &r->next;
        }
    }
}

tsr_status tsr_batcher_step(tsr_batcher *b, size_t *n_active) {
    if (n_active)
        *n_active = 0;
    if (!b)
        return tsr__error(TSR_E_INVALID, "tsr_batcher_step: NULL batcher");
    pthread_mutex_lock(&b->mu);
    settle_requests(b);
    size_t n = build(b);
    pthread_mutex_unlock(&b->mu);
    tsr_status st = n ? tsr_session_decode(b->s, n, b->b_tok, b->b_pos, b->b_seq, b->b_want) : TSR_OK;
    pthread_mutex_lock(&b->mu);
    if (st == TSR_OK)
        collect(b, n);
    else
        fail(b, n);
    drop_done(b);
    if (n_active)
        *n_active = active(b);
    pthread_mutex_unlock(&b->mu);
    return st == TSR_OK ? TSR_OK : tsr__error(st, "tsr_batcher_step: %s", tsr_last_error());
}
