/*
 * core.h - private structures of the core: backend, context, graph, graph
 * allocator and scheduler. Shared by the libtensr/ sources only (backends see
 * device.h, never this file).
 */
#ifndef TSR_CORE_H
#define TSR_CORE_H

#include "device.h"

#include <regex.h>

/* ---- graph (graph.c) ------------------------------------------------------ */
typedef struct tsr_graph {
    tsr_tensor **nodes; /* ops other than NONE/VIEW, in execution order */
    size_t n_nodes;
    tsr_tensor **leafs; /* op NONE tensors the nodes read */
    size_t n_leafs;
    tsr_tensor **views; /* VIEW tensors reached (their data is set after allocation) */
    size_t n_views;
    size_t cap_nodes, cap_leafs, cap_views;
    void *stack; /* traversal stack */
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

/* host: the device index that holds tensors no node uses (unused leafs). */
tsr_status tsr__galloc_new(size_t n_devices, int host, tsr_galloc **out);
void tsr__galloc_free(tsr_galloc *ga);
/* A tensor the scheduler adds to a plan: a copy, on device `dev`, of the
 * storage of `src_root` (another device's memory). It is allocated at node
 * `first` (the start of the split that needs it; src_root is kept alive
 * until then) and lives until its last reader (nodes read it through views
 * the scheduler swaps in while planning and running). */
typedef struct tsr_galloc_extra {
    tsr_tensor *t;
    tsr_tensor *src_root;
    int dev;
    int first;
} tsr_galloc_extra;

/* Plans the graph: for each tensor t needing memory, t->alloc_id gets
 * its allocation id; returns the peak bytes per device in peak[]. A node's
 * memory is on node->device_id; a tsr_empty leaf on its device_id (set by the
 * scheduler), else where it is first used. */
tsr_status tsr__galloc_plan(tsr_galloc *ga, const tsr_graph *g, tsr_tensor *const *outs, size_t n_outs,
                            const tsr_galloc_extra *extras, size_t n_extras, size_t *peak);
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
/* A per-device copy of a shared weight (rope_freqs and the like: not in a
 * layer, read by every layer), so no layer reads across devices. */
typedef struct tsr_weight_copy {
    tsr_tensor *primary, *copy;
    int dev; /* backend device index of the copy */
} tsr_weight_copy;

typedef struct tsr_weight_set {
    tsr_tensor **tensors; /* weights (ctx NULL, FLAG_WEIGHT), in declaration order */
    size_t n, cap;
    tsr_weight_copy *copies; /* copies of shared weights (tensors owned here) */
    size_t n_copies, cap_copies;
    uint64_t synced_epoch; /* tsr__weights_epoch() when the copies were last refreshed */
    tsr_buffer **buffers;  /* one per device at most (plus mmap/copies), freed with the backend */
    size_t n_buffers, cap_buffers;
} tsr_weight_set;

struct tsr_backend {
    tsr_device **devices; /* devices in use; the host device (CPU) is always present */
    size_t n_devices;
    size_t host;          /* index of the host device in devices[] */
    tsr_stream **streams; /* one per device */
    int n_threads;
    int flash_attn;     /* resolved: 0 or 1 */
    int flash_attn_req; /* as asked: tsr_flash_attn_mode */
    size_t attn_max_batch;
    tsr_sched *sched;
    tsr_weight_set weights;
    int n_layers;                 /* repeating layers found in weight names */
    tsr_buffer_type **layer_buft; /* per layer, after placement */
    uint64_t generation;          /* incremented by every compute/reserve */
    uint32_t visit_mark;          /* graph traversal marks */
    size_t n_splits, n_copies;    /* of the last compute */
    /* Memory plan per device, in bytes (tsr_backend_memory_plan):
     *  plan_weights: weights placed there (allocated, or planned by a plan_only placement);
     *  plan_kv: KV cache (the KV cache adds its bytes when it plans/allocates, subtracts on free);
     *  plan_compute: compute buffer (its allocated size, or the largest tsr_measure result).
     * live: bytes this backend has allocated there (weights + KV + compute); a
     * plan fits when plan_weights + plan_kv + plan_compute <= free + live
     * (tsr__plan_check). Whoever allocates for the backend keeps live up to date. */
    size_t *plan_weights, *plan_kv, *plan_compute;
    /* plan_stream: what the devices' streams hold beside buffers for the
     * largest graph reserved or measured (library workspace, per-stream
     * scratch: the device iface's stream_bytes; for the host, the pinned
     * copy staging). Counted by tsr_fit; not part of tsr__plan_check. */
    size_t *plan_stream;
    size_t *live, *live_weights;
    /* A planning backend (tsr_fit's dry runs, tsr__backend_set_plan_mode):
     * loads plan weights without reading or allocating them and keep them
     * declared, KV caches plan without allocating, tsr_reserve measures,
     * and tsr__plan_check passes: the whole plan is read afterwards. */
    bool plan_mode;
    /* the file of the dry runs, parsed once by tsr_fit (not owned): the
     * loader and the model layer use it instead of parsing the file again */
    tsr_gguf *plan_gguf;
    size_t n_open_contexts;
    bool told_no_gpu; /* n_gpu_layers > 0 without a GPU device was logged */
    size_t n_open_caches;
    /* tsr_backend_free was called while contexts or caches were open: the
     * last of them to close frees the backend (tsr__backend_release). */
    bool freed;
};

/* Called by a context or KV cache of b after it stopped counting itself:
 * frees b when tsr_backend_free already asked for it and nothing is open. */
void tsr__backend_release(tsr_backend *b);

size_t tsr__backend_device_index(const tsr_backend *b, const tsr_device *d); /* n_devices when absent */
size_t tsr__backend_host_index(const tsr_backend *b);

/* ---- context -------------------------------------------------------------- */
typedef struct tsr_tensor_chunk tsr_tensor_chunk;

typedef struct tsr_owned {
    void *ptr;
    int kind; /* 0 = aligned host memory, 1 = tsr_buffer */
} tsr_owned;

struct tsr_context {
    tsr_backend *backend;
    tsr_tensor_chunk *chunks; /* arena of tensor structs */
    size_t chunk_used;
    tsr_owned *owned;
    size_t n_owned, cap_owned;
    tsr_status status;
    char error[512];
    uint64_t id;      /* unique in the process (tsr_kv_cache_begin_again) */
    uint64_t version; /* unique in the process, new with each tensor made here (sched.c) */
};

/* ---- tensor data access (tensor.c) ---------------------------------------- */
/* True when t's data may be read now (leaf with memory or an output/result
 * of the latest compute of its backend). */
bool tsr__tensor_has_data(const tsr_tensor *t);
/* Buffer holding t's memory (follows views); NULL for system-memory inputs. */
tsr_buffer *tsr__tensor_buffer(const tsr_tensor *t);

/* ---- placement (place.c) ------------------------------------------------- */
/* Places every declared weight without memory: layers to devices
 * (n_gpu_layers, tensor_split, main_gpu), input layer on the CPU, output
 * layer with the last layer when all are offloaded, shared weights copied to
 * every device holding layers, then the override list (first match wins).
 * Plans the bytes per buffer type, records the plan (plan_weights), logs it,
 * checks every device (tsr__plan_check) and only then allocates one buffer
 * per buffer type; on any failure nothing stays allocated. With
 * p->plan_only it stops after the check (weights get their planned device in
 * device_id, so tsr_measure can size compute buffers) and allocates nothing.
 * The GGUF loader declares the weights, calls this, then writes each
 * weight's data (t->buffer/t->data) and calls tsr__weights_touch(). */
tsr_status tsr__place_weights(tsr_backend *b, const tsr_load_params *p);
/* Layer placement alone (also with no weights: the KV cache of a model
 * without declared weights): b->n_layers becomes max(b->n_layers, n_layers)
 * and b->layer_buft is (re)computed from p (NULL = defaults). */
tsr_status tsr__place_layers(tsr_backend *b, int n_layers, const tsr_load_params *p);
/* Checks plan_weights + plan_kv + plan_compute <= free + live on every
 * device; TSR_E_DEVICE_NOMEM naming the device and the bytes missing. */
tsr_status tsr__plan_check(const tsr_backend *b);
/* Reads the caller's load params over defaults. */
void tsr__load_params_read(const tsr_load_params *in, tsr_load_params *out);
/* gguf/load.c: tsr_backend_load_gguf of a file already parsed (the model
 * layer's; its declaration there is in model/bridge.h). */
tsr_status tsr__backend_load_parsed(tsr_backend *b, const tsr_gguf *g, const tsr_load_params *p);
void tsr__weights_free(tsr_backend *b);
/* Weight data changed (tsr_tensor_write on a weight, the loader): per-device
 * copies of shared weights are refreshed before the next reserve/compute. */
void tsr__weights_touch(void);
uint64_t tsr__weights_epoch(void);
/* The copy of weight w on backend device dev (w itself when w lives there);
 * NULL when w has no copy there. */
tsr_tensor *tsr__weight_copy_on(const tsr_backend *b, const tsr_tensor *w, int dev);
/* True when w is a shared weight with per-device copies. */
bool tsr__weight_is_shared(const tsr_backend *b, const tsr_tensor *w);

/* ---- override lists (override.c) ------------------------------------------ */
typedef struct tsr_override_set {
    regex_t *re;
    tsr_buffer_type **buft;
    const char **pattern;
    size_t *n_matched;
    size_t n;
} tsr_override_set;

/* Compiles a NULL-terminated override list (NULL = empty). */
tsr_status tsr__overrides_compile(const tsr_buft_override *list, tsr_override_set *out);
/* Buffer type of the first pattern matching name (NULL when none); counts matches. */
tsr_buffer_type *tsr__overrides_match(tsr_override_set *set, const char *name);
/* Warns about every pattern that matched nothing. */
void tsr__overrides_warn_unmatched(const tsr_override_set *set);
void tsr__overrides_release(tsr_override_set *set);

/* ---- dry runs of the planner (runtime/backend.c, runtime/sysmem.c; tsr_fit) ---- */
/* A planning backend: loads with plan_only keep the planned weights declared
 * without memory, KV caches plan without allocating, tsr_reserve measures,
 * plan checks pass (the caller compares the plan itself). */
void tsr__backend_set_plan_mode(tsr_backend *b, bool on);
/* The parsed file the dry runs of a planning backend use (NULL: none; not owned). */
void tsr__backend_set_plan_gguf(tsr_backend *b, tsr_gguf *g);
tsr_gguf *tsr__backend_plan_gguf(const tsr_backend *b);
/* Forgets a dry run's weights and zeroes the plan. */
void tsr__backend_plan_reset(tsr_backend *b);
/* Bytes device i's stream holds beside buffers for the largest graph planned. */
size_t tsr__backend_plan_stream(const tsr_backend *b, size_t i);
/* System memory the process may still take: MemAvailable capped by the
 * cgroup (v1/v2) limit less usage; hooks TSR_FIT_SYSMEM, TSR_FIT_PROC_ROOT. */
size_t tsr__system_memory_available(void);
/* "64MiB", "2G", "123" -> bytes; false when malformed. */
bool tsr__parse_size(const char *s, size_t *out);

#endif /* TSR_CORE_H */
