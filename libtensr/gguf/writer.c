/*
 * writer.c - GGUF v3 writer. Keys and tensors are collected (copied) in
 * the order they are added, then serialized in one pass to a file or to
 * memory. The same serializer feeds three sinks: a counter (to size the
 * memory image), a memory buffer, and a buffered file descriptor. A file
 * is written to a temporary name beside the target and renamed over it
 * only once complete, so a reader never sees a half-written model.
 * Everything the writer produces passes the reader's checks.
 */
#include "gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SINK_BUF_SIZE (1u << 20)

typedef struct wtensor {
    char *name;
    tsr_type type;
    int n_dims;
    int64_t ne[TSR_MAX_DIMS];
    void *data; /* NULL for a zero-sized tensor or a zero-filled one */
    size_t size;
} wtensor;

struct tsr_gguf_writer {
    tsr__gguf_kv *kvs;
    size_t n_kv, cap_kv;
    wtensor *tensors;
    size_t n_tensors, cap_tensors;
    tsr__name_index key_ix, tensor_ix;
    size_t alignment;
};

static tsr__names w_kv_names(const tsr_gguf_writer *w) {
    return (tsr__names){w->kvs, sizeof(tsr__gguf_kv), offsetof(tsr__gguf_kv, key)};
}
static tsr__names w_tensor_names(const tsr_gguf_writer *w) {
    return (tsr__names){w->tensors, sizeof(wtensor), offsetof(wtensor, name)};
}

tsr_status tsr_gguf_writer_new(tsr_gguf_writer **out) {
    if (!out)
        return tsr__error(TSR_E_INVALID, "tsr_gguf_writer_new: out is NULL");
    tsr_gguf_writer *w = tsr__calloc(1, sizeof *w);
    *out = w;
    if (!w)
        return tsr__error(TSR_E_NOMEM, "gguf writer: out of memory");
    w->alignment = TSR_GGUF_DEFAULT_ALIGNMENT;
    w->key_ix.seed = (uint64_t)(uintptr_t)w * 0x9e3779b97f4a7c15ull;
    w->tensor_ix.seed = w->key_ix.seed ^ 0x5bd1e995u;
    return TSR_OK;
}

void tsr_gguf_writer_free(tsr_gguf_writer *w) {
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) tsr__gguf_kv_clear(&w->kvs[i]);
    for (size_t i = 0; i < w->n_tensors; i++) {
        tsr__free(w->tensors[i].name);
        tsr__free(w->tensors[i].data);
    }
    tsr__free(w->kvs);
    tsr__free(w->tensors);
    tsr__name_index_free(&w->key_ix);
    tsr__name_index_free(&w->tensor_ix);
    tsr__free(w);
}

/* ------------------------------------------------------------------------ */
/* Keys                                                                     */
/* ------------------------------------------------------------------------ */

static tsr_status check_key(const char *key) {
    if (!key)
        return tsr__error(TSR_E_INVALID, "gguf writer: key is NULL");
    size_t len = strlen(key);
    if (len == 0)
        return tsr__error(TSR_E_INVALID, "gguf writer: key is empty");
    if (len > TSR_GGUF_MAX_KEY_LEN)
        return tsr__error(TSR_E_INVALID, "gguf writer: key of %zu bytes is longer than the limit of %u", len,
                          TSR_GGUF_MAX_KEY_LEN);
    return TSR_OK;
}

/* The alignment key must stay UINT32 and a power of two, because it decides
 * where the reader looks for tensor data. */
static tsr_status check_alignment_kv(tsr_gguf_writer *w, const tsr__gguf_kv *kv) {
    if (strcmp(kv->key, TSR_GGUF_ALIGNMENT_KEY))
        return TSR_OK;
    uint32_t a = 0;
    if (kv->type == TSR_GGUF_UINT32)
        memcpy(&a, kv->data, 4);
    if (kv->type != TSR_GGUF_UINT32 || a == 0 || (a & (a - 1)))
        return tsr__error(TSR_E_INVALID, "gguf writer: key '%s' must be a UINT32 power of two (found %s %" PRIu32 ")",
                          kv->key, tsr__gguf_type_name(kv->type), a);
    w->alignment = a;
    return TSR_OK;
}

/* Takes ownership of kv (cleared on failure): replaces a key of the same
 * name in place (keeping its position) or appends. */
static tsr_status put_kv(tsr_gguf_writer *w, tsr__gguf_kv *kv) {
    tsr_status st = check_alignment_kv(w, kv);
    if (st)
        goto fail;
    tsr__names names = w_kv_names(w);
    int64_t i = tsr__name_index_find(&w->key_ix, &names, kv->key);
    if (i >= 0) {
        tsr__gguf_kv_clear(&w->kvs[i]);
        w->kvs[i] = *kv;
        return TSR_OK;
    }
    if (!TSR_GROW(w->kvs, w->cap_kv, w->n_kv + 1)) {
        st = tsr__error(TSR_E_NOMEM, "gguf writer: out of memory for %zu keys", w->n_kv + 1);
        goto fail;
    }
    w->kvs[w->n_kv] = *kv;
    names = w_kv_names(w);
    int64_t dup;
    if ((st = tsr__name_index_insert(&w->key_ix, &names, w->n_kv, &dup)))
        goto fail;
    w->n_kv++;
    return TSR_OK;
fail:
    tsr__gguf_kv_clear(kv);
    return st;
}

static tsr_status new_kv(tsr__gguf_kv *kv, const char *key, tsr_gguf_type type, size_t size) {
    memset(kv, 0, sizeof *kv);
    tsr_status st = check_key(key);
    if (st)
        return st;
    kv->key_len = strlen(key);
    kv->key = tsr__strdup(key);
    kv->type = type;
    kv->n = 1;
    kv->size = size;
    kv->data = tsr__malloc(size + 1);
    if (!kv->key || !kv->data) {
        tsr__gguf_kv_clear(kv);
        return tsr__error(TSR_E_NOMEM, "gguf writer: out of memory for key '%s'", key);
    }
    return TSR_OK;
}

tsr_status tsr_gguf_writer_set(tsr_gguf_writer *w, const char *key, tsr_gguf_type type, const void *value) {
    if (!w || !value)
        return tsr__error(TSR_E_INVALID, "tsr_gguf_writer_set: NULL argument");
    if (type == TSR_GGUF_STRING)
        return tsr_gguf_writer_set_str(w, key, value);
    size_t size = tsr__gguf_type_size(type);
    if (!size)
        return tsr__error(TSR_E_INVALID,
                          "gguf writer: key '%s': type %d is not a scalar type (use set_arr for "
                          "arrays)",
                          key ? key : "(null)", (int)type);
    if (type == TSR_GGUF_BOOL && *(const uint8_t *)value > 1)
        return tsr__error(TSR_E_INVALID, "gguf writer: key '%s': bool value must be 0 or 1, found %u",
                          key ? key : "(null)", *(const uint8_t *)value);
    tsr__gguf_kv kv;
    tsr_status st = new_kv(&kv, key, type, size);
    if (st)
        return st;
    memcpy(kv.data, value, size);
    return put_kv(w, &kv);
}

tsr_status tsr_gguf_writer_set_str(tsr_gguf_writer *w, const char *key, const char *value) {
    if (!w || !value)
        return tsr__error(TSR_E_INVALID, "tsr_gguf_writer_set_str: NULL argument");
    size_t len = strlen(value);
    if (len > TSR_GGUF_MAX_STR_LEN)
        return tsr__error(TSR_E_INVALID,
                          "gguf writer: key '%s': string of %zu bytes is longer than the limit "
                          "of %u",
                          key ? key : "(null)", len, TSR_GGUF_MAX_STR_LEN);
    tsr__gguf_kv kv;
    tsr_status st = new_kv(&kv, key, TSR_GGUF_STRING, len);
    if (st)
        return st;
    memcpy(kv.data, value, len + 1);
    return put_kv(w, &kv);
}

tsr_status tsr_gguf_writer_set_arr(tsr_gguf_writer *w, const char *key, tsr_gguf_type elem_type, const void *data,
                                   uint64_t n) {
    if (!w || (!data && n))
        return tsr__error(TSR_E_INVALID, "tsr_gguf_writer_set_arr: NULL argument");
    if (elem_type == TSR_GGUF_STRING)
        return tsr__error(TSR_E_INVALID, "gguf writer: key '%s': use set_arr_str for string arrays",
                          key ? key : "(null)");
    size_t esize = tsr__gguf_type_size(elem_type), size;
    if (!esize)
        return tsr__error(TSR_E_INVALID, "gguf writer: key '%s': element type %d is not a numeric type%s",
                          key ? key : "(null)", (int)elem_type,
                          elem_type == TSR_GGUF_ARRAY ? " (nested arrays are not supported)" : "");
    if (n > TSR_GGUF_MAX_ARR_LEN || tsr__mul_overflow((size_t)n, esize, &size))
        return tsr__error(TSR_E_INVALID,
                          "gguf writer: key '%s': array of %" PRIu64 " elements is longer than the "
                          "limit of %" PRIu64,
                          key ? key : "(null)", n, TSR_GGUF_MAX_ARR_LEN);
    if (elem_type == TSR_GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1)
                return tsr__error(TSR_E_INVALID, "gguf writer: key '%s': bool element %" PRIu64 " must be 0 or 1",
                                  key ? key : "(null)", i);
    tsr__gguf_kv kv;
    tsr_status st = new_kv(&kv, key, TSR_GGUF_ARRAY, size);
    if (st)
        return st;
    kv.arr_type = elem_type;
    kv.n = n;
    if (size)
        memcpy(kv.data, data, size);
    return put_kv(w, &kv);
}

tsr_status tsr_gguf_writer_set_arr_str(tsr_gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
    if (!w || (!strs && n))
        return tsr__error(TSR_E_INVALID, "tsr_gguf_writer_set_arr_str: NULL argument");
    if (n > TSR_GGUF_MAX_ARR_LEN)
        return tsr__error(TSR_E_INVALID,
                          "gguf writer: key '%s': array of %" PRIu64 " strings is longer than the "
                          "limit of %" PRIu64,
                          key ? key : "(null)", n, TSR_GGUF_MAX_ARR_LEN);
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i])
            return tsr__error(TSR_E_INVALID, "gguf writer: key '%s': string %" PRIu64 " is NULL", key ? key : "(null)",
                              i);
        size_t len = strlen(strs[i]);
        if (len > TSR_GGUF_MAX_STR_LEN || tsr__add_overflow(total, len + 1, &total))
            return tsr__error(TSR_E_INVALID, "gguf writer: key '%s': string %" PRIu64 " is too long",
                              key ? key : "(null)", i);
    }
    tsr__gguf_kv kv;
    tsr_status st = new_kv(&kv, key, TSR_GGUF_ARRAY, total);
    if (st)
        return st;
    kv.arr_type = TSR_GGUF_STRING;
    kv.n = n;
    kv.str_offs = tsr__malloc((size_t)(n + 1) * sizeof(uint64_t));
    if (!kv.str_offs) {
        tsr__gguf_kv_clear(&kv);
        return tsr__error(TSR_E_NOMEM, "gguf writer: out of memory for key '%s'", key);
    }
    size_t used = 0;
    for (uint64_t i = 0; i < n; i++) {
        size_t len = strlen(strs[i]);
        memcpy((char *)kv.data + used, strs[i], len + 1);
        kv.str_offs[i] = used;
        used += len + 1;
    }
    kv.str_offs[n] = used;
    return put_kv(w, &kv);
}

tsr_status tsr_gguf_writer_set_alignment(tsr_gguf_writer *w, size_t alignment) {
    if (!w)
        return tsr__error(TSR_E_INVALID, "tsr_gguf_writer_set_alignment: NULL writer");
    if (alignment == 0 || (alignment & (alignment - 1)) || alignment > TSR_GGUF_MAX_ALIGNMENT)
        return tsr__error(TSR_E_INVALID, "gguf writer: alignment must be a power of two up to %u, found %zu",
                          TSR_GGUF_MAX_ALIGNMENT, alignment);
    uint32_t a = (uint32_t)alignment;
    return tsr_gguf_writer_set(w, TSR_GGUF_ALIGNMENT_KEY, TSR_GGUF_UINT32, &a);
}

tsr_status tsr_gguf_writer_copy_keys(tsr_gguf_writer *w, const tsr_gguf *g) {
    if (!w || !g)
        return tsr__error(TSR_E_INVALID, "tsr_gguf_writer_copy_keys: NULL argument");
    for (size_t i = 0; i < tsr__gguf_kv_count(g); i++) {
        const tsr__gguf_kv *src = tsr__gguf_kv_at(g, i);
        if (strcmp(src->key, TSR_GGUF_ALIGNMENT_KEY) == 0)
            continue;
        tsr__gguf_kv kv;
        tsr_status st = tsr__gguf_kv_copy(&kv, src);
        if (st || (st = put_kv(w, &kv)))
            return st;
    }
    return TSR_OK;
}

/* ------------------------------------------------------------------------ */
/* Tensors                                                                  */
/* ------------------------------------------------------------------------ */

static tsr_status check_tensor(const char *name, tsr_type type, int n_dims, const int64_t *ne, size_t *size) {
    if (!name || !ne)
        return tsr__error(TSR_E_INVALID, "tsr_gguf_writer_add_tensor: NULL argument");
    size_t len = strlen(name);
    if (len == 0 || len > TSR_GGUF_MAX_NAME)
        return tsr__error(TSR_E_INVALID, "gguf writer: tensor name '%s' must be 1 to %d bytes, found %zu", name,
                          TSR_GGUF_MAX_NAME, len);
    if (n_dims < 1 || n_dims > TSR_MAX_DIMS)
        return tsr__error(TSR_E_INVALID, "gguf writer: tensor '%s': n_dims must be 1 to %d, found %d", name,
                          TSR_MAX_DIMS, n_dims);
    const tsr_type_traits *tt = (unsigned)type < TSR_TYPE_COUNT ? tsr__type_traits(type) : NULL;
    if (!tt)
        return tsr__error(TSR_E_INVALID, "gguf writer: tensor '%s': unknown type %d", name, (int)type);
    for (int d = 0; d < n_dims; d++)
        if (ne[d] < 0)
            return tsr__error(TSR_E_INVALID, "gguf writer: tensor '%s': ne[%d] = %" PRId64 " is negative", name, d,
                              ne[d]);
    if (ne[0] % tt->block_size)
        return tsr__error(TSR_E_INVALID,
                          "gguf writer: tensor '%s': ne[0] = %" PRId64 " is not a multiple of the "
                          "block size %" PRId64 " of %s",
                          name, ne[0], tt->block_size, tt->name);
    if (!tsr__gguf_tensor_bytes(type, n_dims, ne, size))
        return tsr__error(TSR_E_INVALID, "gguf writer: tensor '%s': size overflows", name);
    return TSR_OK;
}

static tsr_status grow_tensors(tsr_gguf_writer *w) {
    if (!TSR_GROW(w->tensors, w->cap_tensors, w->n_tensors + 1))
        return tsr__error(TSR_E_NOMEM, "gguf writer: out of memory for %zu tensors", w->n_tensors + 1);
    return TSR_OK;
}

tsr_status tsr_gguf_writer_add_tensor(tsr_gguf_writer *w, const char *name, tsr_type type, int n_dims,
                                      const int64_t *ne, const void *data) {
    if (!w)
        return tsr__error(TSR_E_INVALID, "tsr_gguf_writer_add_tensor: NULL writer");
    size_t size;
    tsr_status st = check_tensor(name, type, n_dims, ne, &size);
    if (st)
        return st;
    tsr__names names = w_tensor_names(w);
    if (tsr__name_index_find(&w->tensor_ix, &names, name) >= 0)
        return tsr__error(TSR_E_INVALID, "gguf writer: duplicate tensor name '%s'", name);
    if ((st = grow_tensors(w)))
        return st;
    wtensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = tsr__strdup(name);
    t->data = data && size ? tsr__malloc(size) : NULL;
    if (!t->name || (data && size && !t->data)) {
        tsr__free(t->name);
        tsr__free(t->data);
        return tsr__error(TSR_E_NOMEM, "gguf writer: out of memory for tensor '%s' (%zu bytes)", name, size);
    }
    if (t->data)
        memcpy(t->data, data, size);
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < TSR_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->size = size;
    names = w_tensor_names(w);
    int64_t dup;
    if ((st = tsr__name_index_insert(&w->tensor_ix, &names, w->n_tensors, &dup))) {
        tsr__free(t->name);
        tsr__free(t->data);
        return st;
    }
    w->n_tensors++;
    return TSR_OK;
}

/* ------------------------------------------------------------------------ */
/* Serialization                                                            */
/* ------------------------------------------------------------------------ */

typedef struct sink {
    uint64_t pos; /* bytes emitted so far */
    uint8_t *mem; /* memory mode: destination (NULL when only counting) */
    int fd;       /* file mode: >= 0 */
    uint8_t *buf;
    size_t buf_len;
    const char *path;
    tsr_status st; /* first error; later writes are no-ops */
} sink;

static void sink_flush(sink *k) {
    size_t done = 0;
    while (done < k->buf_len && !k->st) {
        ssize_t r = write(k->fd, k->buf + done, k->buf_len - done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            k->st = tsr__error(TSR_E_IO, "%s: write failed at offset %" PRIu64 ": %s", k->path,
                               k->pos - k->buf_len + done, strerror(errno));
        else
            done += (size_t)r;
    }
    k->buf_len = 0;
}

/* p == NULL writes n zero bytes. */
static void sink_put(sink *k, const void *p, size_t n) {
    if (k->st)
        return;
    if (k->fd < 0) {
        if (k->mem) {
            if (p)
                memcpy(k->mem + k->pos, p, n);
            else
                memset(k->mem + k->pos, 0, n);
        }
        k->pos += n;
        return;
    }
    const uint8_t *s = p;
    while (n && !k->st) {
        size_t take = SINK_BUF_SIZE - k->buf_len < n ? SINK_BUF_SIZE - k->buf_len : n;
        if (s) {
            memcpy(k->buf + k->buf_len, s, take);
            s += take;
        } else {
            memset(k->buf + k->buf_len, 0, take);
        }
        k->buf_len += take;
        k->pos += take;
        n -= take;
        if (k->buf_len == SINK_BUF_SIZE)
            sink_flush(k);
    }
}

static void put_u32(sink *k, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    sink_put(k, b, 4);
}

static void put_u64(sink *k, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    sink_put(k, b, 8);
}

static void put_str(sink *k, const char *s, size_t len) {
    put_u64(k, len);
    sink_put(k, s, len);
}

static void put_pad(sink *k, size_t alignment) {
    sink_put(k, NULL, (size_t)((alignment - k->pos % alignment) % alignment));
}

static void put_kv_value(sink *k, const tsr__gguf_kv *kv) {
    put_str(k, kv->key, kv->key_len);
    put_u32(k, (uint32_t)kv->type);
    if (kv->type == TSR_GGUF_STRING) {
        put_str(k, kv->data, kv->size);
    } else if (kv->type != TSR_GGUF_ARRAY) {
        sink_put(k, kv->data, kv->size);
    } else {
        put_u32(k, (uint32_t)kv->arr_type);
        put_u64(k, kv->n);
        if (kv->arr_type != TSR_GGUF_STRING) {
            sink_put(k, kv->data, kv->size);
            return;
        }
        for (uint64_t i = 0; i < kv->n; i++)
            put_str(k, (const char *)kv->data + kv->str_offs[i], (size_t)(kv->str_offs[i + 1] - kv->str_offs[i] - 1));
    }
}

static void serialize(const tsr_gguf_writer *w, sink *k) {
    sink_put(k, TSR_GGUF_MAGIC, 4);
    put_u32(k, 3);
    put_u64(k, w->n_tensors);
    put_u64(k, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) put_kv_value(k, &w->kvs[i]);
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        put_str(k, t->name, strlen(t->name));
        put_u32(k, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) put_u64(k, (uint64_t)t->ne[d]);
        put_u32(k, (uint32_t)t->type);
        put_u64(k, offset);
        offset += tsr__pad(t->size, w->alignment);
    }
    put_pad(k, w->alignment);
    for (size_t i = 0; i < w->n_tensors; i++) {
        sink_put(k, w->tensors[i].data, w->tensors[i].size);
        put_pad(k, w->alignment);
    }
}

tsr_status tsr_gguf_writer_write_memory(tsr_gguf_writer *w, void **data, size_t *size) {
    if (!w || !data || !size)
        return tsr__error(TSR_E_INVALID, "tsr_gguf_writer_write_memory: NULL argument");
    *data = NULL;
    *size = 0;
    sink count = {.fd = -1};
    serialize(w, &count);
    if (count.pos > SIZE_MAX)
        return tsr__error(TSR_E_NOMEM, "gguf writer: image too large");
    sink k = {.fd = -1, .mem = tsr__malloc((size_t)count.pos)};
    if (!k.mem)
        return tsr__error(TSR_E_NOMEM, "gguf writer: out of memory for a %" PRIu64 "-byte image", count.pos);
    serialize(w, &k);
    *data = k.mem;
    *size = (size_t)k.pos;
    return TSR_OK;
}

/* Opens a new temporary file beside path (same directory, so rename is atomic). */
static tsr_status open_temp(const char *path, char **tmp, int *fd) {
    static unsigned counter;
    size_t n = strlen(path) + 64;
    *tmp = tsr__malloc(n);
    if (!*tmp)
        return tsr__error(TSR_E_NOMEM, "%s: out of memory", path);
    for (int attempt = 0; attempt < 100; attempt++) {
        snprintf(*tmp, n, "%s.tmp.%ld.%u", path, (long)getpid(), __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
        *fd = open(*tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (*fd >= 0)
            return TSR_OK;
        if (errno != EEXIST)
            break;
    }
    tsr_status st = tsr__error(TSR_E_IO, "%s: cannot create temporary file %s: %s", path, *tmp, strerror(errno));
    tsr__free(*tmp);
    *tmp = NULL;
    return st;
}

/* An existing path that is not a regular file (a device, a FIFO, a
 * terminal) is written in place: renaming over it would replace it. */
static bool is_special(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && !S_ISREG(sb.st_mode);
}

tsr_status tsr_gguf_writer_write_file(tsr_gguf_writer *w, const char *path) {
    if (!w || !path)
        return tsr__error(TSR_E_INVALID, "tsr_gguf_writer_write_file: NULL argument");
    sink k = {.fd = -1, .path = path, .buf = tsr__malloc(SINK_BUF_SIZE)};
    if (!k.buf)
        return tsr__error(TSR_E_NOMEM, "%s: out of memory for the write buffer", path);
    char *tmp = NULL;
    tsr_status st = TSR_OK;
    if (is_special(path)) {
        k.fd = open(path, O_WRONLY | O_CLOEXEC);
        if (k.fd < 0)
            st = tsr__error(TSR_E_IO, "%s: cannot open for writing: %s", path, strerror(errno));
    } else {
        st = open_temp(path, &tmp, &k.fd);
    }
    if (st) {
        tsr__free(k.buf);
        return st;
    }
    serialize(w, &k);
    if (!k.st)
        sink_flush(&k);
    if (!k.st && tmp && fsync(k.fd) != 0 && errno != EINVAL && errno != EROFS)
        k.st = tsr__error(TSR_E_IO, "%s: fsync failed: %s", path, strerror(errno));
    if (close(k.fd) != 0 && !k.st)
        k.st = tsr__error(TSR_E_IO, "%s: close failed: %s", path, strerror(errno));
    if (!k.st && tmp && rename(tmp, path) != 0)
        k.st = tsr__error(TSR_E_IO, "%s: cannot rename %s over it: %s", path, tmp, strerror(errno));
    if (k.st && tmp)
        unlink(tmp);
    tsr__free(tmp);
    tsr__free(k.buf);
    return k.st;
}
