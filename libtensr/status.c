/*
 * status.c - status codes and their strings (one X-macro table), the
 * thread-local error detail, the version, and the allocation wrappers every
 * allocation in the library goes through (so tests can count allocations and
 * make the Nth one fail).
 */
#include "internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#define TSR_STATUS_TABLE(X)                       \
    X(TSR_OK, "ok")                               \
    X(TSR_E_INVALID, "invalid argument")          \
    X(TSR_E_NOMEM, "out of host memory")          \
    X(TSR_E_DEVICE_NOMEM, "out of device memory") \
    X(TSR_E_IO, "I/O error")                      \
    X(TSR_E_MALFORMED, "malformed data")          \
    X(TSR_E_UNSUPPORTED, "unsupported")           \
    X(TSR_E_NOT_FOUND, "not found")               \
    X(TSR_E_DEVICE, "device error")               \
    X(TSR_E_CANCELLED, "cancelled")               \
    X(TSR_E_FULL, "no room in the KV cache")      \
    X(TSR_E_TYPE, "type mismatch")                \
    X(TSR_E_STATE, "invalid state")               \
    X(TSR_E_RANGE, "out of range")

const char *tsr_status_string(tsr_status s) {
    switch (s) {
#define TSR_STATUS_CASE(code, text) \
    case code: return text;
        TSR_STATUS_TABLE(TSR_STATUS_CASE)
#undef TSR_STATUS_CASE
    }
    return "unknown status";
}

/* ---- version ------------------------------------------------------------ */

#define TSR_STR2(x) #x
#define TSR_STR(x) TSR_STR2(x)

unsigned tsr_version(void) { return TSR_VERSION_NUMBER; }

const char *tsr_version_string(void) {
    return TSR_STR(TSR_VERSION_MAJOR) "." TSR_STR(TSR_VERSION_MINOR) "." TSR_STR(TSR_VERSION_PATCH);
}

/* ---- thread-local error detail ------------------------------------------ */

static _Thread_local char tsr_error_buf[1024];

const char *tsr_last_error(void) { return tsr_error_buf; }

void tsr_clear_error(void) { tsr_error_buf[0] = '\0'; }

tsr_status tsr__verror(tsr_status s, const char *fmt, va_list ap) {
    if (fmt) { /* through a copy: an argument may be the current detail (a prefix added to it) */
        char tmp[sizeof tsr_error_buf];
        vsnprintf(tmp, sizeof tmp, fmt, ap);
        memcpy(tsr_error_buf, tmp, sizeof tmp);
    } else
        snprintf(tsr_error_buf, sizeof tsr_error_buf, "%s", tsr_status_string(s));
    return s;
}

tsr_status tsr__error(tsr_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tsr__verror(s, fmt, ap);
    va_end(ap);
    return s;
}

void tsr__error_prefix(const char *fmt, ...) {
    char prefix[512], old[sizeof tsr_error_buf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, tsr_error_buf, sizeof old);
    /* truncation is fine: the detail is for people */
    size_t n = strlen(prefix);
    if (n > sizeof tsr_error_buf - 3)
        n = sizeof tsr_error_buf - 3;
    memcpy(tsr_error_buf, prefix, n);
    memcpy(tsr_error_buf + n, ": ", 2);
    size_t rest = sizeof tsr_error_buf - n - 3;
    size_t m = strlen(old);
    if (m > rest)
        m = rest;
    memcpy(tsr_error_buf + n + 2, old, m);
    tsr_error_buf[n + 2 + m] = '\0';
}

/* ---- allocation wrappers ------------------------------------------------ */

static atomic_uint_fast64_t tsr_n_allocs;
static atomic_int_fast64_t tsr_fail_after = -1;
static atomic_int_fast64_t tsr_n_live; /* made and not yet freed */

uint64_t tsr__alloc_count(void) { return atomic_load(&tsr_n_allocs); }

int64_t tsr__alloc_live(void) { return atomic_load(&tsr_n_live); }

/* p, as returned by an allocation, counted as live when it is one. */
static void *alloc_made(void *p) {
    if (p)
        atomic_fetch_add(&tsr_n_live, 1);
    return p;
}

static void alloc_gone(void *p) {
    if (p)
        atomic_fetch_sub(&tsr_n_live, 1);
}

static atomic_bool tsr_fail_once; /* only the one allocation fails, then the hook disarms */

void tsr__fail_alloc_after(int64_t n) {
    atomic_store(&tsr_fail_once, false);
    atomic_store(&tsr_fail_after, n);
}

void tsr__fail_alloc_once(int64_t n) {
    atomic_store(&tsr_fail_once, true);
    atomic_store(&tsr_fail_after, n);
}

/* Counts an allocation; false when the test hook says this one must fail. */
static bool alloc_tick(void) {
    atomic_fetch_add(&tsr_n_allocs, 1);
    int_fast64_t left = atomic_load(&tsr_fail_after);
    while (left >= 0) {
        if (left == 0 && !atomic_load(&tsr_fail_once))
            return false;
        if (left == 0) { /* one thread wins the failure and disarms the hook */
            if (atomic_compare_exchange_weak(&tsr_fail_after, &left, -1))
                return false;
            continue;
        }
        if (atomic_compare_exchange_weak(&tsr_fail_after, &left, left - 1))
            break;
    }
    return true;
}

/* No allocator can give more than PTRDIFF_MAX bytes: such a size (a huge
 * count from a caller or a file) fails here as out of memory, before
 * malloc sees it (valgrind calls such an argument an error). */
#define TSR_ALLOC_MAX ((size_t)PTRDIFF_MAX)

void *tsr__malloc(size_t size) {
    if (!alloc_tick() || size > TSR_ALLOC_MAX)
        return NULL;
    return alloc_made(malloc(size ? size : 1));
}

void *tsr__calloc(size_t n, size_t size) {
    size_t bytes;
    if (!alloc_tick() || tsr__mul_overflow(n, size, &bytes) || bytes > TSR_ALLOC_MAX)
        return NULL;
    if (n == 0 || size == 0)
        n = size = 1;
    return alloc_made(calloc(n, size));
}

void *tsr__realloc(void *p, size_t size) {
    if (!alloc_tick() || size > TSR_ALLOC_MAX)
        return NULL;
    void *q = realloc(p, size ? size : 1);
    return p ? q : alloc_made(q); /* a resize is the same allocation */
}

void tsr__free(void *p) {
    alloc_gone(p);
    free(p);
}

bool tsr__grow(void **arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return true;
    size_t nc = *cap ? *cap : 16, bytes;
    while (nc < need)
        if (tsr__mul_overflow(nc, 2, &nc))
            return false;
    if (tsr__mul_overflow(nc, elem, &bytes))
        return false;
    void *p = tsr__realloc(*arr, bytes);
    if (!p)
        return false;
    *arr = p;
    *cap = nc;
    return true;
}

char *tsr__strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = tsr__malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

void *tsr__aligned_alloc(size_t alignment, size_t size) {
    if (alignment < TSR_ALIGN)
        alignment = TSR_ALIGN;
    if (!alloc_tick() || size > TSR_ALLOC_MAX)
        return NULL;
    void *p = NULL;
    if (posix_memalign(&p, alignment, size ? size : 1) != 0)
        return NULL;
    return alloc_made(p);
}

void tsr__aligned_free(void *p) {
    alloc_gone(p);
    free(p);
}

void tsr_free(void *p) { tsr__free(p); }
