/* llama.c - the llama family of networks (llama, mistral, qwen2, qwen3,
 * qwen3moe in the table of common.c), named and parameterised as llama.cpp
 * names them; the common hyper-parameters and weights are all it needs.
 *
 * The graph: token embedding, per layer RMS norm -> Q/K/V (optional biases)
 * -> (qwen3: per-head RMS norm of q and k) -> rope (normal or NEOX, per
 * architecture) -> tsr_attention over the KV cache -> output projection ->
 * residual -> RMS norm -> SwiGLU FFN, or a mixture of experts -> residual,
 * then the final norm and the output head. Only the rows whose logits are
 * wanted go through the last layer's FFN and the head (the largest matrix of
 * a small model): they are gathered with tsr_get_rows before it. */
#include "model.h"

#include <math.h>

/* Self-attention of layer il on the normed input: [head_dim_v*n_head, n]. */
static tsr_tensor *attention(llm_fwd *f, int il, tsr_tensor *cur) {
    const llm_hparams *hp = &f->m->hp;
    const llm_layer *l = &f->m->layers[il];
    tsr_context *ctx = f->ctx;
    tsr_tensor *q = tsr__llm_linear(f, l->wq, l->bq, cur);
    tsr_tensor *k = tsr__llm_linear(f, l->wk, l->bk, cur);
    tsr_tensor *v = tsr__llm_linear(f, l->wv, l->bv, cur);
    q = tsr_reshape_3d(ctx, q, hp->head_dim_k, hp->n_head, f->n);
    k = tsr_reshape_3d(ctx, k, hp->head_dim_k, hp->n_head_kv, f->n);
    if (l->attn_q_norm) { /* qwen3: RMS norm of each head before rope */
        q = tsr__llm_rms_norm(f, q, l->attn_q_norm);
        k = tsr__llm_rms_norm(f, k, l->attn_k_norm);
    }
    q = tsr__llm_rope(f, q, l->rope_freqs);
    k = tsr__llm_rope(f, k, l->rope_freqs);
    v = tsr_reshape_3d(ctx, v, hp->head_dim_v, hp->n_head_kv, f->n);
    float scale = 1.0f / sqrtf((float)hp->head_dim_k);
    return tsr_attention(ctx, f->cache, il, q, k, v, scale);
}

static tsr_tensor *feed_forward(llm_fwd *f, const llm_layer *l, tsr_tensor *x) {
    tsr_tensor *cur = tsr__llm_rms_norm(f, x, l->ffn_norm);
    if (l->ffn_gate_inp)
        return tsr__llm_moe(f, l, cur);
    return tsr__llm_ffn(f, l->ffn_gate, l->ffn_up, l->ffn_down, cur);
}

tsr_tensor *tsr__llama_graph(llm_fwd *f, tsr_tensor *tokens) {
    const tsr_model *m = f->m;
    tsr_context *ctx = f->ctx;
    tsr_tensor *x = tsr_get_rows(ctx, m->tok_embd, tokens);
    for (int il = 0; il < m->hp.n_layer; il++) {
        const llm_layer *l = &m->layers[il];
        tsr_tensor *cur = attention(f, il, tsr__llm_rms_norm(f, x, l->attn_norm));
        if (il == m->hp.n_layer - 1) {
            if (f->n_out == 0)
                return cur;
            cur = tsr__llm_out_rows(f, cur);
            x = tsr__llm_out_rows(f, x);
        }
        x = tsr_add(ctx, tsr__llm_linear(f, l->wo, l->bo, cur), x);
        x = tsr_add(ctx, feed_forward(f, l, x), x);
    }
    return tsr__llm_linear(f, m->output, m->output_b, tsr__llm_rms_norm(f, x, m->out_norm));
}
