/*
 * kvcache.h - private: the KV cache object (kvcache.c) as the attention
 * helper (attention.c) sees it, and the attention graph builder shared by
 * the cached and cache-less entry points.
 */
#ifndef TSR_KVCACHE_H
#define TSR_KVCACHE_H

#include "core.h"

/* The bound of cells the graph reads (n_kv) is rounded up to this, so that
 * graphs keep few distinct shapes as a generation grows, and so a fused
 * attention kernel that walks the keys in tiles of 256 never reads past
 * the cache (the cache tensors are padded to it on the flash path). */
#define TSR_KV_PAD 256
/* Rows of the mask are padded to this on the flash path (query tiles of a
 * GPU kernel); the plain path and the CPU kernel need no padding. */
#define TSR_KV_MASK_ROWS_PAD 16

struct tsr_kv_cache {
    tsr_backend *b;
    tsr_kv_cache_params p;       /* as given (read over defaults) */
    int *l_nkvh, *l_hdk, *l_hdv; /* per layer: KV heads, K and V head dims */
    uint8_t *l_swa;              /* per layer: 1 = sliding window (p.n_swa > 0) */
    bool any_swa;                /* some layer has the window: begin builds mask_swa */
    int64_t n_ctx_alloc;         /* rows of the cache tensors: n_ctx, padded on the flash path */
    bool flash;                  /* backend path at creation: flash (V as rows) or plain (V transposed) */
    tsr_tensor *k, *v;           /* n_layers tensor structs each (ctx NULL, FLAG_PERSIST):
                                  * k [head_dim_k * n_head_kv, n_ctx_alloc];
                                  * v the same, or transposed [n_ctx_alloc, head_dim_v * n_head_kv] */
    /* one group per buffer type the layers use: planned bytes (added to the
     * backend's plan_kv), its device, and the buffer once allocated (added
     * to the backend's live bytes) */
    tsr_buffer_type **grp_bt;
    size_t *grp_size, *grp_dev;
    tsr_buffer **bufs;
    size_t n_grp;
    int32_t *cell_pos; /* per cell: position, -1 when free */
    int32_t *cell_seq; /* per cell: sequence id */
    int64_t n_used;
    int64_t *cells_buf; /* scratch of a begin: n_batch_max cells and positions, n_seq next positions */
    int32_t *pos_buf, *next_buf;
    bool planned; /* grp_size added to the backend's plan_kv */
    bool counted; /* counted in the backend's open caches */
    /* the batch of the last begin */
    tsr_context *ctx;
    uint64_t ctx_id; /* ctx->id then (tsr_kv_cache_begin_again) */
    int64_t n_tokens, n_kv;
    tsr_tensor *idx;      /* I64 [n_tokens]: cell of each token */
    tsr_tensor *mask;     /* F16 [n_kv, n_tokens padded] */
    tsr_tensor *mask_swa; /* the same with the window, for the l_swa layers; NULL when none */
};

/* The cells sequence seq may take: [*c0, *c1) (all of them unless
 * per_seq_cells). */
void tsr__kv_seq_range(const tsr_kv_cache *c, int seq, int64_t *c0, int64_t *c1);

/* Attention of q [head_dim_k, n_head, n_tokens] over keys k
 * [head_dim_k, n_kv, n_head_kv] and values v: on the flash path v is
 * [head_dim_v, n_kv, n_head_kv] (rows contiguous); on the plain path v is
 * transposed, [n_kv, head_dim_v, n_head_kv] with rows contiguous. mask
 * [n_kv, >= n_tokens] or NULL. Returns [head_dim_v * n_head, n_tokens] F32.
 * The plain path steps over heads (and token blocks) to keep the scores of
 * one step under max_batch bytes (0 = no limit). */
tsr_tensor *tsr__attention_build(tsr_context *ctx, tsr_tensor *q, tsr_tensor *k, tsr_tensor *v, tsr_tensor *mask,
                                 float scale, bool flash, size_t max_batch);

/* Step plan of the plain path: query heads per step and query tokens per
 * step for the score bound (exposed for tests through the step count). */
typedef struct tsr_attn_steps {
    int64_t heads;  /* query heads per step (whole KV groups when >= group, else within a group) */
    int64_t tokens; /* query tokens per step */
    int64_t n_steps;
} tsr_attn_steps;

void tsr__attention_plan(int64_t n_kv, int64_t n_tokens, int64_t n_head, int64_t n_head_kv, size_t max_batch,
                         tsr_attn_steps *out);

#endif /* TSR_KVCACHE_H */
