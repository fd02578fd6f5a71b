/*
 * module.c - run-time backend modules: the services the core lends them and
 * the loader. Modules come from the directories and files of
 * TSR_BACKEND_PATH (':'-separated; empty = none) or, when it is unset, from
 * the package's module folder (TSR_MODULE_DIR, $(pkglibdir)/modules). A
 * directory contributes its libtensr-*.so files in name order. Each module is
 * checked (entry point, ABI version, op count, struct sizes) before its
 * devices are enumerated; whatever goes wrong is logged with the path and the
 * reason, and the library goes on without that module.
 */
#include "core.h"

#include <dirent.h>
#include <errno.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#ifndef TSR_MODULE_DIR
#define TSR_MODULE_DIR ""
#endif

static tsr_device *services_host(void) { return tsr__host_device_early(); }

static const tsr_module_services tsr_services = {
    sizeof(tsr_module_services),
    TSR_MODULE_ABI_VERSION,
    tsr__verror,
    tsr__log_enabled,
    tsr__log_fields,
    tsr__malloc,
    tsr__calloc,
    tsr__realloc,
    tsr__free,
    tsr__aligned_alloc,
    tsr__aligned_free,
    tsr__type_traits,
    tsr__op_info,
    tsr__nbytes,
    services_host,
    tsr__plan_count,
};

const tsr_module_services *tsr__module_services(void) { return &tsr_services; }

static void module_log(tsr_log_level level, const char *msg, const char *path, const char *reason) {
    tsr__log(level, msg, 2, "path", path, "reason", reason);
}

/* Why m cannot be used with this core; NULL when it can. */
static const char *module_mismatch(const tsr_device_module *m, char *buf, size_t size) {
    if (m->abi_version != TSR_MODULE_ABI_VERSION)
        return tsr__fmt(buf, size, "built for backend ABI version %u, this library has version %u",
                        (unsigned)m->abi_version, (unsigned)TSR_MODULE_ABI_VERSION);
    if (m->op_count != TSR_OP_COUNT)
        return tsr__fmt(buf, size, "built with %u ops, this library has %u", (unsigned)m->op_count,
                        (unsigned)TSR_OP_COUNT);
    const tsr_device_module want = TSR_DEVICE_MODULE_INIT(NULL);
    if (m->sizeof_services != want.sizeof_services || m->sizeof_tensor != want.sizeof_tensor ||
        m->sizeof_device != want.sizeof_device || m->sizeof_device_iface != want.sizeof_device_iface ||
        m->sizeof_buffer_type != want.sizeof_buffer_type || m->sizeof_buft_iface != want.sizeof_buft_iface ||
        m->sizeof_buffer != want.sizeof_buffer || m->sizeof_reg != want.sizeof_reg)
        return tsr__fmt(buf, size, "shared struct sizes differ from this library's (tensor %zu, expected %zu)",
                        m->sizeof_tensor, want.sizeof_tensor);
    if (!m->reg || !m->reg->name || !m->reg->enumerate)
        return "the registration has no name or no enumerate function";
    return NULL;
}

/* Loads one module; true when it was kept (it found devices). */
static bool module_load(const char *path, size_t (*add)(const tsr_device_reg *reg)) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        module_log(TSR_LOG_INFO, "backend module skipped", path, e ? e : "dlopen failed");
        return false;
    }
    tsr_module_init_fn init;
    void *sym = dlsym(h, TSR_MODULE_ENTRY_NAME);
    memcpy(&init, &sym, sizeof init); /* object to function pointer, as POSIX allows */
    char buf[160];
    const char *why = NULL;
    const tsr_device_module *m = NULL;
    if (!sym)
        why = "no entry point " TSR_MODULE_ENTRY_NAME;
    else if (!(m = init(&tsr_services)))
        why = "the module declined to start (its log says why)";
    else
        why = module_mismatch(m, buf, sizeof buf);
    if (why) {
        module_log(TSR_LOG_WARN, "backend module skipped", path, why);
        dlclose(h);
        return false;
    }
    size_t n = add(m->reg);
    if (n == 0) {
        tsr__log(TSR_LOG_INFO, "backend module has no device", 2, "path", path, "backend", m->reg->name);
        dlclose(h);
        return false;
    }
    tsr__log(TSR_LOG_INFO, "backend module loaded", 3, "path", path, "backend", m->reg->name, "devices",
             tsr__fmt(buf, sizeof buf, "%zu", n));
    return true; /* kept for the life of the process: its devices are registered */
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool is_module_name(const char *name) {
    size_t n = strlen(name);
    return strncmp(name, "libtensr-", 9) == 0 && n > 12 && strcmp(name + n - 3, ".so") == 0;
}

/* The libtensr-*.so files of dir, in name order. */
static size_t dir_load(const char *dir, bool quiet_if_missing, size_t (*add)(const tsr_device_reg *reg)) {
    DIR *d = opendir(dir);
    if (!d) {
        if (!quiet_if_missing)
            module_log(TSR_LOG_WARN, "backend module folder skipped", dir, strerror(errno));
        return 0;
    }
    char **names = NULL;
    size_t n = 0, cap = 0, kept = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!is_module_name(e->d_name))
            continue;
        char *s = tsr__strdup(e->d_name);
        if (!s || !TSR_GROW(names, cap, n + 1)) {
            tsr__free(s);
            module_log(TSR_LOG_WARN, "backend module folder skipped", dir, "out of host memory");
            break;
        }
        names[n++] = s;
    }
    closedir(d);
    if (n)
        qsort(names, n, sizeof *names, name_cmp);
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, names[i]) < sizeof path)
            kept += module_load(path, add);
        tsr__free(names[i]);
    }
    tsr__free(names);
    return kept;
}

static size_t path_load(const char *item, size_t (*add)(const tsr_device_reg *reg)) {
    struct stat st;
    if (stat(item, &st) != 0) {
        module_log(TSR_LOG_WARN, "backend module skipped", item, strerror(errno));
        return 0;
    }
    if (S_ISDIR(st.st_mode))
        return dir_load(item, false, add);
    return module_load(item, add);
}

size_t tsr__modules_load(size_t (*add)(const tsr_device_reg *reg)) {
    const char *env = getenv("TSR_BACKEND_PATH");
    if (!env)
        return TSR_MODULE_DIR[0] ? dir_load(TSR_MODULE_DIR, true, add) : 0;
    size_t kept = 0;
    for (const char *p = env; *p;) {
        size_t len = strcspn(p, ":");
        char item[4096];
        if (len > 0 && len < sizeof item) {
            memcpy(item, p, len);
            item[len] = '\0';
            kept += path_load(item, add);
        }
        p += len;
        if (*p == ':')
            p++;
    }
    return kept;
}
