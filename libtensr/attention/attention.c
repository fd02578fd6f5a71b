/*
 * attention.c - the attention helper: the one place where attention is
 * built, so every model gets the best path the backend offers.
 *
 *  - Writes: the batch's k and v go into the layer's cache cells with
 *    set_rows; V goes in transposed on the plain path (a set_rows of
 *    one-element rows over a 4-D view of the cache), so no copy is needed
 *    to read it.
 *  - Reads: views of the tensors set_rows returns, so the graph orders every
 *    write before the reads of the same layer.
 *  - Masks: the cache's causal mask, or its windowed mask for a layer with
 *    a sliding window; every path below takes the one it is given.
 *  - Flash path: one flash_attn node over the padded cache and mask.
 *  - Plain path: K*Q on permuted views, softmax with mask and scale,
 *    V*softmax, one permute + cont. When the scores of all heads would pass
 *    the backend's attention max batch, the heads (and, when one head does
 *    not fit, blocks of query tokens) are processed in steps whose scores
 *    fit, each step's result written into rows of one output tensor by a
 *    chain of set_rows (no concat chain; the chain also orders the steps so
 *    each step's scores are freed before the next one's are allocated).
 */
#include "attention/kvcache.h"

/* Scores of one (query head, query token) pair: the K*Q row; its softmax
 * overwrites it in place (the graph allocator hands a dying source's memory
 * to an element-wise result), so the row is the whole cost. */
static size_t pair_bytes(int64_t n_kv) { return (size_t)(n_kv > 0 ? n_kv : 1) * sizeof(float); }

void tsr__attention_plan(int64_t n_kv, int64_t n_tokens, int64_t n_head, int64_t n_head_kv, size_t max_batch,
                         tsr_attn_steps *out) {
    out->heads = n_head;
    out->tokens = n_tokens;
    out->n_steps = 1;
    size_t unit = pair_bytes(n_kv), total;
    if (max_batch == 0 || n_tokens == 0 || n_head == 0 || n_head_kv <= 0 ||
        (!tsr__mul_overflow(unit, (size_t)n_head * (size_t)n_tokens, &total) && total <= max_batch))
        return;
    int64_t pairs = (int64_t)(max_batch / unit), group = n_head / n_head_kv;
    if (pairs < 1)
        pairs = 1; /* one score row per step: the smallest step there is */
    if (pairs >= n_tokens) {
        int64_t fit = pairs / n_tokens;
        if (fit >= group) { /* whole KV groups per step */
            out->heads = fit / group * group;
            out->n_steps = (n_head + out->heads - 1) / out->heads;
        } else { /* part of one group per step */
            out->heads = fit;
            out->n_steps = n_head_kv * ((group + fit - 1) / fit);
        }
        return;
    }
    out->heads = 1;
    out->tokens = pairs;
    out->n_steps = n_head * ((n_tokens + pairs - 1) / pairs);
}

/* ---- the paths ------------------------------------------------------------------- */

static tsr_tensor *attn_flash(tsr_context *ctx, tsr_tensor *q, tsr_tensor *k, tsr_tensor *v, tsr_tensor *mask,
                              float scale) {
    tsr_tensor *qp = tsr_permute(ctx, q, 0, 2, 1, 3);           /* [head_dim, n_tokens, n_head] */
    tsr_tensor *o = tsr_flash_attn(ctx, qp, k, v, mask, scale); /* [head_dim_v, n_head, n_tokens] */
    return o ? tsr_reshape_2d(ctx, o, o->ne[0] * o->ne[1], o->ne[2]) : NULL;
}

/* Scores, softmax and V*softmax of q_part [head_dim, nt, nh] over k_part
 * [head_dim, n_kv, nk] and transposed v_part [n_kv, head_dim_v, nk].
 * Result [head_dim_v, nt, nh]. */
static tsr_tensor *attn_core(tsr_context *ctx, tsr_tensor *q_part, tsr_tensor *k_part, tsr_tensor *v_part,
                             tsr_tensor *mask, float scale) {
    tsr_tensor *kq = tsr_mul_mat(ctx, k_part, q_part);      /* [n_kv, nt, nh] */
    tsr_tensor *sm = tsr_softmax_ext(ctx, kq, mask, scale); /* masked, scaled */
    return tsr_mul_mat(ctx, v_part, sm);
}

static tsr_tensor *attn_plain(tsr_context *ctx, tsr_tensor *q, tsr_tensor *k, tsr_tensor *v, tsr_tensor *mask,
                              float scale) {
    tsr_tensor *qp = tsr_permute(ctx, q, 0, 2, 1, 3);
    tsr_tensor *o = attn_core(ctx, qp, k, v, mask, scale);
    o = tsr_cont(ctx, tsr_permute(ctx, o, 0, 2, 1, 3)); /* [head_dim_v, n_head, n_tokens] */
    return o ? tsr_reshape_2d(ctx, o, o->ne[0] * o->ne[1], o->ne[2]) : NULL;
}

typedef struct tsr_step {
    int64_t h0, nh, t0, nt;
} tsr_step;

/* The i-th step of a plan, in the order the output rows are filled. */
static tsr_step step_at(const tsr_attn_steps *pl, int64_t n_head, int64_t n_head_kv, int64_t n_tokens, int64_t i) {
    tsr_step s = {0, pl->heads, 0, pl->tokens};
    int64_t group = n_head / n_head_kv;
    if (pl->tokens < n_tokens) { /* one head per step, blocks of tokens */
        int64_t per_head = (n_tokens + pl->tokens - 1) / pl->tokens;
        s.h0 = i / per_head;
        s.t0 = (i % per_head) * pl->tokens;
    } else if (pl->heads >= group) { /* whole groups */
        s.h0 = i * pl->heads;
    } else { /* steps inside one group */
        int64_t per_group = (group + pl->heads - 1) / pl->heads;
        s.h0 = (i / per_group) * group + (i % per_group) * pl->heads;
        if (s.h0 + s.nh > (i / per_group + 1) * group)
            s.nh = (i / per_group + 1) * group - s.h0;
    }
    if (s.h0 + s.nh > n_head)
        s.nh = n_head - s.h0;
    if (s.t0 + s.nt > n_tokens)
        s.nt = n_tokens - s.t0;
    return s;
}

/* Output row of each step result row, in step order: row (tt, hh) of a step
 * goes to row (t0 + tt) * n_head + (h0 + hh) of [head_dim_v, n_head * n_tokens]. */
static tsr_tensor *step_rows(tsr_context *ctx, const tsr_attn_steps *pl, int64_t n_head, int64_t n_head_kv,
                             int64_t n_tokens) {
    int64_t ne[1] = {n_head * n_tokens};
    tsr_tensor *idx = tsr_input(ctx, TSR_TYPE_I64, 1, ne, NULL);
    if (!idx || !idx->data)
        return idx;
    int64_t *rows = idx->data;
    int64_t n = 0;
    for (int64_t i = 0; i < pl->n_steps; i++) {
        tsr_step s = step_at(pl, n_head, n_head_kv, n_tokens, i);
        for (int64_t hh = 0; hh < s.nh; hh++)
            for (int64_t tt = 0; tt < s.nt; tt++) rows[n++] = (s.t0 + tt) * n_head + s.h0 + hh;
    }
    return tsr_set_name(idx, "attn_step_rows");
}

/* One step: views of q, of the KV heads the step's query heads use, and of
 * the mask rows of its tokens. Result [head_dim_v, nt * nh]. */
static tsr_tensor *attn_step(tsr_context *ctx, tsr_tensor *q, tsr_tensor *k, tsr_tensor *v, tsr_tensor *mask,
                             float scale, tsr_step s, int64_t group) {
    int64_t hk0 = s.h0 / group, nk = s.nh >= group ? s.nh / group : 1;
    tsr_tensor *qs = tsr_view_3d(ctx, q, q->ne[0], s.nt, s.nh, q->nb[2], q->nb[1], s.h0 * q->nb[1] + s.t0 * q->nb[2]);
    tsr_tensor *ks = tsr_view_3d(ctx, k, k->ne[0], k->ne[1], nk, k->nb[1], k->nb[2], hk0 * k->nb[2]);
    tsr_tensor *vs = tsr_view_3d(ctx, v, v->ne[0], v->ne[1], nk, v->nb[1], v->nb[2], hk0 * v->nb[2]);
    tsr_tensor *ms = mask ? tsr_view_2d(ctx, mask, mask->ne[0], s.nt, mask->nb[1], s.t0 * mask->nb[1]) : NULL;
    if (mask && !ms)
        return NULL;
    tsr_tensor *o = attn_core(ctx, qs, ks, vs, ms, scale); /* [head_dim_v, nt, nh] */
    return o ? tsr_reshape_2d(ctx, o, o->ne[0], s.nt * s.nh) : NULL;
}

static tsr_tensor *attn_chunked(tsr_context *ctx, tsr_tensor *q, tsr_tensor *k, tsr_tensor *v, tsr_tensor *mask,
                                float scale, const tsr_attn_steps *pl) {
    int64_t n_head = q->ne[1], n_tokens = q->ne[2], n_head_kv = k->ne[2], hdv = v->ne[1];
    int64_t ne[2] = {hdv, n_head * n_tokens};
    tsr_tensor *out = tsr_set_name(tsr_empty(ctx, TSR_TYPE_F32, 2, ne), "attn_out");
    tsr_tensor *rows = step_rows(ctx, pl, n_head, n_head_kv, n_tokens);
    tsr_tensor *acc = out;
    size_t off = 0;
    for (int64_t i = 0; i < pl->n_steps && acc && rows; i++) {
        tsr_step s = step_at(pl, n_head, n_head_kv, n_tokens, i);
        tsr_tensor *o = attn_step(ctx, q, k, v, mask, scale, s, n_head / n_head_kv);
        tsr_tensor *ri = tsr_view_1d(ctx, rows, s.nt * s.nh, off);
        off += (size_t)(s.nt * s.nh) * sizeof(int64_t);
        acc = tsr_set_rows(ctx, acc, o, ri); /* depends on every earlier step */
    }
    return acc ? tsr_reshape_2d(ctx, acc, hdv * n_head, n_tokens) : NULL;
}

tsr_tensor *tsr__attention_build(tsr_context *ctx, tsr_tensor *q, tsr_tensor *k, tsr_tensor *v, tsr_tensor *mask,
                                 float scale, bool flash, size_t max_batch) {
    if (!q || !k || !v)
        return NULL;
    if (flash)
        return attn_flash(ctx, q, k, v, mask, scale);
    tsr_attn_steps pl;
    tsr__attention_plan(k->ne[1], q->ne[2], q->ne[1], k->ne[2], max_batch, &pl);
    if (pl.n_steps <= 1)
        return attn_plain(ctx, q, k, v, mask, scale);
    return attn_chunked(ctx, q, k, v, mask, scale, &pl);
}

/* ---- argument checks ------------------------------------------------------------ */

static bool attn_srcs(tsr_context *ctx, const char *fn, tsr_tensor *q, tsr_tensor *k, tsr_tensor *v) {
    if (!ctx) {
        tsr__error(TSR_E_INVALID, "%s: NULL context", fn);
        return false;
    }
    if (!q || !k || !v) {
        if (ctx->status == TSR_OK)
            tsr__op_error(ctx, TSR_E_INVALID, "%s: %s is NULL", fn, !q ? "q" : !k ? "k" : "v");
        return false;
    }
    return true;
}

/* q [hd_k, n_head, n_tok], k [hd_k, n_head_kv, n_kv], v [hd_v, n_head_kv, n_kv]. */
static bool attn_shapes(tsr_context *ctx, const char *fn, const tsr_tensor *q, const tsr_tensor *k,
                        const tsr_tensor *v) {
    if (q->type != TSR_TYPE_F32) {
        tsr__op_error(ctx, TSR_E_UNSUPPORTED, "%s: q has type %s; expected f32", fn, tsr_type_name(q->type));
        return false;
    }
    bool ok = q->ne[3] == 1 && k->ne[3] == 1 && v->ne[3] == 1 && q->ne[0] == k->ne[0] && k->ne[1] == v->ne[1] &&
              k->ne[2] == v->ne[2] && k->ne[1] > 0 && q->ne[1] % k->ne[1] == 0;
    if (!ok)
        tsr__op_error(ctx, TSR_E_INVALID,
                      "%s: q [%lld, %lld, %lld, %lld], k [%lld, %lld, %lld, %lld], v [%lld, %lld, %lld, %lld] do not "
                      "match: expected q [head_dim_k, n_head, n_tokens], k [head_dim_k, n_head_kv, n], v "
                      "[head_dim_v, n_head_kv, n] with n_head a multiple of n_head_kv",
                      fn, (long long)q->ne[0], (long long)q->ne[1], (long long)q->ne[2], (long long)q->ne[3],
                      (long long)k->ne[0], (long long)k->ne[1], (long long)k->ne[2], (long long)k->ne[3],
                      (long long)v->ne[0], (long long)v->ne[1], (long long)v->ne[2], (long long)v->ne[3]);
    return ok;
}

tsr_tensor *tsr_attention_nocache(tsr_context *ctx, tsr_tensor *q, tsr_tensor *k, tsr_tensor *v, tsr_tensor *mask,
                                  float scale) {
    const char *fn = "tsr_attention_nocache";
    if (!attn_srcs(ctx, fn, q, k, v) || !attn_shapes(ctx, fn, q, k, v))
        return NULL;
    if (mask && (mask->ne[0] != k->ne[2] || mask->ne[1] < q->ne[2] || mask->ne[2] != 1 || mask->ne[3] != 1))
        return tsr__op_error(ctx, TSR_E_INVALID,
                             "%s: mask [%lld, %lld, %lld, %lld] must be [n_kv = %lld, >= n_tokens = %lld]", fn,
                             (long long)mask->ne[0], (long long)mask->ne[1], (long long)mask->ne[2],
                             (long long)mask->ne[3], (long long)k->ne[2], (long long)q->ne[2]);
    bool flash = tsr_backend_flash_attn(ctx->backend) != 0;
    tsr_tensor *kp = tsr_permute(ctx, k, 0, 2, 1, 3); /* [head_dim_k, n_kv, n_head_kv] */
    /* the plain path reads V transposed: the one copy a caller without a cache pays */
    tsr_tensor *vp = flash ? tsr_permute(ctx, v, 0, 2, 1, 3) : tsr_cont(ctx, tsr_permute(ctx, v, 1, 2, 0, 3));
    return tsr__attention_build(ctx, q, kp, vp, mask, scale, flash, tsr_backend_attn_max_batch(ctx->backend));
}

/* ---- with the cache ------------------------------------------------------------- */

/* Writes src [hd, n_head_kv, n_tokens] as rows of cache t [hd, n_ctx,
 * n_head_kv] at the batch's cells; returns the written cache. */
static tsr_tensor *write_rows(tsr_context *ctx, tsr_tensor *t, tsr_tensor *src, tsr_tensor *idx) {
    return tsr_set_rows(ctx, t, tsr_permute(ctx, src, 0, 2, 1, 3), idx);
}

/* Writes v [hd_v, n_head_kv, n_tokens] into the transposed cache t
 * [n_ctx, hd_v * n_head_kv]: element (d, h) of token i goes to column
 * cell(i), row h * hd_v + d. Seen as [1, n_ctx, hd_v, n_head_kv] the cache
 * takes one-element rows at the cells, and v seen as [1, n_tokens, hd_v,
 * n_head_kv] gives them, whatever v's strides. */
static tsr_tensor *write_transposed(tsr_context *ctx, tsr_tensor *t, tsr_tensor *v, tsr_tensor *idx) {
    int64_t hd = v->ne[0], nkv = v->ne[1], n_ctx = t->ne[0];
    size_t es = t->nb[0];
    tsr_tensor *dst = tsr_view_4d(ctx, t, 1, n_ctx, hd, nkv, es, (size_t)n_ctx * es, (size_t)(n_ctx * hd) * es, 0);
    tsr_tensor *src = tsr_view_4d(ctx, v, 1, v->ne[2], hd, nkv, v->nb[2], v->nb[0], v->nb[1], 0);
    return tsr_set_rows(ctx, dst, src, idx);
}

static bool attn_cache_ok(tsr_context *ctx, const tsr_kv_cache *c, int il, const tsr_tensor *q, const tsr_tensor *k,
                          const tsr_tensor *v) {
    const char *fn = "tsr_attention";
    if (!c)
        return tsr__op_error(ctx, TSR_E_INVALID, "%s: NULL cache", fn), false;
    if (c->ctx != ctx)
        return tsr__op_error(ctx, TSR_E_STATE, "%s: call tsr_kv_cache_begin with this context first", fn), false;
    if (il < 0 || il >= c->p.n_layers)
        return tsr__op_error(ctx, TSR_E_RANGE, "%s: layer %d is not 0..%d", fn, il, c->p.n_layers - 1), false;
    if (k->type != TSR_TYPE_F32 || v->type != TSR_TYPE_F32)
        return tsr__op_error(ctx, TSR_E_UNSUPPORTED, "%s: k and v must be f32 (they are %s and %s)", fn,
                             tsr_type_name(k->type), tsr_type_name(v->type)),
               false;
    if (k->ne[0] != c->l_hdk[il] || v->ne[0] != c->l_hdv[il] || k->ne[1] != c->l_nkvh[il] || k->ne[2] != c->n_tokens ||
        q->ne[2] != c->n_tokens)
        return tsr__op_error(ctx, TSR_E_INVALID,
                             "%s: k [%lld, %lld, %lld], v [%lld, ...] and q tokens %lld do not match layer %d of the "
                             "cache (head_dim_k %d, head_dim_v %d, n_head_kv %d) and the batch of %lld tokens",
                             fn, (long long)k->ne[0], (long long)k->ne[1], (long long)k->ne[2], (long long)v->ne[0],
                             (long long)q->ne[2], il, c->l_hdk[il], c->l_hdv[il], c->l_nkvh[il],
                             (long long)c->n_tokens),
               false;
    return true;
}

/* V read from K's cells (v_in_k): the first head_dim_v values of each K row,
 * as rows on the flash path, transposed by a copy on the plain path (which
 * reads V transposed; a quantized K is converted to F16 first, its blocks
 * cannot be transposed). kw: the written K cache. */
static tsr_tensor *v_of_k(tsr_context *ctx, const tsr_kv_cache *c, int il, tsr_tensor *kw) {
    tsr_tensor *vr = tsr_view_3d(ctx, kw, c->l_hdv[il], c->n_kv, c->l_nkvh[il], kw->nb[1], kw->nb[2], 0);
    if (c->flash || !vr)
        return vr;
    if (kw->type != TSR_TYPE_F32 && kw->type != TSR_TYPE_F16 && kw->type != TSR_TYPE_BF16)
        vr = tsr_cast(ctx, vr, TSR_TYPE_F16);
    return tsr_cont(ctx, tsr_permute(ctx, vr, 1, 0, 2, 3));
}

tsr_tensor *tsr_attention(tsr_context *ctx, tsr_kv_cache *cache, int il, tsr_tensor *q, tsr_tensor *k, tsr_tensor *v,
                          float scale) {
    const char *fn = "tsr_attention";
    if (cache && cache->p.v_in_k && !v && k && q && ctx && cache->ctx == ctx && il >= 0 && il < cache->p.n_layers) {
        /* latent attention: V is a view of K's cells; check q and k with
         * a stand-in v of the layer's width */
        v = tsr_view_3d(ctx, k, cache->l_hdv[il], k->ne[1], k->ne[2], k->nb[1], k->nb[2], 0);
        if (!v)
            return NULL;
    } else if (cache && cache->p.v_in_k && v && ctx) {
        return tsr__op_error(ctx, TSR_E_INVALID, "%s: the cache reads V from K (v_in_k): pass v NULL", fn);
    }
    if (!attn_srcs(ctx, fn, q, k, v) || !attn_shapes(ctx, fn, q, k, v) || !attn_cache_ok(ctx, cache, il, q, k, v))
        return NULL;
    tsr_kv_cache *c = cache;
    int64_t n_kv = c->n_kv, nkvh = c->l_nkvh[il];
    tsr_tensor *kw = write_rows(ctx, &c->k[il], k, c->idx);
    tsr_tensor *kr = kw ? tsr_view_3d(ctx, kw, kw->ne[0], n_kv, nkvh, kw->nb[1], kw->nb[2], 0) : NULL;
    tsr_tensor *vr;
    if (c->p.v_in_k) {
        vr = kw ? v_of_k(ctx, c, il, kw) : NULL;
    } else if (c->flash) {
        tsr_tensor *vw = write_rows(ctx, &c->v[il], v, c->idx);
        vr = vw ? tsr_view_3d(ctx, vw, vw->ne[0], n_kv, nkvh, vw->nb[1], vw->nb[2], 0) : NULL;
    } else {
        tsr_tensor *vw = write_transposed(ctx, &c->v[il], v, c->idx);
        vr = vw ? tsr_view_3d(ctx, vw, n_kv, vw->ne[2], nkvh, vw->nb[2], vw->nb[3], 0) : NULL;
    }
    if (!kr || !vr)
        return NULL;
    tsr_tensor *mask = c->l_swa[il] && c->mask_swa ? c->mask_swa : c->mask;
    return tsr__attention_build(ctx, q, kr, vr, mask, scale, c->flash, tsr_backend_attn_max_batch(c->b));
}
