/*
 * tensr-server - an OpenAI-compatible HTTP server over libtensr's batching
 * scheduler (tsr_batcher): HTTP by GNU libmicrohttpd (a thread per
 * connection), JSON by jansson. One stepping thread drives the batcher;
 * connection threads submit requests and wait for their events.
 *
 * Endpoints: POST /v1/chat/completions, POST /v1/completions (SSE when
 * "stream": true), GET /v1/models, POST /tokenize, POST /detokenize,
 * GET /health, GET /metrics (Prometheus text), GET / (the chat page, from
 * chat.html compiled in). Errors in OpenAI's shape. Bound to 127.0.0.1
 * unless --host says otherwise; with --api-key every route but /health and
 * / needs "Authorization: Bearer KEY" (compared in constant time). CORS
 * only for the origins --cors-origin lists. SIGTERM stops accepting, lets
 * the running requests finish (at most --timeout seconds), then exits 0.
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include <libtensr.h>

#include "../fit-target.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BODY_MAX (8u << 20)
#define MAX_STOP 4
#define JSON_DEPTH_MAX 64
#define TOP_MAX 20

extern const char tsr_chat_page[]; /* chat.html as a C string (Makefile.am writes it at build time) */

typedef struct opts {
    const char *model, *host, *api_key, *overrides, *cors, *fit_target;
    int port, n_threads, n_slots, flash_attn, n_gpu_layers, verbose, batch_invariant;
    int ngl_given, fit_print; /* -ngl given (0 too: no fit); --fit-print */
    int64_t n_ctx, n_batch, n_ubatch, max_queued, timeout_s, keepalive_s;
    size_t amb;
} opts;

static opts o;
static tsr_backend *backend;
static tsr_model *model;
static tsr_batcher *batcher;
static char model_id[256];
static pthread_mutex_t step_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t step_cv = PTHREAD_COND_INITIALIZER;
static int stopping;
static atomic_int draining, drain_expired; /* SIGTERM seen; --timeout passed since */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static int n_live; /* completions being answered (a stream until its connection ends) */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void live_add(int d) {
    pthread_mutex_lock(&live_mu);
    n_live += d;
    pthread_mutex_unlock(&live_mu);
}

/* ---- metrics: counters and histograms (Prometheus text at GET /metrics) --- */

enum { H_TTFT, H_ITL, H_QUEUE, H_E2E, N_HIST };
static const double hist_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                 1,     2.5,    5,     10,   30,    60,   120, 300};
#define N_LE (sizeof hist_le / sizeof hist_le[0])
static const struct {
    const char *name, *help;
} hist_info[N_HIST] = {
    {"tensr_time_to_first_token_seconds", "Time from a request's arrival to its first generated token."},
    {"tensr_inter_token_latency_seconds", "Time between two consecutive generated tokens of a request."},
    {"tensr_request_queue_time_seconds", "Time a request waited in the queue before it got a slot."},
    {"tensr_e2e_request_latency_seconds", "Time from a request's arrival to its last token."},
};
static const unsigned status_codes[] = {200, 204, 400, 401, 403, 404, 405, 413, 429, 500, 503};
#define N_CODES (sizeof status_codes / sizeof status_codes[0])

static struct {
    pthread_mutex_t mu;
    uint64_t bucket[N_HIST][N_LE + 1]; /* last: +Inf */
    double sum[N_HIST];
    uint64_t by_code[N_CODES + 1]; /* last: any other status */
    uint64_t prompt_tokens, gen_tokens, cached_tokens;
} met = {PTHREAD_MUTEX_INITIALIZER, {{0}}, {0}, {0}, 0, 0, 0};

static void observe(int h, double v) {
    size_t i = 0;
    while (i < N_LE && v > hist_le[i]) i++;
    pthread_mutex_lock(&met.mu);
    met.bucket[h][i]++;
    met.sum[h] += v;
    pthread_mutex_unlock(&met.mu);
}

static void count_status(unsigned code) {
    size_t i = 0;
    while (i < N_CODES && status_codes[i] != code) i++;
    pthread_mutex_lock(&met.mu);
    met.by_code[i]++;
    pthread_mutex_unlock(&met.mu);
}

/* ---- a request's results, shared by the stepping thread (events) and the
 * connection's thread (waits for them). Lock order: the batcher's lock,
 * then j->mu (on_event runs inside the step); so no batcher call is made
 * while j->mu is held. ---------------------------------------------------- */

typedef struct job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs; /* the connection and the batcher (until its last event) */
    uint64_t id;
    char *text; /* text not yet sent (stream) or all of it */
    size_t n_text, cap_text;
    int finish;
    int64_t n_prompt, n_cached, n_gen;
    /* the response */
    int chat, stream, include_usage;
    char *out; /* SSE bytes not yet handed to the connection */
    size_t n_out, cap_out, pos_out;
    int sent_role, done;
    time_t created;
    /* logprobs (want_lp): one entry per generated token; lp[0..lp_sent) went out */
    int want_lp, n_top;
    struct lp_entry *lp;
    size_t n_lp, cap_lp, lp_sent, lp_offset; /* lp_offset: completions' text_offset */
    /* metrics (seconds, now_s) */
    double t_submit, t_first, t_prev, t_quiet; /* t_quiet: the stream's last bytes */
    struct job *next_pending;                  /* the admission list (pending_mu) */
    int fd; /* the connection's socket (a stream watches it for the client leaving) */
} job;

typedef struct lp_entry {
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_token[TOP_MAX];
    float top_logprob[TOP_MAX];
} lp_entry;

static void job_unref(job *j) {
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0)
        return;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j->text);
    free(j->out);
    free(j->lp);
    free(j);
}

static int grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap)
        return 1;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *n = realloc(*buf, c);
    if (!n)
        return 0;
    *buf = n;
    *cap = c;
    return 1;
}

/* The batcher's callback: on the stepping thread, with the batcher locked. */
static int on_event(void *user, const tsr_batch_event *ev) {
    job *j = user;
    double t = now_s();
    pthread_mutex_lock(&j->mu);
    if (ev->token >= 0) {
        if (j->t_first == 0) {
            j->t_first = t;
            observe(H_TTFT, t - j->t_submit);
        } else {
            observe(H_ITL, t - j->t_prev);
        }
        j->t_prev = t;
        if (j->want_lp && j->n_lp < (size_t)1 << 24) {
            size_t cap = j->cap_lp * sizeof *j->lp;
            char *p = (char *)j->lp;
            if (grow(&p, &cap, (j->n_lp + 1) * sizeof *j->lp)) {
                j->lp = (lp_entry *)(void *)p;
                j->cap_lp = cap / sizeof *j->lp;
                lp_entry *e = &j->lp[j->n_lp++];
                e->token = ev->token;
                e->logprob = ev->logprob;
                e->n_top = ev->size >= sizeof *ev && ev->top_tokens ? (int)ev->n_top : 0;
                if (e->n_top > TOP_MAX)
                    e->n_top = TOP_MAX;
                for (int i = 0; i < e->n_top; i++) {
                    e->top_token[i] = ev->top_tokens[i];
                    e->top_logprob[i] = ev->top_logprobs[i];
                }
            }
        }
    }
    if (ev->finish) {
        observe(H_E2E, t - j->t_submit);
        pthread_mutex_lock(&met.mu);
        met.prompt_tokens += (uint64_t)ev->n_prompt;
        met.cached_tokens += (uint64_t)ev->n_cached;
        met.gen_tokens += (uint64_t)ev->n_generated;
        pthread_mutex_unlock(&met.mu);
    }
    if (ev->text_len && grow(&j->text, &j->cap_text, j->n_text + ev->text_len)) {
        memcpy(j->text + j->n_text, ev->text, ev->text_len);
        j->n_text += ev->text_len;
    }
    j->n_prompt = ev->n_prompt;
    j->n_cached = ev->n_cached;
    j->n_gen = ev->n_generated;
    if (ev->finish)
        j->finish = ev->finish;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (ev->finish)
        job_unref(j);
    return 0;
}

/* ---- the stepping thread -------------------------------------------------- */

static void wake_stepper(void) {
    pthread_mutex_lock(&step_mu);
    pthread_cond_signal(&step_cv);
    pthread_mutex_unlock(&step_mu);
}

/* Requests submitted and not yet seen in a slot, in submission order (the
 * batcher's queue order: it admits first come, first served). Submission
 * appends under pending_mu, so the list and the batcher's queue agree; after
 * each step the stepper takes from its head as many as left the queue. */
static pthread_mutex_t pending_mu = PTHREAD_MUTEX_INITIALIZER;
static job *pending_head, *pending_tail;

static void job_unref(job *j);

/* After a step that began at t0: the requests no longer waiting were
 * admitted at its start (queue time t0 - arrival). Lock order: pending_mu,
 * then the batcher's lock, then j->mu. */
static void note_admitted(double t0) {
    pthread_mutex_lock(&pending_mu);
    size_t waiting = 0, n = 0;
    tsr_batcher_counts(batcher, NULL, &waiting, NULL);
    /* finished ones first (a request cancelled in the queue never had a slot) */
    job **pp = &pending_head, *last = NULL;
    while (*pp) {
        job *j = *pp;
        pthread_mutex_lock(&j->mu);
        int fin = j->finish, gen = j->n_gen > 0 || j->t_first > 0;
        pthread_mutex_unlock(&j->mu);
        if (!fin) {
            last = j;
            pp = &j->next_pending;
            n++;
            continue;
        }
        *pp = j->next_pending;
        if (fin != TSR_FINISH_CANCELLED || gen)
            observe(H_QUEUE, t0 > j->t_submit ? t0 - j->t_submit : 0.0);
        job_unref(j);
    }
    pending_tail = last;
    while (pending_head && n > waiting) {
        job *j = pending_head;
        pending_head = j->next_pending;
        if (!pending_head)
            pending_tail = NULL;
        n--;
        observe(H_QUEUE, t0 > j->t_submit ? t0 - j->t_submit : 0.0);
        job_unref(j);
    }
    pthread_mutex_unlock(&pending_mu);
}

static void *stepper(void *arg) {
    (void)arg;
    for (;;) {
        size_t active = 0;
        double t0 = now_s();
        if (tsr_batcher_step(batcher, &active) != TSR_OK)
            fprintf(stderr, "tensr-server: step: %s\n", tsr_last_error());
        note_admitted(t0);
        if (active)
            continue;
        pthread_mutex_lock(&step_mu);
        if (stopping) {
            pthread_mutex_unlock(&step_mu);
            return NULL;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&step_cv, &step_mu, &ts);
        pthread_mutex_unlock(&step_mu);
    }
}

/* ---- HTTP helpers ---------------------------------------------------------- */

typedef struct conn {
    char *body;
    size_t n_body;
    int too_big;
} conn;

/* The request's Origin when --cors-origin lists it (or lists "*"), else NULL. */
static const char *cors_origin(struct MHD_Connection *c) {
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!o.cors || !origin || !*origin)
        return NULL;
    size_t lo = strlen(origin);
    for (const char *p = o.cors; *p;) {
        size_t l = strcspn(p, ",");
        if ((l == 1 && *p == '*') || (l == lo && strncmp(p, origin, l) == 0))
            return origin;
        p += l;
        p += *p == ',';
    }
    return NULL;
}

/* Queues r with the headers every response gets (CORS, Retry-After) and
 * counts its status for /metrics. */
static enum MHD_Result respond(struct MHD_Connection *c, unsigned code, struct MHD_Response *r) {
    const char *origin = cors_origin(c);
    if (origin) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(r, "Vary", "Origin");
    }
    if (code == 429 || code == 503)
        MHD_add_response_header(r, "Retry-After", "1");
    count_status(code);
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned code, json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    if (!s)
        return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    return respond(c, code, r);
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned code, const char *type, const char *param,
                                  const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *e = json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", msg, "type", type, "param",
                          param ? json_string(param) : json_null(), "code", json_null());
    return send_json(c, code, e);
}

/* Constant-time comparison of the bearer token with the key. */
static int key_ok(struct MHD_Connection *c) {
    if (!o.api_key)
        return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0)
        return 0;
    h += 7;
    size_t lk = strlen(o.api_key), lh = strlen(h);
    unsigned char diff = (unsigned char)(lk != lh);
    for (size_t i = 0; i < lk; i++) diff |= (unsigned char)(o.api_key[i] ^ (i < lh ? h[i] : 0));
    return diff == 0;
}

/* ---- request parsing ------------------------------------------------------- */

typedef struct req {
    tsr_sampler_params sp;
    tsr_logit_bias bias[300];
    const char *stop[MAX_STOP];
    size_t n_stop;
    int64_t max_tokens;
    int stream, include_usage;
    int want_lp, n_top; /* logprobs asked for, and how many top alternatives */
    char *prompt;       /* formatted text (malloc) */
} req;

/* A bad field: its name and what is wrong, for a 400. */
typedef struct bad {
    const char *param;
    char msg[256];
} bad;

static int fail(bad *b, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->msg, sizeof b->msg, fmt, ap);
    va_end(ap);
    b->param = param;
    return 0;
}

static int num(json_t *body, const char *key, double lo, double hi, double *out, bad *b) {
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return 1;
    if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi)
        return fail(b, key, "'%s' must be a number within %g..%g", key, lo, hi);
    *out = json_number_value(v);
    return 1;
}

static int parse_sampling(json_t *body, req *r, bad *b) {
    double t = 1.0, top_p = 1.0, min_p = 0.0, rp = 1.0, pp = 0.0, fp = 0.0, top_k = 0, seed = -1, mt = -1, mct = -1;
    if (!num(body, "temperature", 0, 2, &t, b) || !num(body, "top_p", 0, 1, &top_p, b) ||
        !num(body, "min_p", 0, 1, &min_p, b) || !num(body, "repeat_penalty", 0.01, 100, &rp, b) ||
        !num(body, "presence_penalty", -2, 2, &pp, b) || !num(body, "frequency_penalty", -2, 2, &fp, b) ||
        !num(body, "top_k", 0, 1e6, &top_k, b) || !num(body, "seed", -1e18, 1e18, &seed, b) ||
        !num(body, "max_tokens", 0, 1e9, &mt, b) || !num(body, "max_completion_tokens", 0, 1e9, &mct, b))
        return 0;
    tsr_sampler_params_init(&r->sp, sizeof r->sp);
    r->sp.temp = (float)t;
    r->sp.top_p = (float)top_p;
    r->sp.min_p = (float)min_p;
    r->sp.top_k = (int32_t)top_k;
    r->sp.repeat_penalty = (float)rp;
    r->sp.presence_penalty = (float)pp;
    r->sp.freq_penalty = (float)fp;
    if (seed >= 0)
        r->sp.seed = (uint64_t)seed;
    r->max_tokens = mct >= 0 ? (int64_t)mct : mt >= 0 ? (int64_t)mt : 0;
    json_t *lb = json_object_get(body, "logit_bias");
    if (lb && !json_is_null(lb)) {
        if (!json_is_object(lb) || json_object_size(lb) > sizeof r->bias / sizeof r->bias[0])
            return fail(b, "logit_bias", "'logit_bias' must be an object of at most 300 token ids");
        const char *k;
        json_t *v;
        json_object_foreach(lb, k, v) {
            char *end = NULL;
            long id = strtol(k, &end, 10);
            if (!*k || *end || id < 0 || id >= tsr_model_n_vocab(model) || !json_is_number(v) ||
                json_number_value(v) < -100 || json_number_value(v) > 100)
                return fail(b, "logit_bias", "'logit_bias': '%s' is no token id, or its bias is not within -100..100",
                            k);
            r->bias[r->sp.n_logit_bias].token = (int32_t)id;
            r->bias[r->sp.n_logit_bias++].bias = (float)json_number_value(v);
        }
        r->sp.logit_bias = r->bias;
    }
    return 1;
}

/* Chat: "logprobs" a boolean and "top_logprobs" 0..20 (which needs
 * logprobs); completions: "logprobs" an integer 0..20, the alternatives. */
static int parse_logprobs(json_t *body, int chat, req *r, bad *b) {
    json_t *lp = json_object_get(body, "logprobs"), *top = json_object_get(body, "top_logprobs");
    if (lp && json_is_null(lp))
        lp = NULL;
    if (top && json_is_null(top))
        top = NULL;
    if (chat) {
        if (lp && !json_is_boolean(lp))
            return fail(b, "logprobs", "'logprobs' must be a boolean");
        if (top && (!json_is_integer(top) || json_integer_value(top) < 0 || json_integer_value(top) > TOP_MAX))
            return fail(b, "top_logprobs", "'top_logprobs' must be an integer within 0..%d", TOP_MAX);
        r->want_lp = lp && json_is_true(lp);
        r->n_top = top ? (int)json_integer_value(top) : 0;
        if (r->n_top && !r->want_lp)
            return fail(b, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        return 1;
    }
    if (top)
        return fail(b, "top_logprobs", "'top_logprobs' is a chat field; completions take an integer 'logprobs'");
    if (lp && (!json_is_integer(lp) || json_integer_value(lp) < 0 || json_integer_value(lp) > TOP_MAX))
        return fail(b, "logprobs", "'logprobs' must be an integer within 0..%d", TOP_MAX);
    r->want_lp = lp != NULL;
    r->n_top = lp ? (int)json_integer_value(lp) : 0;
    return 1;
}

static int parse_common(json_t *body, int chat, req *r, bad *b) {
    json_t *m = json_object_get(body, "model");
    if (m && !json_is_null(m) && !json_is_string(m))
        return fail(b, "model", "'model' must be a string");
    if (json_object_get(body, "tools") && !json_is_null(json_object_get(body, "tools")))
        return fail(b, "tools", "'tools' is not supported");
    json_t *rf = json_object_get(body, "response_format");
    if (rf && !json_is_null(rf) &&
        (!json_is_object(rf) || !json_is_string(json_object_get(rf, "type")) ||
         strcmp(json_string_value(json_object_get(rf, "type")), "text") != 0))
        return fail(b, "response_format", "'response_format' other than text is not supported");
    json_t *n = json_object_get(body, "n");
    if (n && !json_is_null(n) && (!json_is_integer(n) || json_integer_value(n) != 1))
        return fail(b, "n", "'n' other than 1 is not supported (one choice per request)");
    if (!parse_logprobs(body, chat, r, b) || !parse_sampling(body, r, b))
        return 0;
    json_t *st = json_object_get(body, "stream");
    if (st && !json_is_null(st) && !json_is_boolean(st))
        return fail(b, "stream", "'stream' must be a boolean");
    r->stream = st && json_is_true(st);
    json_t *so = json_object_get(body, "stream_options");
    r->include_usage = so && json_is_object(so) && json_is_true(json_object_get(so, "include_usage"));
    json_t *stop = json_object_get(body, "stop");
    if (stop && json_is_string(stop) && json_string_length(stop) > 0) {
        r->stop[r->n_stop++] = json_string_value(stop);
    } else if (stop && json_is_array(stop)) {
        if (json_array_size(stop) > MAX_STOP)
            return fail(b, "stop", "'stop' holds at most %d strings", MAX_STOP);
        size_t i;
        json_t *v;
        json_array_foreach(stop, i, v) {
            if (!json_is_string(v) || json_string_length(v) == 0)
                return fail(b, "stop", "'stop' must hold non-empty strings");
            r->stop[r->n_stop++] = json_string_value(v);
        }
    } else if (stop && !json_is_null(stop) && !json_is_string(stop)) {
        return fail(b, "stop", "'stop' must be a string or an array of strings");
    }
    return 1;
}

/* The chat's messages rendered with the model's template. */
static int chat_prompt(json_t *body, req *r, bad *b) {
    json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0 || json_array_size(msgs) > 4096)
        return fail(b, "messages", "'messages' must be a non-empty array");
    size_t n = json_array_size(msgs), len = 0;
    tsr_chat_message *cm = calloc(n, sizeof *cm);
    if (!cm)
        return fail(b, "messages", "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(msgs, i), *role = json_object_get(m, "role"),
               *content = json_object_get(m, "content");
        if (!json_is_string(role) || !json_is_string(content)) {
            free(cm);
            return fail(b, "messages", "messages[%zu] needs a string 'role' and a string 'content'", i);
        }
        cm[i].role = json_string_value(role);
        cm[i].content = json_string_value(content);
    }
    tsr_status st = tsr_model_chat_format(model, cm, n, 1, NULL, 0, &len);
    if (st == TSR_E_RANGE && (r->prompt = malloc(len + 1)) != NULL)
        st = tsr_model_chat_format(model, cm, n, 1, r->prompt, len + 1, &len);
    free(cm);
    if (st != TSR_OK)
        return fail(b, "messages", "the chat cannot be formatted: %s", tsr_last_error());
    return 1;
}

static int text_prompt(json_t *body, req *r, bad *b) {
    json_t *p = json_object_get(body, "prompt");
    if (!json_is_string(p))
        return fail(b, "prompt", "'prompt' must be a string");
    r->prompt = strdup(json_string_value(p));
    return r->prompt != NULL;
}

/* ---- completions ------------------------------------------------------------ */

static const char *finish_name(int f) {
    return f == TSR_FINISH_LENGTH      ? "length"
           : f == TSR_FINISH_STOP      ? "stop"
           : f == TSR_FINISH_CANCELLED ? "cancelled"
                                       : "error";
}

static json_t *usage(const job *j) {
    return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)j->n_prompt, "completion_tokens",
                     (json_int_t)j->n_gen, "total_tokens", (json_int_t)(j->n_prompt + j->n_gen),
                     "prompt_tokens_details", "cached_tokens", (json_int_t)j->n_cached);
}

/* Length of the valid UTF-8 character at s[0..n), 0 when it is none. */
static size_t utf8_char(const unsigned char *s, size_t n) {
    size_t len = s[0] < 0x80 ? 1 : (s[0] >> 5) == 6 ? 2 : (s[0] >> 4) == 14 ? 3 : (s[0] >> 3) == 30 ? 4 : 0;
    if (!len || len > n || (len == 2 && s[0] < 0xc2))
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if ((len == 3 && s[0] == 0xe0 && s[1] < 0xa0) || (len == 3 && s[0] == 0xed && s[1] >= 0xa0) ||
        (len == 4 && s[0] == 0xf0 && s[1] < 0x90) || (len == 4 && (s[0] > 0xf4 || (s[0] == 0xf4 && s[1] >= 0x90))))
        return 0;
    return len;
}

/* A token's text as a JSON string (a byte of a split character written
 * "\xNN", as OpenAI does) and, when bytes is not NULL, its bytes. */
static json_t *token_str(int32_t tok, json_t **bytes, size_t *n_bytes) {
    char piece[256], out[1100];
    size_t len = 0, n = 0;
    if (tsr_model_token_piece(model, tok, 0, piece, sizeof piece, &len) != TSR_OK)
        len = 0;
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < len; i++) json_array_append_new(*bytes, json_integer((unsigned char)piece[i]));
    }
    if (n_bytes)
        *n_bytes = len;
    for (size_t i = 0; i < len;) {
        size_t l = utf8_char((const unsigned char *)piece + i, len - i);
        if (l) {
            memcpy(out + n, piece + i, l);
            n += l;
            i += l;
        } else {
            n += (size_t)snprintf(out + n, 5, "\\x%02x", (unsigned char)piece[i++]);
        }
    }
    return json_stringn(out, n);
}

/* Text as a JSON string, a byte that is no whole UTF-8 character replaced
 * by U+FFFD: a request that ends (max_tokens, a cancel) within a character
 * leaves its first bytes, which jansson would refuse. */
static json_t *json_text(const char *s, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n;) {
        size_t l = utf8_char((const unsigned char *)s + i, n - i);
        bad += !l;
        i += l ? l : 1;
    }
    if (!bad)
        return json_stringn(s, n);
    char *t = malloc(n + 2 * bad);
    if (!t)
        return json_string("");
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        size_t l = utf8_char((const unsigned char *)s + i, n - i);
        if (l) {
            memcpy(t + m, s + i, l);
            m += l;
            i += l;
        } else {
            memcpy(t + m, "\xef\xbf\xbd", 3);
            m += 3;
            i++;
        }
    }
    json_t *v = json_stringn(t, m);
    free(t);
    return v;
}

static json_t *lp_real(float v) { return json_real(v == v && v > -1e30f ? (double)v : -9999.0); }

/* The logprobs object of entries [from, to): chat's {"content": [...]} or
 * the completions' {"tokens", "token_logprobs", "top_logprobs", "text_offset"}. */
static json_t *lp_json(job *j, size_t from, size_t to) {
    if (!j->want_lp)
        return json_null();
    if (j->chat) {
        json_t *content = json_array();
        for (size_t i = from; i < to; i++) {
            const lp_entry *e = &j->lp[i];
            json_t *bytes, *top = json_array();
            json_t *t = token_str(e->token, &bytes, NULL);
            for (int k = 0; k < e->n_top && k < j->n_top; k++) {
                json_t *tb;
                json_t *ts = token_str(e->top_token[k], &tb, NULL);
                json_array_append_new(
                    top, json_pack("{s:o,s:o,s:o}", "token", ts, "logprob", lp_real(e->top_logprob[k]), "bytes", tb));
            }
            json_array_append_new(content, json_pack("{s:o,s:o,s:o,s:o}", "token", t, "logprob", lp_real(e->logprob),
                                                     "bytes", bytes, "top_logprobs", top));
        }
        return json_pack("{s:o,s:n}", "content", content, "refusal");
    }
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (size_t i = from; i < to; i++) {
        const lp_entry *e = &j->lp[i];
        size_t nb = 0;
        json_array_append_new(toks, token_str(e->token, NULL, &nb));
        json_array_append_new(lps, lp_real(e->logprob));
        json_array_append_new(offs, json_integer((json_int_t)j->lp_offset));
        j->lp_offset += nb;
        json_t *top = json_object();
        for (int k = 0; k < e->n_top && k < j->n_top; k++) {
            json_t *ts = token_str(e->top_token[k], NULL, NULL);
            if (json_string_value(ts))
                json_object_set_new(top, json_string_value(ts), lp_real(e->top_logprob[k]));
            json_decref(ts);
        }
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops, "text_offset",
                     offs);
}

static json_t *choice(const job *j, const char *text, size_t len, int final, json_t *logprobs) {
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(0));
    if (j->chat) {
        json_t *m = json_object();
        if (!j->stream || !j->sent_role)
            json_object_set_new(m, "role", json_string("assistant"));
        if (text)
            json_object_set_new(m, "content", json_text(text, len));
        json_object_set_new(c, j->stream ? "delta" : "message", m);
    } else {
        json_object_set_new(c, "text", json_text(text ? text : "", text ? len : 0));
    }
    json_object_set_new(c, "logprobs", logprobs ? logprobs : json_null());
    json_object_set_new(c, "finish_reason", final ? json_string(finish_name(j->finish)) : json_null());
    return c;
}

static json_t *envelope(const job *j, json_t *choices) {
    char id[64];
    snprintf(id, sizeof id, "%s-%llu", j->chat ? "chatcmpl" : "cmpl", (unsigned long long)j->id);
    const char *obj = j->chat ? (j->stream ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    return json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", id, "object", obj, "created", (json_int_t)j->created, "model",
                     model_id, "choices", choices);
}

/* Appends one SSE event "data: JSON\n\n" to the job's output. */
static void sse(job *j, json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    if (!s)
        return;
    size_t n = strlen(s);
    if (grow(&j->out, &j->cap_out, j->n_out + n + 8)) {
        memcpy(j->out + j->n_out, "data: ", 6);
        memcpy(j->out + j->n_out + 6, s, n);
        memcpy(j->out + j->n_out + 6 + n, "\n\n", 2);
        j->n_out += n + 8;
    }
    free(s);
}

static void sse_raw(job *j, const char *s) {
    size_t n = strlen(s);
    if (grow(&j->out, &j->cap_out, j->n_out + n))
        memcpy(j->out + j->n_out, s, n), j->n_out += n;
}

/* Log-probabilities that must go out without text: the request ended
 * with tokens whose text never came (a stop string, or nothing printable). */
static int lp_due(const job *j) { return j->finish && j->want_lp && j->lp_sent < j->n_lp; }

/* Turns what the job has into SSE bytes (j->mu held). */
static void sse_fill(job *j) {
    if (j->chat && !j->sent_role) {
        sse(j, envelope(j, json_pack("[o]", choice(j, "", 0, 0, NULL))));
        j->sent_role = 1;
    }
    if (j->n_text || lp_due(j)) {
        json_t *lp = lp_json(j, j->lp_sent, j->n_lp);
        j->lp_sent = j->n_lp;
        sse(j, envelope(j, json_pack("[o]", choice(j, j->text, j->n_text, 0, lp))));
        j->n_text = 0;
    }
    if (j->finish && !j->done) {
        sse(j, envelope(j, json_pack("[o]", choice(j, NULL, 0, 1, NULL))));
        if (j->include_usage) {
            json_t *u = envelope(j, json_array());
            json_object_set_new(u, "usage", usage(j));
            sse(j, u);
        }
        sse_raw(j, "data: [DONE]\n\n");
        j->done = 1;
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (j->pos_out < j->n_out) {
            size_t n = j->n_out - j->pos_out < max ? j->n_out - j->pos_out : max;
            memcpy(buf, j->out + j->pos_out, n);
            j->pos_out += n;
            pthread_mutex_unlock(&j->mu);
            return (ssize_t)n;
        }
        j->n_out = j->pos_out = 0;
        if (j->done) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (j->n_text || j->finish || (j->chat && !j->sent_role)) {
            sse_fill(j);
            continue;
        }
        struct pollfd pfd = {j->fd, POLLRDHUP, 0};
        if (drain_expired || /* SIGTERM and --timeout passed: cut the stream */
            (j->fd >= 0 && poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)))) {
            /* or the client left while nothing was written (queued, in
             * prefill): end now, stream_end cancels */
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        /* wake every 100 ms (for the drain); a comment after keepalive_s
         * quiet seconds, so that a client waiting out a long prefill sees
         * the connection live */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT && !j->n_text && !j->finish) {
            double t = now_s();
            if (t - j->t_quiet >= (double)o.keepalive_s) {
                sse_raw(j, ": keep-alive\n\n");
                j->t_quiet = t;
            }
        } else {
            j->t_quiet = now_s();
        }
    }
}

/* The connection ended (finished or the client went away): cancel the
 * request; a finished one ignores it. */
static void stream_end(void *cls) {
    job *j = cls;
    tsr_batcher_cancel(batcher, j->id);
    job_unref(j);
    live_add(-1);
}

static enum MHD_Result completion(struct MHD_Connection *c, json_t *body, int chat) {
    req r;
    memset(&r, 0, sizeof r);
    bad b = {NULL, ""};
    json_t *m = json_object_get(body, "model");
    if (json_is_string(m) && strcmp(json_string_value(m), model_id) != 0)
        return send_error(c, 404, "invalid_request_error", "model", "The model '%s' does not exist",
                          json_string_value(m));
    if (!parse_common(body, chat, &r, &b) || !(chat ? chat_prompt(body, &r, &b) : text_prompt(body, &r, &b))) {
        free(r.prompt);
        return send_error(c, 400, "invalid_request_error", b.param, "%s", b.msg);
    }
    if (draining) {
        free(r.prompt);
        return send_error(c, 503, "server_error", NULL, "the server is shutting down");
    }
    job *j = calloc(1, sizeof *j);
    if (!j) {
        free(r.prompt);
        return send_error(c, 500, "server_error", NULL, "out of memory");
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 3; /* the connection, the batcher, the admission list */
    j->chat = chat;
    j->stream = r.stream;
    j->include_usage = r.include_usage;
    j->want_lp = r.want_lp;
    j->n_top = r.n_top;
    j->created = time(NULL);
    j->t_submit = j->t_quiet = now_s();
    const union MHD_ConnectionInfo *fdi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = fdi ? fdi->connect_fd : -1;
    tsr_request_params rp;
    tsr_request_params_init(&rp, sizeof rp);
    rp.text = r.prompt;
    rp.sampling = &r.sp;
    rp.max_tokens = r.max_tokens;
    rp.stop = r.stop;
    rp.n_stop = r.n_stop;
    rp.callback = on_event;
    rp.user = j;
    rp.n_top_logprobs = r.want_lp ? r.n_top : 0;
    /* submitted and listed under pending_mu: the list keeps the queue's order */
    pthread_mutex_lock(&pending_mu);
    tsr_status st = tsr_batcher_submit(batcher, &rp, &j->id);
    if (st == TSR_OK) {
        if (pending_tail)
            pending_tail->next_pending = j;
        else
            pending_head = j;
        pending_tail = j;
    }
    pthread_mutex_unlock(&pending_mu);
    free(r.prompt);
    if (st != TSR_OK) {
        j->refs = 1;
        job_unref(j);
        if (st == TSR_E_FULL)
            return send_error(c, 503, "server_error", NULL, "all slots are busy and %lld requests wait",
                              (long long)o.max_queued);
        if (st == TSR_E_RANGE)
            return send_error(c, 400, "exceed_context_size_error", chat ? "messages" : "prompt", "%s",
                              tsr_last_error());
        return send_error(c, 400, "invalid_request_error", NULL, "%s", tsr_last_error());
    }
    wake_stepper();
    live_add(1);
    if (j->stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, j,
                                                                      stream_end);
        if (!resp) {
            stream_end(j);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        return respond(c, 200, resp);
    }
    /* wait, watching the socket every 100 ms, whether or not tokens came
     * meanwhile (each token wakes this wait): a client that goes away
     * cancels */
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    pthread_mutex_lock(&j->mu);
    double polled = now_s();
    while (!j->finish) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        double t = now_s();
        if (ci && !j->finish && t - polled >= 0.1) {
            polled = t;
            struct pollfd pfd = {ci->connect_fd, POLLRDHUP, 0};
            if (drain_expired || (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)))) {
                /* never call the batcher holding j->mu: its step holds the
                 * batcher's lock when it takes j->mu (on_event) */
                pthread_mutex_unlock(&j->mu);
                tsr_batcher_cancel(batcher, j->id);
                pthread_mutex_lock(&j->mu);
            }
        }
    }
    json_t *v = envelope(j, json_pack("[o]", choice(j, j->text, j->n_text, 1, lp_json(j, 0, j->n_lp))));
    json_object_set_new(v, "usage", usage(j));
    pthread_mutex_unlock(&j->mu);
    job_unref(j);
    live_add(-1);
    return send_json(c, 200, v);
}

/* ---- the other routes ------------------------------------------------------- */

static enum MHD_Result tokenize(struct MHD_Connection *c, json_t *body) {
    json_t *content = json_object_get(body, "content");
    if (!json_is_string(content))
        return send_error(c, 400, "invalid_request_error", "content", "'content' must be a string");
    size_t len = json_string_length(content), n = 0;
    unsigned fl = json_is_true(json_object_get(body, "add_special")) ? TSR_TOKENIZE_ADD_SPECIAL : 0;
    if (json_is_true(json_object_get(body, "parse_special")))
        fl |= TSR_TOKENIZE_PARSE_SPECIAL;
    tsr_model_tokenize(model, json_string_value(content), len, fl, NULL, 0, &n);
    int32_t *t = malloc((n ? n : 1) * sizeof *t);
    if (!t || tsr_model_tokenize(model, json_string_value(content), len, fl, t, n, &n) != TSR_OK) {
        free(t);
        return send_error(c, 500, "server_error", NULL, "tokenize: %s", tsr_last_error());
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(arr, json_integer(t[i]));
    free(t);
    return send_json(c, 200, json_pack("{s:o}", "tokens", arr));
}

static enum MHD_Result detokenize(struct MHD_Connection *c, json_t *body) {
    json_t *toks = json_object_get(body, "tokens");
    if (!json_is_array(toks))
        return send_error(c, 400, "invalid_request_error", "tokens", "'tokens' must be an array of token ids");
    size_t n = json_array_size(toks), len = 0;
    int32_t *t = malloc((n ? n : 1) * sizeof *t);
    if (!t)
        return send_error(c, 500, "server_error", NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(toks, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= tsr_model_n_vocab(model)) {
            free(t);
            return send_error(c, 400, "invalid_request_error", "tokens", "tokens[%zu] is no token id", i);
        }
        t[i] = (int32_t)json_integer_value(v);
    }
    tsr_model_detokenize(model, t, n, 0, NULL, 0, &len);
    char *s = malloc(len + 1);
    if (!s || tsr_model_detokenize(model, t, n, 0, s, len + 1, &len) != TSR_OK) {
        free(t);
        free(s);
        return send_error(c, 500, "server_error", NULL, "detokenize: %s", tsr_last_error());
    }
    free(t);
    json_t *v = json_pack("{s:o}", "content", json_text(s, len));
    free(s);
    return send_json(c, 200, v);
}

static enum MHD_Result models(struct MHD_Connection *c) {
    return send_json(c, 200,
                     json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id", model_id, "object",
                               "model", "created", (json_int_t)0, "owned_by", "libtensr"));
}

/* Prometheus text (version 0.0.4): the names are documented in
 * tensr-server(1); tensr_requests_waiting, tensr_requests_running and
 * tensr_kv_cache_usage_ratio are what an endpoint picker reads. */
static enum MHD_Result metrics(struct MHD_Connection *c) {
    size_t running = 0, waiting = 0;
    int64_t cells = 0;
    tsr_batcher_counts(batcher, &running, &waiting, &cells);
    char *buf = NULL;
    size_t cap = 0, n = 0;
    FILE *f = open_memstream(&buf, &cap);
    if (!f)
        return MHD_NO;
    fprintf(f,
            "# HELP tensr_requests_running Requests in a slot (prefill or decode).\n"
            "# TYPE tensr_requests_running gauge\ntensr_requests_running %zu\n"
            "# HELP tensr_requests_waiting Requests queued for a slot.\n"
            "# TYPE tensr_requests_waiting gauge\ntensr_requests_waiting %zu\n"
            "# HELP tensr_kv_cache_usage_ratio KV cells held by the slots over all cells (0..1).\n"
            "# TYPE tensr_kv_cache_usage_ratio gauge\ntensr_kv_cache_usage_ratio %.6f\n"
            "# HELP tensr_slots Slots (requests decoded side by side, -np).\n"
            "# TYPE tensr_slots gauge\ntensr_slots %d\n",
            running, waiting, (double)cells / (double)(o.n_ctx / o.n_slots * o.n_slots), o.n_slots);
    pthread_mutex_lock(&met.mu);
    fprintf(f, "# HELP tensr_requests_total HTTP responses by status code.\n# TYPE tensr_requests_total counter\n");
    for (size_t i = 0; i <= N_CODES; i++) {
        if (i < N_CODES)
            fprintf(f, "tensr_requests_total{code=\"%u\"} %llu\n", status_codes[i], (unsigned long long)met.by_code[i]);
        else
            fprintf(f, "tensr_requests_total{code=\"other\"} %llu\n", (unsigned long long)met.by_code[i]);
    }
    fprintf(f,
            "# HELP tensr_prompt_tokens_total Prompt tokens of finished requests.\n"
            "# TYPE tensr_prompt_tokens_total counter\ntensr_prompt_tokens_total %llu\n"
            "# HELP tensr_prompt_tokens_cached_total Of them, kept in a slot from an earlier request.\n"
            "# TYPE tensr_prompt_tokens_cached_total counter\ntensr_prompt_tokens_cached_total %llu\n"
            "# HELP tensr_generation_tokens_total Tokens generated by finished requests.\n"
            "# TYPE tensr_generation_tokens_total counter\ntensr_generation_tokens_total %llu\n",
            (unsigned long long)met.prompt_tokens, (unsigned long long)met.cached_tokens,
            (unsigned long long)met.gen_tokens);
    for (int h = 0; h < N_HIST; h++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", hist_info[h].name, hist_info[h].help, hist_info[h].name);
        uint64_t cum = 0;
        for (size_t i = 0; i <= N_LE; i++) {
            cum += met.bucket[h][i];
            if (i < N_LE)
                fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", hist_info[h].name, hist_le[i], (unsigned long long)cum);
            else
                fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n", hist_info[h].name, (unsigned long long)cum);
        }
        fprintf(f, "%s_sum %.6f\n%s_count %llu\n", hist_info[h].name, met.sum[h], hist_info[h].name,
                (unsigned long long)cum);
    }
    pthread_mutex_unlock(&met.mu);
    fclose(f);
    n = strlen(buf);
    struct MHD_Response *r = MHD_create_response_from_buffer(n, buf, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    return respond(c, 200, r);
}

/* The chat page (chat.html, compiled in). */
static enum MHD_Result page(struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(tsr_chat_page), (void *)tsr_chat_page,
                                                             MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    return respond(c, 200, r);
}

/* A CORS preflight: 204 with what the origin may do when --cors-origin
 * lists it, else 403 (CORS is off unless asked for). */
static enum MHD_Result preflight(struct MHD_Connection *c) {
    if (!cors_origin(c))
        return send_error(c, 403, "invalid_request_error", NULL, "CORS: this origin is not allowed (--cors-origin)");
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    return respond(c, 204, r);
}

/* Nesting of JSON arrays and objects in s[0..n) (strings skipped), at most
 * limit + 1: jansson's own bound (2048) is far deeper than any request. */
static int json_depth(const char *s, size_t n, int limit) {
    int depth = 0, max = 0, in_str = 0;
    for (size_t i = 0; i < n && max <= limit; i++) {
        char ch = s[i];
        if (in_str) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                in_str = 0;
        } else if (ch == '"') {
            in_str = 1;
        } else if (ch == '[' || ch == '{') {
            max = ++depth > max ? depth : max;
        } else if (ch == ']' || ch == '}') {
            depth--;
        }
    }
    return max;
}

static enum MHD_Result route(struct MHD_Connection *c, const char *url, const char *method, conn *cn) {
    int get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
    if (strcmp(method, "OPTIONS") == 0)
        return preflight(c);
    if (get && strcmp(url, "/health") == 0)
        return send_json(c, 200, json_pack("{s:s}", "status", "ok"));
    if (get && (strcmp(url, "/") == 0 || strcmp(url, "/index.html") == 0))
        return page(c);
    if (!key_ok(c))
        return send_error(c, 401, "invalid_request_error", NULL, "Invalid API key");
    if (get && strcmp(url, "/v1/models") == 0)
        return models(c);
    if (get && strcmp(url, "/metrics") == 0)
        return metrics(c);
    int known = post && (strcmp(url, "/v1/chat/completions") == 0 || strcmp(url, "/v1/completions") == 0 ||
                         strcmp(url, "/tokenize") == 0 || strcmp(url, "/detokenize") == 0);
    if (!known)
        return send_error(c, 404, "invalid_request_error", NULL, "%s %s: no such route", method, url);
    if (cn->too_big)
        return send_error(c, 413, "invalid_request_error", NULL, "the body is over %u bytes", BODY_MAX);
    if (json_depth(cn->body ? cn->body : "", cn->n_body, JSON_DEPTH_MAX) > JSON_DEPTH_MAX)
        return send_error(c, 400, "invalid_request_error", NULL, "the body nests JSON deeper than %d levels",
                          JSON_DEPTH_MAX);
    json_error_t je;
    json_t *body = json_loadb(cn->body ? cn->body : "", cn->n_body, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(body)) {
        json_decref(body);
        return send_error(c, 400, "invalid_request_error", NULL, "the body is no JSON object: %s", je.text);
    }
    enum MHD_Result r = strcmp(url, "/tokenize") == 0 ? tokenize(c, body)
                        : strcmp(url, "/detokenize") == 0
                            ? detokenize(c, body)
                            : completion(c, body, strcmp(url, "/v1/chat/completions") == 0);
    json_decref(body);
    return r;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **ptr) {
    (void)cls;
    (void)version;
    conn *cn = *ptr;
    if (!cn) {
        if (!(cn = calloc(1, sizeof *cn)))
            return MHD_NO;
        *ptr = cn;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cn->too_big && cn->n_body + *upload_size <= BODY_MAX) {
            char *b = realloc(cn->body, cn->n_body + *upload_size);
            if (!b)
                return MHD_NO;
            memcpy(b + cn->n_body, upload, *upload_size);
            cn->body = b;
            cn->n_body += *upload_size;
        } else {
            cn->too_big = 1;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    return route(c, url, method, cn);
}

static void completed(void *cls, struct MHD_Connection *c, void **ptr, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    conn *cn = *ptr;
    if (cn) {
        free(cn->body);
        free(cn);
    }
    *ptr = NULL;
}

/* ---- command line ----------------------------------------------------------- */

static void usage_exit(int code) {
    fprintf(code ? stderr : stdout,
            "usage: tensr-server -m MODEL [options]\n"
            "  -m, --model FILE         GGUF model\n"
            "  -c, --ctx-size N         KV cells in all (each of the -np slots gets N / np; default 4096)\n"
            "  -np, --parallel N        slots: requests decoded side by side (default 4)\n"
            "  -t, --threads N          CPU threads (default: the library's)\n"
            "  -b, --batch-size N       most tokens of one step (default 512)\n"
            "  -ub, --ubatch-size N     most prompt tokens of one request a step (default 512)\n"
            "  -ngl, --n-gpu-layers N   layers on GPUs (default: the fit's; -ngl 0: all on the CPU)\n"
            "  -ot, --override-tensor P tensor buffer overrides, PATTERN=BUFT,...\n"
            "  --fit-target MiB[,...]   memory the fit leaves free per GPU (one value: every GPU;\n"
            "                           default 1024); the fit runs when neither -ngl nor -ot is given\n"
            "  --fit-print              print the fitted placement (flags, then bytes per device) and exit\n"
            "  -fa, --flash-attn on|off|auto\n"
            "  -amb, --attn-max-batch N attention max batch, MiB\n"
            "  --batch-invariant on|off a request's tokens the same whatever else is in its batch\n"
            "                           (default on; off: faster decode of a single request)\n"
            "  --host ADDR              IPv4 address to bind (default 127.0.0.1)\n"
            "  --port N                 (default 8080)\n"
            "  --api-key KEY, --api-key-file FILE\n"
            "  --max-queued N           requests waiting for a slot before 503 (default 64)\n"
            "  --timeout S              idle connection timeout, and how long SIGTERM waits for\n"
            "                           running requests (default 600)\n"
            "  --cors-origin LIST       origins (comma-separated, or *) allowed by CORS (default: none)\n"
            "  --sse-keepalive S        an SSE comment after S quiet seconds of a stream (default 5)\n"
            "  -v, --verbose\n");
    exit(code);
}

static const char *arg(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "tensr-server: %s needs a value\n", argv[*i]);
        exit(2);
    }
    return argv[++*i];
}

static int64_t int_arg(int argc, char **argv, int *i, int64_t lo, int64_t hi) {
    const char *name = argv[*i], *v = arg(argc, argv, i);
    char *end = NULL;
    long long n = strtoll(v, &end, 10);
    if (!*v || *end || n < lo || n > hi) {
        fprintf(stderr, "tensr-server: %s %s: expected an integer within %lld..%lld\n", name, v, (long long)lo,
                (long long)hi);
        exit(2);
    }
    return n;
}

static char *read_key_file(const char *path) {
    FILE *f = fopen(path, "r");
    char buf[1024];
    if (!f || !fgets(buf, sizeof buf, f)) {
        fprintf(stderr, "tensr-server: --api-key-file %s: %s\n", path, f ? "empty" : strerror(errno));
        exit(2);
    }
    fclose(f);
    buf[strcspn(buf, "\r\n")] = '\0';
    return strdup(buf);
}

#define IS(a, s, l) (strcmp(a, s) == 0 || strcmp(a, l) == 0)

static void parse_args(int argc, char **argv) {
    o.host = "127.0.0.1";
    o.port = 8080;
    o.n_slots = 4;
    o.n_ctx = 4096;
    o.n_batch = o.n_ubatch = 512;
    o.max_queued = 64;
    o.timeout_s = 600;
    o.keepalive_s = 5;
    o.flash_attn = TSR_FLASH_ATTN_AUTO;
    o.batch_invariant = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (IS(a, "-m", "--model"))
            o.model = arg(argc, argv, &i);
        else if (IS(a, "-c", "--ctx-size"))
            o.n_ctx = int_arg(argc, argv, &i, 16, 1 << 24);
        else if (IS(a, "-np", "--parallel"))
            o.n_slots = (int)int_arg(argc, argv, &i, 1, 1024);
        else if (IS(a, "-t", "--threads"))
            o.n_threads = (int)int_arg(argc, argv, &i, 1, 1024);
        else if (IS(a, "-b", "--batch-size"))
            o.n_batch = int_arg(argc, argv, &i, 1, 1 << 20);
        else if (IS(a, "-ub", "--ubatch-size"))
            o.n_ubatch = int_arg(argc, argv, &i, 1, 1 << 20);
        else if (IS(a, "-ngl", "--n-gpu-layers"))
            o.n_gpu_layers = (int)int_arg(argc, argv, &i, 0, 100000), o.ngl_given = 1;
        else if (strcmp(a, "--fit-target") == 0)
            o.fit_target = arg(argc, argv, &i);
        else if (strcmp(a, "--fit-print") == 0)
            o.fit_print = 1;
        else if (IS(a, "-ot", "--override-tensor"))
            o.overrides = arg(argc, argv, &i);
        else if (IS(a, "-amb", "--attn-max-batch"))
            o.amb = (size_t)int_arg(argc, argv, &i, 0, 1 << 20) << 20;
        else if (IS(a, "-fa", "--flash-attn")) {
            const char *v = arg(argc, argv, &i);
            o.flash_attn = strcmp(v, "on") == 0 || strcmp(v, "1") == 0    ? TSR_FLASH_ATTN_ON
                           : strcmp(v, "off") == 0 || strcmp(v, "0") == 0 ? TSR_FLASH_ATTN_OFF
                           : strcmp(v, "auto") == 0
                               ? TSR_FLASH_ATTN_AUTO
                               : (fprintf(stderr, "tensr-server: -fa %s: on, off or auto\n", v), exit(2), 0);
        } else if (strcmp(a, "--batch-invariant") == 0) {
            const char *v = arg(argc, argv, &i);
            o.batch_invariant = strcmp(v, "on") == 0 || strcmp(v, "1") == 0    ? 1
                                : strcmp(v, "off") == 0 || strcmp(v, "0") == 0 ? 0
                                                                               : (fprintf(stderr,
                                                                                          "tensr-server: --batch-invariant "
                                                                                          "%s: on or off\n",
                                                                                          v),
                                                                                  exit(2), 0);
        } else if (strcmp(a, "--host") == 0)
            o.host = arg(argc, argv, &i);
        else if (strcmp(a, "--port") == 0)
            o.port = (int)int_arg(argc, argv, &i, 0, 65535);
        else if (strcmp(a, "--api-key") == 0)
            o.api_key = arg(argc, argv, &i);
        else if (strcmp(a, "--api-key-file") == 0)
            o.api_key = read_key_file(arg(argc, argv, &i));
        else if (strcmp(a, "--max-queued") == 0)
            o.max_queued = int_arg(argc, argv, &i, 0, 1 << 20);
        else if (strcmp(a, "--timeout") == 0)
            o.timeout_s = int_arg(argc, argv, &i, 1, 1 << 24);
        else if (strcmp(a, "--cors-origin") == 0)
            o.cors = arg(argc, argv, &i);
        else if (strcmp(a, "--sse-keepalive") == 0)
            o.keepalive_s = int_arg(argc, argv, &i, 1, 1 << 24);
        else if (IS(a, "-v", "--verbose"))
            o.verbose = 1;
        else if (IS(a, "-h", "--help"))
            usage_exit(0);
        else {
            fprintf(stderr, "tensr-server: unknown argument %s\n", a);
            usage_exit(2);
        }
    }
    if (!o.model)
        usage_exit(2);
}

/* --fit-print: the placement as flags, then per device the bytes planned
 * and the bytes the fit had there. */
static void fit_print(const tsr_fit_result *fr) {
    char flags[4096];
    size_t len;
    if (tsr_fit_result_flags(fr, flags, sizeof flags, &len) == TSR_OK)
        printf("%s\n", flags);
    for (size_t d = 0; d < fr->n_devices; d++)
        printf("%s planned %zu available %zu\n", tsr_device_name(tsr_device_get(d)), fr->planned[d],
               fr->available[d]);
    fflush(stdout);
}

/* No -ngl and no -ot: tsr_fit picks the GPU layers, split and expert
 * overrides for the slots' context (kept as given); the result owns the
 * overrides it puts into lp. It runs before the server makes its backend:
 * the fit reads each device's free memory as it is, and the streams of a
 * backend made first would hold their workspace and scratch already,
 * which the fit's plan counts again. */
static int fit_placement(const tsr_backend_params *bp, tsr_load_params *lp, tsr_fit_result *fr) {
    tsr_session_params sp;
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = o.n_ctx / o.n_slots * o.n_slots;
    sp.n_seq_max = o.n_slots;
    sp.n_batch = o.n_batch < o.n_slots ? o.n_slots : o.n_batch;
    sp.n_ubatch = o.n_ubatch;
    sp.per_seq_cells = 1;
    tsr_fit_params fp;
    tsr_fit_params_init(&fp, sizeof fp);
    fp.keep_n_ctx = 1;
    size_t margins[TSR_FIT_MAX_DEVICES];
    if (o.fit_target && fit_target_parse(o.fit_target, &fp, margins))
        return fprintf(stderr, "tensr-server: --fit-target %s: expected MiB[,MiB...]\n", o.fit_target), 1;
    if (tsr_fit(o.model, bp, lp, &sp, &fp, fr) != TSR_OK)
        return fprintf(stderr, "tensr-server: fit: %s\n", tsr_last_error()), 1;
    if (o.fit_print)
        fit_print(fr);
    lp->n_gpu_layers = fr->n_gpu_layers;
    lp->tensor_split = fr->n_devices > 2 ? fr->tensor_split : NULL;
    lp->overrides = fr->overrides;
    char flags[4096];
    size_t len;
    if (tsr_fit_result_flags(fr, flags, sizeof flags, &len) == TSR_OK)
        fprintf(stderr, "tensr-server: fit: %s\n", flags);
    return 0;
}

static int load(void) {
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    if (o.n_threads)
        bp.n_threads = o.n_threads;
    bp.flash_attn = o.flash_attn;
    bp.batch_invariant = o.batch_invariant;
    bp.attn_max_batch = o.amb;
    tsr_buft_override *ov = NULL;
    if (o.overrides && tsr_buft_overrides_parse(o.overrides, &ov) != TSR_OK)
        return fprintf(stderr, "tensr-server: %s\n", tsr_last_error()), 1;
    tsr_load_params lp;
    tsr_load_params_init(&lp, sizeof lp);
    lp.n_gpu_layers = o.n_gpu_layers;
    lp.overrides = ov;
    tsr_fit_result fr;
    memset(&fr, 0, sizeof fr);
    fr.size = sizeof fr;
    int fitted = !o.ngl_given && !o.overrides;
    if (o.fit_print && !fitted)
        return fprintf(stderr, "tensr-server: --fit-print: -ngl or -ot given, nothing to fit\n"), 2;
    if (fitted && fit_placement(&bp, &lp, &fr)) /* before the backend: its streams are not counted twice */
        return tsr_fit_result_free(&fr), tsr_buft_overrides_free(ov), 1;
    if (o.fit_print)
        return tsr_fit_result_free(&fr), 3;
    tsr_status st = tsr_backend_new(&bp, &backend);
    if (st != TSR_OK) {
        tsr_fit_result_free(&fr);
        tsr_buft_overrides_free(ov);
        return fprintf(stderr, "tensr-server: %s\n", tsr_last_error()), 1;
    }
    st = tsr_model_load(backend, o.model, &lp, &model);
    tsr_fit_result_free(&fr);
    tsr_buft_overrides_free(ov);
    if (st != TSR_OK)
        return fprintf(stderr, "tensr-server: %s: %s\n", o.model, tsr_last_error()), 1;
    tsr_batcher_params p;
    tsr_batcher_params_init(&p, sizeof p);
    p.n_slots = o.n_slots;
    p.n_ctx_slot = o.n_ctx / o.n_slots;
    p.n_batch = o.n_batch < o.n_slots ? o.n_slots : o.n_batch;
    p.n_ubatch = o.n_ubatch;
    p.n_queue_max = o.max_queued;
    if (tsr_batcher_new(model, &p, &batcher) != TSR_OK)
        return fprintf(stderr, "tensr-server: %s\n", tsr_last_error()), 1;
    const char *base = strrchr(o.model, '/');
    snprintf(model_id, sizeof model_id, "%s", base ? base + 1 : o.model);
    return 0;
}

#ifndef TSR_SERVER_NO_MAIN /* tests/fuzz/fuzz-server.c includes this file */
int main(int argc, char **argv) {
    parse_args(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* every thread; main waits for them */
    int rc = load();
    if (rc)
        return rc == 3 ? 0 : rc; /* 3: --fit-print done */
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)o.port);
    if (inet_pton(AF_INET, o.host, &addr.sin_addr) != 1) {
        fprintf(stderr, "tensr-server: --host %s: not an IPv4 address\n", o.host);
        return 2;
    }
    pthread_t step_thread;
    pthread_create(&step_thread, NULL, stepper, NULL);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG, 0, NULL,
        NULL, handler, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, completed,
        NULL, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o.timeout_s, MHD_OPTION_CONNECTION_LIMIT, 256u, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "tensr-server: cannot listen on %s:%d\n", o.host, o.port);
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "tensr-server: %s on http://%s:%u (%d slots of %lld cells)\n", model_id, o.host,
            info ? info->port : (unsigned)o.port, o.n_slots, (long long)(o.n_ctx / o.n_slots));
    int sig = 0;
    sigwait(&set, &sig);
    /* drain: stop accepting, answer new requests on open connections with
     * 503, let the running ones finish (at most --timeout seconds) */
    fprintf(stderr, "tensr-server: signal %d: stopping\n", sig);
    draining = 1;
    MHD_socket lsock = MHD_quiesce_daemon(d);
    if (lsock != MHD_INVALID_SOCKET)
        close(lsock);
    double until = now_s() + (double)o.timeout_s;
    for (;;) {
        pthread_mutex_lock(&live_mu);
        int live = n_live;
        pthread_mutex_unlock(&live_mu);
        if (live == 0)
            break;
        if (now_s() >= until) {
            fprintf(stderr, "tensr-server: %d requests still running after --timeout %lld s: cut\n", live,
                    (long long)o.timeout_s);
            drain_expired = 1;
            break;
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    MHD_stop_daemon(d);
    pthread_mutex_lock(&step_mu);
    stopping = 1;
    pthread_cond_signal(&step_cv);
    pthread_mutex_unlock(&step_mu);
    pthread_join(step_thread, NULL);
    tsr_batcher_free(batcher);
    tsr_model_free(model);
    tsr_backend_free(backend);
    return 0;
}
#endif
