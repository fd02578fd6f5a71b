/*
 * reader.c - GGUF v2/v3 reader. Every file is treated as hostile: each count,
 * length, dimension, type and offset is checked against the bytes left in
 * the file and against overflow before it is used or allocated, and every
 * error names the file, the byte offset, the key or tensor, and what was
 * expected versus found. Metadata is read through one buffer (a file is
 * read in large chunks, never one syscall per field); tensor data is read on
 * demand with pread, so concurrent tsr_gguf_read_tensor calls are safe.
 * Also holds the helpers the writer (writer.c) shares.
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

#define SRC_BUF_SIZE (256u << 10)
/* Smallest encodings, used to bound counts by the bytes left before any
 * allocation: a key/value is a 1-byte key (8 + 1), a type (4) and a 1-byte
 * value; a tensor info is a 1-byte name, n_dims, one dim, type, offset. */
#define MIN_KV_BYTES (8 + 1 + 4 + 1)
#define MIN_TENSOR_INFO_BYTES (8 + 1 + 4 + 8 + 4 + 8)
#define HEADER_BYTES (4 + 4 + 8 + 8)

typedef struct gguf_tensor {
    char *name;
    tsr_type type;
    int n_dims;
    int64_t ne[TSR_MAX_DIMS];
    uint64_t offset; /* relative to the data section */
    size_t size;
    uint64_t info_pos; /* file offset of the tensor info, for errors */
} gguf_tensor;

struct tsr_gguf {
    char *path;
    uint32_t version;
    size_t alignment;
    uint64_t data_offset;
    uint64_t file_size;
    tsr__gguf_kv *kvs;
    size_t n_kv;
    gguf_tensor *tensors;
    size_t n_tensors;
    tsr__name_index key_ix;
    tsr__name_index tensor_ix;
    int fd;             /* -1 when opened from memory */
    const uint8_t *mem; /* the file's bytes when opened from memory */
    uint8_t *mem_owned; /* copy of them unless the caller kept its own */
};

/* ------------------------------------------------------------------------ */
/* Shared helpers                                                           */
/* ------------------------------------------------------------------------ */

size_t tsr__gguf_type_size(tsr_gguf_type t) {
    switch (t) {
    case TSR_GGUF_UINT8:
    case TSR_GGUF_INT8:
    case TSR_GGUF_BOOL: return 1;
    case TSR_GGUF_UINT16:
    case TSR_GGUF_INT16: return 2;
    case TSR_GGUF_UINT32:
    case TSR_GGUF_INT32:
    case TSR_GGUF_FLOAT32: return 4;
    case TSR_GGUF_UINT64:
    case TSR_GGUF_INT64:
    case TSR_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

const char *tsr__gguf_type_name(tsr_gguf_type t) {
    static const char *const names[] = {"UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32",  "FLOAT32",
                                        "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

int tsr__gguf_type_valid(uint32_t t) { return t <= TSR_GGUF_FLOAT64; }

void tsr__gguf_kv_clear(tsr__gguf_kv *kv) {
    tsr__free(kv->key);
    tsr__free(kv->data);
    tsr__free(kv->str_offs);
    memset(kv, 0, sizeof *kv);
}

static void *dup_bytes(const void *p, size_t n) {
    void *q = tsr__malloc(n ? n : 1);
    if (q && n)
        memcpy(q, p, n);
    return q;
}

tsr_status tsr__gguf_kv_copy(tsr__gguf_kv *dst, const tsr__gguf_kv *src) {
    memset(dst, 0, sizeof *dst);
    *dst = *src;
    dst->key = dst->data = NULL;
    dst->str_offs = NULL;
    dst->key = dup_bytes(src->key, src->key_len + 1);
    dst->data = dup_bytes(src->data, src->size + (src->type == TSR_GGUF_STRING));
    if (src->str_offs)
        dst->str_offs = dup_bytes(src->str_offs, (src->n + 1) * sizeof(uint64_t));
    if (!dst->key || !dst->data || (src->str_offs && !dst->str_offs)) {
        tsr__gguf_kv_clear(dst);
        return tsr__error(TSR_E_NOMEM, "gguf: out of memory copying key '%s'", src->key);
    }
    return TSR_OK;
}

bool tsr__gguf_tensor_bytes(tsr_type type, int n_dims, const int64_t *ne, size_t *out) {
    const tsr_type_traits *tt = tsr__type_traits(type);
    if (!tt || tt->block_size <= 0 || n_dims < 1 || n_dims > TSR_MAX_DIMS)
        return false;
    for (int d = 0; d < n_dims; d++)
        if (ne[d] < 0)
            return false;
    if (ne[0] % tt->block_size)
        return false;
    size_t size = (size_t)(ne[0] / tt->block_size);
    if (tsr__mul_overflow(size, tt->block_bytes, &size))
        return false;
    for (int d = 1; d < n_dims; d++)
        if (tsr__mul_overflow(size, (size_t)ne[d], &size))
            return false;
    /* The element count must fit int64 too (tsr_tensor_nelements). */
    int64_t nel = 1;
    for (int d = 0; d < n_dims; d++)
        if (__builtin_mul_overflow(nel, ne[d], &nel))
            return false;
    *out = size;
    return true;
}

const char *tsr__gguf_printable(char *buf, size_t size, const char *name, size_t len) {
    size_t o = 0;
    for (size_t i = 0; i < len && o + 8 < size; i++) {
        unsigned char c = (unsigned char)name[i];
        if (o > 80) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\')
            buf[o++] = (char)c;
        else
            o += (size_t)snprintf(buf + o, size - o, "\\x%02x", c);
    }
    buf[o < size ? o : size - 1] = 0;
    return buf;
}

/* ---- name index --------------------------------------------------------- */

static const char *names_get(const tsr__names *n, size_t i) {
    const char *item = (const char *)n->base + i * n->stride + n->name_off;
    const char *name;
    memcpy(&name, item, sizeof name);
    return name;
}

static uint64_t name_hash(uint64_t seed, const char *s) {
    uint64_t h = 1469598103934665603ull ^ seed;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h ^ (h >> 29);
}

static void index_place(tsr__name_index *ix, const tsr__names *names, size_t i) {
    size_t mask = ix->cap - 1;
    size_t s = (size_t)name_hash(ix->seed, names_get(names, i)) & mask;
    while (ix->slots[s]) s = (s + 1) & mask;
    ix->slots[s] = (uint32_t)(i + 1);
}

static tsr_status index_grow(tsr__name_index *ix, const tsr__names *names) {
    size_t cap = ix->cap ? ix->cap * 2 : 16;
    uint32_t *slots = tsr__calloc(cap, sizeof *slots);
    if (!slots)
        return tsr__error(TSR_E_NOMEM, "gguf: out of memory for a name index of %zu slots", cap);
    tsr__free(ix->slots);
    ix->slots = slots;
    ix->cap = cap;
    for (size_t i = 0; i < ix->count; i++) index_place(ix, names, i);
    return TSR_OK;
}

void tsr__name_index_free(tsr__name_index *ix) {
    tsr__free(ix->slots);
    ix->slots = NULL;
    ix->cap = ix->count = 0;
}

int64_t tsr__name_index_find(const tsr__name_index *ix, const tsr__names *names, const char *name) {
    if (!ix->cap || !name)
        return -1;
    size_t mask = ix->cap - 1;
    for (size_t s = (size_t)name_hash(ix->seed, name) & mask; ix->slots[s]; s = (s + 1) & mask) {
        size_t i = ix->slots[s] - 1;
        if (strcmp(names_get(names, i), name) == 0)
            return (int64_t)i;
    }
    return -1;
}

tsr_status tsr__name_index_insert(tsr__name_index *ix, const tsr__names *names, size_t i, int64_t *dup) {
    *dup = tsr__name_index_find(ix, names, names_get(names, i));
    if (*dup >= 0)
        return TSR_OK;
    if (i >= UINT32_MAX - 1)
        return tsr__error(TSR_E_RANGE, "gguf: too many names (%zu)", i);
    if ((ix->count + 1) * 2 > ix->cap) {
        tsr_status st = index_grow(ix, names);
        if (st)
            return st;
    }
    index_place(ix, names, i);
    ix->count++;
    return TSR_OK;
}

static tsr__names kv_names(const tsr_gguf *g) {
    return (tsr__names){g->kvs, sizeof(tsr__gguf_kv), offsetof(tsr__gguf_kv, key)};
}
static tsr__names tensor_names(const tsr_gguf *g) {
    return (tsr__names){g->tensors, sizeof(gguf_tensor), offsetof(gguf_tensor, name)};
}

/* ------------------------------------------------------------------------ */
/* Buffered source: a file (through a large buffer) or memory               */
/* ------------------------------------------------------------------------ */

typedef struct src {
    const char *name; /* file name for errors */
    int fd;
    const uint8_t *mem;
    uint64_t size; /* file size */
    uint64_t pos;  /* offset of the next byte to consume */
    uint8_t *buf;  /* file mode: bytes [buf_start, buf_start + buf_len) */
    uint64_t buf_start;
    size_t buf_len;
    uint64_t item_pos; /* offset where the current key/tensor starts */
    char what[200];    /* "key 'general.name'", "tensor #3", "header" */
} src;

TSR_PRINTF(4, 5)
static tsr_status src_fail(const src *s, tsr_status st, uint64_t off, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tsr__error(st, "%s: %s at offset %" PRIu64 ": %s", s->name, s->what, off, msg);
}

static uint64_t src_left(const src *s) { return s->size - s->pos; }

/* Fills the buffer from the file so that it starts at s->pos. */
static tsr_status src_fill(src *s) {
    size_t want = SRC_BUF_SIZE;
    if (src_left(s) < want)
        want = (size_t)src_left(s);
    size_t got = 0;
    while (got < want) {
        ssize_t r = pread(s->fd, s->buf + got, want - got, (off_t)(s->pos + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return src_fail(s, TSR_E_IO, s->pos + got, "read failed: %s", strerror(errno));
        if (r == 0)
            return src_fail(s, TSR_E_IO, s->pos + got,
                            "file ended early (it shrank while being read; expected %" PRIu64 " bytes)", s->size);
        got += (size_t)r;
    }
    s->buf_start = s->pos;
    s->buf_len = got;
    return TSR_OK;
}

/* Reads n bytes (already checked to be in the file) into dst. */
static tsr_status src_copy(src *s, void *dst, size_t n) {
    uint8_t *d = dst;
    if (!s->buf) {
        memcpy(d, s->mem + s->pos, n);
        s->pos += n;
        return TSR_OK;
    }
    while (n) {
        if (s->pos < s->buf_start || s->pos >= s->buf_start + s->buf_len) {
            tsr_status st = src_fill(s);
            if (st)
                return st;
        }
        size_t at = (size_t)(s->pos - s->buf_start);
        size_t k = s->buf_len - at < n ? s->buf_len - at : n;
        memcpy(d, s->buf + at, k);
        d += k;
        n -= k;
        s->pos += k;
    }
    return TSR_OK;
}

/* Reads n bytes of `field`; a file too short for them is a malformed file. */
static tsr_status src_read(src *s, void *dst, uint64_t n, const char *field) {
    if (n > src_left(s))
        return src_fail(s, TSR_E_MALFORMED, s->pos,
                        "file ends (it is %" PRIu64 " bytes) %" PRIu64 " bytes short of the end of %s", s->size,
                        n - src_left(s), field);
    return src_copy(s, dst, (size_t)n);
}

static tsr_status src_u32(src *s, uint32_t *v, const char *field) {
    uint8_t b[4];
    tsr_status st = src_read(s, b, 4, field);
    if (!st)
        *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return st;
}

static tsr_status src_u64(src *s, uint64_t *v, const char *field) {
    uint8_t b[8];
    tsr_status st = src_read(s, b, 8, field);
    if (st)
        return st;
    *v = 0;
    for (int i = 7; i >= 0; i--) *v = *v << 8 | b[i];
    return TSR_OK;
}

/* A GGUF string: uint64 length then bytes. Checks the length against the
 * cap and the bytes left BEFORE allocating; returns it NUL-terminated. */
static tsr_status src_string(src *s, uint64_t cap, const char *field, char **out, size_t *len) {
    uint64_t n, at = s->pos;
    char lenfield[96];
    snprintf(lenfield, sizeof lenfield, "the length of %s", field);
    tsr_status st = src_u64(s, &n, lenfield);
    if (st)
        return st;
    if (n > cap)
        return src_fail(s, TSR_E_MALFORMED, at, "%s is %" PRIu64 " bytes long, more than the limit of %" PRIu64, field,
                        n, cap);
    if (n > src_left(s))
        return src_fail(s, TSR_E_MALFORMED, at,
                        "%s is %" PRIu64 " bytes long but only %" PRIu64 " bytes are left in the file (file is %" PRIu64
                        " bytes)",
                        field, n, src_left(s), s->size);
    char *p = tsr__malloc((size_t)n + 1);
    if (!p)
        return tsr__error(TSR_E_NOMEM, "%s: out of memory for %s (%" PRIu64 " bytes)", s->name, field, n);
    st = src_copy(s, p, (size_t)n);
    if (st) {
        tsr__free(p);
        return st;
    }
    p[n] = 0;
    *out = p;
    *len = (size_t)n;
    return TSR_OK;
}

/* ------------------------------------------------------------------------ */
/* Parsing                                                                  */
/* ------------------------------------------------------------------------ */

static tsr_status parse_header(src *s, tsr_gguf *g, uint64_t *n_tensors, uint64_t *n_kv) {
    snprintf(s->what, sizeof s->what, "header");
    if (s->size < HEADER_BYTES)
        return src_fail(s, TSR_E_MALFORMED, 0, "file is %" PRIu64 " bytes, too short for a GGUF header (%d bytes)",
                        s->size, HEADER_BYTES);
    char magic[4];
    tsr_status st = src_read(s, magic, 4, "the magic");
    if (st)
        return st;
    if (memcmp(magic, TSR_GGUF_MAGIC, 4)) {
        char shown[40];
        return src_fail(s, TSR_E_MALFORMED, 0, "not a GGUF file: expected magic 'GGUF', found '%s'",
                        tsr__gguf_printable(shown, sizeof shown, magic, 4));
    }
    uint32_t v;
    if ((st = src_u32(s, &v, "the version")))
        return st;
    if (v == 1)
        return src_fail(s, TSR_E_UNSUPPORTED, 4, "GGUF version 1 is obsolete: expected version 2 or 3, found 1");
    if (v != 2 && v != 3) {
        uint32_t swapped = __builtin_bswap32(v);
        if (swapped >= 1 && swapped <= 3)
            return src_fail(s, TSR_E_UNSUPPORTED, 4,
                            "big-endian GGUF files are not supported "
                            "(version reads as %" PRIu32 ", byte-swapped %" PRIu32 ")",
                            v, swapped);
        return src_fail(s, TSR_E_UNSUPPORTED, 4, "unknown GGUF version: expected 2 or 3, found %" PRIu32, v);
    }
    g->version = v;
    if ((st = src_u64(s, n_tensors, "the tensor count")) || (st = src_u64(s, n_kv, "the key count")))
        return st;
    /* Bound the counts by what the rest of the file can hold. */
    uint64_t left = src_left(s);
    if (*n_kv > left / MIN_KV_BYTES)
        return src_fail(s, TSR_E_MALFORMED, 16,
                        "%" PRIu64 " keys cannot fit in the %" PRIu64 " bytes left (each needs at least %d bytes)",
                        *n_kv, left, MIN_KV_BYTES);
    left -= *n_kv * MIN_KV_BYTES;
    if (*n_tensors > left / MIN_TENSOR_INFO_BYTES)
        return src_fail(s, TSR_E_MALFORMED, 8,
                        "%" PRIu64 " tensors and %" PRIu64 " keys cannot fit in the %" PRIu64
                        " bytes left (a tensor info needs at least %d bytes, a key %d)",
                        *n_tensors, *n_kv, src_left(s), MIN_TENSOR_INFO_BYTES, MIN_KV_BYTES);
    return TSR_OK;
}

/* Numeric array: n elements of a fixed size, checked against the bytes left. */
static tsr_status parse_num_array(src *s, tsr__gguf_kv *kv, uint64_t at, size_t esize) {
    if (kv->n > src_left(s) / esize)
        return src_fail(s, TSR_E_MALFORMED, at,
                        "array of %" PRIu64 " %s elements needs %" PRIu64 " bytes but only %" PRIu64
                        " are left in the file (file is %" PRIu64 " bytes)",
                        kv->n, tsr__gguf_type_name(kv->arr_type), kv->n * esize, src_left(s), s->size);
    kv->size = (size_t)(kv->n * esize);
    kv->data = tsr__malloc(kv->size ? kv->size : 1);
    if (!kv->data)
        return tsr__error(TSR_E_NOMEM, "%s: %s: out of memory for an array of %zu bytes", s->name, s->what, kv->size);
    tsr_status st = src_copy(s, kv->data, kv->size);
    if (st || kv->arr_type != TSR_GGUF_BOOL)
        return st;
    for (uint64_t i = 0; i < kv->n; i++)
        if (((uint8_t *)kv->data)[i] > 1)
            return src_fail(s, TSR_E_MALFORMED, s->pos - kv->n + i,
                            "bool element %" PRIu64 ": expected 0 or 1, found %u", i, ((uint8_t *)kv->data)[i]);
    return TSR_OK;
}

/* String array: n strings packed into one growing blob (bounded by the
 * file size, since every byte of it was read from the file). */
static tsr_status parse_str_array(src *s, tsr__gguf_kv *kv, uint64_t at) {
    if (kv->n > src_left(s) / 8)
        return src_fail(s, TSR_E_MALFORMED, at,
                        "array of %" PRIu64 " strings needs at least %" PRIu64 " bytes but only %" PRIu64
                        " are left in the file (file is %" PRIu64 " bytes)",
                        kv->n, kv->n * 8, src_left(s), s->size);
    kv->str_offs = tsr__malloc((size_t)(kv->n + 1) * sizeof(uint64_t));
    if (!kv->str_offs)
        return tsr__error(TSR_E_NOMEM, "%s: %s: out of memory for %" PRIu64 " strings", s->name, s->what, kv->n);
    size_t cap = 0, used = 0;
    for (uint64_t i = 0; i < kv->n; i++) {
        /* hot path of every vocabulary: no formatting and no allocation per
         * element; the element's name is written only into an error */
        uint64_t n, el_at = s->pos;
        char field[64];
        if (src_left(s) < 8) {
            snprintf(field, sizeof field, "the length of string element %" PRIu64, i);
            return src_read(s, &n, 8, field);
        }
        tsr_status st = src_u64(s, &n, "");
        if (st)
            return st;
        if (n > TSR_GGUF_MAX_STR_LEN || n > src_left(s)) {
            snprintf(field, sizeof field, "string element %" PRIu64, i);
            if (n > TSR_GGUF_MAX_STR_LEN)
                return src_fail(s, TSR_E_MALFORMED, el_at,
                                "%s is %" PRIu64 " bytes long, more than the limit of %" PRIu64, field, n,
                                (uint64_t)TSR_GGUF_MAX_STR_LEN);
            return src_fail(s, TSR_E_MALFORMED, el_at,
                            "%s is %" PRIu64 " bytes long but only %" PRIu64
                            " bytes are left in the file (file is %" PRIu64 " bytes)",
                            field, n, src_left(s), s->size);
        }
        size_t len = (size_t)n;
        if (used + len + 1 > cap) {
            size_t ncap = cap ? cap : 256;
            while (ncap < used + len + 1) ncap *= 2;
            char *nd = tsr__realloc(kv->data, ncap);
            if (!nd)
                return tsr__error(TSR_E_NOMEM, "%s: %s: out of memory for strings (%zu bytes)", s->name, s->what, ncap);
            kv->data = nd;
            cap = ncap;
        }
        if ((st = src_copy(s, (char *)kv->data + used, len)) != TSR_OK)
            return st;
        ((char *)kv->data)[used + len] = '\0';
        kv->str_offs[i] = used;
        used += len + 1;
    }
    kv->str_offs[kv->n] = used;
    kv->size = used;
    if (!kv->data && !(kv->data = tsr__malloc(1)))
        return tsr__error(TSR_E_NOMEM, "%s: out of memory", s->name);
    return TSR_OK;
}

static tsr_status parse_array(src *s, tsr__gguf_kv *kv) {
    uint64_t at = s->pos;
    uint32_t et;
    tsr_status st = src_u32(s, &et, "the array element type");
    if (st)
        return st;
    if (et == TSR_GGUF_ARRAY)
        return src_fail(s, TSR_E_MALFORMED, at, "nested arrays are not supported (element type ARRAY)");
    if (!tsr__gguf_type_valid(et))
        return src_fail(s, TSR_E_MALFORMED, at, "unknown array element type: expected 0..12, found %" PRIu32, et);
    kv->arr_type = (tsr_gguf_type)et;
    at = s->pos;
    if ((st = src_u64(s, &kv->n, "the array length")))
        return st;
    if (kv->n > TSR_GGUF_MAX_ARR_LEN)
        return src_fail(s, TSR_E_MALFORMED, at, "array of %" PRIu64 " elements is longer than the limit of %" PRIu64,
                        kv->n, TSR_GGUF_MAX_ARR_LEN);
    if (et == TSR_GGUF_STRING)
        return parse_str_array(s, kv, at);
    return parse_num_array(s, kv, at, tsr__gguf_type_size(kv->arr_type));
}

static tsr_status parse_value(src *s, tsr__gguf_kv *kv) {
    uint64_t at = s->pos;
    if (kv->type == TSR_GGUF_ARRAY)
        return parse_array(s, kv);
    kv->n = 1;
    if (kv->type == TSR_GGUF_STRING) {
        char *str;
        tsr_status st = src_string(s, TSR_GGUF_MAX_STR_LEN, "the string value", &str, &kv->size);
        if (!st)
            kv->data = str;
        return st;
    }
    kv->size = tsr__gguf_type_size(kv->type);
    kv->data = tsr__malloc(kv->size);
    if (!kv->data)
        return tsr__error(TSR_E_NOMEM, "%s: out of memory", s->name);
    tsr_status st = src_read(s, kv->data, kv->size, "the value");
    if (st)
        return st;
    if (kv->type == TSR_GGUF_BOOL && *(uint8_t *)kv->data > 1)
        return src_fail(s, TSR_E_MALFORMED, at, "bool value: expected 0 or 1, found %u", *(uint8_t *)kv->data);
    return TSR_OK;
}

/* general.alignment: UINT32, a power of two. */
static tsr_status check_alignment(src *s, tsr_gguf *g, const tsr__gguf_kv *kv, uint64_t at) {
    if (kv->type != TSR_GGUF_UINT32)
        return src_fail(s, TSR_E_MALFORMED, at, "expected type UINT32, found %s (%d)", tsr__gguf_type_name(kv->type),
                        (int)kv->type);
    uint32_t a;
    memcpy(&a, kv->data, 4);
    if (a == 0 || (a & (a - 1)))
        return src_fail(s, TSR_E_MALFORMED, at, "alignment must be a power of two, found %" PRIu32, a);
    g->alignment = a;
    return TSR_OK;
}

static tsr_status parse_kv(src *s, tsr_gguf *g, size_t i) {
    tsr__gguf_kv *kv = &g->kvs[i];
    s->item_pos = s->pos;
    snprintf(s->what, sizeof s->what, "key #%zu", i);
    tsr_status st = src_string(s, TSR_GGUF_MAX_KEY_LEN, "the key name", &kv->key, &kv->key_len);
    if (st)
        return st;
    char shown[128];
    tsr__gguf_printable(shown, sizeof shown, kv->key, kv->key_len);
    if (kv->key_len == 0)
        return src_fail(s, TSR_E_MALFORMED, s->item_pos, "key name is empty");
    if (memchr(kv->key, 0, kv->key_len))
        return src_fail(s, TSR_E_MALFORMED, s->item_pos, "key name '%s' contains a NUL byte", shown);
    snprintf(s->what, sizeof s->what, "key '%s'", shown);
    int64_t dup;
    tsr__names names = kv_names(g);
    if ((st = tsr__name_index_insert(&g->key_ix, &names, i, &dup)))
        return st;
    if (dup >= 0)
        return src_fail(s, TSR_E_MALFORMED, s->item_pos, "duplicate key (first defined as key #%" PRId64 ")", dup);
    uint64_t at = s->pos;
    uint32_t type;
    if ((st = src_u32(s, &type, "the value type")))
        return st;
    if (!tsr__gguf_type_valid(type))
        return src_fail(s, TSR_E_MALFORMED, at, "unknown value type: expected 0..12, found %" PRIu32, type);
    kv->type = (tsr_gguf_type)type;
    if ((st = parse_value(s, kv)))
        return st;
    if (strcmp(kv->key, TSR_GGUF_ALIGNMENT_KEY) == 0)
        return check_alignment(s, g, kv, at);
    return TSR_OK;
}

static tsr_status parse_tensor_name(src *s, tsr_gguf *g, size_t i) {
    gguf_tensor *t = &g->tensors[i];
    size_t len;
    tsr_status st = src_string(s, TSR_GGUF_MAX_KEY_LEN, "the tensor name", &t->name, &len);
    if (st)
        return st;
    char shown[128];
    tsr__gguf_printable(shown, sizeof shown, t->name, len);
    if (len == 0)
        return src_fail(s, TSR_E_MALFORMED, t->info_pos, "tensor name is empty");
    if (memchr(t->name, 0, len))
        return src_fail(s, TSR_E_MALFORMED, t->info_pos, "tensor name '%s' contains a NUL byte", shown);
    if (len > TSR_GGUF_MAX_NAME)
        return src_fail(s, TSR_E_MALFORMED, t->info_pos, "tensor name '%s' is %zu bytes, longer than the limit of %d",
                        shown, len, TSR_GGUF_MAX_NAME);
    snprintf(s->what, sizeof s->what, "tensor '%s'", shown);
    int64_t dup;
    tsr__names names = tensor_names(g);
    if ((st = tsr__name_index_insert(&g->tensor_ix, &names, i, &dup)))
        return st;
    if (dup >= 0)
        return src_fail(s, TSR_E_MALFORMED, t->info_pos, "duplicate tensor name (first defined as tensor #%" PRId64 ")",
                        dup);
    return TSR_OK;
}

static tsr_status parse_tensor_shape(src *s, gguf_tensor *t) {
    uint64_t at = s->pos;
    uint32_t nd;
    tsr_status st = src_u32(s, &nd, "n_dims");
    if (st)
        return st;
    if (nd < 1 || nd > TSR_MAX_DIMS)
        return src_fail(s, TSR_E_MALFORMED, at, "n_dims: expected 1 to %d, found %" PRIu32, TSR_MAX_DIMS, nd);
    t->n_dims = (int)nd;
    for (int d = 0; d < TSR_MAX_DIMS; d++) t->ne[d] = 1;
    for (int d = 0; d < t->n_dims; d++) {
        uint64_t v;
        char field[16];
        snprintf(field, sizeof field, "ne[%d]", d);
        at = s->pos;
        if ((st = src_u64(s, &v, field)))
            return st;
        if (v > (uint64_t)INT64_MAX)
            return src_fail(s, TSR_E_MALFORMED, at,
                            "ne[%d]: expected 0 to %" PRId64 ", found %" PRIu64 " (negative as int64)", d, INT64_MAX,
                            v);
        t->ne[d] = (int64_t)v;
    }
    return TSR_OK;
}

static tsr_status check_tensor_type(src *s, gguf_tensor *t, uint32_t type, uint64_t at) {
    if (type == 4 || type == 5)
        return src_fail(s, TSR_E_UNSUPPORTED, at,
                        "tensor type %" PRIu32 " (%s) was removed from GGUF; "
                        "the file must be converted again",
                        type, type == 4 ? "Q4_2" : "Q4_3");
    const tsr_type_traits *tt = type < TSR_TYPE_COUNT ? tsr__type_traits((tsr_type)type) : NULL;
    if (!tt || tt->block_size <= 0)
        return src_fail(s, TSR_E_UNSUPPORTED, at,
                        "unknown tensor type: expected a type number below %d, found %" PRIu32, TSR_TYPE_COUNT, type);
    t->type = (tsr_type)type;
    if (t->ne[0] % tt->block_size)
        return src_fail(s, TSR_E_MALFORMED, at,
                        "ne[0] = %" PRId64 " is not a multiple of the block size %" PRId64 " of type %s", t->ne[0],
                        tt->block_size, tt->name);
    if (!tsr__gguf_tensor_bytes(t->type, t->n_dims, t->ne, &t->size))
        return src_fail(s, TSR_E_MALFORMED, t->info_pos,
                        "size of a %s tensor of %" PRId64 " x %" PRId64 " x %" PRId64 " x %" PRId64
                        " elements overflows",
                        tt->name, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    return TSR_OK;
}

static tsr_status parse_tensor_info(src *s, tsr_gguf *g, size_t i) {
    gguf_tensor *t = &g->tensors[i];
    t->info_pos = s->pos;
    snprintf(s->what, sizeof s->what, "tensor #%zu", i);
    tsr_status st = parse_tensor_name(s, g, i);
    if (st || (st = parse_tensor_shape(s, t)))
        return st;
    uint64_t at = s->pos;
    uint32_t type;
    if ((st = src_u32(s, &type, "the tensor type")) || (st = check_tensor_type(s, t, type, at)))
        return st;
    at = s->pos;
    if ((st = src_u64(s, &t->offset, "the tensor offset")))
        return st;
    if (t->offset % g->alignment)
        return src_fail(s, TSR_E_MALFORMED, at, "data offset %" PRIu64 " is not a multiple of the alignment %zu",
                        t->offset, g->alignment);
    return TSR_OK;
}

typedef struct span {
    uint64_t offset;
    size_t size;
    size_t index;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static tsr_status check_overlaps(src *s, tsr_gguf *g) {
    span *sp = tsr__malloc(g->n_tensors * sizeof *sp);
    if (!sp)
        return tsr__error(TSR_E_NOMEM, "%s: out of memory", s->name);
    size_t n = 0;
    for (size_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].size)
            sp[n++] = (span){g->tensors[i].offset, g->tensors[i].size, i};
    qsort(sp, n, sizeof *sp, cmp_span);
    tsr_status st = TSR_OK;
    for (size_t k = 1; k < n && !st; k++) {
        if (sp[k - 1].offset + sp[k - 1].size <= sp[k].offset)
            continue;
        const gguf_tensor *t = &g->tensors[sp[k].index], *prev = &g->tensors[sp[k - 1].index];
        char shown[128], shown2[128];
        snprintf(s->what, sizeof s->what, "tensor '%s'",
                 tsr__gguf_printable(shown, sizeof shown, t->name, strlen(t->name)));
        st = src_fail(s, TSR_E_MALFORMED, g->data_offset + t->offset,
                      "data (offsets %" PRIu64 "..%" PRIu64 " of the data section) overlaps tensor '%s' "
                      "(offsets %" PRIu64 "..%" PRIu64 ")",
                      t->offset, t->offset + t->size,
                      tsr__gguf_printable(shown2, sizeof shown2, prev->name, strlen(prev->name)), prev->offset,
                      prev->offset + prev->size);
    }
    tsr__free(sp);
    return st;
}

/* Every tensor's bytes inside the file, and no two overlapping. */
static tsr_status check_tensor_data(src *s, tsr_gguf *g) {
    char shown[128];
    for (size_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        uint64_t start, end;
        snprintf(s->what, sizeof s->what, "tensor '%s'",
                 tsr__gguf_printable(shown, sizeof shown, t->name, strlen(t->name)));
        if (__builtin_add_overflow(g->data_offset, t->offset, &start) ||
            __builtin_add_overflow(start, (uint64_t)t->size, &end))
            return src_fail(s, TSR_E_MALFORMED, t->info_pos, "data offset %" PRIu64 " + size %zu overflows", t->offset,
                            t->size);
        /* A zero-sized tensor may sit at the very end, even where the file
         * stops before the padding of an empty data section. */
        if (t->size ? end > g->file_size : start > (g->file_size > g->data_offset ? g->file_size : g->data_offset))
            return src_fail(s, TSR_E_MALFORMED, start,
                            "data extends past end of file (%zu bytes up to offset %" PRIu64 "; file is %" PRIu64
                            " bytes)",
                            t->size, end, g->file_size);
    }
    return g->n_tensors < 2 ? TSR_OK : check_overlaps(s, g);
}

static tsr_status parse(src *s, tsr_gguf *g) {
    uint64_t n_tensors, n_kv;
    tsr_status st = parse_header(s, g, &n_tensors, &n_kv);
    if (st)
        return st;
    g->alignment = TSR_GGUF_DEFAULT_ALIGNMENT;
    g->kvs = tsr__calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->kvs);
    g->tensors = tsr__calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensors);
    if (!g->kvs || !g->tensors)
        return tsr__error(TSR_E_NOMEM, "%s: out of memory for %" PRIu64 " keys and %" PRIu64 " tensors", s->name, n_kv,
                          n_tensors);
    for (size_t i = 0; i < n_kv; i++, g->n_kv++)
        if ((st = parse_kv(s, g, i))) {
            g->n_kv++; /* so that close frees the partial pair */
            return st;
        }
    for (size_t i = 0; i < n_tensors; i++, g->n_tensors++)
        if ((st = parse_tensor_info(s, g, i))) {
            g->n_tensors++;
            return st;
        }
    snprintf(s->what, sizeof s->what, "data section");
    uint64_t pad = (g->alignment - s->pos % g->alignment) % g->alignment;
    if (__builtin_add_overflow(s->pos, pad, &g->data_offset))
        return src_fail(s, TSR_E_MALFORMED, s->pos, "data section offset overflows");
    return check_tensor_data(s, g);
}

/* ------------------------------------------------------------------------ */
/* Open / close                                                             */
/* ------------------------------------------------------------------------ */

static tsr_status open_common(tsr_gguf *g, src *s, tsr_gguf **out) {
    g->key_ix.seed = (uint64_t)(uintptr_t)g * 0x9e3779b97f4a7c15ull;
    g->tensor_ix.seed = g->key_ix.seed ^ 0x5bd1e995u;
    s->name = g->path;
    g->file_size = s->size;
    tsr_status st = parse(s, g);
    if (st) {
        tsr_gguf_close(g);
        return st;
    }
    *out = g;
    return TSR_OK;
}

tsr_status tsr_gguf_open(const char *path, tsr_gguf **out) {
    if (!out)
        return tsr__error(TSR_E_INVALID, "tsr_gguf_open: out is NULL");
    *out = NULL;
    if (!path)
        return tsr__error(TSR_E_INVALID, "tsr_gguf_open: path is NULL");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tsr__error(TSR_E_IO, "%s: cannot open: %s", path, strerror(errno));
    return tsr__gguf_open_fd(fd, path, out);
}

tsr_status tsr__gguf_open_fd(int fd, const char *path, tsr_gguf **out) {
    *out = NULL;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        tsr_status st = tsr__error(TSR_E_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return st;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return tsr__error(TSR_E_IO, "%s: not a regular file", path);
    }
    tsr_gguf *g = tsr__calloc(1, sizeof *g);
    uint8_t *buf = tsr__malloc(SRC_BUF_SIZE);
    char *p = tsr__strdup(path);
    if (!g || !buf || !p) {
        tsr__free(g);
        tsr__free(buf);
        tsr__free(p);
        close(fd);
        return tsr__error(TSR_E_NOMEM, "%s: out of memory", path);
    }
    g->fd = fd;
    g->path = p;
    src s = {.fd = fd, .size = (uint64_t)sb.st_size, .buf = buf};
    tsr_status st = open_common(g, &s, out);
    tsr__free(buf);
    return st;
}

int tsr__gguf_fd(const tsr_gguf *g) { return g->fd; }

const char *tsr__gguf_path(const tsr_gguf *g) { return g->path; }

tsr_status tsr_gguf_open_memory(const void *data, size_t size, const char *name, int keep, tsr_gguf **out) {
    if (!out)
        return tsr__error(TSR_E_INVALID, "tsr_gguf_open_memory: out is NULL");
    *out = NULL;
    if (!data && size)
        return tsr__error(TSR_E_INVALID, "tsr_gguf_open_memory: data is NULL");
    if (!name)
        name = "<memory>";
    tsr_gguf *g = tsr__calloc(1, sizeof *g);
    char *p = tsr__strdup(name);
    uint8_t *copy = keep ? NULL : tsr__malloc(size ? size : 1);
    if (!g || !p || (!keep && !copy)) {
        tsr__free(g);
        tsr__free(p);
        tsr__free(copy);
        return tsr__error(TSR_E_NOMEM, "%s: out of memory (%zu bytes)", name, size);
    }
    if (copy && size)
        memcpy(copy, data, size);
    g->fd = -1;
    g->path = p;
    g->mem_owned = copy;
    g->mem = keep ? data : copy;
    src s = {.fd = -1, .mem = g->mem, .size = size};
    return open_common(g, &s, out);
}

void tsr_gguf_close(tsr_gguf *g) {
    if (!g)
        return;
    for (size_t i = 0; i < g->n_kv; i++) tsr__gguf_kv_clear(&g->kvs[i]);
    for (size_t i = 0; i < g->n_tensors; i++) tsr__free(g->tensors[i].name);
    tsr__free(g->kvs);
    tsr__free(g->tensors);
    tsr__name_index_free(&g->key_ix);
    tsr__name_index_free(&g->tensor_ix);
    if (g->fd >= 0)
        close(g->fd);
    tsr__free(g->mem_owned);
    tsr__free(g->path);
    tsr__free(g);
}

/* ------------------------------------------------------------------------ */
/* Accessors                                                                */
/* ------------------------------------------------------------------------ */

uint32_t tsr_gguf_version(const tsr_gguf *g) { return g ? g->version : 0; }
int64_t tsr_gguf_n_tensors(const tsr_gguf *g) { return g ? (int64_t)g->n_tensors : -1; }
int64_t tsr_gguf_n_keys(const tsr_gguf *g) { return g ? (int64_t)g->n_kv : -1; }
size_t tsr_gguf_alignment(const tsr_gguf *g) { return g ? g->alignment : 0; }
uint64_t tsr_gguf_data_offset(const tsr_gguf *g) { return g ? g->data_offset : 0; }
const char *tsr_gguf_path(const tsr_gguf *g) { return g ? g->path : NULL; }

size_t tsr__gguf_kv_count(const tsr_gguf *g) { return g->n_kv; }
const tsr__gguf_kv *tsr__gguf_kv_at(const tsr_gguf *g, size_t i) { return &g->kvs[i]; }
const uint8_t *tsr__gguf_memory(const tsr_gguf *g) { return g->mem; }

int64_t tsr_gguf_find_key(const tsr_gguf *g, const char *key) {
    if (!g || !key)
        return -1;
    tsr__names names = kv_names(g);
    return tsr__name_index_find(&g->key_ix, &names, key);
}

const char *tsr_gguf_key_name(const tsr_gguf *g, int64_t i) {
    return g && i >= 0 && (uint64_t)i < g->n_kv ? g->kvs[i].key : NULL;
}

tsr_gguf_type tsr_gguf_key_type(const tsr_gguf *g, int64_t i) {
    return g && i >= 0 && (uint64_t)i < g->n_kv ? g->kvs[i].type : (tsr_gguf_type)-1;
}

static tsr_status find_kv(const tsr_gguf *g, const char *key, const void *out, const tsr__gguf_kv **kv) {
    if (!g || !key || !out)
        return tsr__error(TSR_E_INVALID, "gguf: NULL argument");
    int64_t i = tsr_gguf_find_key(g, key);
    if (i < 0)
        return tsr__error(TSR_E_NOT_FOUND, "%s: no key '%s'", g->path, key);
    *kv = &g->kvs[i];
    return TSR_OK;
}

static tsr_status type_error(const tsr_gguf *g, const tsr__gguf_kv *kv, const char *expected) {
    return tsr__error(TSR_E_TYPE, "%s: key '%s': expected %s, found %s", g->path, kv->key, expected,
                      tsr__gguf_type_name(kv->type));
}

/* Integer value of kv as (negative?, magnitude-compatible) pair. */
static bool kv_int(const tsr__gguf_kv *kv, int64_t *sv, uint64_t *uv, bool *neg) {
    const void *p = kv->data;
    int64_t s = 0;
    uint64_t u = 0;
    switch (kv->type) {
    case TSR_GGUF_UINT8: u = *(const uint8_t *)p; break;
    case TSR_GGUF_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        u = v;
    } break;
    case TSR_GGUF_UINT32: {
        uint32_t v;
        memcpy(&v, p, 4);
        u = v;
    } break;
    case TSR_GGUF_UINT64: memcpy(&u, p, 8); break;
    case TSR_GGUF_INT8: s = *(const int8_t *)p; break;
    case TSR_GGUF_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        s = v;
    } break;
    case TSR_GGUF_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        s = v;
    } break;
    case TSR_GGUF_INT64: memcpy(&s, p, 8); break;
    default: return false;
    }
    bool is_signed = kv->type == TSR_GGUF_INT8 || kv->type == TSR_GGUF_INT16 || kv->type == TSR_GGUF_INT32 ||
                     kv->type == TSR_GGUF_INT64;
    if (is_signed) {
        *neg = s < 0;
        u = (uint64_t)s;
    } else {
        *neg = false;
        s = (int64_t)u;
    }
    *sv = s;
    *uv = u;
    return true;
}

static tsr_status get_int(const tsr_gguf *g, const char *key, const void *out, bool want_signed, uint64_t umax,
                          int64_t smin, int64_t smax, int64_t *sv, uint64_t *uv, const char *tname) {
    const tsr__gguf_kv *kv = NULL;
    tsr_status st = find_kv(g, key, out, &kv);
    if (st)
        return st;
    bool neg;
    char expected[64];
    snprintf(expected, sizeof expected, "an integer that fits %s", tname);
    if (!kv_int(kv, sv, uv, &neg))
        return type_error(g, kv, expected);
    bool fits = want_signed ? (neg ? *sv >= smin : *uv <= (uint64_t)smax) : (!neg && *uv <= umax);
    if (!fits) {
        if (neg)
            return tsr__error(TSR_E_TYPE, "%s: key '%s': expected %s, found %s %" PRId64, g->path, kv->key, expected,
                              tsr__gguf_type_name(kv->type), *sv);
        return tsr__error(TSR_E_TYPE, "%s: key '%s': expected %s, found %s %" PRIu64, g->path, kv->key, expected,
                          tsr__gguf_type_name(kv->type), *uv);
    }
    return TSR_OK;
}

tsr_status tsr_gguf_get_u32(const tsr_gguf *g, const char *key, uint32_t *out) {
    int64_t s;
    uint64_t u;
    tsr_status st = get_int(g, key, out, false, UINT32_MAX, 0, 0, &s, &u, "uint32");
    if (!st)
        *out = (uint32_t)u;
    return st;
}

tsr_status tsr_gguf_get_i32(const tsr_gguf *g, const char *key, int32_t *out) {
    int64_t s;
    uint64_t u;
    tsr_status st = get_int(g, key, out, true, 0, INT32_MIN, INT32_MAX, &s, &u, "int32");
    if (!st)
        *out = (int32_t)s;
    return st;
}

tsr_status tsr_gguf_get_u64(const tsr_gguf *g, const char *key, uint64_t *out) {
    int64_t s;
    uint64_t u;
    tsr_status st = get_int(g, key, out, false, UINT64_MAX, 0, 0, &s, &u, "uint64");
    if (!st)
        *out = u;
    return st;
}

tsr_status tsr_gguf_get_i64(const tsr_gguf *g, const char *key, int64_t *out) {
    int64_t s;
    uint64_t u;
    tsr_status st = get_int(g, key, out, true, 0, INT64_MIN, INT64_MAX, &s, &u, "int64");
    if (!st)
        *out = s;
    return st;
}

static tsr_status get_float(const tsr_gguf *g, const char *key, const void *out, double *v) {
    const tsr__gguf_kv *kv = NULL;
    tsr_status st = find_kv(g, key, out, &kv);
    if (st)
        return st;
    if (kv->type == TSR_GGUF_FLOAT32) {
        float f;
        memcpy(&f, kv->data, 4);
        *v = f;
    } else if (kv->type == TSR_GGUF_FLOAT64) {
        memcpy(v, kv->data, 8);
    } else {
        return type_error(g, kv, "FLOAT32 or FLOAT64");
    }
    return TSR_OK;
}

tsr_status tsr_gguf_get_f32(const tsr_gguf *g, const char *key, float *out) {
    double v;
    tsr_status st = get_float(g, key, out, &v);
    if (!st)
        *out = (float)v;
    return st;
}

tsr_status tsr_gguf_get_f64(const tsr_gguf *g, const char *key, double *out) {
    double v;
    tsr_status st = get_float(g, key, out, &v);
    if (!st)
        *out = v;
    return st;
}

tsr_status tsr_gguf_get_bool(const tsr_gguf *g, const char *key, int *out) {
    const tsr__gguf_kv *kv = NULL;
    tsr_status st = find_kv(g, key, out, &kv);
    if (st)
        return st;
    if (kv->type != TSR_GGUF_BOOL)
        return type_error(g, kv, "BOOL");
    *out = *(const uint8_t *)kv->data != 0;
    return TSR_OK;
}

tsr_status tsr_gguf_get_str(const tsr_gguf *g, const char *key, const char **out, size_t *len) {
    const tsr__gguf_kv *kv = NULL;
    tsr_status st = find_kv(g, key, out, &kv);
    if (st)
        return st;
    if (kv->type != TSR_GGUF_STRING)
        return type_error(g, kv, "STRING");
    *out = kv->data;
    if (len)
        *len = kv->size;
    return TSR_OK;
}

static tsr_status find_arr(const tsr_gguf *g, const char *key, const void *out, const tsr__gguf_kv **kv) {
    tsr_status st = find_kv(g, key, out, kv);
    if (st)
        return st;
    if ((*kv)->type != TSR_GGUF_ARRAY)
        return type_error(g, *kv, "ARRAY");
    return TSR_OK;
}

tsr_status tsr_gguf_get_arr_info(const tsr_gguf *g, const char *key, tsr_gguf_type *elem_type, uint64_t *n) {
    const tsr__gguf_kv *kv = NULL;
    tsr_status st = find_arr(g, key, elem_type ? (const void *)elem_type : (const void *)n, &kv);
    if (st)
        return st;
    if (elem_type)
        *elem_type = kv->arr_type;
    if (n)
        *n = kv->n;
    return TSR_OK;
}

tsr_status tsr_gguf_get_arr_data(const tsr_gguf *g, const char *key, const void **data) {
    const tsr__gguf_kv *kv = NULL;
    tsr_status st = find_arr(g, key, data, &kv);
    if (st)
        return st;
    if (kv->arr_type == TSR_GGUF_STRING)
        return tsr__error(TSR_E_TYPE,
                          "%s: key '%s': expected a numeric array, found an array of STRING "
                          "(use tsr_gguf_get_arr_str)",
                          g->path, kv->key);
    *data = kv->data;
    return TSR_OK;
}

tsr_status tsr_gguf_get_arr_str(const tsr_gguf *g, const char *key, uint64_t i, const char **out, size_t *len) {
    const tsr__gguf_kv *kv = NULL;
    tsr_status st = find_arr(g, key, out, &kv);
    if (st)
        return st;
    if (kv->arr_type != TSR_GGUF_STRING)
        return tsr__error(TSR_E_TYPE, "%s: key '%s': expected an array of STRING, found an array of %s", g->path,
                          kv->key, tsr__gguf_type_name(kv->arr_type));
    if (i >= kv->n)
        return tsr__error(TSR_E_RANGE, "%s: key '%s': index %" PRIu64 " out of range (array has %" PRIu64 " strings)",
                          g->path, kv->key, i, kv->n);
    *out = (const char *)kv->data + kv->str_offs[i];
    if (len)
        *len = (size_t)(kv->str_offs[i + 1] - kv->str_offs[i] - 1);
    return TSR_OK;
}

tsr_status tsr_gguf_get_raw(const tsr_gguf *g, int64_t i, const void **data, size_t *size) {
    if (!g || !data || !size)
        return tsr__error(TSR_E_INVALID, "tsr_gguf_get_raw: NULL argument");
    if (i < 0 || (uint64_t)i >= g->n_kv)
        return tsr__error(TSR_E_RANGE, "%s: key index %" PRId64 " out of range (%zu keys)", g->path, i, g->n_kv);
    const tsr__gguf_kv *kv = &g->kvs[i];
    if (kv->type == TSR_GGUF_ARRAY)
        return type_error(g, kv, "a scalar or STRING");
    *data = kv->data;
    *size = kv->size;
    return TSR_OK;
}

/* ---- tensors ------------------------------------------------------------ */

static const gguf_tensor *tensor_at(const tsr_gguf *g, int64_t i) {
    return g && i >= 0 && (uint64_t)i < g->n_tensors ? &g->tensors[i] : NULL;
}

int64_t tsr_gguf_find_tensor(const tsr_gguf *g, const char *name) {
    if (!g || !name)
        return -1;
    tsr__names names = tensor_names(g);
    return tsr__name_index_find(&g->tensor_ix, &names, name);
}

const char *tsr_gguf_tensor_name(const tsr_gguf *g, int64_t i) {
    const gguf_tensor *t = tensor_at(g, i);
    return t ? t->name : NULL;
}

tsr_type tsr_gguf_tensor_type(const tsr_gguf *g, int64_t i) {
    const gguf_tensor *t = tensor_at(g, i);
    return t ? t->type : (tsr_type)-1;
}

int tsr_gguf_tensor_n_dims(const tsr_gguf *g, int64_t i) {
    const gguf_tensor *t = tensor_at(g, i);
    return t ? t->n_dims : -1;
}

int64_t tsr_gguf_tensor_ne(const tsr_gguf *g, int64_t i, int dim) {
    const gguf_tensor *t = tensor_at(g, i);
    if (!t || dim < 0)
        return -1;
    return dim < TSR_MAX_DIMS ? t->ne[dim] : 1;
}

uint64_t tsr_gguf_tensor_offset(const tsr_gguf *g, int64_t i) {
    const gguf_tensor *t = tensor_at(g, i);
    return t ? t->offset : 0;
}

size_t tsr_gguf_tensor_size(const tsr_gguf *g, int64_t i) {
    const gguf_tensor *t = tensor_at(g, i);
    return t ? t->size : 0;
}

tsr_status tsr_gguf_read_tensor(const tsr_gguf *g, int64_t i, void *dst, size_t size) {
    if (!g)
        return tsr__error(TSR_E_INVALID, "tsr_gguf_read_tensor: NULL handle");
    const gguf_tensor *t = tensor_at(g, i);
    if (!t)
        return tsr__error(TSR_E_RANGE, "%s: tensor index %" PRId64 " out of range (%zu tensors)", g ? g->path : "gguf",
                          i, g ? g->n_tensors : 0);
    if (!dst && t->size)
        return tsr__error(TSR_E_INVALID, "tsr_gguf_read_tensor: dst is NULL");
    if (size < t->size)
        return tsr__error(TSR_E_RANGE, "%s: tensor '%s': destination of %zu bytes is smaller than its %zu bytes",
                          g->path, t->name, size, t->size);
    uint64_t off = g->data_offset + t->offset;
    if (g->fd < 0) {
        if (t->size)
            memcpy(dst, g->mem + off, t->size);
        return TSR_OK;
    }
    for (size_t done = 0; done < t->size;) {
        ssize_t r = pread(g->fd, (char *)dst + done, t->size - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return tsr__error(TSR_E_IO, "%s: tensor '%s' at offset %" PRIu64 ": read failed: %s", g->path, t->name,
                              off + done, strerror(errno));
        if (r == 0)
            return tsr__error(TSR_E_IO,
                              "%s: tensor '%s' at offset %" PRIu64 ": file ended early (it shrank "
                              "after it was opened; it was %" PRIu64 " bytes)",
                              g->path, t->name, off + done, g->file_size);
        done += (size_t)r;
    }
    return TSR_OK;
}
