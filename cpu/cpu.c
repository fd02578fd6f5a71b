/*
 * cpu.c - the CPU backend: one device "CPU" (description = CPU model), its
 * host buffer type "CPU", streams (a persistent threadpool plus a work
 * buffer sized by reserve) and the op table (support, work-buffer size and
 * kernel of every op). job.c runs the nodes.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#endif
#include "cpu.h"

#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <unistd.h>

/* ---- host buffer type ------------------------------------------------------ */

static tsr_status host_alloc(tsr_buffer_type *bt, size_t size, void **base, void **handle) {
    size_t n = tsr__pad(size ? size : 1, bt->alignment);
    if (n < size)
        return tsr__error(TSR_E_NOMEM, "%s: cannot allocate %zu bytes: size overflows", bt->name, size);
    void *p = tsr__aligned_alloc(bt->alignment, n);
    if (!p)
        return tsr__error(TSR_E_NOMEM, "%s: cannot allocate %zu bytes of host memory", bt->name, size);
    *base = p;
    *handle = p;
    return TSR_OK;
}
static void host_free(tsr_buffer_type *bt, void *base, void *handle) {
    (void)bt;
    (void)handle;
    tsr__aligned_free(base);
}
static tsr_status host_set(tsr_buffer *buf, void *dst, const void *host, size_t size) {
    (void)buf;
    if (size)
        memcpy(dst, host, size);
    return TSR_OK;
}
static tsr_status host_get(tsr_buffer *buf, const void *src, void *host, size_t size) {
    (void)buf;
    if (size)
        memcpy(host, src, size);
    return TSR_OK;
}
static tsr_status host_memset(tsr_buffer *buf, void *dst, int value, size_t size) {
    (void)buf;
    if (size)
        memset(dst, value, size);
    return TSR_OK;
}
static tsr_status host_copy(tsr_buffer *db, void *dst, tsr_buffer *sb, const void *src, size_t size) {
    (void)db;
    (void)sb;
    if (size)
        memmove(dst, src, size);
    return TSR_OK;
}

/* The interleaved weights (repack.c) back as stored. */
static tsr_status host_to_stored(tsr_buffer *buf, tsr_tensor *t) {
    (void)buf;
    return tsr__il8_canonical(t);
}

const tsr_buft_iface tsr__cpu_buft_iface = {host_alloc,  host_free, host_set,       host_get,
                                            host_memset, host_copy, host_to_stored, NULL};

/* ---- the op table: support, work buffer and kernel of every op ------------------
 * What the CPU runs is stated here and nowhere else: the core's builders ask
 * the devices (graph/ops.c) and the scheduler moves to the CPU what another
 * device declines. Each entry: supports(node) with its sources' types and
 * layouts, the kernel, and the work-buffer bytes with nth threads (NULL: none). */

typedef struct cpu_op {
    bool (*supports)(const tsr_tensor *op);
    tsr_cpu_kernel_fn kernel;
    size_t (*work)(const tsr_tensor *node, int nth);
    /* The kernel has no barrier, shares no stream state (the dynamic
     * counter, the batched matmuls' conversion) and partitions only its own
     * scratch, so the node may run in a phase with others (plan_phases);
     * MUL_MAT only on the one-column path. */
    bool shares;
} cpu_op;

static bool is_float_type(tsr_type t) { return t == TSR_TYPE_F32 || t == TSR_TYPE_F16 || t == TSR_TYPE_BF16; }
static bool is_cpy_type(tsr_type t) { return is_float_type(t) || t == TSR_TYPE_I32; }
static bool is_f32(const tsr_tensor *t) { return t->type == TSR_TYPE_F32; }
static bool is_mask(const tsr_tensor *m) { return !m || m->type == TSR_TYPE_F32 || m->type == TSR_TYPE_F16; }

/* Types the quantized stores (cache writes, casts) write. */
static bool is_store_type(tsr_type t) {
    switch (t) {
    case TSR_TYPE_F32:
    case TSR_TYPE_F16:
    case TSR_TYPE_BF16:
    case TSR_TYPE_Q8_0:
    case TSR_TYPE_Q4_0:
    case TSR_TYPE_Q4_1:
    case TSR_TYPE_Q5_0:
    case TSR_TYPE_Q5_1: return true;
    default: return false;
    }
}

/* Conversions a copy may do: float to float or store type, q8_0 to those, any type to itself. */
static bool can_convert(tsr_type from, tsr_type to) {
    if (from == to)
        return from != TSR_TYPE_Q8_K;
    if (from == TSR_TYPE_I32 || to == TSR_TYPE_I32)
        return false;
    return (is_float_type(from) || from == TSR_TYPE_Q8_0) && (is_float_type(to) || is_store_type(to));
}

static bool supports_copy(const tsr_tensor *op, const tsr_tensor *src) {
    const tsr_cpu_kernels *k = tsr__cpu_kernels();
    if (src->type == op->type && !tsr_type_is_quantized(op->type))
        return tsr__type_traits(op->type) != NULL;
    if (!is_cpy_type(src->type) && !(tsr_type_is_quantized(src->type) && k->to_float[src->type]))
        return false;
    if (is_cpy_type(op->type))
        return true;
    return tsr_type_is_quantized(op->type) && k->from_float[op->type] && op->type != TSR_TYPE_Q8_1 &&
           op->type != TSR_TYPE_Q8_K && op->ne[0] % tsr_type_block_size(op->type) == 0 &&
           op->nb[0] == tsr_type_block_bytes(op->type);
}

static bool sup_leaf(const tsr_tensor *op) {
    (void)op;
    return true;
}
static bool sup_binary(const tsr_tensor *op) {
    return is_float_type(op->src[0]->type) && is_float_type(op->src[1]->type);
}
static bool sup_unary(const tsr_tensor *op) { return is_f32(op->src[0]); }
static bool sup_glu(const tsr_tensor *op) { return is_f32(op->src[0]) && is_f32(op->src[1]); }

static bool sup_mul_mat(const tsr_tensor *op) {
    const tsr_tensor *a = op->src[0];
    const bool weight_type = is_store_type(a->type) || a->type == TSR_TYPE_Q4_K || a->type == TSR_TYPE_Q5_K ||
                             a->type == TSR_TYPE_Q6_K; /* the weight types of the matmul kernels */
    if (!weight_type)
        return false;
    return tsr__cpu_kernels()->vec_dot[a->type] && is_f32(op->src[1]) && a->nb[0] == tsr_type_block_bytes(a->type);
}

/* The experts' weights: what mul_mat takes; ids I32. */
static bool sup_mul_mat_id(const tsr_tensor *op) { return sup_mul_mat(op) && op->src[2]->type == TSR_TYPE_I32; }

static bool sup_get_rows(const tsr_tensor *op) {
    const tsr_type_traits *tr = tsr__type_traits(op->src[0]->type);
    return tr && tr->to_float && tsr__cpu_kernels()->to_float[op->src[0]->type] && op->src[1]->type == TSR_TYPE_I32;
}

static bool sup_set_rows(const tsr_tensor *op) {
    return is_store_type(op->type) && supports_copy(op, op->src[1]) && is_f32(op->src[1]) &&
           (op->src[2]->type == TSR_TYPE_I32 || op->src[2]->type == TSR_TYPE_I64);
}

static bool sup_rope(const tsr_tensor *op) {
    return is_f32(op->src[0]) && op->src[1]->type == TSR_TYPE_I32 && (!op->src[2] || is_f32(op->src[2]));
}

static bool sup_softmax(const tsr_tensor *op) { return is_f32(op->src[0]) && is_mask(op->src[1]); }

static bool sup_concat(const tsr_tensor *op) {
    return op->src[0]->type == op->src[1]->type && is_cpy_type(op->src[0]->type);
}

static bool sup_cpy(const tsr_tensor *op) {
    return can_convert(op->src[0]->type, op->type) && supports_copy(op, op->src[0]);
}

static bool is_kv_type(const tsr_tensor *t) {
    return (t->type == TSR_TYPE_F32 || t->type == TSR_TYPE_F16 || t->type == TSR_TYPE_Q8_0) &&
           (t->nb[0] == 0 || t->nb[0] == tsr_type_block_bytes(t->type)); /* nb[0] 0: a type-only probe */
}

static bool sup_flash_attn(const tsr_tensor *op) {
    return is_f32(op->src[0]) && is_kv_type(op->src[1]) && is_kv_type(op->src[2]) && is_mask(op->src[3]);
}

static size_t work_rope(const tsr_tensor *node, int nth) {
    return (size_t)nth * tsr__pad(((size_t)node->op_params[TSR_ROPE_P_N_DIMS] + 2) * sizeof(float), TSR_ALIGN);
}
static size_t work_set_rows(const tsr_tensor *node, int nth) {
    return (size_t)nth * tsr__pad((size_t)node->src[1]->ne[0] * sizeof(float), TSR_ALIGN);
}
static size_t work_cpy(const tsr_tensor *node, int nth) {
    return (size_t)nth * tsr__pad((size_t)(node->ne[0] + node->src[0]->ne[0]) * sizeof(float), TSR_ALIGN);
}

static size_t work_sort(const tsr_tensor *node, int nth) { return tsr__cpu_argsort_work(node, nth); }

static const cpu_op cpu_ops[] = {
    [TSR_OP_NONE] = {sup_leaf, NULL, NULL},
    [TSR_OP_VIEW] = {sup_leaf, NULL, NULL},
    [TSR_OP_ADD] = {sup_binary, tsr__cpu_op_binary, NULL, true},
    [TSR_OP_SUB] = {sup_binary, tsr__cpu_op_binary, NULL, true},
    [TSR_OP_MUL] = {sup_binary, tsr__cpu_op_binary, NULL, true},
    [TSR_OP_DIV] = {sup_binary, tsr__cpu_op_binary, NULL, true},
    [TSR_OP_SCALE] = {sup_unary, tsr__cpu_op_scale, NULL, true},
    [TSR_OP_MUL_MAT] = {sup_mul_mat, tsr__cpu_op_mul_mat, tsr__cpu_mul_mat_work, true},
    [TSR_OP_GET_ROWS] = {sup_get_rows, tsr__cpu_op_get_rows, NULL, true},
    [TSR_OP_SET_ROWS] = {sup_set_rows, tsr__cpu_op_set_rows, work_set_rows, true},
    [TSR_OP_RMS_NORM] = {sup_unary, tsr__cpu_op_norm, NULL, true},
    [TSR_OP_NORM] = {sup_unary, tsr__cpu_op_norm, NULL, true},
    [TSR_OP_ROPE] = {sup_rope, tsr__cpu_op_rope, work_rope, true},
    [TSR_OP_SOFTMAX] = {sup_softmax, tsr__cpu_op_softmax, NULL, true},
    [TSR_OP_SILU] = {sup_unary, tsr__cpu_op_unary, NULL, true},
    [TSR_OP_GELU] = {sup_unary, tsr__cpu_op_unary, NULL, true},
    [TSR_OP_SWIGLU] = {sup_glu, tsr__cpu_op_glu, NULL, true},
    [TSR_OP_GEGLU] = {sup_glu, tsr__cpu_op_glu, NULL, true},
    [TSR_OP_CONCAT] = {sup_concat, tsr__cpu_op_concat, NULL, true},
    [TSR_OP_ARGMAX] = {sup_unary, tsr__cpu_op_argmax, NULL, true},
    [TSR_OP_CPY] = {sup_cpy, tsr__cpu_op_cpy, work_cpy, true},
    [TSR_OP_CONT] = {sup_cpy, tsr__cpu_op_cpy, work_cpy, true},
    [TSR_OP_FLASH_ATTN] = {sup_flash_attn, tsr__cpu_op_flash_attn, tsr__cpu_flash_attn_work, false},
    [TSR_OP_MUL_MAT_ID] = {sup_mul_mat_id, tsr__cpu_op_mul_mat_id, tsr__cpu_mul_mat_id_work, false},
    [TSR_OP_ARGSORT] = {sup_unary, tsr__cpu_op_argsort, work_sort, true},
    [TSR_OP_TOP_K] = {sup_unary, tsr__cpu_op_argsort, work_sort, true},
    [TSR_OP_SIGMOID] = {sup_unary, tsr__cpu_op_unary, NULL, true},
    [TSR_OP_SUM_ROWS] = {sup_unary, tsr__cpu_op_sum_rows, NULL, true},
};
/* A new op in TSR_OPS stops the build here until it has an entry above. */
_Static_assert(TSR_OP_COUNT == 28, "cpu/cpu.c: give the new op an entry in cpu_ops");
_Static_assert(sizeof cpu_ops / sizeof *cpu_ops == TSR_OP_COUNT, "cpu/cpu.c: one cpu_ops entry per op");

size_t tsr__cpu_ops_missing(tsr_op *missing, size_t max) {
    size_t n = 0;
    for (int op = 0; op < TSR_OP_COUNT; op++) {
        const cpu_op *e = &cpu_ops[op];
        bool leaf = op == TSR_OP_NONE || op == TSR_OP_VIEW;
        if (!e->supports || (!leaf && !e->kernel)) {
            if (n < max)
                missing[n] = (tsr_op)op;
            n++;
        }
    }
    return n;
}

bool tsr__cpu_supports_op(const tsr_tensor *op) {
    return (unsigned)op->op < TSR_OP_COUNT && cpu_ops[op->op].supports && cpu_ops[op->op].supports(op);
}

size_t tsr__cpu_work_size(const tsr_tensor *node, int nth) {
    if ((unsigned)node->op >= TSR_OP_COUNT || !cpu_ops[node->op].work)
        return 0;
    return cpu_ops[node->op].work(node, nth);
}

tsr_cpu_kernel_fn tsr__cpu_op_kernel(tsr_op op) { return (unsigned)op < TSR_OP_COUNT ? cpu_ops[op].kernel : NULL; }

bool tsr__cpu_op_shares(tsr_op op) { return (unsigned)op < TSR_OP_COUNT && cpu_ops[op].shares; }

/* ---- streams -------------------------------------------------------------------- */

/* The cores this process may run on: the online CPUs, fewer when the
 * affinity mask (taskset, cgroup cpusets) allows fewer. */
int tsr__cpu_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    int cores = n > 0 ? (int)n : 1;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int a = CPU_COUNT(&set);
        if (a > 0 && a < cores)
            cores = a;
    }
    return cores;
}

/* Threads beyond the cores only wait for each other at every barrier (one
 * token/s instead of a hundred): more than the cores are clamped to them,
 * and that is logged. */
int tsr__cpu_threads(int requested) {
    const int cores = tsr__cpu_cores();
    if (requested <= 0)
        return cores;
    if (requested > cores) {
        char a[16], b[16], line[96];
        snprintf(line, sizeof line, "cpu: n_threads %d > %d cores: using %d", requested, cores, cores);
        tsr__log(TSR_LOG_WARN, line, 2, "n_threads", tsr__fmt(a, sizeof a, "%d", requested), "cores",
                 tsr__fmt(b, sizeof b, "%d", cores));
        return cores;
    }
    return requested;
}

tsr_status tsr__cpu_stream_new(tsr_device *d, int n_threads, tsr_stream **out) {
    *out = NULL;
    if (n_threads < 0)
        return tsr__error(TSR_E_INVALID, "%s: n_threads must be >= 0, found %d", d ? d->name : "cpu", n_threads);
    n_threads = tsr__cpu_threads(n_threads);
    tsr_stream *s = tsr__calloc(1, sizeof *s);
    if (!s)
        return tsr__error(TSR_E_NOMEM, "cpu: out of memory creating a stream");
    tsr_status st = tsr__tp_new(n_threads, &s->tp);
    if (st != TSR_OK) {
        tsr__free(s);
        return st;
    }
    const size_t n_claims = (size_t)n_threads * TSR_CPU_PHASE_MAX;
    s->claims = tsr__aligned_alloc(TSR_ALIGN, n_claims * sizeof *s->claims);
    if (!s->claims) {
        tsr__tp_free(s->tp);
        tsr__free(s);
        return tsr__error(TSR_E_NOMEM, "cpu: out of memory creating a stream");
    }
    for (size_t t = 0; t < n_claims; t++) atomic_init(&s->claims[t].w, 0);
    s->seq = 1; /* claims start at sequence 0: stale */
    s->device = d;
    s->n_threads = n_threads;
    s->k = tsr__cpu_kernels();
    const char *rp = getenv("TSR_CPU_REPACK");
    s->repack = !(rp && strcmp(rp, "0") == 0);
    const char *ph = getenv("TSR_CPU_PHASES");
    s->phases = !(ph && strcmp(ph, "0") == 0);
    *out = s;
    return TSR_OK;
}

void tsr__cpu_stream_free(tsr_stream *s) {
    if (!s)
        return;
    tsr__tp_free(s->tp);
    tsr__aligned_free(s->claims);
    tsr__aligned_free(s->work);
    tsr__free(s->plan);
    tsr__free(s);
}

/* ---- the device ----------------------------------------------------------------- */

static tsr_status cpu_memory(const tsr_device *d, size_t *free_, size_t *total) {
    (void)d;
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    size_t tot = pages > 0 && psize > 0 ? (size_t)pages * (size_t)psize : 0, avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
                avail = (size_t)kb * 1024;
        fclose(f);
    }
    if (!avail) {
        long av = sysconf(_SC_AVPHYS_PAGES);
        avail = av > 0 && psize > 0 ? (size_t)av * (size_t)psize : tot;
    }
    if (free_)
        *free_ = avail;
    if (total)
        *total = tot;
    return TSR_OK;
}

static bool cpu_supports(const tsr_device *d, const tsr_tensor *op) {
    (void)d;
    return tsr__cpu_supports_op(op);
}
static tsr_status cpu_sync(tsr_stream *s) {
    (void)s;
    return TSR_OK;
}

static const tsr_device_iface cpu_dev_iface = {
    cpu_memory, cpu_supports, tsr__cpu_stream_new, tsr__cpu_stream_free, tsr__cpu_reserve, tsr__cpu_run_nodes,
    cpu_sync,   NULL};

static tsr_device cpu_device;
static tsr_buffer_type cpu_buft;

static void cpu_model_name(char *out, size_t size) {
    snprintf(out, size, "CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || !colon)
            continue;
        colon++;
        while (*colon == ' ' || *colon == '\t') colon++;
        colon[strcspn(colon, "\n")] = '\0';
        snprintf(out, size, "%s", colon);
        break;
    }
    fclose(f);
}

static size_t cpu_enumerate(tsr_device **devs, size_t max) {
    if (max < 1)
        return 0;
    if (!cpu_device.iface) { /* the registry enumerates once, under its lock */
        cpu_buft.iface = &tsr__cpu_buft_iface;
        snprintf(cpu_buft.name, sizeof cpu_buft.name, "CPU");
        cpu_buft.device = &cpu_device;
        cpu_buft.alignment = TSR_ALIGN;
        cpu_buft.is_host = true;
        snprintf(cpu_device.name, sizeof cpu_device.name, "CPU");
        cpu_model_name(cpu_device.description, sizeof cpu_device.description);
        cpu_device.kind = TSR_DEVICE_CPU;
        cpu_device.buft = &cpu_buft;
        cpu_device.host_buft = NULL;
        cpu_device.iface = &cpu_dev_iface;
    }
    devs[0] = &cpu_device;
    return 1;
}

static const tsr_device_reg cpu_reg = {"cpu", cpu_enumerate, tsr__cpu_features_string};

const tsr_device_reg *tsr__cpu_device_reg(void) { return &cpu_reg; }
