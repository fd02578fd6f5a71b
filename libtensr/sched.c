/*
 * sched.c - the scheduler: one per backend, made with it and reset by every
 * compute. It builds the graph, assigns each node to a device (weights
 * decide, other nodes follow their inputs, unsupported ops fall back to the
 * CPU), groups consecutive nodes of one device into splits, plans compute
 * memory with the graph allocator, grows each device's compute buffer only
 * when a graph needs more than any before (tsr_reserve sizes it up front),
 * and runs the splits.
 */
#include "core.h"

#include <stdio.h>

typedef struct tsr_split {
    int dev;
    size_t first, n;
} tsr_split;

struct tsr_sched {
    tsr_backend *b;
    tsr_graph graph;
    tsr_galloc *ga;
    tsr_buffer **bufs; /* compute buffer per device */
    size_t *peak;
    tsr_split *splits;
    size_t n_splits, cap_splits;
};

tsr_status tsr__sched_new(tsr_backend *b, tsr_sched **out) {
    tsr_sched *s = tsr__calloc(1, sizeof *s);
    if (!s)
        return tsr__error(TSR_E_NOMEM, "out of host memory creating the scheduler");
    s->b = b;
    s->bufs = tsr__calloc(b->n_devices, sizeof *s->bufs);
    s->peak = tsr__calloc(b->n_devices, sizeof *s->peak);
    tsr_status st = s->bufs && s->peak ? tsr__galloc_new(b->n_devices, &s->ga)
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
    for (size_t i = 0; s->bufs && i < s->b->n_devices; i++)
        tsr_buffer_free(s->bufs[i]);
    tsr__free(s->bufs);
    tsr__free(s->peak);
    tsr__galloc_free(s->ga);
    tsr__graph_free(&s->graph);
    tsr__free(s->splits);
    tsr__free(s);
}

/* Device index of the memory t lives in; -1 for system memory or none yet. */
static int tsr_mem_device(const tsr_backend *b, const tsr_tensor *t) {
    const tsr_tensor *r = tsr__view_root((tsr_tensor *)t);
    if (r->buffer) {
        size_t i = tsr__backend_device_index(b, r->buffer->buft->device);
        return i < b->n_devices ? (int)i : (int)tsr__backend_cpu_index(b);
    }
    return r->op == TSR_OP_NONE ? -1 : r->device_id;
}

static bool tsr_supports(const tsr_backend *b, int dev, const tsr_tensor *node) {
    const tsr_device *d = b->devices[dev];
    return d->iface->supports_op && d->iface->supports_op(d, node);
}

/* Weights decide; in-place writes go where their target lives; other nodes
 * follow their first source with a device; otherwise the CPU. */
static int tsr_pick_device(const tsr_backend *b, const tsr_tensor *node) {
    int cpu = (int)tsr__backend_cpu_index(b);
    for (int j = 0; j < TSR_MAX_SRC; j++) {
        const tsr_tensor *s = node->src[j];
        if (s && (tsr__view_root((tsr_tensor *)s)->flags & TSR_FLAG_WEIGHT)) {
            int d = tsr_mem_device(b, s);
            if (d >= 0)
                return d;
        }
    }
    if (node->view_src) {
        int d = tsr_mem_device(b, node->view_src);
        if (d >= 0)
            return d;
    }
    for (int j = 0; j < TSR_MAX_SRC; j++)
        if (node->src[j]) {
            int d = tsr_mem_device(b, node->src[j]);
            if (d >= 0)
                return d;
        }
    return cpu;
}

static tsr_status tsr_check_leaf(const tsr_backend *b, const tsr_tensor *t) {
    if (t->ctx && t->ctx->backend != b)
        return tsr__error(TSR_E_INVALID, "tensor '%s' belongs to a context of another backend", t->name);
    if ((t->flags & (TSR_FLAG_WEIGHT | TSR_FLAG_PERSIST | TSR_FLAG_INPUT)) && !t->data && tsr_tensor_nbytes(t) > 0)
        return tsr__error(TSR_E_STATE, "tensor '%s' has no memory yet%s", t->name,
                          (t->flags & TSR_FLAG_WEIGHT) ? " (weights are allocated by tsr_backend_place_weights or "
                                                         "tsr_backend_load_gguf)" : "");
    return TSR_OK;
}

static tsr_status tsr_add_split(tsr_sched *s, int dev, size_t first) {
    if (s->n_splits == s->cap_splits) {
        size_t nc = s->cap_splits ? s->cap_splits * 2 : 16;
        tsr_split *p = tsr__realloc(s->splits, nc * sizeof *p);
        if (!p)
            return tsr__error(TSR_E_NOMEM, "out of host memory scheduling the graph");
        s->splits = p;
        s->cap_splits = nc;
    }
    s->splits[s->n_splits++] = (tsr_split){dev, first, 0};
    return TSR_OK;
}

/* Assigns devices and forms splits. Multi-device reads of non-host memory
 * are the business of the copies below. */
static tsr_status tsr_assign(tsr_sched *s) {
    tsr_backend *b = s->b;
    tsr_graph *g = &s->graph;
    tsr_status st;
    for (size_t i = 0; i < g->n_leafs; i++)
        if ((st = tsr_check_leaf(b, g->leafs[i])) != TSR_OK)
            return st;
    s->n_splits = 0;
    for (size_t i = 0; i < g->n_nodes; i++) {
        tsr_tensor *n = g->nodes[i];
        if (n->ctx && n->ctx->backend != b)
            return tsr__error(TSR_E_INVALID, "node '%s' (%s) belongs to a context of another backend", n->name,
                              tsr__op_name(n->op));
        int dev = tsr_pick_device(b, n);
        if (!tsr_supports(b, dev, n)) {
            int cpu = (int)tsr__backend_cpu_index(b);
            if (dev == cpu || !tsr_supports(b, cpu, n))
                return tsr__error(TSR_E_UNSUPPORTED, "no device of the backend runs %s of node '%s' with these types",
                                  tsr__op_name(n->op), n->name);
            dev = cpu;
        }
        n->device_id = dev;
        if (s->n_splits == 0 || s->splits[s->n_splits - 1].dev != dev)
            if ((st = tsr_add_split(s, dev, i)) != TSR_OK)
                return st;
        s->splits[s->n_splits - 1].n++;
    }
    return TSR_OK;
}

/* Every source a node reads must be in memory its device can address. */
static tsr_status tsr_check_access(tsr_sched *s) {
    tsr_backend *b = s->b;
    const tsr_graph *g = &s->graph;
    for (size_t i = 0; i < g->n_nodes; i++) {
        const tsr_tensor *n = g->nodes[i];
        const tsr_device *d = b->devices[n->device_id];
        for (int j = 0; j < TSR_MAX_SRC; j++) {
            if (!n->src[j])
                continue;
            int md = tsr_mem_device(b, n->src[j]);
            bool ok = md == n->device_id || (md < 0 && d->kind == TSR_DEVICE_CPU) ||
                      (md >= 0 && d->kind == TSR_DEVICE_CPU && b->devices[md]->buft->is_host &&
                       b->devices[md]->kind == TSR_DEVICE_CPU);
            if (!ok)
                return tsr__error(TSR_E_UNSUPPORTED,
                                  "node '%s' (%s) on %s reads '%s' held by %s: cross-device copies are not "
                                  "supported by this scheduler yet",
                                  n->name, tsr__op_name(n->op), d->name, n->src[j]->name,
                                  md < 0 ? "system memory" : b->devices[md]->name);
        }
    }
    return TSR_OK;
}

/* Makes each device's compute buffer at least as large as the plan. */
static tsr_status tsr_ensure_buffers(tsr_sched *s) {
    tsr_backend *b = s->b;
    for (size_t d = 0; d < b->n_devices; d++) {
        if (s->peak[d] == 0 || (s->bufs[d] && s->bufs[d]->size >= s->peak[d]))
            continue;
        char mib[32];
        tsr__log(TSR_LOG_DEBUG, "compute buffer", 2, "device", b->devices[d]->name, "mib",
                 tsr__fmt(mib, sizeof mib, "%.2f", s->peak[d] / 1048576.0));
        tsr_buffer_free(s->bufs[d]);
        s->bufs[d] = NULL;
        b->plan_compute[d] = 0;
        tsr_status st = tsr_buffer_alloc(b->devices[d]->buft, s->peak[d], &s->bufs[d]);
        if (st != TSR_OK) {
            tsr__error_prefix("compute buffer of %.2f MiB on %s", s->peak[d] / 1048576.0, b->devices[d]->name);
            return st;
        }
        b->plan_compute[d] = s->peak[d];
    }
    return TSR_OK;
}

static void tsr_resolve_view(tsr_tensor *t) {
    if (!t->view_src)
        return;
    tsr_resolve_view(t->view_src);
    t->data = t->view_src->data ? (char *)t->view_src->data + t->view_offs : NULL;
    t->device_id = t->view_src->device_id;
}

/* Gives every planned tensor its address, then resolves views. */
static void tsr_bind(tsr_sched *s) {
    tsr_graph *g = &s->graph;
    tsr_tensor **lists[2] = {g->leafs, g->nodes};
    size_t counts[2] = {g->n_leafs, g->n_nodes};
    for (int l = 0; l < 2; l++)
        for (size_t i = 0; i < counts[l]; i++) {
            tsr_tensor *t = lists[l][i];
            int dev = tsr__galloc_device(s->ga, t);
            if (dev < 0) {
                if (!t->view_src && t->op != TSR_OP_NONE)
                    t->data = NULL; /* zero-sized result */
                continue;
            }
            t->buffer = s->bufs[dev];
            t->data = (char *)s->bufs[dev]->base + tsr__galloc_offset(s->ga, t);
            if (t->op == TSR_OP_NONE)
                t->device_id = dev;
        }
    for (size_t i = 0; i < g->n_nodes; i++)
        tsr_resolve_view(g->nodes[i]);
    for (size_t i = 0; i < g->n_views; i++)
        tsr_resolve_view(g->views[i]);
}

static tsr_status tsr_run_splits(tsr_sched *s) {
    tsr_backend *b = s->b;
    for (size_t i = 0; i < s->n_splits; i++) {
        tsr_split *sp = &s->splits[i];
        tsr_stream *st = b->streams[sp->dev];
        tsr_status r = b->devices[sp->dev]->iface->compute(st, s->graph.nodes + sp->first, sp->n);
        if (r == TSR_OK && b->devices[sp->dev]->iface->synchronize)
            r = b->devices[sp->dev]->iface->synchronize(st);
        if (r != TSR_OK) {
            tsr__error_prefix("compute on %s", b->devices[sp->dev]->name);
            return r;
        }
    }
    return TSR_OK;
}

static tsr_status tsr_reserve_streams(tsr_sched *s) {
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

tsr_status tsr__sched_run(tsr_sched *s, tsr_tensor *const *outs, size_t n_outs, int mode, size_t *sizes) {
    tsr_backend *b = s->b;
    b->visit_mark++;
    if (b->visit_mark == 0)
        b->visit_mark = 1;
    tsr_status st = tsr__graph_build(&s->graph, outs, n_outs, b->visit_mark);
    if (st == TSR_OK)
        st = tsr_assign(s);
    if (st == TSR_OK)
        st = tsr_check_access(s);
    if (st == TSR_OK)
        st = tsr__galloc_plan(s->ga, &s->graph, outs, n_outs, s->peak);
    if (st != TSR_OK)
        return st;
    b->n_splits = s->n_splits;
    b->n_copies = 0;
    if (mode == 2) {
        memcpy(sizes, s->peak, b->n_devices * sizeof *sizes);
        return TSR_OK;
    }
    b->generation++; /* earlier results are gone from here on */
    if ((st = tsr_ensure_buffers(s)) != TSR_OK)
        return st;
    tsr_bind(s);
    if (mode == 1)
        return tsr_reserve_streams(s);
    if ((st = tsr_run_splits(s)) != TSR_OK)
        return st;
    for (size_t i = 0; i < s->graph.n_nodes; i++)
        s->graph.nodes[i]->generation = b->generation;
    for (size_t i = 0; i < s->graph.n_views; i++)
        s->graph.views[i]->generation = b->generation;
    for (size_t i = 0; i < s->graph.n_leafs; i++)
        if (!tsr__has_static_data(s->graph.leafs[i]))
            s->graph.leafs[i]->generation = b->generation;
    return TSR_OK;
}

/* ---- public entry points --------------------------------------------------- */

static tsr_status tsr_check_compute_args(tsr_context *ctx, tsr_tensor *const *outs, size_t n_outs, const char *what) {
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
    tsr_status s = tsr_check_compute_args(ctx, outs, n_outs, "tsr_compute");
    if (s != TSR_OK || n_outs == 0)
        return s;
    return tsr__sched_run(ctx->backend->sched, outs, n_outs, 0, NULL);
}

tsr_status tsr_reserve(tsr_context *ctx, tsr_tensor *const *outs, size_t n_outs) {
    tsr_status s = tsr_check_compute_args(ctx, outs, n_outs, "tsr_reserve");
    if (s != TSR_OK || n_outs == 0)
        return s;
    return tsr__sched_run(ctx->backend->sched, outs, n_outs, 1, NULL);
}

tsr_status tsr_measure(tsr_context *ctx, tsr_tensor *const *outs, size_t n_outs, size_t *sizes) {
    tsr_status s = tsr_check_compute_args(ctx, outs, n_outs, "tsr_measure");
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
