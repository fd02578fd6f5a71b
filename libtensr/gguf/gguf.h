/*
 * gguf.h - private declarations shared by the GGUF reader (reader.c), the
 * writer (writer.c) and the weight loader: the in-memory form of a
 * key/value pair, the limits a file must respect, and small helpers.
 * Never installed.
 */
#ifndef TSR_GGUF_H
#define TSR_GGUF_H

#include "internal.h"

#include <stdint.h>

#define TSR_GGUF_MAGIC "GGUF"
#define TSR_GGUF_DEFAULT_ALIGNMENT 32
#define TSR_GGUF_ALIGNMENT_KEY "general.alignment"

/* Sanity caps. A hostile file can declare any size; these bound what one
 * field may make us allocate, independently of the file size check. */
#define TSR_GGUF_MAX_KEY_LEN 65535u              /* the GGUF spec's key limit */
#define TSR_GGUF_MAX_STR_LEN (256u << 20)        /* one string value: 256 MiB */
#define TSR_GGUF_MAX_ARR_LEN ((uint64_t)1 << 30) /* elements of one array */
#define TSR_GGUF_MAX_ALIGNMENT (1u << 30)
#define TSR_GGUF_MAX_NAME (TSR_MAX_NAME - 1) /* tensor name bytes (ggml: GGML_MAX_NAME - 1) */

/* One key/value pair. Scalars: `data` holds the value's bytes (size =
 * element size). Strings: `data` is NUL-terminated, `size` its length
 * without the NUL. Numeric arrays: `n` elements of `arr_type` in `data`.
 * String arrays: `n` strings stored back to back, each NUL-terminated, in
 * `data` (size bytes in all); `str_offs[i]` is where string i starts, and
 * its length is str_offs[i+1] - str_offs[i] - 1 (str_offs has n+1 entries). */
typedef struct tsr__gguf_kv {
    char *key;
    size_t key_len;
    tsr_gguf_type type;
    tsr_gguf_type arr_type; /* arrays only */
    uint64_t n;             /* arrays: element count; scalars: 1 */
    void *data;
    size_t size;
    uint64_t *str_offs; /* string arrays only */
} tsr__gguf_kv;

/* Bytes of one value of a fixed-size GGUF value type; 0 for STRING, ARRAY
 * and unknown numbers. */
size_t tsr__gguf_type_size(tsr_gguf_type t);
/* "UINT32", "STRING", ...; "unknown" for other numbers. */
const char *tsr__gguf_type_name(tsr_gguf_type t);
/* 1 for a value-type number this version knows. */
int tsr__gguf_type_valid(uint32_t t);

void tsr__gguf_kv_clear(tsr__gguf_kv *kv);
/* Deep copy of src into dst (dst is overwritten, not freed). */
tsr_status tsr__gguf_kv_copy(tsr__gguf_kv *dst, const tsr__gguf_kv *src);

/* Reader access for the writer's copy_keys and for the loader. */
size_t tsr__gguf_kv_count(const tsr_gguf *g);
const tsr__gguf_kv *tsr__gguf_kv_at(const tsr_gguf *g, size_t i);
/* Data of the file when it was opened from memory (NULL for a file). */
const uint8_t *tsr__gguf_memory(const tsr_gguf *g);
/* tsr_gguf_open of the file open on fd (path names it in errors): the
 * handle keeps fd and closes it in tsr_gguf_close; on failure fd is closed. */
tsr_status tsr__gguf_open_fd(int fd, const char *path, tsr_gguf **out);
/* The descriptor of the file g was parsed from (-1: opened from memory),
 * open until tsr_gguf_close, and the path it was opened by. */
int tsr__gguf_fd(const tsr_gguf *g);
const char *tsr__gguf_path(const tsr_gguf *g);

/* Bytes of a tensor of `type` with dims ne[0..n_dims-1]; false (and *out
 * untouched) when the type is unknown, ne[0] is not a multiple of the
 * block, a dim is negative or the size overflows. */
bool tsr__gguf_tensor_bytes(tsr_type type, int n_dims, const int64_t *ne, size_t *out);

/* Name-to-index hash table (open addressing) used for keys and tensors.
 * Items live in the caller's array of structs; the table stores indices and
 * finds an item's name through a tsr__names accessor, so it never copies
 * names. A per-table seed keeps a hostile file from choosing collisions. */
typedef struct tsr__names {
    const void *base; /* first item */
    size_t stride;    /* sizeof one item */
    size_t name_off;  /* offsetof the item's `char *` name */
} tsr__names;

typedef struct tsr__name_index {
    uint32_t *slots; /* item index + 1; 0 = empty */
    size_t cap;      /* power of two (0 before the first insert) */
    size_t count;
    uint64_t seed;
} tsr__name_index;

void tsr__name_index_free(tsr__name_index *ix);
/* Adds item i (its name read through names; i == count of items inserted
 * so far). Sets *dup to the index of an earlier item with the same name, or
 * -1 when i was inserted. TSR_E_NOMEM, TSR_E_RANGE (more than 2^31 items). */
tsr_status tsr__name_index_insert(tsr__name_index *ix, const tsr__names *names, size_t i, int64_t *dup);
/* Index of the item named name, or -1. */
int64_t tsr__name_index_find(const tsr__name_index *ix, const tsr__names *names, const char *name);

/* Writes a printable, quoted-safe copy of name (at most about 80 bytes) to
 * buf for error messages: control bytes become \xNN, long names end in "...". */
const char *tsr__gguf_printable(char *buf, size_t size, const char *name, size_t len);

#endif /* TSR_GGUF_H */
