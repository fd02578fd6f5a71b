/*
 * gguf-dump.c - test helper: prints what libtensr's GGUF reader sees in a
 * file as JSON (keys with types and values, tensor infos with a checksum of
 * their data), so tests/test-gguf-python.py can compare it with what the
 * `gguf` Python package (llama.cpp's own reader) reports. With
 * `--write-sample OUT` it instead writes a file with libtensr's writer for
 * the Python side to read.
 *   gguf-dump FILE.gguf
 *   gguf-dump --write-sample OUT.gguf
 */
#include "libtensr.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void json_str(const char *s, size_t len) {
    putchar('"');
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static void json_double(double d) {
    if (isnan(d)) printf("\"nan\"");
    else if (isinf(d)) printf(d > 0 ? "\"inf\"" : "\"-inf\"");
    else printf("%.17g", d);
}

/* One scalar of type t at p (little-endian, as in the file). */
static void json_scalar(tsr_gguf_type t, const void *p) {
    switch (t) {
    case TSR_GGUF_UINT8: printf("%u", *(const uint8_t *)p); break;
    case TSR_GGUF_INT8: printf("%d", *(const int8_t *)p); break;
    case TSR_GGUF_BOOL: printf(*(const uint8_t *)p ? "true" : "false"); break;
    case TSR_GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); printf("%u", v); } break;
    case TSR_GGUF_INT16: { int16_t v; memcpy(&v, p, 2); printf("%d", v); } break;
    case TSR_GGUF_UINT32: { uint32_t v; memcpy(&v, p, 4); printf("%" PRIu32, v); } break;
    case TSR_GGUF_INT32: { int32_t v; memcpy(&v, p, 4); printf("%" PRId32, v); } break;
    case TSR_GGUF_UINT64: { uint64_t v; memcpy(&v, p, 8); printf("%" PRIu64, v); } break;
    case TSR_GGUF_INT64: { int64_t v; memcpy(&v, p, 8); printf("%" PRId64, v); } break;
    case TSR_GGUF_FLOAT32: { float v; memcpy(&v, p, 4); json_double(v); } break;
    case TSR_GGUF_FLOAT64: { double v; memcpy(&v, p, 8); json_double(v); } break;
    default: printf("null");
    }
}

static size_t elem_size(tsr_gguf_type t) {
    static const size_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return (unsigned)t < 13 ? sizes[t] : 0;
}

static int dump_key(const tsr_gguf *g, int64_t i) {
    const char *key = tsr_gguf_key_name(g, i);
    tsr_gguf_type t = tsr_gguf_key_type(g, i);
    printf("{\"name\": ");
    json_str(key, strlen(key));
    printf(", \"type\": %d, ", (int)t);
    if (t != TSR_GGUF_ARRAY) {
        const void *raw;
        size_t size;
        if (tsr_gguf_get_raw(g, i, &raw, &size)) return 1;
        printf("\"value\": ");
        if (t == TSR_GGUF_STRING) json_str(raw, size);
        else json_scalar(t, raw);
        printf("}");
        return 0;
    }
    tsr_gguf_type et;
    uint64_t n;
    if (tsr_gguf_get_arr_info(g, key, &et, &n)) return 1;
    printf("\"elem_type\": %d, \"n\": %" PRIu64 ", \"value\": [", (int)et, n);
    const void *data = NULL;
    if (et != TSR_GGUF_STRING && tsr_gguf_get_arr_data(g, key, &data)) return 1;
    for (uint64_t k = 0; k < n; k++) {
        if (k) printf(", ");
        if (et == TSR_GGUF_STRING) {
            const char *s;
            size_t len;
            if (tsr_gguf_get_arr_str(g, key, k, &s, &len)) return 1;
            json_str(s, len);
        } else {
            json_scalar(et, (const uint8_t *)data + k * elem_size(et));
        }
    }
    printf("]}");
    return 0;
}

/* sum of byte[i] * (i + 1), modulo 2^64: cheap, and position-sensitive. */
static uint64_t checksum(const uint8_t *p, size_t n) {
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) s += (uint64_t)p[i] * (uint64_t)(i + 1);
    return s;
}

static int dump_tensor(const tsr_gguf *g, int64_t i) {
    size_t size = tsr_gguf_tensor_size(g, i);
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf || tsr_gguf_read_tensor(g, i, buf, size)) {
        free(buf);
        return 1;
    }
    const char *name = tsr_gguf_tensor_name(g, i);
    printf("{\"name\": ");
    json_str(name, strlen(name));
    printf(", \"type\": %d, \"ne\": [", (int)tsr_gguf_tensor_type(g, i));
    for (int d = 0; d < tsr_gguf_tensor_n_dims(g, i); d++) printf("%s%" PRId64, d ? ", " : "", tsr_gguf_tensor_ne(g, i, d));
    printf("], \"offset\": %" PRIu64 ", \"size\": %zu, \"checksum\": %" PRIu64 "}", tsr_gguf_tensor_offset(g, i),
           size, checksum(buf, size));
    free(buf);
    return 0;
}

static int dump(const char *path) {
    tsr_gguf *g;
    if (tsr_gguf_open(path, &g)) {
        fprintf(stderr, "gguf-dump: %s\n", tsr_last_error());
        return 1;
    }
    printf("{\"version\": %" PRIu32 ", \"alignment\": %zu, \"data_offset\": %" PRIu64 ",\n \"keys\": [\n",
           tsr_gguf_version(g), tsr_gguf_alignment(g), tsr_gguf_data_offset(g));
    int rc = 0;
    for (int64_t i = 0; i < tsr_gguf_n_keys(g) && !rc; i++) {
        printf(i ? ",\n  " : "  ");
        rc = dump_key(g, i);
    }
    printf("],\n \"tensors\": [\n");
    for (int64_t i = 0; i < tsr_gguf_n_tensors(g) && !rc; i++) {
        printf(i ? ",\n  " : "  ");
        rc = dump_tensor(g, i);
    }
    printf("]}\n");
    if (rc) fprintf(stderr, "gguf-dump: %s\n", tsr_last_error());
    tsr_gguf_close(g);
    return rc;
}

#define TRY(e)                                                          \
    do {                                                                \
        if ((e) != TSR_OK) {                                            \
            fprintf(stderr, "gguf-dump: %s: %s\n", #e, tsr_last_error()); \
            goto out;                                                   \
        }                                                               \
    } while (0)

/* A file with every value type and a tensor of several types. */
static int write_sample(const char *path) {
    tsr_gguf_writer *w = NULL;
    int rc = 1;
    uint8_t u8 = 250, bt = 1;
    int8_t i8 = -100;
    uint16_t u16 = 65000;
    int16_t i16 = -32000;
    uint32_t u32 = 3000000000u;
    int32_t i32 = -2000000000;
    float f32 = 3.25f;
    uint64_t u64 = 18000000000000000000ull;
    int64_t i64 = -9000000000000000000ll;
    double f64 = -2.5e300;
    static const char *const strs[] = {"<unk>", "<s>", "</s>", "héllo", ""};
    static const int32_t ia[] = {1, -2, 3, -4};
    static const float fa[] = {0.5f, -1.25f, 1e-20f};
    TRY(tsr_gguf_writer_new(&w));
    TRY(tsr_gguf_writer_set_alignment(w, 64));
    TRY(tsr_gguf_writer_set_str(w, "general.architecture", "llama"));
    TRY(tsr_gguf_writer_set(w, "s.u8", TSR_GGUF_UINT8, &u8));
    TRY(tsr_gguf_writer_set(w, "s.i8", TSR_GGUF_INT8, &i8));
    TRY(tsr_gguf_writer_set(w, "s.u16", TSR_GGUF_UINT16, &u16));
    TRY(tsr_gguf_writer_set(w, "s.i16", TSR_GGUF_INT16, &i16));
    TRY(tsr_gguf_writer_set(w, "s.u32", TSR_GGUF_UINT32, &u32));
    TRY(tsr_gguf_writer_set(w, "s.i32", TSR_GGUF_INT32, &i32));
    TRY(tsr_gguf_writer_set(w, "s.f32", TSR_GGUF_FLOAT32, &f32));
    TRY(tsr_gguf_writer_set(w, "s.bool", TSR_GGUF_BOOL, &bt));
    TRY(tsr_gguf_writer_set(w, "s.u64", TSR_GGUF_UINT64, &u64));
    TRY(tsr_gguf_writer_set(w, "s.i64", TSR_GGUF_INT64, &i64));
    TRY(tsr_gguf_writer_set(w, "s.f64", TSR_GGUF_FLOAT64, &f64));
    TRY(tsr_gguf_writer_set_str(w, "s.str", "a \"quoted\"\nline"));
    TRY(tsr_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, 5));
    TRY(tsr_gguf_writer_set_arr(w, "a.i32", TSR_GGUF_INT32, ia, 4));
    TRY(tsr_gguf_writer_set_arr(w, "a.f32", TSR_GGUF_FLOAT32, fa, 3));
    TRY(tsr_gguf_writer_set_arr(w, "a.empty", TSR_GGUF_UINT8, NULL, 0));
    static const struct { const char *name; tsr_type type; int n_dims; int64_t ne[4]; } ts[] = {
        {"f32", TSR_TYPE_F32, 2, {5, 3}}, {"f16", TSR_TYPE_F16, 1, {7}}, {"bf16", TSR_TYPE_BF16, 3, {2, 2, 3}},
        {"q8_0", TSR_TYPE_Q8_0, 2, {64, 2}}, {"q4_0", TSR_TYPE_Q4_0, 1, {32}}, {"q4_K", TSR_TYPE_Q4_K, 2, {256, 2}},
        {"q6_K", TSR_TYPE_Q6_K, 1, {256}}, {"i32", TSR_TYPE_I32, 4, {1, 2, 3, 1}}};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        size_t size = tsr_row_size(ts[i].type, ts[i].ne[0]);
        for (int d = 1; d < ts[i].n_dims; d++) size *= (size_t)ts[i].ne[d];
        uint8_t *data = malloc(size);
        if (!data) goto out;
        for (size_t b = 0; b < size; b++) data[b] = (uint8_t)(b * 31 + i);
        if (ts[i].type == TSR_TYPE_F32 || ts[i].type == TSR_TYPE_F16 || ts[i].type == TSR_TYPE_BF16)
            memset(data, 0x3c, size); /* finite values for the float types */
        tsr_status st = tsr_gguf_writer_add_tensor(w, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne, data);
        free(data);
        TRY(st);
    }
    TRY(tsr_gguf_writer_write_file(w, path));
    rc = 0;
out:
    tsr_gguf_writer_free(w);
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-sample") == 0) return write_sample(argv[2]);
    if (argc != 2) {
        fprintf(stderr, "usage: gguf-dump FILE.gguf | gguf-dump --write-sample OUT.gguf\n");
        return 2;
    }
    return dump(argv[1]);
}
