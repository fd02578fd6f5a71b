/* common.c - what every architecture of the model layer shares: the table
 * of architectures (each row names its hyper-parameter reader, layer
 * binding and graph builder, in its own file: llama.c, gemma3.c,
 * deepseek2.c), the hyper-parameters every file has (read from the GGUF
 * metadata as llama.cpp names them), weight lookup with shape checks, and
 * the blocks the graphs are built from: RMS norm, linear, rope, the SwiGLU
 * feed-forward network, the mixture of experts, the gathering of the rows
 * whose logits are wanted. */
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
    int yarn = strcmp(type, "yarn") == 0 && (hp->flags & LLM_YARN);
    hp->rope_attn_factor = 1.0f;
    if (strcmp(type, "none") != 0 && strcmp(type, "linear") != 0 && !yarn)
        return tsr__error(TSR_E_UNSUPPORTED, "%s: rope scaling '%s' is not supported (only none and linear%s)",
                          tsr_gguf_path(g), type, hp->flags & LLM_YARN ? " and yarn" : "");
    if (strcmp(type, "none") == 0 && tsr_gguf_find_key(g, key) >= 0)
        factor = 0.0f;
    if (factor < 0.0f)
        return tsr__error(TSR_E_MALFORMED, "%s: rope scaling factor %g is negative", tsr_gguf_path(g), factor);
    hp->rope_freq_scale = factor > 0.0f ? 1.0f / factor : 1.0f;
    if (yarn) {
        /* YaRN as llama.cpp's context sets it up: ramped interpolation
         * (ext_factor 1), the rope kernel's magnitude 1 + 0.1 ln(factor)
         * cancelled in attn_factor (an architecture may refine it, e.g.
         * deepseek2's log multiplier), times rope.scaling.attn_factor */
        float af = 1.0f;
        hp->rope_ext_factor = 1.0f;
        if ((st = key_f32(g, hp, "rope.scaling.attn_factor", 1.0f, &af)) != TSR_OK)
            return st;
        hp->rope_attn_factor = af;
    }
    int64_t orig;
    st = key_i64(g, hp, "rope.scaling.original_context_length", hp->n_ctx_train, &orig);
    hp->n_ctx_orig = orig;
    return st;
}

/* Sizes that must agree with each other; one message per inconsistency. */
static tsr_status check_hparams(const tsr_gguf *g, const llm_hparams *hp) {
    const char *path = tsr_gguf_path(g);
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        (hp->n_ff <= 0 && hp->n_expert == 0))
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

/* The architectures: rope type as llama.cpp's llama_model_rope_type (NEOX
 * for the qwen and gemma families), what each adds to the common
 * hyper-parameters and weights, and its graph. Adding an architecture = one
 * file with its functions + one row here. */
static const llm_arch llm_archs[] = {
    {"llama", TSR_ROPE_NORMAL, LLM_MOE_OPT, NULL, NULL, tsr__llm_bind_layer_std, tsr__llama_graph},
    {"mistral", TSR_ROPE_NORMAL, 0, NULL, NULL, tsr__llm_bind_layer_std, tsr__llama_graph},
    {"qwen2", TSR_ROPE_NEOX, LLM_OUT_BIAS, NULL, NULL, tsr__llm_bind_layer_std, tsr__llama_graph},
    {"qwen3", TSR_ROPE_NEOX, LLM_QK_NORM, NULL, NULL, tsr__llm_bind_layer_std, tsr__llama_graph},
    {"qwen3moe", TSR_ROPE_NEOX, LLM_QK_NORM | LLM_MOE | LLM_FF_EXP_KEY, NULL, NULL, tsr__llm_bind_layer_std,
     tsr__llama_graph},
    {"gemma3", TSR_ROPE_NEOX, LLM_QK_NORM | LLM_NO_BIAS, tsr__gemma3_hparams_read, tsr__gemma3_known_tensor,
     tsr__gemma3_bind_layer, tsr__gemma3_graph},
    {"deepseek2", TSR_ROPE_NORMAL, LLM_MOE_OPT | LLM_FF_EXP_KEY | LLM_MOE_GROUPS | LLM_YARN,
     tsr__deepseek2_hparams_read, tsr__deepseek2_known_tensor, tsr__deepseek2_bind_layer, tsr__deepseek2_graph},
};
#define N_ARCHS (sizeof llm_archs / sizeof llm_archs[0])

static tsr_status read_arch(const tsr_gguf *g, llm_hparams *hp) {
    const char *arch;
    size_t len;
    if (tsr_gguf_get_str(g, "general.architecture", &arch, &len) != TSR_OK)
        return tsr__error(TSR_E_MALFORMED, "%s: no general.architecture string", tsr_gguf_path(g));
    for (size_t i = 0; i < N_ARCHS; i++) {
        if (strcmp(arch, llm_archs[i].name) == 0) {
            snprintf(hp->arch, sizeof hp->arch, "%s", arch);
            hp->rope_mode = llm_archs[i].rope_mode;
            hp->flags = llm_archs[i].flags;
            hp->def = &llm_archs[i];
            return TSR_OK;
        }
    }
    char names[160] = "";
    for (size_t i = 0, n = 0; i < N_ARCHS && n < sizeof names; i++)
        n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", llm_archs[i].name);
    return tsr__error(TSR_E_UNSUPPORTED, "%s: architecture '%s' is not supported (%s are)", tsr_gguf_path(g), arch,
                      names);
}

/* Experts: expert_count and expert_used_count (Mixtral in the llama
 * architecture, qwen3moe); grouped expert selection is not supported. */
static tsr_status read_experts(const tsr_gguf *g, llm_hparams *hp) {
    const char *path = tsr_gguf_path(g);
    int groups = 0, used = 0;
    tsr_status st;
    hp->moe_norm_w = 1; /* Mixtral, qwen3moe: softmax, renormalised, unscaled */
    hp->moe_w_scale = 1.0f;
    if ((st = key_int(g, hp, "expert_count", 0, &hp->n_expert)) != TSR_OK ||
        (st = key_int(g, hp, "expert_used_count", 0, &hp->n_expert_used)) != TSR_OK ||
        (st = key_int(g, hp, "expert_group_count", 0, &groups)) != TSR_OK ||
        (st = key_int(g, hp, "expert_group_used_count", 0, &used)) != TSR_OK)
        return st;
    if (hp->n_expert > 0 && !(hp->flags & (LLM_MOE | LLM_MOE_OPT)))
        return tsr__error(TSR_E_UNSUPPORTED, "%s: architecture '%s' with experts (expert_count %d) is not supported",
                          path, hp->arch, hp->n_expert);
    if ((hp->flags & LLM_MOE) && hp->n_expert == 0)
        return tsr__error(TSR_E_MALFORMED, "%s: architecture '%s' needs %s.expert_count > 0", path, hp->arch, hp->arch);
    if (hp->n_expert == 0)
        return hp->n_expert_used == 0
                   ? TSR_OK
                   : tsr__error(TSR_E_MALFORMED, "%s: expert_used_count %d without experts", path, hp->n_expert_used);
    if (hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert)
        return tsr__error(TSR_E_MALFORMED, "%s: expert_used_count %d must be in 1..expert_count (%d)", path,
                          hp->n_expert_used, hp->n_expert);
    if (groups > 1 && !(hp->flags & LLM_MOE_GROUPS))
        return tsr__error(TSR_E_UNSUPPORTED, "%s: grouped expert selection (expert_group_count %d) is not supported",
                          path, groups);
    if (groups > 1 && (hp->n_expert % groups != 0 || hp->n_expert / groups < 2 || used < 1 || used > groups ||
                       (int64_t)used * (hp->n_expert / groups) < hp->n_expert_used))
        return tsr__error(TSR_E_MALFORMED,
                          "%s: %d experts in %d groups of which %d used: the groups must divide the experts (2 or "
                          "more each) and the groups used hold at least expert_used_count (%d) experts",
                          path, hp->n_expert, groups, used, hp->n_expert_used);
    hp->n_expert_groups = groups > 1 ? groups : 0;
    hp->n_group_used = groups > 1 ? used : 0;
    /* llama.cpp: qwen3moe's experts are expert_feed_forward_length wide,
     * else feed_forward_length / expert_used_count; Mixtral's are n_ff wide. */
    int64_t def = hp->n_ff / hp->n_expert_used;
    if (!(hp->flags & LLM_FF_EXP_KEY))
        hp->n_ff_exp = hp->n_ff;
    else if ((st = key_i64(g, hp, "expert_feed_forward_length", def, &hp->n_ff_exp)) != TSR_OK)
        return st;
    if (hp->n_ff_exp <= 0)
        return tsr__error(TSR_E_MALFORMED, "%s: the experts' feed-forward length is 0", path);
    return TSR_OK;
}

/* Whether the graph of hp uses the per-layer tensor "blk.N." + suffix. */
static int known_layer_tensor(const llm_hparams *hp, const char *suffix) {
    static const char *const common[] = {
        "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",    "attn_output.weight",
        "attn_q.bias",      "attn_k.bias",   "attn_v.bias",   "attn_output.bias", "ffn_norm.weight",
    };
    static const char *const dense[] = {"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"};
    static const char *const moe[] = {"ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
                                      "ffn_down_exps.weight"};
    static const char *const qk_norm[] = {"attn_q_norm.weight", "attn_k_norm.weight"};
    if (hp->def->known_tensor) {
        int k = hp->def->known_tensor(hp, suffix);
        if (k >= 0)
            return k;
    }
    if ((hp->flags & LLM_NO_BIAS) && strstr(suffix, ".bias"))
        return 0;
    for (size_t i = 0; i < sizeof common / sizeof common[0]; i++)
        if (strcmp(suffix, common[i]) == 0)
            return 1;
    for (size_t i = 0; hp->n_expert == 0 && i < sizeof dense / sizeof dense[0]; i++)
        if (strcmp(suffix, dense[i]) == 0)
            return 1;
    for (size_t i = 0; hp->n_expert > 0 && i < sizeof moe / sizeof moe[0]; i++)
        if (strcmp(suffix, moe[i]) == 0)
            return 1;
    for (size_t i = 0; (hp->flags & LLM_QK_NORM) && i < sizeof qk_norm / sizeof qk_norm[0]; i++)
        if (strcmp(suffix, qk_norm[i]) == 0)
            return 1;
    return 0;
}

/* A per-layer tensor the graph would not use (shared experts, a fused QKV,
 * FFN biases, experts in a dense architecture...) is refused, naming it,
 * rather than silently ignored. */
static tsr_status check_layer_tensors(const tsr_gguf *g, const llm_hparams *hp) {
    for (int64_t i = 0; i < tsr_gguf_n_tensors(g); i++) {
        const char *name = tsr_gguf_tensor_name(g, i), *p;
        if (strncmp(name, "blk.", 4) != 0)
            continue;
        p = name + 4;
        while (*p >= '0' && *p <= '9') p++;
        if (p == name + 4 || *p != '.' || !known_layer_tensor(hp, p + 1))
            return tsr__error(TSR_E_UNSUPPORTED, "%s: tensor '%s' is not supported for architecture '%s'%s",
                              tsr_gguf_path(g), name, hp->arch,
                              hp->n_expert == 0 && strstr(name, "_exps") ? " without expert_count" : "");
    }
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
    return check_layer_tensors(g, hp);
}

tsr_status tsr__llm_hparams_read(const tsr_gguf *g, llm_hparams *hp) {
    tsr_status st;
    memset(hp, 0, sizeof *hp);
    if ((st = read_arch(g, hp)) != TSR_OK)
        return st;
    if ((st = key_i64(g, hp, "context_length", 4096, &hp->n_ctx_train)) != TSR_OK ||
        (st = key_i64(g, hp, "embedding_length", -1, &hp->n_embd)) != TSR_OK ||
        (st = key_i64(g, hp, "feed_forward_length", hp->flags & LLM_MOE ? 0 : -1, &hp->n_ff)) != TSR_OK ||
        (st = key_int(g, hp, "block_count", -1, &hp->n_layer)) != TSR_OK ||
        (st = key_int(g, hp, "attention.head_count", -1, &hp->n_head)) != TSR_OK ||
        (st = key_int(g, hp, "attention.head_count_kv", hp->n_head, &hp->n_head_kv)) != TSR_OK)
        return st;
    if ((st = read_head_dims(g, hp)) != TSR_OK ||
        (st = key_f32(g, hp, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->norm_eps)) != TSR_OK ||
        (st = key_f32(g, hp, "rope.freq_base", 10000.0f, &hp->rope_freq_base)) != TSR_OK ||
        (st = read_rope_scaling(g, hp)) != TSR_OK ||
        (st = key_i64(g, hp, "attention.sliding_window", 0, &hp->sliding_window)) != TSR_OK ||
        (st = read_experts(g, hp)) != TSR_OK || (st = read_tensor_facts(g, hp)) != TSR_OK)
        return st;
    if (hp->def->hparams && (st = hp->def->hparams(g, hp)) != TSR_OK)
        return st;
    return check_hparams(g, hp);
}

tsr_status tsr__llm_key_i64(const tsr_gguf *g, const llm_hparams *hp, const char *suffix, int64_t def, int64_t *out) {
    return key_i64(g, hp, suffix, def, out);
}

tsr_status tsr__llm_key_f32(const tsr_gguf *g, const llm_hparams *hp, const char *suffix, float def, float *out) {
    return key_f32(g, hp, suffix, def, out);
}

/* ---- weights ------------------------------------------------------------- */

/* Looks up a weight and checks its shape ({ne0, ne1, ne2}; ne1 = 0 for 1-D,
 * ne2 = 0 for 2-D). Optional weights may be absent (*out = NULL). */
static tsr_status bind3(tsr_model *m, const char *name, int64_t ne0, int64_t ne1, int64_t ne2, int optional,
                        tsr_tensor **out) {
    tsr_tensor *t = tsr_backend_weight(m->be, name);
    *out = t;
    if (!t) {
        tsr_clear_error();
        return optional ? TSR_OK
                        : tsr__error(TSR_E_MALFORMED, "%s: tensor '%s' is missing", tsr_gguf_path(m->gguf), name);
    }
    int64_t want1 = ne1 ? ne1 : 1, want2 = ne2 ? ne2 : 1;
    if (tsr_tensor_ne(t, 0) != ne0 || tsr_tensor_ne(t, 1) != want1 || tsr_tensor_ne(t, 2) != want2 ||
        tsr_tensor_ne(t, 3) != 1)
        return tsr__error(TSR_E_MALFORMED,
                          "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld]",
                          tsr_gguf_path(m->gguf), name, (long long)tsr_tensor_ne(t, 0), (long long)tsr_tensor_ne(t, 1),
                          (long long)tsr_tensor_ne(t, 2), (long long)tsr_tensor_ne(t, 3), (long long)ne0,
                          (long long)want1, (long long)want2);
    return TSR_OK;
}

static tsr_status bind(tsr_model *m, const char *name, int64_t ne0, int64_t ne1, int optional, tsr_tensor **out) {
    return bind3(m, name, ne0, ne1, 0, optional, out);
}

tsr_status tsr__llm_bind(tsr_model *m, const char *name, int64_t ne0, int64_t ne1, int optional, tsr_tensor **out) {
    return bind(m, name, ne0, ne1, optional, out);
}

/* The weights of one layer: use = 0 skips an entry the architecture lacks. */
typedef struct layer_weight {
    const char *s;
    int64_t ne0, ne1, ne2;
    int opt, use;
    tsr_tensor **dst;
} layer_weight;

tsr_status tsr__llm_bind_layer_std(tsr_model *m, int il) {
    const llm_hparams *hp = &m->hp;
    llm_layer *l = &m->layers[il];
    int64_t nq = (int64_t)hp->n_head * hp->head_dim_k, nk = (int64_t)hp->n_head_kv * hp->head_dim_k;
    int64_t nv = (int64_t)hp->n_head_kv * hp->head_dim_v, no = (int64_t)hp->n_head * hp->head_dim_v;
    int64_t e = hp->n_embd, ff = hp->n_ff, fx = hp->n_ff_exp, nx = hp->n_expert;
    int dense = nx == 0, moe = nx > 0, qkn = (hp->flags & LLM_QK_NORM) != 0;
    layer_weight w[] = {
        {"attn_norm.weight", e, 0, 0, 0, 1, &l->attn_norm},
        {"attn_q.weight", e, nq, 0, 0, 1, &l->wq},
        {"attn_k.weight", e, nk, 0, 0, 1, &l->wk},
        {"attn_v.weight", e, nv, 0, 0, 1, &l->wv},
        {"attn_output.weight", no, e, 0, 0, 1, &l->wo},
        {"attn_q.bias", nq, 0, 0, 1, 1, &l->bq},
        {"attn_k.bias", nk, 0, 0, 1, 1, &l->bk},
        {"attn_v.bias", nv, 0, 0, 1, 1, &l->bv},
        {"attn_output.bias", e, 0, 0, 1, 1, &l->bo},
        {"attn_q_norm.weight", hp->head_dim_k, 0, 0, 0, qkn, &l->attn_q_norm},
        {"attn_k_norm.weight", hp->head_dim_k, 0, 0, 0, qkn, &l->attn_k_norm},
        {"ffn_norm.weight", e, 0, 0, 0, 1, &l->ffn_norm},
        {"ffn_gate.weight", e, ff, 0, 0, dense, &l->ffn_gate},
        {"ffn_up.weight", e, ff, 0, 0, dense, &l->ffn_up},
        {"ffn_down.weight", ff, e, 0, 0, dense, &l->ffn_down},
        {"ffn_gate_inp.weight", e, nx, 0, 0, moe, &l->ffn_gate_inp},
        {"ffn_gate_exps.weight", e, fx, nx, 0, moe, &l->ffn_gate_exps},
        {"ffn_up_exps.weight", e, fx, nx, 0, moe, &l->ffn_up_exps},
        {"ffn_down_exps.weight", fx, e, nx, 0, moe, &l->ffn_down_exps},
    };
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        char name[96];
        if (!w[i].use)
            continue;
        snprintf(name, sizeof name, "blk.%d.%s", il, w[i].s);
        tsr_status st = bind3(m, name, w[i].ne0, w[i].ne1, w[i].ne2, w[i].opt, w[i].dst);
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

tsr_status tsr__llm_bind_weights(tsr_model *m) {
    const llm_hparams *hp = &m->hp;
    tsr_status st;
    if ((st = bind(m, "token_embd.weight", hp->n_embd, hp->n_vocab, 0, &m->tok_embd)) != TSR_OK ||
        (st = bind(m, "output_norm.weight", hp->n_embd, 0, 0, &m->out_norm)) != TSR_OK ||
        (st = bind(m, "output.weight", hp->n_embd, hp->n_vocab, 1, &m->output)) != TSR_OK)
        return st;
    if ((hp->flags & LLM_OUT_BIAS) && (st = bind(m, "output.bias", hp->n_vocab, 0, 1, &m->output_b)) != TSR_OK)
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
        if ((st = hp->def->bind_layer(m, il)) != TSR_OK)
            return st;
    return TSR_OK;
}

/* ---- the blocks every graph is built from --------------------------------- */

tsr_tensor *tsr__llm_rms_norm(llm_fwd *f, tsr_tensor *x, tsr_tensor *w) {
    return tsr_mul(f->ctx, tsr_rms_norm(f->ctx, x, f->m->hp.norm_eps), w);
}

tsr_tensor *tsr__llm_linear(llm_fwd *f, tsr_tensor *w, tsr_tensor *b, tsr_tensor *x) {
    tsr_tensor *y = tsr_mul_mat(f->ctx, w, x);
    return b ? tsr_add(f->ctx, y, b) : y;
}

tsr_tensor *tsr__llm_rope(llm_fwd *f, tsr_tensor *x, tsr_tensor *factors) {
    const llm_hparams *hp = &f->m->hp;
    return tsr_rope_ext(f->ctx, x, f->pos, factors, hp->n_rot, hp->rope_mode, (int)hp->n_ctx_orig, hp->rope_freq_base,
                        hp->rope_freq_scale, hp->rope_ext_factor, hp->rope_attn_factor, 32.0f, 1.0f);
}

tsr_tensor *tsr__llm_out_rows(llm_fwd *f, tsr_tensor *t) {
    return f->out_ids ? tsr_get_rows(f->ctx, t, f->out_ids) : t;
}

tsr_tensor *tsr__llm_ffn(llm_fwd *f, tsr_tensor *gate, tsr_tensor *up, tsr_tensor *down, tsr_tensor *x) {
    tsr_tensor *g = tsr_mul_mat(f->ctx, gate, x);
    tsr_tensor *u = tsr_mul_mat(f->ctx, up, x);
    return tsr_mul_mat(f->ctx, down, tsr_swiglu(f->ctx, g, u));
}

/* Grouped selection (DeepSeek V3): each group of nx / n_groups experts
 * scores the sum of its two best selection scores; the experts of all but
 * the n_group_used best groups get -inf, as llama.cpp's build_moe_ffn
 * does (its fill is a copy of a -inf input here). sel: [nx, n]. */
static tsr_tensor *moe_mask_groups(llm_fwd *f, tsr_tensor *sel, int64_t n) {
    const llm_hparams *hp = &f->m->hp;
    tsr_context *ctx = f->ctx;
    int64_t ng = hp->n_expert_groups, epg = hp->n_expert / ng;
    tsr_tensor *sg = tsr_reshape_3d(ctx, sel, epg, ng, n);
    tsr_tensor *best2 = tsr_top_k(ctx, sg, 2); /* I32 [2, ng, n] */
    tsr_tensor *gs = tsr_get_rows(ctx, tsr_reshape_4d(ctx, sg, 1, epg, ng, n), best2);
    gs = tsr_reshape_2d(ctx, tsr_sum_rows(ctx, tsr_reshape_3d(ctx, gs, 2, ng, n)), ng, n);
    tsr_tensor *groups = tsr_top_k(ctx, gs, hp->n_group_used); /* I32 [n_group_used, n] */
    int64_t ne[3] = {epg, ng, n};
    size_t cnt = (size_t)(epg * ng * n);
    float *ninf = tsr__malloc(cnt * sizeof *ninf);
    if (!ninf) {
        tsr__error(TSR_E_NOMEM, "out of memory for the expert groups' mask (%zu values)", cnt);
        return NULL;
    }
    for (size_t i = 0; i < cnt; i++) ninf[i] = -INFINITY;
    tsr_tensor *fill = tsr_input(ctx, TSR_TYPE_F32, 3, ne, ninf);
    tsr__free(ninf);
    tsr_tensor *masked = tsr_cpy(ctx, fill, tsr_empty(ctx, TSR_TYPE_F32, 3, ne));
    masked = tsr_set_rows(ctx, masked, tsr_get_rows(ctx, sg, groups), groups);
    return tsr_reshape_2d(ctx, masked, hp->n_expert, n);
}

/* Mixture of experts, as llama.cpp's build_moe_ffn: the router's scores
 * (softmax over all experts, or each expert's sigmoid: hp->moe_sigmoid),
 * the n_expert_used best by the score plus exp_probs_b when the layer has
 * one (DeepSeek V3: the bias steers the choice only, the weights are the
 * unbiased scores), within the n_group_used best groups when the experts
 * are grouped, ties to the lower index; their scores renormalised to sum
 * to 1 (hp->moe_norm_w) and scaled by hp->moe_w_scale; each chosen
 * expert's SwiGLU FFN, weighted and summed. The renormalising sum is at
 * least the largest score, so llama.cpp's clamp of it from below (F16's
 * smallest normal) is left out: it could only act when every chosen sigmoid
 * is under 6e-5. cur: [n_embd, n]. */
tsr_tensor *tsr__llm_moe(llm_fwd *f, const llm_layer *l, tsr_tensor *cur) {
    const llm_hparams *hp = &f->m->hp;
    tsr_context *ctx = f->ctx;
    int64_t n = tsr_tensor_ne(cur, 1), nx = hp->n_expert, k = hp->n_expert_used, e = hp->n_embd;
    tsr_tensor *logits = tsr_mul_mat(ctx, l->ffn_gate_inp, cur); /* [nx, n] */
    tsr_tensor *probs = hp->moe_sigmoid ? tsr_sigmoid(ctx, logits) : tsr_softmax(ctx, logits);
    tsr_tensor *choice = l->ffn_exp_probs_b ? tsr_add(ctx, probs, l->ffn_exp_probs_b) : probs;
    if (hp->n_expert_groups > 1)
        choice = moe_mask_groups(f, choice, n);
    tsr_tensor *sel = tsr_top_k(ctx, choice, (int)k);                             /* I32 [k, n] */
    tsr_tensor *w = tsr_get_rows(ctx, tsr_reshape_3d(ctx, probs, 1, nx, n), sel); /* [1, k, n] */
    if (hp->moe_norm_w) {
        w = tsr_reshape_2d(ctx, w, k, n);
        w = tsr_reshape_3d(ctx, tsr_div(ctx, w, tsr_sum_rows(ctx, w)), 1, k, n);
    }
    if (hp->moe_w_scale != 0.0f && hp->moe_w_scale != 1.0f)
        w = tsr_scale(ctx, w, hp->moe_w_scale);
    tsr_tensor *x = tsr_reshape_3d(ctx, cur, e, 1, n);
    tsr_tensor *up = tsr_mul_mat_id(ctx, l->ffn_up_exps, x, sel); /* [n_ff_exp, k, n] */
    tsr_tensor *gate = tsr_mul_mat_id(ctx, l->ffn_gate_exps, x, sel);
    tsr_tensor *y = tsr_mul_mat_id(ctx, l->ffn_down_exps, tsr_swiglu(ctx, gate, up), sel); /* [e, k, n] */
    y = tsr_mul(ctx, y, w);
    tsr_tensor *out = NULL;
    for (int64_t i = 0; i < k; i++) {
        tsr_tensor *v = tsr_view_2d(ctx, y, e, n, tsr_tensor_nb(y, 2), (size_t)i * tsr_tensor_nb(y, 1));
        out = out ? tsr_add(ctx, out, v) : v;
    }
    return k == 1 ? tsr_cont(ctx, out) : out;
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

int tsr__llm_gathers_rows(const llm_batch *b) { return b->n_out > 0 && (!b->tokens || !all_rows(b)); }

tsr_tensor *tsr__llm_fwd_begin(llm_fwd *f, const tsr_model *m, tsr_context *ctx, tsr_kv_cache *cache,
                               const llm_batch *b) {
    const int64_t ne = b->n, ne_out = b->n_out;
    *f = (llm_fwd){m, ctx, cache, NULL, NULL, NULL, b->n, b->n_out};
    tsr_tensor *tok = f->tok = tsr_input(ctx, TSR_TYPE_I32, 1, &ne, b->tokens);
    f->pos = tsr_input(ctx, TSR_TYPE_I32, 1, &ne, b->pos);
    if (tsr__llm_gathers_rows(b))
        f->out_ids = tsr_input(ctx, TSR_TYPE_I32, 1, &ne_out, b->out_ids);
    return tok;
}

tsr_status tsr__llm_fwd_end(tsr_context *ctx, const tsr_tensor *out) {
    if (out)
        return TSR_OK;
    tsr_status st = tsr_context_status(ctx);
    return tsr__error(st ? st : TSR_E_INVALID, "building the graph: %s",
                      tsr_context_error(ctx) ? tsr_context_error(ctx) : tsr_last_error());
}

tsr_status tsr__llm_build(const tsr_model *m, tsr_context *ctx, tsr_kv_cache *cache, const llm_batch *b,
                          tsr_tensor **out, llm_fwd *inputs) {
    llm_fwd f;
    tsr_tensor *tok = tsr__llm_fwd_begin(&f, m, ctx, cache, b);
    *out = m->hp.def->graph(&f, tok);
    if (inputs)
        *inputs = f;
    return tsr__llm_fwd_end(ctx, *out);
}
