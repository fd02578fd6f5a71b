/*
 * fake.c - test-only devices that behave like GPUs to the core, backed by
 * host memory and the CPU kernels. TSR_FAKE_DEVICES (read once, at the first
 * device enumeration) lists them: "FAKE0:256MiB,FAKE1:1GiB" (sizes in B,
 * KiB/MiB/GiB or K/M/G). Each fake device:
 *  - is a TSR_DEVICE_GPU named as given (description "libtensr fake device"),
 *    registered before the CPU (as GPUs are);
 *  - has its own buffer type, named like the device, with is_host = false,
 *    so the scheduler must copy inputs and tensors of other devices into its
 *    compute buffer exactly as for a real GPU, and a pinned-host staging
 *    buffer type "<NAME>_Host";
 *  - enforces its memory size: an allocation past it fails with
 *    TSR_E_DEVICE_NOMEM naming the device, the size asked and the free memory;
 *  - checks, before running nodes, that every node and every source lives in
 *    its own memory: a scheduler bug that lets a device read another
 *    device's memory is an error here instead of a silent success;
 *  - runs every op the CPU runs except ARGMAX, so that the CPU fallback of an
 *    unsupported op is exercised too;
 *  - with TSR_FAKE_STREAM_BYTES=SIZE, each stream takes SIZE bytes of the
 *    device's memory outside any buffer (as a CUDA stream's cuBLAS workspace
 *    and scratch do) and reports them through the iface's stream_bytes, so
 *    that the planner's count of stream memory can be tested;
 *  - with TSR_FAKE_FAULT=op[,op...] (op names as tsr__op_name gives them,
 *    read at each compute), computes those ops wrongly by a little: the
 *    element of largest magnitude of each such node's output moved by a
 *    relative 1e-2 (F32, F16, BF16; an I32 output's first element plus 1),
 *    so that a harness can show it would catch a wrong kernel.
 * It sees the CPU only as the host device, through its function tables, as
 * any backend could. The same file also builds as a run-time module
 * (TSR_FAKE_MODULE, tests/libtensr-fake.so): it then reaches the core only
 * through the services the loader hands it (module.h), takes its devices
 * from TSR_FAKE_MODULE_DEVICES (default FAKEMOD0:256MiB) and registers as
 * "fake-module"; with TSR_FAKE_MODULE_ABI_SKEW it claims a wrong ABI
 * version, so that the loader's refusal can be tested.
 */
#include "device.h"
#ifdef TSR_FAKE_MODULE
#include "module.h"
#define FAKE_ENV "TSR_FAKE_MODULE_DEVICES"
#define FAKE_DEFAULT "FAKEMOD0:256MiB"
#define FAKE_REG_NAME "fake-module"
#else
#define FAKE_ENV "TSR_FAKE_DEVICES"
#define FAKE_DEFAULT NULL
#define FAKE_REG_NAME "fake"
#endif

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#define FAKE_MAX 8
#define FAKE_HEADER 64 /* bytes before each allocation: its size (for the accounting) */

typedef struct fake_dev {
    tsr_device dev;
    tsr_buffer_type buft, host_buft;
    size_t total, used;
    pthread_mutex_t lock;
} fake_dev;

static fake_dev fakes[FAKE_MAX];
static size_t n_fakes;

/* A stream of the host device, remembered with the fake device it serves. */
typedef struct fake_stream {
    tsr_device *dev;
    tsr_stream *host;
    size_t held; /* TSR_FAKE_STREAM_BYTES taken from the device */
} fake_stream;

static bool parse_size(const char *s, size_t *out);

/* TSR_FAKE_STREAM_BYTES, 0 when unset or malformed. */
static size_t fake_stream_held(void) {
    const char *env = getenv("TSR_FAKE_STREAM_BYTES");
    size_t n = 0;
    return env && parse_size(env, &n) ? n : 0;
}

static fake_dev *fake_of(const tsr_device *d) { return (fake_dev *)d->impl; }

/* ---- buffer type: host memory with a device limit ----------------------- */

static tsr_status fake_alloc(tsr_buffer_type *bt, size_t size, void **base, void **handle) {
    fake_dev *f = bt->impl;
    size_t padded = tsr__pad(size, bt->alignment), all, hdr = bt->alignment > FAKE_HEADER ? bt->alignment : FAKE_HEADER;
    if (padded < size || tsr__add_overflow(padded, hdr, &all))
        return tsr__error(TSR_E_DEVICE_NOMEM, "%s: cannot allocate %zu bytes: size overflows", f->dev.name, size);
    pthread_mutex_lock(&f->lock);
    size_t free_b = f->total - f->used;
    bool fits = padded <= free_b;
    if (fits)
        f->used += padded;
    pthread_mutex_unlock(&f->lock);
    if (!fits)
        return tsr__error(TSR_E_DEVICE_NOMEM, "%s: cannot allocate %.2f MiB (%zu bytes): %.2f MiB free of %.2f MiB",
                          f->dev.name, size / 1048576.0, size, free_b / 1048576.0, f->total / 1048576.0);
    char *p = tsr__aligned_alloc(hdr, all);
    if (!p) {
        pthread_mutex_lock(&f->lock);
        f->used -= padded;
        pthread_mutex_unlock(&f->lock);
        return tsr__error(TSR_E_DEVICE_NOMEM, "%s: cannot allocate %.2f MiB (%zu bytes): the host allocation failed",
                          f->dev.name, size / 1048576.0, size);
    }
    memcpy(p, &padded, sizeof padded);
    *handle = p;
    *base = p + hdr;
    return TSR_OK;
}

static void fake_free(tsr_buffer_type *bt, void *base, void *handle) {
    (void)base;
    fake_dev *f = bt->impl;
    size_t padded;
    memcpy(&padded, handle, sizeof padded);
    pthread_mutex_lock(&f->lock);
    f->used -= padded;
    pthread_mutex_unlock(&f->lock);
    tsr__aligned_free(handle);
}

static tsr_status fake_set(tsr_buffer *buf, void *dst, const void *host, size_t size) {
    (void)buf;
    if (size)
        memcpy(dst, host, size);
    return TSR_OK;
}

static tsr_status fake_get(tsr_buffer *buf, const void *src, void *host, size_t size) {
    (void)buf;
    if (size)
        memcpy(host, src, size);
    return TSR_OK;
}

static tsr_status fake_memset(tsr_buffer *buf, void *dst, int value, size_t size) {
    (void)buf;
    if (size)
        memset(dst, value, size);
    return TSR_OK;
}

static tsr_status fake_copy(tsr_buffer *db, void *dst, tsr_buffer *sb, const void *src, size_t size) {
    (void)db, (void)sb;
    if (size)
        memmove(dst, src, size);
    return TSR_OK;
}

static const tsr_buft_iface fake_buft_iface = {fake_alloc,  fake_free, fake_set, fake_get,
                                               fake_memset, fake_copy, NULL,     NULL};

/* ---- device ---------------------------------------------------------------- */

static tsr_status fake_memory(const tsr_device *d, size_t *free_b, size_t *total) {
    fake_dev *f = fake_of(d);
    pthread_mutex_lock(&f->lock);
    *free_b = f->total - f->used;
    *total = f->total;
    pthread_mutex_unlock(&f->lock);
    return TSR_OK;
}

static bool fake_supports(const tsr_device *d, const tsr_tensor *op) {
    (void)d;
    const tsr_device *host = tsr__host_device_early();
    return op->op != TSR_OP_ARGMAX && host && host->iface->supports_op(host, op);
}

/* Memory of t (following views) must be one of this device's buffers. */
static bool fake_owns(const tsr_device *d, const tsr_tensor *t) {
    if (tsr__nbytes(t) == 0)
        return true;
    const tsr_tensor *r = tsr__view_root((tsr_tensor *)t);
    return r->buffer && r->buffer->buft == d->buft && r->data;
}

static tsr_status fake_stream_new(tsr_device *d, int n_threads, tsr_stream **out) {
    *out = NULL;
    tsr_device *host = tsr__host_device_early();
    fake_stream *fs = tsr__calloc(1, sizeof *fs);
    if (!fs)
        return tsr__error(TSR_E_NOMEM, "%s: out of memory creating a stream", d->name);
    tsr_status st = host->iface->stream_new(host, n_threads, &fs->host);
    if (st != TSR_OK) {
        tsr__free(fs);
        return st;
    }
    fs->dev = d;
    fake_dev *f = fake_of(d);
    size_t held = fake_stream_held();
    pthread_mutex_lock(&f->lock);
    bool fits = held <= f->total - f->used;
    if (fits)
        f->used += held;
    pthread_mutex_unlock(&f->lock);
    if (!fits) {
        host->iface->stream_free(fs->host);
        tsr__free(fs);
        return tsr__error(TSR_E_DEVICE_NOMEM, "%s: no memory for the stream's %zu bytes of scratch", d->name, held);
    }
    fs->held = held;
    *out = (tsr_stream *)fs;
    return TSR_OK;
}

static size_t fake_stream_bytes(const tsr_device *d, tsr_tensor *const *nodes, size_t n) {
    (void)d;
    (void)nodes;
    (void)n;
    return fake_stream_held();
}

static void fake_stream_free(tsr_stream *s) {
    fake_stream *fs = (fake_stream *)s;
    if (!fs)
        return;
    tsr__host_device_early()->iface->stream_free(fs->host);
    fake_dev *f = fake_of(fs->dev);
    pthread_mutex_lock(&f->lock);
    f->used -= fs->held;
    pthread_mutex_unlock(&f->lock);
    tsr__free(fs);
}

static tsr_status fake_reserve(tsr_stream *s, tsr_tensor *const *nodes, size_t n) {
    return tsr__host_device_early()->iface->reserve(((fake_stream *)s)->host, nodes, n);
}

/* op's name is in TSR_FAKE_FAULT's comma-separated list. */
static bool fake_faulty(tsr_op op) {
    const char *list = getenv("TSR_FAKE_FAULT"), *name = tsr__op_name(op);
    const size_t len = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        const size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == len && strncasecmp(p, name, n) == 0)
            return true;
        p = end ? end + 1 : NULL;
    }
    return false;
}

/* TSR_FAKE_FAULT: node's output, computed, made slightly wrong: its finite
 * element of largest magnitude times about 1.01 (F16: 10 units of the last
 * place, BF16: 1; a zero output gets 0.01), an I32 output's first element
 * plus 1. Magnitudes of F16 and BF16 compare as their bits without the sign. */
static void fake_fault(const tsr_tensor *node) {
    const tsr_type t = node->type;
    if (tsr__nbytes(node) == 0 || !node->data ||
        (t != TSR_TYPE_F32 && t != TSR_TYPE_F16 && t != TSR_TYPE_BF16 && t != TSR_TYPE_I32))
        return;
    char *base = node->data, *at = NULL;
    if (t == TSR_TYPE_I32) {
        int32_t v;
        memcpy(&v, base, sizeof v);
        v = v == INT32_MAX ? v - 1 : v + 1;
        memcpy(base, &v, sizeof v);
        return;
    }
    float best = -1.0f;
    for (int64_t i3 = 0; i3 < node->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < node->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < node->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < node->ne[0]; i0++) {
                    char *p = base + i0 * node->nb[0] + i1 * node->nb[1] + i2 * node->nb[2] + i3 * node->nb[3];
                    float a;
                    uint16_t h;
                    if (t == TSR_TYPE_F32) {
                        memcpy(&a, p, sizeof a);
                        a = fabsf(a);
                    } else {
                        memcpy(&h, p, sizeof h);
                        h &= 0x7FFF;
                        a = h >= (t == TSR_TYPE_F16 ? 0x7C00 : 0x7F80) ? NAN : (float)h;
                    }
                    if (a > best) /* (NaN never) */
                        best = a, at = p;
                }
    if (!at)
        return;
    if (t == TSR_TYPE_F32) {
        float v;
        memcpy(&v, at, sizeof v);
        v = v != 0.0f ? v * 1.01f : 0.01f;
        memcpy(at, &v, sizeof v);
        return;
    }
    uint16_t h;
    memcpy(&h, at, sizeof h);
    if ((h & 0x7FFF) == 0)
        h = t == TSR_TYPE_F16 ? 0x211F : 0x3C24; /* 0.01 */
    else if ((h & 0x7FFF) < (t == TSR_TYPE_F16 ? 0x7BF0 : 0x7F70))
        h = (uint16_t)(h + (t == TSR_TYPE_F16 ? 10 : 1));
    else
        h = (uint16_t)(h - (t == TSR_TYPE_F16 ? 10 : 1));
    memcpy(at, &h, sizeof h);
}

static tsr_status fake_compute(tsr_stream *s, tsr_tensor *const *nodes, size_t n) {
    const tsr_device *d = ((fake_stream *)s)->dev;
    for (size_t i = 0; i < n; i++) {
        const tsr_tensor *node = nodes[i];
        if (!fake_owns(d, node))
            return tsr__error(TSR_E_DEVICE, "%s: node '%s' (%s) writes memory that is not on this device", d->name,
                              node->name, tsr__op_name(node->op));
        for (int j = 0; j < TSR_MAX_SRC; j++)
            if (node->src[j] && !fake_owns(d, node->src[j])) {
                const tsr_buffer *b = tsr__view_root(node->src[j])->buffer;
                return tsr__error(TSR_E_DEVICE, "%s: node '%s' (%s) reads '%s' from %s memory", d->name, node->name,
                                  tsr__op_name(node->op), node->src[j]->name, b ? b->buft->name : "system");
            }
    }
    tsr_device *host = tsr__host_device_early();
    tsr_status st = host->iface->compute(((fake_stream *)s)->host, nodes, n);
    if (st != TSR_OK || !getenv("TSR_FAKE_FAULT"))
        return st;
    if ((st = host->iface->synchronize(((fake_stream *)s)->host)) != TSR_OK)
        return st;
    for (size_t i = 0; i < n; i++)
        if (fake_faulty(nodes[i]->op))
            fake_fault(nodes[i]);
    return TSR_OK;
}

static tsr_status fake_sync(tsr_stream *s) {
    return tsr__host_device_early()->iface->synchronize(((fake_stream *)s)->host);
}

static const tsr_device_iface fake_dev_iface = {fake_memory,  fake_supports, fake_stream_new, fake_stream_free,
                                                fake_reserve, fake_compute,  fake_sync,       fake_stream_bytes};

/* ---- enumeration from TSR_FAKE_DEVICES ------------------------------------- */

/* "256MiB" -> bytes; false when malformed. */
static bool parse_size(const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0)
        return false;
    static const struct {
        const char *suffix;
        double mul;
    } units[] = {{"", 1},
                 {"B", 1},
                 {"K", 1024.0},
                 {"KiB", 1024.0},
                 {"KB", 1024.0},
                 {"M", 1048576.0},
                 {"MiB", 1048576.0},
                 {"MB", 1048576.0},
                 {"G", 1073741824.0},
                 {"GiB", 1073741824.0},
                 {"GB", 1073741824.0}};
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (strcasecmp(end, units[i].suffix) == 0) {
            double bytes = v * units[i].mul;
            if (bytes >= 1.8e19)
                return false;
            *out = (size_t)bytes;
            return true;
        }
    return false;
}

static bool add_fake(const char *item) {
    const char *colon = strchr(item, ':');
    size_t name_len = colon ? (size_t)(colon - item) : 0;
    size_t total;
    if (!colon || name_len == 0 || name_len > 20 || !parse_size(colon + 1, &total)) {
        char buf[64];
        tsr__log(TSR_LOG_WARN, "TSR_FAKE_DEVICES: ignoring an entry (expected NAME:SIZE, e.g. FAKE0:256MiB)", 1,
                 "entry", tsr__fmt(buf, sizeof buf, "%s", item));
        return false;
    }
    for (size_t i = 0; i < n_fakes; i++)
        if (strncasecmp(fakes[i].dev.name, item, name_len) == 0 && fakes[i].dev.name[name_len] == '\0')
            name_len = 0;
    if (name_len == 0 || (name_len == 3 && strncasecmp(item, "CPU", 3) == 0)) {
        tsr__log(TSR_LOG_WARN, "TSR_FAKE_DEVICES: ignoring a duplicate device name", 0);
        return false;
    }
    fake_dev *f = &fakes[n_fakes];
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->lock, NULL);
    f->total = total;
    snprintf(f->dev.name, sizeof f->dev.name, "%.*s", (int)name_len, item);
    snprintf(f->dev.description, sizeof f->dev.description, "libtensr fake device");
    f->dev.kind = TSR_DEVICE_GPU;
    f->dev.iface = &fake_dev_iface;
    f->dev.impl = f;
    f->dev.buft = &f->buft;
    f->dev.host_buft = &f->host_buft;
    f->buft = (tsr_buffer_type){&fake_buft_iface, "", &f->dev, TSR_ALIGN, false, false, f};
    snprintf(f->buft.name, sizeof f->buft.name, "%.*s", (int)name_len, item);
    f->host_buft = (tsr_buffer_type){tsr__host_device_early()->buft->iface, "", &f->dev, TSR_ALIGN, true, true, NULL};
    snprintf(f->host_buft.name, sizeof f->host_buft.name, "%.*s_Host", (int)name_len, item);
    n_fakes++;
    return true;
}

static size_t fake_enumerate(tsr_device **devs, size_t max) {
    const char *env = getenv(FAKE_ENV);
    if (!env)
        env = FAKE_DEFAULT;
    if (!env || !*env || !tsr__host_device_early())
        return 0;
    char spec[512];
    snprintf(spec, sizeof spec, "%s", env);
    char *save = NULL;
    for (char *item = strtok_r(spec, ",", &save); item && n_fakes < FAKE_MAX && n_fakes < max;
         item = strtok_r(NULL, ",", &save))
        add_fake(item);
    for (size_t i = 0; i < n_fakes; i++) devs[i] = &fakes[i].dev;
    return n_fakes;
}

static const tsr_device_reg fake_reg = {FAKE_REG_NAME, fake_enumerate, NULL};

#ifdef TSR_FAKE_MODULE
TSR_MODULE_SERVICES_DEFINE

TSR_MODULE_EXPORT const tsr_device_module *TSR_MODULE_ENTRY(const tsr_module_services *svc) {
    static tsr_device_module mod = TSR_DEVICE_MODULE_INIT(&fake_reg);
    if (!tsr__module_attach(svc))
        return NULL;
#ifdef TSR_FAKE_MODULE_ABI_SKEW
    mod.abi_version = TSR_MODULE_ABI_VERSION + 1;
#endif
    return &mod;
}
#else
const tsr_device_reg *tsr__fake_device_reg(void) { return &fake_reg; }
#endif
