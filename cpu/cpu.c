/*
 * cpu.c - the CPU backend: one device "CPU" (description = CPU model), its
 * host buffer type "CPU", streams (a persistent threadpool plus a work
 * buffer sized by reserve), op support, and the graph runner that executes
 * nodes in order, every node split over all threads, with a barrier after
 * each phase: neighbouring nodes independent of each other share one
 * (plan_phases).
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

const tsr_buft_iface tsr__cpu_buft_iface = {host_alloc, host_free, host_set, host_get, host_memset, host_copy};

/* ---- the op table: support, work buffer and kernel of every op ------------------
 * What the CPU runs is stated here and nowhere else: the core's builders ask
 * the devices (graph/ops.c) and the scheduler moves to the CPU what another
 * device declines. Each entry: supports(node) with its sources' types and
 * layouts, the kernel, and the work-buffer bytes with nth threads (NULL: none). */

typedef void (*kernel_fn)(const tsr_compute_params *p, tsr_tensor *dst);

typedef struct cpu_op {
    bool (*supports)(const tsr_tensor *op);
    kernel_fn kernel;
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

static tsr_status ensure_work(tsr_stream *s, size_t need) {
    if (need <= s->work_size)
        return TSR_OK;
    void *w = tsr__aligned_alloc(TSR_ALIGN, tsr__pad(need, TSR_ALIGN));
    if (!w)
        return tsr__error(TSR_E_NOMEM, "cpu: cannot allocate %zu bytes of work buffer", need);
    tsr__aligned_free(s->work);
    s->work = w;
    s->work_size = need;
    return TSR_OK;
}

static kernel_fn kernel_of(tsr_op op) { return (unsigned)op < TSR_OP_COUNT ? cpu_ops[op].kernel : NULL; }

/* Whether the job runs node (leafs, views and empty results do not). */
static bool node_runs(const tsr_tensor *node) { return kernel_of(node->op) && tsr__nelements(node) != 0; }

static bool node_shares(const tsr_stream *s, const tsr_tensor *node) {
    if (!s->phases || !cpu_ops[node->op].shares)
        return false;
    if (node->op == TSR_OP_MUL_MAT) /* (an empty sum is a memset by thread 0) */
        return node->src[0]->ne[0] != 0 && tsr__cpu_mul_mat_gemv(s->k, node, NULL);
    return true;
}

static bool overlap(const tsr_tensor *a, const tsr_tensor *b) {
    if (!a || !b || !a->data || !b->data)
        return false;
    const char *alo = a->data, *blo = b->data;
    return alo < blo + tsr__nbytes(b) && blo < alo + tsr__nbytes(a);
}

/* Whether x and y may not run at once: one writes bytes the other reads or
 * writes (a node writes only its own bytes; views and sources are spans). */
static bool conflict(const tsr_tensor *x, const tsr_tensor *y) {
    if (overlap(x, y))
        return true;
    for (int j = 0; j < TSR_MAX_SRC; j++)
        if (overlap(x, y->src[j]) || overlap(y, x->src[j]))
            return true;
    return false;
}

/* Ops whose kernel (ops.c) gives thread ith the rows tsr__cpu_split(nrows
 * of dst) gives it, and computes a row of dst from the same row (i1, i2,
 * i3) of each source of dst's shape, nothing else. */
static bool row_op(const tsr_tensor *node) {
    switch (node->op) {
    case TSR_OP_ADD:
    case TSR_OP_SUB:
    case TSR_OP_MUL:
    case TSR_OP_DIV:
    case TSR_OP_SCALE:
    case TSR_OP_RMS_NORM:
    case TSR_OP_NORM: return true;
    default: return false;
    }
}

/* a and b overlapping are the same contiguous bytes laid out alike, rows of
 * the shape `rows` (dims 1-3) of the ops that read or write them. */
static bool same_rows(const tsr_tensor *a, const tsr_tensor *b, const tsr_tensor *rows) {
    if (a->data != b->data || a->type != b->type || !tsr__is_contiguous(a))
        return false;
    for (int d = 0; d < 4; d++)
        if (a->ne[d] != b->ne[d] || a->nb[d] != b->nb[d] || (d > 0 && a->ne[d] != rows->ne[d]))
            return false;
    return true;
}

/* Row ops x and y (x after y) of the same rows may share a phase despite
 * touching each other's bytes when every such touch is of the same rows
 * (same_rows): each thread then reads and writes only its own rows in
 * both, in program order (a norm and the multiply by its weights in place,
 * the residual add before them). */
static bool rows_aligned(const tsr_tensor *x, const tsr_tensor *y) {
    if (!row_op(x) || !row_op(y))
        return false;
    for (int d = 1; d < 4; d++)
        if (x->ne[d] != y->ne[d])
            return false;
    if (overlap(x, y) && !same_rows(x, y, x))
        return false;
    for (int j = 0; j < TSR_MAX_SRC; j++) {
        if (overlap(x->src[j], y) && !same_rows(x->src[j], y, x))
            return false;
        if (overlap(x, y->src[j]) && !same_rows(x, y->src[j], x))
            return false;
    }
    return true;
}

/* The job's phases (s->plan) and its work buffer: each phase's nodes'
 * scratch one after the other from offset 0 (a one-column matmul of the
 * activations an earlier one of the phase converted the same way shares
 * that one's: each thread converted the row there already), then, at
 * *conv_off, the batched matmuls' converted activations. Greedy: a node
 * joins the phase before it when it and every node there share
 * (node_shares), it conflicts with none of them (or only row by row:
 * rows_aligned) and the phase has room;
 * nodes the job skips change nothing. Returns the bytes, or 0 with
 * *conv_off = SIZE_MAX when the plan could not be allocated. */
static size_t plan_phases(tsr_stream *s, tsr_tensor *const *nodes, size_t n, size_t *conv_off) {
    if (!TSR_GROW(s->plan, s->cap_plan, n ? n : 1)) {
        *conv_off = SIZE_MAX;
        return 0;
    }
    size_t need = 0, conv = 0, work = 0, member[TSR_CPU_PHASE_MAX];
    int nm = 0;
    bool sharing = false;
    for (size_t i = 0; i < n; i++) {
        tsr_tensor *node = nodes[i];
        s->plan[i] = (tsr_cpu_node_plan){0, 0, false, false};
        if (!node_runs(node))
            continue;
        size_t w = tsr__pad(tsr__cpu_work_size(node, s->n_threads), TSR_ALIGN), c;
        if (node->op == TSR_OP_MUL_MAT && (c = tsr__cpu_mul_mat_conv(node)) > conv)
            conv = c;
        const bool sh = node_shares(s, node);
        bool join = nm > 0 && nm < TSR_CPU_PHASE_MAX && sh && sharing;
        for (int m = 0; join && m < nm; m++)
            join = !conflict(node, nodes[member[m]]) || rows_aligned(node, nodes[member[m]]);
        if (!join && nm > 0) { /* the phase before ends */
            s->plan[member[nm - 1]].barrier = true;
            need = work > need ? work : need;
            nm = 0;
            work = 0;
        }
        if (nm == 0)
            sharing = sh;
        tsr_cpu_node_plan *pl = &s->plan[i];
        pl->slot = (uint8_t)nm;
        pl->woff = work;
        tsr_type dt, dm;
        if (sh && node->op == TSR_OP_MUL_MAT && tsr__cpu_mul_mat_gemv(s->k, node, &dt))
            for (int m = nm - 1; m >= 0; m--) {
                const tsr_tensor *o = nodes[member[m]];
                if (o->op == TSR_OP_MUL_MAT && o->src[1] == node->src[1] && tsr__cpu_mul_mat_gemv(s->k, o, &dm) &&
                    dm == dt && !s->plan[member[m]].conv_ready) {
                    pl->woff = s->plan[member[m]].woff;
                    pl->conv_ready = true;
                    break;
                }
            }
        if (!pl->conv_ready)
            work += w;
        member[nm++] = i;
    }
    if (nm > 0) {
        s->plan[member[nm - 1]].barrier = true;
        need = work > need ? work : need;
    }
    *conv_off = tsr__pad(need, TSR_ALIGN);
    return *conv_off + conv;
}

static uint64_t nodes_hash(tsr_tensor *const *nodes, size_t n) {
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ (uint64_t)(uintptr_t)nodes[i]) * 0x100000001b3u;
        h = (h ^ (uint64_t)(uintptr_t)nodes[i]->data) * 0x100000001b3u;
    }
    return h;
}

/* Whether the stream's plan is of these nodes (plan_of). */
static bool plan_is_of(const tsr_stream *s, tsr_tensor *const *nodes, size_t n) {
    return s->plan_n == n && s->plan_nodes == nodes && s->plan_epoch == tsr__plan_count() &&
           s->plan_hash == nodes_hash(nodes, n);
}

/* plan_phases, or its last plan when the job is the same nodes again: the
 * same array and count, no graph planned by any scheduler since (tensors
 * never change once made; only a plan binds them elsewhere), and the same
 * nodes at the same addresses (a caller reusing an array). A decode step
 * run on the scheduler's last plan takes about 1 us here instead of 80. */
static size_t plan_of(tsr_stream *s, tsr_tensor *const *nodes, size_t n, size_t *conv_off) {
    if (s->plan_n && plan_is_of(s, nodes, n)) {
        *conv_off = s->plan_conv_off;
        return s->plan_need;
    }
    s->plan_n = 0;
    s->plan_prepared = false;
    const size_t need = plan_phases(s, nodes, n, conv_off);
    if (*conv_off != SIZE_MAX) {
        s->plan_nodes = nodes;
        s->plan_n = n;
        s->plan_epoch = tsr__plan_count();
        s->plan_hash = nodes_hash(nodes, n);
        s->plan_need = need;
        s->plan_conv_off = *conv_off;
    }
    return need;
}

tsr_status tsr__cpu_reserve(tsr_stream *s, tsr_tensor *const *nodes, size_t n) {
    size_t conv_off, need = plan_of(s, nodes, n, &conv_off);
    if (conv_off == SIZE_MAX)
        return tsr__error(TSR_E_NOMEM, "cpu: out of host memory planning %zu nodes", n);
    return ensure_work(s, need);
}

int64_t tsr__cpu_next_task(tsr_stream *s, uint64_t seq, int nth) {
    const uint64_t tag = seq & ((UINT64_C(1) << 40) - 1);
    uint64_t w = atomic_load_explicit(&s->tagged, memory_order_relaxed);
    for (;;) {
        const uint64_t c = (w >> 24) == tag ? (w & (uint64_t)TSR_CPU_TAGGED_MAX) : (uint64_t)nth;
        if (c >= (uint64_t)TSR_CPU_TAGGED_MAX)
            return TSR_CPU_TAGGED_MAX;
        if (atomic_compare_exchange_weak_explicit(&s->tagged, &w, tag << 24 | (c + 1), memory_order_relaxed,
                                                  memory_order_relaxed))
            return (int64_t)c;
    }
}

void tsr__cpu_fail(tsr_stream *s, tsr_status st, const char *fmt, ...) {
    int expected = TSR_OK;
    if (!atomic_compare_exchange_strong(&s->error, &expected, (int)TSR_E_DEVICE))
        return; /* an earlier failure wins */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->error_msg, sizeof s->error_msg, fmt, ap);
    va_end(ap);
    atomic_store(&s->error, (int)st);
}

/* Prefetch at the barriers: a thread that waits requests the rows it will
 * read first in the next one-column matmul (within PF_NODES nodes), at most
 * PF_BYTES of them, so that memory is read while threads wait. */
#define PF_NODES 16
#define PF_BYTES (192 << 10)

static void next_prefetch(const tsr_stream *s, size_t i, int ith, int nth, size_t *target, tsr_prefetch *pf) {
    if (*target > i && *target < s->n_nodes)
        return; /* still prefetching for a node ahead */
    pf->cur = pf->end = NULL;
    *target = s->n_nodes;
    for (size_t j = i + 1; j < s->n_nodes && j <= i + PF_NODES; j++) {
        const tsr_tensor *n = s->nodes[j];
        if (n->op != TSR_OP_MUL_MAT || tsr__nelements(n) == 0)
            continue;
        if (tsr__cpu_mul_mat_rows(s->k, n, ith, nth, pf)) {
            if (pf->end - pf->cur > PF_BYTES)
                pf->end = pf->cur + PF_BYTES;
            *target = j;
        }
        return;
    }
}

/* The job every thread runs: all nodes, a barrier after each phase. */
static void run_job(void *arg, int ith, int nth) {
    tsr_stream *s = arg;
    tsr_compute_params p = {ith, nth, 0, 0, false, s->work, s->work_size, s, s->k};
    tsr_prefetch pf = {NULL, NULL};
    size_t target = 0;
    for (size_t i = 0; i < s->n_nodes; i++) {
        tsr_tensor *node = s->nodes[i];
        if (!node_runs(node))
            continue;
        const tsr_cpu_node_plan *pl = &s->plan[i];
        const int64_t t0 = s->prof ? tsr__prof_now() : 0;
        p.seq = s->seq + i;
        p.slot = pl->slot;
        p.conv_ready = pl->conv_ready;
        p.work = (char *)s->work + pl->woff;
        p.work_size = s->work_size - pl->woff;
        if (node->op == TSR_OP_MUL_MAT && node->src[0]->ne[0] == 0) {
            if (ith == 0)
                memset(node->data, 0, tsr__nbytes(node)); /* empty sums */
        } else {
            kernel_of(node->op)(&p, node);
        }
        if (!pl->barrier) { /* the phase goes on */
            if (s->prof)
                tsr__prof_add(TSR_PROF_OP0 + (int)node->op, tsr__prof_now() - t0);
            continue;
        }
        if (nth > 1)
            next_prefetch(s, i, ith, nth, &target, &pf);
        if (s->prof) {
            const int64_t t1 = tsr__prof_now();
            tsr__tp_barrier_pf(s->tp, &pf);
            tsr__prof_add(TSR_PROF_OP0 + (int)node->op, t1 - t0);
            tsr__prof_add(TSR_PROF_BARRIER, tsr__prof_now() - t1);
        } else {
            tsr__tp_barrier_pf(s->tp, &pf);
        }
    }
}

/* ---- weights in the 8-row interleaved layout (libtensr/quant/repack.c) ----
 * Before a job: a weight that the job uses otherwise than as src0 of a
 * matmul into float rows or of a gather (get_rows, as a tied embedding
 * is), or through a view, goes back to its stored layout for good; then
 * every weight that is src0 of such a matmul and can take the interleaved
 * layout takes it, once (decode's kernels read it faster: avx2/gemv.c).
 * Uses on other devices and reads of its bytes are the core's to handle
 * (tsr__il8_canonical). TSR_CPU_REPACK=0 turns it off; kernel tables
 * without interleaved kernels never start it. */
static bool il8_direct_use(const tsr_tensor *node, int j, const tsr_tensor *src) {
    if (j != 0 || src->view_src)
        return false;
    if (node->op == TSR_OP_GET_ROWS) /* rows gathered block by block (ops.c), 1-D indices */
        return node->src[1] && node->src[1]->ne[1] == 1 && node->src[1]->ne[2] == 1 && node->src[1]->ne[3] == 1;
    return node->op == TSR_OP_MUL_MAT && node->nb[0] == sizeof(float);
}

/* The weights to rearrange, on all the stream's threads: each thread its
 * share of every weight's 8-row groups, through its own copy of a group. */
typedef struct il8_job {
    tsr_tensor **ts;
    size_t n;
    char *tmp;    /* n_threads copies of the largest group */
    size_t group; /* bytes of the largest group */
} il8_job;

static void il8_run(void *arg, int ith, int nth) {
    const il8_job *j = arg;
    for (size_t i = 0; i < j->n; i++) {
        int64_t g0, g1;
        tsr__cpu_split(j->ts[i]->ne[1] / 8, ith, nth, &g0, &g1);
        tsr__il8_groups(j->ts[i], g0, g1, true, j->tmp + (size_t)ith * j->group);
    }
}

/* Whether this stream's matmuls read weights of type t interleaved. */
static bool il8_reads(const tsr_stream *s, tsr_type t) { return s->repack && s->k->gemv_il8[t] && s->k->gemm_il8[t]; }

static tsr_status il8_prepare(tsr_stream *s, tsr_tensor *const *nodes, size_t n) {
    /* Always: another stream (or an earlier setting) may have interleaved
     * a weight this job reads otherwise. */
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < TSR_MAX_SRC; j++) {
            tsr_tensor *src = nodes[i]->src[j], *root = src;
            if (!src)
                continue;
            while (root->view_src) root = root->view_src;
            if (!(root->flags & TSR_FLAG_WEIGHT) || !tsr__il8_type(root->type))
                continue;
            if (il8_direct_use(nodes[i], j, src) &&
                (nodes[i]->op != TSR_OP_MUL_MAT || !(root->flags & TSR_FLAG_IL8) || il8_reads(s, root->type)))
                continue;
            if (root->flags & TSR_FLAG_IL8) {
                tsr_status st = tsr__il8_canonical(root); /* (sets TSR_FLAG_NOREPACK) */
                if (st != TSR_OK)
                    return st;
            } else if (!il8_direct_use(nodes[i], j, src)) {
                root->flags |= TSR_FLAG_NOREPACK;
            }
        }
    if (!s->repack)
        return TSR_OK;
    il8_job job = {NULL, 0, NULL, 0};
    for (size_t i = 0; i < n; i++) {
        tsr_tensor *w = nodes[i]->src[0];
        if (nodes[i]->op != TSR_OP_MUL_MAT || !w || !il8_direct_use(nodes[i], 0, w) ||
            (w->flags & (TSR_FLAG_IL8 | TSR_FLAG_NOREPACK)) != 0 || !(w->flags & TSR_FLAG_WEIGHT) || !w->buffer ||
            w->buffer->buft->iface != &tsr__cpu_buft_iface || !il8_reads(s, w->type) || !tsr__il8_fits(w))
            continue;
        if (!job.ts && !(job.ts = tsr__malloc(n * sizeof *job.ts)))
            return TSR_OK;        /* (out of memory: the weights stay as they are) */
        w->flags |= TSR_FLAG_IL8; /* (marks it taken; the job rearranges it) */
        job.ts[job.n++] = w;
        if (8 * w->nb[1] > job.group)
            job.group = 8 * w->nb[1];
    }
    if (job.n && (job.tmp = tsr__malloc((size_t)s->n_threads * job.group)) != NULL)
        tsr__tp_run(s->tp, il8_run, &job);
    for (size_t i = 0; !job.tmp && i < job.n; i++) job.ts[i]->flags &= ~(uint32_t)TSR_FLAG_IL8; /* not done */
    tsr__free(job.tmp);
    tsr__free(job.ts);
    return TSR_OK;
}

/* The job's checks, plan, work buffer and weights, skipped for the nodes
 * of the job before run again (plan_of; s->plan_prepared): every op has a
 * kernel, and il8_prepare changes nothing the second time. A weight's
 * layout only ever goes back to stored for good after a job of these
 * nodes was prepared (another stream, a read: TSR_FLAG_NOREPACK), and the
 * matmuls read each weight by its flag, so such a change costs speed,
 * never a result. */
static tsr_status prepare(tsr_stream *s, tsr_tensor *const *nodes, size_t n, size_t *conv_off) {
    if (s->plan_prepared && plan_is_of(s, nodes, n)) {
        *conv_off = s->plan_conv_off;
        return TSR_OK;
    }
    for (size_t i = 0; i < n; i++) {
        if (nodes[i]->op != TSR_OP_NONE && nodes[i]->op != TSR_OP_VIEW && !kernel_of(nodes[i]->op))
            return tsr__error(TSR_E_UNSUPPORTED, "cpu: node '%s': op %s has no CPU kernel", nodes[i]->name,
                              tsr__op_name(nodes[i]->op));
    }
    const size_t need = plan_of(s, nodes, n, conv_off);
    if (*conv_off == SIZE_MAX)
        return tsr__error(TSR_E_NOMEM, "cpu: out of host memory planning %zu nodes", n);
    tsr_status st = ensure_work(s, need);
    if (st == TSR_OK)
        st = il8_prepare(s, nodes, n);
    s->plan_prepared = st == TSR_OK && s->plan_n == n;
    return st;
}

tsr_status tsr__cpu_run_nodes(tsr_stream *s, tsr_tensor *const *nodes, size_t n) {
    size_t conv_off;
    tsr_status st = prepare(s, nodes, n, &conv_off);
    if (st != TSR_OK)
        return st;
    s->conv_off = conv_off;
    s->conv_seq = 0; /* nothing converted in this job yet */
    s->nodes = nodes;
    s->n_nodes = n;
    atomic_store(&s->error, (int)TSR_OK);
    s->prof = tsr__prof_on();
    const int64_t t0 = s->prof ? tsr__prof_now() : 0;
    tsr__tp_run(s->tp, run_job, s);
    s->seq += n;
    if (s->prof)
        tsr__prof_add(TSR_PROF_RUN, tsr__prof_now() - t0);
    s->nodes = NULL;
    s->n_nodes = 0;
    const int err = atomic_load(&s->error);
    return err == TSR_OK ? TSR_OK : tsr__error((tsr_status)err, "cpu: %s", s->error_msg);
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
    cpu_memory,         cpu_supports, tsr__cpu_stream_new, tsr__cpu_stream_free, tsr__cpu_reserve,
    tsr__cpu_run_nodes, cpu_sync};

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

static const tsr_backend_reg cpu_reg = {"cpu", cpu_enumerate, tsr__cpu_features_string};

const tsr_backend_reg *tsr__cpu_backend_reg(void) { return &cpu_reg; }
