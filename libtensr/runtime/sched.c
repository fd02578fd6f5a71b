/*
 * sched.c - the scheduler: one per backend, made with it and reset by every
 * compute. For each graph it
 *  1. assigns every node to a device: an in-place write runs where its
 *     target lives, otherwise the first weight read decides (shared weights
 *     with per-device copies do not), otherwise the first source with a
 *     device, otherwise the CPU; an op the device cannot run falls back to
 *     the CPU;
 *  2. groups consecutive nodes of one device into splits;
 *  3. plans copies: a node reading memory its device cannot address (another
 *     device's memory, or system memory from a non-CPU device) reads a copy
 *     of that tensor's root storage in its own compute buffer. A copy is made
 *     once, at the start of the first split that needs it, and reused by
 *     later splits on the same device unless the graph writes the root in
 *     place (then each split makes its own). Shared weights are read through
 *     their per-device copies (place.c) instead. Nodes see copies through
 *     "shadow" tensors swapped into their src[] while planning and while
 *     their split runs, and restored right after, so the caller's graph is
 *     never left modified;
 *  4. plans compute memory of every device with the graph allocator (copies
 *     included), grows each device's compute buffer only when a graph needs
 *     more than any before (tsr_reserve sizes it up front; measure mode only
 *     reports the sizes), and runs the splits, copying first.
 * After a reserve, a graph no larger allocates nothing: every array here is
 * kept and grown only, device-to-device copies go through a staging buffer
 * sized at planning time.
 *
 * A compute of the same outputs as the compute before it, with no tensor
 * made in their context since (its version, unique in the process) and no
 * other plan in between, is the same graph (a node's sources never change
 * once it is made): it runs on the last plan, without steps 1-4 (a decode
 * step built once and run for each token). TSR_GRAPH_REUSE=0 plans every
 * compute.
 */
#include "core.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#define LOC_NONE (-1)    /* not decided yet (a tsr_empty leaf before its first use) */
#define LOC_SYSMEM (-2)  /* plain system memory (inputs) */
#define LOC_FOREIGN (-3) /* memory of a device that is not in this backend */

#define POOL_CHUNK 64
#define STAGING_MAX ((size_t)16 << 20)

typedef struct tsr_split {
    int dev;
    size_t first, n;
    size_t copy_begin, copy_end; /* copies made before the split runs */
    size_t swap_begin, swap_end; /* src swaps of its nodes */
} tsr_split;

typedef struct tsr_copy {
    tsr_tensor *root; /* source storage */
    tsr_tensor *copy; /* its copy on dev (a pool tensor with root's shape) */
    int dev;
} tsr_copy;

typedef struct tsr_swap {
    tsr_tensor *node;
    int j;
    tsr_tensor *with, *orig;
} tsr_swap;

/* What a node on `dev` in split `split` (-1: any split) reads instead of key. */
typedef struct tsr_shadow {
    tsr_tensor *key, *t;
    int dev, split, next;
} tsr_shadow;

typedef struct tsr_pool_chunk {
    tsr_tensor t[POOL_CHUNK];
} tsr_pool_chunk;

struct tsr_sched {
    tsr_backend *b;
    tsr_graph graph;
    tsr_galloc *ga;
    tsr_buffer **bufs; /* compute buffer per device */
    size_t *peak;
    tsr_split *splits;
    size_t n_splits, cap_splits;
    tsr_copy *copies;
    size_t n_copies, cap_copies;
    tsr_galloc_extra *extras;
    size_t cap_extras;
    tsr_swap *swaps;
    size_t n_swaps, cap_swaps;
    tsr_shadow *shadows;
    size_t n_shadows, cap_shadows;
    tsr_tensor **written; /* roots the graph writes in place */
    size_t n_written, cap_written;
    tsr_pool_chunk **chunks; /* tensor structs of copies and shadows, reused */
    size_t n_chunks, cap_chunks, pool_used;
    void *staging; /* host memory for device-to-device copies (staging_buf's, or NULL) */
    tsr_buffer *staging_buf;
    size_t staging_size, staging_need;
    /* The outputs and context version of the compute the plan is for (n_last 0: none) */
    tsr_tensor **last_outs;
    size_t n_last, cap_last;
    uint64_t last_version;
    bool reuse; /* TSR_GRAPH_REUSE is not "0" */
};

static _Atomic uint64_t tsr_n_plans;
uint64_t tsr__plan_count(void) { return atomic_load(&tsr_n_plans); }

static tsr_status oom(void) { return tsr__error(TSR_E_NOMEM, "out of host memory scheduling the graph"); }

tsr_status tsr__sched_new(tsr_backend *b, tsr_sched **out) {
    tsr_sched *s = tsr__calloc(1, sizeof *s);
    if (!s)
        return tsr__error(TSR_E_NOMEM, "out of host memory creating the scheduler");
    s->b = b;
    const char *env = getenv("TSR_GRAPH_REUSE");
    s->reuse = !(env && strcmp(env, "0") == 0);
    s->bufs = tsr__calloc(b->n_devices, sizeof *s->bufs);
    s->peak = tsr__calloc(b->n_devices, sizeof *s->peak);
    tsr_status st = s->bufs && s->peak ? tsr__galloc_new(b->n_devices, (int)b->host, &s->ga)
                                       : tsr__error(TSR_E_NOMEM, "out of host memory creating the scheduler");
    if (st != TSR_OK) {
        tsr__sched_free(s);
        return st;
    }
    *out = s;
    return TSR_OK;
}

void tsr__sched_free(tsr_sched *s) {
    if (!s)
        return;
    for (size_t i = 0; s->bufs && i < s->b->n_devices; i++) {
        if (s->bufs[i] && s->b->live)
            s->b->live[i] -= s->bufs[i]->size;
        tsr_buffer_free(s->bufs[i]);
    }
    tsr__free(s->bufs);
    tsr__free(s->peak);
    tsr__galloc_free(s->ga);
    tsr__graph_free(&s->graph);
    tsr__free(s->splits);
    tsr__free(s->copies);
    tsr__free(s->extras);
    tsr__free(s->swaps);
    tsr__free(s->shadows);
    tsr__free(s->written);
    for (size_t i = 0; i < s->n_chunks; i++) tsr__free(s->chunks[i]);
    tsr__free(s->chunks);
    tsr_buffer_free(s->staging_buf);
    tsr__free(s->last_outs);
    tsr__free(s);
}

/* ---- where memory lives ------------------------------------------------------ */

static int cpu_index(const tsr_backend *b) { return (int)tsr__backend_host_index(b); }

static bool is_static(const tsr_tensor *r) {
    return r->op == TSR_OP_NONE && (r->flags & (TSR_FLAG_INPUT | TSR_FLAG_WEIGHT | TSR_FLAG_PERSIST));
}

/* Device index holding t's storage, or LOC_*. Computed results and
 * tsr_empty leafs are where this compute put them (device_id); leafs with
 * their own memory are where their buffer is (host buffer types count as the
 * CPU); weights without memory yet are where placement planned them. */
static int location_of(const tsr_backend *b, const tsr_tensor *t) {
    const tsr_tensor *r = tsr__view_root((tsr_tensor *)t);
    if (!is_static(r))
        return r->device_id >= 0 ? r->device_id : LOC_NONE;
    if (r->buffer) {
        const tsr_buffer_type *bt = r->buffer->buft;
        if (bt->is_host)
            return cpu_index(b);
        size_t i = tsr__backend_device_index(b, bt->device);
        return i < b->n_devices ? (int)i : LOC_FOREIGN;
    }
    if (r->flags & TSR_FLAG_WEIGHT)
        return r->device_id >= 0 && (size_t)r->device_id < b->n_devices ? r->device_id : cpu_index(b);
    if ((r->flags & TSR_FLAG_PERSIST) && b->plan_mode && r->device_id >= 0 && (size_t)r->device_id < b->n_devices)
        return r->device_id; /* a planned KV cache of a dry run */
    return LOC_SYSMEM;
}

static bool accessible(const tsr_backend *b, int loc, int dev) {
    return loc == dev || (loc == LOC_SYSMEM && dev == cpu_index(b));
}

static const char *loc_name(const tsr_backend *b, int loc) {
    if (loc >= 0)
        return b->devices[loc]->name;
    return loc == LOC_SYSMEM ? "system memory" : loc == LOC_FOREIGN ? "a device outside the backend" : "nowhere";
}

static bool supports(const tsr_backend *b, int dev, const tsr_tensor *node) {
    const tsr_device *d = b->devices[dev];
    return d->iface->supports_op && d->iface->supports_op(d, node);
}

/* ---- device assignment ---------------------------------------------------------- */

static int pick_device(const tsr_backend *b, const tsr_tensor *node) {
    if (node->view_src) { /* in place: where the target lives */
        int d = location_of(b, node->view_src);
        if (d >= 0 || d == LOC_FOREIGN)
            return d;
        if (d == LOC_SYSMEM)
            return cpu_index(b);
    }
    for (int j = 0; j < TSR_MAX_SRC; j++) {
        const tsr_tensor *s = node->src[j];
        if (!s)
            continue;
        const tsr_tensor *r = tsr__view_root((tsr_tensor *)s);
        if ((r->flags & TSR_FLAG_WEIGHT) && r->op == TSR_OP_NONE && !tsr__weight_is_shared(b, r)) {
            int d = location_of(b, r);
            if (d >= 0)
                return d;
        }
    }
    for (int j = 0; j < TSR_MAX_SRC; j++)
        if (node->src[j]) {
            int d = location_of(b, node->src[j]);
            if (d >= 0)
                return d;
        }
    return cpu_index(b);
}

static tsr_status check_leaf(const tsr_backend *b, const tsr_tensor *t, bool need_memory) {
    if (t->ctx && t->ctx->backend != b)
        return tsr__error(TSR_E_INVALID, "tensor '%s' belongs to a context of another backend", t->name);
    if (need_memory && (t->flags & (TSR_FLAG_WEIGHT | TSR_FLAG_PERSIST | TSR_FLAG_INPUT)) && !t->data &&
        tsr_tensor_nbytes(t) > 0)
        return tsr__error(TSR_E_STATE, "tensor '%s' has no memory yet%s", t->name,
                          (t->flags & TSR_FLAG_WEIGHT) ? " (weights are allocated by tsr_backend_place_weights or "
                                                         "tsr_backend_load_gguf)"
                                                       : "");
    return TSR_OK;
}

static tsr_status add_split(tsr_sched *s, int dev, size_t first) {
    if (!TSR_GROW(s->splits, s->cap_splits, s->n_splits + 1))
        return oom();
    s->splits[s->n_splits++] = (tsr_split){dev, first, 0, 0, 0, 0, 0};
    return TSR_OK;
}

/* A tsr_empty leaf (memory from the graph allocator) lives where it is first used. */
static void claim_empty(tsr_tensor *t, int dev) {
    if (!t)
        return;
    tsr_tensor *r = tsr__view_root(t);
    if (r->op == TSR_OP_NONE && !is_static(r) && r->device_id < 0)
        r->device_id = dev;
}

static tsr_status place_node(tsr_sched *s, tsr_tensor *n) {
    tsr_backend *b = s->b;
    int cpu = cpu_index(b), dev = pick_device(b, n);
    if (dev == LOC_FOREIGN)
        return tsr__error(TSR_E_UNSUPPORTED,
                          "node '%s' (%s) writes into '%s', which lives on a device outside the "
                          "backend",
                          n->name, tsr__op_name(n->op), n->view_src->name);
    if (!supports(b, dev, n)) {
        if (n->view_src && location_of(b, n->view_src) == dev && dev != cpu)
            return tsr__error(TSR_E_UNSUPPORTED,
                              "%s cannot run %s of node '%s' with these types, and the node "
                              "writes into memory of that device",
                              b->devices[dev]->name, tsr__op_name(n->op), n->name);
        if (dev == cpu || !supports(b, cpu, n))
            return tsr__error(TSR_E_UNSUPPORTED, "no device of the backend runs %s of node '%s' with these types",
                              tsr__op_name(n->op), n->name);
        dev = cpu;
    }
    n->device_id = dev;
    if (n->view_src) {
        claim_empty(n->view_src, dev);
        if (!TSR_GROW(s->written, s->cap_written, s->n_written + 1))
            return oom();
        s->written[s->n_written++] = tsr__view_root(n->view_src);
    }
    for (int j = 0; j < TSR_MAX_SRC; j++) claim_empty(n->src[j], dev);
    return TSR_OK;
}

/* Assigns devices and forms splits. */
static tsr_status assign(tsr_sched *s, bool need_memory) {
    tsr_backend *b = s->b;
    tsr_graph *g = &s->graph;
    tsr_status st;
    for (size_t i = 0; i < g->n_leafs; i++) {
        if ((st = check_leaf(b, g->leafs[i], need_memory)) != TSR_OK)
            return st;
        if (!is_static(g->leafs[i]))
            g->leafs[i]->device_id = -1;
    }
    s->n_splits = s->n_written = 0;
    for (size_t i = 0; i < g->n_nodes; i++) {
        tsr_tensor *n = g->nodes[i];
        if (n->ctx && n->ctx->backend != b)
            return tsr__error(TSR_E_INVALID, "node '%s' (%s) belongs to a context of another backend", n->name,
                              tsr__op_name(n->op));
        if ((st = place_node(s, n)) != TSR_OK)
            return st;
        if (s->n_splits == 0 || s->splits[s->n_splits - 1].dev != n->device_id)
            if ((st = add_split(s, n->device_id, i)) != TSR_OK)
                return st;
        s->splits[s->n_splits - 1].n++;
    }
    return TSR_OK;
}

/* ---- copies ------------------------------------------------------------------------ */

static tsr_tensor *pool_get(tsr_sched *s) {
    size_t ci = s->pool_used / POOL_CHUNK;
    if (ci == s->n_chunks) {
        if (!TSR_GROW(s->chunks, s->cap_chunks, s->n_chunks + 1))
            return NULL;
        tsr_pool_chunk *c = tsr__malloc(sizeof *c);
        if (!c)
            return NULL;
        s->chunks[s->n_chunks++] = c;
    }
    tsr_tensor *t = &s->chunks[ci]->t[s->pool_used++ % POOL_CHUNK];
    memset(t, 0, sizeof *t);
    t->alloc_id = t->shadow_head = -1;
    return t;
}

static bool is_written(const tsr_sched *s, const tsr_tensor *root) {
    for (size_t i = 0; i < s->n_written; i++)
        if (s->written[i] == root)
            return true;
    return false;
}

/* Byte offset of view t inside its root's storage. */
static size_t root_offset(const tsr_tensor *t) {
    size_t off = 0;
    for (; t->view_src; t = t->view_src) off += t->view_offs;
    return off;
}

static tsr_tensor *shadow_find(const tsr_sched *s, const tsr_tensor *key, int dev, int split) {
    if (key->shadow_mark != s->b->visit_mark)
        return NULL;
    for (int e = key->shadow_head; e >= 0; e = s->shadows[e].next)
        if (s->shadows[e].dev == dev && s->shadows[e].split == split)
            return s->shadows[e].t;
    return NULL;
}

static bool shadow_add(tsr_sched *s, tsr_tensor *key, tsr_tensor *t, int dev, int split) {
    if (!TSR_GROW(s->shadows, s->cap_shadows, s->n_shadows + 1))
        return false;
    int head = key->shadow_mark == s->b->visit_mark ? key->shadow_head : -1;
    s->shadows[s->n_shadows] = (tsr_shadow){key, t, dev, split, head};
    key->shadow_head = (int32_t)s->n_shadows++;
    key->shadow_mark = s->b->visit_mark;
    return true;
}

/* A new copy of root r on dev, made at the start of split k. */
static tsr_tensor *new_copy(tsr_sched *s, tsr_tensor *r, int dev) {
    tsr_backend *b = s->b;
    tsr_tensor *c = pool_get(s);
    if (!c || !TSR_GROW(s->copies, s->cap_copies, s->n_copies + 1))
        return NULL;
    c->type = r->type;
    c->n_dims = r->n_dims;
    memcpy(c->ne, r->ne, sizeof c->ne);
    memcpy(c->nb, r->nb, sizeof c->nb);
    c->device_id = dev;
    snprintf(c->name, sizeof c->name, "%.40s#%.20s", r->name, b->devices[dev]->name);
    s->copies[s->n_copies++] = (tsr_copy){r, c, dev};
    /* a copy between two non-host devices bounces through host staging memory */
    int from = location_of(b, r);
    size_t size = tsr_tensor_nbytes(r);
    if (from >= 0 && from != cpu_index(b) && dev != cpu_index(b) && size > s->staging_need)
        s->staging_need = size < STAGING_MAX ? size : STAGING_MAX;
    return c;
}

/* What a node on dev in split k reads instead of src (a copy of its root,
 * or a view of that copy). NULL when out of host memory. */
static tsr_tensor *shadow_of(tsr_sched *s, tsr_tensor *src, int dev, int k) {
    tsr_tensor *r = tsr__view_root(src);
    int split = is_written(s, r) ? k : -1;
    tsr_tensor *t = shadow_find(s, src, dev, split);
    if (t)
        return t;
    if (src == r) {
        t = (r->flags & TSR_FLAG_WEIGHT) ? tsr__weight_copy_on(s->b, r, dev) : NULL;
        if (t)
            t->alloc_id = -1; /* static memory: nothing for the allocator */
        else if (!(t = new_copy(s, r, dev)))
            return NULL;
    } else {
        tsr_tensor *c = shadow_of(s, r, dev, k);
        if (!c || !(t = pool_get(s)))
            return NULL;
        t->type = src->type;
        t->n_dims = src->n_dims;
        memcpy(t->ne, src->ne, sizeof t->ne);
        memcpy(t->nb, src->nb, sizeof t->nb);
        memcpy(t->name, src->name, sizeof t->name);
        t->op = TSR_OP_VIEW;
        t->view_src = c;
        t->view_offs = root_offset(src);
        t->device_id = dev;
    }
    return shadow_add(s, src, t, dev, split) ? t : NULL;
}

static tsr_status plan_node_copies(tsr_sched *s, tsr_tensor *n, int dev, int k) {
    tsr_backend *b = s->b;
    for (int j = 0; j < TSR_MAX_SRC; j++) {
        tsr_tensor *src = n->src[j];
        if (!src || tsr__nbytes(src) == 0)
            continue;
        if (n->view_src && tsr__view_root(src) == tsr__view_root(n->view_src))
            continue; /* the in-place target: on dev by construction */
        int loc = location_of(b, src);
        if (accessible(b, loc, dev))
            continue;
        if (loc == LOC_NONE)
            return tsr__error(TSR_E_STATE, "node '%s' reads '%s', which no node of the graph computes", n->name,
                              src->name);
        tsr_tensor *sh = shadow_of(s, src, dev, k);
        if (!sh || !TSR_GROW(s->swaps, s->cap_swaps, s->n_swaps + 1))
            return oom();
        s->swaps[s->n_swaps++] = (tsr_swap){n, j, sh, src};
    }
    return TSR_OK;
}

static tsr_status plan_copies(tsr_sched *s) {
    s->n_copies = s->n_swaps = s->n_shadows = s->pool_used = s->staging_need = 0;
    for (size_t k = 0; k < s->n_splits; k++) {
        tsr_split *sp = &s->splits[k];
        sp->copy_begin = s->n_copies;
        sp->swap_begin = s->n_swaps;
        for (size_t i = sp->first; i < sp->first + sp->n; i++) {
            tsr_status st = plan_node_copies(s, s->graph.nodes[i], sp->dev, (int)k);
            if (st != TSR_OK)
                return st;
        }
        sp->copy_end = s->n_copies;
        sp->swap_end = s->n_swaps;
    }
    for (size_t i = 0; i < s->b->weights.n_copies; i++) { /* shared weights refreshed device to device */
        const tsr_weight_copy *wc = &s->b->weights.copies[i];
        size_t size = tsr_tensor_nbytes(wc->primary);
        if (wc->primary->buffer && !wc->primary->buffer->buft->is_host && wc->dev != cpu_index(s->b) &&
            size > s->staging_need)
            s->staging_need = size < STAGING_MAX ? size : STAGING_MAX;
    }
    if (!TSR_GROW(s->extras, s->cap_extras, s->n_copies + 1))
        return oom();
    for (size_t k = 0; k < s->n_splits; k++)
        for (size_t c = s->splits[k].copy_begin; c < s->splits[k].copy_end; c++)
            s->extras[c] = (tsr_galloc_extra){s->copies[c].copy, s->copies[c].root, s->copies[c].dev,
                                              (int)s->splits[k].first};
    s->b->n_copies = s->n_copies;
    return TSR_OK;
}

static void swap_apply(tsr_sched *s, size_t begin, size_t end, bool apply) {
    for (size_t i = begin; i < end; i++)
        s->swaps[i].node->src[s->swaps[i].j] = apply ? s->swaps[i].with : s->swaps[i].orig;
}

/* Every node, seen with its split's swaps, reads only memory its device addresses. */
static tsr_status verify_splits(tsr_sched *s) {
    tsr_backend *b = s->b;
    tsr_status st = TSR_OK;
    for (size_t k = 0; k < s->n_splits && st == TSR_OK; k++) {
        tsr_split *sp = &s->splits[k];
        swap_apply(s, sp->swap_begin, sp->swap_end, true);
        for (size_t i = sp->first; i < sp->first + sp->n && st == TSR_OK; i++) {
            const tsr_tensor *n = s->graph.nodes[i];
            for (int j = 0; j < TSR_MAX_SRC && st == TSR_OK; j++) {
                int loc = n->src[j] && tsr__nbytes(n->src[j]) ? location_of(b, n->src[j]) : sp->dev;
                if (!accessible(b, loc, sp->dev))
                    st = tsr__error(TSR_E_STATE, "scheduler: node '%s' on %s would read '%s' from %s", n->name,
                                    b->devices[sp->dev]->name, n->src[j]->name, loc_name(b, loc));
            }
        }
        swap_apply(s, sp->swap_begin, sp->swap_end, false);
    }
    return st;
}

/* ---- memory ------------------------------------------------------------------------ */

/* Host memory the GPUs copy from and to: the first GPU's pinned host buffer
 * type (page-locked: copies run asynchronously at full speed, not staged by
 * the driver through a pageable bounce), else the CPU's own. */
static tsr_buffer_type *pinned_buft(const tsr_backend *b) {
    for (size_t d = 0; d < b->n_devices; d++)
        if (d != tsr__backend_host_index(b) && b->devices[d]->host_buft && b->devices[d]->host_buft->is_host)
            return b->devices[d]->host_buft;
    return b->devices[tsr__backend_host_index(b)]->buft;
}

/* Makes each device's compute buffer at least as large as the plan (the
 * CPU's in pinned host memory when there is a GPU: the activations and
 * results that cross to and from it), and the staging memory as large as
 * the largest device-to-device copy needs (pinned too). */
static tsr_status ensure_buffers(tsr_sched *s) {
    tsr_backend *b = s->b;
    for (size_t d = 0; d < b->n_devices; d++) {
        if (s->peak[d] == 0 || (s->bufs[d] && s->bufs[d]->size >= s->peak[d]))
            continue;
        char mib[32];
        tsr__log(TSR_LOG_DEBUG, "compute buffer", 2, "device", b->devices[d]->name, "mib",
                 tsr__fmt(mib, sizeof mib, "%.2f", s->peak[d] / 1048576.0));
        if (s->bufs[d])
            b->live[d] -= s->bufs[d]->size;
        tsr_buffer_free(s->bufs[d]);
        s->bufs[d] = NULL;
        b->plan_compute[d] = s->peak[d];
        tsr_buffer_type *bt = d == tsr__backend_host_index(b) ? pinned_buft(b) : b->devices[d]->buft;
        tsr_status st = tsr_buffer_alloc(bt, s->peak[d], &s->bufs[d]);
        if (st != TSR_OK && bt != b->devices[d]->buft) { /* no pinned memory to be had: pageable, slower */
            tsr__log(TSR_LOG_WARN, "pinned host memory refused: the CPU's compute buffer is pageable", 1, "mib",
                     tsr__fmt(mib, sizeof mib, "%.2f", s->peak[d] / 1048576.0));
            st = tsr_buffer_alloc(b->devices[d]->buft, s->peak[d], &s->bufs[d]);
        }
        if (st != TSR_OK) {
            tsr__error_prefix("compute buffer of %.2f MiB on %s", s->peak[d] / 1048576.0, b->devices[d]->name);
            return st;
        }
        b->live[d] += s->bufs[d]->size;
    }
    if (s->staging_need > s->staging_size) {
        tsr_buffer *nb = NULL;
        if (tsr_buffer_alloc(pinned_buft(b), s->staging_need, &nb) != TSR_OK)
            return tsr__error(TSR_E_NOMEM, "out of host memory for %zu bytes of copy staging: %s", s->staging_need,
                              tsr_last_error());
        tsr_buffer_free(s->staging_buf);
        s->staging_buf = nb;
        s->staging = nb->base;
        s->staging_size = s->staging_need;
    }
    return TSR_OK;
}

static void resolve_view(tsr_tensor *t) {
    if (!t->view_src)
        return;
    resolve_view(t->view_src);
    t->data = t->view_src->data ? (char *)t->view_src->data + t->view_offs : NULL;
    if (t->op == TSR_OP_VIEW || t->device_id < 0) /* an in-place op keeps the device that runs it */
        t->device_id = t->view_src->device_id;
}

static void bind_one(tsr_sched *s, tsr_tensor *t) {
    int dev = tsr__galloc_device(s->ga, t);
    if (dev < 0) {
        if (!t->view_src && !is_static(t))
            t->data = NULL; /* zero-sized */
        return;
    }
    t->buffer = s->bufs[dev];
    t->data = (char *)s->bufs[dev]->base + tsr__galloc_offset(s->ga, t);
    if (t->op == TSR_OP_NONE)
        t->device_id = dev;
}

/* Gives every planned tensor its address, then resolves views. */
static void bind(tsr_sched *s) {
    tsr_graph *g = &s->graph;
    for (size_t i = 0; i < g->n_leafs; i++) bind_one(s, g->leafs[i]);
    for (size_t i = 0; i < g->n_nodes; i++) bind_one(s, g->nodes[i]);
    for (size_t i = 0; i < s->n_copies; i++) bind_one(s, s->copies[i].copy);
    for (size_t i = 0; i < g->n_nodes; i++) resolve_view(g->nodes[i]);
    for (size_t i = 0; i < g->n_views; i++) resolve_view(g->views[i]);
    for (size_t i = 0; i < s->n_shadows; i++) resolve_view(s->shadows[i].t);
}

/* ---- running ------------------------------------------------------------------------- */

static tsr_status copy_root(tsr_sched *s, const tsr_copy *c) {
    const tsr_tensor *r = c->root;
    size_t size = tsr_tensor_nbytes(r);
    /* another device reads a weight its buffer type keeps in a layout of its own: as stored from now on */
    tsr_status st = tsr__tensor_to_stored((tsr_tensor *)r);
    tsr_buffer *db = c->copy->buffer;
    /* from host memory into a device that copies asynchronously: nothing
     * writes the source before the split's synchronize */
    if (st == TSR_OK && size && r->buffer && r->buffer->buft->is_host && db && db->buft != r->buffer->buft &&
        db->buft->iface->set_async)
        st = db->buft->iface->set_async(db, c->copy->data, r->data, size);
    else if (st == TSR_OK)
        st = tsr__buffer_copy_staged(db, c->copy->data, r->buffer, r->data, size, s->staging, s->staging_size);
    if (st != TSR_OK)
        tsr__error_prefix("copying '%s' (%zu bytes) to %s", r->name, size, s->b->devices[c->dev]->name);
    return st;
}

/* Refreshes the per-device copies of shared weights after their data changed. */
static tsr_status sync_weight_copies(tsr_sched *s) {
    tsr_backend *b = s->b;
    uint64_t epoch = tsr__weights_epoch();
    if (b->weights.n_copies == 0 || b->weights.synced_epoch == epoch)
        return TSR_OK;
    for (size_t i = 0; i < b->weights.n_copies; i++) {
        const tsr_weight_copy *wc = &b->weights.copies[i];
        if (!wc->primary->buffer || !wc->copy->buffer)
            continue;
        tsr_status st = tsr__tensor_to_stored(wc->primary);
        if (st == TSR_OK)
            st = tsr__buffer_copy_staged(wc->copy->buffer, wc->copy->data, wc->primary->buffer, wc->primary->data,
                                         tsr_tensor_nbytes(wc->primary), s->staging, s->staging_size);
        if (st != TSR_OK)
            return st;
        wc->copy->flags &= ~(uint32_t)TSR_FLAG_OWN_LAYOUT; /* the stored layout's bytes, whatever the copy had */
    }
    b->weights.synced_epoch = epoch;
    return TSR_OK;
}

static tsr_status run_split(tsr_sched *s, const tsr_split *sp) {
    tsr_backend *b = s->b;
    tsr_status r = TSR_OK;
    for (size_t c = sp->copy_begin; c < sp->copy_end && r == TSR_OK; c++) r = copy_root(s, &s->copies[c]);
    if (r != TSR_OK)
        return r;
    tsr_stream *st = b->streams[sp->dev];
    const tsr_device_iface *di = b->devices[sp->dev]->iface;
    swap_apply(s, sp->swap_begin, sp->swap_end, true);
    r = di->compute(st, s->graph.nodes + sp->first, sp->n);
    if (r == TSR_OK && di->synchronize)
        r = di->synchronize(st);
    swap_apply(s, sp->swap_begin, sp->swap_end, false);
    if (r != TSR_OK)
        tsr__error_prefix("compute on %s", b->devices[sp->dev]->name);
    return r;
}

static tsr_status reserve_streams(tsr_sched *s) {
    tsr_backend *b = s->b;
    for (size_t i = 0; i < s->n_splits; i++) {
        tsr_split *sp = &s->splits[i];
        const tsr_device_iface *di = b->devices[sp->dev]->iface;
        if (di->reserve) {
            tsr_status r = di->reserve(b->streams[sp->dev], s->graph.nodes + sp->first, sp->n);
            if (r != TSR_OK)
                return r;
        }
    }
    return TSR_OK;
}

/* What each device's stream holds beside buffers for this plan (the largest
 * graph so far): the iface's stream_bytes over each of its splits (library
 * workspace + scratch), and for the host the pinned copy staging. */
static void plan_streams(tsr_sched *s) {
    tsr_backend *b = s->b;
    for (size_t i = 0; i < s->n_splits; i++) {
        tsr_split *sp = &s->splits[i];
        const tsr_device *d = b->devices[sp->dev];
        size_t n = d->iface->stream_bytes ? d->iface->stream_bytes(d, s->graph.nodes + sp->first, sp->n) : 0;
        if (n > b->plan_stream[sp->dev])
            b->plan_stream[sp->dev] = n;
    }
    size_t host = tsr__backend_host_index(b);
    if (s->staging_need > b->plan_stream[host])
        b->plan_stream[host] = s->staging_need;
}

/* Graph, devices, splits, copies and the memory plan (peak per device). */
static tsr_status plan_graph(tsr_sched *s, tsr_tensor *const *outs, size_t n_outs, int mode) {
    tsr_backend *b = s->b;
    atomic_fetch_add(&tsr_n_plans, 1);
    s->n_last = 0;                                     /* the plan is for this request from here on */
    (void)TSR_GROW(s->last_outs, s->cap_last, n_outs); /* here, not in the compute after a reserve */
    b->visit_mark++;
    if (b->visit_mark == 0)
        b->visit_mark = 1;
    tsr_status st = tsr__graph_build(&s->graph, outs, n_outs, b->visit_mark);
    if (st == TSR_OK)
        st = assign(s, mode != 2);
    if (st == TSR_OK)
        st = plan_copies(s);
    if (st == TSR_OK && mode != 2)
        st = verify_splits(s);
    if (st != TSR_OK)
        return st;
    swap_apply(s, 0, s->n_swaps, true);
    st = tsr__galloc_plan(s->ga, &s->graph, outs, n_outs, s->extras, s->n_copies, s->peak);
    swap_apply(s, 0, s->n_swaps, false);
    b->n_splits = s->n_splits;
    return st;
}

static void mark_results(tsr_sched *s) {
    uint64_t gen = s->b->generation;
    for (size_t i = 0; i < s->graph.n_nodes; i++) s->graph.nodes[i]->generation = gen;
    for (size_t i = 0; i < s->graph.n_views; i++) s->graph.views[i]->generation = gen;
    for (size_t i = 0; i < s->graph.n_leafs; i++)
        if (!tsr__has_static_data(s->graph.leafs[i]))
            s->graph.leafs[i]->generation = gen;
}

/* The version of the one context all of outs were made in; 0 when they are
 * of several, or of none (weights). */
static uint64_t outs_version(tsr_tensor *const *outs, size_t n_outs) {
    const tsr_context *ctx = n_outs ? outs[0]->ctx : NULL;
    for (size_t i = 1; i < n_outs && ctx; i++)
        if (outs[i]->ctx != ctx)
            return 0;
    return ctx ? ctx->version : 0;
}

/* Whether the last plan is this request's (see the top of the file). */
static bool same_request(const tsr_sched *s, tsr_tensor *const *outs, size_t n_outs) {
    if (!s->reuse || s->n_last == 0 || s->n_last != n_outs)
        return false;
    for (size_t i = 0; i < n_outs; i++)
        if (s->last_outs[i] != outs[i])
            return false;
    return outs_version(outs, n_outs) == s->last_version;
}

/* After a compute that ran: its request, for same_request. */
static void remember_request(tsr_sched *s, tsr_tensor *const *outs, size_t n_outs) {
    s->last_version = outs_version(outs, n_outs);
    if (s->last_version == 0 || n_outs > s->cap_last)
        return; /* not remembered: the next compute plans */
    memcpy(s->last_outs, outs, n_outs * sizeof *outs);
    s->n_last = n_outs;
}

tsr_status tsr__sched_run(tsr_sched *s, tsr_tensor *const *outs, size_t n_outs, int mode, size_t *sizes) {
    tsr_backend *b = s->b;
    if (mode == 0 && same_request(s, outs, n_outs)) {
        b->generation++;
        s->n_last = 0; /* again only after this run succeeds */
        tsr_status st = sync_weight_copies(s);
        for (size_t i = 0; i < s->n_splits && st == TSR_OK; i++) st = run_split(s, &s->splits[i]);
        if (st != TSR_OK)
            return st;
        mark_results(s);
        remember_request(s, outs, n_outs);
        return TSR_OK;
    }
    if (mode == 1 && b->plan_mode) /* a dry run reserves nothing: it measures */
        mode = 3;
    tsr_status st = plan_graph(s, outs, n_outs, mode == 3 ? 2 : mode);
    if (st != TSR_OK)
        return st;
    plan_streams(s);
    if (mode >= 2) {
        if (sizes)
            memcpy(sizes, s->peak, b->n_devices * sizeof *sizes);
        for (size_t d = 0; d < b->n_devices; d++) /* the plan: the largest graph measured */
            if (s->peak[d] > b->plan_compute[d])
                b->plan_compute[d] = s->peak[d];
        return TSR_OK;
    }
    b->generation++; /* earlier results are gone from here on */
    if ((st = ensure_buffers(s)) != TSR_OK)
        return st;
    bind(s);
    if ((st = sync_weight_copies(s)) != TSR_OK)
        return st;
    if (mode == 1)
        return reserve_streams(s);
    for (size_t i = 0; i < s->n_splits; i++)
        if ((st = run_split(s, &s->splits[i])) != TSR_OK)
            return st;
    mark_results(s);
    remember_request(s, outs, n_outs);
    return TSR_OK;
}

/* ---- public entry points --------------------------------------------------- */

static tsr_status check_compute_args(tsr_context *ctx, tsr_tensor *const *outs, size_t n_outs, const char *what) {
    if (!ctx)
        return tsr__error(TSR_E_INVALID, "%s: NULL context", what);
    if (ctx->status != TSR_OK)
        return tsr__error(ctx->status, "%s: an op failed while building the graph: %s", what, ctx->error);
    if (!outs && n_outs)
        return tsr__error(TSR_E_INVALID, "%s: NULL outputs", what);
    for (size_t i = 0; i < n_outs; i++)
        if (!outs[i])
            return tsr__error(TSR_E_INVALID, "%s: output %zu is NULL", what, i);
    return TSR_OK;
}

tsr_status tsr_compute(tsr_context *ctx, tsr_tensor *const *outs, size_t n_outs) {
    tsr_status s = check_compute_args(ctx, outs, n_outs, "tsr_compute");
    if (s != TSR_OK || n_outs == 0)
        return s;
    if (!tsr__prof_on())
        return tsr__sched_run(ctx->backend->sched, outs, n_outs, 0, NULL);
    /* planning = the whole run less the devices' run_nodes (TSR_PROF_RUN) */
    const int64_t t0 = tsr__prof_now();
    s = tsr__sched_run(ctx->backend->sched, outs, n_outs, 0, NULL);
    tsr__prof_add(TSR_PROF_PLAN, tsr__prof_now() - t0);
    return s;
}

tsr_status tsr_reserve(tsr_context *ctx, tsr_tensor *const *outs, size_t n_outs) {
    tsr_status s = check_compute_args(ctx, outs, n_outs, "tsr_reserve");
    if (s != TSR_OK || n_outs == 0)
        return s;
    return tsr__sched_run(ctx->backend->sched, outs, n_outs, 1, NULL);
}

tsr_status tsr_measure(tsr_context *ctx, tsr_tensor *const *outs, size_t n_outs, size_t *sizes) {
    tsr_status s = check_compute_args(ctx, outs, n_outs, "tsr_measure");
    if (s != TSR_OK)
        return s;
    if (!sizes)
        return tsr__error(TSR_E_INVALID, "tsr_measure: NULL sizes");
    if (n_outs == 0) {
        memset(sizes, 0, ctx->backend->n_devices * sizeof *sizes);
        return TSR_OK;
    }
    return tsr__sched_run(ctx->backend->sched, outs, n_outs, 2, sizes);
}

tsr_device *tsr_tensor_device(const tsr_tensor *t) {
    if (!t || t->device_id < 0 || !t->ctx || (size_t)t->device_id >= t->ctx->backend->n_devices)
        return NULL;
    return t->ctx->backend->devices[t->device_id];
}
