/*
 * cpu.c - the CPU backend: one device "CPU" (description = CPU model), its
 * host buffer type "CPU", streams (a persistent threadpool plus a work
 * buffer sized by reserve), op support, and the graph runner that executes
 * nodes in order, every node split over all threads, with a barrier
 * between nodes.
 */
#include "cpu.h"

#include <stdio.h>
#include <unistd.h>

/* ---- host buffer type ------------------------------------------------------ */

static tsr_status host_alloc(tsr_buffer_type *bt, size_t size, void **base, void **handle) {
    size_t n = tsr__pad(size ? size : 1, bt->alignment);
    if (n < size) return tsr__error(TSR_E_NOMEM, "%s: cannot allocate %zu bytes: size overflows", bt->name, size);
    void *p = tsr__aligned_alloc(bt->alignment, n);
    if (!p) return tsr__error(TSR_E_NOMEM, "%s: cannot allocate %zu bytes of host memory", bt->name, size);
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
    if (size) memcpy(dst, host, size);
    return TSR_OK;
}
static tsr_status host_get(tsr_buffer *buf, const void *src, void *host, size_t size) {
    (void)buf;
    if (size) memcpy(host, src, size);
    return TSR_OK;
}
static tsr_status host_memset(tsr_buffer *buf, void *dst, int value, size_t size) {
    (void)buf;
    if (size) memset(dst, value, size);
    return TSR_OK;
}
static tsr_status host_copy(tsr_buffer *db, void *dst, tsr_buffer *sb, const void *src, size_t size) {
    (void)db;
    (void)sb;
    if (size) memmove(dst, src, size);
    return TSR_OK;
}

const tsr_buft_iface tsr__cpu_buft_iface = {host_alloc, host_free, host_set, host_get, host_memset, host_copy};

/* ---- op support -------------------------------------------------------------- */

static bool is_float_type(tsr_type t) { return t == TSR_TYPE_F32 || t == TSR_TYPE_F16 || t == TSR_TYPE_BF16; }
static bool is_cpy_type(tsr_type t) { return is_float_type(t) || t == TSR_TYPE_I32; }

static bool supports_copy(const tsr_tensor *op, const tsr_tensor *src) {
    const tsr_cpu_kernels *k = tsr__cpu_kernels();
    if (src->type == op->type && !tsr_type_is_quantized(op->type)) return tsr__type_traits(op->type) != NULL;
    if (!is_cpy_type(src->type) && !(tsr_type_is_quantized(src->type) && k->to_float[src->type])) return false;
    if (is_cpy_type(op->type)) return true;
    return tsr_type_is_quantized(op->type) && k->from_float[op->type] && op->type != TSR_TYPE_Q8_1 &&
           op->type != TSR_TYPE_Q8_K && op->ne[0] % tsr_type_block_size(op->type) == 0 &&
           op->nb[0] == tsr_type_block_bytes(op->type);
}

bool tsr__cpu_supports_op(const tsr_tensor *op) {
    const tsr_cpu_kernels *k = tsr__cpu_kernels();
    const tsr_tensor *a = op->src[0], *b = op->src[1];
    switch (op->op) {
    case TSR_OP_NONE:
    case TSR_OP_VIEW: return true;
    case TSR_OP_ADD: case TSR_OP_SUB: case TSR_OP_MUL: case TSR_OP_DIV:
        return is_float_type(a->type) && is_float_type(b->type);
    case TSR_OP_SCALE: case TSR_OP_SILU: case TSR_OP_GELU: return is_float_type(a->type);
    case TSR_OP_SWIGLU: case TSR_OP_GEGLU: return is_float_type(a->type) && is_float_type(b->type);
    case TSR_OP_RMS_NORM: case TSR_OP_NORM: case TSR_OP_ARGMAX: return a->type == TSR_TYPE_F32;
    case TSR_OP_ROPE: return a->type == TSR_TYPE_F32 && b->type == TSR_TYPE_I32 &&
                             (!op->src[2] || op->src[2]->type == TSR_TYPE_F32);
    case TSR_OP_SOFTMAX: return a->type == TSR_TYPE_F32 && (!b || b->type == TSR_TYPE_F32 || b->type == TSR_TYPE_F16);
    case TSR_OP_MUL_MAT:
        return k->vec_dot[a->type] && is_float_type(b->type) && a->nb[0] == tsr_type_block_bytes(a->type);
    case TSR_OP_GET_ROWS: return k->to_float[a->type] && b->type == TSR_TYPE_I32;
    case TSR_OP_SET_ROWS:
        return supports_copy(op, b) && b->type == TSR_TYPE_F32 &&
               (op->src[2]->type == TSR_TYPE_I32 || op->src[2]->type == TSR_TYPE_I64);
    case TSR_OP_CPY: case TSR_OP_CONT: return supports_copy(op, a);
    case TSR_OP_CONCAT: return a->type == b->type && is_cpy_type(a->type);
    case TSR_OP_FLASH_ATTN: {
        const tsr_tensor *m = op->src[3];
        const bool kv_ok = (b->type == TSR_TYPE_F32 || b->type == TSR_TYPE_F16 || b->type == TSR_TYPE_Q8_0) &&
                           (op->src[2]->type == TSR_TYPE_F32 || op->src[2]->type == TSR_TYPE_F16 ||
                            op->src[2]->type == TSR_TYPE_Q8_0);
        return a->type == TSR_TYPE_F32 && kv_ok && (!m || m->type == TSR_TYPE_F32 || m->type == TSR_TYPE_F16) &&
               (b->nb[0] == 0 || b->nb[0] == tsr_type_block_bytes(b->type)) &&
               (op->src[2]->nb[0] == 0 || op->src[2]->nb[0] == tsr_type_block_bytes(op->src[2]->type)); /* 0: a type-only probe */
    }
    default: return false;
    }
}

/* ---- work buffer sizing -------------------------------------------------------- */

size_t tsr__cpu_work_size(const tsr_tensor *node, int nth) {
    const size_t pt_align = TSR_ALIGN;
    switch (node->op) {
    case TSR_OP_MUL_MAT: return tsr__cpu_mul_mat_work(node, nth);
    case TSR_OP_FLASH_ATTN: return tsr__cpu_flash_attn_work(node, nth);
    case TSR_OP_ROPE:
        return (size_t)nth * tsr__pad(((size_t)node->op_params[TSR_ROPE_P_N_DIMS] + 2) * sizeof(float), pt_align);
    case TSR_OP_SET_ROWS: return (size_t)nth * tsr__pad((size_t)node->src[1]->ne[0] * sizeof(float), pt_align);
    case TSR_OP_CPY: case TSR_OP_CONT:
        return (size_t)nth * tsr__pad((size_t)(node->ne[0] + node->src[0]->ne[0]) * sizeof(float), pt_align);
    default: return 0;
    }
}

/* ---- streams -------------------------------------------------------------------- */

static int default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

tsr_status tsr__cpu_stream_new(tsr_device *d, int n_threads, tsr_stream **out) {
    *out = NULL;
    if (n_threads < 0) return tsr__error(TSR_E_INVALID, "%s: n_threads must be >= 0, found %d", d ? d->name : "cpu", n_threads);
    if (n_threads == 0) n_threads = default_threads();
    tsr_stream *s = tsr__calloc(1, sizeof *s);
    if (!s) return tsr__error(TSR_E_NOMEM, "cpu: out of memory creating a stream");
    tsr_status st = tsr__tp_new(n_threads, &s->tp);
    if (st != TSR_OK) {
        tsr__free(s);
        return st;
    }
    s->device = d;
    s->n_threads = n_threads;
    s->k = tsr__cpu_kernels();
    *out = s;
    return TSR_OK;
}

void tsr__cpu_stream_free(tsr_stream *s) {
    if (!s) return;
    tsr__tp_free(s->tp);
    tsr__aligned_free(s->work);
    tsr__free(s);
}

static tsr_status ensure_work(tsr_stream *s, size_t need) {
    if (need <= s->work_size) return TSR_OK;
    void *w = tsr__aligned_alloc(TSR_ALIGN, tsr__pad(need, TSR_ALIGN));
    if (!w) return tsr__error(TSR_E_NOMEM, "cpu: cannot allocate %zu bytes of work buffer", need);
    tsr__aligned_free(s->work);
    s->work = w;
    s->work_size = need;
    return TSR_OK;
}

static size_t nodes_work(const tsr_stream *s, tsr_tensor *const *nodes, size_t n) {
    size_t need = 0;
    for (size_t i = 0; i < n; i++) {
        size_t w = tsr__cpu_work_size(nodes[i], s->n_threads);
        if (w > need) need = w;
    }
    return need;
}

tsr_status tsr__cpu_reserve(tsr_stream *s, tsr_tensor *const *nodes, size_t n) {
    return ensure_work(s, nodes_work(s, nodes, n));
}

typedef void (*kernel_fn)(const tsr_compute_params *p, tsr_tensor *dst);

static kernel_fn kernel_of(tsr_op op) {
    switch (op) {
    case TSR_OP_ADD: case TSR_OP_SUB: case TSR_OP_MUL: case TSR_OP_DIV: return tsr__cpu_op_binary;
    case TSR_OP_SCALE: return tsr__cpu_op_scale;
    case TSR_OP_MUL_MAT: return tsr__cpu_op_mul_mat;
    case TSR_OP_GET_ROWS: return tsr__cpu_op_get_rows;
    case TSR_OP_SET_ROWS: return tsr__cpu_op_set_rows;
    case TSR_OP_RMS_NORM: case TSR_OP_NORM: return tsr__cpu_op_norm;
    case TSR_OP_ROPE: return tsr__cpu_op_rope;
    case TSR_OP_SOFTMAX: return tsr__cpu_op_softmax;
    case TSR_OP_SILU: case TSR_OP_GELU: return tsr__cpu_op_unary;
    case TSR_OP_SWIGLU: case TSR_OP_GEGLU: return tsr__cpu_op_glu;
    case TSR_OP_CONCAT: return tsr__cpu_op_concat;
    case TSR_OP_ARGMAX: return tsr__cpu_op_argmax;
    case TSR_OP_CPY: case TSR_OP_CONT: return tsr__cpu_op_cpy;
    case TSR_OP_FLASH_ATTN: return tsr__cpu_op_flash_attn;
    default: return NULL;
    }
}

/* The job every thread runs: all nodes, a barrier after each. */
static void run_job(void *arg, int ith, int nth) {
    tsr_stream *s = arg;
    const tsr_compute_params p = {ith, nth, s->work, s->work_size, s, s->k};
    for (size_t i = 0; i < s->n_nodes; i++) {
        tsr_tensor *node = s->nodes[i];
        kernel_fn fn = kernel_of(node->op);
        if (!fn || tsr__nelements(node) == 0) continue;
        if (node->op == TSR_OP_MUL_MAT && node->src[0]->ne[0] == 0) {
            if (ith == 0) memset(node->data, 0, tsr__nbytes(node)); /* empty sums */
        } else {
            fn(&p, node);
        }
        tsr__tp_barrier(s->tp);
    }
}

tsr_status tsr__cpu_run_nodes(tsr_stream *s, tsr_tensor *const *nodes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (nodes[i]->op != TSR_OP_NONE && nodes[i]->op != TSR_OP_VIEW && !kernel_of(nodes[i]->op))
            return tsr__error(TSR_E_UNSUPPORTED, "cpu: node '%s': op %s has no CPU kernel", nodes[i]->name,
                              tsr__op_name(nodes[i]->op));
    }
    tsr_status st = ensure_work(s, nodes_work(s, nodes, n));
    if (st != TSR_OK) return st;
    s->nodes = nodes;
    s->n_nodes = n;
    tsr__tp_run(s->tp, run_job, s);
    s->nodes = NULL;
    s->n_nodes = 0;
    return TSR_OK;
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
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = (size_t)kb * 1024;
        fclose(f);
    }
    if (!avail) {
        long av = sysconf(_SC_AVPHYS_PAGES);
        avail = av > 0 && psize > 0 ? (size_t)av * (size_t)psize : tot;
    }
    if (free_) *free_ = avail;
    if (total) *total = tot;
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

static const tsr_device_iface cpu_dev_iface = {cpu_memory, cpu_supports, tsr__cpu_stream_new, tsr__cpu_stream_free,
                                               tsr__cpu_reserve, tsr__cpu_run_nodes, cpu_sync};

static tsr_device cpu_device;
static tsr_buffer_type cpu_buft;

static void cpu_model_name(char *out, size_t size) {
    snprintf(out, size, "CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || !colon) continue;
        colon++;
        while (*colon == ' ' || *colon == '\t') colon++;
        colon[strcspn(colon, "\n")] = '\0';
        snprintf(out, size, "%s", colon);
        break;
    }
    fclose(f);
}

static size_t cpu_enumerate(tsr_device **devs, size_t max) {
    if (max < 1) return 0;
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
