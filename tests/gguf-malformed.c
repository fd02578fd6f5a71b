/*
 * gguf-malformed.c - generator and checker of malformed GGUF files. Each
 * case builds a file byte by byte that breaks one rule of the format (GGUF
 * v2/v3, little-endian: counts and lengths within the file, keys and tensor
 * names unique, 1..4 dimensions, known types, aligned offsets that do not
 * overlap), opens it from memory and from a file, and checks the status
 * and that the error names the file, the offset and what was expected. It
 * also truncates a small valid file at every byte and mutates every byte,
 * and accepts a few unusual but valid files (zero-sized tensors, v2, gaps).
 *   gguf-malformed            run the checks (make check)
 *   gguf-malformed -v         also print each case's error message
 *   gguf-malformed -w DIR     write every generated file into DIR (seeds
 *                             for the fuzz corpus), then run the checks
 */
#include "libtensr.h"
#include "tsrtest.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int verbose;
static const char *write_dir;
static char tmpdir[256];

/* ---- byte builder ------------------------------------------------------------- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    if (src) memcpy(b->p + b->n, src, n);
    else memset(b->p + b->n, 0, n);
    b->n += n;
}
static void u8(buf *b, uint8_t v) { put(b, &v, 1); }
static void u32(buf *b, uint32_t v) { for (int i = 0; i < 4; i++) u8(b, (uint8_t)(v >> 8 * i)); }
static void u64(buf *b, uint64_t v) { for (int i = 0; i < 8; i++) u8(b, (uint8_t)(v >> 8 * i)); }
static void str(buf *b, const char *s) { u64(b, strlen(s)); put(b, s, strlen(s)); }
static void hdr(buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    put(b, "GGUF", 4);
    u32(b, version);
    u64(b, n_tensors);
    u64(b, n_kv);
}
static void kv_u32(buf *b, const char *key, uint32_t v) { str(b, key); u32(b, 4); u32(b, v); }
static void kv_str(buf *b, const char *key, const char *v) { str(b, key); u32(b, 8); str(b, v); }
static void tinfo(buf *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off) {
    str(b, name);
    u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) u64(b, ne[d]);
    u32(b, type);
    u64(b, off);
}
static void pad(buf *b, size_t align) { put(b, NULL, (align - b->n % align) % align); }

/* A standard valid prefix: header with n_tensors tensors and 1 + extra keys. */
static void std_head(buf *b, uint64_t n_tensors, uint64_t extra_keys) {
    hdr(b, 3, n_tensors, 1 + extra_keys);
    kv_str(b, "general.architecture", "llama");
}

static const uint64_t NE32[1] = {32}, NE8[1] = {8};

/* ---- cases -------------------------------------------------------------------- */

typedef struct mcase {
    const char *name;
    void (*build)(buf *b);
    tsr_status status;     /* TSR_OK for valid files */
    const char *expect;    /* substring of the error */
} mcase;

#define CASE(fn) static void fn(buf *b)
CASE(c_empty) { (void)b; }
CASE(c_short) { put(b, "GGUF\3\0\0\0", 8); }
CASE(c_magic) { put(b, "GGML", 4); u32(b, 3); u64(b, 0); u64(b, 0); }
CASE(c_v1) { hdr(b, 1, 0, 0); }
CASE(c_v0) { hdr(b, 0, 0, 0); }
CASE(c_v4) { hdr(b, 4, 0, 0); }
CASE(c_bigendian) { hdr(b, 0x03000000u, 0, 0); }
CASE(c_nkv_huge) { hdr(b, 3, 0, UINT64_MAX); put(b, NULL, 100); }
CASE(c_nkv_big) { hdr(b, 3, 0, 1000); kv_u32(b, "a", 1); }
CASE(c_ntensors_big) { hdr(b, 3, (uint64_t)1 << 40, 0); put(b, NULL, 1000); }
CASE(c_ntensors_fit) { hdr(b, 3, 5, 0); put(b, NULL, 5 * 33 - 1); }
CASE(c_keylen_left) { hdr(b, 3, 0, 1); u64(b, 1000); put(b, "abc", 3); u32(b, 4); u32(b, 0); }
CASE(c_keylen_cap) { hdr(b, 3, 0, 1); u64(b, (uint64_t)1 << 20); put(b, NULL, 64); }
CASE(c_key_empty) { hdr(b, 3, 0, 1); kv_u32(b, "", 1); }
CASE(c_key_nul) { hdr(b, 3, 0, 1); u64(b, 3); put(b, "a\0b", 3); u32(b, 4); u32(b, 1); }
CASE(c_key_dup) { hdr(b, 3, 0, 3); kv_u32(b, "a.b", 1); kv_u32(b, "c", 2); kv_u32(b, "a.b", 3); }
CASE(c_vtype_13) { hdr(b, 3, 0, 1); str(b, "k"); u32(b, 13); u32(b, 0); }
CASE(c_vtype_huge) { hdr(b, 3, 0, 1); str(b, "k"); u32(b, 0xffffffffu); u32(b, 0); }
CASE(c_value_trunc) { hdr(b, 3, 0, 1); str(b, "k"); u32(b, 12); u32(b, 0); u8(b, 0); }
CASE(c_str_left) { hdr(b, 3, 0, 1); str(b, "k"); u32(b, 8); u64(b, 500); put(b, "short", 5); }
CASE(c_str_cap) { hdr(b, 3, 0, 1); str(b, "k"); u32(b, 8); u64(b, (uint64_t)1 << 40); put(b, NULL, 8); }
CASE(c_bool_2) { hdr(b, 3, 0, 1); str(b, "k"); u32(b, 7); u8(b, 2); }
CASE(c_arr_nested) { hdr(b, 3, 0, 1); str(b, "k"); u32(b, 9); u32(b, 9); u64(b, 1); put(b, NULL, 16); }
CASE(c_arr_etype) { hdr(b, 3, 0, 1); str(b, "k"); u32(b, 9); u32(b, 77); u64(b, 1); put(b, NULL, 8); }
CASE(c_arr_cap) { hdr(b, 3, 0, 1); str(b, "k"); u32(b, 9); u32(b, 0); u64(b, (uint64_t)1 << 40); put(b, NULL, 8); }
CASE(c_arr_left) { hdr(b, 3, 0, 1); str(b, "k"); u32(b, 9); u32(b, 10); u64(b, 100); put(b, NULL, 799); }
CASE(c_arr_str_left) { hdr(b, 3, 0, 1); str(b, "k"); u32(b, 9); u32(b, 8); u64(b, 1000); str(b, "x"); }
CASE(c_arr_str_elem) {
    hdr(b, 3, 0, 1); str(b, "tokenizer.ggml.tokens"); u32(b, 9); u32(b, 8); u64(b, 3);
    str(b, "a"); str(b, "b"); u64(b, 99); put(b, "c", 1);
}
CASE(c_arr_bool) { hdr(b, 3, 0, 1); str(b, "k"); u32(b, 9); u32(b, 7); u64(b, 3); u8(b, 1); u8(b, 0); u8(b, 7); }
CASE(c_align_type) { hdr(b, 3, 0, 1); str(b, "general.alignment"); u32(b, 5); u32(b, 32); }
CASE(c_align_str) { hdr(b, 3, 0, 1); kv_str(b, "general.alignment", "32"); }
CASE(c_align_zero) { hdr(b, 3, 0, 1); kv_u32(b, "general.alignment", 0); }
CASE(c_align_48) { hdr(b, 3, 0, 1); kv_u32(b, "general.alignment", 48); }
CASE(c_tname_empty) { std_head(b, 1, 0); tinfo(b, "", 1, NE32, 0, 0); pad(b, 32); put(b, NULL, 128); }
CASE(c_tname_long) {
    std_head(b, 1, 0);
    tinfo(b, "blk.0.a.name.that.is.sixty.four.bytes.long.which.is.one.too.many", 1, NE32, 0, 0);
    pad(b, 32); put(b, NULL, 128);
}
CASE(c_tname_nul) {
    std_head(b, 1, 0); u64(b, 3); put(b, "a\0b", 3); u32(b, 1); u64(b, 32); u32(b, 0); u64(b, 0);
    pad(b, 32); put(b, NULL, 128);
}
CASE(c_tname_dup) {
    std_head(b, 2, 0); tinfo(b, "w", 1, NE8, 0, 0); tinfo(b, "w", 1, NE8, 0, 32); pad(b, 32); put(b, NULL, 64);
}
CASE(c_ndims_0) { std_head(b, 1, 0); tinfo(b, "w", 0, NE8, 0, 0); pad(b, 32); put(b, NULL, 32); }
CASE(c_ndims_5) {
    static const uint64_t ne[5] = {1, 1, 1, 1, 1};
    std_head(b, 1, 0); tinfo(b, "w", 5, ne, 0, 0); pad(b, 32); put(b, NULL, 32);
}
CASE(c_ne_negative) {
    static const uint64_t ne[2] = {8, (uint64_t)1 << 63};
    std_head(b, 1, 0); tinfo(b, "w", 2, ne, 0, 0); pad(b, 32); put(b, NULL, 32);
}
CASE(c_type_4) { std_head(b, 1, 0); tinfo(b, "w", 1, NE32, 4, 0); pad(b, 32); put(b, NULL, 32); }
CASE(c_type_5) { std_head(b, 1, 0); tinfo(b, "w", 1, NE32, 5, 0); pad(b, 32); put(b, NULL, 32); }
CASE(c_type_31) { std_head(b, 1, 0); tinfo(b, "w", 1, NE32, 31, 0); pad(b, 32); put(b, NULL, 32); }
CASE(c_type_huge) { std_head(b, 1, 0); tinfo(b, "w", 1, NE32, 0xffffffffu, 0); pad(b, 32); put(b, NULL, 32); }
CASE(c_block) {
    static const uint64_t ne[2] = {33, 2};
    std_head(b, 1, 0); tinfo(b, "blk.0.ffn_up.weight", 2, ne, 2, 0); pad(b, 32); put(b, NULL, 64);
}
CASE(c_kblock) {
    static const uint64_t ne[2] = {128, 2};
    std_head(b, 1, 0); tinfo(b, "blk.0.ffn_down.weight", 2, ne, 12, 0); pad(b, 32); put(b, NULL, 288);
}
CASE(c_nelements_overflow) {
    static const uint64_t ne[3] = {(uint64_t)1 << 32, (uint64_t)1 << 32, 4};
    std_head(b, 1, 0); tinfo(b, "w", 3, ne, 24, 0); pad(b, 32); put(b, NULL, 32);
}
CASE(c_bytes_overflow) {
    static const uint64_t ne[1] = {(uint64_t)1 << 62};
    std_head(b, 1, 0); tinfo(b, "w", 1, ne, 0, 0); pad(b, 32); put(b, NULL, 32);
}
CASE(c_offset_align) { std_head(b, 1, 0); tinfo(b, "w", 1, NE8, 0, 16); pad(b, 32); put(b, NULL, 64); }
CASE(c_offset_align64) {
    std_head(b, 1, 1); kv_u32(b, "general.alignment", 64); tinfo(b, "w", 1, NE8, 0, 32); pad(b, 64);
    put(b, NULL, 128);
}
CASE(c_past_end) {
    static const uint64_t ne[2] = {4096, 4};
    std_head(b, 1, 0); tinfo(b, "blk.3.ffn_up.weight", 2, ne, 8, 0); pad(b, 32); put(b, NULL, 1000);
}
CASE(c_past_end2) {
    std_head(b, 2, 0); tinfo(b, "a", 1, NE8, 0, 0); tinfo(b, "b", 1, NE8, 0, 32); pad(b, 32); put(b, NULL, 40);
}
CASE(c_offset_overflow) {
    std_head(b, 1, 0); tinfo(b, "w", 1, NE8, 0, UINT64_MAX - 31); pad(b, 32); put(b, NULL, 32);
}
CASE(c_overlap) {
    static const uint64_t ne[1] = {16};
    std_head(b, 2, 0); tinfo(b, "a", 1, ne, 0, 0); tinfo(b, "b", 1, NE8, 0, 32); pad(b, 32); put(b, NULL, 96);
}
CASE(c_overlap_same) {
    std_head(b, 2, 0); tinfo(b, "a", 1, NE8, 0, 0); tinfo(b, "b", 1, NE8, 1, 0); pad(b, 32); put(b, NULL, 64);
}
CASE(c_zero_past_end) {
    static const uint64_t ne[2] = {8, 0};
    std_head(b, 1, 0); tinfo(b, "w", 2, ne, 0, 4096); pad(b, 32);
}
CASE(c_tinfo_trunc) { std_head(b, 1, 0); str(b, "w"); u32(b, 2); u64(b, 8); }
/* Valid unusual files. */
CASE(v_minimal) { hdr(b, 3, 0, 0); }
CASE(v_version2) { hdr(b, 2, 1, 1); kv_u32(b, "a", 1); tinfo(b, "w", 1, NE8, 0, 0); pad(b, 32); put(b, NULL, 32); }
CASE(v_zero_sized) {
    static const uint64_t ne0[2] = {0, 7}, ne1[3] = {256, 3, 0};
    std_head(b, 3, 0);
    tinfo(b, "z0", 2, ne0, 0, 0); tinfo(b, "z1", 3, ne1, 14, 0); tinfo(b, "w", 1, NE8, 0, 0);
    pad(b, 32); put(b, NULL, 32);
}
CASE(v_zero_only_nopad) { static const uint64_t ne[1] = {0}; std_head(b, 1, 0); tinfo(b, "z", 1, ne, 0, 0); }
CASE(v_gap) {
    std_head(b, 2, 0); tinfo(b, "b", 1, NE8, 0, 64); tinfo(b, "a", 1, NE8, 0, 0); pad(b, 32); put(b, NULL, 96);
}
CASE(v_align1) {
    std_head(b, 2, 1); kv_u32(b, "general.alignment", 1);
    tinfo(b, "a", 1, NE8, 24, 0); tinfo(b, "b", 1, NE8, 24, 8); put(b, NULL, 16);
}

static const mcase cases[] = {
    {"empty file", c_empty, TSR_E_MALFORMED, "too short for a GGUF header"},
    {"8-byte file", c_short, TSR_E_MALFORMED, "file is 8 bytes, too short"},
    {"bad magic", c_magic, TSR_E_MALFORMED, "expected magic 'GGUF', found 'GGML'"},
    {"version 1", c_v1, TSR_E_UNSUPPORTED, "expected version 2 or 3, found 1"},
    {"version 0", c_v0, TSR_E_UNSUPPORTED, "expected 2 or 3, found 0"},
    {"version 4", c_v4, TSR_E_UNSUPPORTED, "expected 2 or 3, found 4"},
    {"big-endian", c_bigendian, TSR_E_UNSUPPORTED, "big-endian"},
    {"n_kv = 2^64-1", c_nkv_huge, TSR_E_MALFORMED, "18446744073709551615 keys cannot fit"},
    {"n_kv too large", c_nkv_big, TSR_E_MALFORMED, "1000 keys cannot fit"},
    {"n_tensors 2^40", c_ntensors_big, TSR_E_MALFORMED, "1099511627776 tensors and 0 keys cannot fit"},
    {"n_tensors one byte short", c_ntensors_fit, TSR_E_MALFORMED, "5 tensors and 0 keys cannot fit in the 164 bytes left"},
    {"key length past end", c_keylen_left, TSR_E_MALFORMED, "the key name is 1000 bytes long but only"},
    {"key length over cap", c_keylen_cap, TSR_E_MALFORMED, "more than the limit of 65535"},
    {"empty key", c_key_empty, TSR_E_MALFORMED, "key #0 at offset 24: key name is empty"},
    {"key with NUL", c_key_nul, TSR_E_MALFORMED, "contains a NUL byte"},
    {"duplicate key", c_key_dup, TSR_E_MALFORMED, "key 'a.b' at offset 60: duplicate key (first defined as key #0)"},
    {"value type 13", c_vtype_13, TSR_E_MALFORMED, "key 'k' at offset 33: unknown value type: expected 0..12, found 13"},
    {"value type 2^32-1", c_vtype_huge, TSR_E_MALFORMED, "found 4294967295"},
    {"value truncated", c_value_trunc, TSR_E_MALFORMED, "short of the end of the value"},
    {"string past end", c_str_left, TSR_E_MALFORMED, "the string value is 500 bytes long but only 5 bytes are left"},
    {"string over cap", c_str_cap, TSR_E_MALFORMED, "more than the limit of 268435456"},
    {"bool value 2", c_bool_2, TSR_E_MALFORMED, "bool value: expected 0 or 1, found 2"},
    {"nested array", c_arr_nested, TSR_E_MALFORMED, "nested arrays are not supported"},
    {"array element type 77", c_arr_etype, TSR_E_MALFORMED, "unknown array element type: expected 0..12, found 77"},
    {"array over cap", c_arr_cap, TSR_E_MALFORMED, "longer than the limit of 1073741824"},
    {"array past end", c_arr_left, TSR_E_MALFORMED, "array of 100 UINT64 elements needs 800 bytes but only 799"},
    {"string array past end", c_arr_str_left, TSR_E_MALFORMED, "array of 1000 strings needs at least 8000 bytes"},
    {"string array element", c_arr_str_elem, TSR_E_MALFORMED, "key 'tokenizer.ggml.tokens' at offset 87: string element 2 is 99 bytes long but only 1 bytes are left"},
    {"bool array element 7", c_arr_bool, TSR_E_MALFORMED, "bool element 2: expected 0 or 1, found 7"},
    {"alignment INT32", c_align_type, TSR_E_MALFORMED, "key 'general.alignment' at offset 49: expected type UINT32, found INT32"},
    {"alignment STRING", c_align_str, TSR_E_MALFORMED, "expected type UINT32, found STRING"},
    {"alignment 0", c_align_zero, TSR_E_MALFORMED, "alignment must be a power of two, found 0"},
    {"alignment 48", c_align_48, TSR_E_MALFORMED, "alignment must be a power of two, found 48"},
    {"empty tensor name", c_tname_empty, TSR_E_MALFORMED, "tensor #0 at offset 69: tensor name is empty"},
    {"tensor name 64 bytes", c_tname_long, TSR_E_MALFORMED, "is 64 bytes, longer than the limit of 63"},
    {"tensor name with NUL", c_tname_nul, TSR_E_MALFORMED, "tensor name 'a\\x00b' contains a NUL byte"},
    {"duplicate tensor", c_tname_dup, TSR_E_MALFORMED, "tensor 'w' at offset 102: duplicate tensor name (first defined as tensor #0)"},
    {"n_dims 0", c_ndims_0, TSR_E_MALFORMED, "tensor 'w' at offset 78: n_dims: expected 1 to 4, found 0"},
    {"n_dims 5", c_ndims_5, TSR_E_MALFORMED, "n_dims: expected 1 to 4, found 5"},
    {"negative dim", c_ne_negative, TSR_E_MALFORMED, "ne[1]: expected 0 to 9223372036854775807, found 9223372036854775808"},
    {"type 4 (Q4_2)", c_type_4, TSR_E_UNSUPPORTED, "tensor type 4 (Q4_2) was removed"},
    {"type 5 (Q4_3)", c_type_5, TSR_E_UNSUPPORTED, "tensor type 5 (Q4_3) was removed"},
    {"type 31", c_type_31, TSR_E_UNSUPPORTED, "unknown tensor type: expected a type number below 31, found 31"},
    {"type 2^32-1", c_type_huge, TSR_E_UNSUPPORTED, "found 4294967295"},
    {"ne[0] not a multiple of 32", c_block, TSR_E_MALFORMED, "tensor 'blk.0.ffn_up.weight' at offset 116: ne[0] = 33 is not a multiple of the block size 32 of type q4_0"},
    {"ne[0] not a multiple of 256", c_kblock, TSR_E_MALFORMED, "ne[0] = 128 is not a multiple of the block size 256 of type q4_K"},
    {"element count overflow", c_nelements_overflow, TSR_E_MALFORMED, "overflows"},
    {"byte size overflow", c_bytes_overflow, TSR_E_MALFORMED, "size of a f32 tensor of 4611686018427387904 x 1 x 1 x 1 elements overflows"},
    {"offset not aligned", c_offset_align, TSR_E_MALFORMED, "data offset 16 is not a multiple of the alignment 32"},
    {"offset not aligned to 64", c_offset_align64, TSR_E_MALFORMED, "data offset 32 is not a multiple of the alignment 64"},
    {"data past end", c_past_end, TSR_E_MALFORMED, "tensor 'blk.3.ffn_up.weight' at offset 128: data extends past end of file (17408 bytes up to offset 17536; file is 1128 bytes)"},
    {"second tensor past end", c_past_end2, TSR_E_MALFORMED, "tensor 'b' at offset 192: data extends past end of file (32 bytes up to offset 224; file is 200 bytes)"},
    {"offset overflow", c_offset_overflow, TSR_E_MALFORMED, "overflows"},
    {"overlapping tensors", c_overlap, TSR_E_MALFORMED, "tensor 'b' at offset 192: data (offsets 32..64 of the data section) overlaps tensor 'a' (offsets 0..64)"},
    {"tensors at the same offset", c_overlap_same, TSR_E_MALFORMED, "overlaps tensor 'a'"},
    {"zero-sized tensor past end", c_zero_past_end, TSR_E_MALFORMED, "data extends past end of file"},
    {"tensor info truncated", c_tinfo_trunc, TSR_E_MALFORMED, "short of the end of ne[1]"},
    {"valid: minimal", v_minimal, TSR_OK, NULL},
    {"valid: version 2", v_version2, TSR_OK, NULL},
    {"valid: zero-sized tensors", v_zero_sized, TSR_OK, NULL},
    {"valid: only a zero-sized tensor, no padding", v_zero_only_nopad, TSR_OK, NULL},
    {"valid: tensors out of order with a gap", v_gap, TSR_OK, NULL},
    {"valid: alignment 1", v_align1, TSR_OK, NULL},
};

/* ---- checking ------------------------------------------------------------------ */

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
}

/* Opens (memory and file), checks the outcome, returns the status. */
static tsr_status open_both(const char *label, const void *p, size_t n, tsr_status want, const char *expect,
                            int quiet) {
    char path[512];
    snprintf(path, sizeof path, "%s/case.gguf", tmpdir);
    write_file(path, p, n);
    tsr_status got[2];
    for (int via_file = 0; via_file < 2; via_file++) {
        tsr_gguf *g = NULL;
        tsr_clear_error();
        got[via_file] = via_file ? tsr_gguf_open(path, &g) : tsr_gguf_open_memory(p, n, "case.gguf", 1, &g);
        const char *err = tsr_last_error();
        int bad = got[via_file] != want || (want == TSR_OK) != (g != NULL);
        if (want != TSR_OK) {
            bad |= strstr(err, "case.gguf") == NULL || strstr(err, " at offset ") == NULL;
            if (expect) bad |= strstr(err, expect) == NULL;
        }
        CHECK(!bad, "%s (%s): status %d (want %d), error: %s\n  expected to contain: %s", label,
              via_file ? "file" : "memory", got[via_file], want, err, expect ? expect : "(any)");
        if (!bad && verbose && !quiet && via_file == 0) {
            printf("%-44s %-18s %s\n", label, tsr_status_string(got[0]), want == TSR_OK ? "(opens)" : err);
        }
        tsr_gguf_close(g);
    }
    return got[0];
}

static void run_cases(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        buf b = {0};
        cases[i].build(&b);
        if (write_dir) {
            char path[512];
            snprintf(path, sizeof path, "%s/malformed-%02zu", write_dir, i);
            write_file(path, b.p, b.n);
        }
        open_both(cases[i].name, b.p, b.n, cases[i].status, cases[i].expect, 0);
        free(b.p);
    }
}

/* A small valid file whose last tensor ends exactly at the end of the file. */
static void small_valid(buf *b) {
    static const uint64_t ne2[2] = {32, 2};
    hdr(b, 3, 3, 5);
    kv_str(b, "general.architecture", "llama");
    kv_u32(b, "llama.block_count", 1);
    str(b, "tokenizer.ggml.tokens"); u32(b, 9); u32(b, 8); u64(b, 3); str(b, "<s>"); str(b, "a"); str(b, "");
    str(b, "tokenizer.ggml.scores"); u32(b, 9); u32(b, 6); u64(b, 3); put(b, NULL, 12);
    str(b, "tokenizer.ggml.add_bos_token"); u32(b, 7); u8(b, 1);
    tinfo(b, "token_embd.weight", 2, ne2, 8, 0);
    tinfo(b, "output_norm.weight", 1, NE8, 0, 96);
    tinfo(b, "blk.0.attn_q.weight", 1, NE32, 1, 128);
    pad(b, 32);
    for (int i = 0; i < 192; i++) u8(b, (uint8_t)(i * 13));
}

static void run_truncations(void) {
    buf b = {0};
    small_valid(&b);
    if (write_dir) {
        char path[512];
        snprintf(path, sizeof path, "%s/valid-small", write_dir);
        write_file(path, b.p, b.n);
    }
    open_both("small valid file", b.p, b.n, TSR_OK, NULL, 0);
    int first = 1;
    for (size_t len = 0; len < b.n; len++) {
        char label[64];
        snprintf(label, sizeof label, "truncated to %zu of %zu bytes", len, b.n);
        open_both(label, b.p, len, TSR_E_MALFORMED, NULL, !(first || len == b.n - 1 || len % 97 == 0));
        first = 0;
    }
    /* Every byte changed to a few values: must open or fail cleanly. */
    size_t opened = 0, failed = 0;
    static const uint8_t vals[] = {0x00, 0x01, 0x7f, 0x80, 0xff};
    for (size_t i = 0; i < b.n; i++)
        for (size_t v = 0; v < sizeof vals; v++) {
            uint8_t old = b.p[i];
            if (old == vals[v]) continue;
            b.p[i] = vals[v];
            tsr_gguf *g = NULL;
            tsr_clear_error();
            tsr_status st = tsr_gguf_open_memory(b.p, b.n, "mut.gguf", 1, &g);
            if (st == TSR_OK) {
                opened++;
                for (int64_t t = 0; t < tsr_gguf_n_tensors(g); t++) {
                    static uint8_t dst[4096];
                    if (tsr_gguf_tensor_size(g, t) <= sizeof dst)
                        CHECK(tsr_gguf_read_tensor(g, t, dst, sizeof dst) == TSR_OK, "mutation %zu=%02x: read_tensor",
                              i, vals[v]);
                }
            } else {
                const int named = strstr(tsr_last_error(), "mut.gguf") != NULL;
                CHECK(named, "mutation %zu=%02x: the error does not name the file", i, vals[v]);
                failed += named;
            }
            tsr_gguf_close(g);
            b.p[i] = old;
        }
    if (verbose) printf("mutations: %zu opened, %zu rejected cleanly\n", opened, failed);
    free(b.p);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-v")) verbose = 1;
        else if (!strcmp(argv[i], "-w") && i + 1 < argc) write_dir = argv[++i];
        else {
            fprintf(stderr, "usage: %s [-v] [-w DIR]\n", argv[0]);
            return 2;
        }
    }
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmpdir, sizeof tmpdir, "%s/gguf-malformed-XXXXXX", base);
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    run_cases();
    run_truncations();
    char path[600];
    snprintf(path, sizeof path, "%s/case.gguf", tmpdir);
    unlink(path);
    rmdir(tmpdir);
    printf("gguf-malformed: %zu cases, then truncations and mutations of a valid file\n",
           sizeof cases / sizeof cases[0]);
    return tsrtest_done("gguf-malformed");
}
