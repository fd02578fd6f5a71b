/* gemma3.c - the Gemma 3 network (general.architecture "gemma3") on
 * libtensr's public API, as llama.cpp builds it: what differs from llama
 * (common.c reads the common hyper-parameters first; its row of the
 * table names the functions here).
 *
 * The graph: token embedding scaled by sqrt(n_embd); per layer RMS norm ->
 * Q/K/V -> per-head RMS norms of q and k -> NEOX rope (the windowed layers
 * with their own base, rope.freq_base_swa, 10000 by default, and no
 * scaling; the global layers with rope.freq_base and the file's scaling) ->
 * q scaled by 1/sqrt(head_dim) (1/sqrt(n_embd/n_head) for the 62-layer
 * 27B) -> tsr_attention with score scale 1 -> output projection -> RMS
 * norm (post_attention_norm) -> residual -> RMS norm -> GELU-gated FFN ->
 * RMS norm (post_ffw_norm) -> residual; then the final norm and the tied
 * head. The GGUF norms already hold Gemma's (1 + w) (the converter adds
 * the 1).
 *
 * Sliding window: attention.sliding_window positions on every layer but
 * every swa_period-th (attention.sliding_window_pattern, 6 by default:
 * five windowed layers, then one global); the KV cache builds the
 * windowed mask (tsr_kv_cache_params.n_swa/swa_layers, set by session.c
 * from tsr__llm_layer_is_swa). */
#include "model.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

int tsr__llm_is_gemma3(const llm_hparams *hp) { return strcmp(hp->arch, "gemma3") == 0; }

int tsr__llm_layer_is_swa(const llm_hparams *hp, int il) {
    if (hp->n_swa <= 0)
        return 0;
    return hp->swa_period == 0 || il % hp->swa_period < hp->swa_period - 1;
}

tsr_status tsr__gemma3_hparams_read(const tsr_gguf *g, llm_hparams *hp) {
    int64_t period = 6;
    float softcap = 0.0f;
    tsr_status st;
    if ((st = tsr__llm_key_i64(g, hp, "attention.sliding_window", 0, &hp->n_swa)) != TSR_OK ||
        (st = tsr__llm_key_i64(g, hp, "attention.sliding_window_pattern", 6, &period)) != TSR_OK ||
        (st = tsr__llm_key_f32(g, hp, "rope.freq_base_swa", 10000.0f, &hp->rope_freq_base_swa)) != TSR_OK ||
        (st = tsr__llm_key_f32(g, hp, "final_logit_softcapping", 0.0f, &softcap)) != TSR_OK)
        return st;
    if (period > INT32_MAX) /* past the layers it means every layer windowed, as in llama.cpp */
        period = INT32_MAX;
    hp->swa_period = (int)period;
    if (softcap != 0.0f)
        return tsr__error(TSR_E_UNSUPPORTED, "%s: final_logit_softcapping %g is not supported", tsr_gguf_path(g),
                          softcap);
    if (!(hp->rope_freq_base_swa > 0.0f))
        return tsr__error(TSR_E_MALFORMED, "%s: rope.freq_base_swa %g must be > 0", tsr_gguf_path(g),
                          hp->rope_freq_base_swa);
    /* gemma_pytorch's query_pre_attn_scalar: n_embd / n_head for the 27B
     * (62 layers), the head dimension otherwise, as llama.cpp has it */
    float d = hp->n_layer == 62 && hp->n_head > 0 ? (float)(hp->n_embd / hp->n_head) : (float)hp->head_dim_k;
    hp->attn_scale = 1.0f / sqrtf(d);
    return TSR_OK;
}

/* Its per-layer norms; no biases (LLM_NO_BIAS); the rest as llama. */
int tsr__gemma3_known_tensor(const llm_hparams *hp, const char *suffix) {
    (void)hp;
    return strcmp(suffix, "post_attention_norm.weight") == 0 || strcmp(suffix, "post_ffw_norm.weight") == 0 ? 1 : -1;
}

tsr_status tsr__gemma3_bind_layer(tsr_model *m, int il) {
    const llm_hparams *hp = &m->hp;
    llm_layer *l = &m->layers[il];
    tsr_status st0 = tsr__llm_bind_layer_std(m, il);
    if (st0 != TSR_OK)
        return st0;
    struct {
        const char *s;
        int64_t ne0;
        tsr_tensor **dst;
    } w[] = {
        {"attn_q_norm.weight", hp->head_dim_k, &l->g3.q_norm},
        {"attn_k_norm.weight", hp->head_dim_k, &l->g3.k_norm},
        {"post_attention_norm.weight", hp->n_embd, &l->g3.post_attn_norm},
        {"post_ffw_norm.weight", hp->n_embd, &l->g3.post_ffn_norm},
    };
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%d.%s", il, w[i].s);
        tsr_status st = tsr__llm_bind(m, name, w[i].ne0, 0, 0, w[i].dst);
        if (st != TSR_OK)
            return st;
    }
    return TSR_OK;
}

/* ---- the forward pass ---------------------------------------------------- */

typedef llm_fwd g3_fwd;

static tsr_tensor *norm(g3_fwd *f, tsr_tensor *x, tsr_tensor *w) {
    return tsr_mul(f->ctx, tsr_rms_norm(f->ctx, x, f->m->hp.norm_eps), w);
}

static tsr_tensor *rope(g3_fwd *f, int il, tsr_tensor *x) {
    const llm_hparams *hp = &f->m->hp;
    int swa = tsr__llm_layer_is_swa(hp, il);
    float base = swa ? hp->rope_freq_base_swa : hp->rope_freq_base;
    float scale = swa ? 1.0f : hp->rope_freq_scale;
    return tsr_rope_ext(f->ctx, x, f->pos, NULL, hp->n_rot, TSR_ROPE_NEOX, (int)hp->n_ctx_orig, base, scale, 0.0f, 1.0f,
                        32.0f, 1.0f);
}

/* Self-attention of layer il on the normed input: [head_dim_v*n_head, n]. */
static tsr_tensor *attention(g3_fwd *f, int il, tsr_tensor *cur) {
    const llm_hparams *hp = &f->m->hp;
    const llm_layer *l = &f->m->layers[il];
    tsr_context *ctx = f->ctx;
    tsr_tensor *q = tsr_reshape_3d(ctx, tsr_mul_mat(ctx, l->wq, cur), hp->head_dim_k, hp->n_head, f->n);
    tsr_tensor *k = tsr_reshape_3d(ctx, tsr_mul_mat(ctx, l->wk, cur), hp->head_dim_k, hp->n_head_kv, f->n);
    tsr_tensor *v = tsr_reshape_3d(ctx, tsr_mul_mat(ctx, l->wv, cur), hp->head_dim_v, hp->n_head_kv, f->n);
    q = tsr_scale(ctx, rope(f, il, norm(f, q, l->g3.q_norm)), hp->attn_scale);
    k = rope(f, il, norm(f, k, l->g3.k_norm));
    return tsr_attention(ctx, f->cache, il, q, k, v, 1.0f);
}

static tsr_tensor *out_rows(g3_fwd *f, tsr_tensor *t) { return f->out_ids ? tsr_get_rows(f->ctx, t, f->out_ids) : t; }

static tsr_tensor *feed_forward(g3_fwd *f, const llm_layer *l, tsr_tensor *x) {
    tsr_tensor *cur = norm(f, x, l->ffn_norm);
    tsr_tensor *gate = tsr_mul_mat(f->ctx, l->ffn_gate, cur);
    tsr_tensor *up = tsr_mul_mat(f->ctx, l->ffn_up, cur);
    return norm(f, tsr_mul_mat(f->ctx, l->ffn_down, tsr_geglu(f->ctx, gate, up)), l->g3.post_ffn_norm);
}

tsr_tensor *tsr__gemma3_graph(llm_fwd *f, tsr_tensor *tokens) {
    const tsr_model *m = f->m;
    tsr_context *ctx = f->ctx;
    tsr_tensor *x = tsr_scale(ctx, tsr_get_rows(ctx, m->tok_embd, tokens), sqrtf((float)m->hp.n_embd));
    for (int il = 0; il < m->hp.n_layer; il++) {
        const llm_layer *l = &m->layers[il];
        tsr_tensor *cur = attention(f, il, norm(f, x, l->attn_norm));
        if (il == m->hp.n_layer - 1) {
            if (f->n_out == 0)
                return cur;
            cur = out_rows(f, cur);
            x = out_rows(f, x);
        }
        x = tsr_add(ctx, norm(f, tsr_mul_mat(ctx, l->wo, cur), l->g3.post_attn_norm), x);
        x = tsr_add(ctx, feed_forward(f, l, x), x);
    }
    return tsr_mul_mat(ctx, m->output, norm(f, x, m->out_norm));
}
