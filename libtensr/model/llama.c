/* llama.c - the llama/mistral-architecture network on libtensr's public
 * API: hyper-parameters from the GGUF metadata, the weights' shapes, and the
 * graph of one micro-batch.
 *
 * The graph: token embedding, per layer RMS norm -> Q/K/V (optional biases)
 * -> rope -> tsr_attention over the KV cache -> output projection ->
 * residual -> RMS norm -> SwiGLU FFN -> residual, then the final norm and
 * the output head. Only the rows whose logits are wanted go through the
 * last layer's FFN and the head (the largest matrix of a small model): they
 * are gathered with tsr_get_rows before it. */
#include "model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A libtensr call failed: keep its detail behind our prefix. */
static tsr_status fail_tsr(tsr_status st, const char *what) {
    return tsr__error(st, "%s: %s", what, tsr_last_error()[0] ? tsr_last_error() : tsr_status_string(st));
}

/* ---- hyper-parameters ---------------------------------------------------- */

/* Integer key ARCH.suffix: required (def < 0) or defaulted. */
static tsr_status key_i64(const tsr_gguf *g, const llm_hparams *hp, const char *suffix, int64_t def, int64_t *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", hp->arch, suffix);
    tsr_status st = tsr_gguf_get_i64(g, key, out);
    if (st == TSR_E_NOT_FOUND && def >= 0) {
        *out = def;
        return TSR_OK;
    }
    if (st == TSR_E_NOT_FOUND)
        return tsr__error(TSR_E_MALFORMED, "%s: required key '%s' is missing", tsr_gguf_path(g), key);
    if (st == TSR_E_TYPE)
        return tsr__error(TSR_E_UNSUPPORTED,
                          "%s: key '%s' is not a single integer (per-layer values are not supported)", tsr_gguf_path(g),
                          key);
    if (st != TSR_OK)
        return fail_tsr(st, key);
    if (*out < 0 || *out > (int64_t)1 << 40)
        return tsr__error(TSR_E_MALFORMED, "%s: key '%s' = %lld is out of range", tsr_gguf_path(g), key,
                          (long long)*out);
    return TSR_OK;
}

/* The same for a count kept in an int: values past INT32_MAX are refused, not truncated. */
static tsr_status key_int(const tsr_gguf *g, const llm_hparams *hp, const char *suffix, int64_t def, int *out) {
    int64_t v = 0;
    tsr_status st = key_i64(g, hp, suffix, def, &v);
    if (st == TSR_OK && v > INT32_MAX)
        st = tsr__error(TSR_E_MALFORMED, "%s: key '%s.%s' = %lld is out of range (at most %d)", tsr_gguf_path(g),
                        hp->arch, suffix, (long long)v, INT32_MAX);
    *out = st == TSR_OK ? (int)v : 0;
    return st;
}

static tsr_status key_f32(const tsr_gguf *g, const llm_hparams *hp, const char *suffix, float def, float *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", hp->arch, suffix);
    tsr_status st = tsr_gguf_get_f32(g, key, out);
    if (st == TSR_E_NOT_FOUND) {
        *out = def;
        return TSR_OK;
    }
    if (st != TSR_OK)
        return fail_tsr(st, key);
    if (!isfinite(*out))
        return tsr__error(TSR_E_MALFORMED, "%s: key '%s' is not a finite number", tsr_gguf_path(g), key);
    return TSR_OK;
}

/* Rope scaling: none and linear are supported; YaRN and others are not. */
static tsr_status read_rope_scaling(const tsr_gguf *g, llm_hparams *hp) {
    char key[160];
    const char *type = "none";
    float factor = 0.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.type", hp->arch);
    if (tsr_gguf_find_key(g, key) >= 0 && tsr_gguf_get_str(g, key, &type, NULL) != TSR_OK)
        return tsr__error(TSR_E_MALFORMED, "%s: key '%s' is not a string", tsr_gguf_path(g), key);
    tsr_status st = key_f32(g, hp, "rope.scaling.factor", 0.0f, &factor);
    if (st == TSR_OK && factor == 0.0f)
        st = key_f32(g, hp, "rope.scale_linear", 0.0f, &factor);
    if (st != TSR_OK)
        return st;
    if (strcmp(type, "none") != 0 && strcmp(type, "linear") != 0)
        return tsr__error(TSR_E_UNSUPPORTED, "%s: rope scaling '%s' is not supported (only none and linear)",
                          tsr_gguf_path(g), type);
    if (strcmp(type, "none") == 0 && tsr_gguf_find_key(g, key) >= 0)
        factor = 0.0f;
    if (factor < 0.0f)
        return tsr__error(TSR_E_MALFORMED, "%s: rope scaling factor %g is negative", tsr_gguf_path(g), factor);
    hp->rope_freq_scale = factor > 0.0f ? 1.0f / factor : 1.0f;
    int64_t orig;
    st = key_i64(g, hp, "rope.scaling.original_context_length", hp->n_ctx_train, &orig);
    hp->n_ctx_orig = orig;
    return st;
}

/* Sizes that must agree with each other; one message per inconsistency. */
static tsr_status check_hparams(const tsr_gguf *g, const llm_hparams *hp) {
    const char *path = tsr_gguf_path(g);
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 || hp->n_ff <= 0)
        return tsr__error(TSR_E_MALFORMED, "%s: embedding %lld, layers %d, heads %d/%d, ffn %lld: all must be > 0",
                          path, (long long)hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, (long long)hp->n_ff);
    if (hp->n_head % hp->n_head_kv != 0)
        return tsr__error(TSR_E_MALFORMED, "%s: head_count %d is not a multiple of head_count_kv %d", path, hp->n_head,
                          hp->n_head_kv);
    if (hp->head_dim_k <= 0 || hp->head_dim_v <= 0)
        return tsr__error(TSR_E_MALFORMED, "%s: head dimension k %d v %d (embedding %lld over %d heads)", path,
                          hp->head_dim_k, hp->head_dim_v, (long long)hp->n_embd, hp->n_head);
    if (hp->n_rot <= 0 || hp->n_rot % 2 != 0 || hp->n_rot > hp->head_dim_k)
        return tsr__error(TSR_E_MALFORMED, "%s: rope.dimension_count %d must be even and in 1..%d", path, hp->n_rot,
                          hp->head_dim_k);
    if (!(hp->norm_eps > 0.0f) || !(hp->rope_freq_base > 0.0f))
        return tsr__error(TSR_E_MALFORMED, "%s: rms epsilon %g and rope freq_base %g must be > 0", path, hp->norm_eps,
                          hp->rope_freq_base);
    return TSR_OK;
}

/* Head dimensions: key_length/value_length when given (Mistral-style),
 * else n_embd / n_head, which must then divide evenly. */
static tsr_status read_head_dims(const tsr_gguf *g, llm_hparams *hp) {
    int64_t def = hp->n_head > 0 && hp->n_embd % hp->n_head == 0 ? hp->n_embd / hp->n_head : 0;
    tsr_status st = key_int(g, hp, "attention.key_length", def, &hp->head_dim_k);
    if (st == TSR_OK)
        st = key_int(g, hp, "attention.value_length", def, &hp->head_dim_v);
    if (st == TSR_OK)
        st = key_int(g, hp, "rope.dimension_count", hp->head_dim_k, &hp->n_rot);
    return st;
}

static tsr_status read_arch(const tsr_gguf *g, llm_hparams *hp) {
    const char *arch;
    size_t len;
    if (tsr_gguf_get_str(g, "general.architecture", &arch, &len) != TSR_OK)
        return tsr__error(TSR_E_MALFORMED, "%s: no general.architecture string", tsr_gguf_path(g));
    if (strcmp(arch, "llama") != 0 && strcmp(arch, "mistral") != 0 && strcmp(arch, "gemma3") != 0)
        return tsr__error(TSR_E_UNSUPPORTED, "%s: architecture '%s' is not supported (llama, mistral and gemma3 are)",
                          tsr_gguf_path(g), arch);
    snprintf(hp->arch, sizeof hp->arch, "%s", arch);
    return TSR_OK;
}

/* Fills the sizes that come from tensor shapes: vocabulary, tied head. */
static tsr_status read_tensor_facts(const tsr_gguf *g, llm_hparams *hp) {
    int64_t i = tsr_gguf_find_tensor(g, "token_embd.weight");
    if (i < 0)
        return tsr__error(TSR_E_MALFORMED, "%s: tensor 'token_embd.weight' is missing", tsr_gguf_path(g));
    hp->n_vocab = tsr_gguf_tensor_ne(g, i, 1);
    hp->tied_output = tsr_gguf_find_tensor(g, "output.weight") < 0;
    hp->has_rope_freqs = tsr_gguf_find_tensor(g, "rope_freqs.weight") >= 0;
    if (tsr_gguf_find_tensor(g, "blk.0.ffn_gate_inp.weight") >= 0)
        return tsr__error(TSR_E_UNSUPPORTED, "%s: mixture-of-experts layers (ffn_gate_inp) are not supported",
                          tsr_gguf_path(g));
    return TSR_OK;
}

tsr_status llm_hparams_read(const tsr_gguf *g, llm_hparams *hp) {
    tsr_status st;
    memset(hp, 0, sizeof *hp);
    if ((st = read_arch(g, hp)) != TSR_OK)
        return st;
    if ((st = key_i64(g, hp, "context_length", 4096, &hp->n_ctx_train)) != TSR_OK ||
        (st = key_i64(g, hp, "embedding_length", -1, &hp->n_embd)) != TSR_OK ||
        (st = key_i64(g, hp, "feed_forward_length", -1, &hp->n_ff)) != TSR_OK ||
        (st = key_int(g, hp, "block_count", -1, &hp->n_layer)) != TSR_OK ||
        (st = key_int(g, hp, "attention.head_count", -1, &hp->n_head)) != TSR_OK ||
        (st = key_int(g, hp, "attention.head_count_kv", hp->n_head, &hp->n_head_kv)) != TSR_OK)
        return st;
    if ((st = read_head_dims(g, hp)) != TSR_OK ||
        (st = key_f32(g, hp, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->norm_eps)) != TSR_OK ||
        (st = key_f32(g, hp, "rope.freq_base", 10000.0f, &hp->rope_freq_base)) != TSR_OK ||
        (st = read_rope_scaling(g, hp)) != TSR_OK ||
        (st = key_i64(g, hp, "attention.sliding_window", 0, &hp->sliding_window)) != TSR_OK ||
        (st = read_tensor_facts(g, hp)) != TSR_OK)
        return st;
    if (llm_is_gemma3(hp) && (st = gemma3_hparams_read(g, hp)) != TSR_OK)
        return st;
    return check_hparams(g, hp);
}

tsr_status llm_key_i64(const tsr_gguf *g, const llm_hparams *hp, const char *suffix, int64_t def, int64_t *out) {
    return key_i64(g, hp, suffix, def, out);
}

tsr_status llm_key_f32(const tsr_gguf *g, const llm_hparams *hp, const char *suffix, float def, float *out) {
    return key_f32(g, hp, suffix, def, out);
}

/* ---- weights ------------------------------------------------------------- */

/* Looks up a weight and checks its shape ({ne0, ne1}; ne1 = 0 for 1-D).
 * Optional weights may be absent (*out = NULL). */
static tsr_status bind(tsr_model *m, const char *name, int64_t ne0, int64_t ne1, int optional, tsr_tensor **out) {
    tsr_tensor *t = tsr_backend_weight(m->be, name);
    *out = t;
    if (!t) {
        tsr_clear_error();
        return optional ? TSR_OK
                        : tsr__error(TSR_E_MALFORMED, "%s: tensor '%s' is missing", tsr_gguf_path(m->gguf), name);
    }
    int64_t want1 = ne1 ? ne1 : 1;
    if (tsr_tensor_ne(t, 0) != ne0 || tsr_tensor_ne(t, 1) != want1 || tsr_tensor_ne(t, 2) != 1 ||
        tsr_tensor_ne(t, 3) != 1)
        return tsr__error(TSR_E_MALFORMED, "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                          tsr_gguf_path(m->gguf), name, (long long)tsr_tensor_ne(t, 0), (long long)tsr_tensor_ne(t, 1),
                          (long long)tsr_tensor_ne(t, 2), (long long)tsr_tensor_ne(t, 3), (long long)ne0,
                          (long long)want1);
    return TSR_OK;
}

tsr_status llm_bind(tsr_model *m, const char *name, int64_t ne0, int64_t ne1, int optional, tsr_tensor **out) {
    return bind(m, name, ne0, ne1, optional, out);
}

static tsr_status bind_layer(tsr_model *m, int il) {
    const llm_hparams *hp = &m->hp;
    llm_layer *l = &m->layers[il];
    int64_t nq = (int64_t)hp->n_head * hp->head_dim_k, nk = (int64_t)hp->n_head_kv * hp->head_dim_k;
    int64_t nv = (int64_t)hp->n_head_kv * hp->head_dim_v, no = (int64_t)hp->n_head * hp->head_dim_v;
    struct {
        const char *s;
        int64_t ne0, ne1;
        int opt;
        tsr_tensor **dst;
    } w[] = {
        {"attn_norm.weight", hp->n_embd, 0, 0, &l->attn_norm},
        {"attn_q.weight", hp->n_embd, nq, 0, &l->wq},
        {"attn_k.weight", hp->n_embd, nk, 0, &l->wk},
        {"attn_v.weight", hp->n_embd, nv, 0, &l->wv},
        {"attn_output.weight", no, hp->n_embd, 0, &l->wo},
        {"attn_q.bias", nq, 0, 1, &l->bq},
        {"attn_k.bias", nk, 0, 1, &l->bk},
        {"attn_v.bias", nv, 0, 1, &l->bv},
        {"attn_output.bias", hp->n_embd, 0, 1, &l->bo},
        {"ffn_norm.weight", hp->n_embd, 0, 0, &l->ffn_norm},
        {"ffn_gate.weight", hp->n_embd, hp->n_ff, 0, &l->ffn_gate},
        {"ffn_up.weight", hp->n_embd, hp->n_ff, 0, &l->ffn_up},
        {"ffn_down.weight", hp->n_ff, hp->n_embd, 0, &l->ffn_down},
    };
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%d.%s", il, w[i].s);
        tsr_status st = bind(m, name, w[i].ne0, w[i].ne1, w[i].opt, w[i].dst);
        if (st != TSR_OK)
            return st;
    }
    if (hp->has_rope_freqs) {
        tsr_buffer_type *bt = tsr_backend_layer_buffer_type(m->be, il);
        l->rope_freqs = tsr_backend_weight_on(m->be, "rope_freqs.weight", bt ? tsr_buffer_type_device(bt) : NULL);
        if (!l->rope_freqs || tsr_tensor_nelements(l->rope_freqs) < hp->n_rot / 2)
            return tsr__error(TSR_E_MALFORMED, "%s: rope_freqs.weight must have %d elements", tsr_gguf_path(m->gguf),
                              hp->n_rot / 2);
    }
    return TSR_OK;
}

tsr_status llm_bind_weights(tsr_model *m) {
    const llm_hparams *hp = &m->hp;
    tsr_status st;
    if ((st = bind(m, "token_embd.weight", hp->n_embd, hp->n_vocab, 0, &m->tok_embd)) != TSR_OK ||
        (st = bind(m, "output_norm.weight", hp->n_embd, 0, 0, &m->out_norm)) != TSR_OK ||
        (st = bind(m, "output.weight", hp->n_embd, hp->n_vocab, 1, &m->output)) != TSR_OK)
        return st;
    if (!m->output)
        m->output = m->tok_embd; /* tied embedding */
    if (tsr_backend_n_layers(m->be) != hp->n_layer)
        return tsr__error(TSR_E_MALFORMED, "%s: block_count is %d but the file has %d layers of tensors",
                          tsr_gguf_path(m->gguf), hp->n_layer, tsr_backend_n_layers(m->be));
    m->layers = tsr__calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers)
        return tsr__error(TSR_E_NOMEM, "out of memory for %d layers", hp->n_layer);
    for (int il = 0; il < hp->n_layer; il++)
        if ((st = bind_layer(m, il)) != TSR_OK || (llm_is_gemma3(hp) && (st = gemma3_bind_layer(m, il)) != TSR_OK))
            return st;
    return TSR_OK;
}

/* ---- the forward pass ---------------------------------------------------- */

/* One micro-batch being built. */
typedef struct fwd {
    const tsr_model *m;
    tsr_context *ctx;
    tsr_kv_cache *cache;
    tsr_tensor *pos, *out_ids; /* out_ids NULL: every row is kept */
    int64_t n, n_out;
} fwd;

static tsr_tensor *rms_norm(fwd *f, tsr_tensor *x, tsr_tensor *w) {
    return tsr_mul(f->ctx, tsr_rms_norm(f->ctx, x, f->m->hp.norm_eps), w);
}

static tsr_tensor *linear(fwd *f, tsr_tensor *w, tsr_tensor *b, tsr_tensor *x) {
    tsr_tensor *y = tsr_mul_mat(f->ctx, w, x);
    return b ? tsr_add(f->ctx, y, b) : y;
}

static tsr_tensor *rope(fwd *f, tsr_tensor *x, tsr_tensor *factors) {
    const llm_hparams *hp = &f->m->hp;
    return tsr_rope_ext(f->ctx, x, f->pos, factors, hp->n_rot, TSR_ROPE_NORMAL, (int)hp->n_ctx_orig, hp->rope_freq_base,
                        hp->rope_freq_scale, 0.0f, 1.0f, 32.0f, 1.0f);
}

/* Self-attention of layer il on the normed input: [head_dim_v*n_head, n]. */
static tsr_tensor *attention(fwd *f, int il, tsr_tensor *cur) {
    const llm_hparams *hp = &f->m->hp;
    const llm_layer *l = &f->m->layers[il];
    tsr_context *ctx = f->ctx;
    tsr_tensor *q = linear(f, l->wq, l->bq, cur);
    tsr_tensor *k = linear(f, l->wk, l->bk, cur);
    tsr_tensor *v = linear(f, l->wv, l->bv, cur);
    q = rope(f, tsr_reshape_3d(ctx, q, hp->head_dim_k, hp->n_head, f->n), l->rope_freqs);
    k = rope(f, tsr_reshape_3d(ctx, k, hp->head_dim_k, hp->n_head_kv, f->n), l->rope_freqs);
    v = tsr_reshape_3d(ctx, v, hp->head_dim_v, hp->n_head_kv, f->n);
    float scale = 1.0f / sqrtf((float)hp->head_dim_k);
    return tsr_attention(ctx, f->cache, il, q, k, v, scale);
}

/* The rows whose logits are wanted of a [ne0, n] tensor. */
static tsr_tensor *out_rows(fwd *f, tsr_tensor *t) { return f->out_ids ? tsr_get_rows(f->ctx, t, f->out_ids) : t; }

static tsr_tensor *feed_forward(fwd *f, const llm_layer *l, tsr_tensor *x) {
    tsr_tensor *cur = rms_norm(f, x, l->ffn_norm);
    tsr_tensor *gate = tsr_mul_mat(f->ctx, l->ffn_gate, cur);
    tsr_tensor *up = tsr_mul_mat(f->ctx, l->ffn_up, cur);
    return tsr_mul_mat(f->ctx, l->ffn_down, tsr_swiglu(f->ctx, gate, up));
}

static tsr_tensor *graph(fwd *f, tsr_tensor *tokens) {
    const tsr_model *m = f->m;
    tsr_context *ctx = f->ctx;
    tsr_tensor *x = tsr_get_rows(ctx, m->tok_embd, tokens);
    for (int il = 0; il < m->hp.n_layer; il++) {
        const llm_layer *l = &m->layers[il];
        tsr_tensor *cur = attention(f, il, rms_norm(f, x, l->attn_norm));
        if (il == m->hp.n_layer - 1) {
            if (f->n_out == 0)
                return cur;
            cur = out_rows(f, cur);
            x = out_rows(f, x);
        }
        x = tsr_add(ctx, linear(f, l->wo, l->bo, cur), x);
        x = tsr_add(ctx, feed_forward(f, l, x), x);
    }
    return tsr_mul_mat(ctx, m->output, rms_norm(f, x, m->out_norm));
}

/* Whether out_ids[0..n_out) is 0..n-1 (every row: no gather). */
static int all_rows(const llm_batch *b) {
    if (b->n_out != b->n)
        return 0;
    for (int64_t i = 0; b->out_ids && i < b->n_out; i++)
        if (b->out_ids[i] != i)
            return 0;
    return 1;
}

tsr_status llm_build(const tsr_model *m, tsr_context *ctx, tsr_kv_cache *cache, const llm_batch *b, tsr_tensor **out) {
    if (llm_is_gemma3(&m->hp))
        return gemma3_build(m, ctx, cache, b, out);
    fwd f = {m, ctx, cache, NULL, NULL, b->n, b->n_out};
    int64_t ne = b->n, ne_out = b->n_out;
    tsr_tensor *tok = tsr_input(ctx, TSR_TYPE_I32, 1, &ne, b->tokens);
    f.pos = tsr_input(ctx, TSR_TYPE_I32, 1, &ne, b->pos);
    if (b->n_out > 0 && (!b->tokens || !all_rows(b)))
        f.out_ids = tsr_input(ctx, TSR_TYPE_I32, 1, &ne_out, b->out_ids);
    *out = graph(&f, tok);
    if (!*out) {
        tsr_status st = tsr_context_status(ctx);
        return tsr__error(st ? st : TSR_E_INVALID, "building the graph: %s",
                          tsr_context_error(ctx) ? tsr_context_error(ctx) : tsr_last_error());
    }
    return TSR_OK;
}
