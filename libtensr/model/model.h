/*
 * model.h - private declarations of the model layer (libtensr/model/): the
 * model and session structs, the hyper-parameters, the table of
 * architectures (common.c) with each one's functions (llama.c: llama,
 * mistral, qwen2, qwen3, qwen3moe; gemma3.c; deepseek2.c) and the blocks
 * they share, used by the public functions of api.c and session.c. Like every model source it sees libtensr.h only
 * (bridge.h adds the error channel).
 */
#ifndef TSR_MODEL_MODEL_H
#define TSR_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "bridge.h"
#include "chat.h"
#include "sampler.h"
#include "tokenizer.h"

/* What an architecture's graph adds to the llama one (llm_arch.flags). */
enum {
    LLM_QK_NORM = 1 << 0,    /* per-head RMS norm of q and k before rope (attn_q_norm, attn_k_norm) */
    LLM_MOE = 1 << 1,        /* every layer is a mixture of experts (expert_count > 0 required) */
    LLM_MOE_OPT = 1 << 2,    /* experts when expert_count > 0 (Mixtral in the llama architecture) */
    LLM_OUT_BIAS = 1 << 3,   /* optional output.bias */
    LLM_FF_EXP_KEY = 1 << 4, /* expert size from expert_feed_forward_length (else feed_forward_length) */
    LLM_NO_BIAS = 1 << 5,    /* the graph has no Q/K/V/output biases: refuse them */
    LLM_MOE_GROUPS = 1 << 6, /* grouped expert selection (expert_group_count) allowed */
    LLM_YARN = 1 << 7        /* rope.scaling.type yarn allowed */
};

typedef struct llm_hparams llm_hparams;
typedef struct llm_fwd llm_fwd;

/* One architecture the layer knows: a row of the table in common.c. */
typedef struct llm_arch {
    const char *name; /* general.architecture */
    int rope_mode;    /* TSR_ROPE_NORMAL or TSR_ROPE_NEOX, as llama.cpp's llama_model_rope_type */
    unsigned flags;   /* LLM_* above */
    /* after the common hyper-parameters are read (NULL: nothing more) */
    tsr_status (*hparams)(const tsr_gguf *g, llm_hparams *hp);
    /* whether the graph uses per-layer tensor blk.N.<suffix>: 1 or 0, or -1
     * to leave it to the common list (NULL: the common list) */
    int (*known_tensor)(const llm_hparams *hp, const char *suffix);
    /* looks up and checks layer il's weights */
    tsr_status (*bind_layer)(tsr_model *m, int il);
    /* the logits of the batch f (or, with f->n_out 0, the last attention) */
    tsr_tensor *(*graph)(llm_fwd *f, tsr_tensor *tokens);
} llm_arch;

/* What the GGUF metadata says about the network. */
struct llm_hparams {
    char arch[32];       /* general.architecture */
    const llm_arch *def; /* its row of the table */
    int rope_mode;       /* from the architecture table */
    unsigned flags;
    int64_t n_vocab;
    int64_t n_ctx_train;
    int64_t n_embd;
    int64_t n_ff;
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim_k; /* attention.key_length, else n_embd / n_head */
    int head_dim_v; /* attention.value_length, else n_embd / n_head */
    int n_rot;      /* rope.dimension_count, else head_dim_k */
    float norm_eps; /* attention.layer_norm_rms_epsilon */
    float rope_freq_base;
    float rope_freq_scale;  /* 1 / rope.scaling.factor (linear scaling) */
    int64_t n_ctx_orig;     /* rope.scaling.original_context_length, else n_ctx_train */
    int64_t sliding_window; /* attention.sliding_window; 0 when absent */
    int tied_output;        /* 1 when output.weight is absent (the head is token_embd) */
    int has_rope_freqs;     /* 1 when rope_freqs.weight is present */
    int n_expert;           /* expert_count; 0: a dense feed-forward network */
    int n_expert_used;      /* expert_used_count: experts per token */
    int64_t n_ff_exp;       /* rows of one expert's gate/up (expert_feed_forward_length) */
    /* gemma3 (gemma3.c); zero for llama/mistral, whose window llama.cpp
     * does not apply either */
    int64_t n_swa;            /* sliding window of the windowed layers; 0 = none */
    int swa_period;           /* layer il is windowed unless il % swa_period == swa_period - 1 */
    float rope_freq_base_swa; /* rope of the windowed layers (no scaling) */
    float attn_scale;         /* the queries' scale (the scores' is 1) */
    /* mixtures of experts (common.c's tsr__llm_moe) */
    int n_expert_groups;    /* expert_group_count when > 1, else 0 */
    int n_group_used;       /* expert_group_used_count */
    int moe_sigmoid;        /* expert_gating_func: 0 softmax, 1 sigmoid */
    int moe_norm_w;         /* chosen weights renormalised to sum 1 */
    float moe_w_scale;      /* then scaled (0 or 1: not) */
    float rope_ext_factor;  /* YaRN: 1 (LLM_YARN files with rope.scaling.type yarn), else 0 */
    float rope_attn_factor; /* the rope's magnitude factor (1 but with YaRN) */
    int kv_v_in_k;          /* the cache keeps no V: V is the first head_dim_v values of K (deepseek2) */
    /* deepseek2 (deepseek2.c); head_dim_k/v, n_head_kv above are the
     * latent cache's (kv_lora_rank + rope, kv_lora_rank, 1) */
    struct {
        int64_t q_lora, kv_lora;    /* attention.q_lora_rank (0: plain attn_q), attention.kv_lora_rank */
        int64_t k_mla, v_mla, nope; /* a head's key and value width, key width without the rope part */
        int n_dense_lead;           /* leading_dense_block_count */
        int n_shared;               /* expert_shared_count */
        int legacy_kv_b;            /* attn_kv_b (else attn_k_b / attn_v_b) */
        float kq_scale;             /* the scores' scale, YaRN's mscale included */
    } ds;
};

typedef struct llm_layer {
    tsr_tensor *attn_norm, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *bo;
    tsr_tensor *ffn_norm, *ffn_gate, *ffn_up, *ffn_down;
    tsr_tensor *attn_q_norm, *attn_k_norm;                                  /* [head_dim_k], LLM_QK_NORM */
    tsr_tensor *ffn_gate_inp, *ffn_gate_exps, *ffn_up_exps, *ffn_down_exps; /* experts */
    tsr_tensor *ffn_exp_probs_b; /* the choice's bias (exp_probs_b.bias), or NULL */
    /* deepseek2: q LoRA or plain q (wq), the KV LoRA, shared experts */
    struct {
        tsr_tensor *q_a, *q_a_norm, *q_b, *kv_a_mqa, *kv_a_norm, *kv_b, *k_b, *v_b;
        tsr_tensor *gate_shexp, *up_shexp, *down_shexp;
    } ds;
    tsr_tensor *rope_freqs; /* the copy on this layer's device, or NULL */
    /* gemma3: per-head RMS norms of q and k, norms after attention and FFN */
    struct {
        tsr_tensor *q_norm, *k_norm, *post_attn_norm, *post_ffn_norm;
    } g3;
} llm_layer;

struct tsr_model {
    tsr_backend *be;
    tsr_gguf *gguf;
    int gguf_borrowed; /* a planning backend's file (tsr_fit's dry runs): not closed here */
    llm_hparams hp;
    tsr_tensor *tok_embd, *out_norm, *output, *output_b;
    llm_layer *layers;
    tok_vocab *vocab;
    chat_template *tmpl;    /* NULL when the model has none we know */
    tsr_status tmpl_status; /* why tmpl is NULL */
    char tmpl_error[256];
    size_t n_sessions; /* open sessions: they keep the model alive */
    int freed;         /* tsr_model_free was called while sessions were open */
    int vocab_only;    /* loaded without weights: no sessions */
};

/* One micro-batch to build: n tokens (ids, positions, sequences), the rows
 * whose logits are kept (out_ids[0..n_out), increasing). tokens == NULL
 * builds the worst case for tsr_reserve. */
typedef struct llm_batch {
    const int32_t *tokens, *pos, *seq, *out_ids;
    int64_t n, n_out;
} llm_batch;

/* Reads the hyper-parameters of an open GGUF (no weights needed).
 * TSR_E_UNSUPPORTED for an architecture or a feature the layer lacks,
 * TSR_E_MALFORMED for inconsistent metadata. */
tsr_status tsr__llm_hparams_read(const tsr_gguf *g, llm_hparams *hp);
/* Looks up every weight of m->hp in m->be and checks its shape. */
tsr_status tsr__llm_bind_weights(tsr_model *m);
/* Whether the graph of b gathers the rows of out_ids (else it keeps every row). */
int tsr__llm_gathers_rows(const llm_batch *b);
/* Builds the graph of batch b in ctx over cache (tsr_kv_cache_begin* already
 * called); *out: logits [n_vocab, n_out], or, when n_out == 0, the last
 * layer's attention (which writes the cache). inputs (NULL: not wanted):
 * the graph's token, position and output-row inputs, to run it again on
 * another batch of the same shape. */
tsr_status tsr__llm_build(const tsr_model *m, tsr_context *ctx, tsr_kv_cache *cache, const llm_batch *b,
                          tsr_tensor **out, llm_fwd *inputs);

/* Shared with the other architectures' files: GGUF key ARCH.suffix (a
 * required integer when def < 0; a float defaulting to def) and a weight
 * lookup with its shape check ({ne0, ne1}, ne1 0 for 1-D; optional ones
 * may be absent). */
tsr_status tsr__llm_key_i64(const tsr_gguf *g, const llm_hparams *hp, const char *suffix, int64_t def, int64_t *out);
tsr_status tsr__llm_key_f32(const tsr_gguf *g, const llm_hparams *hp, const char *suffix, float def, float *out);
tsr_status tsr__llm_bind(tsr_model *m, const char *name, int64_t ne0, int64_t ne1, int optional, tsr_tensor **out);

/* The common weights of layer il (attention, norms, dense FFN or experts),
 * as llama has them: llama's bind_layer, and the start of others'. */
tsr_status tsr__llm_bind_layer_std(tsr_model *m, int il);

/* The architectures' functions (the table in common.c). */
tsr_tensor *tsr__llama_graph(llm_fwd *f, tsr_tensor *tokens);
int tsr__llm_is_gemma3(const llm_hparams *hp);
tsr_status tsr__gemma3_hparams_read(const tsr_gguf *g, llm_hparams *hp);
int tsr__gemma3_known_tensor(const llm_hparams *hp, const char *suffix);
tsr_status tsr__gemma3_bind_layer(tsr_model *m, int il);
tsr_tensor *tsr__gemma3_graph(llm_fwd *f, tsr_tensor *tokens);
int tsr__llm_layer_is_swa(const llm_hparams *hp, int il); /* gemma3's sliding window */
tsr_status tsr__deepseek2_hparams_read(const tsr_gguf *g, llm_hparams *hp);
int tsr__deepseek2_known_tensor(const llm_hparams *hp, const char *suffix);
tsr_status tsr__deepseek2_bind_layer(tsr_model *m, int il);
tsr_tensor *tsr__deepseek2_graph(llm_fwd *f, tsr_tensor *tokens);

/* One micro-batch being built (every architecture's graph). */
struct llm_fwd {
    const tsr_model *m;
    tsr_context *ctx;
    tsr_kv_cache *cache;
    tsr_tensor *tok, *pos, *out_ids; /* inputs; out_ids NULL: every row is kept */
    int64_t n, n_out;
};

/* Starts building batch b: fills f and makes the position and (when not
 * every row is kept) output-row inputs; returns the token input. */
tsr_tensor *tsr__llm_fwd_begin(llm_fwd *f, const tsr_model *m, tsr_context *ctx, tsr_kv_cache *cache,
                               const llm_batch *b);
/* The status of the graph built in ctx: TSR_OK when out is not NULL, else
 * the context's error behind "building the graph". */
tsr_status tsr__llm_fwd_end(tsr_context *ctx, const tsr_tensor *out);

/* The blocks the graphs share (common.c): RMS norm times w; w x (+ b);
 * rope with the file's scaling; the rows whose logits are wanted; the
 * SwiGLU FFN; the mixture of experts of layer l (router, choice, weights
 * as hp says; llama.cpp's build_moe_ffn). */
tsr_tensor *tsr__llm_rms_norm(llm_fwd *f, tsr_tensor *x, tsr_tensor *w);
tsr_tensor *tsr__llm_linear(llm_fwd *f, tsr_tensor *w, tsr_tensor *b, tsr_tensor *x);
tsr_tensor *tsr__llm_rope(llm_fwd *f, tsr_tensor *x, tsr_tensor *factors);
tsr_tensor *tsr__llm_out_rows(llm_fwd *f, tsr_tensor *t);
tsr_tensor *tsr__llm_ffn(llm_fwd *f, tsr_tensor *gate, tsr_tensor *up, tsr_tensor *down, tsr_tensor *x);
tsr_tensor *tsr__llm_moe(llm_fwd *f, const llm_layer *l, tsr_tensor *cur);

/* Frees m for real (tsr_model_free, or its last session after that). */
void tsr__llm_model_destroy(tsr_model *m);

#endif
