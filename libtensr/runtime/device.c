/*
 * device.c - the device registry: backends are asked for their devices once
 * (GPU-like backends first, then the CPU), in a stable order; lookup by name
 * is case-insensitive. The first enumeration logs system info once.
 */
#include "core.h"

#include <pthread.h>
#include <stdio.h>
#include <strings.h>
#include <unistd.h>

#define TSR_MAX_DEVICES 64

static tsr_device *tsr_devices[TSR_MAX_DEVICES];
static size_t tsr_n_devices;
static char tsr_backend_names[128];
static pthread_once_t tsr_registry_once = PTHREAD_ONCE_INIT;

static tsr_device *tsr_host; /* the CPU: enumerated first, listed last */

static void note_backend(const char *name) {
    size_t len = strlen(tsr_backend_names);
    snprintf(tsr_backend_names + len, sizeof tsr_backend_names - len, "%s%s", len ? "," : "", name);
}

/* Appends reg's devices (one slot stays free for the host); returns how many it found. */
static size_t add_backend(const tsr_device_reg *reg) {
    size_t n = reg->enumerate(tsr_devices + tsr_n_devices, TSR_MAX_DEVICES - 1 - tsr_n_devices);
    tsr_n_devices += n;
    if (n)
        note_backend(reg->name);
    return n;
}

static void log_system_info(void) {
    char buf[4][64];
    const tsr_device_reg *cpu = tsr__cpu_device_reg();
    const char *features = cpu->features ? cpu->features() : "";
    tsr__log(TSR_LOG_INFO, "system info", 4, "version", tsr_version_string(), "cpu_features", features, "threads",
             tsr__fmt(buf[0], sizeof buf[0], "%ld", sysconf(_SC_NPROCESSORS_ONLN)), "backends", tsr_backend_names);
    for (size_t i = 0; i < tsr_n_devices; i++) {
        size_t free = 0, total = 0;
        tsr_device_memory(tsr_devices[i], &free, &total);
        tsr__log(TSR_LOG_INFO, "device", 5, "index", tsr__fmt(buf[1], sizeof buf[1], "%zu", i), "name",
                 tsr_devices[i]->name, "description", tsr_devices[i]->description, "free_mib",
                 tsr__fmt(buf[2], sizeof buf[2], "%zu", free >> 20), "total_mib",
                 tsr__fmt(buf[3], sizeof buf[3], "%zu", total >> 20));
    }
}

/* Order: modules (GPUs), the fake test devices, then the CPU. The CPU is
 * enumerated first all the same, so modules can use the host device while
 * they enumerate (tsr__host_device_early). */
static void enumerate_devices(void) {
    const tsr_device_reg *cpu = tsr__cpu_device_reg();
    tsr_device *host[1];
    tsr_host = cpu->enumerate(host, 1) ? host[0] : NULL;
    tsr__modules_load(add_backend);
    add_backend(tsr__fake_device_reg());
    if (tsr_host) {
        tsr_devices[tsr_n_devices++] = tsr_host;
        note_backend(cpu->name);
    }
    /* per-model indices and registry order */
    for (size_t i = 0; i < tsr_n_devices; i++) {
        tsr_devices[i]->registry_index = i;
        int idx = 0;
        for (size_t j = 0; j < i; j++)
            if (strcmp(tsr_devices[j]->description, tsr_devices[i]->description) == 0)
                idx++;
        tsr_devices[i]->index_in_model = idx;
    }
    log_system_info();
}

size_t tsr_device_count(void) {
    pthread_once(&tsr_registry_once, enumerate_devices);
    return tsr_n_devices;
}

tsr_device *tsr_device_get(size_t i) {
    size_t n = tsr_device_count();
    if (i < n)
        return tsr_devices[i];
    tsr__error(TSR_E_RANGE, "tsr_device_get: no device %zu (%zu devices)", i, n);
    return NULL;
}

tsr_device *tsr_device_by_name(const char *name) {
    size_t n = tsr_device_count();
    if (!name) {
        tsr__error(TSR_E_INVALID, "tsr_device_by_name: NULL name");
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        if (strcasecmp(tsr_devices[i]->name, name) == 0)
            return tsr_devices[i];
    char list[512] = "";
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", tsr_devices[i]->name);
    }
    tsr__error(TSR_E_NOT_FOUND, "no device named '%s' (devices: %s)", name, list);
    return NULL;
}

tsr_device *tsr__host_device(void) {
    tsr_device_count();
    return tsr_host;
}

tsr_device *tsr__host_device_early(void) { return tsr_host; }

const char *tsr_device_name(const tsr_device *d) { return d ? d->name : NULL; }
const char *tsr_device_description(const tsr_device *d) { return d ? d->description : NULL; }
tsr_device_class tsr_device_kind(const tsr_device *d) { return d ? d->kind : TSR_DEVICE_CPU; }
int tsr_device_index_in_model(const tsr_device *d) { return d ? d->index_in_model : -1; }
tsr_buffer_type *tsr_device_buffer_type(const tsr_device *d) { return d ? d->buft : NULL; }
tsr_buffer_type *tsr_device_host_buffer_type(const tsr_device *d) { return d ? d->host_buft : NULL; }

tsr_status tsr_device_memory(const tsr_device *d, size_t *free, size_t *total) {
    if (!d)
        return tsr__error(TSR_E_INVALID, "tsr_device_memory: NULL device");
    size_t f = 0, t = 0;
    tsr_status s = d->iface->memory(d, &f, &t);
    if (free)
        *free = f;
    if (total)
        *total = t;
    return s;
}

const char *tsr_backends_available(void) {
    tsr_device_count();
    return tsr_backend_names;
}

/* ---- buffer types by name -------------------------------------------------- */

static size_t buft_list(char *buf, size_t size) {
    size_t n = tsr_device_count(), len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        tsr_buffer_type *bts[2] = {tsr_devices[i]->buft, tsr_devices[i]->host_buft};
        for (int k = 0; k < 2; k++)
            if (bts[k] && len < size)
                len += (size_t)snprintf(buf + len, size - len, "%s%s", len ? ", " : "", bts[k]->name);
    }
    return len;
}

tsr_buffer_type *tsr_buffer_type_by_name(const char *name) {
    size_t n = tsr_device_count();
    if (!name) {
        tsr__error(TSR_E_INVALID, "tsr_buffer_type_by_name: NULL name");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (tsr_devices[i]->buft && strcasecmp(tsr_devices[i]->buft->name, name) == 0)
            return tsr_devices[i]->buft;
        if (tsr_devices[i]->host_buft && strcasecmp(tsr_devices[i]->host_buft->name, name) == 0)
            return tsr_devices[i]->host_buft;
    }
    char list[512];
    buft_list(list, sizeof list);
    tsr__error(TSR_E_NOT_FOUND, "unknown buffer type '%s' (valid: %s)", name, list);
    return NULL;
}

const char *tsr_buffer_type_name(const tsr_buffer_type *bt) { return bt ? bt->name : NULL; }
tsr_device *tsr_buffer_type_device(const tsr_buffer_type *bt) { return bt ? bt->device : NULL; }
