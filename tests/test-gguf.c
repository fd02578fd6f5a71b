/*
 * test-gguf.c - GGUF writer/reader round trips: every value type (scalars at
 * their extremes, strings, arrays of every element type, empty arrays),
 * tensors of every type at several alignments (zero-sized ones included),
 * bit-exact re-serialization, the typed getters' conversions and errors,
 * writer argument checks, I/O errors with the OS's text, and every
 * allocation failing in turn (no leak, TSR_E_NOMEM). Links the static
 * library for the allocation hook.
 */
#include "internal.h"
#include "tsrtest.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

static void path_in_tmp(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", tmpdir, name); }

static uint64_t rng_state = 0x12345678abcdefull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* ---- value round trips ---------------------------------------------------- */

static const char *const str_arr[] = {"", "hello", "ünïcödé ✓", "a longer string with spaces\tand\ttabs",
                                      "[INST]", "<|im_start|>"};

static void add_all_values(tsr_gguf_writer *w) {
    uint8_t u8 = 255; int8_t i8 = -128; uint16_t u16 = 65535; int16_t i16 = -32768;
    uint32_t u32 = 4294967295u; int32_t i32 = INT32_MIN; float f32 = -1.5e-38f;
    uint8_t b1 = 1, b0 = 0; uint64_t u64 = UINT64_MAX; int64_t i64 = INT64_MIN; double f64 = DBL_MAX;
    uint32_t small = 7; int64_t neg = -3; double third = 1.0 / 3.0; float nanv = NAN;
    CHECK_OK(tsr_gguf_writer_set(w, "t.u8", TSR_GGUF_UINT8, &u8));
    CHECK_OK(tsr_gguf_writer_set(w, "t.i8", TSR_GGUF_INT8, &i8));
    CHECK_OK(tsr_gguf_writer_set(w, "t.u16", TSR_GGUF_UINT16, &u16));
    CHECK_OK(tsr_gguf_writer_set(w, "t.i16", TSR_GGUF_INT16, &i16));
    CHECK_OK(tsr_gguf_writer_set(w, "t.u32", TSR_GGUF_UINT32, &u32));
    CHECK_OK(tsr_gguf_writer_set(w, "t.i32", TSR_GGUF_INT32, &i32));
    CHECK_OK(tsr_gguf_writer_set(w, "t.f32", TSR_GGUF_FLOAT32, &f32));
    CHECK_OK(tsr_gguf_writer_set(w, "t.nan", TSR_GGUF_FLOAT32, &nanv));
    CHECK_OK(tsr_gguf_writer_set(w, "t.true", TSR_GGUF_BOOL, &b1));
    CHECK_OK(tsr_gguf_writer_set(w, "t.false", TSR_GGUF_BOOL, &b0));
    CHECK_OK(tsr_gguf_writer_set(w, "t.u64", TSR_GGUF_UINT64, &u64));
    CHECK_OK(tsr_gguf_writer_set(w, "t.i64", TSR_GGUF_INT64, &i64));
    CHECK_OK(tsr_gguf_writer_set(w, "t.f64", TSR_GGUF_FLOAT64, &f64));
    CHECK_OK(tsr_gguf_writer_set(w, "t.small", TSR_GGUF_UINT32, &small));
    CHECK_OK(tsr_gguf_writer_set(w, "t.neg", TSR_GGUF_INT64, &neg));
    CHECK_OK(tsr_gguf_writer_set(w, "t.third", TSR_GGUF_FLOAT64, &third));
    CHECK_OK(tsr_gguf_writer_set_str(w, "t.str", "general purpose ✓"));
    CHECK_OK(tsr_gguf_writer_set(w, "t.str2", TSR_GGUF_STRING, "via set"));
    CHECK_OK(tsr_gguf_writer_set_str(w, "t.empty", ""));
    CHECK_OK(tsr_gguf_writer_set_arr_str(w, "t.astr", str_arr, 6));
    CHECK_OK(tsr_gguf_writer_set_arr_str(w, "t.astr0", NULL, 0));
    /* One array of every numeric element type, with distinct bytes. */
    static const tsr_gguf_type num[] = {TSR_GGUF_UINT8, TSR_GGUF_INT8, TSR_GGUF_UINT16, TSR_GGUF_INT16,
                                        TSR_GGUF_UINT32, TSR_GGUF_INT32, TSR_GGUF_FLOAT32, TSR_GGUF_BOOL,
                                        TSR_GGUF_UINT64, TSR_GGUF_INT64, TSR_GGUF_FLOAT64};
    for (size_t t = 0; t < sizeof num / sizeof num[0]; t++) {
        uint8_t data[8 * 37];
        size_t es = tsr__gguf_type_size(num[t]);
        for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 7 + t);
        if (num[t] == TSR_GGUF_BOOL)
            for (size_t i = 0; i < sizeof data; i++) data[i] &= 1;
        char key[32];
        snprintf(key, sizeof key, "a.%s", tsr__gguf_type_name(num[t]));
        CHECK_OK(tsr_gguf_writer_set_arr(w, key, num[t], data, 37));
        snprintf(key, sizeof key, "a0.%s", tsr__gguf_type_name(num[t]));
        CHECK_OK(tsr_gguf_writer_set_arr(w, key, num[t], NULL, 0));
        (void)es;
    }
}

static void check_all_values(const tsr_gguf *g) {
    uint32_t u32; int32_t i32; uint64_t u64; int64_t i64; float f; double d; int b;
    const char *s; size_t len;
    CHECK_OK(tsr_gguf_get_u32(g, "t.u8", &u32)); CHECK(u32 == 255);
    CHECK_OK(tsr_gguf_get_i32(g, "t.i8", &i32)); CHECK(i32 == -128);
    CHECK_OK(tsr_gguf_get_u32(g, "t.u16", &u32)); CHECK(u32 == 65535);
    CHECK_OK(tsr_gguf_get_i64(g, "t.i16", &i64)); CHECK(i64 == -32768);
    CHECK_OK(tsr_gguf_get_u32(g, "t.u32", &u32)); CHECK(u32 == 4294967295u);
    CHECK_OK(tsr_gguf_get_i32(g, "t.i32", &i32)); CHECK(i32 == INT32_MIN);
    CHECK_OK(tsr_gguf_get_f32(g, "t.f32", &f)); CHECK(f == -1.5e-38f);
    CHECK_OK(tsr_gguf_get_f32(g, "t.nan", &f)); CHECK(isnan(f));
    CHECK_OK(tsr_gguf_get_bool(g, "t.true", &b)); CHECK(b == 1);
    CHECK_OK(tsr_gguf_get_bool(g, "t.false", &b)); CHECK(b == 0);
    CHECK_OK(tsr_gguf_get_u64(g, "t.u64", &u64)); CHECK(u64 == UINT64_MAX);
    CHECK_OK(tsr_gguf_get_i64(g, "t.i64", &i64)); CHECK(i64 == INT64_MIN);
    CHECK_OK(tsr_gguf_get_f64(g, "t.f64", &d)); CHECK(d == DBL_MAX);
    CHECK_OK(tsr_gguf_get_f64(g, "t.third", &d)); CHECK(d == 1.0 / 3.0);
    CHECK_OK(tsr_gguf_get_f32(g, "t.third", &f)); CHECK(f == (float)(1.0 / 3.0));
    CHECK_OK(tsr_gguf_get_f64(g, "t.f32", &d)); CHECK(d == (double)-1.5e-38f);
    /* Integer getters accept any integer type whose value fits. */
    CHECK_OK(tsr_gguf_get_u64(g, "t.small", &u64)); CHECK(u64 == 7);
    CHECK_OK(tsr_gguf_get_i32(g, "t.small", &i32)); CHECK(i32 == 7);
    CHECK_OK(tsr_gguf_get_i32(g, "t.neg", &i32)); CHECK(i32 == -3);
    CHECK(tsr_gguf_get_u32(g, "t.neg", &u32) == TSR_E_TYPE);
    CHECK(strstr(tsr_last_error(), "t.neg") && strstr(tsr_last_error(), "-3"));
    CHECK(tsr_gguf_get_u64(g, "t.i8", &u64) == TSR_E_TYPE);
    CHECK(tsr_gguf_get_i32(g, "t.u32", &i32) == TSR_E_TYPE);
    CHECK(tsr_gguf_get_i64(g, "t.u64", &i64) == TSR_E_TYPE);
    CHECK(tsr_gguf_get_u32(g, "t.u64", &u32) == TSR_E_TYPE);
    CHECK(tsr_gguf_get_u32(g, "t.f32", &u32) == TSR_E_TYPE);
    CHECK(strstr(tsr_last_error(), "FLOAT32"));
    CHECK(tsr_gguf_get_f32(g, "t.u32", &f) == TSR_E_TYPE);
    CHECK(tsr_gguf_get_bool(g, "t.u8", &b) == TSR_E_TYPE);
    CHECK(tsr_gguf_get_str(g, "t.u8", &s, &len) == TSR_E_TYPE);
    CHECK(tsr_gguf_get_u32(g, "t.missing", &u32) == TSR_E_NOT_FOUND);
    CHECK(strstr(tsr_last_error(), "t.missing") != NULL);
    CHECK(tsr_gguf_get_u32(g, "t.u8", NULL) == TSR_E_INVALID);
    CHECK_OK(tsr_gguf_get_str(g, "t.str", &s, &len));
    CHECK(strcmp(s, "general purpose ✓") == 0 && len == strlen(s));
    CHECK_OK(tsr_gguf_get_str(g, "t.str2", &s, NULL)); CHECK(strcmp(s, "via set") == 0);
    CHECK_OK(tsr_gguf_get_str(g, "t.empty", &s, &len)); CHECK(len == 0 && s[0] == 0);
}

static void check_all_arrays(const tsr_gguf *g) {
    tsr_gguf_type et;
    uint64_t n;
    const char *s;
    size_t len;
    const void *data;
    CHECK_OK(tsr_gguf_get_arr_info(g, "t.astr", &et, &n));
    CHECK(et == TSR_GGUF_STRING && n == 6);
    for (uint64_t i = 0; i < 6; i++) {
        CHECK_OK(tsr_gguf_get_arr_str(g, "t.astr", i, &s, &len));
        CHECK(strcmp(s, str_arr[i]) == 0 && len == strlen(str_arr[i]));
    }
    CHECK(tsr_gguf_get_arr_str(g, "t.astr", 6, &s, &len) == TSR_E_RANGE);
    CHECK(tsr_gguf_get_arr_data(g, "t.astr", &data) == TSR_E_TYPE);
    CHECK_OK(tsr_gguf_get_arr_info(g, "t.astr0", &et, &n)); CHECK(et == TSR_GGUF_STRING && n == 0);
    CHECK(tsr_gguf_get_arr_info(g, "t.u8", &et, &n) == TSR_E_TYPE);
    for (int t = 0; t <= TSR_GGUF_FLOAT64; t++) {
        if (t == TSR_GGUF_STRING || t == TSR_GGUF_ARRAY) continue;
        char key[32];
        snprintf(key, sizeof key, "a.%s", tsr__gguf_type_name((tsr_gguf_type)t));
        CHECK_OK(tsr_gguf_get_arr_info(g, key, &et, &n));
        CHECK(et == (tsr_gguf_type)t && n == 37);
        CHECK_OK(tsr_gguf_get_arr_data(g, key, &data));
        const uint8_t *p = data;
        int ok = 1;
        for (size_t i = 0; i < 37 * tsr__gguf_type_size((tsr_gguf_type)t); i++) {
            uint8_t want = (uint8_t)(i * 7 + (t < 8 ? t : t - 2));
            if (t == TSR_GGUF_BOOL) want &= 1;
            ok &= p[i] == want;
        }
        CHECK(ok);
        CHECK(tsr_gguf_get_arr_str(g, key, 0, &s, &len) == TSR_E_TYPE);
        snprintf(key, sizeof key, "a0.%s", tsr__gguf_type_name((tsr_gguf_type)t));
        CHECK_OK(tsr_gguf_get_arr_info(g, key, &et, &n)); CHECK(et == (tsr_gguf_type)t && n == 0);
        CHECK_OK(tsr_gguf_get_arr_data(g, key, &data));
    }
}

static void check_raw(const tsr_gguf *g) {
    const void *data;
    size_t size;
    int64_t i = tsr_gguf_find_key(g, "t.i16");
    CHECK(i >= 0 && tsr_gguf_key_type(g, i) == TSR_GGUF_INT16);
    CHECK_OK(tsr_gguf_get_raw(g, i, &data, &size));
    CHECK(size == 2 && ((const uint8_t *)data)[0] == 0x00 && ((const uint8_t *)data)[1] == 0x80);
    i = tsr_gguf_find_key(g, "t.str");
    CHECK_OK(tsr_gguf_get_raw(g, i, &data, &size));
    CHECK(size == strlen("general purpose ✓") && memcmp(data, "general purpose", 15) == 0);
    CHECK(tsr_gguf_get_raw(g, tsr_gguf_find_key(g, "t.astr"), &data, &size) == TSR_E_TYPE);
    CHECK(tsr_gguf_get_raw(g, tsr_gguf_n_keys(g), &data, &size) == TSR_E_RANGE);
    CHECK(tsr_gguf_key_name(g, -1) == NULL && tsr_gguf_key_type(g, 99999) == (tsr_gguf_type)-1);
    CHECK(tsr_gguf_find_key(g, "nope") == -1);
    for (int64_t k = 0; k < tsr_gguf_n_keys(g); k++) CHECK(tsr_gguf_find_key(g, tsr_gguf_key_name(g, k)) == k);
}

/* Copies every key and tensor of g into a new writer and returns its image. */
static void reserialize(const tsr_gguf *g, void **img, size_t *size) {
    tsr_gguf_writer *w;
    CHECK_OK(tsr_gguf_writer_new(&w));
    if (tsr_gguf_alignment(g) != TSR_GGUF_DEFAULT_ALIGNMENT || tsr_gguf_find_key(g, "general.alignment") >= 0)
        CHECK_OK(tsr_gguf_writer_set_alignment(w, tsr_gguf_alignment(g)));
    CHECK_OK(tsr_gguf_writer_copy_keys(w, g));
    for (int64_t i = 0; i < tsr_gguf_n_tensors(g); i++) {
        size_t sz = tsr_gguf_tensor_size(g, i);
        void *buf = malloc(sz ? sz : 1);
        CHECK_OK(tsr_gguf_read_tensor(g, i, buf, sz));
        int64_t ne[4];
        for (int d = 0; d < 4; d++) ne[d] = tsr_gguf_tensor_ne(g, i, d);
        CHECK_OK(tsr_gguf_writer_add_tensor(w, tsr_gguf_tensor_name(g, i), tsr_gguf_tensor_type(g, i),
                                            tsr_gguf_tensor_n_dims(g, i), ne, buf));
        free(buf);
    }
    CHECK_OK(tsr_gguf_writer_write_memory(w, img, size));
    tsr_gguf_writer_free(w);
}

static void test_values(void) {
    tsr_gguf_writer *w;
    CHECK_OK(tsr_gguf_writer_new(&w));
    add_all_values(w);
    /* Setting a key again replaces the value in place. */
    uint32_t v = 1;
    CHECK_OK(tsr_gguf_writer_set(w, "t.small", TSR_GGUF_UINT32, &v));
    v = 7;
    CHECK_OK(tsr_gguf_writer_set(w, "t.small", TSR_GGUF_UINT32, &v));
    void *img;
    size_t size;
    CHECK_OK(tsr_gguf_writer_write_memory(w, &img, &size));
    char path[512];
    path_in_tmp(path, sizeof path, "values.gguf");
    CHECK_OK(tsr_gguf_writer_write_file(w, path));
    tsr_gguf_writer_free(w);

    tsr_gguf *gm, *gf;
    CHECK_OK(tsr_gguf_open_memory(img, size, "values.gguf", 0, &gm));
    CHECK_OK(tsr_gguf_open(path, &gf));
    tsr_gguf *gs[2] = {gm, gf};
    for (int k = 0; k < 2; k++) {
        if (!gs[k]) continue;
        CHECK(tsr_gguf_version(gs[k]) == 3 && tsr_gguf_n_tensors(gs[k]) == 0);
        CHECK(tsr_gguf_n_keys(gs[k]) == 21 + 22);
        CHECK(strcmp(tsr_gguf_key_name(gs[k], 0), "t.u8") == 0);
        check_all_values(gs[k]);
        check_all_arrays(gs[k]);
        check_raw(gs[k]);
        void *img2;
        size_t size2;
        reserialize(gs[k], &img2, &size2);
        CHECK(size2 == size && memcmp(img, img2, size) == 0);
        tsr_free(img2);
    }
    CHECK(gf && strcmp(tsr_gguf_path(gf), path) == 0);
    /* The file and the memory image are the same bytes. */
    FILE *fp = fopen(path, "rb");
    char *fbuf = malloc(size + 1);
    CHECK(fp && fread(fbuf, 1, size + 1, fp) == size && memcmp(fbuf, img, size) == 0);
    if (fp) fclose(fp);
    free(fbuf);
    tsr_gguf_close(gm);
    tsr_gguf_close(gf);
    tsr_free(img);
}

/* ---- tensors --------------------------------------------------------------- */

typedef struct tspec {
    const char *name;
    tsr_type type;
    int n_dims;
    int64_t ne[4];
} tspec;

static void test_tensors_at(size_t alignment, int via_file) {
    static const tspec specs[] = {
        {"token_embd.weight", TSR_TYPE_Q4_0, 2, {64, 3}},
        {"scalar", TSR_TYPE_F32, 1, {1}},
        {"empty0", TSR_TYPE_F32, 2, {0, 5}},
        {"odd.f16", TSR_TYPE_F16, 3, {3, 5, 7}},
        {"bf16.4d", TSR_TYPE_BF16, 4, {2, 3, 1, 5}},
        {"q4_1", TSR_TYPE_Q4_1, 1, {96}},
        {"q5_0", TSR_TYPE_Q5_0, 2, {32, 3}},
        {"q5_1", TSR_TYPE_Q5_1, 2, {32, 1}},
        {"q8_0", TSR_TYPE_Q8_0, 2, {64, 3}},
        {"q4_K", TSR_TYPE_Q4_K, 2, {256, 2}},
        {"q5_K", TSR_TYPE_Q5_K, 1, {512}},
        {"q6_K", TSR_TYPE_Q6_K, 2, {256, 3}},
        {"empty.q6_K", TSR_TYPE_Q6_K, 2, {256, 0}},
        {"i8", TSR_TYPE_I8, 1, {13}},
        {"i16", TSR_TYPE_I16, 1, {9}},
        {"i32", TSR_TYPE_I32, 2, {5, 2}},
        {"i64", TSR_TYPE_I64, 1, {3}},
        {"f64", TSR_TYPE_F64, 1, {2}},
        {"blk.0.attn_q.weight.name.that.is.exactly.63.bytes.long.xxxxxxxx", TSR_TYPE_F32, 1, {4}},
    };
    size_t n = sizeof specs / sizeof specs[0];
    CHECK(strlen(specs[n - 1].name) == 63);
    tsr_gguf_writer *w;
    CHECK_OK(tsr_gguf_writer_new(&w));
    if (alignment) CHECK_OK(tsr_gguf_writer_set_alignment(w, alignment));
    CHECK_OK(tsr_gguf_writer_set_str(w, "general.architecture", "llama"));
    uint8_t *datas[32];
    size_t sizes[32];
    for (size_t i = 0; i < n; i++) {
        CHECK(tsr__gguf_tensor_bytes(specs[i].type, specs[i].n_dims, specs[i].ne, &sizes[i]));
        datas[i] = malloc(sizes[i] + 1);
        for (size_t b = 0; b < sizes[i]; b++) datas[i][b] = (uint8_t)rnd();
        CHECK_OK(tsr_gguf_writer_add_tensor(w, specs[i].name, specs[i].type, specs[i].n_dims, specs[i].ne,
                                            datas[i]));
    }
    /* A tensor without data is zero-filled. */
    int64_t zne[1] = {40};
    CHECK_OK(tsr_gguf_writer_add_tensor(w, "zeros", TSR_TYPE_F32, 1, zne, NULL));
    void *img;
    size_t size;
    CHECK_OK(tsr_gguf_writer_write_memory(w, &img, &size));
    char path[512];
    path_in_tmp(path, sizeof path, "tensors.gguf");
    if (via_file) CHECK_OK(tsr_gguf_writer_write_file(w, path));
    tsr_gguf_writer_free(w);

    tsr_gguf *g = NULL;
    if (via_file) CHECK_OK(tsr_gguf_open(path, &g));
    else CHECK_OK(tsr_gguf_open_memory(img, size, "tensors", 1, &g));
    if (!g) goto out;
    size_t align = alignment ? alignment : 32;
    CHECK(tsr_gguf_alignment(g) == align);
    CHECK(tsr_gguf_data_offset(g) % align == 0);
    CHECK(tsr_gguf_n_tensors(g) == (int64_t)n + 1);
    for (size_t i = 0; i < n; i++) {
        int64_t k = tsr_gguf_find_tensor(g, specs[i].name);
        CHECK(k == (int64_t)i);
        CHECK(strcmp(tsr_gguf_tensor_name(g, k), specs[i].name) == 0);
        CHECK(tsr_gguf_tensor_type(g, k) == specs[i].type);
        CHECK(tsr_gguf_tensor_n_dims(g, k) == specs[i].n_dims);
        for (int d = 0; d < 4; d++)
            CHECK(tsr_gguf_tensor_ne(g, k, d) == (d < specs[i].n_dims ? specs[i].ne[d] : 1));
        CHECK(tsr_gguf_tensor_size(g, k) == sizes[i]);
        CHECK(tsr_gguf_tensor_offset(g, k) % align == 0);
        uint8_t *buf = malloc(sizes[i] + 8);
        CHECK_OK(tsr_gguf_read_tensor(g, k, buf, sizes[i] + 8));
        CHECK(memcmp(buf, datas[i], sizes[i]) == 0);
        if (sizes[i]) CHECK(tsr_gguf_read_tensor(g, k, buf, sizes[i] - 1) == TSR_E_RANGE);
        free(buf);
    }
    float z[40];
    memset(z, 0xff, sizeof z);
    CHECK_OK(tsr_gguf_read_tensor(g, (int64_t)n, z, sizeof z));
    CHECK(z[0] == 0 && z[39] == 0);
    CHECK(tsr_gguf_find_tensor(g, "nope") == -1 && tsr_gguf_tensor_name(g, -1) == NULL);
    CHECK(tsr_gguf_tensor_ne(g, 0, 4) == 1 && tsr_gguf_tensor_ne(g, 99, 0) == -1);
    CHECK(tsr_gguf_read_tensor(g, 99, z, sizeof z) == TSR_E_RANGE);
    void *img2;
    size_t size2;
    reserialize(g, &img2, &size2);
    CHECK(size2 == size && memcmp(img2, img, size) == 0);
    tsr_free(img2);
    tsr_gguf_close(g);
out:
    for (size_t i = 0; i < n; i++) free(datas[i]);
    tsr_free(img);
}

static void test_tensors(void) {
    static const size_t aligns[] = {0, 1, 8, 32, 64, 4096};
    for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
        test_tensors_at(aligns[a], 0);
        test_tensors_at(aligns[a], 1);
    }
}

/* ---- writer argument checks ------------------------------------------------- */

static void test_writer_errors(void) {
    tsr_gguf_writer *w;
    CHECK_OK(tsr_gguf_writer_new(&w));
    int64_t ne[4] = {32, 2, 1, 1}, bad[4] = {33, 1, 1, 1}, negne[2] = {4, -1};
    uint8_t two = 2;
    uint32_t three = 3;
    int32_t i = 64;
    char longname[80];
    memset(longname, 'x', 64);
    longname[64] = 0;
    CHECK_OK(tsr_gguf_writer_add_tensor(w, "a", TSR_TYPE_Q8_0, 2, ne, NULL));
    CHECK(tsr_gguf_writer_add_tensor(w, "a", TSR_TYPE_F32, 1, ne, NULL) == TSR_E_INVALID);
    CHECK(strstr(tsr_last_error(), "duplicate"));
    CHECK(tsr_gguf_writer_add_tensor(w, "", TSR_TYPE_F32, 1, ne, NULL) == TSR_E_INVALID);
    CHECK(tsr_gguf_writer_add_tensor(w, longname, TSR_TYPE_F32, 1, ne, NULL) == TSR_E_INVALID);
    CHECK(tsr_gguf_writer_add_tensor(w, "b", TSR_TYPE_F32, 0, ne, NULL) == TSR_E_INVALID);
    CHECK(tsr_gguf_writer_add_tensor(w, "b", TSR_TYPE_F32, 5, ne, NULL) == TSR_E_INVALID);
    CHECK(tsr_gguf_writer_add_tensor(w, "b", (tsr_type)4, 1, ne, NULL) == TSR_E_INVALID);
    CHECK(tsr_gguf_writer_add_tensor(w, "b", (tsr_type)99, 1, ne, NULL) == TSR_E_INVALID);
    CHECK(tsr_gguf_writer_add_tensor(w, "b", TSR_TYPE_Q4_0, 1, bad, NULL) == TSR_E_INVALID);
    CHECK(strstr(tsr_last_error(), "multiple"));
    CHECK(tsr_gguf_writer_add_tensor(w, "b", TSR_TYPE_F32, 2, negne, NULL) == TSR_E_INVALID);
    CHECK(tsr_gguf_writer_set(w, "k", TSR_GGUF_BOOL, &two) == TSR_E_INVALID);
    CHECK(tsr_gguf_writer_set(w, "k", TSR_GGUF_ARRAY, &two) == TSR_E_INVALID);
    CHECK(tsr_gguf_writer_set(w, "k", (tsr_gguf_type)13, &two) == TSR_E_INVALID);
    CHECK(tsr_gguf_writer_set(w, "", TSR_GGUF_UINT8, &two) == TSR_E_INVALID);
    CHECK(tsr_gguf_writer_set(w, NULL, TSR_GGUF_UINT8, &two) == TSR_E_INVALID);
    CHECK(tsr_gguf_writer_set_arr(w, "k", TSR_GGUF_ARRAY, &two, 1) == TSR_E_INVALID);
    CHECK(strstr(tsr_last_error(), "nested"));
    CHECK(tsr_gguf_writer_set_arr(w, "k", TSR_GGUF_BOOL, &two, 1) == TSR_E_INVALID);
    CHECK(tsr_gguf_writer_set_alignment(w, 24) == TSR_E_INVALID);
    CHECK(tsr_gguf_writer_set_alignment(w, 0) == TSR_E_INVALID);
    CHECK(tsr_gguf_writer_set(w, "general.alignment", TSR_GGUF_UINT32, &three) == TSR_E_INVALID);
    CHECK(tsr_gguf_writer_set(w, "general.alignment", TSR_GGUF_INT32, &i) == TSR_E_INVALID);
    CHECK(tsr_gguf_writer_write_file(w, "/nonexistent-dir/x.gguf") == TSR_E_IO);
    CHECK(strstr(tsr_last_error(), "No such file or directory"));
    CHECK(tsr_gguf_writer_new(NULL) == TSR_E_INVALID);
    tsr_gguf_writer_free(w);
    tsr_gguf_writer_free(NULL);
    tsr_gguf_close(NULL);
}

/* ---- I/O errors --------------------------------------------------------------- */

static void test_io_errors(void) {
    tsr_gguf *g = (tsr_gguf *)1;
    char path[512];
    path_in_tmp(path, sizeof path, "does-not-exist.gguf");
    CHECK(tsr_gguf_open(path, &g) == TSR_E_IO && g == NULL);
    CHECK(strstr(tsr_last_error(), path) && strstr(tsr_last_error(), strerror(ENOENT)));
    CHECK(tsr_gguf_open(tmpdir, &g) == TSR_E_IO);
    CHECK(strstr(tsr_last_error(), "not a regular file"));
    CHECK(tsr_gguf_open(NULL, &g) == TSR_E_INVALID);
    CHECK(tsr_gguf_open_memory(NULL, 4, NULL, 0, &g) == TSR_E_INVALID);
    CHECK(tsr_gguf_open_memory("", 0, NULL, 0, &g) == TSR_E_MALFORMED);
    CHECK(strstr(tsr_last_error(), "<memory>") && strstr(tsr_last_error(), "too short"));
    /* Writing over an existing file replaces it atomically; a failed write
     * leaves no temporary file behind. */
    tsr_gguf_writer *w;
    CHECK_OK(tsr_gguf_writer_new(&w));
    path_in_tmp(path, sizeof path, "replace.gguf");
    FILE *fp = fopen(path, "w");
    if (fp) {
        fputs("old contents", fp);
        fclose(fp);
    }
    CHECK_OK(tsr_gguf_writer_write_file(w, path));
    CHECK_OK(tsr_gguf_open(path, &g));
    tsr_gguf_close(g);
    if (access("/dev/full", W_OK) == 0) {
        int64_t ne[1] = {1 << 20};
        CHECK_OK(tsr_gguf_writer_add_tensor(w, "big", TSR_TYPE_F32, 1, ne, NULL));
        CHECK(tsr_gguf_writer_write_file(w, "/dev/full") == TSR_E_IO);
    }
    tsr_gguf_writer_free(w);
}

/* ---- allocation failures ------------------------------------------------------ */

static void test_alloc_failures(void) {
    tsr_gguf_writer *w;
    CHECK_OK(tsr_gguf_writer_new(&w));
    add_all_values(w);
    int64_t ne[2] = {64, 2};
    CHECK_OK(tsr_gguf_writer_add_tensor(w, "t0", TSR_TYPE_Q8_0, 2, ne, NULL));
    CHECK_OK(tsr_gguf_writer_add_tensor(w, "t1", TSR_TYPE_F16, 2, ne, NULL));
    void *img;
    size_t size;
    CHECK_OK(tsr_gguf_writer_write_memory(w, &img, &size));
    char path[512];
    path_in_tmp(path, sizeof path, "alloc.gguf");
    CHECK_OK(tsr_gguf_writer_write_file(w, path));
    tsr_gguf_writer_free(w);
    /* Fail allocation k for every k until the open succeeds. */
    for (int via_file = 0; via_file < 2; via_file++) {
        int ok = 0;
        for (int64_t k = 0; k < 100000 && !ok; k++) {
            tsr_gguf *g = NULL;
            tsr__fail_alloc_after(k);
            tsr_status st = via_file ? tsr_gguf_open(path, &g) : tsr_gguf_open_memory(img, size, "m", 0, &g);
            tsr__fail_alloc_after(-1);
            if (st == TSR_OK) {
                ok = 1;
                tsr_gguf_close(g);
            } else {
                CHECK(st == TSR_E_NOMEM && g == NULL);
            }
        }
        CHECK(ok);
    }
    tsr_free(img);
}

/* Allocation failures inside the writer's setters: each must fail cleanly. */
static void test_writer_alloc_failures(void) {
    for (int64_t k = 0; k < 200; k++) {
        tsr_gguf_writer *w;
        if (tsr_gguf_writer_new(&w)) continue;
        tsr__fail_alloc_after(k);
        static const char *const strs[] = {"a", "bb"};
        int64_t ne[1] = {32};
        uint32_t v = 64;
        tsr_status s1 = tsr_gguf_writer_set(w, "a", TSR_GGUF_UINT32, &v);
        tsr_status s2 = tsr_gguf_writer_set_arr_str(w, "b", strs, 2);
        tsr_status s3 = tsr_gguf_writer_add_tensor(w, "t", TSR_TYPE_F32, 1, ne, NULL);
        tsr_status s4 = tsr_gguf_writer_set_alignment(w, 64);
        void *img = NULL;
        size_t size;
        tsr_status s5 = tsr_gguf_writer_write_memory(w, &img, &size);
        tsr__fail_alloc_after(-1);
        CHECK((s1 == TSR_OK || s1 == TSR_E_NOMEM) && (s2 == TSR_OK || s2 == TSR_E_NOMEM) &&
              (s3 == TSR_OK || s3 == TSR_E_NOMEM) && (s4 == TSR_OK || s4 == TSR_E_NOMEM) &&
              (s5 == TSR_OK || s5 == TSR_E_NOMEM));
        if (s5 == TSR_OK) {
            tsr_gguf *g;
            CHECK_OK(tsr_gguf_open_memory(img, size, "w", 1, &g));
            CHECK(tsr_gguf_n_keys(g) == (s1 == TSR_OK) + (s2 == TSR_OK) + (s4 == TSR_OK));
            tsr_gguf_close(g);
        }
        tsr_free(img);
        tsr_gguf_writer_free(w);
    }
}

int main(void) {
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmpdir, sizeof tmpdir, "%s/test-gguf-XXXXXX", base);
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_values();
    test_tensors();
    test_writer_errors();
    test_io_errors();
    test_alloc_failures();
    test_writer_alloc_failures();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return tsrtest_done("test-gguf");
}
