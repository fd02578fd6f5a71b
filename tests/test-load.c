/*
 * test-load.c - tsr_backend_load_gguf: small GGUF files written with the
 * writer are loaded with 1 and several I/O threads, with and without mmap,
 * at several alignments, and every byte of every weight is compared with
 * what was written. Then the failure paths: cancel from the progress
 * callback at every call, truncated files, a file that shrinks or is
 * replaced while loading, paths that are no files, NaN/Inf found by verify,
 * plan_only, invalid arguments, and every allocation failing in turn; after
 * each failure the backend must hold nothing and load again cleanly. Fake
 * GPU devices (TSR_FAKE_DEVICES) take the staged path, copies of shared
 * weights and a device that is too small.
 * (test-load-model.c loads the real SmolLM2 model.)
 */
#include "libtensr.h"
#include "internal.h"
#include "tsrtest.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_T 16 /* tensors of the test model */

typedef struct model {
    int n;
    char name[MAX_T][64];
    tsr_type type[MAX_T];
    int n_dims[MAX_T];
    int64_t ne[MAX_T][4];
    uint8_t *data[MAX_T];
    size_t size[MAX_T];
} model;

static char g_dir[] = "/tmp/tsr-test-load-XXXXXX";

static void path_in_dir(char *out, size_t n, const char *file) { snprintf(out, n, "%s/%s", g_dir, file); }

/* Valid data of any type: floats in [-1, 1) converted or quantized. */
static uint8_t *make_data(tsr_type type, int64_t nel, size_t *size, uint64_t seed) {
    int64_t bs = tsr_type_block_size(type);
    *size = (size_t)(nel / bs) * tsr_type_block_bytes(type);
    float *f = malloc((size_t)(nel ? nel : 1) * sizeof *f);
    uint8_t *d = malloc(*size ? *size : 1);
    tsrtest_fill(f, (size_t)nel, seed);
    for (int64_t i = 0; i < nel; i++) {
        if (type == TSR_TYPE_F32)
            memcpy(d + 4 * i, &f[i], 4);
        else if (type == TSR_TYPE_F16 || type == TSR_TYPE_BF16) {
            uint16_t h = type == TSR_TYPE_F16 ? tsr_fp32_to_fp16(f[i]) : tsr_fp32_to_bf16(f[i]);
            memcpy(d + 2 * i, &h, 2);
        }
    }
    if (tsr_type_is_quantized(type) && nel)
        CHECK_OK(tsr_quantize(type, f, d, nel));
    free(f);
    return d;
}

static void add(model *m, const char *name, tsr_type type, int n_dims, int64_t a, int64_t b, int64_t c) {
    int i = m->n++;
    snprintf(m->name[i], sizeof m->name[i], "%s", name);
    m->type[i] = type;
    m->n_dims[i] = n_dims;
    int64_t ne[4] = {a, b, c, 1};
    memcpy(m->ne[i], ne, sizeof ne);
    m->data[i] = make_data(type, a * b * c, &m->size[i], (uint64_t)i + 7);
}

/* A model of every kind of tensor: odd shapes, one empty tensor, tiny ones,
 * quantized ones, and one of 20 MiB that spans several read chunks. */
static void make_model(model *m) {
    memset(m, 0, sizeof *m);
    add(m, "token_embd.weight", TSR_TYPE_Q8_0, 2, 64, 37, 1);
    add(m, "blk.0.attn_norm.weight", TSR_TYPE_F32, 1, 7, 1, 1);
    add(m, "blk.0.attn_q.weight", TSR_TYPE_F16, 2, 33, 5, 1);
    add(m, "blk.0.attn_k.weight", TSR_TYPE_BF16, 3, 3, 2, 5);
    add(m, "blk.0.ffn_up.weight", TSR_TYPE_Q4_1, 2, 96, 3, 1);
    add(m, "blk.0.empty", TSR_TYPE_F32, 2, 0, 4, 1);
    add(m, "blk.1.ffn_down.weight", TSR_TYPE_Q4_K, 2, 256, 3, 1);
    add(m, "blk.1.ffn_gate.weight", TSR_TYPE_Q6_K, 2, 512, 1, 1);
    add(m, "blk.1.one", TSR_TYPE_F32, 1, 1, 1, 1);
    add(m, "blk.1.big.weight", TSR_TYPE_F32, 2, 1024, 5 * 1024 + 3, 1);
    add(m, "blk.1.ffn_x.weight", TSR_TYPE_Q4_0, 2, 32, 9, 1);
    add(m, "output.weight", TSR_TYPE_Q5_1, 2, 64, 11, 1);
    add(m, "rope_freqs.weight", TSR_TYPE_F32, 1, 16, 1, 1); /* shared: last (check_copies) */
}

static void free_model(model *m) {
    for (int i = 0; i < m->n; i++)
        free(m->data[i]);
}

static tsr_status write_model(const model *m, const char *path, size_t alignment) {
    tsr_gguf_writer *w = NULL;
    tsr_status s = tsr_gguf_writer_new(&w);
    if (s == TSR_OK && alignment)
        s = tsr_gguf_writer_set_alignment(w, alignment);
    if (s == TSR_OK)
        s = tsr_gguf_writer_set_str(w, "general.architecture", "llama");
    for (int i = 0; i < m->n && s == TSR_OK; i++)
        s = tsr_gguf_writer_add_tensor(w, m->name[i], m->type[i], m->n_dims[i], m->ne[i], m->data[i]);
    if (s == TSR_OK)
        s = tsr_gguf_writer_write_file(w, path);
    tsr_gguf_writer_free(w);
    return s;
}

static tsr_backend *new_backend(void) {
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = 1;
    tsr_backend *b = NULL;
    CHECK_OK(tsr_backend_new(&bp, &b));
    return b;
}

static tsr_load_params params(int n_io_threads, int use_mmap) {
    tsr_load_params p;
    tsr_load_params_init(&p, sizeof p);
    p.n_io_threads = n_io_threads;
    p.use_mmap = use_mmap;
    return p;
}

/* Every weight present with the right type, shape and bytes. */
static int compare_weights(tsr_backend *b, const model *m) {
    int bad = 0;
    if (tsr_backend_n_weights(b) != (size_t)m->n) {
        fprintf(stderr, "expected %d weights, have %zu\n", m->n, tsr_backend_n_weights(b));
        return 1;
    }
    for (int i = 0; i < m->n; i++) {
        tsr_tensor *t = tsr_backend_weight(b, m->name[i]);
        if (!t || tsr_tensor_type(t) != m->type[i] || tsr_tensor_nbytes(t) != m->size[i]) {
            fprintf(stderr, "weight %s: missing or wrong type/size\n", m->name[i]);
            bad++;
            continue;
        }
        for (int d = 0; d < 4; d++)
            bad += tsr_tensor_ne(t, d) != m->ne[i][d];
        uint8_t *got = malloc(m->size[i] ? m->size[i] : 1);
        tsr_status s = tsr_tensor_read(t, got, 0, m->size[i]);
        if (s != TSR_OK || memcmp(got, m->data[i], m->size[i]) != 0) {
            fprintf(stderr, "weight %s: data differs (%s)\n", m->name[i], tsr_status_string(s));
            bad++;
        }
        free(got);
    }
    return bad;
}

/* ---- loading at several alignments, thread counts, with mmap ------------- */

static int count_mapped(tsr_backend *b) {
    int n = 0;
    for (size_t i = 0; i < tsr_backend_n_weights(b); i++) {
        const tsr_buffer_type *bt = tsr_tensor_buffer_type(tsr_backend_weight_at(b, i));
        n += bt && strcmp(tsr_buffer_type_name(bt), "CPU_Mapped") == 0;
    }
    return n;
}

static void test_loads(const model *m) {
    const size_t aligns[] = {0, 1, 64, 256 << 10};
    const int threads[] = {1, 2, 3, 0, 8};
    char path[256];
    path_in_dir(path, sizeof path, "m.gguf");
    for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
        CHECK_OK(write_model(m, path, aligns[a]));
        for (int mm = 0; mm < 2; mm++)
            for (size_t k = 0; k < sizeof threads / sizeof threads[0]; k++) {
                tsr_backend *b = new_backend();
                tsr_load_params p = params(threads[k], mm);
                tsr_status s = tsr_backend_load_gguf(b, path, &p);
                CHECK_OK(s);
                int bad = s == TSR_OK ? compare_weights(b, m) : 1;
                if (bad)
                    fprintf(stderr, "  (alignment %zu, threads %d, mmap %d)\n", aligns[a], threads[k], mm);
                CHECK(bad == 0);
                /* mapped: every non-empty tensor when aligned to 32; none without mmap */
                int mapped = count_mapped(b);
                CHECK(mm ? (aligns[a] == 1 || mapped == m->n - 1) : mapped == 0);
                tsr_backend_free(b);
            }
    }
}

/* A write to a mapped weight changes memory only (copy-on-write). */
static void test_mmap_write(const model *m) {
    char path[256];
    path_in_dir(path, sizeof path, "m.gguf");
    CHECK_OK(write_model(m, path, 0));
    tsr_backend *b = new_backend();
    tsr_load_params p = params(2, 1);
    CHECK_OK(tsr_backend_load_gguf(b, path, &p));
    tsr_tensor *t = tsr_backend_weight(b, "blk.0.attn_norm.weight");
    float x[7] = {1, 2, 3, 4, 5, 6, 7}, y[7];
    CHECK(t && strcmp(tsr_buffer_type_name(tsr_tensor_buffer_type(t)), "CPU_Mapped") == 0);
    CHECK_OK(tsr_tensor_write(t, x, 0, sizeof x));
    CHECK_OK(tsr_tensor_read(t, y, 0, sizeof y));
    CHECK(memcmp(x, y, sizeof x) == 0);
    tsr_backend_free(b);
    tsr_gguf *g = NULL;
    CHECK_OK(tsr_gguf_open(path, &g));
    if (g) {
        CHECK_OK(tsr_gguf_read_tensor(g, tsr_gguf_find_tensor(g, "blk.0.attn_norm.weight"), y, sizeof y));
        CHECK(memcmp(y, m->data[1], sizeof y) == 0);
        tsr_gguf_close(g);
    }
}

/* ---- progress and cancel -------------------------------------------------- */

typedef struct prog {
    int calls, cancel_at, monotonic;
    uint64_t last, total;
    int first_zero, last_full;
    const char *path, *swap_with;
    int action; /* 0 none, 1 truncate the file at the first call, 2 replace it */
    uint64_t truncate_to;
} prog;

static int on_progress(uint64_t done, uint64_t total, void *user) {
    prog *pr = user;
    if (pr->calls == 0) {
        pr->first_zero = done == 0;
        pr->total = total;
        if (pr->action == 1 && truncate(pr->path, (off_t)pr->truncate_to) != 0)
            perror("truncate");
        if (pr->action == 2 && rename(pr->swap_with, pr->path) != 0)
            perror("rename");
    }
    pr->monotonic &= done >= pr->last && total == pr->total && done <= total;
    pr->last = done;
    pr->last_full = done == total;
    /* cancel at call cancel_at or, when this run reports less often, at
     * the last call (done == total), which always comes */
    int k = pr->calls++;
    return pr->cancel_at >= 0 && (k >= pr->cancel_at || done == total);
}

static void test_progress_cancel(const model *m) {
    char path[256];
    path_in_dir(path, sizeof path, "m.gguf");
    CHECK_OK(write_model(m, path, 0));
    uint64_t want_total = 0;
    for (int i = 0; i < m->n; i++)
        want_total += m->size[i];
    for (int mm = 0; mm < 2; mm++) {
        /* a full run counts the calls */
        prog pr = {.cancel_at = -1, .monotonic = 1};
        tsr_backend *b = new_backend();
        tsr_load_params p = params(3, mm);
        p.progress = on_progress;
        p.progress_user = &pr;
        CHECK_OK(tsr_backend_load_gguf(b, path, &p));
        CHECK(pr.calls >= 2 && pr.first_zero && pr.last_full && pr.monotonic);
        CHECK(pr.total == (mm ? 0 : want_total));
        tsr_backend_free(b);
        /* cancel at every call, the last one included */
        int n_calls = pr.calls;
        b = new_backend();
        for (int k = 0; k < n_calls; k++) {
            prog pc = {.cancel_at = k, .monotonic = 1};
            p.progress_user = &pc;
            CHECK_STATUS(tsr_backend_load_gguf(b, path, &p), TSR_E_CANCELLED);
            CHECK(strstr(tsr_last_error(), path) != NULL);
            CHECK(tsr_backend_n_weights(b) == 0);
            size_t w = 1;
            CHECK_OK(tsr_backend_memory_plan(b, tsr_backend_n_devices(b) - 1, &w, NULL, NULL));
            CHECK(w == 0);
        }
        p.progress = NULL;
        CHECK_OK(tsr_backend_load_gguf(b, path, &p)); /* the same backend loads cleanly afterwards */
        CHECK(compare_weights(b, m) == 0);
        tsr_backend_free(b);
    }
}

/* ---- files that fail ------------------------------------------------------ */

static void expect_fail(const char *path, tsr_load_params *p, tsr_status want, const char *needle) {
    tsr_backend *b = new_backend();
    CHECK_STATUS(tsr_backend_load_gguf(b, path, p), want);
    const char *e = tsr_last_error();
    if (!strstr(e, path) || (needle && !strstr(e, needle))) {
        fprintf(stderr, "error '%s' should name '%s' and say '%s'\n", e, path, needle ? needle : "");
        CHECK(0);
    }
    CHECK(tsr_backend_n_weights(b) == 0);
    tsr_backend_free(b);
}

static off_t file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? sb.st_size : -1;
}

static void test_bad_files(const model *m) {
    char path[256], other[256], fifo[256];
    path_in_dir(path, sizeof path, "bad.gguf");
    path_in_dir(other, sizeof other, "other.gguf");
    path_in_dir(fifo, sizeof fifo, "fifo.gguf");
    tsr_load_params p = params(4, 0);
    /* truncated data section: rejected before anything is allocated */
    CHECK_OK(write_model(m, path, 0));
    off_t full = file_size(path), data_end = 0;
    tsr_gguf *g = NULL;
    CHECK_OK(tsr_gguf_open(path, &g));
    for (int64_t i = 0; g && i < tsr_gguf_n_tensors(g); i++) {
        off_t e = (off_t)(tsr_gguf_data_offset(g) + tsr_gguf_tensor_offset(g, i) + tsr_gguf_tensor_size(g, i));
        data_end = e > data_end ? e : data_end;
    }
    tsr_gguf_close(g);
    CHECK(data_end > 0 && data_end <= full);
    CHECK(truncate(path, data_end - 1) == 0);
    expect_fail(path, &p, TSR_E_MALFORMED, "past end of file");
    CHECK(truncate(path, full / 2) == 0);
    expect_fail(path, &p, TSR_E_MALFORMED, NULL);
    /* the file shrinks once the load started: a read fails, naming the tensor */
    for (int nt = 1; nt <= 4; nt += 3) { /* (mmap is not tested here: a mapped file that shrinks faults) */
        CHECK_OK(write_model(m, path, 0));
        g = NULL;
        CHECK_OK(tsr_gguf_open(path, &g));
        int64_t big = tsr_gguf_find_tensor(g, "blk.1.big.weight");
        prog pr = {.cancel_at = -1, .monotonic = 1, .path = path, .action = 1,
                   .truncate_to = tsr_gguf_data_offset(g) + tsr_gguf_tensor_offset(g, big) + 4096};
        tsr_gguf_close(g);
        p.progress = on_progress;
        p.progress_user = &pr;
        p.n_io_threads = nt;
        expect_fail(path, &p, TSR_E_IO, "blk.1.big.weight");
        CHECK(strstr(tsr_last_error(), "ended early") != NULL);
    }
    /* the file is replaced by another once the load started */
    CHECK_OK(write_model(m, path, 0));
    CHECK_OK(write_model(m, other, 0));
    prog pr = {.cancel_at = -1, .monotonic = 1, .path = path, .action = 2, .swap_with = other};
    p.progress_user = &pr;
    p.n_io_threads = 2;
    expect_fail(path, &p, TSR_E_IO, "replaced");
    p.progress = NULL;
    /* not files */
    expect_fail(g_dir, &p, TSR_E_IO, NULL);
    CHECK(mkfifo(fifo, 0600) == 0);
    expect_fail(fifo, &p, TSR_E_IO, NULL);
    unlink(fifo);
    expect_fail(other, &p, TSR_E_IO, "No such file");
}

/* ---- verify ---------------------------------------------------------------- */

static void poison(model *m, int i, size_t byte_off, uint16_t h16, uint32_t f32, int is32) {
    if (is32)
        memcpy(m->data[i] + byte_off, &f32, 4);
    else
        memcpy(m->data[i] + byte_off, &h16, 2);
}

static void verify_case(const model *m, const char *needle) {
    char path[256];
    path_in_dir(path, sizeof path, "v.gguf");
    CHECK_OK(write_model(m, path, 0));
    for (int mm = 0; mm < 2; mm++) {
        tsr_load_params p = params(2, mm);
        tsr_backend *b = new_backend();
        CHECK_OK(tsr_backend_load_gguf(b, path, &p)); /* verify is off by default */
        tsr_backend_free(b);
        p.verify = 1;
        expect_fail(path, &p, TSR_E_MALFORMED, needle);
    }
}

static void test_verify(void) {
    static const struct {
        int tensor;
        size_t off;
        uint16_t h;
        uint32_t f;
        int is32;
        const char *needle;
    } cases[] = {
        {1, 5 * 4, 0, 0x7fc00000u, 1, "'blk.0.attn_norm.weight' (f32): element 5 is NaN"},
        {9, 4 * 1024 * 4096 + 8, 0, 0xff800000u, 1, "'blk.1.big.weight' (f32): element 4194306 is infinite"},
        {2, 2 * 33 * 2, 0x7c00, 0, 0, "'blk.0.attn_q.weight' (f16): element 66 is infinite"},
        {3, 2 * 29, 0x7fc1, 0, 0, "element 29 is NaN"},
        {0, 34 * 2, 0x7e00, 0, 0, "'token_embd.weight' (q8_0): block 2: scale d is NaN"},
        {4, 20 * 3 + 2, 0xfc00, 0, 0, "block 3: scale m is infinite"},
        {6, 144 + 2, 0x7c00, 0, 0, "block 1: scale dmin is infinite"},
        {7, 210 + 208, 0x7d00, 0, 0, "block 1: scale d is NaN"},
        {11, 24 * 10, 0x7c00, 0, 0, "'output.weight' (q5_1): block 10: scale d is infinite"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        model m;
        make_model(&m);
        poison(&m, cases[c].tensor, cases[c].off, cases[c].h, cases[c].f, cases[c].is32);
        verify_case(&m, cases[c].needle);
        free_model(&m);
    }
}

/* ---- plan_only, arguments, state ----------------------------------------- */

static int plan_logged;
static void on_log(tsr_log_level level, const char *msg, const tsr_log_field *f, size_t n, void *user) {
    (void)level, (void)f, (void)n, (void)user;
    plan_logged += strcmp(msg, "memory plan") == 0;
}

static void test_plan_and_args(const model *m) {
    char path[256];
    path_in_dir(path, sizeof path, "m.gguf");
    CHECK_OK(write_model(m, path, 0));
    tsr_backend *b = new_backend();
    tsr_load_params p = params(0, 0);
    p.plan_only = 1;
    tsr_log_level old = tsr_log_get_level();
    tsr_log_set(on_log, NULL);
    tsr_log_set_level(TSR_LOG_INFO);
    CHECK_OK(tsr_backend_load_gguf(b, path, &p));
    tsr_log_set(NULL, NULL);
    tsr_log_set_level(old);
    CHECK(plan_logged >= 1);
    CHECK(tsr_backend_n_weights(b) == 0);
    size_t w = 0, want = 0;
    for (int i = 0; i < m->n; i++)
        want += m->size[i];
    CHECK_OK(tsr_backend_memory_plan(b, tsr_backend_n_devices(b) - 1, &w, NULL, NULL));
    CHECK(w >= want && w <= want + (size_t)m->n * 4096); /* padding is placement's choice */
    /* a real load afterwards, then a second load is refused */
    p.plan_only = 0;
    CHECK_OK(tsr_backend_load_gguf(b, path, &p));
    CHECK(compare_weights(b, m) == 0);
    CHECK_STATUS(tsr_backend_load_gguf(b, path, &p), TSR_E_STATE);
    CHECK(compare_weights(b, m) == 0);
    tsr_backend_free(b);

    b = new_backend();
    CHECK_STATUS(tsr_backend_load_gguf(NULL, path, &p), TSR_E_INVALID);
    CHECK_STATUS(tsr_backend_load_gguf(b, NULL, &p), TSR_E_INVALID);
    p.n_io_threads = -1;
    CHECK_STATUS(tsr_backend_load_gguf(b, path, &p), TSR_E_INVALID);
    p.size = 0;
    CHECK_STATUS(tsr_backend_load_gguf(b, path, &p), TSR_E_INVALID);
    CHECK_OK(tsr_backend_load_gguf(b, path, NULL)); /* defaults */
    CHECK(compare_weights(b, m) == 0);
    tsr_backend_free(b);
}

/* Every allocation fails in turn: an error (never a crash, never OK with
 * missing data) and nothing left in the backend. */
static void test_alloc_failures(const model *m) {
    char path[256];
    path_in_dir(path, sizeof path, "m.gguf");
    CHECK_OK(write_model(m, path, 0));
    for (int mm = 0; mm < 2; mm++) {
        bool ok = false;
        for (int64_t n = 0; n < 1000 && !ok; n++) {
            tsr_backend *b = new_backend();
            tsr_load_params p = params(3, mm);
            tsr__fail_alloc_after(n);
            tsr_status s = tsr_backend_load_gguf(b, path, &p);
            tsr__fail_alloc_after(-1);
            if (s == TSR_OK) {
                CHECK(compare_weights(b, m) == 0);
                ok = true;
            } else {
                CHECK(s == TSR_E_NOMEM || s == TSR_E_DEVICE_NOMEM);
                CHECK(tsr_backend_n_weights(b) == 0);
            }
            tsr_backend_free(b);
        }
        CHECK(ok);
    }
}

/* ---- fake GPU devices: staging, copies of shared weights, device OOM ------- */

static tsr_backend *backend_on(const char *d0, const char *d1) {
    tsr_device *list[3] = {tsr_device_by_name(d0), d1 ? tsr_device_by_name(d1) : NULL, NULL};
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = 1;
    bp.devices = list;
    tsr_backend *b = NULL;
    CHECK(list[0] != NULL);
    CHECK_OK(tsr_backend_new(&bp, &b));
    return b;
}

static size_t dev_used(const char *name) {
    size_t fr = 0, tot = 0;
    tsr_device_memory(tsr_device_by_name(name), &fr, &tot);
    return tot - fr;
}

static const char *buft_of(tsr_backend *b, const char *name) {
    tsr_tensor *t = tsr_backend_weight(b, name);
    return t && tsr_tensor_buffer_type(t) ? tsr_buffer_type_name(tsr_tensor_buffer_type(t)) : "";
}

/* rope_freqs (shared) has a copy on each device holding layers, with the
 * file's bytes right after the load */
static int check_copies(tsr_backend *b, const model *m) {
    int bad = 0, i = m->n - 1;
    for (size_t d = 0; d < tsr_backend_n_devices(b); d++) {
        tsr_tensor *c = tsr_backend_weight_on(b, m->name[i], tsr_backend_device(b, d));
        float got[16];
        bad += !c || tsr_tensor_read(c, got, 0, sizeof got) != TSR_OK || memcmp(got, m->data[i], sizeof got) != 0;
    }
    return bad;
}

static void test_devices(const model *m) {
    char path[256];
    path_in_dir(path, sizeof path, "m.gguf");
    CHECK_OK(write_model(m, path, 0));
    const float split[2] = {1, 1};
    for (int mm = 0; mm < 2; mm++)
        for (int ngl = -1; ngl <= 1; ngl += 2)
            for (int nt = 1; nt <= 4; nt += 3) {
                tsr_backend *b = backend_on("FAKE0", "FAKE1");
                tsr_load_params p = params(nt, mm);
                p.n_gpu_layers = ngl;
                p.tensor_split = split;
                CHECK_OK(tsr_backend_load_gguf(b, path, &p));
                CHECK(compare_weights(b, m) == 0);
                CHECK(check_copies(b, m) == 0);
                /* ngl -1: layer 0 on FAKE0, layer 1 on FAKE1; ngl 1: layer 1 on FAKE0 */
                CHECK(strcmp(buft_of(b, "blk.1.big.weight"), ngl < 0 ? "FAKE1" : "FAKE0") == 0);
                CHECK(strcmp(buft_of(b, "blk.0.attn_q.weight"), ngl < 0 ? "FAKE0" : mm ? "CPU_Mapped" : "CPU") == 0);
                CHECK(strcmp(buft_of(b, "token_embd.weight"), mm ? "CPU_Mapped" : "CPU") == 0);
                tsr_backend_free(b);
                CHECK(dev_used("FAKE0") == 0 && dev_used("FAKE1") == 0);
            }
    /* verify reads device memory back */
    model bad;
    make_model(&bad);
    uint32_t inf = 0x7f800000u;
    memcpy(bad.data[9] + 4 * 1000, &inf, 4);
    char vpath[256];
    path_in_dir(vpath, sizeof vpath, "vdev.gguf");
    CHECK_OK(write_model(&bad, vpath, 0));
    free_model(&bad);
    tsr_backend *b = backend_on("FAKE0", NULL);
    tsr_load_params p = params(2, 0);
    p.n_gpu_layers = -1;
    p.verify = 1;
    CHECK_STATUS(tsr_backend_load_gguf(b, vpath, &p), TSR_E_MALFORMED);
    CHECK(strstr(tsr_last_error(), "'blk.1.big.weight' (f32): element 1000 is infinite") != NULL);
    CHECK(tsr_backend_n_weights(b) == 0 && dev_used("FAKE0") == 0);
    /* cancel at every progress call with weights on two devices */
    tsr_backend_free(b);
    for (int k = 0; k < 6; k++) {
        b = backend_on("FAKE0", "FAKE1");
        prog pc = {.cancel_at = k, .monotonic = 1};
        p = params(3, k & 1);
        p.n_gpu_layers = 1;
        p.progress = on_progress;
        p.progress_user = &pc;
        CHECK_STATUS(tsr_backend_load_gguf(b, path, &p), TSR_E_CANCELLED);
        CHECK(tsr_backend_n_weights(b) == 0 && dev_used("FAKE0") == 0 && dev_used("FAKE1") == 0);
        tsr_backend_free(b);
    }
    /* a device too small: TSR_E_DEVICE_NOMEM naming it, nothing allocated,
     * and the same backend loads with the weights on the CPU afterwards */
    b = backend_on("FAKE2", NULL);
    p = params(2, 0);
    p.n_gpu_layers = -1;
    CHECK_STATUS(tsr_backend_load_gguf(b, path, &p), TSR_E_DEVICE_NOMEM);
    CHECK(strstr(tsr_last_error(), "FAKE2") != NULL && strstr(tsr_last_error(), "missing") != NULL);
    CHECK(strstr(tsr_last_error(), path) != NULL);
    CHECK(tsr_backend_n_weights(b) == 0 && dev_used("FAKE2") == 0);
    p.n_gpu_layers = 0;
    CHECK_OK(tsr_backend_load_gguf(b, path, &p));
    CHECK(compare_weights(b, m) == 0);
    tsr_backend_free(b);
}

int main(void) {
    /* fake GPUs (read at the first device enumeration); backends on all
     * devices keep every weight on the CPU unless n_gpu_layers says else */
    setenv("TSR_FAKE_DEVICES", "FAKE0:64MiB,FAKE1:64MiB,FAKE2:4MiB", 1);
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    model m;
    make_model(&m);
    test_loads(&m);
    test_mmap_write(&m);
    test_progress_cancel(&m);
    test_bad_files(&m);
    test_verify();
    test_plan_and_args(&m);
    test_alloc_failures(&m);
    test_devices(&m);
    free_model(&m);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return tsrtest_done("test-load");
}
