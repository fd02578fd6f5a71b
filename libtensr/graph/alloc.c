/*
 * alloc.c - the graph allocator. Every tensor that needs compute memory (an
 * op result that is not written in place, a tsr_empty leaf) gets an offset
 * in its device's compute buffer; memory is given back once the last node
 * reading the tensor ran, and best-fit reuse keeps the peak small. The plan
 * is deterministic: measure mode and the real allocation give the same
 * offsets, so the sizes measured are the sizes used.
 */
#include "core.h"

#include <limits.h>

typedef struct tsr_block {
    size_t offset, size;
} tsr_block;

typedef struct tsr_heap {
    tsr_block *blocks; /* free blocks, sorted by offset */
    size_t n, cap;
    size_t end, peak;
} tsr_heap;

struct tsr_galloc {
    size_t n_devices;
    int host; /* device of tensors no node uses */
    tsr_heap *heaps;
    /* per allocation id */
    tsr_tensor **roots;
    int *dev, *first, *last, *next_alloc, *next_free;
    bool *donated; /* memory handed to the node that overwrote it in place */
    size_t *size, *offs;
    size_t n, cap;
    /* per node: heads of the id lists to allocate / free at that node */
    int *head_alloc, *head_free;
    size_t cap_nodes;
};

tsr_status tsr__galloc_new(size_t n_devices, int host, tsr_galloc **out) {
    tsr_galloc *ga = tsr__calloc(1, sizeof *ga);
    if (!ga || !(ga->heaps = tsr__calloc(n_devices, sizeof *ga->heaps))) {
        tsr__free(ga);
        return tsr__error(TSR_E_NOMEM, "out of host memory creating the graph allocator");
    }
    ga->n_devices = n_devices;
    ga->host = host;
    *out = ga;
    return TSR_OK;
}

void tsr__galloc_free(tsr_galloc *ga) {
    if (!ga)
        return;
    for (size_t i = 0; i < ga->n_devices; i++) tsr__free(ga->heaps[i].blocks);
    tsr__free(ga->heaps);
    tsr__free(ga->roots);
    tsr__free(ga->dev);
    tsr__free(ga->first);
    tsr__free(ga->last);
    tsr__free(ga->next_alloc);
    tsr__free(ga->next_free);
    tsr__free(ga->donated);
    tsr__free(ga->size);
    tsr__free(ga->offs);
    tsr__free(ga->head_alloc);
    tsr__free(ga->head_free);
    tsr__free(ga);
}

/* The per-id arrays share one capacity: each grows from the same cap to the
 * same need, so tsr__grow gives each the same new capacity. */
#define TSR_GROW_PARALLEL(arr, cap, need, out) \
    (*(out) = (cap), tsr__grow((void **)&(arr), (out), (need), sizeof *(arr)))

static tsr_status reserve_ids(tsr_galloc *ga, size_t n) {
    size_t c = ga->cap;
    if (!TSR_GROW_PARALLEL(ga->roots, ga->cap, n, &c) || !TSR_GROW_PARALLEL(ga->dev, ga->cap, n, &c) ||
        !TSR_GROW_PARALLEL(ga->first, ga->cap, n, &c) || !TSR_GROW_PARALLEL(ga->last, ga->cap, n, &c) ||
        !TSR_GROW_PARALLEL(ga->next_alloc, ga->cap, n, &c) || !TSR_GROW_PARALLEL(ga->next_free, ga->cap, n, &c) ||
        !TSR_GROW_PARALLEL(ga->donated, ga->cap, n, &c) || !TSR_GROW_PARALLEL(ga->size, ga->cap, n, &c) ||
        !TSR_GROW_PARALLEL(ga->offs, ga->cap, n, &c))
        return tsr__error(TSR_E_NOMEM, "out of host memory planning the graph");
    ga->cap = c;
    return TSR_OK;
}

static tsr_status reserve_nodes(tsr_galloc *ga, size_t n) {
    size_t c = ga->cap_nodes;
    if (!TSR_GROW_PARALLEL(ga->head_alloc, ga->cap_nodes, n + 1, &c) ||
        !TSR_GROW_PARALLEL(ga->head_free, ga->cap_nodes, n + 1, &c))
        return tsr__error(TSR_E_NOMEM, "out of host memory planning the graph");
    ga->cap_nodes = c;
    return TSR_OK;
}

/* ---- heap: best fit over free blocks, growing at the end ----------------- */

static size_t heap_alloc(tsr_heap *h, size_t size) {
    size_t best = h->n;
    for (size_t i = 0; i < h->n; i++)
        if (h->blocks[i].size >= size && (best == h->n || h->blocks[i].size < h->blocks[best].size))
            best = i;
    size_t off;
    if (best < h->n) {
        off = h->blocks[best].offset;
        h->blocks[best].offset += size;
        h->blocks[best].size -= size;
        if (h->blocks[best].size == 0) {
            memmove(&h->blocks[best], &h->blocks[best + 1], (h->n - best - 1) * sizeof *h->blocks);
            h->n--;
        }
    } else if (h->n > 0 && h->blocks[h->n - 1].offset + h->blocks[h->n - 1].size == h->end) {
        off = h->blocks[h->n - 1].offset; /* extend the free tail */
        h->end = off + size;
        h->n--;
    } else {
        off = h->end;
        h->end += size;
    }
    if (h->end > h->peak)
        h->peak = h->end;
    return off;
}

static tsr_status heap_free(tsr_heap *h, size_t off, size_t size) {
    size_t i = 0;
    while (i < h->n && h->blocks[i].offset < off) i++;
    bool merge_prev = i > 0 && h->blocks[i - 1].offset + h->blocks[i - 1].size == off;
    bool merge_next = i < h->n && off + size == h->blocks[i].offset;
    if (merge_prev && merge_next) {
        h->blocks[i - 1].size += size + h->blocks[i].size;
        memmove(&h->blocks[i], &h->blocks[i + 1], (h->n - i - 1) * sizeof *h->blocks);
        h->n--;
    } else if (merge_prev) {
        h->blocks[i - 1].size += size;
    } else if (merge_next) {
        h->blocks[i].offset = off;
        h->blocks[i].size += size;
    } else {
        if (!TSR_GROW(h->blocks, h->cap, h->n + 1))
            return tsr__error(TSR_E_NOMEM, "out of host memory planning the graph");
        memmove(&h->blocks[i + 1], &h->blocks[i], (h->n - i) * sizeof *h->blocks);
        h->blocks[i] = (tsr_block){off, size};
        h->n++;
    }
    return TSR_OK;
}

/* ---- planning ------------------------------------------------------------- */

static bool needs_memory(const tsr_tensor *t) {
    if (t->view_src)
        return false;
    if (t->op == TSR_OP_NONE && (t->flags & (TSR_FLAG_INPUT | TSR_FLAG_WEIGHT | TSR_FLAG_PERSIST)))
        return false;
    return tsr_tensor_nbytes(t) > 0;
}

static tsr_status add_root(tsr_galloc *ga, tsr_tensor *t) {
    tsr_status s = reserve_ids(ga, ga->n + 1);
    if (s != TSR_OK)
        return s;
    int id = (int)ga->n++;
    ga->roots[id] = t;
    ga->dev[id] = t->device_id;
    ga->first[id] = INT_MAX;
    ga->last[id] = -1;
    ga->size[id] = tsr__pad(tsr_tensor_nbytes(t), TSR_ALIGN);
    ga->offs[id] = 0;
    t->alloc_id = id;
    return TSR_OK;
}

/* Records that node i uses root-of-t (reads or writes it). */
static void use(tsr_galloc *ga, tsr_tensor *t, int i, int dev) {
    if (!t)
        return;
    tsr_tensor *r = tsr__view_root(t);
    int id = r->alloc_id;
    if (id < 0)
        return;
    if (i < ga->first[id]) {
        ga->first[id] = i;
        if (ga->dev[id] < 0)
            ga->dev[id] = dev; /* a tsr_empty leaf lives where it is first used */
    }
    if (i > ga->last[id])
        ga->last[id] = i;
}

static tsr_status collect(tsr_galloc *ga, const tsr_graph *g, const tsr_galloc_extra *extras, size_t n_extras) {
    ga->n = 0;
    for (size_t i = 0; i < g->n_leafs; i++) g->leafs[i]->alloc_id = -1;
    for (size_t i = 0; i < g->n_views; i++) g->views[i]->alloc_id = -1;
    for (size_t i = 0; i < g->n_nodes; i++) g->nodes[i]->alloc_id = -1;
    tsr_status s = TSR_OK;
    for (size_t i = 0; i < g->n_leafs && s == TSR_OK; i++)
        if (needs_memory(g->leafs[i]))
            s = add_root(ga, g->leafs[i]);
    for (size_t i = 0; i < g->n_nodes && s == TSR_OK; i++)
        if (needs_memory(g->nodes[i]))
            s = add_root(ga, g->nodes[i]);
    for (size_t i = 0; i < n_extras && s == TSR_OK; i++) {
        extras[i].t->alloc_id = -1;
        if (tsr_tensor_nbytes(extras[i].t) > 0 && (s = add_root(ga, extras[i].t)) == TSR_OK)
            ga->dev[extras[i].t->alloc_id] = extras[i].dev;
    }
    return s;
}

/* A source of node i whose memory the node may take over: it dies at i, is
 * its own root with the node's layout on the node's device, and no other
 * source of the node reads the same memory through another view. */
static int find_donor(const tsr_galloc *ga, const tsr_tensor *node, int i, int self) {
    const unsigned donors = tsr__op_info(node->op)->donors; /* the op table's in-place rule */
    for (int j = 0; j < TSR_MAX_SRC; j++) {
        const tsr_tensor *src = node->src[j];
        if (!(donors & (1u << j)) || !src || src->view_src || src->alloc_id < 0 || src->type != node->type ||
            !tsr__same_shape(src, node) || !tsr__is_contiguous(src) || !tsr__is_contiguous(node))
            continue;
        int d = src->alloc_id;
        if ((size_t)d >= ga->n || ga->roots[d] != src || ga->last[d] != i || ga->first[d] >= i || ga->donated[d] ||
            ga->dev[d] != ga->dev[self] || ga->size[d] < ga->size[self])
            continue;
        bool aliased = false;
        for (int k = 0; k < TSR_MAX_SRC; k++)
            if (node->src[k] && node->src[k] != src && tsr__view_root(node->src[k]) == src)
                aliased = true;
        if (!aliased)
            return d;
    }
    return -1;
}

tsr_status tsr__galloc_plan(tsr_galloc *ga, const tsr_graph *g, tsr_tensor *const *outs, size_t n_outs,
                            const tsr_galloc_extra *extras, size_t n_extras, size_t *peak) {
    tsr_status s = collect(ga, g, extras, n_extras);
    if (s != TSR_OK || (s = reserve_nodes(ga, g->n_nodes)) != TSR_OK)
        return s;
    int n_nodes = (int)g->n_nodes;
    for (int i = 0; i < n_nodes; i++) {
        tsr_tensor *node = g->nodes[i];
        use(ga, node, i, node->device_id);
        for (int j = 0; j < TSR_MAX_SRC; j++) use(ga, node->src[j], i, node->device_id);
    }
    /* a copy is written before its split's first node; its source must live until then */
    for (size_t e = 0; e < n_extras; e++) {
        use(ga, extras[e].t, extras[e].first, extras[e].dev);
        use(ga, extras[e].src_root, extras[e].first, extras[e].dev);
    }
    for (size_t o = 0; o < n_outs; o++) {
        int id = tsr__view_root(outs[o])->alloc_id;
        if (id >= 0)
            ga->last[id] = INT_MAX;
    }
    /* buckets: list of ids to allocate / free at each node (index n_nodes = never) */
    for (int i = 0; i <= n_nodes; i++) ga->head_alloc[i] = ga->head_free[i] = -1;
    for (int id = (int)ga->n - 1; id >= 0; id--) {
        int f = ga->first[id] == INT_MAX ? 0 : ga->first[id];
        if (ga->dev[id] < 0)
            ga->dev[id] = ga->host; /* unused leaf: the host device */
        ga->next_alloc[id] = ga->head_alloc[f];
        ga->head_alloc[f] = id;
        int l = ga->last[id] < f ? f : (ga->last[id] == INT_MAX ? n_nodes : ga->last[id]);
        ga->next_free[id] = ga->head_free[l];
        ga->head_free[l] = id;
    }
    for (size_t d = 0; d < ga->n_devices; d++) {
        ga->heaps[d].n = 0;
        ga->heaps[d].end = ga->heaps[d].peak = 0;
    }
    if (ga->n)
        memset(ga->donated, 0, ga->n * sizeof *ga->donated);
    for (int i = 0; i < (n_nodes > 0 ? n_nodes : 1); i++) {
        int self = i < n_nodes ? g->nodes[i]->alloc_id : -1;
        for (int id = ga->head_alloc[i]; id >= 0; id = ga->next_alloc[id]) {
            int donor = id == self ? find_donor(ga, g->nodes[i], i, id) : -1;
            if (donor >= 0) { /* the node overwrites a source that dies here: reuse its memory */
                ga->offs[id] = ga->offs[donor];
                ga->size[id] = ga->size[donor];
                ga->donated[donor] = true;
            } else {
                ga->offs[id] = heap_alloc(&ga->heaps[ga->dev[id]], ga->size[id]);
            }
        }
        for (int id = i < n_nodes ? ga->head_free[i] : -1; id >= 0; id = ga->next_free[id])
            if (!ga->donated[id] && (s = heap_free(&ga->heaps[ga->dev[id]], ga->offs[id], ga->size[id])) != TSR_OK)
                return s;
    }
    for (size_t d = 0; d < ga->n_devices; d++) peak[d] = ga->heaps[d].peak;
    return TSR_OK;
}

size_t tsr__galloc_offset(const tsr_galloc *ga, const tsr_tensor *t) {
    int id = t->alloc_id;
    return id >= 0 && (size_t)id < ga->n ? ga->offs[id] : 0;
}

int tsr__galloc_device(const tsr_galloc *ga, const tsr_tensor *t) {
    int id = t->alloc_id;
    return id >= 0 && (size_t)id < ga->n ? ga->dev[id] : -1;
}
