/*
 * backend.c - tsr_backend: the devices in use, one execution stream per
 * device, exactly one scheduler (made here, reset by every compute), and the
 * weights. Parameters are read only up to the caller's `size`.
 */
#include "core.h"

#include <stddef.h>
#include <stdio.h>

void tsr_backend_params_init(tsr_backend_params *p, size_t size) {
    if (!p || size < sizeof(size_t))
        return;
    tsr_backend_params d = {0};
    d.size = size < sizeof d ? size : sizeof d;
    d.devices = NULL;
    d.n_threads = 0;
    d.flash_attn = TSR_FLASH_ATTN_AUTO;
    d.attn_max_batch = 0;
    d.batch_invariant = 0;
    memcpy(p, &d, d.size);
    p->size = size;
}

static void backend_params_read(const tsr_backend_params *in, tsr_backend_params *out) {
    tsr_backend_params_init(out, sizeof *out);
    if (in && in->size >= sizeof(size_t))
        TSR_PARAMS_COPY(out, in);
    out->size = sizeof *out;
}

size_t tsr__backend_device_index(const tsr_backend *b, const tsr_device *d) {
    for (size_t i = 0; i < b->n_devices; i++)
        if (b->devices[i] == d)
            return i;
    return b->n_devices;
}

size_t tsr__backend_host_index(const tsr_backend *b) { return b->host; }

/* Fills b->devices from the NULL-terminated list (NULL = all); the host
 * device (the CPU) is always present, after the others (b->host). */
static tsr_status backend_pick_devices(tsr_backend *b, tsr_device *const *list) {
    size_t n_all = tsr_device_count(), n = 0;
    b->devices = tsr__calloc(n_all + 1, sizeof *b->devices);
    if (!b->devices)
        return tsr__error(TSR_E_NOMEM, "tsr_backend_new: out of host memory");
    tsr_device *cpu = tsr__host_device();
    for (size_t i = 0; i < n_all; i++) {
        tsr_device *d = tsr_device_get(i);
        bool want = !list;
        for (size_t j = 0; list && list[j]; j++) {
            if (j >= 64)
                return tsr__error(TSR_E_INVALID, "tsr_backend_new: device list is not NULL-terminated");
            if (list[j] == d)
                want = true;
        }
        if (want && d != cpu)
            b->devices[n++] = d;
    }
    for (size_t j = 0; list && list[j]; j++)
        if (tsr__backend_device_index(b, list[j]) == n && list[j] != cpu) {
            bool known = false;
            for (size_t i = 0; i < n_all; i++) known |= tsr_device_get(i) == list[j];
            if (!known)
                return tsr__error(TSR_E_INVALID, "tsr_backend_new: device list entry %zu is not a device", j);
        }
    b->host = n;
    b->devices[n++] = cpu;
    b->n_devices = n;
    return TSR_OK;
}

static tsr_status backend_init(tsr_backend *b, const tsr_backend_params *p) {
    tsr_status s = backend_pick_devices(b, p->devices);
    if (s != TSR_OK)
        return s;
    /* the threads in effect: 0 = the cores, never more than the cores (logged) */
    const int n_threads = p->n_threads < 0 ? p->n_threads : tsr__cpu_threads(p->n_threads);
    b->n_threads = n_threads;
    b->flash_attn_req = p->flash_attn;
    b->attn_max_batch = p->attn_max_batch;
    b->streams = tsr__calloc(b->n_devices, sizeof *b->streams);
    b->plan_weights = tsr__calloc(b->n_devices, sizeof(size_t));
    b->plan_kv = tsr__calloc(b->n_devices, sizeof(size_t));
    b->plan_compute = tsr__calloc(b->n_devices, sizeof(size_t));
    b->plan_stream = tsr__calloc(b->n_devices, sizeof(size_t));
    b->live = tsr__calloc(b->n_devices, sizeof(size_t));
    b->live_weights = tsr__calloc(b->n_devices, sizeof(size_t));
    if (!b->streams || !b->plan_weights || !b->plan_kv || !b->plan_compute || !b->plan_stream || !b->live ||
        !b->live_weights)
        return tsr__error(TSR_E_NOMEM, "tsr_backend_new: out of host memory");
    for (size_t i = 0; i < b->n_devices; i++) {
        tsr_device *d = b->devices[i];
        if ((s = d->iface->stream_new(d, n_threads, &b->streams[i])) != TSR_OK) {
            tsr__error_prefix("tsr_backend_new: device %s", d->name);
            return s;
        }
    }
    if (p->batch_invariant)
        tsr__cpu_stream_set_invariant(b->streams[b->host]);
    /* flash attention: ON, or AUTO when every device runs the op */
    b->flash_attn = p->flash_attn == TSR_FLASH_ATTN_ON;
    if (p->flash_attn == TSR_FLASH_ATTN_AUTO) {
        tsr_tensor probe = {0}, q = {0}, k = {0}, v = {0};
        q.type = TSR_TYPE_F32;
        k.type = v.type = TSR_TYPE_F16;
        probe.op = TSR_OP_FLASH_ATTN;
        probe.type = TSR_TYPE_F32;
        probe.src[0] = &q;
        probe.src[1] = &k;
        probe.src[2] = &v;
        b->flash_attn = 1;
        for (size_t i = 0; i < b->n_devices; i++)
            if (!b->devices[i]->iface->supports_op || !b->devices[i]->iface->supports_op(b->devices[i], &probe))
                b->flash_attn = 0;
    }
    if (p->n_threads < 0)
        return tsr__error(TSR_E_INVALID, "tsr_backend_new: n_threads must be >= 0, got %d", p->n_threads);
    if (p->flash_attn < TSR_FLASH_ATTN_AUTO || p->flash_attn > TSR_FLASH_ATTN_ON)
        return tsr__error(TSR_E_INVALID, "tsr_backend_new: flash_attn must be -1, 0 or 1, got %d", p->flash_attn);
    return tsr__sched_new(b, &b->sched);
}

tsr_status tsr_backend_new(const tsr_backend_params *p, tsr_backend **out) {
    if (!out)
        return tsr__error(TSR_E_INVALID, "tsr_backend_new: NULL out");
    *out = NULL;
    if (p && p->size < sizeof(size_t))
        return tsr__error(TSR_E_INVALID, "tsr_backend_new: params.size is %zu; call tsr_backend_params_init first",
                          p->size);
    tsr_backend_params prm;
    backend_params_read(p, &prm);
    tsr_backend *b = tsr__calloc(1, sizeof *b);
    if (!b)
        return tsr__error(TSR_E_NOMEM, "tsr_backend_new: out of host memory");
    tsr_status s = backend_init(b, &prm);
    if (s != TSR_OK) {
        tsr_backend_free(b);
        return s;
    }
    *out = b;
    return TSR_OK;
}

static void backend_destroy(tsr_backend *b) {
    tsr__sched_free(b->sched);
    tsr__weights_free(b);
    for (size_t i = 0; b->streams && i < b->n_devices; i++)
        if (b->streams[i])
            b->devices[i]->iface->stream_free(b->streams[i]);
    tsr__free(b->streams);
    tsr__free(b->devices);
    tsr__free(b->plan_weights);
    tsr__free(b->plan_kv);
    tsr__free(b->plan_compute);
    tsr__free(b->plan_stream);
    tsr__free(b->live);
    tsr__free(b->live_weights);
    tsr__free(b->layer_buft);
    tsr__free(b);
}

/* As sqlite3_close_v2 and tsr_model_free: a backend whose contexts or KV
 * caches are still open stays alive (and they stay usable) until the last
 * of them closes, instead of leaving them dangling. */
void tsr_backend_free(tsr_backend *b) {
    if (!b)
        return;
    if (b->n_open_contexts || b->n_open_caches) {
        char n[48];
        tsr__log(TSR_LOG_WARN, "tsr_backend_free with contexts or KV caches still open: freed when they close", 1,
                 "open", tsr__fmt(n, sizeof n, "%zu contexts, %zu caches", b->n_open_contexts, b->n_open_caches));
        b->freed = true;
        return;
    }
    backend_destroy(b);
}

void tsr__backend_release(tsr_backend *b) {
    if (b && b->freed && !b->n_open_contexts && !b->n_open_caches)
        backend_destroy(b);
}

size_t tsr_backend_n_devices(const tsr_backend *b) { return b ? b->n_devices : 0; }
tsr_device *tsr_backend_device(const tsr_backend *b, size_t i) { return b && i < b->n_devices ? b->devices[i] : NULL; }
int tsr_backend_n_threads(const tsr_backend *b) { return b ? b->n_threads : 0; }
int tsr_backend_flash_attn(const tsr_backend *b) { return b ? b->flash_attn : 0; }
size_t tsr_backend_attn_max_batch(const tsr_backend *b) { return b ? b->attn_max_batch : 0; }
size_t tsr_backend_n_splits(const tsr_backend *b) { return b ? b->n_splits : 0; }
size_t tsr_backend_n_copies(const tsr_backend *b) { return b ? b->n_copies : 0; }

tsr_status tsr_backend_memory_plan(const tsr_backend *b, size_t i, size_t *weights, size_t *kv_cache, size_t *compute) {
    if (!b)
        return tsr__error(TSR_E_INVALID, "tsr_backend_memory_plan: NULL backend");
    if (i >= b->n_devices)
        return tsr__error(TSR_E_RANGE, "tsr_backend_memory_plan: no device %zu in the backend", i);
    if (weights)
        *weights = b->plan_weights[i];
    if (kv_cache)
        *kv_cache = b->plan_kv[i];
    if (compute)
        *compute = b->plan_compute[i];
    return TSR_OK;
}

void tsr_backend_log_plan(const tsr_backend *b) {
    if (!b)
        return;
    for (size_t i = 0; i < b->n_devices; i++) {
        char w[32], k[32], c[32], p[32], f[32], t[32];
        size_t fr = 0, tot = 0;
        tsr_device_memory(b->devices[i], &fr, &tot);
        double sum = (double)b->plan_weights[i] + (double)b->plan_kv[i] + (double)b->plan_compute[i];
        /* available = free now + what this backend already holds there */
        tsr__log(TSR_LOG_INFO, "memory plan", 7, "device", b->devices[i]->name, "weights_mib",
                 tsr__fmt(w, sizeof w, "%.2f", b->plan_weights[i] / 1048576.0), "kv_cache_mib",
                 tsr__fmt(k, sizeof k, "%.2f", b->plan_kv[i] / 1048576.0), "compute_mib",
                 tsr__fmt(c, sizeof c, "%.2f", b->plan_compute[i] / 1048576.0), "plan_mib",
                 tsr__fmt(p, sizeof p, "%.2f", sum / 1048576.0), "available_mib",
                 tsr__fmt(f, sizeof f, "%.2f", ((double)fr + (double)b->live[i]) / 1048576.0), "total_mib",
                 tsr__fmt(t, sizeof t, "%.2f", tot / 1048576.0));
    }
}

/* ---- dry runs (tsr_fit) ----------------------------------------------------------- */

void tsr__backend_set_plan_mode(tsr_backend *b, bool on) { b->plan_mode = on; }

void tsr__backend_set_plan_gguf(tsr_backend *b, tsr_gguf *g) { b->plan_gguf = g; }

tsr_gguf *tsr__backend_plan_gguf(const tsr_backend *b) { return b && b->plan_mode ? b->plan_gguf : NULL; }

/* Forgets the planned weights (declared, never allocated) and the whole
 * plan, so that the next dry run starts from nothing. */
void tsr__backend_plan_reset(tsr_backend *b) {
    tsr__weights_free(b);
    tsr__free(b->layer_buft);
    b->layer_buft = NULL;
    b->n_layers = 0;
    for (size_t d = 0; d < b->n_devices; d++)
        b->plan_weights[d] = b->plan_kv[d] = b->plan_compute[d] = b->plan_stream[d] = 0;
}

size_t tsr__backend_plan_stream(const tsr_backend *b, size_t i) { return i < b->n_devices ? b->plan_stream[i] : 0; }
