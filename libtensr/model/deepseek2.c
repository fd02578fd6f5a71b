/* deepseek2.c - DeepSeek V2, V2-Lite, V3/R1 and Kimi-K2 (general.architecture
 * "deepseek2") on libtensr's public API, with llama.cpp's keys and tensor
 * names, built as llama.cpp's absorbed multi-head latent attention (MLA).
 *
 * Attention: q from the q LoRA (attn_q_a -> RMS norm attn_q_a_norm ->
 * attn_q_b) or the plain attn_q (V2-Lite), per head k_mla = nope + rope
 * wide; attn_kv_a_mqa gives the compressed kv (kv_lora_rank, RMS-normed by
 * attn_kv_a_norm) and one rope key shared by every head. The cache keeps,
 * per token, only [kv (kv_lora_rank) | rope key] (576 values for V3): one
 * KV head (tsr_kv_cache_params.v_in_k) whose first kv_lora_rank values
 * are V. Each head's q_nope is multiplied by its k_b into the latent space
 * and put before its roped q_pe, attention runs as GQA with one KV head of
 * width kv_lora_rank + rope (plain or flash path, attn_max_batch as any
 * model), and each head's latent result goes through its v_b, then
 * attn_output. The scores' scale is mscale^2 / sqrt(k_mla), mscale YaRN's
 * with the log multiplier, as llama.cpp computes it.
 *
 * k_b and v_b: the split attn_k_b [nope, kv_lora, n_head] and attn_v_b
 * [kv_lora, v_mla, n_head] of newer conversions; for legacy files with one
 * attn_kv_b [kv_lora, n_head * (nope + v_mla)], v_b is a strided view of
 * it, and k_b (which needs kv_b's rows transposed) is made in the graph:
 * the nope rows converted to F32 and transposed, n_head * nope * kv_lora
 * values per layer and micro-batch (llama.cpp instead expands K and V per
 * head for such files; the results agree to rounding).
 *
 * Feed-forward: the first leading_dense_block_count layers are dense
 * SwiGLU; the others a mixture of experts (common.c's tsr__llm_moe: softmax or
 * sigmoid scores, exp_probs_b for the choice only, grouped selection,
 * expert_weights_norm / expert_weights_scale) plus the shared experts'
 * SwiGLU FFN (ffn_*_shexp) added to the routed output. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static tsr_status key_int(const tsr_gguf *g, const llm_hparams *hp, const char *suffix, int64_t def, int *out) {
    int64_t v = 0;
    tsr_status st = tsr__llm_key_i64(g, hp, suffix, def, &v);
    if (st == TSR_OK && v > INT32_MAX)
        st = tsr__error(TSR_E_MALFORMED, "%s: key '%s.%s' is out of range", tsr_gguf_path(g), hp->arch, suffix);
    *out = st == TSR_OK ? (int)v : 0;
    return st;
}

/* A boolean key (llama.cpp writes expert_weights_norm as bool). */
static tsr_status key_bool(const tsr_gguf *g, const llm_hparams *hp, const char *suffix, int *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", hp->arch, suffix);
    *out = 0;
    if (tsr_gguf_find_key(g, key) < 0)
        return TSR_OK;
    if (tsr_gguf_get_bool(g, key, out) == TSR_OK)
        return TSR_OK;
    int64_t v = 0;
    tsr_clear_error();
    if (tsr_gguf_get_i64(g, key, &v) != TSR_OK)
        return tsr__error(TSR_E_MALFORMED, "%s: key '%s' is not a boolean", tsr_gguf_path(g), key);
    *out = v != 0;
    return TSR_OK;
}

tsr_status tsr__deepseek2_hparams_read(const tsr_gguf *g, llm_hparams *hp) {
    const char *path = tsr_gguf_path(g);
    int64_t q_lora = 0, kv_lora = 0, k_mla = 0, v_mla = 0;
    int gating = 0;
    float log_mul = 0.0f;
    tsr_status st;
    if ((st = tsr__llm_key_i64(g, hp, "attention.q_lora_rank", 0, &q_lora)) != TSR_OK ||
        (st = tsr__llm_key_i64(g, hp, "attention.kv_lora_rank", -1, &kv_lora)) != TSR_OK ||
        (st = tsr__llm_key_i64(g, hp, "attention.key_length_mla", hp->head_dim_k, &k_mla)) != TSR_OK ||
        (st = tsr__llm_key_i64(g, hp, "attention.value_length_mla", hp->head_dim_v, &v_mla)) != TSR_OK ||
        (st = key_int(g, hp, "leading_dense_block_count", 0, &hp->ds.n_dense_lead)) != TSR_OK ||
        (st = key_int(g, hp, "expert_shared_count", 0, &hp->ds.n_shared)) != TSR_OK ||
        (st = tsr__llm_key_f32(g, hp, "expert_weights_scale", 0.0f, &hp->moe_w_scale)) != TSR_OK ||
        (st = key_bool(g, hp, "expert_weights_norm", &hp->moe_norm_w)) != TSR_OK ||
        (st = key_int(g, hp, "expert_gating_func", 0, &gating)) != TSR_OK ||
        (st = tsr__llm_key_f32(g, hp, "rope.scaling.yarn_log_multiplier", 0.0f, &log_mul)) != TSR_OK)
        return st;
    /* llama.cpp's gating functions: 0 (absent: V2, V2.5) and 1 softmax, 2 sigmoid */
    if (gating > 2)
        return tsr__error(TSR_E_UNSUPPORTED, "%s: expert_gating_func %d is not supported (1 softmax, 2 sigmoid)", path,
                          gating);
    hp->moe_sigmoid = gating == 2;
    hp->ds.q_lora = q_lora;
    hp->ds.kv_lora = kv_lora;
    hp->ds.k_mla = k_mla;
    hp->ds.v_mla = v_mla;
    hp->ds.nope = k_mla - hp->n_rot;
    hp->ds.legacy_kv_b = tsr_gguf_find_tensor(g, "blk.0.attn_kv_b.weight") >= 0;
    if (kv_lora <= 0 || kv_lora > 65536 || v_mla <= 0 || v_mla > 65536 || hp->ds.nope < 1 || k_mla > 65536 ||
        q_lora > 1 << 20)
        return tsr__error(TSR_E_MALFORMED,
                          "%s: kv_lora_rank %lld, key_length_mla %lld (rope %d), value_length_mla %lld: all must be "
                          "> 0 and the key longer than its rope part",
                          path, (long long)kv_lora, (long long)k_mla, hp->n_rot, (long long)v_mla);
    if (hp->ds.n_dense_lead < 0 || hp->ds.n_dense_lead > hp->n_layer)
        return tsr__error(TSR_E_MALFORMED, "%s: leading_dense_block_count %d is not in 0..%d", path,
                          hp->ds.n_dense_lead, hp->n_layer);
    if (hp->ds.n_dense_lead < hp->n_layer && (hp->n_expert == 0 || hp->ds.n_shared < 0))
        return tsr__error(TSR_E_MALFORMED, "%s: mixture-of-experts layers without expert_count", path);
    /* the latent cache: one KV head [kv | rope key], V its first kv_lora values */
    hp->n_head_kv = 1;
    hp->head_dim_k = (int)(kv_lora + hp->n_rot);
    hp->head_dim_v = (int)kv_lora;
    hp->kv_v_in_k = 1;
    /* YaRN's mscale as llama.cpp has it: the context's attn_factor (with
     * the log multiplier, the converter's 0.1 taken back out, mscale ==
     * mscale_all_dims: 1 / (1 + 0.1 ln f)) for the rope, and the scores
     * pre-scaled by mscale^2 */
    float f = 1.0f / hp->rope_freq_scale, lnf = logf(f);
    if (log_mul != 0.0f) {
        log_mul /= 0.1f;
        if (hp->rope_ext_factor != 0.0f)
            hp->rope_attn_factor /= 1.0f + 0.1f * lnf;
    }
    float attn_org = hp->rope_attn_factor * (1.0f + 0.1f * lnf);
    float mscale = attn_org * (1.0f + 0.1f * log_mul * lnf);
    hp->ds.kq_scale = mscale * mscale / sqrtf((float)k_mla);
    return TSR_OK;
}

int tsr__deepseek2_known_tensor(const llm_hparams *hp, const char *suffix) {
    static const char *const names[] = {
        "attn_norm.weight",      "attn_q_a.weight",      "attn_q_a_norm.weight",  "attn_q_b.weight",
        "attn_q.weight",         "attn_kv_a_mqa.weight", "attn_kv_a_norm.weight", "attn_kv_b.weight",
        "attn_k_b.weight",       "attn_v_b.weight",      "attn_output.weight",    "ffn_norm.weight",
        "ffn_gate.weight",       "ffn_up.weight",        "ffn_down.weight",       "ffn_gate_inp.weight",
        "ffn_gate_exps.weight",  "ffn_up_exps.weight",   "ffn_down_exps.weight",  "exp_probs_b.bias",
        "ffn_gate_shexp.weight", "ffn_up_shexp.weight",  "ffn_down_shexp.weight",
    };
    (void)hp;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(suffix, names[i]) == 0)
            return 1;
    return 0;
}

typedef struct ds_weight {
    const char *s;
    int64_t ne0, ne1, ne2;
    int use, opt;
    tsr_tensor **dst;
} ds_weight;

/* Looks up blk.il.<s> with shape {ne0, ne1, ne2} (0: a dimension absent). */
static tsr_status bind_one(tsr_model *m, int il, const ds_weight *w) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", il, w->s);
    tsr_tensor *t = tsr_backend_weight(m->be, name);
    *w->dst = t;
    if (!t) {
        tsr_clear_error();
        return w->opt ? TSR_OK
                      : tsr__error(TSR_E_MALFORMED, "%s: tensor '%s' is missing", tsr_gguf_path(m->gguf), name);
    }
    int64_t want[4] = {w->ne0, w->ne1 ? w->ne1 : 1, w->ne2 ? w->ne2 : 1, 1};
    for (int d = 0; d < 4; d++)
        if (tsr_tensor_ne(t, d) != want[d])
            return tsr__error(
                TSR_E_MALFORMED, "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld]",
                tsr_gguf_path(m->gguf), name, (long long)tsr_tensor_ne(t, 0), (long long)tsr_tensor_ne(t, 1),
                (long long)tsr_tensor_ne(t, 2), (long long)tsr_tensor_ne(t, 3), (long long)want[0], (long long)want[1],
                (long long)want[2]);
    return TSR_OK;
}

tsr_status tsr__deepseek2_bind_layer(tsr_model *m, int il) {
    const llm_hparams *hp = &m->hp;
    llm_layer *l = &m->layers[il];
    int64_t e = hp->n_embd, nh = hp->n_head, ql = hp->ds.q_lora, kvl = hp->ds.kv_lora, r = hp->n_rot;
    int64_t kq = hp->ds.k_mla, nope = hp->ds.nope, vm = hp->ds.v_mla, ff = hp->n_ff, fx = hp->n_ff_exp;
    int64_t nx = hp->n_expert, sh = fx * hp->ds.n_shared;
    int dense = il<hp->ds.n_dense_lead, moe = !dense, lora = ql> 0, legacy = hp->ds.legacy_kv_b;
    ds_weight w[] = {
        {"attn_norm.weight", e, 0, 0, 1, 0, &l->attn_norm},
        {"attn_q_a.weight", e, ql, 0, lora, 0, &l->ds.q_a},
        {"attn_q_a_norm.weight", ql, 0, 0, lora, 0, &l->ds.q_a_norm},
        {"attn_q_b.weight", ql, nh * kq, 0, lora, 0, &l->ds.q_b},
        {"attn_q.weight", e, nh * kq, 0, !lora, 0, &l->wq},
        {"attn_kv_a_mqa.weight", e, kvl + r, 0, 1, 0, &l->ds.kv_a_mqa},
        {"attn_kv_a_norm.weight", kvl, 0, 0, 1, 0, &l->ds.kv_a_norm},
        {"attn_kv_b.weight", kvl, nh * (nope + vm), 0, legacy, 0, &l->ds.kv_b},
        {"attn_k_b.weight", nope, kvl, nh, !legacy, 0, &l->ds.k_b},
        {"attn_v_b.weight", kvl, vm, nh, !legacy, 0, &l->ds.v_b},
        {"attn_output.weight", nh * vm, e, 0, 1, 0, &l->wo},
        {"ffn_norm.weight", e, 0, 0, 1, 0, &l->ffn_norm},
        {"ffn_gate.weight", e, ff, 0, dense, 0, &l->ffn_gate},
        {"ffn_up.weight", e, ff, 0, dense, 0, &l->ffn_up},
        {"ffn_down.weight", ff, e, 0, dense, 0, &l->ffn_down},
        {"ffn_gate_inp.weight", e, nx, 0, moe, 0, &l->ffn_gate_inp},
        {"exp_probs_b.bias", nx, 0, 0, moe, 1, &l->ffn_exp_probs_b},
        {"ffn_gate_exps.weight", e, fx, nx, moe, 0, &l->ffn_gate_exps},
        {"ffn_up_exps.weight", e, fx, nx, moe, 0, &l->ffn_up_exps},
        {"ffn_down_exps.weight", fx, e, nx, moe, 0, &l->ffn_down_exps},
        {"ffn_gate_shexp.weight", e, sh, 0, moe && sh > 0, 0, &l->ds.gate_shexp},
        {"ffn_up_shexp.weight", e, sh, 0, moe && sh > 0, 0, &l->ds.up_shexp},
        {"ffn_down_shexp.weight", sh, e, 0, moe && sh > 0, 0, &l->ds.down_shexp},
    };
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        if (!w[i].use)
            continue;
        tsr_status st = bind_one(m, il, &w[i]);
        if (st != TSR_OK)
            return st;
    }
    return TSR_OK;
}

/* ---- the forward pass ---------------------------------------------------- */

/* k_b [nope, kv_lora, n_head] of a legacy attn_kv_b: its nope rows of each
 * head, F32, transposed. */
static tsr_tensor *legacy_k_b(llm_fwd *f, const llm_layer *l) {
    const llm_hparams *hp = &f->m->hp;
    tsr_context *ctx = f->ctx;
    tsr_tensor *kvb = l->ds.kv_b;
    size_t row = tsr_tensor_nb(kvb, 1);
    tsr_tensor *kn = tsr_view_3d(ctx, kvb, hp->ds.kv_lora, hp->ds.nope, hp->n_head, row,
                                 row * (size_t)(hp->ds.nope + hp->ds.v_mla), 0);
    kn = tsr_cast(ctx, kn, TSR_TYPE_F32); /* [kv_lora, nope, n_head] */
    return tsr_cont(ctx, tsr_permute(ctx, kn, 1, 0, 2, 3));
}

/* v_b [kv_lora, v_mla, n_head]: the split tensor or a view of attn_kv_b. */
static tsr_tensor *v_b(llm_fwd *f, const llm_layer *l) {
    const llm_hparams *hp = &f->m->hp;
    if (l->ds.v_b)
        return l->ds.v_b;
    size_t row = tsr_tensor_nb(l->ds.kv_b, 1);
    return tsr_view_3d(f->ctx, l->ds.kv_b, hp->ds.kv_lora, hp->ds.v_mla, hp->n_head, row,
                       row * (size_t)(hp->ds.nope + hp->ds.v_mla), row * (size_t)hp->ds.nope);
}

/* Latent attention of layer il on the normed input: [v_mla * n_head, n]. */
static tsr_tensor *attention(llm_fwd *f, int il, tsr_tensor *cur) {
    const llm_hparams *hp = &f->m->hp;
    const llm_layer *l = &f->m->layers[il];
    tsr_context *ctx = f->ctx;
    int64_t n = f->n, nh = hp->n_head, kvl = hp->ds.kv_lora, r = hp->n_rot, nope = hp->ds.nope;
    tsr_tensor *q = l->wq ? tsr_mul_mat(ctx, l->wq, cur)
                          : tsr_mul_mat(ctx, l->ds.q_b,
                                        tsr__llm_rms_norm(f, tsr_mul_mat(ctx, l->ds.q_a, cur), l->ds.q_a_norm));
    q = tsr_reshape_3d(ctx, q, hp->ds.k_mla, nh, n);
    size_t qb1 = tsr_tensor_nb(q, 1), qb2 = tsr_tensor_nb(q, 2);
    tsr_tensor *q_nope = tsr_view_3d(ctx, q, nope, nh, n, qb1, qb2, 0);
    tsr_tensor *q_pe = tsr_cont(ctx, tsr_view_3d(ctx, q, r, nh, n, qb1, qb2, (size_t)nope * sizeof(float)));
    q_pe = tsr__llm_rope(f, q_pe, NULL);

    tsr_tensor *kv = tsr_mul_mat(ctx, l->ds.kv_a_mqa, cur); /* [kv_lora + rope, n] */
    size_t kb1 = tsr_tensor_nb(kv, 1);
    tsr_tensor *kv_c = tsr_cont(ctx, tsr_view_2d(ctx, kv, kvl, n, kb1, 0));
    tsr_tensor *k_pe = tsr_cont(ctx, tsr_view_3d(ctx, kv, r, 1, n, kb1, kb1, (size_t)kvl * sizeof(float)));
    k_pe = tsr__llm_rope(f, k_pe, NULL);
    kv_c = tsr__llm_rms_norm(f, kv_c, l->ds.kv_a_norm);

    /* q_nope into the latent space, head by head: [kv_lora, n, n_head] */
    tsr_tensor *k_b = l->ds.k_b ? l->ds.k_b : legacy_k_b(f, l);
    tsr_tensor *q_abs = tsr_mul_mat(ctx, k_b, tsr_cont(ctx, tsr_permute(ctx, q_nope, 0, 2, 1, 3)));
    q_abs = tsr_cont(ctx, tsr_permute(ctx, q_abs, 0, 2, 1, 3)); /* [kv_lora, n_head, n] */
    tsr_tensor *qc = tsr_concat(ctx, q_abs, q_pe, 0);           /* [kv_lora + rope, n_head, n] */
    tsr_tensor *kc = tsr_concat(ctx, tsr_reshape_3d(ctx, kv_c, kvl, 1, n), k_pe, 0);
    tsr_tensor *o = tsr_attention(ctx, f->cache, il, qc, kc, NULL, hp->ds.kq_scale); /* [kv_lora * n_head, n] */
    if (!o)
        return NULL;
    /* each head's latent result through its v_b */
    o = tsr_permute(ctx, tsr_reshape_3d(ctx, o, kvl, nh, n), 0, 2, 1, 3); /* [kv_lora, n, n_head] */
    o = tsr_mul_mat(ctx, v_b(f, l), tsr_cont(ctx, o));                    /* [v_mla, n, n_head] */
    o = tsr_cont(ctx, tsr_permute(ctx, o, 0, 2, 1, 3));                   /* [v_mla, n_head, n] */
    return tsr_reshape_2d(ctx, o, hp->ds.v_mla * nh, n);
}

static tsr_tensor *feed_forward(llm_fwd *f, int il, tsr_tensor *x) {
    const llm_layer *l = &f->m->layers[il];
    tsr_tensor *cur = tsr__llm_rms_norm(f, x, l->ffn_norm);
    if (il < f->m->hp.ds.n_dense_lead)
        return tsr__llm_ffn(f, l->ffn_gate, l->ffn_up, l->ffn_down, cur);
    tsr_tensor *y = tsr__llm_moe(f, l, cur);
    if (l->ds.gate_shexp)
        y = tsr_add(f->ctx, y, tsr__llm_ffn(f, l->ds.gate_shexp, l->ds.up_shexp, l->ds.down_shexp, cur));
    return y;
}

tsr_tensor *tsr__deepseek2_graph(llm_fwd *f, tsr_tensor *tokens) {
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
        x = tsr_add(ctx, tsr_mul_mat(ctx, l->wo, cur), x);
        x = tsr_add(ctx, feed_forward(f, il, x), x);
    }
    return tsr_mul_mat(ctx, m->output, tsr__llm_rms_norm(f, x, m->out_norm));
}
