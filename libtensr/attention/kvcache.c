/*
 * kvcache.c - the KV cache: per-layer K and V tensors allocated whole at
 * creation on each layer's device (one buffer per buffer type), the cell
 * bookkeeping (position and sequence of each cell), and tsr_kv_cache_begin,
 * which finds cells for a batch and builds the cell indices and the causal
 * mask as inputs of the forward pass. The writes into the cache and the
 * reads from it are built by tsr_attention (attention.c).
 *
 * Layout: K of layer il is [head_dim_k, n_ctx, n_head_kv]: each KV head's
 * cells one after another, so that attention, which reads the cells of one
 * head at a time, streams each head's keys from memory in order (with a
 * token's heads in one row, [head_dim_k * n_head_kv, n_ctx], a head's keys
 * were one slice of every row: decode at depth 4096, SmolLM2 Q4_0, Zen 3,
 * 2 threads, 54.5 -> 74.1 tokens/s). On the plain path V is stored
 * transposed, [n_ctx, head_dim_v * n_head_kv], so V*softmax(K*Q) reads it
 * without a copy; on the flash path V is stored like K. A cell belongs to
 * one sequence.
 *
 * Sliding window: layers flagged in swa_layers read the same cells through
 * a second mask that also hides cells n_swa or more positions behind the
 * token. Cells are never evicted, so the window costs no bookkeeping.
 */
#include "attention/kvcache.h"

#include <stdio.h>

void tsr_kv_cache_params_init(tsr_kv_cache_params *p, size_t size) {
    if (!p || size < sizeof(size_t))
        return;
    tsr_kv_cache_params d = {0};
    d.size = size < sizeof d ? size : sizeof d;
    d.type_k = TSR_TYPE_F16;
    d.type_v = TSR_TYPE_F16;
    d.n_seq = 1;
    d.n_batch_max = 512;
    memcpy(p, &d, d.size);
    p->size = size;
}

static const char *tn(tsr_type t) {
    const char *n = tsr_type_name(t);
    return n ? n : "?";
}

static tsr_status check_type(tsr_type t, int head_dim, bool flash, bool is_v) {
    const char *what = is_v ? "type_v" : "type_k";
    bool ok = t == TSR_TYPE_F32 || t == TSR_TYPE_F16 || t == TSR_TYPE_Q8_0;
    if (!ok)
        return tsr__error(TSR_E_UNSUPPORTED, "tsr_kv_cache_new: %s is %s; expected f16, f32 or q8_0", what, tn(t));
    /* V is stored transposed on the plain path: a quantized block would span cells */
    if (t == TSR_TYPE_Q8_0 && is_v && !flash)
        return tsr__error(TSR_E_UNSUPPORTED,
                          "tsr_kv_cache_new: type_v q8_0 needs flash attention (the backend has it off)");
    if (head_dim % tsr_type_block_size(t) != 0)
        return tsr__error(TSR_E_INVALID, "tsr_kv_cache_new: %s %s needs head dims that are multiples of %lld, got %d",
                          what, tn(t), (long long)tsr_type_block_size(t), head_dim);
    return TSR_OK;
}

/* Per-layer window flags: the caller's (copied) or every layer. */
static tsr_status layer_windows(tsr_kv_cache *c) {
    const tsr_kv_cache_params *p = &c->p;
    c->l_swa = tsr__calloc((size_t)p->n_layers, 1);
    if (!c->l_swa)
        return tsr__error(TSR_E_NOMEM, "tsr_kv_cache_new: out of host memory");
    for (int il = 0; il < p->n_layers && p->n_swa > 0; il++) {
        c->l_swa[il] = p->swa_layers ? p->swa_layers[il] != 0 : 1;
        c->any_swa = c->any_swa || c->l_swa[il];
    }
    c->p.swa_layers = NULL;
    return TSR_OK;
}

/* Per-layer shapes: the caller's arrays (copied) or the single values. */
static tsr_status layer_shapes(tsr_kv_cache *c) {
    const tsr_kv_cache_params *p = &c->p;
    size_t nl = (size_t)p->n_layers;
    c->l_nkvh = tsr__malloc(nl * sizeof(int));
    c->l_hdk = tsr__malloc(nl * sizeof(int));
    c->l_hdv = tsr__malloc(nl * sizeof(int));
    if (!c->l_nkvh || !c->l_hdk || !c->l_hdv)
        return tsr__error(TSR_E_NOMEM, "tsr_kv_cache_new: out of host memory");
    for (int il = 0; il < p->n_layers; il++) {
        c->l_nkvh[il] = p->n_head_kv_layer ? p->n_head_kv_layer[il] : p->n_head_kv;
        c->l_hdk[il] = p->head_dim_k_layer ? p->head_dim_k_layer[il] : p->head_dim_k;
        c->l_hdv[il] = p->head_dim_v_layer ? p->head_dim_v_layer[il] : p->head_dim_v;
        if (c->l_nkvh[il] <= 0 || c->l_hdk[il] <= 0 || c->l_hdv[il] <= 0)
            return tsr__error(TSR_E_INVALID,
                              "tsr_kv_cache_new: layer %d: n_head_kv %d, head_dim_k %d, head_dim_v %d must be > 0", il,
                              c->l_nkvh[il], c->l_hdk[il], c->l_hdv[il]);
        if (p->v_in_k && c->l_hdv[il] > c->l_hdk[il])
            return tsr__error(
                TSR_E_INVALID,
                "tsr_kv_cache_new: layer %d: head_dim_v %d > head_dim_k %d, but V is read from K (v_in_k)", il,
                c->l_hdv[il], c->l_hdk[il]);
        tsr_status s = check_type(p->type_k, c->l_hdk[il], c->flash, false);
        if (s == TSR_OK && !p->v_in_k)
            s = check_type(p->type_v, c->l_hdv[il], c->flash, true);
        if (s != TSR_OK)
            return s;
    }
    c->p.n_head_kv_layer = c->p.head_dim_k_layer = c->p.head_dim_v_layer = NULL; /* not the caller's memory later */
    return layer_windows(c);
}

static tsr_status check_params(const tsr_kv_cache_params *p, bool flash) {
    if (p->n_layers <= 0 || p->n_ctx <= 0 || (p->n_head_kv <= 0 && !p->n_head_kv_layer) ||
        (p->head_dim_k <= 0 && !p->head_dim_k_layer) || (p->head_dim_v <= 0 && !p->head_dim_v_layer) || p->n_seq <= 0 ||
        p->n_batch_max < 0 || p->n_swa < 0)
        return tsr__error(TSR_E_INVALID,
                          "tsr_kv_cache_new: n_layers %d, n_ctx %lld, n_head_kv %d, head_dim_k %d, head_dim_v %d, "
                          "n_seq %d must be > 0, n_batch_max %lld and n_swa %lld >= 0",
                          p->n_layers, (long long)p->n_ctx, p->n_head_kv, p->head_dim_k, p->head_dim_v, p->n_seq,
                          (long long)p->n_batch_max, (long long)p->n_swa);
    if (p->n_ctx > INT32_MAX)
        return tsr__error(TSR_E_RANGE, "tsr_kv_cache_new: n_ctx %lld is larger than %d", (long long)p->n_ctx,
                          INT32_MAX);
    tsr_status s = check_type(p->type_k, p->head_dim_k_layer ? 0 : p->head_dim_k, flash, false);
    if (s != TSR_OK || p->v_in_k)
        return s;
    return check_type(p->type_v, p->head_dim_v_layer ? 0 : p->head_dim_v, flash, true);
}

/* Shapes one cache tensor struct (layer il, K or V). */
static bool shape_tensor(tsr_kv_cache *c, tsr_tensor *t, int il, bool is_v) {
    const tsr_kv_cache_params *p = &c->p;
    int64_t hd = is_v ? c->l_hdv[il] : c->l_hdk[il], width = hd * c->l_nkvh[il];
    /* v_in_k: the V struct is never allocated nor read (F32 keeps its shape valid) */
    t->type = is_v ? (p->v_in_k ? TSR_TYPE_F32 : p->type_v) : p->type_k;
    t->op = TSR_OP_NONE;
    t->flags = TSR_FLAG_PERSIST;
    t->device_id = -1;
    bool trans = is_v && !c->flash;
    t->n_dims = trans ? 2 : 3;
    t->ne[0] = trans ? c->n_ctx_alloc : hd;
    t->ne[1] = trans ? width : c->n_ctx_alloc;
    t->ne[2] = trans ? 1 : c->l_nkvh[il];
    t->ne[3] = 1;
    snprintf(t->name, sizeof t->name, "cache_%c_l%d", is_v ? 'v' : 'k', il);
    return tsr__set_contiguous_strides(t);
}

static tsr_buffer_type *layer_buffer_type(const tsr_backend *b, int il) {
    tsr_buffer_type *bt = tsr_backend_layer_buffer_type(b, il);
    return bt ? bt : tsr_device_buffer_type(tsr__host_device());
}

static size_t dev_of(const tsr_backend *b, tsr_buffer_type *bt) {
    size_t d = tsr__backend_device_index(b, bt->device);
    return d < b->n_devices ? d : tsr__backend_host_index(b);
}

static size_t align_of(const tsr_buffer_type *bt) { return bt->alignment > TSR_ALIGN ? bt->alignment : TSR_ALIGN; }

/* Groups the layers by buffer type (layer order) and sums each group's
 * bytes (aligned per tensor); false on overflow. */
static bool group_layers(tsr_kv_cache *c) {
    for (int il = 0; il < c->p.n_layers; il++) {
        tsr_buffer_type *bt = layer_buffer_type(c->b, il);
        size_t g = 0;
        while (g < c->n_grp && c->grp_bt[g] != bt) g++;
        if (g == c->n_grp) {
            c->grp_bt[c->n_grp] = bt;
            c->grp_dev[c->n_grp] = dev_of(c->b, bt);
            c->grp_size[c->n_grp++] = 0;
        }
        size_t kb = tsr__pad(tsr_tensor_nbytes(&c->k[il]), align_of(bt));
        size_t vb = c->p.v_in_k ? 0 : tsr__pad(tsr_tensor_nbytes(&c->v[il]), align_of(bt));
        if (tsr__add_overflow(c->grp_size[g], kb, &c->grp_size[g]) ||
            tsr__add_overflow(c->grp_size[g], vb, &c->grp_size[g]))
            return false;
    }
    return true;
}

/* Allocates group g's buffer (zeroed) and points its layers' tensors into it. */
static tsr_status alloc_group(tsr_kv_cache *c, size_t g) {
    tsr_buffer_type *bt = c->grp_bt[g];
    tsr_buffer *buf = NULL;
    tsr_status s = tsr_buffer_alloc(bt, c->grp_size[g], &buf);
    if (s != TSR_OK) {
        tsr__error_prefix("tsr_kv_cache_new: KV cache of %.2f MiB on %s", c->grp_size[g] / 1048576.0, bt->device->name);
        return s;
    }
    c->bufs[g] = buf;
    c->b->live[c->grp_dev[g]] += buf->size;
    if (bt->iface->memset && (s = bt->iface->memset(buf, buf->base, 0, buf->size)) != TSR_OK)
        return s;
    size_t off = 0;
    for (int il = 0; il < c->p.n_layers; il++) {
        if (layer_buffer_type(c->b, il) != bt)
            continue;
        tsr_tensor *ts[2] = {&c->k[il], &c->v[il]};
        for (int j = 0; j < (c->p.v_in_k ? 1 : 2); j++) {
            ts[j]->buffer = buf;
            ts[j]->data = (char *)buf->base + off;
            ts[j]->device_id = (int)c->grp_dev[g];
            off += tsr__pad(tsr_tensor_nbytes(ts[j]), align_of(bt));
        }
    }
    return TSR_OK;
}

/* Plans every group into the backend's memory plan, checks that the plan
 * fits every device (TSR_E_DEVICE_NOMEM naming the device and the bytes
 * missing), then allocates. */
static tsr_status alloc_all(tsr_kv_cache *c) {
    if (!group_layers(c))
        return tsr__error(TSR_E_INVALID, "tsr_kv_cache_new: the cache size overflows");
    for (size_t g = 0; g < c->n_grp; g++) c->b->plan_kv[c->grp_dev[g]] += c->grp_size[g];
    c->planned = true;
    tsr_status s = tsr__plan_check(c->b);
    if (s != TSR_OK) {
        tsr__error_prefix("tsr_kv_cache_new: KV cache of %d layers x %lld cells", c->p.n_layers, (long long)c->p.n_ctx);
        return s;
    }
    if (c->b->plan_mode) { /* a dry run: each layer's K/V on its planned device, no memory */
        for (int il = 0; il < c->p.n_layers; il++)
            for (size_t g = 0; g < c->n_grp; g++)
                if (layer_buffer_type(c->b, il) == c->grp_bt[g])
                    c->k[il].device_id = c->v[il].device_id = (int)c->grp_dev[g];
        return TSR_OK;
    }
    for (size_t g = 0; g < c->n_grp && s == TSR_OK; g++) s = alloc_group(c, g);
    return s;
}

static tsr_status cache_init(tsr_kv_cache *c) {
    size_t nl = (size_t)c->p.n_layers, nc = (size_t)c->p.n_ctx;
    c->k = tsr__calloc(nl, sizeof *c->k);
    c->v = tsr__calloc(nl, sizeof *c->v);
    c->grp_bt = tsr__calloc(nl, sizeof *c->grp_bt);
    c->grp_size = tsr__calloc(nl, sizeof *c->grp_size);
    c->grp_dev = tsr__calloc(nl, sizeof *c->grp_dev);
    c->bufs = tsr__calloc(nl, sizeof *c->bufs);
    if (!c->k || !c->v || !c->grp_bt || !c->grp_size || !c->grp_dev || !c->bufs)
        return tsr__error(TSR_E_NOMEM, "tsr_kv_cache_new: out of host memory");
    for (int il = 0; il < c->p.n_layers; il++)
        if (!shape_tensor(c, &c->k[il], il, false) || !shape_tensor(c, &c->v[il], il, true))
            return tsr__error(TSR_E_INVALID, "tsr_kv_cache_new: layer %d: the cache size overflows", il);
    tsr_status s = alloc_all(c); /* first: a cache that does not fit fails before any cell array */
    if (s != TSR_OK)
        return s;
    c->cell_pos = tsr__malloc(nc * sizeof *c->cell_pos);
    c->cell_seq = tsr__calloc(nc, sizeof *c->cell_seq);
    /* a batch is at most n_batch_max tokens and the free cells (checked first) */
    const int64_t nbm = c->p.n_batch_max < c->p.n_ctx ? c->p.n_batch_max : c->p.n_ctx;
    const size_t nb = (size_t)(nbm > 0 ? nbm : 1);
    c->cells_buf = tsr__calloc(nb, sizeof *c->cells_buf);
    c->pos_buf = tsr__calloc(nb, sizeof *c->pos_buf);
    c->next_buf = tsr__calloc((size_t)c->p.n_seq, sizeof *c->next_buf);
    if (!c->cell_pos || !c->cell_seq || !c->cells_buf || !c->pos_buf || !c->next_buf)
        return tsr__error(TSR_E_NOMEM, "tsr_kv_cache_new: out of host memory for %zu cells", nc);
    for (size_t i = 0; i < nc; i++) c->cell_pos[i] = -1;
    return TSR_OK;
}

tsr_status tsr_kv_cache_new(tsr_backend *b, const tsr_kv_cache_params *p, tsr_kv_cache **out) {
    if (out)
        *out = NULL;
    if (!b || !p || !out)
        return tsr__error(TSR_E_INVALID, "tsr_kv_cache_new: NULL %s", !b ? "backend" : !p ? "params" : "out");
    if (p->size < sizeof(size_t))
        return tsr__error(TSR_E_INVALID, "tsr_kv_cache_new: params.size is %zu; call tsr_kv_cache_params_init",
                          p->size);
    tsr_kv_cache *c = tsr__calloc(1, sizeof *c);
    if (!c)
        return tsr__error(TSR_E_NOMEM, "tsr_kv_cache_new: out of host memory");
    tsr_kv_cache_params_init(&c->p, sizeof c->p);
    TSR_PARAMS_COPY(&c->p, p);
    c->p.size = sizeof c->p;
    c->b = b;
    c->flash = tsr_backend_flash_attn(b) != 0;
    c->n_ctx_alloc = c->flash ? (int64_t)tsr__pad((size_t)c->p.n_ctx, TSR_KV_PAD) : c->p.n_ctx;
    tsr_status s = check_params(&c->p, c->flash);
    if (s == TSR_OK)
        s = layer_shapes(c);
    if (s == TSR_OK)
        s = cache_init(c);
    if (s != TSR_OK) {
        tsr_kv_cache_free(c);
        return s;
    }
    b->n_open_caches++;
    c->counted = true;
    *out = c;
    return TSR_OK;
}

void tsr_kv_cache_free(tsr_kv_cache *c) {
    if (!c)
        return;
    tsr_backend *b = c->b;
    for (size_t g = 0; g < c->n_grp; g++) {
        size_t d = c->grp_dev[g];
        if (c->planned)
            b->plan_kv[d] -= b->plan_kv[d] >= c->grp_size[g] ? c->grp_size[g] : b->plan_kv[d];
        if (c->bufs[g])
            b->live[d] -= b->live[d] >= c->bufs[g]->size ? c->bufs[g]->size : b->live[d];
        tsr_buffer_free(c->bufs[g]);
    }
    if (c->counted)
        b->n_open_caches--;
    tsr__free(c->k);
    tsr__free(c->v);
    tsr__free(c->l_nkvh);
    tsr__free(c->l_hdk);
    tsr__free(c->l_hdv);
    tsr__free(c->l_swa);
    tsr__free(c->grp_bt);
    tsr__free(c->grp_size);
    tsr__free(c->grp_dev);
    tsr__free(c->bufs);
    tsr__free(c->cell_pos);
    tsr__free(c->cell_seq);
    tsr__free(c->cells_buf);
    tsr__free(c->pos_buf);
    tsr__free(c->next_buf);
    tsr__free(c);
    tsr__backend_release(b);
}

/* ---- cells ---------------------------------------------------------------------- */

void tsr_kv_cache_clear(tsr_kv_cache *c) {
    if (!c)
        return;
    for (int64_t i = 0; i < c->p.n_ctx; i++) c->cell_pos[i] = -1;
    c->n_used = 0;
    /* zeros again: a value that overflowed to inf in an earlier batch would
     * turn into NaN under a zero softmax weight on the plain path */
    for (size_t g = 0; g < c->n_grp; g++) {
        tsr_buffer *buf = c->bufs[g];
        if (buf->buft->iface->memset)
            buf->buft->iface->memset(buf, buf->base, 0, buf->size);
    }
}

tsr_status tsr_kv_cache_remove(tsr_kv_cache *c, int seq, int32_t p0, int32_t p1) {
    if (!c)
        return tsr__error(TSR_E_INVALID, "tsr_kv_cache_remove: NULL cache");
    if (seq < -1 || seq >= c->p.n_seq)
        return tsr__error(TSR_E_INVALID, "tsr_kv_cache_remove: sequence %d is not -1 or 0..%d", seq, c->p.n_seq - 1);
    for (int64_t i = 0; i < c->p.n_ctx; i++) {
        int32_t pos = c->cell_pos[i];
        if (pos < 0 || (seq >= 0 && c->cell_seq[i] != seq) || pos < p0 || (p1 >= 0 && pos >= p1))
            continue;
        c->cell_pos[i] = -1;
        c->n_used--;
    }
    return TSR_OK;
}

int64_t tsr_kv_cache_used(const tsr_kv_cache *c) { return c ? c->n_used : 0; }
int64_t tsr_kv_cache_n_ctx(const tsr_kv_cache *c) { return c ? c->p.n_ctx : 0; }
tsr_tensor *tsr_kv_cache_mask(const tsr_kv_cache *c) { return c ? c->mask : NULL; }

int32_t tsr_kv_cache_seq_pos_max(const tsr_kv_cache *c, int seq) {
    int32_t max = -1;
    for (int64_t i = 0; c && i < c->p.n_ctx; i++)
        if (c->cell_pos[i] > max && (seq < 0 || c->cell_seq[i] == seq))
            max = c->cell_pos[i];
    return max;
}

/* ---- begin ---------------------------------------------------------------------- */

static tsr_status check_batch(const tsr_kv_cache *c, int64_t n_tokens, const int32_t *pos, const int32_t *seq) {
    if (n_tokens < 0 || n_tokens > c->p.n_batch_max)
        return tsr__error(n_tokens < 0 ? TSR_E_INVALID : TSR_E_RANGE,
                          "tsr_kv_cache_begin: batch of %lld tokens; expected 0..%lld (n_batch_max)",
                          (long long)n_tokens, (long long)c->p.n_batch_max);
    for (int64_t i = 0; (seq || pos) && i < n_tokens; i++) {
        if (seq && (seq[i] < 0 || seq[i] >= c->p.n_seq))
            return tsr__error(TSR_E_INVALID, "tsr_kv_cache_begin: token %lld: sequence %d is not 0..%d", (long long)i,
                              seq[i], c->p.n_seq - 1);
        if (pos && pos[i] < 0)
            return tsr__error(TSR_E_INVALID, "tsr_kv_cache_begin: token %lld: position %d is negative", (long long)i,
                              pos[i]);
    }
    return TSR_OK;
}

/* Positions when the caller gives none: each sequence continues after its
 * largest position. */
static void default_positions(const tsr_kv_cache *c, int64_t n_tokens, const int32_t *seq, int32_t *out) {
    int32_t *next = c->next_buf;
    memset(next, 0, (size_t)c->p.n_seq * sizeof *next);
    for (int64_t i = 0; i < c->p.n_ctx; i++)
        if (c->cell_pos[i] >= 0 && c->cell_pos[i] >= next[c->cell_seq[i]])
            next[c->cell_seq[i]] = c->cell_pos[i] == INT32_MAX ? INT32_MAX : c->cell_pos[i] + 1;
    for (int64_t i = 0; i < n_tokens; i++) {
        int s = seq ? seq[i] : 0;
        out[i] = next[s];
        if (next[s] < INT32_MAX)
            next[s]++;
    }
}

/* Causal mask: token i sees cell j when the cell is in use, of the same
 * sequence, at a position <= its own and, with a window (n_swa > 0), less
 * than n_swa positions behind it. Padding rows are fully masked. */
static void fill_mask(const tsr_kv_cache *c, uint16_t *m, int64_t n_kv, int64_t n_rows, int64_t n_tokens,
                      const int32_t *pos, const int32_t *seq, int64_t n_swa) {
    const uint16_t zero = 0x0000, ninf = 0xFC00; /* F16 0 and -inf */
    for (int64_t i = 0; i < n_rows; i++) {
        uint16_t *row = m + i * n_kv;
        if (i >= n_tokens) {
            for (int64_t j = 0; j < n_kv; j++) row[j] = ninf;
            continue;
        }
        int32_t p = pos[i], s = seq ? seq[i] : 0;
        for (int64_t j = 0; j < n_kv; j++) {
            int32_t cp = j < c->p.n_ctx ? c->cell_pos[j] : -1;
            bool seen = cp >= 0 && cp <= p && c->cell_seq[j] == s && (n_swa <= 0 || (int64_t)p - cp < n_swa);
            row[j] = seen ? zero : ninf;
        }
    }
}

/* The graph's bound of cells: the last cell in use, rounded up. */
static int64_t cells_bound(const tsr_kv_cache *c) {
    int64_t last = -1;
    for (int64_t i = c->p.n_ctx; i-- > 0;)
        if (c->cell_pos[i] >= 0) {
            last = i;
            break;
        }
    int64_t n = (int64_t)tsr__pad((size_t)(last + 1), TSR_KV_PAD);
    return n < c->n_ctx_alloc ? n : c->n_ctx_alloc;
}

/* Builds the inputs of a batch whose cells are in cells[]; on failure the
 * context holds the error. */
static tsr_status build_inputs(tsr_kv_cache *c, tsr_context *ctx, int64_t n_tokens, int64_t n_kv, const int32_t *pos,
                               const int32_t *seq, const int64_t *cells, bool reserve) {
    int64_t n_rows = c->flash ? (int64_t)tsr__pad((size_t)n_tokens, TSR_KV_MASK_ROWS_PAD) : n_tokens;
    int64_t ne_idx[1] = {n_tokens}, ne_mask[2] = {n_kv, n_rows};
    tsr_tensor *idx = tsr_input(ctx, TSR_TYPE_I64, 1, ne_idx, cells);
    tsr_tensor *mask = idx ? tsr_input(ctx, TSR_TYPE_F16, 2, ne_mask, NULL) : NULL;
    tsr_tensor *mask_swa = mask && c->any_swa ? tsr_input(ctx, TSR_TYPE_F16, 2, ne_mask, NULL) : NULL;
    if (!mask || (c->any_swa && !mask_swa))
        return tsr_context_status(ctx);
    tsr_set_name(idx, "kv_idx");
    tsr_set_name(mask, "kq_mask");
    if (!reserve && mask->data)
        fill_mask(c, mask->data, n_kv, n_rows, n_tokens, pos, seq, 0);
    if (mask_swa) {
        tsr_set_name(mask_swa, "kq_mask_swa");
        if (!reserve && mask_swa->data)
            fill_mask(c, mask_swa->data, n_kv, n_rows, n_tokens, pos, seq, c->p.n_swa);
    }
    c->ctx = ctx;
    c->ctx_id = ctx->id;
    c->n_tokens = n_tokens;
    c->n_kv = n_kv;
    c->idx = idx;
    c->mask = mask;
    c->mask_swa = mask_swa;
    return TSR_OK;
}

void tsr__kv_seq_range(const tsr_kv_cache *c, int seq, int64_t *c0, int64_t *c1) {
    *c0 = 0;
    *c1 = c->p.n_ctx;
    if (c->p.per_seq_cells && seq >= 0 && seq < c->p.n_seq) {
        *c0 = c->p.n_ctx * seq / c->p.n_seq;
        *c1 = c->p.n_ctx * (seq + 1) / c->p.n_seq;
    }
}

/* Lowest free cells first, so n_kv stays small; with per_seq_cells each
 * token's in its sequence's range (a cursor per sequence in next_buf, free
 * once the positions are known). */
static int64_t find_cells(const tsr_kv_cache *c, int64_t n_tokens, const int32_t *seq, int64_t *cells) {
    int64_t found = 0;
    if (!c->p.per_seq_cells) {
        for (int64_t i = 0; i < c->p.n_ctx && found < n_tokens; i++)
            if (c->cell_pos[i] < 0)
                cells[found++] = i;
        return found;
    }
    int32_t *cur = c->next_buf;
    for (int s = 0; s < c->p.n_seq; s++) cur[s] = -1;
    for (; found < n_tokens; found++) {
        int s = seq ? seq[found] : 0;
        int64_t c0, c1, i;
        tsr__kv_seq_range(c, s, &c0, &c1);
        for (i = cur[s] < 0 ? c0 : cur[s]; i < c1 && c->cell_pos[i] >= 0; i++) {
        }
        if (i >= c1)
            return found;
        cells[found] = i;
        cur[s] = (int32_t)(i + 1);
    }
    return found;
}

/* TSR_E_FULL when fewer than n_tokens cells are free, or with
 * per_seq_cells, fewer than a sequence's tokens in its range (then nothing
 * changes). */
static tsr_status check_room(const tsr_kv_cache *c, int64_t n_tokens, const int32_t *seq) {
    if (n_tokens > c->p.n_ctx - c->n_used)
        return tsr__error(TSR_E_FULL,
                          "tsr_kv_cache_begin: batch of %lld tokens needs free cells; %lld of %lld are free",
                          (long long)n_tokens, (long long)(c->p.n_ctx - c->n_used), (long long)c->p.n_ctx);
    if (!c->p.per_seq_cells)
        return TSR_OK;
    for (int s = 0; s < c->p.n_seq; s++) {
        int64_t want = 0, free_cells = 0, c0, c1;
        for (int64_t i = 0; i < n_tokens; i++) want += (seq ? seq[i] : 0) == s;
        if (want == 0)
            continue;
        tsr__kv_seq_range(c, s, &c0, &c1);
        for (int64_t i = c0; i < c1; i++) free_cells += c->cell_pos[i] < 0;
        if (want > free_cells)
            return tsr__error(TSR_E_FULL, "tsr_kv_cache_begin: sequence %d needs %lld cells; %lld of its %lld are free",
                              s, (long long)want, (long long)free_cells, (long long)(c1 - c0));
    }
    return TSR_OK;
}

/* Cells for the batch (marked used), or TSR_E_FULL with nothing changed
 * (after check_room, which keeps the scratch in bounds, only if the
 * count of cells used were wrong). */
static tsr_status take_cells(tsr_kv_cache *c, int64_t n_tokens, const int32_t *pos, const int32_t *seq,
                             int64_t *cells) {
    const int64_t found = find_cells(c, n_tokens, seq, cells);
    if (found < n_tokens)
        return tsr__error(TSR_E_FULL, "tsr_kv_cache_begin: batch of %lld tokens; %lld cells are free",
                          (long long)n_tokens, (long long)found);
    for (int64_t i = 0; i < n_tokens; i++) {
        c->cell_pos[cells[i]] = pos[i];
        c->cell_seq[cells[i]] = seq ? seq[i] : 0;
    }
    return TSR_OK;
}

/* The arguments of a begin: a cache and a context of its backend, a batch. */
static tsr_status check_begin(const tsr_kv_cache *c, const tsr_context *ctx, int64_t n_tokens, const int32_t *pos,
                              const int32_t *seq, const char *what) {
    if (!c || !ctx)
        return tsr__error(TSR_E_INVALID, "%s: NULL %s", what, !c ? "cache" : "context");
    if (ctx->backend != c->b)
        return tsr__error(TSR_E_INVALID, "%s: the context belongs to another backend than the cache", what);
    return check_batch(c, n_tokens, pos, seq);
}

tsr_status tsr_kv_cache_begin(tsr_kv_cache *c, tsr_context *ctx, int64_t n_tokens, const int32_t *pos,
                              const int32_t *seq) {
    tsr_status s = check_begin(c, ctx, n_tokens, pos, seq, "tsr_kv_cache_begin");
    if (s != TSR_OK || (s = check_room(c, n_tokens, seq)) != TSR_OK)
        return s;
    if (!pos) {
        default_positions(c, n_tokens, seq, c->pos_buf);
        pos = c->pos_buf;
    }
    int64_t *cells = c->cells_buf;
    if ((s = take_cells(c, n_tokens, pos, seq, cells)) != TSR_OK)
        return s;
    s = build_inputs(c, ctx, n_tokens, cells_bound(c), pos, seq, cells, false);
    if (s != TSR_OK) { /* nothing changes on failure */
        for (int64_t i = 0; i < n_tokens; i++) c->cell_pos[cells[i]] = -1;
        return s;
    }
    c->n_used += n_tokens;
    return TSR_OK;
}

tsr_status tsr_kv_cache_begin_again(tsr_kv_cache *c, tsr_context *ctx, int64_t n_tokens, const int32_t *pos,
                                    const int32_t *seq) {
    tsr_status s = check_begin(c, ctx, n_tokens, pos, seq, "tsr_kv_cache_begin_again");
    if (s != TSR_OK)
        return s;
    /* the id, not the pointer: a context made where a closed one was is another */
    if (!c->idx || ctx->id != c->ctx_id)
        return tsr__error(TSR_E_STATE, "tsr_kv_cache_begin_again: the last tsr_kv_cache_begin was not in this context");
    if (n_tokens != c->n_tokens)
        return tsr__error(TSR_E_STATE, "tsr_kv_cache_begin_again: batch of %lld tokens; the graph's has %lld",
                          (long long)n_tokens, (long long)c->n_tokens);
    int64_t *cells = c->idx->data; /* the graph reads them from here */
    const int64_t n_rows = c->mask->ne[1];
    if ((n_tokens > 0 && !cells) || (n_rows > 0 && (!c->mask->data || (c->mask_swa && !c->mask_swa->data))))
        return tsr__error(TSR_E_STATE, "tsr_kv_cache_begin_again: the inputs of the last begin have no memory");
    if ((s = check_room(c, n_tokens, seq)) != TSR_OK)
        return s;
    if (!pos) {
        default_positions(c, n_tokens, seq, c->pos_buf);
        pos = c->pos_buf;
    }
    /* the cells into scratch first: the graph's keep their values when the shape differs */
    if ((s = take_cells(c, n_tokens, pos, seq, c->cells_buf)) != TSR_OK)
        return s;
    const int64_t n_kv = cells_bound(c);
    if (n_kv != c->n_kv) { /* another shape: undo */
        for (int64_t i = 0; i < n_tokens; i++) c->cell_pos[c->cells_buf[i]] = -1;
        return tsr__error(TSR_E_STATE,
                          "tsr_kv_cache_begin_again: the batch's cells need %lld cells read; the graph reads %lld",
                          (long long)n_kv, (long long)c->n_kv);
    }
    if (n_tokens > 0)
        memcpy(cells, c->cells_buf, (size_t)n_tokens * sizeof *cells);
    if (n_rows > 0)
        fill_mask(c, c->mask->data, n_kv, n_rows, n_tokens, pos, seq, 0);
    if (c->mask_swa && n_rows > 0)
        fill_mask(c, c->mask_swa->data, n_kv, n_rows, n_tokens, pos, seq, c->p.n_swa);
    c->n_used += n_tokens;
    return TSR_OK;
}

tsr_status tsr_kv_cache_begin_reserve(tsr_kv_cache *c, tsr_context *ctx, int64_t n_tokens) {
    if (!c || !ctx)
        return tsr__error(TSR_E_INVALID, "tsr_kv_cache_begin_reserve: NULL %s", !c ? "cache" : "context");
    if (ctx->backend != c->b)
        return tsr__error(TSR_E_INVALID, "tsr_kv_cache_begin_reserve: the context belongs to another backend");
    if (n_tokens < 0 || n_tokens > c->p.n_batch_max || n_tokens > c->p.n_ctx)
        return tsr__error(TSR_E_RANGE, "tsr_kv_cache_begin_reserve: batch of %lld tokens; expected 0..%lld",
                          (long long)n_tokens,
                          (long long)(c->p.n_batch_max < c->p.n_ctx ? c->p.n_batch_max : c->p.n_ctx));
    /* indices 0..n-1 (valid, never written: the graph is only sized) */
    int64_t *cells = tsr__malloc((size_t)(n_tokens > 0 ? n_tokens : 1) * sizeof *cells);
    if (!cells)
        return tsr__error(TSR_E_NOMEM, "tsr_kv_cache_begin_reserve: out of host memory");
    for (int64_t i = 0; i < n_tokens; i++) cells[i] = i;
    tsr_status s = build_inputs(c, ctx, n_tokens, c->n_ctx_alloc, NULL, NULL, cells, true);
    tsr__free(cells);
    return s;
}
