/*
 * test-quantize.c - end-to-end test of examples/tensr-quantize: writes a
 * small F32 model with the GGUF writer, quantizes it to every supported
 * type (and with --keep-output-f16, and -j 1 vs -j 3 giving identical
 * bytes), then checks the types chosen per tensor (llama.cpp's rules), the
 * copied metadata, and that every tensor dequantizes back to the original
 * values within the type's tolerance (relative RMS error, computed in
 * double). Also checks that read and write failures are reported with
 * their cause and leave no output behind.
 */
#include "libtensr.h"
#include "tsrtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[256], tool[1024];

typedef struct tdef {
    const char *name;
    int n_dims;
    int64_t ne[4];
} tdef;

static const tdef model[] = {
    {"token_embd.weight", 2, {256, 12}},
    {"blk.0.attn_norm.weight", 1, {256}},
    {"blk.0.attn_q.weight", 2, {256, 16}},
    {"blk.0.ffn_down.weight", 2, {96, 8}},          /* not a multiple of 256: k-quant fallback */
    {"blk.0.odd.weight", 2, {40, 3}},               /* not a multiple of 32: F16 */
    {"blk.0.ffn_gate_inp.weight", 2, {256, 4}},     /* router: stays F32 */
    {"blk.0.attn_q.bias", 2, {32, 2}},              /* not a weight: stays F32 */
    {"blk.0.exps.weight", 3, {64, 4, 2}},
    {"output_norm.weight", 1, {256}},
    {"output.weight", 2, {256, 12}},
};
#define N_MODEL (sizeof model / sizeof model[0])

static float *model_data[N_MODEL];

static int64_t nel(const tdef *t) {
    int64_t n = 1;
    for (int d = 0; d < t->n_dims; d++) n *= t->ne[d];
    return n;
}

static void write_model(const char *path, int tied) {
    tsr_gguf_writer *w;
    CHECK(tsr_gguf_writer_new(&w) == TSR_OK);
    CHECK(tsr_gguf_writer_set_str(w, "general.architecture", "llama") == TSR_OK);
    static const char *const toks[] = {"<s>", "</s>", "a"};
    CHECK(tsr_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3) == TSR_OK);
    uint32_t ctx = 128;
    CHECK(tsr_gguf_writer_set(w, "llama.context_length", TSR_GGUF_UINT32, &ctx) == TSR_OK);
    for (size_t i = 0; i < N_MODEL; i++) {
        if (tied && !strcmp(model[i].name, "output.weight")) continue;
        CHECK(tsr_gguf_writer_add_tensor(w, model[i].name, TSR_TYPE_F32, model[i].n_dims, model[i].ne,
                                         model_data[i]) == TSR_OK);
    }
    CHECK(tsr_gguf_writer_write_file(w, path) == TSR_OK);
    tsr_gguf_writer_free(w);
}

static int run_tool(const char *args, const char *log) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s > '%s' 2>&1", tool, args, log);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static int log_contains(const char *log, const char *what) {
    FILE *f = fopen(log, "r");
    if (!f) return 0;
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strstr(buf, what) != NULL;
}

/* Largest relative RMS error a type may show on Gaussian data. */
static double tolerance(tsr_type t) {
    switch (t) {
    case TSR_TYPE_F32: return 0;
    case TSR_TYPE_F16: return 1e-3;
    case TSR_TYPE_BF16: return 8e-3;
    case TSR_TYPE_Q8_0: return 0.01;
    case TSR_TYPE_Q6_K: return 0.03;
    case TSR_TYPE_Q5_0: case TSR_TYPE_Q5_1: case TSR_TYPE_Q5_K: return 0.06;
    default: return 0.12; /* 4-bit types */
    }
}

static tsr_type expected_type(const char *name, tsr_type target, int keep_f16, int tied) {
    if (strstr(name, "norm") || strstr(name, "gate_inp") || strstr(name, ".bias")) return TSR_TYPE_F32;
    int quant = tsr_type_is_quantized(target);
    if (!strcmp(name, "output.weight") || (tied && !strcmp(name, "token_embd.weight")))
        return keep_f16 ? TSR_TYPE_F16 : !quant ? target : target == TSR_TYPE_Q8_0 ? TSR_TYPE_Q8_0 : TSR_TYPE_Q6_K;
    if (!quant) return target;
    if (!strcmp(name, "blk.0.odd.weight")) return TSR_TYPE_F16;
    if (!strcmp(name, "blk.0.ffn_down.weight") || !strcmp(name, "blk.0.exps.weight")) {
        if (target == TSR_TYPE_Q4_K) return TSR_TYPE_Q5_0;
        if (target == TSR_TYPE_Q5_K) return TSR_TYPE_Q5_1;
        if (target == TSR_TYPE_Q6_K) return TSR_TYPE_Q8_0;
    }
    return target;
}

static void check_output(const char *path, tsr_type target, int keep_f16, int tied) {
    tsr_gguf *g;
    CHECK(tsr_gguf_open(path, &g) == TSR_OK);
    if (!g) return;
    const char *arch;
    uint32_t ctx = 0, ftype = 0;
    CHECK(tsr_gguf_get_str(g, "general.architecture", &arch, NULL) == TSR_OK && !strcmp(arch, "llama"));
    CHECK(tsr_gguf_get_u32(g, "llama.context_length", &ctx) == TSR_OK && ctx == 128);
    CHECK(tsr_gguf_get_u32(g, "general.file_type", &ftype) == TSR_OK && (ftype > 1 || !tsr_type_is_quantized(target)));
    uint64_t n_tok = 0;
    CHECK(tsr_gguf_get_arr_info(g, "tokenizer.ggml.tokens", NULL, &n_tok) == TSR_OK && n_tok == 3);
    CHECK(tsr_gguf_n_tensors(g) == (int64_t)N_MODEL - tied);
    for (size_t i = 0; i < N_MODEL; i++) {
        if (tied && !strcmp(model[i].name, "output.weight")) continue;
        int64_t k = tsr_gguf_find_tensor(g, model[i].name);
        CHECK(k >= 0);
        if (k < 0) continue;
        tsr_type t = tsr_gguf_tensor_type(g, k), want = expected_type(model[i].name, target, keep_f16, tied);
        CHECK(t == want, "%s as %s: tensor %s is %s, expected %s", path, tsr_type_name(target), model[i].name,
              tsr_type_name(t), tsr_type_name(want));
        for (int d = 0; d < 4; d++) CHECK(tsr_gguf_tensor_ne(g, k, d) == (d < model[i].n_dims ? model[i].ne[d] : 1));
        size_t size = tsr_gguf_tensor_size(g, k);
        int64_t n = nel(&model[i]);
        void *raw = malloc(size);
        float *back = malloc((size_t)n * sizeof *back);
        CHECK(tsr_gguf_read_tensor(g, k, raw, size) == TSR_OK);
        CHECK(tsr_dequantize(t, raw, back, n) == TSR_OK);
        double err = 0, ref = 0;
        for (int64_t e = 0; e < n; e++) {
            double d = (double)back[e] - model_data[i][e];
            err += d * d;
            ref += (double)model_data[i][e] * model_data[i][e];
        }
        double rel = sqrt(err / ref);
        CHECK(rel <= tolerance(t), "%s: tensor %s (%s): relative RMS error %.4g above %.4g", path, model[i].name,
              tsr_type_name(t), rel, tolerance(t));
        free(raw);
        free(back);
    }
    tsr_gguf_close(g);
}

static int files_equal(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int eq = fa && fb;
    while (eq) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) eq = 0;
        if (ca == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return eq;
}

static void test_types(const char *in, const char *in_tied) {
    static const char *const names[] = {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_K", "q5_K", "Q6_K", "f16", "BF16", "f32"};
    char out[512], log[512], args[2048];
    snprintf(log, sizeof log, "%s/log.txt", tmpdir);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        tsr_type t;
        CHECK(tsr_type_by_name(names[i], &t) == TSR_OK);
        for (int variant = 0; variant < 3; variant++) {
            int keep = variant == 1, tied = variant == 2;
            snprintf(out, sizeof out, "%s/out-%s-%d.gguf", tmpdir, names[i], variant);
            snprintf(args, sizeof args, "'%s' '%s' %s%s -j 3", tied ? in_tied : in, out, names[i],
                     keep ? " --keep-output-f16" : "");
            int rc = run_tool(args, log);
            CHECK(rc == 0);
            if (rc) {
                fprintf(stderr, "tensr-quantize %s failed; see %s\n", args, log);
                continue;
            }
            check_output(out, t, keep, tied);
        }
    }
    /* The thread count changes nothing in the output. */
    char out1[512];
    snprintf(out1, sizeof out1, "%s/out-j1.gguf", tmpdir);
    snprintf(args, sizeof args, "'%s' '%s' q4_K -j 1", in, out1);
    CHECK(run_tool(args, log) == 0);
    snprintf(out, sizeof out, "%s/out-q4_K-0.gguf", tmpdir);
    CHECK(files_equal(out, out1));
}

static void test_failures(const char *in) {
    char log[512], args[2048], out[512];
    snprintf(log, sizeof log, "%s/log.txt", tmpdir);
    snprintf(args, sizeof args, "'%s/missing.gguf' '%s/x.gguf' q8_0", tmpdir, tmpdir);
    CHECK(run_tool(args, log) == 1);
    CHECK(log_contains(log, "missing.gguf") && log_contains(log, "No such file or directory"));
    snprintf(args, sizeof args, "'%s' '%s/no-such-dir/x.gguf' q8_0", in, tmpdir);
    CHECK(run_tool(args, log) == 1);
    CHECK(log_contains(log, "cannot write the output") && log_contains(log, "No such file or directory"));
    snprintf(args, sizeof args, "'%s' '%s/x.gguf' q2_K", in, tmpdir);
    CHECK(run_tool(args, log) == 1);
    CHECK(log_contains(log, "unknown or unsupported TYPE 'q2_K'; valid types: f32 f16 bf16 q8_0"));
    /* A malformed input is rejected with the reader's message; nothing is written. */
    char bad[512];
    snprintf(bad, sizeof bad, "%s/bad.gguf", tmpdir);
    FILE *f = fopen(bad, "wb");
    if (f) {
        fwrite("GGUF\x03\0\0\0", 1, 8, f);
        fclose(f);
    }
    snprintf(out, sizeof out, "%s/from-bad.gguf", tmpdir);
    snprintf(args, sizeof args, "'%s' '%s' q8_0", bad, out);
    CHECK(run_tool(args, log) == 1);
    CHECK(log_contains(log, "too short for a GGUF header"));
    CHECK(access(out, F_OK) != 0);
}

int main(void) {
    const char *top = getenv("top_builddir");
    snprintf(tool, sizeof tool, "%s/examples/tensr-quantize", top ? top : ".");
    CHECK(access(tool, X_OK) == 0, "%s not built", tool);
    if (tsrtest_failures)
        return tsrtest_done("test-quantize");
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmpdir, sizeof tmpdir, "%s/test-quantize-XXXXXX", base);
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    /* Gaussian-ish data (sum of uniforms) with an outlier per tensor. */
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < N_MODEL; i++) {
        int64_t n = nel(&model[i]);
        model_data[i] = malloc((size_t)n * sizeof(float));
        for (int64_t e = 0; e < n; e++) {
            double acc = 0;
            for (int k = 0; k < 4; k++) {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                acc += (double)(s >> 11) / 9007199254740992.0 - 0.5;
            }
            model_data[i][e] = (float)(acc * 1.7);
        }
        model_data[i][n / 2] = 4.0f;
    }
    char in[512], in_tied[512];
    snprintf(in, sizeof in, "%s/model-f32.gguf", tmpdir);
    snprintf(in_tied, sizeof in_tied, "%s/model-f32-tied.gguf", tmpdir);
    write_model(in, 0);
    write_model(in_tied, 1);
    test_types(in, in_tied);
    test_failures(in);
    for (size_t i = 0; i < N_MODEL; i++) free(model_data[i]);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (tsrtest_failures) fprintf(stderr, "test-quantize: files kept in %s\n", tmpdir);
    else if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return tsrtest_done("test-quantize");
}
