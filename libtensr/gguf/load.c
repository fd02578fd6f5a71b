/*
 * load.c - tsr_backend_load_gguf: makes the tensors of a GGUF file the
 * backend's weights. Declares every tensor, lets placement (place.c) plan,
 * check and allocate one buffer per device, then reads the data with several
 * I/O threads. Each thread has its own file descriptor and reads with
 * pread(v) (no shared seek position: this is what makes network file systems
 * fast), over contiguous file sections cut into chunks, straight into host
 * buffers or through a staging buffer into device buffers. Optionally maps
 * CPU-resident weights from the file, and verifies float data and block
 * scales. On any failure everything the load created is freed and the first
 * real error is returned with its cause.
 *
 * Behaviour callers can rely on:
 *  - the backend must hold no weights yet (TSR_E_STATE otherwise); after a
 *    failure it holds none again and can load another file;
 *  - progress is called on the calling thread only: (0, total) before any
 *    read, then as chunks complete, then (total, total); total counts the
 *    bytes read (mapped weights are not read). A non-zero return stops the
 *    I/O threads after their current chunk: TSR_E_CANCELLED;
 *  - use_mmap: CPU-resident weights whose file offset is 32-byte aligned
 *    (except shared weights, which placement copies to other devices) point
 *    into a private copy-on-write mapping of the whole file, buffer type
 *    "CPU_Mapped", unmapped when the backend's weights are freed. A write
 *    to such a weight changes memory, never the file. The file must not
 *    shrink while mapped (the OS raises SIGBUS on access past its end).
 *    Placement is run once with plan_only first to learn which weights stay
 *    on the CPU, so its memory check counts them against free CPU memory;
 *  - verify: F32/F16/BF16 elements and the f16 scales of Q4_0, Q4_1, Q5_0,
 *    Q5_1, Q8_0 (d, m) and Q4_K, Q5_K (d, dmin), Q6_K (d) blocks must be
 *    finite; the error names the tensor and the element or block index;
 *  - plan_only: placement plans, checks and logs; no weight stays declared,
 *    the plan stays readable through tsr_backend_memory_plan.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* preadv */
#endif
#include "core.h"
#include "gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define LOAD_CHUNK ((size_t)8 << 20)      /* bytes one thread reads at a time: balances threads */
#define LOAD_MAX_GAP ((uint64_t)64 << 10) /* file gap (padding) still read inside one section */
#define LOAD_MAX_ITEMS 256                /* tensors per chunk: bounds the iovec list */
#define LOAD_AUTO_THREADS 4
#define LOAD_MAX_THREADS 64
#define LOAD_MAP_ALIGN 32 /* mapped tensors must start this aligned */

/* One weight's bytes in the file. */
typedef struct load_item {
    uint64_t off; /* absolute file offset */
    size_t size;
    tsr_tensor *t;
} load_item;

/* A unit of work: a file range inside one section (one destination buffer). */
typedef struct load_chunk {
    uint64_t off;
    size_t size;
    size_t first;   /* first item overlapping the range */
    size_t last;    /* end of its section's items: later items belong to another buffer */
    size_t payload; /* tensor bytes in the range (gaps excluded) */
    bool direct;    /* destination is host memory: read into place */
} load_chunk;

typedef struct load_state {
    const char *path;
    dev_t dev;
    ino_t ino;
    const load_item *items;
    size_t n_items;
    const load_chunk *chunks;
    size_t n_chunks;
    atomic_size_t next_chunk;
    atomic_uint_fast64_t done;
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_running;     /* guarded by mu */
    tsr_status status; /* first error (guarded by mu) */
    char error[1024];
} load_state;

typedef struct load_worker {
    load_state *st;
    pthread_t thread;
    bool started;
    int fd;
    char *junk;              /* file gaps are read into this */
    char *staging;           /* host memory for device destinations */
    tsr_buffer *staging_buf; /* when staging is the device's pinned host memory */
} load_worker;

/* ------------------------------------------------------------------------ */
/* The mapped-file buffer type: CPU memory freed with munmap.               */
/* ------------------------------------------------------------------------ */

static tsr_status map_alloc(tsr_buffer_type *bt, size_t size, void **base, void **handle) {
    (void)base;
    (void)handle;
    return tsr__error(TSR_E_UNSUPPORTED, "%s: buffer type holds mapped files only (asked %zu bytes)", bt->name, size);
}

static void map_free(tsr_buffer_type *bt, void *base, void *handle) {
    (void)bt;
    munmap(base, (size_t)(uintptr_t)handle);
}

static tsr_status map_memset(tsr_buffer *buf, void *dst, int value, size_t size) {
    (void)buf;
    memset(dst, value, size);
    return TSR_OK;
}

static const tsr_buft_iface map_iface = {map_alloc, map_free, NULL, NULL, map_memset, NULL, NULL, NULL};
static tsr_buffer_type map_buft;
static pthread_once_t map_buft_once = PTHREAD_ONCE_INIT;

static void map_buft_init(void) {
    tsr_device *cpu = tsr__host_device();
    map_buft.iface = &map_iface;
    snprintf(map_buft.name, sizeof map_buft.name, "CPU_Mapped");
    map_buft.device = cpu;
    map_buft.alignment = LOAD_MAP_ALIGN;
    map_buft.is_host = true;
}

static tsr_status add_weight_buffer(tsr_backend *b, tsr_buffer *buf) {
    tsr_weight_set *w = &b->weights;
    if (!TSR_GROW(w->buffers, w->cap_buffers, w->n_buffers + 1))
        return tsr__error(TSR_E_NOMEM, "out of host memory");
    w->buffers[w->n_buffers++] = buf;
    return TSR_OK;
}

/* Maps the whole file privately (copy-on-write, so a tsr_tensor_write on a
 * mapped weight changes memory, never the file, and cannot fault) and
 * registers it as a weight buffer; the backend unmaps it when its weights go. */
static tsr_status map_file(tsr_backend *b, const char *path, int fd, uint64_t file_size, tsr_buffer **out) {
    pthread_once(&map_buft_once, map_buft_init);
    if (file_size == 0 || file_size > SIZE_MAX)
        return tsr__error(TSR_E_INVALID, "%s: cannot map a file of %" PRIu64 " bytes", path, file_size);
    tsr_buffer *buf = tsr__calloc(1, sizeof *buf);
    if (!buf)
        return tsr__error(TSR_E_NOMEM, "%s: out of host memory", path);
    void *p = mmap(NULL, (size_t)file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        tsr__free(buf);
        return tsr__error(TSR_E_IO, "%s: mmap of %" PRIu64 " bytes failed: %s", path, file_size, strerror(errno));
    }
    buf->buft = &map_buft;
    buf->base = p;
    buf->size = (size_t)file_size;
    buf->handle = (void *)(uintptr_t)file_size;
    tsr_status s = add_weight_buffer(b, buf);
    if (s != TSR_OK)
        tsr_buffer_free(buf);
    else
        *out = buf;
    return s;
}

/* ------------------------------------------------------------------------ */
/* Errors from I/O threads                                                  */
/* ------------------------------------------------------------------------ */

/* Records the calling thread's last error as the load's error if it is the
 * first, and stops the other threads. */
static void record_error(load_state *st, tsr_status s) {
    pthread_mutex_lock(&st->mu);
    if (st->status == TSR_OK) {
        st->status = s;
        snprintf(st->error, sizeof st->error, "%s", tsr_last_error());
    }
    pthread_mutex_unlock(&st->mu);
    atomic_store(&st->stop, 1);
}

/* The tensor whose bytes are at (or after) file offset off in chunk c. */
static const load_item *item_at(const load_state *st, const load_chunk *c, uint64_t off) {
    for (size_t k = c->first; k < c->last; k++)
        if (st->items[k].off + st->items[k].size > off)
            return &st->items[k];
    return &st->items[c->last - 1];
}

static tsr_status read_error(const load_state *st, const load_chunk *c, uint64_t off, int err) {
    const load_item *it = item_at(st, c, off);
    if (err)
        return tsr__error(TSR_E_IO, "%s: tensor '%s' at offset %" PRIu64 ": read failed: %s", st->path, it->t->name,
                          off, strerror(err));
    return tsr__error(TSR_E_IO,
                      "%s: tensor '%s' at offset %" PRIu64 ": file ended early (it shrank while "
                      "loading)",
                      st->path, it->t->name, off);
}

/* preadv until every byte of iov[0..n) is read (short reads, EINTR). */
static tsr_status read_full(load_worker *w, const load_chunk *c, struct iovec *iov, int n, uint64_t off) {
    while (n > 0) {
        ssize_t r = preadv(w->fd, iov, n > IOV_MAX ? IOV_MAX : n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return read_error(w->st, c, off, r < 0 ? errno : 0);
        off += (uint64_t)r;
        for (size_t left = (size_t)r; n > 0 && (left > 0 || iov->iov_len == 0);) {
            size_t k = left < iov->iov_len ? left : iov->iov_len;
            iov->iov_base = (char *)iov->iov_base + k;
            iov->iov_len -= k;
            left -= k;
            if (iov->iov_len == 0) {
                iov++;
                n--;
            }
        }
    }
    return TSR_OK;
}

/* ------------------------------------------------------------------------ */
/* Reading one chunk                                                        */
/* ------------------------------------------------------------------------ */

/* Host destination: one preadv whose vector points at each tensor's place
 * (file gaps go to the junk buffer). */
static tsr_status read_direct(load_worker *w, const load_chunk *c) {
    const load_state *st = w->st;
    struct iovec iov[2 * LOAD_MAX_ITEMS + 2];
    int n = 0;
    uint64_t pos = c->off, end = c->off + c->size;
    if (!w->junk && !(w->junk = tsr__malloc(LOAD_MAX_GAP)))
        return tsr__error(TSR_E_NOMEM, "%s: out of host memory for the reader", st->path);
    for (size_t k = c->first; k < c->last && st->items[k].off < end; k++) {
        const load_item *it = &st->items[k];
        uint64_t a = it->off > pos ? it->off : pos, z = it->off + it->size < end ? it->off + it->size : end;
        if (a >= z)
            continue;
        if (a > pos)
            iov[n++] = (struct iovec){w->junk, (size_t)(a - pos)};
        iov[n++] = (struct iovec){(char *)it->t->data + (a - it->off), (size_t)(z - a)};
        pos = z;
    }
    return read_full(w, c, iov, n, c->off);
}

static tsr_status get_staging(load_worker *w, tsr_buffer *dst) {
    if (w->staging)
        return TSR_OK;
    tsr_buffer_type *hb = dst->buft->device ? dst->buft->device->host_buft : NULL;
    if (hb && hb->is_host && tsr_buffer_alloc(hb, LOAD_CHUNK, &w->staging_buf) == TSR_OK) {
        w->staging = w->staging_buf->base;
        return TSR_OK;
    }
    tsr_clear_error(); /* no pinned memory: plain memory works, only slower */
    w->staging = tsr__aligned_alloc(TSR_ALIGN, LOAD_CHUNK);
    return w->staging ? TSR_OK : tsr__error(TSR_E_NOMEM, "%s: out of host memory for staging", w->st->path);
}

/* Device destination: read the range into staging, then set each piece. */
static tsr_status read_staged(load_worker *w, const load_chunk *c) {
    const load_state *st = w->st;
    tsr_status s = get_staging(w, st->items[c->first].t->buffer);
    if (s != TSR_OK)
        return s;
    struct iovec iov = {w->staging, c->size};
    if ((s = read_full(w, c, &iov, 1, c->off)) != TSR_OK)
        return s;
    uint64_t end = c->off + c->size;
    for (size_t k = c->first; k < c->last && st->items[k].off < end; k++) {
        const load_item *it = &st->items[k];
        uint64_t a = it->off > c->off ? it->off : c->off, z = it->off + it->size < end ? it->off + it->size : end;
        if (a >= z)
            continue;
        s = tsr__buffer_set(it->t->buffer, (char *)it->t->data + (a - it->off), w->staging + (a - c->off),
                            (size_t)(z - a));
        if (s != TSR_OK) {
            tsr__error_prefix("%s: tensor '%s'", st->path, it->t->name);
            return s;
        }
    }
    return TSR_OK;
}

static void *worker_main(void *arg) {
    load_worker *w = arg;
    load_state *st = w->st;
    while (!atomic_load(&st->stop)) {
        size_t i = atomic_fetch_add(&st->next_chunk, 1);
        if (i >= st->n_chunks)
            break;
        const load_chunk *c = &st->chunks[i];
        tsr_status s = c->direct ? read_direct(w, c) : read_staged(w, c);
        if (s != TSR_OK) {
            record_error(st, s);
            break;
        }
        atomic_fetch_add(&st->done, c->payload);
        pthread_mutex_lock(&st->mu);
        pthread_cond_signal(&st->cv);
        pthread_mutex_unlock(&st->mu);
    }
    pthread_mutex_lock(&st->mu);
    st->n_running--;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* The read plan: items sorted by (buffer, offset), sections, chunks        */
/* ------------------------------------------------------------------------ */

static int cmp_item(const void *a, const void *b) {
    const load_item *x = a, *y = b;
    uintptr_t bx = (uintptr_t)x->t->buffer, by = (uintptr_t)y->t->buffer;
    if (bx != by)
        return bx < by ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

static bool buffer_is_direct(const tsr_buffer *buf) { return buf->buft->is_host && !buf->buft->is_pinned_host; }

/* End of the section starting at item k: items of the same buffer whose file
 * ranges follow each other with small gaps. */
static size_t section_end(const load_item *items, size_t n, size_t k) {
    size_t m = k + 1;
    while (m < n && items[m].t->buffer == items[k].t->buffer && items[m].off >= items[m - 1].off + items[m - 1].size &&
           items[m].off - (items[m - 1].off + items[m - 1].size) <= LOAD_MAX_GAP)
        m++;
    return m;
}

static tsr_status push_chunk(load_chunk **chunks, size_t *n, size_t *cap, load_chunk c) {
    if (!tsr__grow((void **)chunks, cap, *n + 1, sizeof **chunks))
        return tsr__error(TSR_E_NOMEM, "out of host memory planning the reads");
    (*chunks)[(*n)++] = c;
    return TSR_OK;
}

/* Payload bytes of items[j..] inside [a, z). */
static size_t payload_of(const load_item *items, size_t n, size_t j, uint64_t a, uint64_t z) {
    size_t sum = 0;
    for (; j < n && items[j].off < z; j++) {
        uint64_t lo = items[j].off > a ? items[j].off : a, hi = items[j].off + items[j].size;
        if (hi > z)
            hi = z;
        if (hi > lo)
            sum += (size_t)(hi - lo);
    }
    return sum;
}

static tsr_status build_chunks(const load_item *items, size_t n, load_chunk **out, size_t *n_out) {
    size_t cap = 0;
    *out = NULL;
    *n_out = 0;
    for (size_t k = 0; k < n;) {
        size_t m = section_end(items, n, k), j = k;
        uint64_t pos = items[k].off, end = items[m - 1].off + items[m - 1].size;
        bool direct = buffer_is_direct(items[k].t->buffer);
        while (pos < end) {
            while (items[j].off + items[j].size <= pos) j++;
            uint64_t cend = end - pos > LOAD_CHUNK ? pos + LOAD_CHUNK : end;
            if (j + LOAD_MAX_ITEMS < m && items[j + LOAD_MAX_ITEMS].off < cend)
                cend = items[j + LOAD_MAX_ITEMS].off;
            load_chunk c = {pos, (size_t)(cend - pos), j, m, payload_of(items, m, j, pos, cend), direct};
            tsr_status s = push_chunk(out, n_out, &cap, c);
            if (s != TSR_OK)
                return s;
            pos = cend;
        }
        k = m;
    }
    return TSR_OK;
}

/* ------------------------------------------------------------------------ */
/* Running the threads                                                      */
/* ------------------------------------------------------------------------ */

static tsr_status open_worker_fd(load_state *st, load_worker *w) {
    w->fd = open(st->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (w->fd < 0)
        return tsr__error(TSR_E_IO, "%s: cannot open: %s", st->path, strerror(errno));
    struct stat sb;
    if (fstat(w->fd, &sb) != 0)
        return tsr__error(TSR_E_IO, "%s: cannot stat: %s", st->path, strerror(errno));
    if (sb.st_dev != st->dev || sb.st_ino != st->ino)
        return tsr__error(TSR_E_IO, "%s: the file was replaced while loading", st->path);
    posix_fadvise(w->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    return TSR_OK;
}

/* Reports progress from the calling thread until the workers are done; a
 * non-zero return of the callback stops them. */
static int wait_workers(load_state *st, uint64_t total, tsr_progress_fn progress, void *user) {
    int cancelled = 0;
    uint64_t reported = 0;
    pthread_mutex_lock(&st->mu);
    while (st->n_running > 0) {
        uint64_t done = atomic_load(&st->done);
        if (done == reported || !progress || cancelled) {
            pthread_cond_wait(&st->cv, &st->mu);
            continue;
        }
        pthread_mutex_unlock(&st->mu);
        reported = done;
        if (progress(done, total, user) != 0) {
            cancelled = 1;
            atomic_store(&st->stop, 1);
        }
        pthread_mutex_lock(&st->mu);
    }
    pthread_mutex_unlock(&st->mu);
    return cancelled;
}

static void free_worker(load_worker *w) {
    if (w->fd >= 0)
        close(w->fd);
    tsr__free(w->junk);
    if (w->staging_buf)
        tsr_buffer_free(w->staging_buf);
    else
        tsr__aligned_free(w->staging);
}

static tsr_status run_workers(load_state *st, int n_threads, uint64_t total, tsr_progress_fn progress, void *user) {
    load_worker *ws = tsr__calloc((size_t)n_threads, sizeof *ws);
    if (!ws)
        return tsr__error(TSR_E_NOMEM, "%s: out of host memory for %d I/O threads", st->path, n_threads);
    tsr_status s = TSR_OK;
    for (int i = 0; i < n_threads; i++) {
        ws[i].fd = -1;
        ws[i].st = st;
    }
    for (int i = 0; i < n_threads && s == TSR_OK; i++) s = open_worker_fd(st, &ws[i]);
    for (int i = 0; i < n_threads && s == TSR_OK; i++) {
        pthread_mutex_lock(&st->mu);
        st->n_running++;
        pthread_mutex_unlock(&st->mu);
        int e = pthread_create(&ws[i].thread, NULL, worker_main, &ws[i]);
        if (e != 0) {
            pthread_mutex_lock(&st->mu);
            st->n_running--;
            pthread_mutex_unlock(&st->mu);
            atomic_store(&st->stop, 1);
            s = tsr__error(TSR_E_NOMEM, "%s: cannot start I/O thread %d: %s", st->path, i, strerror(e));
        }
        ws[i].started = e == 0;
    }
    int cancelled = wait_workers(st, total, s == TSR_OK ? progress : NULL, user);
    for (int i = 0; i < n_threads; i++) {
        if (ws[i].started)
            pthread_join(ws[i].thread, NULL);
        free_worker(&ws[i]);
    }
    tsr__free(ws);
    if (s != TSR_OK)
        return s;
    if (st->status != TSR_OK)
        return tsr__error(st->status, "%s", st->error);
    if (cancelled)
        return tsr__error(TSR_E_CANCELLED, "%s: loading cancelled by the progress callback", st->path);
    return TSR_OK;
}

/* ------------------------------------------------------------------------ */
/* Verification of float data and block scales                              */
/* ------------------------------------------------------------------------ */

static bool f16_bad(const uint8_t *p) { return ((p[0] | p[1] << 8) & 0x7c00) == 0x7c00; }

/* Byte offsets of the f16 scales of one block of a quantized type (-1 ends). */
static const int *block_scales(tsr_type type) {
    static const int d[] = {0, -1}, dm[] = {0, 2, -1}, q6k[] = {208, -1};
    switch (type) {
    case TSR_TYPE_Q4_0:
    case TSR_TYPE_Q5_0:
    case TSR_TYPE_Q8_0: return d;
    case TSR_TYPE_Q4_1:
    case TSR_TYPE_Q5_1:
    case TSR_TYPE_Q4_K:
    case TSR_TYPE_Q5_K: return dm;
    case TSR_TYPE_Q6_K: return q6k;
    default: return NULL;
    }
}

/* Checks n bytes of type at p, whose first element/block has index first.
 * Returns the index of the first bad element/block, or -1. */
static int64_t verify_bytes(tsr_type type, const uint8_t *p, size_t n, int64_t first, int *which) {
    *which = 0;
    if (type == TSR_TYPE_F32) {
        for (size_t i = 0; i + 4 <= n; i += 4) {
            uint32_t u;
            memcpy(&u, p + i, 4);
            if ((u & 0x7f800000u) == 0x7f800000u)
                return first + (int64_t)(i / 4);
        }
    } else if (type == TSR_TYPE_F16 || type == TSR_TYPE_BF16) {
        for (size_t i = 0; i + 2 <= n; i += 2) {
            uint16_t h = (uint16_t)(p[i] | p[i + 1] << 8);
            if (type == TSR_TYPE_F16 ? (h & 0x7c00) == 0x7c00 : (h & 0x7f80) == 0x7f80)
                return first + (int64_t)(i / 2);
        }
    } else if (block_scales(type)) {
        const int *sc = block_scales(type);
        size_t bb = tsr__type_traits(type)->block_bytes;
        for (size_t i = 0; i + bb <= n; i += bb)
            for (int k = 0; sc[k] >= 0; k++)
                if (f16_bad(p + i + sc[k])) {
                    *which = k;
                    return first + (int64_t)(i / bb);
                }
    }
    return -1;
}

static tsr_status verify_error(const char *path, const tsr_tensor *t, int64_t idx, int which, const uint8_t *at,
                               size_t unit) {
    const tsr_type_traits *tr = tsr__type_traits(t->type);
    bool nan;
    if (!tr->quantized) {
        uint32_t u = 0;
        memcpy(&u, at, unit);
        nan = t->type == TSR_TYPE_F32   ? (u & 0x7fffffu) != 0
              : t->type == TSR_TYPE_F16 ? (u & 0x3ffu) != 0
                                        : (u & 0x7fu) != 0;
        return tsr__error(TSR_E_MALFORMED, "%s: tensor '%s' (%s): element %" PRId64 " is %s", path, t->name, tr->name,
                          idx, nan ? "NaN" : "infinite");
    }
    const uint8_t *h = at + block_scales(t->type)[which];
    nan = ((h[0] | h[1] << 8) & 0x3ff) != 0;
    const char *names[] = {"d", t->type == TSR_TYPE_Q4_K || t->type == TSR_TYPE_Q5_K ? "dmin" : "m"};
    return tsr__error(TSR_E_MALFORMED, "%s: tensor '%s' (%s): block %" PRId64 ": scale %s is %s", path, t->name,
                      tr->name, idx, names[which], nan ? "NaN" : "infinite");
}

static tsr_status verify_tensor(const char *path, const tsr_tensor *t, uint8_t **tmp) {
    const tsr_type_traits *tr = tsr__type_traits(t->type);
    size_t unit = tr->block_bytes, n = tsr_tensor_nbytes(t);
    if (n == 0 ||
        (!block_scales(t->type) && t->type != TSR_TYPE_F32 && t->type != TSR_TYPE_F16 && t->type != TSR_TYPE_BF16))
        return TSR_OK;
    size_t step = LOAD_CHUNK / unit * unit;
    bool host = buffer_is_direct(t->buffer);
    if (!host && !*tmp && !(*tmp = tsr__malloc(LOAD_CHUNK)))
        return tsr__error(TSR_E_NOMEM, "%s: out of host memory verifying '%s'", path, t->name);
    for (size_t off = 0; off < n; off += step) {
        size_t len = n - off < step ? n - off : step;
        const uint8_t *p = (const uint8_t *)t->data + off;
        if (!host) {
            tsr_status s = tsr__buffer_get(t->buffer, p, *tmp, len);
            if (s != TSR_OK)
                return s;
            p = *tmp;
        }
        int which;
        int64_t bad = verify_bytes(t->type, p, len, (int64_t)(off / unit), &which);
        if (bad >= 0)
            return verify_error(path, t, bad, which, p + (size_t)(bad - (int64_t)(off / unit)) * unit, unit);
    }
    return TSR_OK;
}

static tsr_status verify_weights(tsr_backend *b, const char *path) {
    uint8_t *tmp = NULL;
    tsr_status s = TSR_OK;
    for (size_t i = 0; i < b->weights.n && s == TSR_OK; i++) s = verify_tensor(path, b->weights.tensors[i], &tmp);
    tsr__free(tmp);
    return s;
}

/* ------------------------------------------------------------------------ */
/* The load                                                                 */
/* ------------------------------------------------------------------------ */

/* Everything a load made goes: weights, buffers (mappings too), the layer
 * table; plan numbers too unless keep_plan. */
static void rollback(tsr_backend *b, bool keep_plan) {
    tsr__weights_free(b);
    tsr__free(b->layer_buft);
    b->layer_buft = NULL;
    b->n_layers = 0;
    for (size_t d = 0; d < b->n_devices; d++) { /* the backend had no weights before the load */
        b->live[d] -= b->live_weights[d];
        b->live_weights[d] = 0;
        if (!keep_plan)
            b->plan_weights[d] = 0;
    }
}

/* A file without output.weight ties the head to token_embd.weight, which
 * stays on the CPU with the input layer. When the output layer goes to a
 * GPU (n_gpu_layers covers every layer, as placement puts output.* then),
 * the head gets its own copy there, as llama.cpp duplicates it: a weight
 * named output.weight, read from token_embd.weight's bytes (file_offset),
 * so that the LM head runs on the GPU instead of the CPU every token. */
static bool tied_head_on_gpu(const tsr_backend *b, const tsr_gguf *g, const tsr_load_params *prm) {
    const int n = b->n_layers, k = prm->n_gpu_layers < 0 || prm->n_gpu_layers > n ? n : prm->n_gpu_layers;
    return b->n_devices > 1 && n > 0 && k == n && tsr_gguf_find_tensor(g, "output.weight") < 0 &&
           tsr_gguf_find_tensor(g, "token_embd.weight") >= 0;
}

static tsr_status declare_all(tsr_backend *b, const tsr_gguf *g, const char *path, const tsr_load_params *prm) {
    int64_t n = tsr_gguf_n_tensors(g);
    for (int64_t j = 0; j <= n; j++) {
        int64_t i = j;
        const char *name = j < n ? tsr_gguf_tensor_name(g, j) : "output.weight";
        if (j == n && !tied_head_on_gpu(b, g, prm))
            break;
        if (j == n)
            i = tsr_gguf_find_tensor(g, "token_embd.weight");
        int nd = tsr_gguf_tensor_n_dims(g, i);
        int64_t ne[TSR_MAX_DIMS];
        for (int d = 0; d < TSR_MAX_DIMS; d++) ne[d] = tsr_gguf_tensor_ne(g, i, d);
        tsr_status s = tsr_backend_declare_weight(b, name, tsr_gguf_tensor_type(g, i), nd, ne);
        if (s != TSR_OK) {
            tsr__error_prefix("%s", path);
            return s;
        }
        const tsr_tensor *t = b->weights.tensors[b->weights.n - 1];
        if (tsr_tensor_nbytes(t) != tsr_gguf_tensor_size(g, i))
            return tsr__error(TSR_E_MALFORMED,
                              "%s: tensor '%s' (%s): %zu bytes in the file, %zu expected for its shape", path, name,
                              tsr_type_name(t->type), tsr_gguf_tensor_size(g, i), tsr_tensor_nbytes(t));
    }
    return TSR_OK;
}

static uint64_t file_offset(const tsr_gguf *g, const tsr_tensor *t) {
    int64_t i = tsr_gguf_find_tensor(g, t->name);
    if (i < 0 && strcmp(t->name, "output.weight") == 0) /* the tied head's copy (declare_all) */
        i = tsr_gguf_find_tensor(g, "token_embd.weight");
    return tsr_gguf_data_offset(g) + tsr_gguf_tensor_offset(g, i);
}

/* With use_mmap: a plan-only placement tells which weights stay on the CPU;
 * those (suitably aligned) point into a private mapping of the file, so the
 * real placement skips them. Returns the bytes mapped. */
static tsr_status map_cpu_weights(tsr_backend *b, const tsr_gguf *g, const char *path, int fd,
                                  const tsr_load_params *prm, uint64_t file_size, size_t *mapped) {
    tsr_load_params plan = *prm;
    plan.plan_only = 1;
    size_t cpu = tsr__backend_host_index(b);
    *mapped = 0;
    tsr_status s = tsr__place_weights(b, &plan);
    if (s != TSR_OK)
        return s;
    tsr_buffer *map = NULL;
    for (size_t i = 0; i < b->weights.n; i++) {
        tsr_tensor *t = b->weights.tensors[i];
        uint64_t off = file_offset(g, t);
        /* shared weights (rope_freqs...) are tiny and get per-device copies:
         * they are read like device weights, not mapped */
        bool ok = !t->buffer && t->device_id == (int)cpu && off % LOAD_MAP_ALIGN == 0 && tsr_tensor_nbytes(t) > 0 &&
                  !tsr__weight_is_shared(b, t);
        t->device_id = t->buffer ? t->device_id : -1;
        if (!ok)
            continue;
        if (!map && (s = map_file(b, path, fd, file_size, &map)) != TSR_OK)
            return s;
        t->buffer = map;
        t->data = (char *)map->base + off;
        t->device_id = (int)cpu;
        *mapped += tsr_tensor_nbytes(t);
    }
    return TSR_OK;
}

/* Items for every weight that needs reading (not mapped, not empty). */
static tsr_status collect_items(tsr_backend *b, const tsr_gguf *g, const char *path, load_item **out, size_t *n,
                                uint64_t *total) {
    *n = 0;
    *total = 0;
    size_t n_all = b->weights.n + b->weights.n_copies;
    *out = tsr__malloc((n_all ? n_all : 1) * sizeof **out);
    if (!*out)
        return tsr__error(TSR_E_NOMEM, "%s: out of host memory planning the reads", path);
    /* the copies of shared weights are read from the file too, so that
     * tsr_backend_weight_on has their data at once */
    for (size_t i = 0; i < n_all; i++) {
        tsr_tensor *t = i < b->weights.n ? b->weights.tensors[i] : b->weights.copies[i - b->weights.n].copy;
        size_t size = tsr_tensor_nbytes(t);
        if (size == 0 || (t->buffer && t->buffer->buft == &map_buft))
            continue;
        if (!t->buffer || !t->data)
            return tsr__error(TSR_E_STATE, "%s: tensor '%s' got no memory from placement", path, t->name);
        (*out)[(*n)++] = (load_item){file_offset(g, t), size, t};
        *total += size;
    }
    qsort(*out, *n, sizeof **out, cmp_item);
    return TSR_OK;
}

static int pick_threads(int asked, size_t n_chunks) {
    int n = asked > 0 ? asked : LOAD_AUTO_THREADS;
    if (n > LOAD_MAX_THREADS)
        n = LOAD_MAX_THREADS;
    if ((size_t)n > n_chunks)
        n = (int)n_chunks;
    return n;
}

/* Asks for transparent huge pages on the fresh host buffers the threads
 * are about to fill: first-touch page faults (and their page clearing) are
 * otherwise a large part of a load from the page cache. Advisory only. */
static void advise_buffers(const tsr_backend *b) {
    long page = sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < b->weights.n_buffers && page > 0; i++) {
        const tsr_buffer *buf = b->weights.buffers[i];
        if (buf->buft == &map_buft || !buffer_is_direct(buf) || buf->size < ((size_t)4 << 20))
            continue;
        uintptr_t lo = ((uintptr_t)buf->base + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
        uintptr_t hi = ((uintptr_t)buf->base + buf->size) & ~((uintptr_t)page - 1);
#ifdef MADV_HUGEPAGE
        if (hi > lo)
            madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#endif
    }
}

/* Reads every item with the I/O threads; progress brackets the reads with
 * (0, total) before any thread starts and (total, total) after. */
static tsr_status read_items(const char *path, const struct stat *sb, const load_item *items, size_t n_items,
                             uint64_t total, const tsr_load_params *prm, int *n_threads_used) {
    load_chunk *chunks = NULL;
    size_t n_chunks = 0;
    tsr_status s = build_chunks(items, n_items, &chunks, &n_chunks);
    if (s != TSR_OK)
        tsr__error_prefix("%s", path);
    *n_threads_used = pick_threads(prm->n_io_threads, n_chunks);
    if (s == TSR_OK && prm->progress && prm->progress(0, total, prm->progress_user) != 0)
        s = tsr__error(TSR_E_CANCELLED, "%s: loading cancelled by the progress callback", path);
    if (s == TSR_OK && n_chunks > 0) {
        load_state st = {.path = path,
                         .dev = sb->st_dev,
                         .ino = sb->st_ino,
                         .items = items,
                         .n_items = n_items,
                         .chunks = chunks,
                         .n_chunks = n_chunks};
        pthread_mutex_init(&st.mu, NULL);
        pthread_cond_init(&st.cv, NULL);
        s = run_workers(&st, *n_threads_used, total, prm->progress, prm->progress_user);
        pthread_cond_destroy(&st.cv);
        pthread_mutex_destroy(&st.mu);
    }
    tsr__free(chunks);
    if (s == TSR_OK && prm->progress && prm->progress(total, total, prm->progress_user) != 0)
        s = tsr__error(TSR_E_CANCELLED, "%s: loading cancelled by the progress callback", path);
    return s;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void log_loaded(const char *path, size_t n_weights, uint64_t read, size_t mapped, int n_threads, double secs) {
    char a[32], c[32], d[32], e[32], f[32], h[32];
    tsr__log(TSR_LOG_INFO, "weights loaded", 7, "file", path, "tensors", tsr__fmt(a, sizeof a, "%zu", n_weights),
             "read_mib", tsr__fmt(c, sizeof c, "%.2f", read / 1048576.0), "mapped_mib",
             tsr__fmt(d, sizeof d, "%.2f", mapped / 1048576.0), "io_threads", tsr__fmt(e, sizeof e, "%d", n_threads),
             "seconds", tsr__fmt(f, sizeof f, "%.3f", secs), "mib_per_s",
             tsr__fmt(h, sizeof h, "%.1f", secs > 0 ? read / 1048576.0 / secs : 0.0));
}

/* Declare, place (mapping first with use_mmap; placement logs the memory
 * plan), read, verify. */
static tsr_status load_weights(tsr_backend *b, const tsr_gguf *g, const char *path, int fd, const struct stat *sb,
                               const tsr_load_params *prm) {
    double t0 = now_s();
    size_t mapped = 0;
    tsr_status s = declare_all(b, g, path, prm);
    if (s == TSR_OK && prm->use_mmap && !prm->plan_only)
        s = map_cpu_weights(b, g, path, fd, prm, (uint64_t)sb->st_size, &mapped);
    if (s == TSR_OK && (s = tsr__place_weights(b, prm)) != TSR_OK)
        tsr__error_prefix("%s", path);
    if (s != TSR_OK)
        return s;
    /* mapped bytes count as CPU weights, allocated (live) as much as planned,
     * so later plan checks stay neutral to them */
    size_t cpu = tsr__backend_host_index(b);
    b->plan_weights[cpu] += mapped;
    b->live_weights[cpu] += mapped;
    b->live[cpu] += mapped;
    if (prm->plan_only)
        return TSR_OK;
    load_item *items = NULL;
    size_t n_items = 0;
    uint64_t total = 0;
    int n_threads = 0;
    advise_buffers(b);
    s = collect_items(b, g, path, &items, &n_items, &total);
    if (s == TSR_OK)
        s = read_items(path, sb, items, n_items, total, prm, &n_threads);
    tsr__free(items);
    if (s == TSR_OK)
        tsr__weights_touch(); /* the scheduler refreshes copies of shared weights from now on */
    if (s == TSR_OK && prm->verify)
        s = verify_weights(b, path);
    if (s == TSR_OK)
        log_loaded(path, b->weights.n, total, mapped, n_threads, now_s() - t0);
    return s;
}

static tsr_status check_args(const tsr_backend *b, const char *path, const tsr_load_params *p) {
    if (!b || !path)
        return tsr__error(TSR_E_INVALID, "tsr_backend_load_gguf: NULL %s", b ? "path" : "backend");
    if (p && p->size < sizeof(size_t))
        return tsr__error(TSR_E_INVALID, "tsr_backend_load_gguf: params.size is %zu; call tsr_load_params_init",
                          p->size);
    if (b->weights.n > 0)
        return tsr__error(TSR_E_STATE, "%s: the backend has weights already (%zu); load into a new backend", path,
                          b->weights.n);
    return TSR_OK;
}

static tsr_status read_params(const tsr_load_params *p, tsr_load_params *prm) {
    tsr__load_params_read(p, prm);
    if (prm->n_io_threads < 0)
        return tsr__error(TSR_E_INVALID, "tsr_backend_load_gguf: n_io_threads must be >= 0, got %d", prm->n_io_threads);
    return TSR_OK;
}

/* The weights of g, parsed from the file open on its descriptor: that
 * descriptor pins the file (the mapping reads it, the I/O threads check
 * they open the same one), so metadata and weights come from one file. */
static tsr_status load_parsed(tsr_backend *b, const tsr_gguf *g, const char *path, const tsr_load_params *prm) {
    const int fd = tsr__gguf_fd(g);
    struct stat sb;
    if (fd < 0)
        return tsr__error(TSR_E_INVALID, "%s: weights load from a file, not from memory", path);
    if (fstat(fd, &sb) != 0)
        return tsr__error(TSR_E_IO, "%s: cannot stat: %s", path, strerror(errno));
    memset(b->plan_weights, 0, b->n_devices * sizeof *b->plan_weights);
    tsr_status s = load_weights(b, g, path, fd, &sb, prm);
    /* a planning backend keeps the planned weights declared (no memory, the
     * planned device in device_id) for the model and session built on them */
    if (s != TSR_OK || (prm->plan_only && !b->plan_mode))
        rollback(b, s == TSR_OK);
    return s;
}

tsr_status tsr__backend_load_parsed(tsr_backend *b, const tsr_gguf *g, const tsr_load_params *p) {
    const char *path = g ? tsr__gguf_path(g) : NULL;
    tsr_status s = check_args(b, path, p);
    tsr_load_params prm;
    if (s == TSR_OK)
        s = read_params(p, &prm);
    return s == TSR_OK ? load_parsed(b, g, path, &prm) : s;
}

tsr_status tsr_backend_load_gguf(tsr_backend *b, const char *path, const tsr_load_params *p) {
    tsr_status s = check_args(b, path, p);
    tsr_load_params prm;
    if (s != TSR_OK || (s = read_params(p, &prm)) != TSR_OK)
        return s;
    if (b->plan_mode && b->plan_gguf) /* a dry run's file, parsed once (tsr_fit) */
        return load_parsed(b, b->plan_gguf, path, &prm);
    /* O_NONBLOCK: opening a FIFO must not wait for a writer (the parse
     * refuses anything but a regular file). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return tsr__error(TSR_E_IO, "%s: cannot open: %s", path, strerror(errno));
    tsr_gguf *g = NULL;
    if ((s = tsr__gguf_open_fd(fd, path, &g)) == TSR_OK) /* (g owns fd from here) */
        s = load_parsed(b, g, path, &prm);
    tsr_gguf_close(g);
    return s;
}
