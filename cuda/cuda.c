/*
 * backend.c - the CUDA backend module (cuda/libtensr-cuda.so): devices,
 * buffer types, streams, cuBLAS, op support and the node dispatch; the
 * kernels are the .cu files beside it (cuda/kernels.h). Plain C against the
 * CUDA runtime and cuBLAS C APIs; the core is reached only through the
 * services of module.h.
 *
 *  - Devices come from cudaGetDeviceCount in the runtime's order (stable for
 *    a machine; CUDA_VISIBLE_DEVICES picks and orders them,
 *    CUDA_DEVICE_ORDER=PCI_BUS_ID makes it PCI order), named CUDA0, CUDA1,
 *    ...; without a driver or a device the module registers none and logs
 *    why ("cuda: no CUDA device").
 *  - Each device has a buffer type (cudaMalloc; failure is
 *    TSR_E_DEVICE_NOMEM with the size asked and the free memory) and a
 *    pinned-host staging type CUDAn_Host (cudaMallocHost, falling back to
 *    plain host memory when pinning fails).
 *  - Every CUDA and cuBLAS call is checked; a failure is a status naming the
 *    call, the device and the error. An error that poisons the context
 *    (illegal address, launch failure, ...) marks the device lost, and every
 *    later call on it fails at once.
 *  - One CUDA stream per device, shared by the device's buffers and tsr
 *    streams, so copies and kernels stay in order; device-to-device copies
 *    and memsets are asynchronous, host copies end with a stream sync.
 *  - A tsr stream holds a cuBLAS handle, its workspace, and one scratch
 *    arena sized by reserve (converted activations, dequantized weights).
 */
#include "device.h"
#include "module.h"

#include "kernels.h"
#include "quant.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

_Static_assert((int)TCU_F32 == (int)TSR_TYPE_F32 && (int)TCU_F16 == (int)TSR_TYPE_F16 &&
                   (int)TCU_BF16 == (int)TSR_TYPE_BF16 && (int)TCU_Q4_0 == (int)TSR_TYPE_Q4_0 &&
                   (int)TCU_Q4_1 == (int)TSR_TYPE_Q4_1 && (int)TCU_Q5_0 == (int)TSR_TYPE_Q5_0 &&
                   (int)TCU_Q5_1 == (int)TSR_TYPE_Q5_1 && (int)TCU_Q8_0 == (int)TSR_TYPE_Q8_0 &&
                   (int)TCU_Q4_K == (int)TSR_TYPE_Q4_K && (int)TCU_Q5_K == (int)TSR_TYPE_Q5_K &&
                   (int)TCU_Q6_K == (int)TSR_TYPE_Q6_K && (int)TCU_I32 == (int)TSR_TYPE_I32 &&
                   (int)TCU_I64 == (int)TSR_TYPE_I64,
               "cuda/quant.h type numbers differ from libtensr.h");

#define CU_MAX 16
#define CU_WORKSPACE (32u << 20) /* cuBLAS workspace per stream */
#define CU_ALIGN 256

typedef struct cu_dev {
    tsr_device dev;
    tsr_buffer_type buft, host_buft;
    int ordinal; /* the CUDA runtime's device number */
    int n_sm;    /* multiprocessors */
    cudaStream_t stream;
    bool lost;
    char lost_why[192];
    pthread_mutex_t lock;
} cu_dev;

/* A compute's description (op, types, shapes, strides, addresses and
 * parameters of every node and its sources) and, once it was seen twice,
 * its CUDA graph (ids: it runs mul_mat_id's matrix-vector kernel). */
#define CU_GRAPHS 4
typedef struct cu_graph {
    uint64_t *key;
    size_t n, cap;
    uint64_t used; /* the stream's tick when last seen (least recent is replaced) */
    cudaGraphExec_t exec;
    unsigned long long kernels; /* launched into the graph */
    bool no_capture, ids;
    /* The last compute found with this description, cheaply: its nodes
     * array and count, the plan count (tsr__plan_count: no tensor moved
     * since), a hash of the nodes' addresses, and the arena; a compute
     * that matches all of them has the description without building it. */
    tsr_tensor *const *sig_nodes;
    size_t sig_n, sig_arena_size;
    uint64_t sig_plan, sig_hash;
    void *sig_arena;
} cu_graph;

typedef struct cu_stream {
    cu_dev *c;
    cublasHandle_t blas;
    void *ws;
    void *arena;
    size_t arena_size;
    /* mul_mat_id: the device's record of a bad expert id (int[5]: flag,
     * node, id, token, slot), read when the compute is synchronized, and the
     * host's buffer for grouping the pairs of a large batch by expert */
    int *status;
    bool check_ids;
    tsr_tensor *const *nodes; /* the last compute's nodes, until synchronize */
    size_t n_nodes;
    int32_t *group;
    size_t group_n;
    /* CUDA graphs: kernels go to cs, the device's stream, or cap while a
     * compute is captured; the descriptions of the last computes seen, each
     * with its graph once it repeated; key_new: the one being made */
    cudaStream_t cs, cap;
    bool graphs;
    cu_graph g[CU_GRAPHS];
    uint64_t *key_new;
    size_t key_new_cap;
    uint64_t tick;
    /* The activations at the arena's start: b (by address, type, shape
     * and strides) converted for the mat-vec (Q8_1 when q8, else F32), so
     * the products that read the same input (Q/K/V, gate/up) convert it
     * once; forgotten when a node writes into b or another use takes the
     * arena, and at each compute's start. */
    tcu_tensor act_b;
    size_t act_bytes;
    bool act_valid, act_q8;
} cu_stream;

/* Kernel launches (tcu_count_launch; a graph's replay adds the kernels it
 * captured), computes and the last compute's launches, for TSR_PROFILE. */
static atomic_ullong cu_launches, cu_computes, cu_last_launches, cu_keys_built;
static _Thread_local unsigned long long cu_tl_launches; /* this thread's (a capture's own) */

void tcu_count_launch(void) {
    atomic_fetch_add_explicit(&cu_launches, 1, memory_order_relaxed);
    cu_tl_launches++;
}

/* A capture's launches ran nothing: taken back; its replays add them. */
static void cu_count_kernels(long long n) {
    atomic_fetch_add_explicit(&cu_launches, (unsigned long long)n, memory_order_relaxed);
    cu_tl_launches += (unsigned long long)n;
}

static void cu_prof_print(void) {
    const unsigned long long n = atomic_load(&cu_launches), c = atomic_load(&cu_computes);
    fprintf(stderr,
            "libtensr cuda profile (TSR_PROFILE): %llu kernel launches in %llu computes (%.1f per compute); "
            "the last compute (a decode token's, after a tg test) %llu; graph descriptions built %llu\n",
            n, c, c ? (double)n / (double)c : 0.0, atomic_load(&cu_last_launches), atomic_load(&cu_keys_built));
}

#ifdef TCU_EMU_CUDA_RUNTIME_API_H /* the emulated module (tests only): for tests/test-cuda-emu.c */
TSR_MODULE_EXPORT unsigned long long tcu_emu_graph_keys(void) { return atomic_load(&cu_keys_built); }
#endif

static cu_dev cu_devs[CU_MAX];
static size_t cu_n;
static char cu_pinned_tag; /* handle of a pinned allocation (a plain one's handle is its base) */

/* ---- errors ---------------------------------------------------------------- */

static bool cu_sticky(cudaError_t e) {
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed: return true;
    default: return false;
    }
}

static tsr_status cu_fail(cu_dev *c, cudaError_t e, const char *call) {
    if (cu_sticky(e)) {
        pthread_mutex_lock(&c->lock);
        if (!c->lost)
            snprintf(c->lost_why, sizeof c->lost_why, "%s: %s", call, cudaGetErrorName(e));
        c->lost = true;
        pthread_mutex_unlock(&c->lock);
        char buf[200];
        tsr__log(TSR_LOG_ERROR, "cuda: device lost", 2, "device", c->dev.name, "reason",
                 tsr__fmt(buf, sizeof buf, "%s", c->lost_why));
    } else {
        (void)cudaGetLastError(); /* a non-sticky error: clear it */
    }
    return tsr__error(TSR_E_DEVICE, "%s: %s failed: %s (%s)", c->dev.name, call, cudaGetErrorName(e),
                      cudaGetErrorString(e));
}

static tsr_status cu_blas_fail(cu_dev *c, cublasStatus_t s, const char *call) {
    if (s == CUBLAS_STATUS_ALLOC_FAILED)
        return tsr__error(TSR_E_DEVICE_NOMEM, "%s: %s failed: %s (%s)", c->dev.name, call, cublasGetStatusName(s),
                          cublasGetStatusString(s));
    if (s == CUBLAS_STATUS_EXECUTION_FAILED) { /* the kernel's error is the context's */
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            return cu_fail(c, e, call);
    }
    return tsr__error(TSR_E_DEVICE, "%s: %s failed: %s (%s)", c->dev.name, call, cublasGetStatusName(s),
                      cublasGetStatusString(s));
}

#define CU_CHECK(c, name, expr)              \
    do {                                     \
        const cudaError_t e_ = (expr);       \
        if (e_ != cudaSuccess)               \
            return cu_fail((c), e_, (name)); \
    } while (0)
#define CU_BLAS(c, name, expr)                    \
    do {                                          \
        const cublasStatus_t s_ = (expr);         \
        if (s_ != CUBLAS_STATUS_SUCCESS)          \
            return cu_blas_fail((c), s_, (name)); \
    } while (0)

/* Makes c the calling thread's device and creates its stream on first use;
 * fails at once when the device is lost. */
static tsr_status cu_begin(cu_dev *c) {
    if (c->lost)
        return tsr__error(TSR_E_DEVICE, "%s: the device is lost after an earlier error (%s)", c->dev.name, c->lost_why);
    CU_CHECK(c, "cudaSetDevice", cudaSetDevice(c->ordinal));
    if (c->stream)
        return TSR_OK;
    pthread_mutex_lock(&c->lock);
    cudaError_t e = cudaSuccess;
    if (!c->stream)
        e = cudaStreamCreateWithFlags(&c->stream, cudaStreamDefault);
    pthread_mutex_unlock(&c->lock);
    if (e != cudaSuccess)
        return cu_fail(c, e, "cudaStreamCreateWithFlags");
    return TSR_OK;
}

static tsr_status cu_sync(cu_dev *c) {
    CU_CHECK(c, "cudaStreamSynchronize", cudaStreamSynchronize(c->stream));
    return TSR_OK;
}

/* ---- device buffer type ------------------------------------------------------- */

static tsr_status cu_device_malloc(cu_dev *c, size_t size, void **out) {
    *out = NULL;
    const cudaError_t e = cudaMalloc(out, size ? size : CU_ALIGN);
    if (e == cudaSuccess)
        return TSR_OK;
    *out = NULL;
    if (e != cudaErrorMemoryAllocation)
        return cu_fail(c, e, "cudaMalloc");
    (void)cudaGetLastError();
    size_t free_b = 0, total = 0;
    (void)cudaMemGetInfo(&free_b, &total);
    (void)cudaGetLastError();
    return tsr__error(TSR_E_DEVICE_NOMEM, "%s: cudaMalloc of %.2f MiB (%zu bytes) failed: %.2f MiB free of %.2f MiB",
                      c->dev.name, size / 1048576.0, size, free_b / 1048576.0, total / 1048576.0);
}

static tsr_status cu_alloc(tsr_buffer_type *bt, size_t size, void **base, void **handle) {
    cu_dev *c = bt->impl;
    tsr_status st = cu_begin(c);
    if (st == TSR_OK)
        st = cu_device_malloc(c, size, base);
    *handle = *base;
    return st;
}

static void cu_free(tsr_buffer_type *bt, void *base, void *handle) {
    (void)handle;
    cu_dev *c = bt->impl;
    if (!base || c->lost || cudaSetDevice(c->ordinal) != cudaSuccess)
        return;
    const cudaError_t e = cudaFree(base);
    if (e != cudaSuccess) {
        char buf[96];
        tsr__log(TSR_LOG_WARN, "cuda: cudaFree failed", 2, "device", c->dev.name, "error",
                 tsr__fmt(buf, sizeof buf, "%s", cudaGetErrorName(e)));
        (void)cudaGetLastError();
    }
}

/* Whether host is plain (pageable) memory, not pinned or registered: a
 * copy from it returns once the runtime staged the bytes, so the caller
 * may reuse them at once (CUDA's "API synchronization behavior"); from
 * pinned memory the copy may still be reading them after it returns. */
static bool cu_pageable(const void *host) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, host) != cudaSuccess) {
        (void)cudaGetLastError(); /* not an error of the stream: unknown, so treated as pinned */
        return false;
    }
    return a.type == cudaMemoryTypeUnregistered;
}

/* Ordered on the device's stream; waits for the copy only when it reads
 * pinned memory (the scheduler's staging), so inputs in system memory
 * cost no host sync each. */
static tsr_status cu_set(tsr_buffer *buf, void *dst, const void *host, size_t size) {
    cu_dev *c = buf->buft->impl;
    tsr_status st = cu_begin(c);
    if (st != TSR_OK || !size)
        return st;
    CU_CHECK(c, "cudaMemcpyAsync (host to device)",
             cudaMemcpyAsync(dst, host, size, cudaMemcpyHostToDevice, c->stream));
    return cu_pageable(host) ? TSR_OK : cu_sync(c);
}

/* The scheduler's copies into a split (set_async): never waits; the
 * split's synchronize does, once for all of them and the kernels. */
static tsr_status cu_set_async(tsr_buffer *buf, void *dst, const void *host, size_t size) {
    cu_dev *c = buf->buft->impl;
    tsr_status st = cu_begin(c);
    if (st != TSR_OK || !size)
        return st;
    CU_CHECK(c, "cudaMemcpyAsync (host to device)",
             cudaMemcpyAsync(dst, host, size, cudaMemcpyHostToDevice, c->stream));
    return TSR_OK;
}

static tsr_status cu_get(tsr_buffer *buf, const void *src, void *host, size_t size) {
    cu_dev *c = buf->buft->impl;
    tsr_status st = cu_begin(c);
    if (st != TSR_OK || !size)
        return st;
    CU_CHECK(c, "cudaMemcpyAsync (device to host)",
             cudaMemcpyAsync(host, src, size, cudaMemcpyDeviceToHost, c->stream));
    return cu_sync(c);
}

static tsr_status cu_memset(tsr_buffer *buf, void *dst, int value, size_t size) {
    cu_dev *c = buf->buft->impl;
    tsr_status st = cu_begin(c);
    if (st != TSR_OK || !size)
        return st;
    CU_CHECK(c, "cudaMemsetAsync", cudaMemsetAsync(dst, value, size, c->stream));
    return TSR_OK;
}

static tsr_status cu_copy(tsr_buffer *db, void *dst, tsr_buffer *sb, const void *src, size_t size) {
    (void)sb;
    cu_dev *c = db->buft->impl;
    tsr_status st = cu_begin(c);
    if (st != TSR_OK || !size)
        return st;
    CU_CHECK(c, "cudaMemcpyAsync (device to device)",
             cudaMemcpyAsync(dst, src, size, cudaMemcpyDeviceToDevice, c->stream));
    return TSR_OK;
}

static const tsr_buft_iface cu_buft_iface = {cu_alloc, cu_free, cu_set, cu_get, cu_memset, cu_copy, NULL, cu_set_async};

/* ---- pinned host buffer type ----------------------------------------------------- */

static tsr_status cu_host_alloc(tsr_buffer_type *bt, size_t size, void **base, void **handle) {
    cu_dev *c = bt->impl;
    void *p = NULL;
    if (!c->lost && cudaSetDevice(c->ordinal) == cudaSuccess &&
        cudaMallocHost(&p, size ? size : CU_ALIGN) == cudaSuccess) {
        *base = p;
        *handle = &cu_pinned_tag;
        return TSR_OK;
    }
    (void)cudaGetLastError();
    char buf[32];
    tsr__log(TSR_LOG_DEBUG, "cuda: pinning failed, plain host memory instead", 2, "buffer_type", bt->name, "bytes",
             tsr__fmt(buf, sizeof buf, "%zu", size));
    p = tsr__aligned_alloc(CU_ALIGN, tsr__pad(size ? size : 1, CU_ALIGN));
    if (!p)
        return tsr__error(TSR_E_NOMEM, "%s: cannot allocate %zu bytes of host memory", bt->name, size);
    *base = p;
    *handle = p;
    return TSR_OK;
}

static void cu_host_free(tsr_buffer_type *bt, void *base, void *handle) {
    cu_dev *c = bt->impl;
    if (handle == &cu_pinned_tag) {
        if (cudaSetDevice(c->ordinal) != cudaSuccess || cudaFreeHost(base) != cudaSuccess)
            (void)cudaGetLastError();
        return;
    }
    tsr__aligned_free(base);
}

static tsr_status cu_host_set(tsr_buffer *buf, void *dst, const void *host, size_t size) {
    (void)buf;
    if (size)
        memcpy(dst, host, size);
    return TSR_OK;
}

static tsr_status cu_host_get(tsr_buffer *buf, const void *src, void *host, size_t size) {
    (void)buf;
    if (size)
        memcpy(host, src, size);
    return TSR_OK;
}

static tsr_status cu_host_memset(tsr_buffer *buf, void *dst, int value, size_t size) {
    (void)buf;
    if (size)
        memset(dst, value, size);
    return TSR_OK;
}

static tsr_status cu_host_copy(tsr_buffer *db, void *dst, tsr_buffer *sb, const void *src, size_t size) {
    (void)db, (void)sb;
    if (size)
        memmove(dst, src, size);
    return TSR_OK;
}

static const tsr_buft_iface cu_host_buft_iface = {cu_host_alloc,  cu_host_free, cu_host_set, cu_host_get,
                                                  cu_host_memset, cu_host_copy, NULL,        NULL};

/* ---- op support: exactly what the kernels run ---------------------------------- */

static bool cu_is_float(tsr_type t) { return t == TSR_TYPE_F32 || t == TSR_TYPE_F16 || t == TSR_TYPE_BF16; }
static bool cu_is_f32(const tsr_tensor *t) { return t->type == TSR_TYPE_F32; }

/* Types the element loader reads, laid out as it reads them (quantized rows
 * contiguous; nb[0] 0 is a type-only probe). */
static bool cu_readable(const tsr_tensor *t) {
    if (t->type == TSR_TYPE_I32 || tcu_block_size(t->type) == 0)
        return false;
    if (cu_is_float(t->type))
        return true;
    return t->nb[0] == 0 || t->nb[0] == (size_t)tcu_block_bytes(t->type);
}

static bool cu_mask_ok(const tsr_tensor *m) { return !m || m->type == TSR_TYPE_F32 || m->type == TSR_TYPE_F16; }

static bool cu_contig_rows(const tsr_tensor *t) { return t->nb[0] == 0 || t->nb[0] == sizeof(float); }

static bool cu_fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* The integer dots read the weights' fields two bytes at a time: quantized
 * weights at even addresses and strides (every block size is even; only a
 * view at an odd byte offset is not). */
static bool cu_even(const tsr_tensor *a) {
    if (!tcu_dot_q8_1_type((int)a->type))
        return true;
    return !(((uintptr_t)a->data | a->nb[1] | a->nb[2] | a->nb[3]) & 1);
}

/* The row-major layout without gaps (tsr__is_contiguous of the core, which
 * a module cannot call). */
static bool cu_is_contiguous(const tsr_tensor *t) {
    const tsr_type_traits *tr = tsr__type_traits(t->type);
    if (!tr || tr->block_size <= 0)
        return false;
    size_t want = tr->block_bytes;
    if (t->nb[0] != want)
        return false;
    want = want * (size_t)(t->ne[0] / tr->block_size);
    for (int i = 1; i < 4; i++) {
        if (t->ne[i] > 1 && t->nb[i] != want)
            return false;
        want *= (size_t)t->ne[i];
    }
    return true;
}

/* The kernels read and write elements with plain loads of their size (F32,
 * I32 4 bytes, I64 8, F16, BF16 and the quantized blocks' fields 2): an
 * address or a stride off that alignment faults on the GPU (misaligned
 * address, and the context is lost). A view at such an offset (data, or
 * its offset when not yet allocated) is left to the CPU. */
static bool cu_aligned(const tsr_tensor *t) {
    if (!t)
        return true;
    const size_t es = t->type == TSR_TYPE_F32 || t->type == TSR_TYPE_I32 ? 4 : t->type == TSR_TYPE_I64 ? 8 : 2;
    const uintptr_t at = t->data ? (uintptr_t)t->data : (uintptr_t)t->view_offs;
    return ((at | t->nb[0] | t->nb[1] | t->nb[2] | t->nb[3]) & (es - 1)) == 0;
}

static bool cu_sources_aligned(const tsr_tensor *op) {
    bool ok = cu_aligned(op);
    for (int j = 0; j < TSR_MAX_SRC; j++) ok = ok && cu_aligned(op->src[j]);
    return ok;
}

static bool cu_sup_cpy(const tsr_tensor *dst, const tsr_tensor *src) {
    if (src->type == dst->type && cu_is_contiguous(src) && cu_is_contiguous(dst))
        return tsr__type_traits(dst->type) != NULL; /* a byte copy */
    if (dst->type == TSR_TYPE_I32 || src->type == TSR_TYPE_I32)
        return dst->type == src->type;
    if (!cu_readable(src))
        return false;
    if (cu_is_float(dst->type))
        return true;
    return dst->type == TSR_TYPE_Q8_0 && dst->ne[0] % 32 == 0 && (dst->nb[0] == 0 || dst->nb[0] == 34);
}

static bool cu_supports(const tsr_device *d, const tsr_tensor *op) {
    (void)d;
    const tsr_tensor *a = op->src[0], *b = op->src[1];
    switch (op->op) {
    case TSR_OP_NONE:
    case TSR_OP_VIEW: return true;
    default: break;
    }
    if (!cu_sources_aligned(op))
        return false;
    switch (op->op) {
    case TSR_OP_ADD:
    case TSR_OP_SUB:
    case TSR_OP_MUL:
    case TSR_OP_DIV: return cu_is_float(a->type) && cu_is_float(b->type);
    case TSR_OP_SCALE:
    case TSR_OP_SILU:
    case TSR_OP_GELU: return cu_is_f32(a);
    case TSR_OP_SWIGLU:
    case TSR_OP_GEGLU: return cu_is_f32(a) && cu_is_f32(b);
    case TSR_OP_RMS_NORM:
    case TSR_OP_NORM: return cu_is_f32(a) && cu_contig_rows(a);
    case TSR_OP_SOFTMAX: return cu_is_f32(a) && cu_contig_rows(a) && cu_mask_ok(b);
    case TSR_OP_ROPE: return cu_is_f32(a) && b->type == TSR_TYPE_I32 && (!op->src[2] || cu_is_f32(op->src[2]));
    case TSR_OP_GET_ROWS: return cu_readable(a) && b->type == TSR_TYPE_I32;
    case TSR_OP_SET_ROWS: {
        const tsr_tensor *idx = op->src[2];
        const bool to = cu_is_float(op->type) ||
                        (op->type == TSR_TYPE_Q8_0 && op->ne[0] % 32 == 0 && (op->nb[0] == 0 || op->nb[0] == 34));
        return to && cu_is_f32(b) && (idx->type == TSR_TYPE_I32 || idx->type == TSR_TYPE_I64);
    }
    case TSR_OP_CPY:
    case TSR_OP_CONT: return cu_sup_cpy(op, a);
    case TSR_OP_CONCAT: return a->type == b->type && (cu_is_float(a->type) || a->type == TSR_TYPE_I32);
    case TSR_OP_ARGMAX: return cu_is_f32(a);
    case TSR_OP_SIGMOID:
    case TSR_OP_SUM_ROWS: return cu_is_f32(a);
    case TSR_OP_ARGSORT:
    case TSR_OP_TOP_K: return cu_is_f32(a) && a->ne[0] <= TCU_SORT_MAX; /* longer rows: the CPU */
    case TSR_OP_MUL_MAT:
        return cu_readable(a) && cu_even(a) && cu_is_f32(b) && cu_fits_int(a->ne[0]) && cu_fits_int(a->ne[1]) &&
               cu_fits_int(b->ne[1]) && b->ne[2] * b->ne[3] <= TCU_MAX_GRID;
    case TSR_OP_MUL_MAT_ID: { /* ids: I32 rows of whole elements (the host reads them for large batches) */
        const tsr_tensor *ids = op->src[2];
        return cu_readable(a) && cu_even(a) && cu_is_f32(b) && ids->type == TSR_TYPE_I32 && cu_fits_int(a->ne[0]) &&
               cu_fits_int(a->ne[1]) && cu_fits_int(a->ne[2]) && cu_fits_int(ids->ne[0] * ids->ne[1]) &&
               (ids->ne[0] <= 1 || ids->nb[0] == sizeof(int32_t)) &&
               (ids->ne[1] <= 1 || ids->nb[1] >= (size_t)ids->ne[0] * sizeof(int32_t));
    }
    case TSR_OP_FLASH_ATTN: {
        const tsr_tensor *k = op->src[1], *v = op->src[2];
        const bool kv = (k->type == TSR_TYPE_F32 || k->type == TSR_TYPE_F16 || k->type == TSR_TYPE_Q8_0) &&
                        (v->type == TSR_TYPE_F32 || v->type == TSR_TYPE_F16 || v->type == TSR_TYPE_Q8_0) &&
                        cu_readable(k) && cu_readable(v);
        return cu_is_f32(a) && kv && cu_mask_ok(op->src[3]) && (a->ne[0] + v->ne[0]) * 4 <= 48 * 1024;
    }
    default: return false;
    }
}

/* ---- streams, scratch ------------------------------------------------------------ */

/* Few columns: the matrix-vector kernel; else cuBLAS. */
static bool cu_use_mmv(const tsr_tensor *node) { return node->src[1]->ne[1] <= TCU_MMV_MAX_COLS; }

/* A weight matrix cuBLAS reads in place (F32/F16 with whole-element row strides). */
static bool cu_gemm_direct(const tsr_tensor *a) {
    const size_t es = a->type == TSR_TYPE_F32 ? 4 : 2;
    return (a->type == TSR_TYPE_F32 || a->type == TSR_TYPE_F16) && a->nb[0] == es && a->nb[1] % es == 0 &&
           a->nb[1] / es >= (size_t)(a->ne[0] > 0 ? a->ne[0] : 1) && a->nb[1] / es <= INT_MAX;
}

/* mul_mat_id: the matrix-vector kernel up to TCU_MMV_MAX_COLS tokens. */
static bool cu_use_mmv_id(const tsr_tensor *node) { return node->src[2]->ne[1] <= TCU_MMV_MAX_COLS; }

/* Host words for grouping a large mul_mat_id's pairs: ids, pairs, first
 * pair and fill cursor per expert. */
static size_t cu_group_need(const tsr_tensor *node) {
    if (node->op != TSR_OP_MUL_MAT_ID || cu_use_mmv_id(node))
        return 0;
    const size_t n_pairs = (size_t)(node->src[2]->ne[0] * node->src[2]->ne[1]);
    return 2 * n_pairs + 2 * ((size_t)node->src[0]->ne[2] + 1);
}

/* The scratch of the node and of the same node over fewer tokens (a
 * reserve sees the largest graph; a smaller one may take the other path):
 * the matrix-vector kernel's for up to TCU_MMV_MAX_COLS tokens, and past
 * that the GEMM's, which grows with the tokens. */
static size_t cu_scratch_need_id(const tsr_tensor *node) {
    const tsr_tensor *as = node->src[0], *b = node->src[1], *ids = node->src[2];
    const size_t k = (size_t)as->ne[0], m = (size_t)as->ne[1], n_pairs = (size_t)(ids->ne[0] * ids->ne[1]);
    const int64_t n_tok = b->ne[2] < TCU_MMV_MAX_COLS ? b->ne[2] : TCU_MMV_MAX_COLS;
    const size_t mmv = tsr__pad(k * (size_t)(b->ne[1] * n_tok) * 4, CU_ALIGN);
    if (cu_use_mmv_id(node))
        return mmv;
    const bool direct = cu_gemm_direct(as);
    const size_t es = direct && as->type == TSR_TYPE_F32 ? 4 : 2;
    const size_t gemm = tsr__pad(n_pairs * 4, CU_ALIGN) + tsr__pad(n_pairs * k * es, CU_ALIGN) +
                        (direct ? 0 : tsr__pad(k * m * 2, CU_ALIGN)) + tsr__pad(n_pairs * m * 4, CU_ALIGN);
    return gemm > mmv ? gemm : mmv;
}

static tcu_tensor cu_t(const tsr_tensor *t);

static size_t cu_scratch_need(const cu_dev *c, const tsr_tensor *node) {
    if (node->op == TSR_OP_MUL_MAT_ID)
        return cu_scratch_need_id(node);
    if (node->op == TSR_OP_FLASH_ATTN)
        return tsr__pad(tcu_flash_attn_scratch(cu_t(node->src[0]), cu_t(node->src[1]), cu_t(node->src[2]), c->n_sm),
                        CU_ALIGN);
    if (node->op != TSR_OP_MUL_MAT)
        return 0;
    const tsr_tensor *a = node->src[0], *b = node->src[1];
    const size_t k = (size_t)a->ne[0], m = (size_t)a->ne[1], n = (size_t)b->ne[1];
    /* as mul_mat_id's: the mat-vec's for up to TCU_MMV_MAX_COLS columns too */
    const size_t n_mmv = n < TCU_MMV_MAX_COLS ? n : TCU_MMV_MAX_COLS;
    const size_t mmv = tsr__pad(k * n_mmv * (size_t)(b->ne[2] * b->ne[3]) * 4, CU_ALIGN);
    if (cu_use_mmv(node))
        return mmv;
    const bool direct = cu_gemm_direct(a); /* else A is dequantized to F16 and B goes F16 too */
    size_t need = tsr__pad(k * n * (direct && a->type == TSR_TYPE_F32 ? 4 : 2), CU_ALIGN);
    if (!direct)
        need += tsr__pad(k * m * 2, CU_ALIGN);
    return need > mmv ? need : mmv;
}

static tsr_status cu_arena_grow(cu_stream *s, size_t need) {
    if (need <= s->arena_size)
        return TSR_OK;
    cu_dev *c = s->c;
    tsr_status st = cu_sync(c);
    if (st != TSR_OK)
        return st;
    if (s->arena)
        (void)cudaFree(s->arena);
    s->arena = NULL;
    s->arena_size = 0;
    s->act_valid = false;
    st = cu_device_malloc(c, need, &s->arena);
    if (st == TSR_OK)
        s->arena_size = need;
    return st;
}

static void cu_stream_free(tsr_stream *ts) {
    cu_stream *s = (cu_stream *)ts;
    if (!s)
        return;
    if (!s->c->lost && cudaSetDevice(s->c->ordinal) == cudaSuccess) {
        if (s->c->stream)
            (void)cudaStreamSynchronize(s->c->stream);
        if (s->blas)
            (void)cublasDestroy(s->blas);
        if (s->ws)
            (void)cudaFree(s->ws);
        if (s->arena)
            (void)cudaFree(s->arena);
        if (s->status)
            (void)cudaFree(s->status);
        for (int i = 0; i < CU_GRAPHS; i++)
            if (s->g[i].exec)
                (void)cudaGraphExecDestroy(s->g[i].exec);
        if (s->cap)
            (void)cudaStreamDestroy(s->cap);
        (void)cudaGetLastError();
    }
    for (int i = 0; i < CU_GRAPHS; i++) tsr__free(s->g[i].key);
    tsr__free(s->key_new);
    tsr__free(s->group);
    tsr__free(s);
}

static tsr_status cu_stream_new(tsr_device *d, int n_threads, tsr_stream **out) {
    (void)n_threads;
    *out = NULL;
    cu_dev *c = d->impl;
    tsr_status st = cu_begin(c);
    if (st != TSR_OK)
        return st;
    cu_stream *s = tsr__calloc(1, sizeof *s);
    if (!s)
        return tsr__error(TSR_E_NOMEM, "%s: out of memory creating a stream", d->name);
    s->c = c;
    cublasStatus_t bs = cublasCreate(&s->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        s->blas = NULL;
        st = cu_blas_fail(c, bs, "cublasCreate");
    }
    if (st == TSR_OK && (bs = cublasSetStream(s->blas, c->stream)) != CUBLAS_STATUS_SUCCESS)
        st = cu_blas_fail(c, bs, "cublasSetStream");
    if (st == TSR_OK)
        st = cu_device_malloc(c, CU_WORKSPACE, &s->ws);
    if (st == TSR_OK && (bs = cublasSetWorkspace(s->blas, s->ws, CU_WORKSPACE)) != CUBLAS_STATUS_SUCCESS)
        st = cu_blas_fail(c, bs, "cublasSetWorkspace");
    s->cs = c->stream;
    const char *env = getenv("TSR_CUDA_GRAPHS");
    s->graphs = !(env && env[0] == '0' && env[1] == '\0');
    if (st == TSR_OK && s->graphs) {
        const cudaError_t e = cudaStreamCreateWithFlags(&s->cap, cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            s->cap = NULL;
            st = cu_fail(c, e, "cudaStreamCreateWithFlags");
        }
    }
    if (st == TSR_OK)
        st = cu_device_malloc(c, 8 * sizeof(int), (void **)&s->status);
    if (st == TSR_OK) {
        const cudaError_t e = cudaMemsetAsync(s->status, 0, 8 * sizeof(int), c->stream);
        st = e == cudaSuccess ? cu_sync(c) : cu_fail(c, e, "cudaMemsetAsync");
    }
    if (st != TSR_OK) {
        cu_stream_free((tsr_stream *)s);
        return st;
    }
    *out = (tsr_stream *)s;
    return TSR_OK;
}

static tsr_status cu_group_grow(cu_stream *s, size_t need) {
    if (need <= s->group_n)
        return TSR_OK;
    int32_t *g = tsr__malloc(need * sizeof *g);
    if (!g)
        return tsr__error(TSR_E_NOMEM, "%s: cannot allocate %zu bytes for grouping expert ids", s->c->dev.name,
                          need * sizeof *g);
    tsr__free(s->group);
    s->group = g;
    s->group_n = need;
    return TSR_OK;
}

static tsr_status cu_reserve(tsr_stream *ts, tsr_tensor *const *nodes, size_t n_nodes) {
    cu_stream *s = (cu_stream *)ts;
    tsr_status st = cu_begin(s->c);
    size_t need = 0, group = 0;
    for (size_t i = 0; st == TSR_OK && i < n_nodes; i++) {
        const size_t n = cu_scratch_need(s->c, nodes[i]), g = cu_group_need(nodes[i]);
        need = n > need ? n : need;
        group = g > group ? g : group;
    }
    if (st == TSR_OK)
        st = cu_group_grow(s, group);
    return st == TSR_OK ? cu_arena_grow(s, need) : st;
}

/* After a compute ran mul_mat_id's matrix-vector kernel: its record of a
 * bad expert id, as the CPU's TSR_E_RANGE (the record is cleared). */
static tsr_status cu_check_ids(cu_stream *s) {
    cu_dev *c = s->c;
    int h[5];
    CU_CHECK(c, "cudaMemcpyAsync (device to host)",
             cudaMemcpyAsync(h, s->status, sizeof h, cudaMemcpyDeviceToHost, c->stream));
    tsr_status st = cu_sync(c);
    if (st != TSR_OK || !h[0]) {
        s->check_ids = st != TSR_OK; /* unread: the next compute clears the record */
        return st;
    }
    CU_CHECK(c, "cudaMemsetAsync", cudaMemsetAsync(s->status, 0, sizeof h, c->stream));
    st = cu_sync(c);
    if (st != TSR_OK)
        return st;
    s->check_ids = false;
    const tsr_tensor *node = h[1] >= 0 && (size_t)h[1] < s->n_nodes ? s->nodes[h[1]] : NULL;
    const long long ne = node ? (long long)node->src[0]->ne[2] : 0;
    return tsr__error(
        TSR_E_RANGE, "mul_mat_id node '%s': expert id %d (token %lld, slot %lld) is outside 0..%lld (n_expert %lld)",
        node && node->name[0] ? node->name : "(unnamed)", h[2], (long long)h[3], (long long)h[4], ne - 1, ne);
}

static tsr_status cu_synchronize(tsr_stream *ts) {
    cu_stream *s = (cu_stream *)ts;
    tsr_status st = cu_begin(s->c);
    if (st == TSR_OK)
        st = cu_sync(s->c);
    if (st == TSR_OK && s->check_ids)
        st = cu_check_ids(s);
    return st;
}

/* ---- dispatch ------------------------------------------------------------------------ */

static tcu_tensor cu_t(const tsr_tensor *t) {
    tcu_tensor r;
    r.type = (int)t->type;
    for (int i = 0; i < 4; i++) {
        r.ne[i] = t->ne[i];
        r.nb[i] = (int64_t)t->nb[i];
    }
    r.data = t->data;
    return r;
}

static bool cu_same_tensor(const tcu_tensor *x, const tcu_tensor *y) {
    if (x->data != y->data || x->type != y->type)
        return false;
    for (int i = 0; i < 4; i++)
        if (x->ne[i] != y->ne[i] || x->nb[i] != y->nb[i])
            return false;
    return true;
}

/* The bytes from t's first element to past its last (0 when empty). */
static size_t cu_extent(const tsr_tensor *t) {
    size_t n = tsr__type_traits(t->type) ? tsr__type_traits(t->type)->block_bytes : 1;
    for (int i = 0; i < 4; i++) {
        if (t->ne[i] == 0)
            return 0;
        n += (size_t)(t->ne[i] - 1) * t->nb[i];
    }
    return n;
}

/* Whether the memory of x and y (their extents) overlap. */
static bool cu_overlap(const tsr_tensor *x, const tsr_tensor *y) {
    const uintptr_t a = (uintptr_t)x->data, b = (uintptr_t)y->data;
    const size_t na = cu_extent(x), nb = cu_extent(y);
    return na && nb && a < b + nb && b < a + na;
}

/* The mat-vec's activations *y for weights of type wtype: b itself when it
 * is contiguous F32 and the weights float (no copy), NULL when strided (the
 * mat-vec's) and b has F32 rows (read in place through b's strides), the
 * arena's when it holds b converted the same way, else b converted into
 * the arena. */
static cudaError_t cu_activations(cu_stream *s, const tsr_tensor *b, int wtype, bool strided, const void **y) {
    const bool q8 = tcu_dot_q8_1_type(wtype);
    const tcu_tensor tb = cu_t(b);
    if (!q8 && b->type == TSR_TYPE_F32 && cu_is_contiguous(b)) {
        *y = b->data;
        return cudaSuccess;
    }
    if (!q8 && strided && b->type == TSR_TYPE_F32 && b->nb[0] == sizeof(float) && b->nb[1] % sizeof(float) == 0) {
        *y = NULL; /* tcu_mat_vec reads b through its strides */
        return cudaSuccess;
    }
    *y = s->arena;
    if (s->act_valid && s->act_q8 == q8 && cu_same_tensor(&s->act_b, &tb))
        return cudaSuccess;
    const cudaError_t e = tcu_activations(s->cs, s->arena, tb, wtype);
    s->act_valid = e == cudaSuccess;
    s->act_q8 = q8;
    s->act_b = tb;
    s->act_bytes = cu_extent(b);
    return e;
}

/* Forgets the arena's activations when the node writes into their source
 * or uses the arena otherwise. */
static void cu_act_forget(cu_stream *s, const tsr_tensor *node) {
    if (!s->act_valid)
        return;
    const bool arena = node->op == TSR_OP_FLASH_ATTN || (node->op == TSR_OP_MUL_MAT && !cu_use_mmv(node)) ||
                       (node->op == TSR_OP_MUL_MAT_ID && !cu_use_mmv_id(node));
    const uintptr_t d = (uintptr_t)node->data, b = (uintptr_t)s->act_b.data;
    const size_t nb = s->act_bytes, nd = cu_extent(node);
    if (arena || (nd && d < b + nb && b < d + nd))
        s->act_valid = false;
}

/* Whether the mat-vec of node also computes the next node, nx: the
 * residual added (add) or the gate's silu times the up projection
 * (swiglu), F32, of node's shape, with the other operand x too (the
 * epilogue reads and writes each at the product's coordinates). */
static bool cu_fuse_epi(const cu_dev *c, const tsr_tensor *node, const tsr_tensor *nx, tcu_mmv_epi *epi) {
    if (!nx || (nx->op != TSR_OP_ADD && nx->op != TSR_OP_SWIGLU) || nx->type != TSR_TYPE_F32 ||
        node->type != TSR_TYPE_F32 || (nx->src[0] == node) == (nx->src[1] == node))
        return false;
    const tsr_tensor *x = nx->src[0] == node ? nx->src[1] : nx->src[0];
    if (!x || x->type != TSR_TYPE_F32 || !cu_supports(&c->dev, nx) || cu_overlap(nx, node->src[1]))
        return false;
    for (int i = 0; i < 4; i++)
        if (nx->ne[i] != node->ne[i] || x->ne[i] != node->ne[i])
            return false;
    epi->mode = nx->op == TSR_OP_ADD ? TCU_EPI_ADD : nx->src[0] == node ? TCU_EPI_SWIGLU_A : TCU_EPI_SWIGLU_B;
    epi->dst = cu_t(nx);
    epi->x = cu_t(x);
    return true;
}

/* Whether the gate and up projections of one input, p and q (the next
 * product), and sw = swiglu of the two (either order) run as one mat-vec
 * launch (TCU_EPI_SWIGLU_PAIR): weights of one type and shape, F32
 * results of one shape; every result is still written. Float weights read
 * b in place: sw must not have taken b's memory (b dies at q). */
static bool cu_fuse_glu_pair(const cu_dev *c, const tsr_tensor *p, const tsr_tensor *q, const tsr_tensor *sw) {
    if (q->op != TSR_OP_MUL_MAT || sw->op != TSR_OP_SWIGLU || q->src[1] != p->src[1] || !cu_use_mmv(p) ||
        p->type != TSR_TYPE_F32 || q->type != TSR_TYPE_F32 || sw->type != TSR_TYPE_F32 || !cu_supports(&c->dev, q) ||
        !cu_supports(&c->dev, sw))
        return false;
    if (!((sw->src[0] == p && sw->src[1] == q) || (sw->src[0] == q && sw->src[1] == p)))
        return false;
    const tsr_tensor *wp = p->src[0], *wq = q->src[0];
    if (wp->type != wq->type || cu_overlap(sw, p->src[1]))
        return false;
    for (int i = 0; i < 4; i++)
        if (wp->ne[i] != wq->ne[i] || q->ne[i] != p->ne[i] || sw->ne[i] != p->ne[i])
            return false;
    return true;
}

/* The fused gate/up pair (cu_fuse_glu_pair): one launch writes the gate's
 * product, the up projection's and their swiglu. */
static tsr_status cu_mul_mat_glu(cu_stream *s, const tsr_tensor *sw) {
    cu_dev *c = s->c;
    const tsr_tensor *gate = sw->src[0], *up = sw->src[1], *b = gate->src[1];
    tsr_status st = cu_arena_grow(s, cu_scratch_need(c, gate));
    if (st != TSR_OK)
        return st;
    tcu_mmv_epi epi;
    epi.mode = TCU_EPI_SWIGLU_PAIR;
    epi.dst = cu_t(sw);
    epi.x = cu_t(up);
    epi.a2 = cu_t(up->src[0]);
    const void *y = NULL;
    CU_CHECK(c, "tcu_activations (kernel launch)", cu_activations(s, b, (int)gate->src[0]->type, true, &y));
    CU_CHECK(c, "tcu_mat_vec (kernel launch)", tcu_mat_vec(s->cs, cu_t(gate), cu_t(gate->src[0]), cu_t(b), y, &epi));
    return TSR_OK;
}

/* nx: the node after (NULL: none); *fused when the mat-vec computed it too. */
static tsr_status cu_mul_mat(cu_stream *s, tsr_tensor *node, const tsr_tensor *nx, bool *fused) {
    cu_dev *c = s->c;
    const tsr_tensor *a = node->src[0], *b = node->src[1];
    const int64_t k = a->ne[0], m = a->ne[1], n = b->ne[1];
    *fused = false;
    tsr_status st = cu_arena_grow(s, cu_scratch_need(c, node));
    if (st != TSR_OK)
        return st;
    if (cu_use_mmv(node)) {
        const void *y = NULL; /* every matrix of b, rows in order, as a's type meets them */
        tcu_mmv_epi epi;
        const bool fuse = cu_fuse_epi(c, node, nx, &epi);
        CU_CHECK(c, "tcu_activations (kernel launch)", cu_activations(s, b, (int)a->type, true, &y));
        CU_CHECK(c, "tcu_mat_vec (kernel launch)",
                 tcu_mat_vec(s->cs, cu_t(node), cu_t(a), cu_t(b), y, fuse ? &epi : NULL));
        *fused = fuse;
        return TSR_OK;
    }
    if (m == 0 || n == 0 || b->ne[2] == 0 || b->ne[3] == 0 || a->ne[2] == 0 || a->ne[3] == 0)
        return TSR_OK; /* no matrices: nothing to do, and no broadcast ratio to divide by */
    const bool direct = cu_gemm_direct(a), f32 = direct && a->type == TSR_TYPE_F32;
    const size_t es = f32 ? 4 : 2;
    char *bconv = s->arena, *aconv = bconv + tsr__pad((size_t)(k * n) * es, CU_ALIGN);
    const int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    const float one = 1.0f, zero = 0.0f;
    int64_t last_a = -1;
    for (int64_t i3 = 0; i3 < b->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < b->ne[2]; i2++) {
            const int64_t a2 = i2 / r2, a3 = i3 / r3;
            const void *A = (const char *)a->data + a2 * (int64_t)a->nb[2] + a3 * (int64_t)a->nb[3];
            int lda = (int)(a->nb[1] / es);
            if (!direct) {
                if (last_a != a2 + a->ne[2] * a3)
                    CU_CHECK(c, "tcu_matrix_to_f16 (kernel launch)", tcu_matrix_to_f16(s->cs, aconv, cu_t(a), a2, a3));
                last_a = a2 + a->ne[2] * a3;
                A = aconv;
                lda = k > 0 ? (int)k : 1;
            }
            if (f32)
                CU_CHECK(c, "tcu_matrix_to_f32 (kernel launch)",
                         tcu_matrix_to_f32(s->cs, (float *)bconv, cu_t(b), i2, i3));
            else
                CU_CHECK(c, "tcu_matrix_to_f16 (kernel launch)", tcu_matrix_to_f16(s->cs, bconv, cu_t(b), i2, i3));
            float *C = (float *)((char *)node->data + i2 * (int64_t)node->nb[2] + i3 * (int64_t)node->nb[3]);
            const cudaDataType_t ab = f32 ? CUDA_R_32F : CUDA_R_16F;
            CU_BLAS(c, "cublasGemmEx",
                    cublasGemmEx(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)k, &one, A, ab, lda, bconv, ab,
                                 k > 0 ? (int)k : 1, &zero, C, CUDA_R_32F, (int)(node->nb[1] / 4), CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
        }
    return TSR_OK;
}

/* The experts' products: few tokens, a warp per weight row and pair (bad
 * ids recorded on the device, reported by synchronize); more, the pairs
 * grouped by expert on the host (bad ids reported at once), one cuBLAS
 * GEMM per expert over its gathered rows, the products scattered back. */
static tsr_status cu_mul_mat_id(cu_stream *s, tsr_tensor *node, size_t index) {
    cu_dev *c = s->c;
    const tsr_tensor *as = node->src[0], *b = node->src[1], *ids = node->src[2];
    const int64_t k = as->ne[0], m = as->ne[1], n_expert = as->ne[2], n_used = ids->ne[0];
    const int64_t n_tokens = ids->ne[1], n_pairs = n_used * n_tokens;
    tsr_status st = cu_arena_grow(s, cu_scratch_need(c, node));
    if (st != TSR_OK)
        return st;
    if (cu_use_mmv_id(node)) {
        const void *y = NULL;
        CU_CHECK(c, "tcu_activations (kernel launch)", cu_activations(s, b, (int)as->type, false, &y));
        CU_CHECK(c, "tcu_mat_vec_id (kernel launch)",
                 tcu_mat_vec_id(s->cs, cu_t(node), cu_t(as), cu_t(ids), y, b->ne[1], index <= INT_MAX ? (int)index : -1,
                                s->status));
        s->check_ids = true;
        return TSR_OK;
    }
    if (n_pairs == 0 || m == 0)
        return TSR_OK;
    if ((st = cu_group_grow(s, cu_group_need(node))) != TSR_OK)
        return st;
    int32_t *hid = s->group, *hpairs = hid + n_pairs, *first = hpairs + n_pairs, *cur = first + n_expert + 1;
    const size_t row = (size_t)n_used * sizeof(int32_t);
    CU_CHECK(c, "cudaMemcpy2DAsync (expert ids to host)",
             cudaMemcpy2DAsync(hid, row, ids->data, n_tokens > 1 ? ids->nb[1] : row, row, (size_t)n_tokens,
                               cudaMemcpyDefault, c->stream));
    if ((st = cu_sync(c)) != TSR_OK)
        return st;
    memset(first, 0, (size_t)(n_expert + 1) * sizeof *first);
    for (int64_t p = 0; p < n_pairs; p++) {
        const int32_t id = hid[p];
        if (id < 0 || id >= n_expert)
            return tsr__error(TSR_E_RANGE,
                              "mul_mat_id node '%s': expert id %d (token %lld, slot %lld) is outside 0..%lld "
                              "(n_expert %lld)",
                              node->name[0] ? node->name : "(unnamed)", (int)id, (long long)(p / n_used),
                              (long long)(p % n_used), (long long)n_expert - 1, (long long)n_expert);
        first[id + 1]++;
    }
    for (int64_t x = 0; x < n_expert; x++) {
        first[x + 1] += first[x];
        cur[x] = first[x];
    }
    for (int64_t p = 0; p < n_pairs; p++) hpairs[cur[hid[p]]++] = (int32_t)p;

    const bool direct = cu_gemm_direct(as), f32 = direct && as->type == TSR_TYPE_F32;
    const size_t es = f32 ? 4 : 2;
    char *base = s->arena;
    int *dpairs = (int *)base;
    char *bg = base + tsr__pad((size_t)n_pairs * 4, CU_ALIGN);
    char *aconv = bg + tsr__pad((size_t)(n_pairs * k) * es, CU_ALIGN);
    float *cbuf = (float *)(aconv + (direct ? 0 : tsr__pad((size_t)(k * m) * 2, CU_ALIGN)));
    /* pageable source: the call returns once the words are staged */
    CU_CHECK(c, "cudaMemcpyAsync (expert pairs to device)",
             cudaMemcpyAsync(dpairs, hpairs, (size_t)n_pairs * 4, cudaMemcpyHostToDevice, c->stream));
    CU_CHECK(c, "tcu_mmid_gather (kernel launch)",
             tcu_mmid_gather(c->stream, bg, !f32, cu_t(b), dpairs, n_pairs, n_used));
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType_t ab = f32 ? CUDA_R_32F : CUDA_R_16F;
    for (int64_t x = 0; x < n_expert; x++) {
        const int64_t cnt = first[x + 1] - first[x];
        if (cnt == 0)
            continue;
        const void *A = (const char *)as->data + x * (int64_t)as->nb[2];
        int lda = (int)(as->nb[1] / es);
        if (!direct) {
            CU_CHECK(c, "tcu_matrix_to_f16 (kernel launch)", tcu_matrix_to_f16(s->cs, aconv, cu_t(as), x, 0));
            A = aconv;
            lda = k > 0 ? (int)k : 1;
        }
        CU_BLAS(c, "cublasGemmEx",
                cublasGemmEx(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)cnt, (int)k, &one, A, ab, lda,
                             bg + (size_t)(first[x] * k) * es, ab, k > 0 ? (int)k : 1, &zero,
                             cbuf + (size_t)(first[x] * m), CUDA_R_32F, (int)m, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT));
    }
    CU_CHECK(c, "tcu_mmid_scatter (kernel launch)",
             tcu_mmid_scatter(c->stream, cu_t(node), cbuf, dpairs, n_pairs, n_used));
    return TSR_OK;
}

static cudaError_t cu_launch(cu_stream *s, tsr_tensor *node) {
    cudaStream_t cs = s->cs;
    const tsr_tensor *a = node->src[0], *b = node->src[1];
    const tcu_tensor d = cu_t(node);
    switch (node->op) {
    case TSR_OP_ADD: return tcu_binary(cs, TCU_ADD, d, cu_t(a), cu_t(b));
    case TSR_OP_SUB: return tcu_binary(cs, TCU_SUB, d, cu_t(a), cu_t(b));
    case TSR_OP_MUL: return tcu_binary(cs, TCU_MUL, d, cu_t(a), cu_t(b));
    case TSR_OP_DIV: return tcu_binary(cs, TCU_DIV, d, cu_t(a), cu_t(b));
    case TSR_OP_SCALE: return tcu_scale(cs, d, cu_t(a), tsr__get_f32_param(node, 0));
    case TSR_OP_SILU: return tcu_unary(cs, TCU_SILU, d, cu_t(a));
    case TSR_OP_GELU: return tcu_unary(cs, TCU_GELU, d, cu_t(a));
    case TSR_OP_SWIGLU: return tcu_glu(cs, TCU_SILU, d, cu_t(a), cu_t(b));
    case TSR_OP_GEGLU: return tcu_glu(cs, TCU_GELU, d, cu_t(a), cu_t(b));
    case TSR_OP_RMS_NORM: return tcu_norm(cs, 1, d, cu_t(a), tsr__get_f32_param(node, 0));
    case TSR_OP_NORM: return tcu_norm(cs, 0, d, cu_t(a), tsr__get_f32_param(node, 0));
    case TSR_OP_SOFTMAX: {
        const tcu_tensor m = b ? cu_t(b) : d;
        return tcu_softmax(cs, d, cu_t(a), b ? &m : NULL, tsr__get_f32_param(node, 0));
    }
    case TSR_OP_ROPE: {
        const tcu_tensor ff = node->src[2] ? cu_t(node->src[2]) : d;
        return tcu_rope(cs, d, cu_t(a), cu_t(b), node->src[2] ? &ff : NULL, node->op_params);
    }
    case TSR_OP_GET_ROWS: return tcu_get_rows(cs, d, cu_t(a), cu_t(b));
    case TSR_OP_SET_ROWS: return tcu_set_rows(cs, d, cu_t(b), cu_t(node->src[2]));
    case TSR_OP_CPY:
    case TSR_OP_CONT:
        if (a->type == node->type && cu_is_contiguous(a) && cu_is_contiguous(node))
            return cudaMemcpyAsync(node->data, a->data, tsr__nbytes(node), cudaMemcpyDeviceToDevice, cs);
        return tcu_cpy(cs, d, cu_t(a));
    case TSR_OP_CONCAT: return tcu_concat(cs, d, cu_t(a), cu_t(b), node->op_params[0]);
    case TSR_OP_ARGMAX: return tcu_argmax(cs, d, cu_t(a));
    case TSR_OP_SIGMOID: return tcu_unary(cs, TCU_SIGMOID, d, cu_t(a));
    case TSR_OP_SUM_ROWS: return tcu_sum_rows(cs, d, cu_t(a));
    case TSR_OP_ARGSORT: return tcu_argsort(cs, d, cu_t(a), node->op_params[0] == TSR_SORT_DESC, (int)a->ne[0]);
    case TSR_OP_TOP_K: return tcu_argsort(cs, d, cu_t(a), 1, node->op_params[0]);
    case TSR_OP_FLASH_ATTN: {
        const tsr_tensor *mask = node->src[3];
        const tcu_tensor m = mask ? cu_t(mask) : d;
        return tcu_flash_attn(cs, d, cu_t(a), cu_t(b), cu_t(node->src[2]), mask ? &m : NULL,
                              tsr__get_f32_param(node, 0), s->c->n_sm, s->arena, s->arena_size);
    }
    default: return cudaErrorNotSupported;
    }
}

/* Whether node (rms_norm or norm) and the next one, m = node * w (a
 * layer's norm weight), run as one kernel: m F32 of node's shape with
 * contiguous rows, w F32; the norm's result is still written. */
static bool cu_fuse_norm_mul(const cu_dev *c, const tsr_tensor *node, const tsr_tensor *m) {
    if ((node->op != TSR_OP_RMS_NORM && node->op != TSR_OP_NORM) || m->op != TSR_OP_MUL || m->src[0] != node)
        return false;
    const tsr_tensor *w = m->src[1];
    if (!w || w->type != TSR_TYPE_F32 || m->type != TSR_TYPE_F32 || node->type != TSR_TYPE_F32 ||
        m->nb[0] != sizeof(float) || !cu_supports(&c->dev, m))
        return false;
    for (int i = 0; i < 4; i++)
        if (m->ne[i] != node->ne[i] || w->ne[i] <= 0 || node->ne[i] % w->ne[i] != 0)
            return false;
    return true;
}

/* Where the fused norm also writes m (its weighted result) as Q8_1: the
 * arena, when the node after m is a mat-vec with integer-dot weights that
 * reads m (contiguous, whole 32-value segments) and the arena already
 * holds its activations (nothing to grow); else NULL. */
static void *cu_norm_q8_1(const cu_stream *s, const tsr_tensor *m, tsr_tensor *const *rest, size_t n_rest) {
    if (!n_rest || !s->arena)
        return NULL;
    const tsr_tensor *mm = rest[0];
    if ((mm->op != TSR_OP_MUL_MAT && mm->op != TSR_OP_MUL_MAT_ID) || mm->src[1] != m ||
        !tcu_dot_q8_1_type((int)mm->src[0]->type) || !cu_is_contiguous(m) || m->ne[0] % 32 ||
        !cu_supports(&s->c->dev, mm))
        return NULL;
    if (mm->op == TSR_OP_MUL_MAT ? !cu_use_mmv(mm) : !cu_use_mmv_id(mm))
        return NULL;
    return cu_scratch_need(s->c, mm) <= s->arena_size ? s->arena : NULL;
}

/* The node after views from i (n_nodes when none). */
static size_t cu_next_op(tsr_tensor *const *nodes, size_t n_nodes, size_t i) {
    for (size_t j = i + 1; j < n_nodes; j++)
        if (nodes[j]->op != TSR_OP_NONE && nodes[j]->op != TSR_OP_VIEW)
            return j;
    return n_nodes;
}

/* Whether rope and sr (set_rows of the rotated keys into a float cache)
 * run as one kernel: rope's result [hd, n_head_kv, 1] is sr's source as
 * the cache writer permutes it ([hd, 1, n_head_kv]: one token's rows, one
 * per head, so no two rows meet), cache [hd, n_ctx, n_head_kv], one index. */
static bool cu_fuse_rope_set_rows(const cu_dev *c, const tsr_tensor *rope, const tsr_tensor *sr) {
    if (rope->op != TSR_OP_ROPE || sr->op != TSR_OP_SET_ROWS || !cu_supports(&c->dev, sr))
        return false;
    const tsr_tensor *src = sr->src[1], *idx = sr->src[2];
    return src && idx && src->data == rope->data && src->type == TSR_TYPE_F32 && rope->type == TSR_TYPE_F32 &&
           rope->ne[2] == 1 && rope->ne[3] == 1 && src->ne[0] == rope->ne[0] && src->ne[1] == 1 &&
           src->ne[2] == rope->ne[1] && src->ne[3] == 1 && src->nb[0] == rope->nb[0] && src->nb[2] == rope->nb[1] &&
           rope->nb[0] == sizeof(float) && cu_is_float(sr->type) && sr->ne[0] == rope->ne[0] &&
           sr->ne[2] == rope->ne[1] && idx->ne[0] == 1 && idx->ne[1] == 1 && idx->ne[2] == 1;
}

/* Launches the nodes' kernels on s->cs. */
static tsr_status cu_run_nodes(cu_stream *s, tsr_tensor *const *nodes, size_t n_nodes) {
    cu_dev *c = s->c;
    tsr_status st = TSR_OK;
    s->act_valid = false;
    for (size_t i = 0; st == TSR_OK && i < n_nodes; i++) {
        tsr_tensor *node = nodes[i];
        if (node->op == TSR_OP_NONE || node->op == TSR_OP_VIEW)
            continue;
        cu_act_forget(s, node);
        if (!cu_supports(&c->dev, node))
            return tsr__error(TSR_E_UNSUPPORTED, "%s: node '%s' (%s) has no CUDA kernel for its types", c->dev.name,
                              node->name, tsr__op_name(node->op));
        const size_t j = node->op == TSR_OP_MUL_MAT ? cu_next_op(nodes, n_nodes, i) : n_nodes;
        const size_t j2 = j < n_nodes ? cu_next_op(nodes, n_nodes, j) : n_nodes;
        if (j2 < n_nodes && cu_fuse_glu_pair(c, node, nodes[j], nodes[j2])) {
            cu_act_forget(s, nodes[j]);
            cu_act_forget(s, nodes[j2]);
            st = cu_mul_mat_glu(s, nodes[j2]);
            i = j2;
        } else if (node->op == TSR_OP_MUL_MAT) {
            tsr_tensor *nx = i + 1 < n_nodes ? nodes[i + 1] : NULL;
            bool fused = false;
            st = cu_mul_mat(s, node, nx, &fused);
            if (fused) {
                cu_act_forget(s, nx);
                i++;
            }
        } else if (node->op == TSR_OP_MUL_MAT_ID) {
            st = cu_mul_mat_id(s, node, i);
        } else if (node->op == TSR_OP_FLASH_ATTN && (st = cu_arena_grow(s, cu_scratch_need(c, node))) != TSR_OK) {
            break;
        } else if (node->op == TSR_OP_ROPE && cu_next_op(nodes, n_nodes, i) < n_nodes &&
                   cu_fuse_rope_set_rows(c, node, nodes[cu_next_op(nodes, n_nodes, i)])) {
            tsr_tensor *sr = nodes[i = cu_next_op(nodes, n_nodes, i)];
            cu_act_forget(s, sr);
            const tcu_tensor ff = node->src[2] ? cu_t(node->src[2]) : cu_t(node), cache = cu_t(sr),
                             idx = cu_t(sr->src[2]);
            const cudaError_t e = tcu_rope_set_rows(s->cs, cu_t(node), cu_t(node->src[0]), cu_t(node->src[1]),
                                                    node->src[2] ? &ff : NULL, node->op_params, &cache, &idx);
            if (e != cudaSuccess) {
                char call[96];
                snprintf(call, sizeof call, "the %s kernel of node '%.40s'", tsr__op_name(node->op), node->name);
                st = cu_fail(c, e, call);
            }
        } else if (i + 1 < n_nodes && cu_fuse_norm_mul(c, node, nodes[i + 1])) {
            tsr_tensor *m = nodes[++i];
            cu_act_forget(s, m);
            void *yq = cu_norm_q8_1(s, m, nodes + i + 1, n_nodes - i - 1);
            const cudaError_t e = tcu_norm_mul(s->cs, node->op == TSR_OP_RMS_NORM, cu_t(node), cu_t(node->src[0]),
                                               tsr__get_f32_param(node, 0), cu_t(m), cu_t(m->src[1]), yq);
            if (yq) { /* the arena holds m as Q8_1 now */
                s->act_valid = e == cudaSuccess;
                s->act_q8 = true;
                s->act_b = cu_t(m);
                s->act_bytes = cu_extent(m);
            }
            if (e != cudaSuccess) {
                char call[96];
                snprintf(call, sizeof call, "the %s kernel of node '%.40s'", tsr__op_name(node->op), node->name);
                st = cu_fail(c, e, call);
            }
        } else {
            const cudaError_t e = cu_launch(s, node);
            if (e != cudaSuccess) {
                char call[96];
                snprintf(call, sizeof call, "the %s kernel of node '%.40s'", tsr__op_name(node->op), node->name);
                st = cu_fail(c, e, call);
            }
        }
    }
    return st;
}

/* ---- CUDA graphs ------------------------------------------------------------------ */

/* Words per node of a compute's description: op and type, shape, strides,
 * address, parameters, and each source's address, type, shape, strides. */
#define CU_KEY_NODE (1 + 10 + TSR_MAX_OP_PARAMS / 2 + TSR_MAX_SRC * 10)

static uint64_t *cu_key_tensor(uint64_t *k, const tsr_tensor *t) {
    *k++ = (uint64_t)(uintptr_t)t->data;
    *k++ = (uint64_t)t->type;
    for (int i = 0; i < 4; i++) {
        *k++ = (uint64_t)t->ne[i];
        *k++ = (uint64_t)t->nb[i];
    }
    return k;
}

/* Describes the compute in s->key_new; its length in words, 0 when there
 * is no room for it (then no graph). */
static size_t cu_graph_key(cu_stream *s, tsr_tensor *const *nodes, size_t n_nodes) {
    if (n_nodes > (SIZE_MAX / sizeof(uint64_t) - 4) / CU_KEY_NODE)
        return 0;
    atomic_fetch_add_explicit(&cu_keys_built, 1, memory_order_relaxed);
    const size_t need = 4 + n_nodes * CU_KEY_NODE;
    if (need > s->key_new_cap) {
        uint64_t *a = tsr__malloc(need * sizeof *a);
        if (!a)
            return 0;
        tsr__free(s->key_new);
        s->key_new = a;
        s->key_new_cap = need;
    }
    uint64_t *k = s->key_new;
    *k++ = (uint64_t)n_nodes;
    *k++ = (uint64_t)(uintptr_t)s->arena;
    *k++ = (uint64_t)s->arena_size;
    *k++ = (uint64_t)(uintptr_t)s->status;
    for (size_t i = 0; i < n_nodes; i++) {
        const tsr_tensor *t = nodes[i];
        uint64_t *end = k + CU_KEY_NODE;
        *k++ = (uint64_t)t->op;
        k = cu_key_tensor(k, t);
        for (int j = 0; j < TSR_MAX_OP_PARAMS; j += 2)
            *k++ = (uint64_t)(uint32_t)t->op_params[j] | (uint64_t)(uint32_t)t->op_params[j + 1] << 32;
        for (int j = 0; j < TSR_MAX_SRC; j++)
            if (t->src[j])
                k = cu_key_tensor(k, t->src[j]);
            else
                for (int w = 0; w < 10; w++) *k++ = 0;
        while (k < end) *k++ = 0;
    }
    return (size_t)(k - s->key_new);
}

/* The entry whose description is s->key_new (n words); else the least
 * recently seen one, now holding that description (its graph dropped),
 * *fresh set. */
static cu_graph *cu_graph_find(cu_stream *s, size_t n, bool *fresh) {
    *fresh = false;
    cu_graph *old = &s->g[0];
    for (int i = 0; i < CU_GRAPHS; i++) {
        cu_graph *e = &s->g[i];
        if (e->n == n && !memcmp(e->key, s->key_new, n * sizeof *e->key)) {
            e->used = ++s->tick;
            return e;
        }
        if (e->used < old->used)
            old = e;
    }
    if (old->exec) {
        (void)cudaGraphExecDestroy(old->exec);
        old->exec = NULL;
    }
    if (n > old->cap) { /* the entry takes key_new's buffer, key_new the entry's */
        uint64_t *t = old->key;
        const size_t tc = old->cap;
        old->key = s->key_new;
        old->cap = s->key_new_cap;
        s->key_new = t;
        s->key_new_cap = tc;
    } else {
        memcpy(old->key, s->key_new, n * sizeof *old->key);
    }
    old->n = n;
    old->used = ++s->tick;
    old->no_capture = old->ids = false;
    *fresh = true;
    return old;
}

/* The nodes' addresses (tensor and data), hashed. */
static uint64_t cu_nodes_hash(tsr_tensor *const *nodes, size_t n) {
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ (uint64_t)(uintptr_t)nodes[i]) * 0x100000001b3u;
        h = (h ^ (uint64_t)(uintptr_t)nodes[i]->data) * 0x100000001b3u;
    }
    return h;
}

/* The entry that the same nodes found last, when no plan bound a tensor
 * since and the arena stayed (the scheduler kept its plan: a decode step
 * run again); NULL when the description has to be built and compared. */
static cu_graph *cu_graph_same(cu_stream *s, tsr_tensor *const *nodes, size_t n_nodes, uint64_t plan, uint64_t hash) {
    for (int i = 0; i < CU_GRAPHS; i++) {
        cu_graph *e = &s->g[i];
        if (e->n && e->sig_nodes == nodes && e->sig_n == n_nodes && e->sig_plan == plan && e->sig_hash == hash &&
            e->sig_arena == s->arena && e->sig_arena_size == s->arena_size) {
            e->used = ++s->tick;
            return e;
        }
    }
    return NULL;
}

/* Whether the nodes can be captured: no scratch to grow, no host work. */
static bool cu_capturable(const cu_stream *s, tsr_tensor *const *nodes, size_t n_nodes) {
    for (size_t i = 0; i < n_nodes; i++) {
        const tsr_tensor *t = nodes[i];
        if (t->op == TSR_OP_MUL_MAT_ID && !cu_use_mmv_id(t))
            return false;
        if (cu_scratch_need(s->c, t) > s->arena_size)
            return false;
    }
    return true;
}

/* Captures the nodes on s->cap into e->exec (nothing runs yet). */
static tsr_status cu_capture(cu_stream *s, cu_graph *e, tsr_tensor *const *nodes, size_t n_nodes) {
    cu_dev *c = s->c;
    /* cublasSetStream resets the handle's workspace: set ours again each time */
    CU_BLAS(c, "cublasSetStream", cublasSetStream(s->blas, s->cap));
    tsr_status st = TSR_OK;
    cublasStatus_t bs = cublasSetWorkspace(s->blas, s->ws, CU_WORKSPACE);
    if (bs != CUBLAS_STATUS_SUCCESS)
        st = cu_blas_fail(c, bs, "cublasSetWorkspace");
    cudaError_t err = cudaSuccess;
    if (st == TSR_OK && (err = cudaStreamBeginCapture(s->cap, cudaStreamCaptureModeThreadLocal)) != cudaSuccess)
        st = cu_fail(c, err, "cudaStreamBeginCapture");
    cudaGraph_t g = NULL;
    if (st == TSR_OK) {
        s->cs = s->cap;
        s->check_ids = false;
        const unsigned long long before = cu_tl_launches;
        st = cu_run_nodes(s, nodes, n_nodes);
        e->kernels = cu_tl_launches - before;
        cu_count_kernels(-(long long)e->kernels);
        s->cs = c->stream;
        e->ids = s->check_ids;
        s->check_ids = false;
        err = cudaStreamEndCapture(s->cap, &g);
        if (st == TSR_OK && err != cudaSuccess)
            st = cu_fail(c, err, "cudaStreamEndCapture");
    }
    bs = cublasSetStream(s->blas, c->stream);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetWorkspace(s->blas, s->ws, CU_WORKSPACE);
    if (bs != CUBLAS_STATUS_SUCCESS) { /* the handle is not back on the device's stream: no more graphs */
        s->graphs = false;
        if (st == TSR_OK)
            st = cu_blas_fail(c, bs, "cublasSetStream/cublasSetWorkspace");
    }
#if CUDART_VERSION >= 12000
    if (st == TSR_OK && (err = cudaGraphInstantiate(&e->exec, g, 0)) != cudaSuccess) {
#else /* CUDA 11.x: the error node and log buffer arguments */
    if (st == TSR_OK && (err = cudaGraphInstantiate(&e->exec, g, NULL, NULL, 0)) != cudaSuccess) {
#endif
        e->exec = NULL;
        st = cu_fail(c, err, "cudaGraphInstantiate");
    }
    if (g)
        (void)cudaGraphDestroy(g);
    (void)cudaGetLastError();
    if (st == TSR_OK) {
        char buf[32];
        tsr__log(TSR_LOG_DEBUG, "cuda: compute captured as a graph", 2, "device", c->dev.name, "nodes",
                 tsr__fmt(buf, sizeof buf, "%zu", n_nodes));
    }
    return st;
}

/* A compute whose description is one of the last CU_GRAPHS seen is
 * captured into a CUDA graph the second time and replayed after
 * (TSR_CUDA_GRAPHS=0: never), so the splits of one graph on the device take
 * turns; a compute the capture cannot take (scratch to grow, host work)
 * and a new one launch their kernels. */
static tsr_status cu_compute_nodes(tsr_stream *ts, tsr_tensor *const *nodes, size_t n_nodes) {
    cu_stream *s = (cu_stream *)ts;
    cu_dev *c = s->c;
    tsr_status st = cu_begin(c);
    if (st != TSR_OK)
        return st;
    if (s->check_ids) { /* a failed compute's record of ids: dropped */
        s->check_ids = false;
        CU_CHECK(c, "cudaMemsetAsync", cudaMemsetAsync(s->status, 0, 8 * sizeof(int), c->stream));
    }
    s->nodes = nodes;
    s->n_nodes = n_nodes;
    if (s->graphs) { /* the arena first: the description holds its address */
        size_t need = 0;
        for (size_t i = 0; i < n_nodes; i++) {
            const size_t x = cu_scratch_need(c, nodes[i]);
            need = x > need ? x : need;
        }
        if ((st = cu_arena_grow(s, need)) != TSR_OK)
            return st;
    }
    bool fresh = true;
    cu_graph *e = NULL;
    if (s->graphs) {
        const uint64_t plan = tsr__plan_count(), hash = cu_nodes_hash(nodes, n_nodes);
        if ((e = cu_graph_same(s, nodes, n_nodes, plan, hash)) != NULL) {
            fresh = false;
        } else {
            const size_t n = cu_graph_key(s, nodes, n_nodes);
            if (n && (e = cu_graph_find(s, n, &fresh)) != NULL) {
                e->sig_nodes = nodes;
                e->sig_n = n_nodes;
                e->sig_plan = plan;
                e->sig_hash = hash;
                e->sig_arena = s->arena;
                e->sig_arena_size = s->arena_size;
            }
        }
    }
    if (!e || fresh)
        return cu_run_nodes(s, nodes, n_nodes);
    if (!e->exec && !e->no_capture) {
        if (!cu_capturable(s, nodes, n_nodes) || cu_capture(s, e, nodes, n_nodes) != TSR_OK) {
            char buf[64];
            tsr__log(TSR_LOG_DEBUG, "cuda: compute not captured as a graph", 2, "device", c->dev.name, "nodes",
                     tsr__fmt(buf, sizeof buf, "%zu", n_nodes));
            e->no_capture = true; /* while its description is kept */
        }
        if (c->lost)
            return tsr__error(TSR_E_DEVICE, "%s: the device is lost after an earlier error (%s)", c->dev.name,
                              c->lost_why);
    }
    if (!e->exec)
        return cu_run_nodes(s, nodes, n_nodes);
    CU_CHECK(c, "cudaGraphLaunch", cudaGraphLaunch(e->exec, c->stream));
    cu_count_kernels((long long)e->kernels);
    s->check_ids = e->ids;
    return TSR_OK;
}

static tsr_status cu_compute(tsr_stream *ts, tsr_tensor *const *nodes, size_t n_nodes) {
    const unsigned long long before = cu_tl_launches;
    const tsr_status st = cu_compute_nodes(ts, nodes, n_nodes);
    atomic_store_explicit(&cu_last_launches, cu_tl_launches - before, memory_order_relaxed);
    atomic_fetch_add_explicit(&cu_computes, 1, memory_order_relaxed);
    return st;
}

static tsr_status cu_memory(const tsr_device *d, size_t *free_b, size_t *total) {
    cu_dev *c = d->impl;
    *free_b = *total = 0;
    tsr_status st = cu_begin(c);
    if (st != TSR_OK)
        return st;
    CU_CHECK(c, "cudaMemGetInfo", cudaMemGetInfo(free_b, total));
    return TSR_OK;
}

/* A stream's memory outside buffers once reserved for these nodes: the
 * cuBLAS workspace, the status words and the scratch arena (the largest
 * node's need; cu_reserve grows it to that). */
static size_t cu_stream_bytes(const tsr_device *d, tsr_tensor *const *nodes, size_t n_nodes) {
    const cu_dev *c = (const cu_dev *)d->impl;
    size_t need = 0;
    for (size_t i = 0; i < n_nodes; i++) {
        const size_t n = cu_scratch_need(c, nodes[i]);
        need = n > need ? n : need;
    }
    return (size_t)CU_WORKSPACE + CU_ALIGN + need;
}

static const tsr_device_iface cu_dev_iface = {cu_memory,  cu_supports, cu_stream_new,  cu_stream_free,
                                              cu_reserve, cu_compute,  cu_synchronize, cu_stream_bytes};

/* ---- enumeration ------------------------------------------------------------------ */

typedef struct cu_found {
    int ordinal;
    struct cudaDeviceProp prop;
} cu_found;

static size_t cu_enumerate(tsr_device **devs, size_t max) {
    int count = 0;
    char why[256];
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        if (e != cudaSuccess)
            snprintf(why, sizeof why, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
        else
            snprintf(why, sizeof why, "cudaGetDeviceCount found no device");
        (void)cudaGetLastError();
        tsr__log(TSR_LOG_INFO, "cuda: no CUDA device", 1, "reason", why);
        return 0;
    }
    if (count > CU_MAX)
        count = CU_MAX;
    cu_found found[CU_MAX];
    int n = 0;
    for (int i = 0; i < count; i++) {
        const cudaError_t pe = cudaGetDeviceProperties(&found[n].prop, i);
        if (pe != cudaSuccess) {
            snprintf(why, sizeof why, "device %d: cudaGetDeviceProperties: %s", i, cudaGetErrorName(pe));
            tsr__log(TSR_LOG_WARN, "cuda: device skipped", 1, "reason", why);
            (void)cudaGetLastError();
            continue;
        }
        found[n++].ordinal = i;
    }
    const tsr_device *host = tsr__host_device_early();
    for (int i = 0; i < n && cu_n < max && host; i++) {
        cu_dev *c = &cu_devs[cu_n];
        const struct cudaDeviceProp *p = &found[i].prop;
        memset(c, 0, sizeof *c);
        pthread_mutex_init(&c->lock, NULL);
        c->ordinal = found[i].ordinal;
        c->n_sm = p->multiProcessorCount > 0 ? p->multiProcessorCount : 1;
        snprintf(c->dev.name, sizeof c->dev.name, "CUDA%zu", cu_n);
        snprintf(c->dev.description, sizeof c->dev.description, "%.60s, %.1f GiB, compute %d.%d, PCI %04x:%02x:%02x.0",
                 p->name, p->totalGlobalMem / 1073741824.0, p->major, p->minor, (unsigned)p->pciDomainID,
                 (unsigned)p->pciBusID, (unsigned)p->pciDeviceID);
        c->dev.kind = TSR_DEVICE_GPU;
        c->dev.iface = &cu_dev_iface;
        c->dev.impl = c;
        c->dev.buft = &c->buft;
        c->dev.host_buft = &c->host_buft;
        c->buft = (tsr_buffer_type){&cu_buft_iface, "", &c->dev, CU_ALIGN, false, false, c};
        snprintf(c->buft.name, sizeof c->buft.name, "CUDA%zu", cu_n);
        c->host_buft = (tsr_buffer_type){&cu_host_buft_iface, "", &c->dev, CU_ALIGN, true, true, c};
        snprintf(c->host_buft.name, sizeof c->host_buft.name, "CUDA%zu_Host", cu_n);
        tsr__log(TSR_LOG_INFO, "cuda: device", 2, "name", c->dev.name, "description", c->dev.description);
        devs[cu_n] = &c->dev;
        cu_n++;
    }
    return cu_n;
}

/* TSR_PROFILE (set and not 0, as the core reads it): the launch counts at exit. */
static size_t cu_enumerate_prof(tsr_device **devs, size_t max) {
    const size_t n = cu_enumerate(devs, max);
    const char *e = getenv("TSR_PROFILE");
    if (n && e && *e && strcmp(e, "0"))
        atexit(cu_prof_print);
    return n;
}

static const tsr_device_reg cu_reg = {"cuda", cu_enumerate_prof, NULL};

TSR_MODULE_SERVICES_DEFINE

TSR_MODULE_EXPORT const tsr_device_module *TSR_MODULE_ENTRY(const tsr_module_services *svc) {
    static const tsr_device_module mod = TSR_DEVICE_MODULE_INIT(&cu_reg);
    if (!tsr__module_attach(svc))
        return NULL;
    return &mod;
}
