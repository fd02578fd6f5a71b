/* session.c - tsr_session: a KV cache shared by up to n_seq_max sequences,
 * decode of mixed batches in micro-batches of n_ubatch tokens, the logits of
 * the rows asked for. Everything a decode needs beyond its per-graph
 * context (logits rows, positions, row indices) is allocated by
 * tsr_session_new, and the compute buffers are reserved there for the worst
 * micro-batch (n_ubatch tokens against a full cache, n_outputs_max rows), so
 * an out-of-memory shows at creation, never in the middle of a generation.
 *
 * The graph of the last micro-batch of up to 64 tokens is kept (its
 * context, output and inputs) and run again for the next micro-batch of
 * the same shape: the same number of tokens and of logits rows, and cells
 * that give the same n_kv (rounded up to 256 cells). Only its inputs are rewritten (tokens,
 * positions, rows, cells, masks), and the scheduler runs it on its last
 * plan (unless another graph ran on the backend in between): a generation
 * builds a graph once per 256 tokens and allocates nothing per token. TSR_GRAPH_REUSE=0 builds every graph. */
#include "model.h"

#include <stdlib.h>
#include <string.h>

#define KEEP_MAX_TOKENS 64 /* micro-batches whose graphs are kept */

struct tsr_session {
    tsr_model *m;
    tsr_session_params p; /* settled: n_ctx, n_batch, n_ubatch, ... as used */
    tsr_kv_cache *cache;
    float *logits; /* rows of the last decode, n_vocab each */
    int64_t cap_rows;
    int64_t *row_of; /* per token of the last decode: its logits row or -1 */
    size_t n_last;
    int32_t *pos, *out_ids, *next; /* scratch: n_batch positions, n_ubatch rows, n_seq_max next positions */
    int counted;                   /* made whole: counted in m->n_sessions */
    bool reuse;                    /* TSR_GRAPH_REUSE is not "0" */
    struct {                       /* the last micro-batch's graph (ctx NULL: none) */
        tsr_context *ctx;
        tsr_tensor *out;
        llm_fwd in;
    } g;
};

void tsr_session_params_init(tsr_session_params *p, size_t size) {
    if (!p || size < sizeof(size_t))
        return;
    tsr_session_params d;
    memset(&d, 0, sizeof d);
    d.n_ctx = 0;
    d.n_batch = 2048;
    d.n_ubatch = 512;
    d.n_seq_max = 1;
    d.n_outputs_max = 0; /* 0: n_seq_max */
    d.type_k = TSR_TYPE_F16;
    d.type_v = TSR_TYPE_F16;
    d.size = size < sizeof d ? size : sizeof d;
    memcpy(p, &d, d.size);
    p->size = size;
}

/* The caller's params over the defaults (only the fields it knows). */
static void params_read(const tsr_session_params *in, tsr_session_params *out) {
    tsr_session_params_init(out, sizeof *out);
    if (in && in->size > sizeof(size_t)) {
        size_t n = in->size < sizeof *out ? in->size : sizeof *out;
        memcpy((char *)out + sizeof(size_t), (const char *)in + sizeof(size_t), n - sizeof(size_t));
    }
    out->size = sizeof *out;
}

static tsr_status settle(const tsr_model *m, tsr_session_params *p) {
    const llm_hparams *hp = &m->hp;
    if (p->n_ctx < 0 || p->n_batch < 0 || p->n_ubatch < 0 || p->n_seq_max < 0 || p->n_outputs_max < 0)
        return tsr__error(TSR_E_INVALID,
                          "tsr_session_new: negative sizes (n_ctx %lld, n_batch %lld, n_ubatch %lld, "
                          "n_seq_max %d, n_outputs_max %lld)",
                          (long long)p->n_ctx, (long long)p->n_batch, (long long)p->n_ubatch, (int)p->n_seq_max,
                          (long long)p->n_outputs_max);
    if (p->n_ctx == 0)
        p->n_ctx = hp->n_ctx_train;
    if (p->n_ctx > INT32_MAX / 2)
        return tsr__error(TSR_E_INVALID, "tsr_session_new: context size %lld is too large", (long long)p->n_ctx);
    if (p->n_seq_max == 0)
        p->n_seq_max = 1;
    if (p->n_batch == 0 || p->n_batch > p->n_ctx)
        p->n_batch = p->n_ctx < 2048 ? p->n_ctx : 2048;
    if (p->n_ubatch == 0 || p->n_ubatch > p->n_batch)
        p->n_ubatch = p->n_batch < 512 ? p->n_batch : 512;
    if (p->n_outputs_max == 0)
        p->n_outputs_max = p->n_seq_max;
    if (p->n_outputs_max > p->n_ubatch)
        p->n_outputs_max = p->n_ubatch;
    return TSR_OK;
}

static tsr_status make_cache(tsr_session *s) {
    const llm_hparams *hp = &s->m->hp;
    tsr_kv_cache_params kp;
    tsr_kv_cache_params_init(&kp, sizeof kp);
    kp.n_layers = hp->n_layer;
    kp.n_ctx = s->p.n_ctx;
    kp.n_head_kv = hp->n_head_kv;
    kp.head_dim_k = hp->head_dim_k;
    kp.head_dim_v = hp->head_dim_v;
    kp.type_k = s->p.type_k;
    kp.type_v = s->p.type_v;
    kp.n_seq = s->p.n_seq_max;
    kp.n_batch_max = s->p.n_ubatch;
    kp.v_in_k = hp->kv_v_in_k; /* deepseek2's latent cache */
    kp.per_seq_cells = s->p.per_seq_cells != 0;
    /* the model's sliding window (gemma3); llama/mistral files may name one
     * (attention.sliding_window), but llama.cpp does not apply it there and
     * neither do we: hp->n_swa stays 0 for them */
    uint8_t *swa = NULL;
    if (hp->n_swa > 0) {
        if (!(swa = tsr__calloc((size_t)hp->n_layer, 1)))
            return tsr__error(TSR_E_NOMEM, "out of memory for %d layer flags", hp->n_layer);
        for (int il = 0; il < hp->n_layer; il++) swa[il] = (uint8_t)tsr__llm_layer_is_swa(hp, il);
        kp.n_swa = hp->n_swa;
        kp.swa_layers = swa;
    }
    tsr_status st = tsr_kv_cache_new(s->m->be, &kp, &s->cache);
    tsr__free(swa);
    return st == TSR_OK ? TSR_OK : tsr__error(st, "creating the KV cache: %s", tsr_last_error());
}

/* Sizes the compute buffers for the worst micro-batch. */
static tsr_status reserve(tsr_session *s) {
    tsr_context *ctx = tsr_context_new(s->m->be);
    if (!ctx)
        return tsr__error(TSR_E_NOMEM, "creating a context: %s", tsr_last_error());
    llm_batch b = {NULL, NULL, NULL, NULL, s->p.n_ubatch, s->p.n_outputs_max};
    tsr_tensor *out = NULL;
    tsr_status st = tsr_kv_cache_begin_reserve(s->cache, ctx, b.n);
    if (st != TSR_OK)
        st = tsr__error(st, "kv cache: %s", tsr_last_error());
    if (st == TSR_OK)
        st = tsr__llm_build(s->m, ctx, s->cache, &b, &out, NULL);
    if (st == TSR_OK && (st = tsr_reserve(ctx, &out, 1)) != TSR_OK)
        st = tsr__error(st, "reserving compute memory: %s", tsr_last_error());
    tsr_context_close(ctx);
    return st;
}

static tsr_status alloc_scratch(tsr_session *s) {
    const int64_t n_vocab = s->m->hp.n_vocab;
    int64_t n_ub = (s->p.n_batch + s->p.n_ubatch - 1) / s->p.n_ubatch;
    s->cap_rows = n_ub * s->p.n_outputs_max < s->p.n_batch ? n_ub * s->p.n_outputs_max : s->p.n_batch;
    if ((uint64_t)s->cap_rows > SIZE_MAX / sizeof(float) / (uint64_t)n_vocab)
        return tsr__error(TSR_E_NOMEM, "tsr_session_new: %lld logits rows of %lld do not fit in memory",
                          (long long)s->cap_rows, (long long)n_vocab);
    s->logits = tsr__malloc((size_t)s->cap_rows * (size_t)n_vocab * sizeof *s->logits);
    s->row_of = tsr__malloc((size_t)s->p.n_batch * sizeof *s->row_of);
    s->pos = tsr__malloc((size_t)s->p.n_batch * sizeof *s->pos);
    s->out_ids = tsr__malloc((size_t)s->p.n_ubatch * sizeof *s->out_ids);
    s->next = tsr__malloc((size_t)s->p.n_seq_max * sizeof *s->next);
    if (!s->logits || !s->row_of || !s->pos || !s->out_ids || !s->next)
        return tsr__error(TSR_E_NOMEM, "tsr_session_new: out of host memory for %lld logits rows",
                          (long long)s->cap_rows);
    return TSR_OK;
}

tsr_status tsr_session_new(tsr_model *m, const tsr_session_params *p, tsr_session **out) {
    if (out)
        *out = NULL;
    if (!m || !out)
        return tsr__error(TSR_E_INVALID, "tsr_session_new: NULL %s", m ? "out" : "model");
    if (m->vocab_only)
        return tsr__error(TSR_E_STATE, "tsr_session_new: the model was loaded with vocab_only (no weights)");
    tsr_session *s = tsr__calloc(1, sizeof *s);
    if (!s)
        return tsr__error(TSR_E_NOMEM, "tsr_session_new: out of host memory");
    s->m = m;
    const char *env = getenv("TSR_GRAPH_REUSE");
    s->reuse = !(env && strcmp(env, "0") == 0);
    params_read(p, &s->p);
    tsr_status st = settle(m, &s->p);
    if (st == TSR_OK)
        st = alloc_scratch(s);
    if (st == TSR_OK)
        st = make_cache(s);
    if (st == TSR_OK)
        st = reserve(s);
    if (st != TSR_OK) {
        tsr_session_free(s);
        return st;
    }
    m->n_sessions++;
    s->counted = 1;
    *out = s;
    return TSR_OK;
}

static void drop_graph(tsr_session *s) {
    tsr_context_close(s->g.ctx);
    memset(&s->g, 0, sizeof s->g);
}

void tsr_session_free(tsr_session *s) {
    if (!s)
        return;
    drop_graph(s);
    if (s->counted && --s->m->n_sessions == 0 && s->m->freed)
        tsr__llm_model_destroy(s->m);
    tsr_kv_cache_free(s->cache);
    tsr__free(s->logits);
    tsr__free(s->row_of);
    tsr__free(s->pos);
    tsr__free(s->out_ids);
    tsr__free(s->next);
    tsr__free(s);
}

int64_t tsr_session_n_ctx(const tsr_session *s) { return s ? s->p.n_ctx : 0; }

int32_t tsr_session_n_past(const tsr_session *s, int32_t seq) {
    if (!s || seq < 0 || seq >= s->p.n_seq_max)
        return -1;
    int32_t max = tsr_kv_cache_seq_pos_max(s->cache, seq);
    return max < 0 ? 0 : max + 1;
}

tsr_status tsr_session_remove(tsr_session *s, int32_t seq, int32_t p0, int32_t p1) {
    if (!s)
        return tsr__error(TSR_E_INVALID, "tsr_session_remove: NULL session");
    if (seq < -1 || seq >= s->p.n_seq_max)
        return tsr__error(TSR_E_INVALID, "tsr_session_remove: sequence %d is outside -1..%d", seq, s->p.n_seq_max - 1);
    if (p0 < 0)
        p0 = 0;
    tsr_status st = tsr_kv_cache_remove(s->cache, seq, p0, p1);
    return st == TSR_OK ? TSR_OK : tsr__error(st, "tsr_session_remove: %s", tsr_last_error());
}

static tsr_status seq_check(const tsr_session *s, int32_t seq, const char *what) {
    if (!s)
        return tsr__error(TSR_E_INVALID, "%s: NULL session", what);
    if (seq < 0 || seq >= s->p.n_seq_max)
        return tsr__error(TSR_E_INVALID, "%s: sequence %d is outside 0..%d", what, seq, s->p.n_seq_max - 1);
    return TSR_OK;
}

tsr_status tsr_session_seq_copy(tsr_session *s, int32_t src, int32_t dst, int32_t p0, int32_t p1) {
    tsr_status st = seq_check(s, src, "tsr_session_seq_copy");
    if (st == TSR_OK)
        st = seq_check(s, dst, "tsr_session_seq_copy");
    if (st == TSR_OK && (st = tsr_kv_cache_seq_copy(s->cache, src, dst, p0, p1)) != TSR_OK)
        st = tsr__error(st, "tsr_session_seq_copy: %s", tsr_last_error());
    return st;
}

tsr_status tsr_session_seq_save(const tsr_session *s, int32_t seq, void *buf, size_t cap, size_t *size) {
    tsr_status st = seq_check(s, seq, "tsr_session_seq_save");
    if (st == TSR_OK && !size)
        st = tsr__error(TSR_E_INVALID, "tsr_session_seq_save: NULL size");
    if (st == TSR_OK && (st = tsr_kv_cache_seq_save(s->cache, seq, buf, cap, size)) != TSR_OK)
        st = tsr__error(st, "tsr_session_seq_save: %s", tsr_last_error());
    return st;
}

tsr_status tsr_session_seq_load(tsr_session *s, int32_t seq, const void *buf, size_t size) {
    tsr_status st = seq_check(s, seq, "tsr_session_seq_load");
    if (st == TSR_OK && (st = tsr_kv_cache_seq_load(s->cache, seq, buf, size)) != TSR_OK)
        st = tsr__error(st, "tsr_session_seq_load: %s", tsr_last_error());
    return st;
}

const float *tsr_session_logits(const tsr_session *s, size_t i) {
    if (!s || i >= s->n_last || s->row_of[i] < 0)
        return NULL;
    return s->logits + (size_t)s->row_of[i] * (size_t)s->m->hp.n_vocab;
}

static int wants(const int8_t *want, size_t n, size_t i) { return want ? want[i] != 0 : i + 1 == n; }

/* Every check that can fail before anything changes. */
static tsr_status check_batch(const tsr_session *s, size_t n, const int32_t *tokens, const int32_t *pos,
                              const int32_t *seq, const int8_t *want) {
    /* first: a batch larger than the free cells is TSR_E_FULL, whatever
     * n_batch (capped at n_ctx) says, so that a caller can tell "make room"
     * from "split the call" */
    int64_t free_cells = s->p.n_ctx - tsr_kv_cache_used(s->cache);
    if ((uint64_t)n > (uint64_t)free_cells)
        return tsr__error(TSR_E_FULL, "tsr_session_decode: the cache has %lld free cells of %lld, the batch needs %zu",
                          (long long)free_cells, (long long)s->p.n_ctx, n);
    if (n > (size_t)s->p.n_batch)
        return tsr__error(TSR_E_INVALID, "tsr_session_decode: %zu tokens, the session takes at most n_batch %lld", n,
                          (long long)s->p.n_batch);
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= s->m->hp.n_vocab)
            return tsr__error(TSR_E_INVALID, "tsr_session_decode: token %zu: id %d is outside the vocabulary (0..%lld)",
                              i, tokens[i], (long long)s->m->hp.n_vocab - 1);
        if (seq && (seq[i] < 0 || seq[i] >= s->p.n_seq_max))
            return tsr__error(TSR_E_INVALID, "tsr_session_decode: token %zu: sequence %d is outside 0..%d", i, seq[i],
                              s->p.n_seq_max - 1);
        if (pos && pos[i] < 0)
            return tsr__error(TSR_E_INVALID, "tsr_session_decode: token %zu: position %d is negative", i, pos[i]);
    }
    for (size_t i0 = 0; i0 < n; i0 += (size_t)s->p.n_ubatch) {
        size_t nb = n - i0 < (size_t)s->p.n_ubatch ? n - i0 : (size_t)s->p.n_ubatch, rows = 0;
        for (size_t i = i0; i < i0 + nb; i++) rows += wants(want, n, i);
        if (rows > (size_t)s->p.n_outputs_max)
            return tsr__error(TSR_E_RANGE,
                              "tsr_session_decode: %zu logits rows asked in one micro-batch of %lld tokens, at most "
                              "n_outputs_max %lld were reserved",
                              rows, (long long)s->p.n_ubatch, (long long)s->p.n_outputs_max);
    }
    return TSR_OK;
}

/* Positions: given, or each sequence after its last one. */
static void fill_positions(tsr_session *s, size_t n, const int32_t *pos, const int32_t *seq) {
    if (pos) {
        memcpy(s->pos, pos, n * sizeof *pos);
        return;
    }
    for (int32_t q = 0; q < s->p.n_seq_max; q++) s->next[q] = tsr_session_n_past(s, q);
    for (size_t i = 0; i < n; i++) s->pos[i] = s->next[seq ? seq[i] : 0]++;
}

/* Batch b on the kept graph when it has its shape; *ran false (nothing
 * changed) when it has not. */
static tsr_status run_again(tsr_session *s, const llm_batch *b, bool *ran) {
    *ran = false;
    const llm_fwd *in = &s->g.in;
    if (!s->g.ctx || b->n != in->n || b->n_out != in->n_out || tsr__llm_gathers_rows(b) != (in->out_ids != NULL))
        return TSR_OK;
    tsr_status st = tsr_kv_cache_begin_again(s->cache, s->g.ctx, b->n, b->pos, b->seq);
    if (st == TSR_E_STATE) { /* another shape: a new graph */
        tsr_clear_error();
        return TSR_OK;
    }
    if (st != TSR_OK)
        return tsr__error(st, "kv cache: %s", tsr_last_error());
    const size_t n = (size_t)b->n * sizeof(int32_t);
    if ((st = tsr_tensor_write(in->tok, b->tokens, 0, n)) == TSR_OK &&
        (st = tsr_tensor_write(in->pos, b->pos, 0, n)) == TSR_OK && in->out_ids)
        st = tsr_tensor_write(in->out_ids, b->out_ids, 0, (size_t)b->n_out * sizeof(int32_t));
    if (st != TSR_OK)
        return tsr__error(st, "writing the inputs: %s", tsr_last_error());
    *ran = true;
    return TSR_OK;
}

/* A new graph for batch b, kept in s->g when it builds. */
static tsr_status build(tsr_session *s, const llm_batch *b) {
    drop_graph(s);
    tsr_context *ctx = tsr_context_new(s->m->be);
    if (!ctx)
        return tsr__error(TSR_E_NOMEM, "creating a context: %s", tsr_last_error());
    tsr_status st = tsr_kv_cache_begin(s->cache, ctx, b->n, b->pos, b->seq);
    if (st != TSR_OK)
        st = tsr__error(st, "kv cache: %s", tsr_last_error());
    if (st == TSR_OK)
        st = tsr__llm_build(s->m, ctx, s->cache, b, &s->g.out, &s->g.in);
    if (st != TSR_OK) {
        tsr_context_close(ctx);
        memset(&s->g, 0, sizeof s->g);
        return st;
    }
    s->g.ctx = ctx;
    return TSR_OK;
}

/* One micro-batch: tokens [i0, i0+nb) of the call; its rows go to logits row *row.. */
static tsr_status ubatch(tsr_session *s, size_t n, size_t i0, size_t nb, const int32_t *tokens, const int32_t *seq,
                         const int8_t *want, int64_t *row) {
    llm_batch b = {tokens + i0, s->pos + i0, seq ? seq + i0 : NULL, s->out_ids, (int64_t)nb, 0};
    for (size_t i = i0; i < i0 + nb; i++)
        if (wants(want, n, i)) {
            s->out_ids[b.n_out++] = (int32_t)(i - i0);
            s->row_of[i] = *row + b.n_out - 1;
        }
    const bool prof = tsr__prof_on();
    const int64_t t0 = prof ? tsr__prof_now() : 0;
    bool ran = false;
    tsr_status st = s->reuse ? run_again(s, &b, &ran) : TSR_OK;
    if (st == TSR_OK && !ran)
        st = build(s, &b);
    if (prof) {
        tsr__prof_add(0, tsr__prof_now() - t0);
        tsr__prof_tokens(b.n);
    }
    if (st == TSR_OK && (st = tsr_compute(s->g.ctx, &s->g.out, 1)) != TSR_OK)
        st = tsr__error(st, "compute: %s", tsr_last_error());
    if (st == TSR_OK && b.n_out > 0) {
        float *dst = s->logits + (size_t)*row * (size_t)s->m->hp.n_vocab;
        size_t bytes = (size_t)b.n_out * (size_t)s->m->hp.n_vocab * sizeof(float);
        if ((st = tsr_tensor_read(s->g.out, dst, 0, bytes)) != TSR_OK)
            st = tsr__error(st, "reading logits: %s", tsr_last_error());
    }
    /* a failed graph is not run again, nor kept a big one (its mask alone
     * is n_kv x n_tokens; its build is small next to its compute) */
    if (st != TSR_OK || !s->reuse || b.n > KEEP_MAX_TOKENS)
        drop_graph(s);
    *row += b.n_out;
    return st;
}

tsr_status tsr_session_decode(tsr_session *s, size_t n, const int32_t *tokens, const int32_t *pos, const int32_t *seq,
                              const int8_t *want_logits) {
    if (!s || (n > 0 && !tokens))
        return tsr__error(TSR_E_INVALID, "tsr_session_decode: NULL %s", s ? "tokens" : "session");
    tsr_status st = check_batch(s, n, tokens, pos, seq, want_logits);
    if (st != TSR_OK)
        return st;
    s->n_last = 0;
    fill_positions(s, n, pos, seq);
    for (size_t i = 0; i < n; i++) s->row_of[i] = -1;
    int64_t row = 0;
    size_t i0 = 0;
    for (; i0 < n && st == TSR_OK; i0 += (size_t)s->p.n_ubatch) {
        size_t nb = n - i0 < (size_t)s->p.n_ubatch ? n - i0 : (size_t)s->p.n_ubatch;
        st = ubatch(s, n, i0, nb, tokens, seq, want_logits, &row);
    }
    if (st != TSR_OK) { /* forget the cells this call took, so the cache stays as it was */
        for (size_t i = 0; i < i0 && i < n; i++)
            tsr_kv_cache_remove(s->cache, seq ? seq[i] : 0, s->pos[i], s->pos[i] + 1);
        return st;
    }
    s->n_last = n;
    return TSR_OK;
}
