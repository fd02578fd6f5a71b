/*
 * core.h - private structures of the core: backend, context, graph, graph
 * allocator and scheduler. Shared by the libtensr/ sources only (backends see
 * backend.h, never this file).
 */
#ifndef TSR_CORE_H
#define TSR_CORE_H

#include "backend.h"

#include <regex.h>

/* ---- graph (graph.c) ------------------------------------------------------ */
typedef struct tsr_graph {
    tsr_tensor **nodes;   /* ops other than NONE/VIEW, in execution order */
    size_t n_nodes;
    tsr_tensor **leafs;   /* op NONE tensors the nodes read */
    size_t n_leafs;
    tsr_tensor **views;   /* VIEW tensors reached (their data is set after allocation) */
    size_t n_views;
    size_t cap_nodes, cap_leafs, cap_views;
    void *stack;          /* traversal stack */
    size_t cap_stack;
} tsr_graph;

/* Builds the graph that produces outs (topological order, each tensor once).
 * The graph arrays are reused across calls (no allocation once large enough). */
tsr_status tsr__graph_build(tsr_graph *g, tsr_tensor *const *outs, size_t n_outs, uint32_t visit_mark);
void tsr__graph_free(tsr_graph *g);

/* ---- graph allocator (alloc.c) ------------------------------------------- */
/* Plans offsets of every tensor that needs compute memory on each device
 * (nodes that are not in place, tsr_empty leafs, cross-device copies) so
 * memory is reused once a tensor's last reader ran. */
typedef struct tsr_galloc tsr_galloc;

tsr_status tsr__galloc_new(size_t n_devices, tsr_galloc **out);
void tsr__galloc_free(tsr_galloc *ga);
/* Plans the graph: for each tensor t needing memory, t->sched_scratch[1] gets
 * its offset-slot; returns the peak bytes per device in peak[]. `dev_of`
 * gives the device index that holds t (node->device_id). */
tsr_status tsr__galloc_plan(tsr_galloc *ga, const tsr_graph *g, tsr_tensor *const *outs, size_t n_outs,
                            size_t *peak);
/* After a plan: offset of t inside its device's compute buffer. */
size_t tsr__galloc_offset(const tsr_galloc *ga, const tsr_tensor *t);
/* Device index the plan put t on (-1 when t got no compute memory). */
int tsr__galloc_device(const tsr_galloc *ga, const tsr_tensor *t);

/* ---- scheduler (sched.c) -------------------------------------------------- */
typedef struct tsr_sched tsr_sched;

tsr_status tsr__sched_new(tsr_backend *b, tsr_sched **out);
void tsr__sched_free(tsr_sched *s);
/* mode: 0 = compute, 1 = reserve (allocate, run nothing), 2 = measure (sizes only). */
tsr_status tsr__sched_run(tsr_sched *s, tsr_tensor *const *outs, size_t n_outs, int mode, size_t *sizes);

/* ---- backend -------------------------------------------------------------- */
typedef struct tsr_weight_set {
    tsr_tensor **tensors;      /* weights (ctx NULL, FLAG_WEIGHT), in declaration order */
    size_t n, cap;
    tsr_buffer **buffers;      /* one per device at most (plus mmap/copies), freed with the backend */
    size_t n_buffers, cap_buffers;
} tsr_weight_set;

struct tsr_backend {
    tsr_device **devices;      /* devices in use; the CPU is always present and last */
    size_t n_devices;
    tsr_stream **streams;      /* one per device */
    int n_threads;
    int flash_attn;            /* resolved: 0 or 1 */
    int flash_attn_req;        /* as asked: tsr_flash_attn_t */
    size_t attn_max_batch;
    tsr_sched *sched;
    tsr_weight_set weights;
    int n_layers;              /* repeating layers found in weight names */
    tsr_buffer_type **layer_buft; /* per layer, after placement */
    uint64_t generation;       /* incremented by every compute/reserve */
    uint32_t visit_mark;       /* graph traversal marks */
    size_t n_splits, n_copies; /* of the last compute */
    size_t *plan_weights, *plan_kv, *plan_compute; /* per device, bytes */
    size_t n_open_contexts;
    size_t n_open_caches;
};

size_t tsr__backend_device_index(const tsr_backend *b, const tsr_device *d); /* n_devices when absent */
size_t tsr__backend_cpu_index(const tsr_backend *b);

/* ---- context -------------------------------------------------------------- */
typedef struct tsr_tensor_chunk tsr_tensor_chunk;

typedef struct tsr_owned {
    void *ptr;
    int kind; /* 0 = aligned host memory, 1 = tsr_buffer */
} tsr_owned;

struct tsr_context {
    tsr_backend *backend;
    tsr_tensor_chunk *chunks;  /* arena of tensor structs */
    size_t chunk_used;
    tsr_owned *owned;
    size_t n_owned, cap_owned;
    tsr_status status;
    char error[512];
};

/* ---- tensor data access (tensor.c) ---------------------------------------- */
/* True when t's data may be read now (leaf with memory or an output/result
 * of the latest compute of its backend). */
bool tsr__tensor_has_data(const tsr_tensor *t);
/* Buffer holding t's memory (follows views); NULL for system-memory inputs. */
tsr_buffer *tsr__tensor_buffer(const tsr_tensor *t);

/* ---- placement (place.c) ------------------------------------------------- */
tsr_status tsr__place_weights(tsr_backend *b, const tsr_load_params *p);
/* Reads the caller's load params over defaults. */
void tsr__load_params_read(const tsr_load_params *in, tsr_load_params *out);
void tsr__weights_free(tsr_backend *b);

#endif /* TSR_CORE_H */
