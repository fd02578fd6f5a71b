/*
 * place.c - backend weights: declaration, placement on devices, the memory
 * plan, allocation (one buffer per buffer type) and lookup by name.
 *
 * Placement, for every declared weight without memory:
 *  - repeating layers (names "blk.N.") go to devices by layer: the last
 *    n_gpu_layers of them to the backend's GPU devices (every non-CPU
 *    device), split in proportion to tensor_split or else to each GPU's free
 *    memory; the others stay on the CPU;
 *  - the input layer (token_embd*, position_embd*, token_types*) stays on the
 *    CPU; the output layer (output.*, output_norm.*) goes with the last layer
 *    when every layer is offloaded, else to the CPU;
 *  - any other tensor (rope_freqs and the like: not repeated, used inside
 *    every layer) is "shared": it lives with layer 0 and has a copy on every
 *    other device holding layers (tsr_backend_weight_on, and the scheduler
 *    reads the copy of the node's device);
 *  - the override list comes last: the first pattern (POSIX extended regex,
 *    matching anywhere in the name) that matches sets the buffer type (no
 *    per-device copies for an overridden tensor).
 * Then the bytes per buffer type are summed with the same padding the
 * allocation uses, the plan is recorded and logged, every device is checked
 * against its free memory (TSR_E_DEVICE_NOMEM names the device that does not
 * fit), and only when all fit is anything allocated or read.
 */
#include "core.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

void tsr_load_params_init(tsr_load_params *p, size_t size) {
    if (!p || size < sizeof(size_t))
        return;
    tsr_load_params d = {0};
    d.size = size < sizeof d ? size : sizeof d;
    d.n_gpu_layers = 0;
    d.main_gpu = 0;
    d.use_mmap = 0;
    d.n_io_threads = 0;
    memcpy(p, &d, d.size);
    p->size = size;
}

void tsr__load_params_read(const tsr_load_params *in, tsr_load_params *out) {
    tsr_load_params_init(out, sizeof *out);
    if (in && in->size >= sizeof(size_t))
        TSR_PARAMS_COPY(out, in);
    out->size = sizeof *out;
}

/* ---- weight data epoch --------------------------------------------------------- */

static atomic_uint_fast64_t tsr_weights_epoch_v = 1;

void tsr__weights_touch(void) { atomic_fetch_add(&tsr_weights_epoch_v, 1); }
uint64_t tsr__weights_epoch(void) { return atomic_load(&tsr_weights_epoch_v); }

/* ---- declaration and lookup ------------------------------------------------------ */

static int layer_of(const char *name) {
    if (strncmp(name, "blk.", 4) != 0)
        return -1;
    char *end;
    long il = strtol(name + 4, &end, 10);
    return end != name + 4 && *end == '.' && il >= 0 && il < 100000 ? (int)il : -1;
}

tsr_status tsr_backend_declare_weight(tsr_backend *b, const char *name, tsr_type type, int n_dims, const int64_t *ne) {
    if (!b || !name || !ne)
        return tsr__error(TSR_E_INVALID, "tsr_backend_declare_weight: NULL %s",
                          !b      ? "backend"
                          : !name ? "name"
                                  : "shape");
    if (strlen(name) >= TSR_MAX_NAME || name[0] == '\0')
        return tsr__error(TSR_E_INVALID, "tsr_backend_declare_weight: name '%s' is empty or longer than %d bytes", name,
                          TSR_MAX_NAME - 1);
    if (tsr_backend_weight(b, name))
        return tsr__error(TSR_E_INVALID, "tsr_backend_declare_weight: weight '%s' exists already", name);
    tsr_clear_error();
    const tsr_type_traits *tr = tsr__type_traits(type);
    if (!tr || tr->block_size == 0)
        return tsr__error(TSR_E_UNSUPPORTED, "weight '%s': unknown type %d", name, (int)type);
    if (n_dims < 1 || n_dims > TSR_MAX_DIMS)
        return tsr__error(TSR_E_INVALID, "weight '%s': n_dims %d is not 1..4", name, n_dims);
    tsr_tensor *t = tsr__calloc(1, sizeof *t);
    if (!t)
        return tsr__error(TSR_E_NOMEM, "out of host memory declaring weight '%s'", name);
    t->type = type;
    t->n_dims = n_dims;
    t->device_id = -1;
    t->flags = TSR_FLAG_WEIGHT;
    snprintf(t->name, sizeof t->name, "%s", name);
    for (int i = 0; i < TSR_MAX_DIMS; i++) {
        t->ne[i] = i < n_dims ? ne[i] : 1;
        if (t->ne[i] < 0) {
            tsr__free(t);
            return tsr__error(TSR_E_INVALID, "weight '%s': dimension %d is negative", name, i);
        }
    }
    if (t->ne[0] % tr->block_size != 0 || !tsr__set_contiguous_strides(t)) {
        tsr__free(t);
        return tsr__error(TSR_E_INVALID,
                          "weight '%s': ne[0] %lld is not a multiple of %s's block or the size overflows", name,
                          (long long)ne[0], tr->name);
    }
    tsr_weight_set *w = &b->weights;
    if (!TSR_GROW(w->tensors, w->cap, w->n + 1)) {
        tsr__free(t);
        return tsr__error(TSR_E_NOMEM, "out of host memory declaring weight '%s'", name);
    }
    w->tensors[w->n++] = t;
    int il = layer_of(name);
    if (il + 1 > b->n_layers)
        b->n_layers = il + 1;
    return TSR_OK;
}

tsr_tensor *tsr_backend_weight(const tsr_backend *b, const char *name) {
    if (!b || !name) {
        tsr__error(TSR_E_INVALID, "tsr_backend_weight: NULL %s", b ? "name" : "backend");
        return NULL;
    }
    for (size_t i = 0; i < b->weights.n; i++)
        if (strcmp(b->weights.tensors[i]->name, name) == 0)
            return b->weights.tensors[i];
    tsr__error(TSR_E_NOT_FOUND, "no weight named '%s'", name);
    return NULL;
}

tsr_tensor *tsr__weight_copy_on(const tsr_backend *b, const tsr_tensor *w, int dev) {
    if (w->device_id == dev)
        return (tsr_tensor *)w;
    for (size_t i = 0; i < b->weights.n_copies; i++)
        if (b->weights.copies[i].primary == w && b->weights.copies[i].dev == dev)
            return b->weights.copies[i].copy;
    return NULL;
}

bool tsr__weight_is_shared(const tsr_backend *b, const tsr_tensor *w) {
    for (size_t i = 0; i < b->weights.n_copies; i++)
        if (b->weights.copies[i].primary == w)
            return true;
    return false;
}

tsr_tensor *tsr_backend_weight_on(const tsr_backend *b, const char *name, const tsr_device *dev) {
    tsr_tensor *w = tsr_backend_weight(b, name);
    if (!w || !dev)
        return w;
    size_t d = tsr__backend_device_index(b, dev);
    tsr_tensor *c = d < b->n_devices ? tsr__weight_copy_on(b, w, (int)d) : NULL;
    return c ? c : w;
}

size_t tsr_backend_n_weights(const tsr_backend *b) { return b ? b->weights.n : 0; }

tsr_tensor *tsr_backend_weight_at(const tsr_backend *b, size_t i) {
    return b && i < b->weights.n ? b->weights.tensors[i] : NULL;
}

int tsr_backend_n_layers(const tsr_backend *b) { return b ? b->n_layers : 0; }

tsr_buffer_type *tsr_backend_layer_buffer_type(const tsr_backend *b, int il) {
    if (!b || il < 0 || il >= b->n_layers || !b->layer_buft)
        return NULL;
    return b->layer_buft[il];
}

/* ---- layers to devices ------------------------------------------------------------- */

static tsr_status check_load_params(const tsr_backend *b, const tsr_load_params *p, size_t n_gpu) {
    if (p->n_gpu_layers < -1)
        return tsr__error(TSR_E_INVALID, "load params: n_gpu_layers must be >= -1, got %d", p->n_gpu_layers);
    if (n_gpu > 0 && (p->main_gpu < 0 || (size_t)p->main_gpu >= n_gpu))
        return tsr__error(TSR_E_INVALID, "load params: main_gpu %d is not a GPU of the backend (it has %zu: 0..%zu)",
                          p->main_gpu, n_gpu, n_gpu - 1);
    for (size_t g = 0; p->tensor_split && g < n_gpu; g++)
        if (!isfinite(p->tensor_split[g]) || p->tensor_split[g] < 0)
            return tsr__error(TSR_E_INVALID, "load params: tensor_split[%zu] = %g (%s) must be finite and >= 0", g,
                              p->tensor_split[g], b->devices[g]->name);
    return TSR_OK;
}

/* GPU of the j-th of k offloaded layers: cumulative shares, like llama.cpp. */
static size_t gpu_of(const double *cum, size_t n_gpu, int j, int k, size_t main_gpu) {
    if (cum[n_gpu - 1] <= 0)
        return main_gpu; /* no weights at all: everything on the main GPU */
    double frac = (double)j / k;
    for (size_t g = 0; g < n_gpu; g++)
        if (frac < cum[g] / cum[n_gpu - 1])
            return g;
    return n_gpu - 1;
}

tsr_status tsr__place_layers(tsr_backend *b, int n_layers, const tsr_load_params *in) {
    tsr_load_params p;
    tsr__load_params_read(in, &p);
    size_t n_gpu = b->n_devices - 1 /* all but the host */, cpu = tsr__backend_host_index(b);
    tsr_status st = check_load_params(b, &p, n_gpu);
    if (st != TSR_OK)
        return st;
    if (n_layers > b->n_layers)
        b->n_layers = n_layers;
    n_layers = b->n_layers;
    int k = p.n_gpu_layers < 0 || p.n_gpu_layers > n_layers ? n_layers : p.n_gpu_layers;
    if (n_gpu == 0 && k > 0 && !b->told_no_gpu) { /* once per backend, not silently */
        char buf[16];
        b->told_no_gpu = true;
        tsr__log(TSR_LOG_WARN,
                 "n_gpu_layers asks for GPU layers, but the backend has no GPU device: every layer "
                 "stays on the CPU",
                 1, "n_gpu_layers", tsr__fmt(buf, sizeof buf, "%d", p.n_gpu_layers));
    }
    if (n_gpu == 0)
        k = 0;
    double cum[64] = {0};
    for (size_t g = 0; g < n_gpu && g < 64; g++) {
        size_t fr = 0, tot = 0;
        double share = p.tensor_split ? p.tensor_split[g] : (tsr_device_memory(b->devices[g], &fr, &tot), (double)fr);
        cum[g] = (g ? cum[g - 1] : 0) + share;
    }
    tsr_buffer_type **lb = tsr__realloc(b->layer_buft, (n_layers ? (size_t)n_layers : 1) * sizeof *lb);
    if (!lb)
        return tsr__error(TSR_E_NOMEM, "out of host memory placing %d layers", n_layers);
    b->layer_buft = lb;
    for (int il = 0; il < n_layers; il++) {
        size_t dev = il < n_layers - k ? cpu : gpu_of(cum, n_gpu, il - (n_layers - k), k, (size_t)p.main_gpu);
        lb[il] = b->devices[dev]->buft;
    }
    return TSR_OK;
}

/* ---- weights to buffer types --------------------------------------------------------- */

enum { ROLE_LAYER, ROLE_INPUT, ROLE_OUTPUT, ROLE_SHARED };

static bool prefix(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

static int weight_role(const char *name, int *il) {
    *il = layer_of(name);
    if (*il >= 0)
        return ROLE_LAYER;
    if (prefix(name, "token_embd") || prefix(name, "position_embd") || prefix(name, "token_types"))
        return ROLE_INPUT;
    if (prefix(name, "output.") || prefix(name, "output_norm"))
        return ROLE_OUTPUT;
    return ROLE_SHARED;
}

/* The working state of one placement. */
typedef struct tsr_placement {
    tsr_backend *b;
    tsr_load_params p;
    tsr_override_set ov;
    tsr_tensor **t;         /* tensors to place: weights without memory, then new copies */
    tsr_buffer_type **buft; /* their buffer types */
    size_t *offset;         /* their offsets in their buffer */
    size_t n, n_weights;
    tsr_weight_copy *copies; /* new copies of shared weights */
    size_t n_copies;
    tsr_buffer_type *group[64]; /* distinct buffer types */
    size_t group_size[64];
    tsr_buffer *group_buf[64];
    size_t n_groups;
    size_t *add; /* new bytes per device */
} tsr_placement;

static size_t buft_dev(const tsr_backend *b, const tsr_buffer_type *bt) {
    return bt->is_host ? tsr__backend_host_index(b) : tsr__backend_device_index(b, bt->device);
}

static void placement_release(tsr_placement *pl, bool keep_copies) {
    for (size_t g = 0; g < pl->n_groups; g++) tsr_buffer_free(pl->group_buf[g]);
    for (size_t i = 0; !keep_copies && i < pl->n_copies; i++) tsr__free(pl->copies[i].copy);
    tsr__free(pl->copies);
    tsr__free(pl->t);
    tsr__free(pl->buft);
    tsr__free(pl->offset);
    tsr__free(pl->add);
    tsr__overrides_release(&pl->ov);
}

/* Removes copies a plan_only placement left without memory. */
static void drop_pending_copies(tsr_backend *b) {
    size_t kept = 0;
    for (size_t i = 0; i < b->weights.n_copies; i++) {
        if (b->weights.copies[i].copy->buffer)
            b->weights.copies[kept++] = b->weights.copies[i];
        else
            tsr__free(b->weights.copies[i].copy);
    }
    b->weights.n_copies = kept;
}

static tsr_status add_copy(tsr_placement *pl, tsr_tensor *w, size_t dev) {
    tsr_tensor *c = tsr__malloc(sizeof *c);
    if (!c)
        return tsr__error(TSR_E_NOMEM, "out of host memory placing weights");
    *c = *w;
    c->flags &= ~(uint32_t)(TSR_FLAG_OWN_LAYOUT | TSR_FLAG_KEEP_STORED); /* its own layout, from the stored bytes */
    c->alloc_id = -1;
    c->device_id = (int)dev;
    pl->copies[pl->n_copies++] = (tsr_weight_copy){w, c, (int)dev};
    pl->t[pl->n] = c;
    pl->buft[pl->n++] = pl->b->devices[dev]->buft;
    return TSR_OK;
}

/* Copies of shared weight w on every device holding layers but w's own. */
static tsr_status share_weight(tsr_placement *pl, tsr_tensor *w, const tsr_buffer_type *home) {
    tsr_backend *b = pl->b;
    size_t home_dev = buft_dev(b, home);
    for (size_t d = 0; d < b->n_devices; d++) {
        bool holds = false;
        for (int il = 0; il < b->n_layers && !holds; il++) holds = b->layer_buft[il] == b->devices[d]->buft;
        if (holds && d != home_dev) {
            tsr_status st = add_copy(pl, w, d);
            if (st != TSR_OK)
                return st;
        }
    }
    return TSR_OK;
}

static tsr_buffer_type *default_buft(const tsr_placement *pl, int role, int il) {
    const tsr_backend *b = pl->b;
    tsr_buffer_type *cpu = b->devices[tsr__backend_host_index(b)]->buft;
    int n = b->n_layers;
    switch (role) {
    case ROLE_LAYER: return b->layer_buft[il];
    case ROLE_INPUT: return cpu;
    case ROLE_OUTPUT: {
        int k = pl->p.n_gpu_layers < 0 || pl->p.n_gpu_layers > n ? n : pl->p.n_gpu_layers;
        return n > 0 && k == n ? b->layer_buft[n - 1] : cpu;
    }
    default: return n > 0 ? b->layer_buft[0] : cpu;
    }
}

/* Whether bt's device multiplies a matrix of w's type (supports_op on a
 * type-only probe: nb[0] 0). A quantized weight it cannot multiply (a type
 * without a kernel there, e.g. Q2_K on CUDA) stays in system memory: on the
 * device it would be copied back to the CPU by every compute. */
static bool device_multiplies(const tsr_buffer_type *bt, const tsr_tensor *w) {
    const tsr_type_traits *tr = tsr__type_traits(w->type);
    if (bt->is_host || !bt->device || !tr || tr->block_size <= 1 || w->n_dims < 2)
        return true;
    tsr_tensor a = *w, x = {0}, probe = {0}; /* the product of w and one column */
    a.data = NULL;
    x.type = probe.type = TSR_TYPE_F32;
    for (int i = 0; i < 4; i++) x.ne[i] = probe.ne[i] = i < 2 ? 1 : w->ne[i];
    x.ne[0] = w->ne[0];
    probe.ne[0] = w->ne[1];
    x.nb[0] = probe.nb[0] = sizeof(float);
    for (int i = 1; i < 4; i++) {
        x.nb[i] = x.nb[i - 1] * (size_t)x.ne[i - 1];
        probe.nb[i] = probe.nb[i - 1] * (size_t)probe.ne[i - 1];
    }
    x.n_dims = probe.n_dims = w->n_dims;
    probe.op = TSR_OP_MUL_MAT;
    probe.src[0] = &a;
    probe.src[1] = &x;
    const tsr_device *d = bt->device;
    return d->iface->supports_op && d->iface->supports_op(d, &probe);
}

static void log_override(const tsr_tensor *t, const tsr_buffer_type *bt) {
    if (!tsr__log_enabled(TSR_LOG_DEBUG))
        return;
    char size[32];
    tsr__log(TSR_LOG_DEBUG, "buffer type override", 3, "tensor", t->name, "mib",
             tsr__fmt(size, sizeof size, "%.3f", tsr_tensor_nbytes(t) / 1048576.0), "buffer_type", bt->name);
}

/* Decides the buffer type of every weight without memory (and the copies). */
static tsr_status decide(tsr_placement *pl) {
    tsr_backend *b = pl->b;
    for (size_t i = 0; i < b->weights.n; i++) {
        tsr_tensor *w = b->weights.tensors[i];
        if (w->buffer) { /* placed before (or mapped by the loader): a shared one still needs its copies */
            int il;
            if (weight_role(w->name, &il) == ROLE_SHARED && !tsr__weight_is_shared(b, w) &&
                !tsr__overrides_match(&pl->ov, w->name)) {
                tsr_status st = share_weight(pl, w, w->buffer->buft);
                if (st != TSR_OK)
                    return st;
            }
            continue;
        }
        int il, role = weight_role(w->name, &il);
        tsr_buffer_type *bt = tsr__overrides_match(&pl->ov, w->name);
        bool overridden = bt != NULL;
        if (bt) {
            if (!bt->is_host && tsr__backend_device_index(b, bt->device) >= b->n_devices)
                return tsr__error(TSR_E_INVALID,
                                  "override for '%s': buffer type %s belongs to device %s, which the "
                                  "backend does not use",
                                  w->name, bt->name, bt->device->name);
            log_override(w, bt);
        } else {
            bt = default_buft(pl, role, il);
            if (!device_multiplies(bt, w)) {
                char buf[32];
                if (!b->plan_mode)
                    tsr__log(TSR_LOG_INFO, "weight kept in system memory: its device has no kernel for its type", 3,
                             "tensor", w->name, "type", tsr_type_name(w->type), "device",
                             tsr__fmt(buf, sizeof buf, "%s", bt->device->name));
                bt = b->devices[tsr__backend_host_index(b)]->buft;
            }
        }
        pl->t[pl->n] = w;
        pl->buft[pl->n++] = bt;
        if (role == ROLE_SHARED && !overridden) {
            tsr_status st = share_weight(pl, w, bt);
            if (st != TSR_OK)
                return st;
        }
    }
    if (!b->plan_mode) /* tsr_fit's dry runs: said once, by the real load */
        tsr__overrides_warn_unmatched(&pl->ov);
    return TSR_OK;
}

/* Bytes per buffer type (padded as allocated) and per device. */
static tsr_status size_groups(tsr_placement *pl) {
    for (size_t i = 0; i < pl->n; i++) {
        size_t g = 0;
        while (g < pl->n_groups && pl->group[g] != pl->buft[i]) g++;
        if (g == pl->n_groups) {
            if (g == 64)
                return tsr__error(TSR_E_UNSUPPORTED, "weights placed on more than 64 buffer types");
            pl->group[pl->n_groups++] = pl->buft[i];
        }
        size_t a = pl->buft[i]->alignment > TSR_ALIGN ? pl->buft[i]->alignment : TSR_ALIGN;
        size_t sz = tsr__pad(tsr_tensor_nbytes(pl->t[i]), a);
        pl->offset[i] = pl->group_size[g];
        if (tsr__add_overflow(pl->group_size[g], sz, &pl->group_size[g]))
            return tsr__error(TSR_E_INVALID, "weights: total size overflows");
        pl->add[buft_dev(pl->b, pl->buft[i])] += sz;
    }
    return TSR_OK;
}

static tsr_status allocate(tsr_placement *pl) {
    for (size_t g = 0; g < pl->n_groups; g++) {
        if (pl->group_size[g] == 0)
            continue;
        tsr_status st = tsr_buffer_alloc(pl->group[g], pl->group_size[g], &pl->group_buf[g]);
        if (st != TSR_OK) {
            tsr__error_prefix("weights: %.2f MiB on %s", pl->group_size[g] / 1048576.0, pl->group[g]->name);
            return st;
        }
    }
    return TSR_OK;
}

/* Hands the buffers and copies to the backend (capacity reserved before). */
static void commit(tsr_placement *pl) {
    tsr_backend *b = pl->b;
    for (size_t i = 0; i < pl->n; i++) {
        tsr_tensor *t = pl->t[i];
        size_t g = 0;
        while (pl->group[g] != pl->buft[i]) g++;
        t->buffer = pl->group_buf[g];
        t->data = t->buffer ? (char *)t->buffer->base + pl->offset[i] : NULL;
        t->device_id = (int)buft_dev(b, pl->buft[i]);
    }
    for (size_t g = 0; g < pl->n_groups; g++)
        if (pl->group_buf[g]) {
            b->weights.buffers[b->weights.n_buffers++] = pl->group_buf[g];
            pl->group_buf[g] = NULL;
        }
    for (size_t d = 0; d < b->n_devices; d++) {
        b->live_weights[d] += pl->add[d];
        b->live[d] += pl->add[d];
    }
    b->weights.synced_epoch = 0;
}

static tsr_status reserve_lists(tsr_placement *pl) {
    tsr_weight_set *w = &pl->b->weights;
    size_t need_c = w->n_copies + pl->n_copies, need_b = w->n_buffers + pl->n_groups;
    if (!TSR_GROW(w->copies, w->cap_copies, need_c) || !TSR_GROW(w->buffers, w->cap_buffers, need_b))
        return tsr__error(TSR_E_NOMEM, "out of host memory placing weights");
    return TSR_OK;
}

static tsr_status placement_init(tsr_placement *pl, tsr_backend *b, const tsr_load_params *p) {
    memset(pl, 0, sizeof *pl);
    pl->b = b;
    tsr__load_params_read(p, &pl->p);
    size_t cap = b->weights.n * b->n_devices + 1;
    pl->t = tsr__calloc(cap, sizeof *pl->t);
    pl->buft = tsr__calloc(cap, sizeof *pl->buft);
    pl->offset = tsr__calloc(cap, sizeof *pl->offset);
    pl->copies = tsr__calloc(cap, sizeof *pl->copies);
    pl->add = tsr__calloc(b->n_devices, sizeof *pl->add);
    if (!pl->t || !pl->buft || !pl->offset || !pl->copies || !pl->add)
        return tsr__error(TSR_E_NOMEM, "out of host memory placing weights");
    return tsr__overrides_compile(pl->p.overrides, &pl->ov);
}

tsr_status tsr__plan_check(const tsr_backend *b) {
    if (b->plan_mode) /* a dry run: the caller (tsr_fit) compares the whole plan itself */
        return TSR_OK;
    for (size_t d = 0; d < b->n_devices; d++) {
        size_t fr = 0, tot = 0;
        tsr_device_memory(b->devices[d], &fr, &tot);
        double need = (double)b->plan_weights[d] + (double)b->plan_kv[d] + (double)b->plan_compute[d];
        double avail = (double)fr + (double)b->live[d];
        if (need > avail)
            return tsr__error(TSR_E_DEVICE_NOMEM,
                              "%s: the memory plan needs %.2f MiB (weights %.2f + KV cache %.2f + compute %.2f) but "
                              "%.2f MiB are available: %.2f MiB (%.0f bytes) missing",
                              b->devices[d]->name, need / 1048576.0, b->plan_weights[d] / 1048576.0,
                              b->plan_kv[d] / 1048576.0, b->plan_compute[d] / 1048576.0, avail / 1048576.0,
                              (need - avail) / 1048576.0, need - avail);
    }
    return TSR_OK;
}

static tsr_status place_run(tsr_placement *pl) {
    tsr_backend *b = pl->b;
    tsr_status st = tsr__place_layers(b, 0, &pl->p);
    if (st == TSR_OK)
        st = decide(pl);
    if (st == TSR_OK)
        st = size_groups(pl);
    if (st != TSR_OK)
        return st;
    for (size_t d = 0; d < b->n_devices; d++) b->plan_weights[d] = b->live_weights[d] + pl->add[d];
    if (!b->plan_mode)
        tsr_backend_log_plan(b);
    if ((st = tsr__plan_check(b)) != TSR_OK)
        return st;
    if ((st = reserve_lists(pl)) != TSR_OK)
        return st;
    if (pl->p.plan_only) { /* planned devices only: tsr_measure can size compute buffers */
        for (size_t i = 0; i < pl->n; i++) pl->t[i]->device_id = (int)buft_dev(b, pl->buft[i]);
    } else {
        if ((st = allocate(pl)) != TSR_OK)
            return st;
        commit(pl);
    }
    if (pl->n_copies)
        memcpy(b->weights.copies + b->weights.n_copies, pl->copies, pl->n_copies * sizeof *pl->copies);
    b->weights.n_copies += pl->n_copies;
    return TSR_OK;
}

tsr_status tsr__place_weights(tsr_backend *b, const tsr_load_params *p) {
    drop_pending_copies(b);
    tsr_placement pl;
    tsr_status st = placement_init(&pl, b, p);
    if (st == TSR_OK)
        st = place_run(&pl);
    placement_release(&pl, st == TSR_OK);
    return st;
}

tsr_status tsr_backend_place_weights(tsr_backend *b, const tsr_load_params *p) {
    if (!b)
        return tsr__error(TSR_E_INVALID, "tsr_backend_place_weights: NULL backend");
    if (p && p->size < sizeof(size_t))
        return tsr__error(TSR_E_INVALID, "tsr_backend_place_weights: params.size is %zu; call tsr_load_params_init",
                          p->size);
    tsr_load_params prm;
    tsr__load_params_read(p, &prm);
    return tsr__place_weights(b, &prm);
}

void tsr__weights_free(tsr_backend *b) {
    for (size_t i = 0; i < b->weights.n; i++) tsr__free(b->weights.tensors[i]);
    for (size_t i = 0; i < b->weights.n_copies; i++) tsr__free(b->weights.copies[i].copy);
    for (size_t i = 0; i < b->weights.n_buffers; i++) tsr_buffer_free(b->weights.buffers[i]);
    tsr__free(b->weights.tensors);
    tsr__free(b->weights.copies);
    tsr__free(b->weights.buffers);
    memset(&b->weights, 0, sizeof b->weights);
}
