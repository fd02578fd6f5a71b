/* api.c - the model layer's public functions: loading a model (weights,
 * vocabulary, chat template), the tokenizer and chat formatting into the
 * caller's buffers, and the sampler. Sessions are in session.c. */
#include "model.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* ---- loading --------------------------------------------------------------- */

/* The chat template, when the model has one: a model without one (or with
 * one we do not know) still loads; tsr_model_chat_format says why. A
 * gemma3 file without tokenizer.chat_template (the 270M Q4_K_M one of
 * examples/get-model.sh has none) gets Gemma's turns, the only format
 * Gemma's instruct models know. */
static void load_template(tsr_model *m) {
    const char *text = NULL;
    int has = tsr_gguf_find_key(m->gguf, "tokenizer.chat_template") >= 0;
    if (!has && tsr__llm_is_gemma3(&m->hp)) {
        m->tmpl_status = tsr__chat_template_by_name("gemma", &m->tmpl);
        if (m->tmpl_status != TSR_OK)
            snprintf(m->tmpl_error, sizeof m->tmpl_error, "%s", tsr_last_error());
        tsr_clear_error();
        return;
    }
    if (!has || tsr_gguf_get_str(m->gguf, "tokenizer.chat_template", &text, NULL) != TSR_OK) {
        m->tmpl_status = TSR_E_NOT_FOUND;
        snprintf(m->tmpl_error, sizeof m->tmpl_error, "%s: the model has no tokenizer.chat_template",
                 tsr_gguf_path(m->gguf));
        tsr_clear_error();
        return;
    }
    m->tmpl_status = tsr__chat_template_detect(text, &m->tmpl);
    if (m->tmpl_status != TSR_OK)
        snprintf(m->tmpl_error, sizeof m->tmpl_error, "%s: %s", tsr_gguf_path(m->gguf), tsr_last_error());
    tsr_clear_error();
}

/* vocab_only, read up to the caller's size (an older caller has no such field). */
static int want_vocab_only(const tsr_load_params *lp) {
    return lp && lp->size >= offsetof(tsr_load_params, vocab_only) + sizeof lp->vocab_only && lp->vocab_only;
}

/* A vocabulary-only model: the architecture's name and context length (any
 * architecture: a front end counts tokens for models it does not run), the
 * vocabulary and the chat template; no weights, nothing from the backend. */
static tsr_status load_vocab_only(tsr_model *m, const char *path) {
    const char *arch;
    tsr_status st = tsr_gguf_open(path, &m->gguf);
    if (st != TSR_OK)
        return st;
    if (tsr_gguf_get_str(m->gguf, "general.architecture", &arch, NULL) != TSR_OK)
        return tsr__error(TSR_E_MALFORMED, "%s: no general.architecture string", path);
    snprintf(m->hp.arch, sizeof m->hp.arch, "%s", arch);
    if ((st = tsr__llm_key_i64(m->gguf, &m->hp, "context_length", 0, &m->hp.n_ctx_train)) != TSR_OK)
        return st;
    if ((st = tsr__tok_vocab_load(m->gguf, &m->vocab)) != TSR_OK)
        return st;
    m->hp.n_vocab = tsr__tok_n_vocab(m->vocab);
    m->vocab_only = 1;
    load_template(m);
    return TSR_OK;
}

/* A dry run of tsr_fit: the file parsed once (the planning backend's), no
 * vocabulary (the plan does not need it: n_vocab is token_embd.weight's). */
static tsr_status load_planned(tsr_model *m, tsr_gguf *g, const char *path, const tsr_load_params *lp) {
    m->gguf = g;
    m->gguf_borrowed = 1;
    tsr_status st = tsr__llm_hparams_read(m->gguf, &m->hp);
    if (st == TSR_OK && (st = tsr_backend_load_gguf(m->be, path, lp)) != TSR_OK)
        return tsr__error(st, "loading weights: %s", tsr_last_error());
    return st == TSR_OK ? tsr__llm_bind_weights(m) : st;
}

static tsr_status load(tsr_model *m, const char *path, const tsr_load_params *lp) {
    tsr_gguf *planned = tsr__backend_plan_gguf(m->be);
    if (planned)
        return load_planned(m, planned, path, lp);
    tsr_status st = tsr_gguf_open(path, &m->gguf);
    if (st != TSR_OK)
        return st; /* the detail names the file */
    if ((st = tsr__llm_hparams_read(m->gguf, &m->hp)) != TSR_OK)
        return st;
    if ((st = tsr__tok_vocab_load(m->gguf, &m->vocab)) != TSR_OK)
        return st;
    if (tsr__tok_n_vocab(m->vocab) != m->hp.n_vocab)
        return tsr__error(TSR_E_MALFORMED, "%s: the vocabulary has %d tokens, token_embd.weight %lld rows", path,
                          tsr__tok_n_vocab(m->vocab), (long long)m->hp.n_vocab);
    if ((st = tsr__backend_load_parsed(m->be, m->gguf, lp)) != TSR_OK) /* the file parsed above */
        return tsr__error(st, "loading weights: %s", tsr_last_error());
    if ((st = tsr__llm_bind_weights(m)) != TSR_OK)
        return st;
    load_template(m);
    return TSR_OK;
}

tsr_status tsr_model_load(tsr_backend *b, const char *path, const tsr_load_params *lp, tsr_model **out) {
    int vocab_only = want_vocab_only(lp);
    if (out)
        *out = NULL;
    if ((!b && !vocab_only) || !path || !out)
        return tsr__error(TSR_E_INVALID, "tsr_model_load: NULL %s", !path ? "path" : !out ? "out" : "backend");
    if (!vocab_only && tsr_backend_n_weights(b) > 0)
        return tsr__error(TSR_E_STATE, "tsr_model_load: the backend already holds %zu weights (one model per backend)",
                          tsr_backend_n_weights(b));
    tsr_model *m = tsr__calloc(1, sizeof *m);
    if (!m)
        return tsr__error(TSR_E_NOMEM, "tsr_model_load: out of host memory");
    m->be = vocab_only ? NULL : b;
    tsr_status st = vocab_only ? load_vocab_only(m, path) : load(m, path, lp);
    if (st != TSR_OK) {
        tsr__llm_model_destroy(m);
        return st;
    }
    *out = m;
    return TSR_OK;
}

void tsr_model_free(tsr_model *m) {
    if (!m)
        return;
    if (m->n_sessions > 0) { /* as sqlite3_close_v2: the last session to close frees the model */
        m->freed = 1;
        return;
    }
    tsr__llm_model_destroy(m);
}

void tsr__llm_model_destroy(tsr_model *m) {
    tsr__free(m->layers);
    tsr__tok_vocab_free(m->vocab);
    tsr__chat_template_free(m->tmpl);
    if (!m->gguf_borrowed)
        tsr_gguf_close(m->gguf);
    tsr__free(m);
}

const char *tsr_model_arch(const tsr_model *m) { return m ? m->hp.arch : NULL; }
int32_t tsr_model_n_vocab(const tsr_model *m) { return m ? (int32_t)m->hp.n_vocab : 0; }
int64_t tsr_model_n_ctx_train(const tsr_model *m) { return m ? m->hp.n_ctx_train : 0; }
int32_t tsr_model_token_bos(const tsr_model *m) { return m ? tsr__tok_bos(m->vocab) : -1; }
int32_t tsr_model_token_eos(const tsr_model *m) { return m ? tsr__tok_eos(m->vocab) : -1; }
int tsr_model_token_is_eog(const tsr_model *m, int32_t token) { return m && tsr__tok_is_eog(m->vocab, token); }

/* ---- text ------------------------------------------------------------------ */

/* Copies n bytes of src into buf (cap), NUL-terminated when it fits; TSR_E_RANGE when it does not. */
static tsr_status copy_out(const char *what, const char *src, size_t n, char *buf, size_t cap, int nul, size_t *len) {
    *len = n;
    if (n > cap || (nul && n == cap))
        return tsr__error(TSR_E_RANGE, "%s: %zu bytes%s do not fit in a buffer of %zu", what, n,
                          nul ? " and a NUL" : "", cap);
    if (n)
        memcpy(buf, src, n);
    if (nul)
        buf[n] = '\0';
    return TSR_OK;
}

tsr_status tsr_model_tokenize(const tsr_model *m, const char *text, size_t len, unsigned flags, int32_t *tokens,
                              size_t cap, size_t *n_tokens) {
    if (n_tokens)
        *n_tokens = 0;
    if (!m || (!text && len) || (!tokens && cap) || !n_tokens)
        return tsr__error(TSR_E_INVALID, "tsr_model_tokenize: NULL argument");
    if (flags & ~(TSR_TOKENIZE_ADD_SPECIAL | TSR_TOKENIZE_PARSE_SPECIAL))
        return tsr__error(TSR_E_INVALID, "tsr_model_tokenize: unknown flags 0x%x", flags);
    int32_t *ids = NULL;
    size_t n = 0;
    tsr_status st = tsr__tok_tokenize(m->vocab, text ? text : "", len, (flags & TSR_TOKENIZE_ADD_SPECIAL) != 0,
                                      (flags & TSR_TOKENIZE_PARSE_SPECIAL) != 0, &ids, &n);
    if (st != TSR_OK)
        return st;
    *n_tokens = n;
    if (n > cap)
        st = tsr__error(TSR_E_RANGE, "tsr_model_tokenize: %zu tokens do not fit in a buffer of %zu", n, cap);
    else if (n)
        memcpy(tokens, ids, n * sizeof *ids);
    tsr__free(ids);
    return st;
}

tsr_status tsr_model_token_piece(const tsr_model *m, int32_t token, int special, char *buf, size_t cap, size_t *len) {
    if (len)
        *len = 0;
    if (!m || (!buf && cap) || !len)
        return tsr__error(TSR_E_INVALID, "tsr_model_token_piece: NULL argument");
    if (token < 0 || token >= m->hp.n_vocab)
        return tsr__error(TSR_E_INVALID, "tsr_model_token_piece: token %d is outside the vocabulary (0..%lld)", token,
                          (long long)m->hp.n_vocab - 1);
    size_t n = 0;
    const char *p = tsr__tok_piece(m->vocab, token, special, &n);
    return copy_out("tsr_model_token_piece", p, n, buf, cap, 0, len);
}

tsr_status tsr_model_detokenize(const tsr_model *m, const int32_t *tokens, size_t n, int special, char *buf, size_t cap,
                                size_t *len) {
    if (len)
        *len = 0;
    if (!m || (!tokens && n) || (!buf && cap) || !len)
        return tsr__error(TSR_E_INVALID, "tsr_model_detokenize: NULL argument");
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->hp.n_vocab)
            return tsr__error(TSR_E_INVALID, "tsr_model_detokenize: token %zu: id %d is outside the vocabulary", i,
                              tokens[i]);
    char *text = NULL;
    size_t n_text = 0;
    tsr_status st = tsr__tok_detokenize(m->vocab, tokens, n, 0, special, &text, &n_text);
    if (st == TSR_OK)
        st = copy_out("tsr_model_detokenize", text, n_text, buf, cap, 1, len);
    tsr__free(text);
    return st;
}

tsr_status tsr_model_chat_format(const tsr_model *m, const tsr_chat_message *msgs, size_t n, int add_assistant,
                                 char *buf, size_t cap, size_t *len) {
    if (len)
        *len = 0;
    if (!m || (!msgs && n) || (!buf && cap) || !len)
        return tsr__error(TSR_E_INVALID, "tsr_model_chat_format: NULL argument");
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return tsr__error(TSR_E_INVALID, "tsr_model_chat_format: message %zu has a NULL role or content", i);
    if (!m->tmpl)
        return tsr__error(m->tmpl_status, "%s", m->tmpl_error);
    char *text = NULL;
    /* tsr_chat_message and chat_msg are the same two strings */
    chat_msg *cm = n ? tsr__malloc(n * sizeof *cm) : NULL;
    if (n && !cm)
        return tsr__error(TSR_E_NOMEM, "tsr_model_chat_format: out of host memory");
    for (size_t i = 0; i < n; i++) cm[i] = (chat_msg){msgs[i].role, msgs[i].content};
    tsr_status st = tsr__chat_format(m->tmpl, cm, n, add_assistant, &text);
    tsr__free(cm);
    if (st == TSR_OK)
        st = copy_out("tsr_model_chat_format", text, strlen(text), buf, cap, 1, len);
    tsr__free(text);
    return st;
}

/* ---- sampler --------------------------------------------------------------- */

/* The longest penalty window: longer than any context, small enough that its
 * history (4 bytes a token) is no surprise allocation. */
#define TSR_SAMPLER_MAX_LAST_N (1 << 20)

struct tsr_sampler {
    smp_sampler *s;
    int32_t n_vocab;
    float *row; /* [n_vocab]: the biased logits of tsr_sampler_logprobs */
};

void tsr_sampler_params_init(tsr_sampler_params *p, size_t size) {
    if (!p || size < sizeof(size_t))
        return;
    tsr_sampler_params d;
    memset(&d, 0, sizeof d);
    smp_params sp;
    tsr__smp_params_default(&sp);
    d.temp = sp.temp;
    d.top_k = sp.top_k;
    d.top_p = sp.top_p;
    d.min_p = sp.min_p;
    d.repeat_penalty = sp.repeat_penalty;
    d.repeat_last_n = sp.repeat_last_n;
    d.seed = sp.seed;
    d.freq_penalty = sp.freq_penalty;
    d.presence_penalty = sp.presence_penalty;
    d.size = size < sizeof d ? size : sizeof d;
    memcpy(p, &d, d.size);
    p->size = size;
}

/* Penalties finite; each bias on a token of the vocabulary, not NaN, not +inf. */
static tsr_status check_bias(const tsr_sampler_params *q, int32_t n_vocab) {
    if (!isfinite(q->freq_penalty) || !isfinite(q->presence_penalty))
        return tsr__error(TSR_E_INVALID, "tsr_sampler_new: freq_penalty %g and presence_penalty %g must be finite",
                          q->freq_penalty, q->presence_penalty);
    if (q->n_logit_bias > 0 && !q->logit_bias)
        return tsr__error(TSR_E_INVALID, "tsr_sampler_new: n_logit_bias %zu with a NULL logit_bias", q->n_logit_bias);
    for (size_t i = 0; i < q->n_logit_bias; i++) {
        const tsr_logit_bias *b = &q->logit_bias[i];
        if (b->token < 0 || b->token >= n_vocab || isnan(b->bias) || b->bias == INFINITY)
            return tsr__error(TSR_E_INVALID,
                              "tsr_sampler_new: logit_bias[%zu]: token %d (vocabulary 0..%d), bias %g (not NaN nor "
                              "+inf)",
                              i, b->token, n_vocab - 1, b->bias);
    }
    return TSR_OK;
}

/* The biases into the sampler (two arrays, copied). */
static tsr_status set_bias(tsr_sampler *s, const tsr_sampler_params *q) {
    size_t n = q->n_logit_bias;
    if (n == 0)
        return TSR_OK;
    int32_t *ids = tsr__malloc(n * sizeof *ids);
    float *bias = tsr__malloc(n * sizeof *bias);
    tsr_status st = ids && bias ? TSR_OK : tsr__error(TSR_E_NOMEM, "tsr_sampler_new: out of host memory");
    for (size_t i = 0; st == TSR_OK && i < n; i++) {
        ids[i] = q->logit_bias[i].token;
        bias[i] = q->logit_bias[i].bias;
    }
    if (st == TSR_OK)
        st = tsr__smp_set_bias(s->s, ids, bias, n);
    tsr__free(ids);
    tsr__free(bias);
    return st;
}

tsr_status tsr_sampler_new(const tsr_model *m, const tsr_sampler_params *p, tsr_sampler **out) {
    if (out)
        *out = NULL;
    if (!m || !out)
        return tsr__error(TSR_E_INVALID, "tsr_sampler_new: NULL %s", m ? "out" : "model");
    tsr_sampler_params q;
    tsr_sampler_params_init(&q, sizeof q);
    if (p && p->size > sizeof(size_t)) {
        size_t n = p->size < sizeof q ? p->size : sizeof q;
        memcpy((char *)&q + sizeof(size_t), (const char *)p + sizeof(size_t), n - sizeof(size_t));
    }
    /* NaN fails every comparison; top_p and min_p are probabilities */
    if (!(q.temp >= 0.0f && q.temp <= FLT_MAX) || !(q.top_p >= 0.0f && q.top_p <= 1.0f) ||
        !(q.min_p >= 0.0f && q.min_p <= 1.0f) || !(q.repeat_penalty > 0.0f && q.repeat_penalty <= FLT_MAX) ||
        q.repeat_last_n < 0 || q.repeat_last_n > TSR_SAMPLER_MAX_LAST_N)
        return tsr__error(TSR_E_INVALID,
                          "tsr_sampler_new: temp %g must be finite and >= 0, top_p %g and min_p %g within 0..1, "
                          "repeat_penalty %g finite and > 0, repeat_last_n %d within 0..%d",
                          q.temp, q.top_p, q.min_p, q.repeat_penalty, q.repeat_last_n, TSR_SAMPLER_MAX_LAST_N);
    tsr_status st = check_bias(&q, (int32_t)m->hp.n_vocab);
    if (st != TSR_OK)
        return st;
    smp_params sp;
    tsr__smp_params_default(&sp);
    sp.freq_penalty = q.freq_penalty;
    sp.presence_penalty = q.presence_penalty;
    sp.temp = q.temp;
    sp.top_k = q.top_k;
    sp.top_p = q.top_p;
    sp.min_p = q.min_p;
    sp.repeat_penalty = q.repeat_penalty;
    sp.repeat_last_n = q.repeat_last_n;
    sp.seed = q.seed;
    tsr_sampler *s = tsr__calloc(1, sizeof *s);
    if (!s)
        return tsr__error(TSR_E_NOMEM, "tsr_sampler_new: out of host memory");
    s->n_vocab = (int32_t)m->hp.n_vocab;
    st = tsr__smp_new(&sp, s->n_vocab, &s->s);
    if (st == TSR_OK && !(s->row = tsr__malloc((size_t)s->n_vocab * sizeof *s->row)))
        st = tsr__error(TSR_E_NOMEM, "tsr_sampler_new: out of host memory");
    if (st == TSR_OK)
        st = set_bias(s, &q);
    if (st != TSR_OK) {
        tsr_sampler_free(s);
        return st;
    }
    *out = s;
    return TSR_OK;
}

void tsr_sampler_free(tsr_sampler *s) {
    if (!s)
        return;
    tsr__smp_free(s->s);
    tsr__free(s->row);
    tsr__free(s);
}

int32_t tsr_sampler_sample(tsr_sampler *s, const float *logits) {
    if (!s || !logits) {
        tsr__error(TSR_E_INVALID, "tsr_sampler_sample: NULL %s", s ? "logits" : "sampler");
        return -1;
    }
    int32_t id = tsr__smp_sample(s->s, logits);
    tsr__smp_accept(s->s, id);
    return id;
}

tsr_status tsr_sampler_accept(tsr_sampler *s, int32_t token) {
    if (!s)
        return tsr__error(TSR_E_INVALID, "tsr_sampler_accept: NULL sampler");
    if (token < 0 || token >= s->n_vocab)
        return tsr__error(TSR_E_INVALID, "tsr_sampler_accept: token %d is outside the vocabulary (0..%d)", token,
                          s->n_vocab - 1);
    tsr__smp_accept(s->s, token);
    return TSR_OK;
}

void tsr_sampler_reset(tsr_sampler *s) {
    if (s)
        tsr__smp_reset(s->s);
}

/* Inserts (id, v) into the top list of n_top (sorted, most likely first,
 * ties by lower id: ids arrive increasing, so a tie stays behind). */
static void top_insert(int32_t *ids, float *vals, size_t *n, size_t n_top, int32_t id, float v) {
    if (*n == n_top && !(v > vals[*n - 1]))
        return;
    size_t j = *n < n_top ? (*n)++ : n_top - 1;
    while (j > 0 && v > vals[j - 1]) {
        ids[j] = ids[j - 1];
        vals[j] = vals[j - 1];
        j--;
    }
    ids[j] = id;
    vals[j] = v;
}

/* e^x for x <= 0 (0 below -87: a term that cannot change the sum) within
 * 2 units in the last place: 2^n * e^r, n = round(x / ln 2), r = x - n ln 2
 * (|r| <= ln 2 / 2, in two steps), e^r by its Taylor polynomial to r^7.
 * tsr_sampler_logprobs sums it over the vocabulary, 4 values at a time
 * with SSE2 (every x86-64): libm's exp there took 1.4 ms of a tensr-server
 * step of 8 streams (SmolLM2's 49152 tokens, Zen 4), ~300 us a row, the
 * other core idle meanwhile; about 20 us now. */
#define EXP_C1 0.693145752f /* ln 2 in two parts */
#define EXP_C2 1.42860677e-6f
/* e^r's Taylor coefficients, r^7 first */
static const float exp_c[8] = {1.98412698e-4f, 1.38888889e-3f, 8.33333333e-3f, 4.16666667e-2f,
                               1.66666667e-1f, 0.5f,           1.0f,           1.0f};
static inline float exp_le0(float x) {
    if (!(x > -87.0f))
        return 0.0f;
    const int32_t n = (int32_t)(x * 1.44269504f - 0.5f); /* x <= 0: rounded to nearest */
    const float r = (x - (float)n * EXP_C1) - (float)n * EXP_C2;
    float p = exp_c[0];
    for (int q = 1; q < 8; q++) p = p * r + exp_c[q];
    const uint32_t bits = (uint32_t)(n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* The sum of e^(row[i] - max) over n values (each <= max): in float lanes
 * 8 steps at a time, then in double. */
static double sum_exp(const float *row, int32_t n, float max) {
    double sum = 0.0;
    int32_t i = 0;
#ifdef __SSE2__
    const __m128 mx = _mm_set1_ps(max), lo = _mm_set1_ps(-87.0f);
    while (i + 4 <= n) {
        __m128 acc = _mm_setzero_ps();
        for (int k = 0; k < 8 && i + 4 <= n; k++, i += 4) {
            __m128 x = _mm_sub_ps(_mm_loadu_ps(row + i), mx);
            const __m128 live = _mm_cmpgt_ps(x, lo);
            x = _mm_max_ps(x, lo);
            const __m128i ni = _mm_cvttps_epi32(_mm_sub_ps(_mm_mul_ps(x, _mm_set1_ps(1.44269504f)), _mm_set1_ps(0.5f)));
            const __m128 nf = _mm_cvtepi32_ps(ni);
            const __m128 r = _mm_sub_ps(_mm_sub_ps(x, _mm_mul_ps(nf, _mm_set1_ps(EXP_C1))),
                                        _mm_mul_ps(nf, _mm_set1_ps(EXP_C2)));
            __m128 p = _mm_set1_ps(exp_c[0]);
            for (int q = 1; q < 8; q++) p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(exp_c[q]));
            const __m128 scale = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(ni, _mm_set1_epi32(127)), 23));
            acc = _mm_add_ps(acc, _mm_and_ps(live, _mm_mul_ps(p, scale)));
        }
        float t[4];
        _mm_storeu_ps(t, acc);
        sum += ((double)t[0] + (double)t[1]) + ((double)t[2] + (double)t[3]);
    }
#endif
    for (; i < n; i++) sum += exp_le0(row[i] - max);
    return sum;
}

tsr_status tsr_sampler_logprobs(const tsr_sampler *s, const float *logits, int32_t token, float *logprob, size_t n_top,
                                int32_t *top_tokens, float *top_logprobs) {
    if (!s || !logits || (n_top > 0 && (!top_tokens || !top_logprobs)))
        return tsr__error(TSR_E_INVALID, "tsr_sampler_logprobs: NULL %s",
                          !s        ? "sampler"
                          : !logits ? "logits"
                                    : "top arrays");
    if (token < -1 || token >= s->n_vocab)
        return tsr__error(TSR_E_INVALID, "tsr_sampler_logprobs: token %d is outside the vocabulary (0..%d)", token,
                          s->n_vocab - 1);
    float *row = s->row; /* scratch: the sampler is used by one thread at a time */
    tsr__smp_biased(s->s, logits, row);
    float max = -INFINITY;
    for (int32_t i = 0; i < s->n_vocab; i++) max = row[i] > max ? row[i] : max;
    const double sum = max == -INFINITY ? 0.0 : sum_exp(row, s->n_vocab, max);
    const float lse = (float)((double)max + log(sum));
    if (logprob)
        *logprob = token >= 0 ? row[token] - lse : 0.0f;
    if (n_top > (size_t)s->n_vocab)
        n_top = (size_t)s->n_vocab;
    size_t n = 0;
    for (int32_t i = 0; i < s->n_vocab && n_top > 0; i++) top_insert(top_tokens, top_logprobs, &n, n_top, i, row[i]);
    for (size_t j = 0; j < n; j++) top_logprobs[j] -= lse;
    return TSR_OK;
}
