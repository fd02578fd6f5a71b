/*
 * device.h - the interface a backend (cpu/, cuda/, the fake test devices)
 * implements, and the only way the core sees a backend. A backend registers
 * a tsr_device_reg; the core enumerates its devices once, in registry order
 * (GPU backends first, then the CPU), and from then on talks to them only
 * through the function tables below.
 */
#ifndef TSR_DEVICE_H
#define TSR_DEVICE_H

#include "internal.h"

typedef struct tsr_stream tsr_stream;

/* Buffer type operations. Addresses are in the buffer type's address space
 * (device pointers for a GPU); `host` pointers are plain system memory. */
typedef struct tsr_buft_iface {
    /* Allocate size bytes (size may be 0: return a valid, distinct base).
     * On failure return TSR_E_DEVICE_NOMEM/TSR_E_NOMEM with the detail set
     * (device, size asked, free memory). */
    tsr_status (*alloc)(tsr_buffer_type *bt, size_t size, void **base, void **handle);
    void (*free)(tsr_buffer_type *bt, void *base, void *handle);
    tsr_status (*set)(tsr_buffer *buf, void *dst, const void *host, size_t size);
    tsr_status (*get)(tsr_buffer *buf, const void *src, void *host, size_t size);
    tsr_status (*memset)(tsr_buffer *buf, void *dst, int value, size_t size);
    /* Copy within the buffer type's device (both buffers of this type). */
    tsr_status (*copy)(tsr_buffer *dst_buf, void *dst, tsr_buffer *src_buf, const void *src, size_t size);
    /* May be NULL: the buffer type keeps every tensor as stored (as the
     * file lays it out). A buffer type may keep a tensor's bytes in a layout
     * of its own (TSR_FLAG_OWN_LAYOUT; the CPU's interleaved matmul
     * weights, cpu/repack.c), which it takes on its own; before the core
     * reads or writes a tensor's bytes or copies them to another device
     * (tsr__tensor_to_stored), it asks for them in the stored layout, to
     * stay so (TSR_FLAG_KEEP_STORED). t is the root of its views, in buf. */
    tsr_status (*to_stored)(tsr_buffer *buf, tsr_tensor *t);
    /* May be NULL (then set): set, for a caller that leaves host's bytes
     * as they are until it synchronizes the device's stream (the
     * scheduler's copies into a split, which ends with synchronize), so
     * the copy may still read them after the call returns. */
    tsr_status (*set_async)(tsr_buffer *buf, void *dst, const void *host, size_t size);
} tsr_buft_iface;

struct tsr_buffer_type {
    const tsr_buft_iface *iface;
    char name[32];
    tsr_device *device;
    size_t alignment;
    bool is_host;        /* memory directly addressable by the CPU */
    bool is_pinned_host; /* staging memory of a GPU */
    void *impl;
};

struct tsr_buffer {
    tsr_buffer_type *buft;
    void *base;
    size_t size;
    void *handle;
};

/* Device operations. */
typedef struct tsr_device_iface {
    tsr_status (*memory)(const tsr_device *d, size_t *free, size_t *total);
    /* Whether the device can run node `op` with its source types. */
    bool (*supports_op)(const tsr_device *d, const tsr_tensor *op);
    /* An execution stream (CPU: threadpool; CUDA: stream + cuBLAS handle). */
    tsr_status (*stream_new)(tsr_device *d, int n_threads, tsr_stream **out);
    void (*stream_free)(tsr_stream *s);
    /* Size any per-stream scratch (work buffers) for these nodes, so that a
     * later compute of no larger nodes allocates nothing. */
    tsr_status (*reserve)(tsr_stream *s, tsr_tensor *const *nodes, size_t n_nodes);
    /* Runs nodes in order. Every node's data and its sources' data are
     * addresses this device can read (the scheduler copied what was needed). */
    tsr_status (*compute)(tsr_stream *s, tsr_tensor *const *nodes, size_t n_nodes);
    tsr_status (*synchronize)(tsr_stream *s);
    /* Bytes a stream of this device holds outside buffers once reserved for
     * these nodes: library workspaces (cuBLAS) and per-stream scratch, none
     * of which the buffers show. The planner (tsr_fit) adds them to the
     * device's plan. NULL = none. Reads shapes and types only: the nodes
     * may have no memory (a dry run). */
    size_t (*stream_bytes)(const tsr_device *d, tsr_tensor *const *nodes, size_t n_nodes);
} tsr_device_iface;

struct tsr_device {
    const tsr_device_iface *iface;
    char name[32];
    char description[128];
    tsr_device_class kind;
    int index_in_model;
    size_t registry_index;
    tsr_buffer_type *buft;
    tsr_buffer_type *host_buft; /* NULL for the CPU */
    void *impl;
};

/* A backend implementation: enumerates its devices once. */
typedef struct tsr_device_reg {
    const char *name; /* "cpu", "cuda", "fake" */
    /* Fills up to max devices; returns the number found. Errors are logged,
     * not fatal: a backend that cannot start contributes no device. */
    size_t (*enumerate)(tsr_device **devs, size_t max);
    /* CPU feature string for the system-info log (may be NULL). */
    const char *(*features)(void);
} tsr_device_reg;

/* ---- run-time backend modules ------------------------------------------------
 * A module is a shared object in the module folder ($(pkglibdir)/modules, or
 * the directories and files listed in TSR_BACKEND_PATH, separated by ':')
 * named libtensr-*.so. It exports one function, TSR_MODULE_ENTRY, which gets
 * the core's services and returns its registration. The core loads a module
 * only when the registration's abi_version, op count and struct sizes are
 * the core's own, logs every module it loaded or skipped and why, and never
 * fails because of one.
 *
 * Bump TSR_MODULE_ABI_VERSION whenever a struct or function table shared
 * with modules (this file, the tensor struct and op table of internal.h,
 * the services below) changes in a way the sizes do not show. */
#define TSR_MODULE_ABI_VERSION 1
#define TSR_MODULE_ENTRY tsr_backend_module_init
#define TSR_MODULE_ENTRY_NAME "tsr_backend_module_init"
#if defined(__GNUC__)
#define TSR_MODULE_EXPORT __attribute__((visibility("default")))
#else
#define TSR_MODULE_EXPORT
#endif

/* What the core lends a module: the library's error detail, logging, the
 * allocation wrappers (so the failure-injection counter sees a module's
 * allocations too), type traits, op names, tensor helpers and the host
 * device (whose function tables a module may use to run nodes on the CPU). */
typedef struct tsr_module_services {
    size_t size; /* sizeof(tsr_module_services) of the core */
    uint32_t abi_version;
    tsr_status (*verror)(tsr_status s, const char *fmt, va_list ap);
    bool (*log_enabled)(tsr_log_level level);
    /* fields: n_fields (key, value) pairs as 2 * n_fields strings */
    void (*log)(tsr_log_level level, const char *msg, size_t n_fields, const char *const *fields);
    void *(*malloc)(size_t size);
    void *(*calloc)(size_t n, size_t size);
    void *(*realloc)(void *p, size_t size);
    void (*free)(void *p);
    void *(*aligned_alloc)(size_t alignment, size_t size);
    void (*aligned_free)(void *p);
    const tsr_type_traits *(*type_traits)(tsr_type type);
    const tsr_op_info *(*op_info)(tsr_op op);
    size_t (*tensor_nbytes)(const tsr_tensor *t);
    tsr_device *(*host_device)(void);
    /* Graphs planned by every scheduler so far: nodes a device saw at the
     * same count, in the same array, are the same nodes at the same
     * addresses (only a plan binds a tensor elsewhere), so what the device
     * derived from them still holds (cpu/job.c's plan_of, the CUDA graphs). */
    uint64_t (*plan_count)(void);
} tsr_module_services;

/* What a module hands back. The sizes are the module's own sizeof of the
 * shared structs, so a module built against other headers is refused. */
typedef struct tsr_device_module {
    uint32_t abi_version; /* TSR_MODULE_ABI_VERSION the module was built with */
    uint32_t op_count;    /* TSR_OP_COUNT the module was built with */
    size_t sizeof_services, sizeof_tensor, sizeof_device, sizeof_device_iface, sizeof_buffer_type, sizeof_buft_iface,
        sizeof_buffer, sizeof_reg;
    const tsr_device_reg *reg;
} tsr_device_module;

/* Initializer of a module's registration (sizes filled from these headers). */
#define TSR_DEVICE_MODULE_INIT(reg_ptr)                                                                            \
    {                                                                                                              \
        TSR_MODULE_ABI_VERSION, TSR_OP_COUNT, sizeof(tsr_module_services), sizeof(tsr_tensor), sizeof(tsr_device), \
            sizeof(tsr_device_iface), sizeof(tsr_buffer_type), sizeof(tsr_buft_iface), sizeof(tsr_buffer),         \
            sizeof(tsr_device_reg), (reg_ptr)                                                                      \
    }

/* The entry point: returns NULL when the module cannot work at all (after
 * logging why through the services). */
typedef const tsr_device_module *(*tsr_module_init_fn)(const tsr_module_services *svc);

/* device.c: the registry. The host device (the CPU) runs what no other
 * device can and holds system-memory tensors. */
tsr_device *tsr__host_device(void);
/* The same without enumerating: what backends call while the registry
 * enumerates them (the host is enumerated first); NULL before that. */
tsr_device *tsr__host_device_early(void);
const tsr_device_reg *tsr__cpu_device_reg(void); /* cpu/ */
/* cpu/cpu.c: the cores this process may use (online CPUs within its
 * affinity mask), and the threads a request of n_threads gets: 0 = the
 * cores; more than the cores = the cores, with a warning in the log. */
int tsr__cpu_cores(void);
int tsr__cpu_threads(int n_threads);
/* Makes a CPU stream batch invariant (tsr_backend_params.batch_invariant):
 * it marks the nodes it plans TSR_FLAG_BATCHINV, and the matmuls and the
 * fused attention then compute each column or query row the same way
 * whatever the batch (cpu/matmul.c, cpu/attn.c). */
void tsr__cpu_stream_set_invariant(tsr_stream *s);
const tsr_device_reg *tsr__fake_device_reg(void); /* cpu/fake.c: TSR_FAKE_DEVICES */
/* module.c: loads the modules of TSR_BACKEND_PATH (or the module folder)
 * and adds their registrations through add() (which returns the number of
 * devices it found); logs each one; returns the number of modules kept. */
size_t tsr__modules_load(size_t (*add)(const tsr_device_reg *reg));
/* The services the core lends modules (also used by the built-in fake backend). */
const tsr_module_services *tsr__module_services(void);
/* Allocates a tensor's bytes inside a buffer: data = base + offset. */
tsr_status tsr__buffer_set(tsr_buffer *buf, void *dst, const void *host, size_t size);
tsr_status tsr__buffer_get(tsr_buffer *buf, const void *src, void *host, size_t size);
/* Copies between any two buffers (through host memory when devices differ). */
tsr_status tsr__buffer_copy(tsr_buffer *dst_buf, void *dst, tsr_buffer *src_buf, const void *src, size_t size);
/* Same, bouncing device-to-device copies through `staging` (host memory of
 * staging_size bytes, in chunks) instead of allocating. */
/* t's memory (its view root's) in the stored layout (the buffer type's
 * to_stored; nothing to do for most): before its bytes are read, written
 * or copied to another device. */
tsr_status tsr__tensor_to_stored(tsr_tensor *t);
tsr_status tsr__buffer_copy_staged(tsr_buffer *dst_buf, void *dst, tsr_buffer *src_buf, const void *src, size_t size,
                                   void *staging, size_t staging_size);

#endif /* TSR_DEVICE_H */
