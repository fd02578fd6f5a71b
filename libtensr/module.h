/*
 * module.h - for backends built as run-time modules (outside libtensr.so):
 * the tsr__ helpers of internal.h that a backend uses, routed through the
 * services table the core hands the module's entry point. Include it after
 * device.h; expand TSR_MODULE_SERVICES_DEFINE in exactly one file of the
 * module, and call tsr__module_attach(svc) first thing in the entry point.
 * A module links nothing of libtensr: hidden symbols are out of its reach,
 * and the services are the whole contract.
 */
#ifndef TSR_MODULE_H
#define TSR_MODULE_H

#include "device.h"

#include <stdio.h>

extern const tsr_module_services *tsr__svc;

#define TSR_MODULE_SERVICES_DEFINE const tsr_module_services *tsr__svc;

/* Keeps the core's services; false when they are older than this module needs. */
static inline bool tsr__module_attach(const tsr_module_services *svc) {
    if (!svc || svc->abi_version != TSR_MODULE_ABI_VERSION || svc->size < sizeof(tsr_module_services))
        return false;
    tsr__svc = svc;
    return true;
}

static inline tsr_status tsr__module_error(tsr_status s, const char *fmt, ...) TSR_PRINTF(2, 3);
static inline tsr_status tsr__module_error(tsr_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    s = tsr__svc->verror(s, fmt, ap);
    va_end(ap);
    return s;
}

static inline void tsr__module_log(tsr_log_level level, const char *msg, size_t n_fields, ...) {
    if (!tsr__svc->log_enabled(level))
        return;
    const char *kv[64];
    if (n_fields > 32)
        n_fields = 32;
    va_list ap;
    va_start(ap, n_fields);
    for (size_t i = 0; i < 2 * n_fields; i++) kv[i] = va_arg(ap, const char *);
    va_end(ap);
    tsr__svc->log(level, msg, n_fields, kv);
}

static inline const char *tsr__module_fmt(char *buf, size_t size, const char *fmt, ...) TSR_PRINTF(3, 4);
static inline const char *tsr__module_fmt(char *buf, size_t size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    return buf;
}

static inline tsr_tensor *tsr__module_view_root(tsr_tensor *t) {
    while (t->view_src) t = t->view_src;
    return t;
}

static inline const char *tsr__module_op_name(tsr_op op) {
    const tsr_op_info *info = tsr__svc->op_info(op);
    return info ? info->name : "?";
}

#define tsr__error tsr__module_error
#define tsr__log tsr__module_log
#define tsr__fmt tsr__module_fmt
#define tsr__view_root tsr__module_view_root
#define tsr__op_name tsr__module_op_name
#define tsr__malloc(n) tsr__svc->malloc(n)
#define tsr__calloc(n, size) tsr__svc->calloc(n, size)
#define tsr__realloc(p, n) tsr__svc->realloc(p, n)
#define tsr__free(p) tsr__svc->free(p)
#define tsr__aligned_alloc(align, n) tsr__svc->aligned_alloc(align, n)
#define tsr__aligned_free(p) tsr__svc->aligned_free(p)
#define tsr__plan_count() tsr__svc->plan_count()
#define tsr__type_traits(type) tsr__svc->type_traits(type)
#define tsr__op_info(op) tsr__svc->op_info(op)
#define tsr__nbytes(t) tsr__svc->tensor_nbytes(t)
#define tsr__host_device_early() tsr__svc->host_device()

#endif /* TSR_MODULE_H */
