/*
 * backend.h - the interface a backend (cpu/, cuda/, the fake test devices)
 * implements, and the only way the core sees a backend. A backend registers
 * a tsr_backend_reg; the core enumerates its devices once, in registry order
 * (GPU backends first, then the CPU), and from then on talks to them only
 * through the function tables below.
 */
#ifndef TSR_BACKEND_H
#define TSR_BACKEND_H

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
} tsr_device_iface;

struct tsr_device {
    const tsr_device_iface *iface;
    char name[32];
    char description[128];
    tsr_device_kind_t kind;
    int index_in_model;
    size_t registry_index;
    tsr_buffer_type *buft;
    tsr_buffer_type *host_buft; /* NULL for the CPU */
    void *impl;
};

/* A backend implementation: enumerates its devices once. */
typedef struct tsr_backend_reg {
    const char *name; /* "cpu", "cuda", "fake" */
    /* Fills up to max devices; returns the number found. Errors are logged,
     * not fatal: a backend that cannot start contributes no device. */
    size_t (*enumerate)(tsr_device **devs, size_t max);
    /* CPU feature string for the system-info log (may be NULL). */
    const char *(*features)(void);
} tsr_backend_reg;

/* device.c: the registry. */
tsr_device *tsr__cpu_device(void);
const tsr_backend_reg *tsr__cpu_backend_reg(void);   /* cpu/ */
const tsr_backend_reg *tsr__fake_backend_reg(void);  /* cpu/fake.c: TSR_FAKE_DEVICES */
/* Allocates a tensor's bytes inside a buffer: data = base + offset. */
tsr_status tsr__buffer_set(tsr_buffer *buf, void *dst, const void *host, size_t size);
tsr_status tsr__buffer_get(tsr_buffer *buf, const void *src, void *host, size_t size);
/* Copies between any two buffers (through host memory when devices differ). */
tsr_status tsr__buffer_copy(tsr_buffer *dst_buf, void *dst, tsr_buffer *src_buf, const void *src,
                            size_t size);
/* Same, bouncing device-to-device copies through `staging` (host memory of
 * staging_size bytes, in chunks) instead of allocating. */
tsr_status tsr__buffer_copy_staged(tsr_buffer *dst_buf, void *dst, tsr_buffer *src_buf, const void *src, size_t size,
                                   void *staging, size_t staging_size);

#endif /* TSR_BACKEND_H */
