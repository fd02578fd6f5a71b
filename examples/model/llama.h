/* llama.h - the llama/mistral-architecture forward pass built on libtensr's
 * public API only (examples/model): hyper-parameters from the GGUF metadata,
 * weights through tsr_backend_load_gguf, a KV cache and tsr_attention, one
 * graph per micro-batch, logits for the rows asked for.
 *
 * One llm is driven by one thread at a time (like the backend it uses).
 * Errors: functions return a tsr_status and llm_last_error() gives a
 * one-line, thread-local detail. */
#ifndef TSR_EXAMPLES_LLAMA_H
#define TSR_EXAMPLES_LLAMA_H

#include <stddef.h>
#include <stdint.h>

#include "libtensr.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the GGUF metadata says about the network. */
typedef struct llm_hparams {
    char arch[32];            /* general.architecture ("llama", "mistral") */
    int64_t n_vocab;
    int64_t n_ctx_train;
    int64_t n_embd;
    int64_t n_ff;
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim_k;           /* attention.key_length, else n_embd / n_head */
    int head_dim_v;           /* attention.value_length, else n_embd / n_head */
    int n_rot;                /* rope.dimension_count, else head_dim_k */
    float norm_eps;           /* attention.layer_norm_rms_epsilon */
    float rope_freq_base;
    float rope_freq_scale;    /* 1 / rope.scaling.factor (linear scaling) */
    int64_t n_ctx_orig;       /* rope.scaling.original_context_length, else n_ctx_train */
    int64_t sliding_window;   /* attention.sliding_window; 0 when absent */
    int tied_output;          /* 1 when output.weight is absent (the head is token_embd) */
    int has_rope_freqs;       /* 1 when rope_freqs.weight is present */
} llm_hparams;

typedef struct llm_params {
    int64_t n_ctx;            /* KV cells; 0 = the training context */
    int64_t n_ubatch;         /* micro-batch: tokens per graph (default 512) */
    int64_t n_outputs_max;    /* most logits rows per micro-batch the caller will ask for
                                 (reserved at start; default 1; n_ubatch for perplexity) */
    tsr_type type_k;          /* KV cache types (default F16) */
    tsr_type type_v;
} llm_params;

typedef struct llm llm;

/* Thread-local detail of the last llm_* error ("" when none). */
const char *llm_last_error(void);

void llm_params_default(llm_params *p);

/* Reads the hyper-parameters of an open GGUF (no weights needed).
 * TSR_E_UNSUPPORTED for an architecture or a feature this runner lacks,
 * TSR_E_MALFORMED for inconsistent metadata. */
tsr_status llm_hparams_read(const tsr_gguf *g, llm_hparams *hp);

/* Opens a model: metadata, weights (placed and loaded with lp, may be
 * NULL), shape checks of every tensor, the KV cache, and a tsr_reserve of
 * the worst-case micro-batch (n_ubatch tokens against a full cache, with
 * n_outputs_max logits rows), so an out-of-memory shows here. The backend
 * must hold no other weights and outlive the llm. */
tsr_status llm_open(tsr_backend *be, const char *path, const tsr_load_params *lp, const llm_params *p,
                    llm **out);
void llm_free(llm *m);  /* NULL is a no-op; does not free the backend */

const llm_hparams *llm_get_hparams(const llm *m);
/* The model's GGUF (metadata stays readable while m lives): for the tokenizer. */
const tsr_gguf *llm_get_gguf(const llm *m);
int64_t llm_n_ctx(const llm *m);
/* Tokens in the cache (the position of the next token). */
int64_t llm_n_past(const llm *m);
/* Empties the KV cache (next token at position 0). */
void llm_reset(llm *m);

/* Evaluates tokens[0..n) at positions n_past.., in micro-batches of
 * n_ubatch, and appends them to the cache. Logits of the rows
 * [logits_from, n) are written to logits (row-major, n_vocab floats per
 * row); logits_from >= n (or logits NULL) asks for none. Rows asked for in
 * one micro-batch beyond n_outputs_max are an error (TSR_E_RANGE).
 * TSR_E_FULL when the cache has no room (nothing is evaluated then). */
tsr_status llm_decode(llm *m, const int32_t *tokens, int64_t n, int64_t logits_from, float *logits);

#ifdef __cplusplus
}
#endif

#endif
