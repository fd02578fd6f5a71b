/*
 * test-sched.c - devices, buffer types, placement, overrides, the memory
 * plan and the multi-device scheduler, on fake devices (TSR_FAKE_DEVICES,
 * set here before the first libtensr call): FAKE0 and FAKE1 (64 MiB each)
 * and FAKE2 (1 MiB, for out-of-memory cases).
 */
#include "tsrtest.h"

#include "internal.h"

#include <math.h>

#define MIB ((size_t)1 << 20)

static tsr_device *dev(const char *name) { return tsr_device_by_name(name); }

/* A backend on the named devices (the CPU is always added). */
static tsr_backend *backend_on(const char *a, const char *b2) {
    tsr_device *list[3] = {a ? dev(a) : NULL, b2 ? dev(b2) : NULL, NULL};
    if (!a)
        list[0] = tsr_device_by_name("CPU"); /* CPU only */
    tsr_backend_params p;
    tsr_backend_params_init(&p, sizeof p);
    p.devices = list;
    p.n_threads = 2;
    tsr_backend *b = NULL;
    CHECK_OK(tsr_backend_new(&p, &b));
    return b;
}

static size_t used(const char *name) {
    size_t fr = 0, tot = 0;
    tsr_device_memory(dev(name), &fr, &tot);
    return tot - fr;
}

/* ---- log capture ------------------------------------------------------------ */

static int n_override_logs, n_unmatched_logs, n_no_gpu_logs;
static char unmatched_pattern[64], override_buft_of_blk1_q[32];
static char plan_lines[8][256];
static int n_plan_lines;

static const char *field(const tsr_log_field *f, size_t n, const char *key) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(f[i].key, key) == 0)
            return f[i].value;
    return "";
}

static void capture(tsr_log_level level, const char *msg, const tsr_log_field *f, size_t n, void *user) {
    (void)level, (void)user;
    if (strcmp(msg, "buffer type override") == 0) {
        n_override_logs++;
        CHECK(field(f, n, "mib")[0] != '\0');
        if (strcmp(field(f, n, "tensor"), "blk.1.attn_q.weight") == 0)
            snprintf(override_buft_of_blk1_q, sizeof override_buft_of_blk1_q, "%s", field(f, n, "buffer_type"));
    } else if (strcmp(msg, "buffer type override matched no tensor") == 0) {
        n_unmatched_logs++;
        snprintf(unmatched_pattern, sizeof unmatched_pattern, "%s", field(f, n, "pattern"));
    } else if (strncmp(msg, "n_gpu_layers asks for GPU layers", 32) == 0) {
        n_no_gpu_logs++;
    } else if (strcmp(msg, "memory plan") == 0 && n_plan_lines < 8) {
        int len = 0;
        for (size_t i = 0; i < n; i++)
            len += snprintf(plan_lines[n_plan_lines] + len, sizeof plan_lines[0] - (size_t)len, "%s%s=%s",
                            i ? " " : "", f[i].key, f[i].value);
        n_plan_lines++;
    }
}

/* ---- devices and buffer types ---------------------------------------------------- */

static void test_devices(void) {
    size_t n = tsr_device_count();
    CHECK(n == 4);
    const char *names[] = {"FAKE0", "FAKE1", "FAKE2", "CPU"};
    for (size_t i = 0; i < n && i < 4; i++)
        CHECK(strcmp(tsr_device_name(tsr_device_get(i)), names[i]) == 0);
    tsr_device *f1 = dev("fake1");
    CHECK(f1 && f1 == tsr_device_get(1));
    CHECK(tsr_device_kind(f1) == TSR_DEVICE_GPU);
    CHECK(strcmp(tsr_device_description(f1), "libtensr fake device") == 0);
    CHECK(tsr_device_index_in_model(dev("FAKE0")) == 0 && tsr_device_index_in_model(f1) == 1 &&
          tsr_device_index_in_model(dev("FAKE2")) == 2);
    size_t fr, tot;
    CHECK_OK(tsr_device_memory(f1, &fr, &tot));
    CHECK(tot == 64 * MIB && fr == tot);
    CHECK(tsr_buffer_type_by_name("fake0") == tsr_device_buffer_type(dev("FAKE0")));
    CHECK(tsr_buffer_type_by_name("FAKE0_Host") == tsr_device_host_buffer_type(dev("FAKE0")));
    CHECK(tsr_device_host_buffer_type(dev("CPU")) == NULL);
    CHECK(strstr(tsr_backends_available(), "fake") != NULL);

    /* device memory limit: an error naming the device, the size and the free memory */
    tsr_buffer *buf = NULL, *big = NULL;
    CHECK_OK(tsr_buffer_alloc(tsr_device_buffer_type(dev("FAKE2")), 512 * 1024, &buf));
    CHECK(used("FAKE2") == 512 * 1024);
    CHECK_STATUS(tsr_buffer_alloc(tsr_device_buffer_type(dev("FAKE2")), 600 * 1024, &big), TSR_E_DEVICE_NOMEM);
    CHECK(big == NULL && strstr(tsr_last_error(), "FAKE2") && strstr(tsr_last_error(), "614400") &&
          strstr(tsr_last_error(), "0.50 MiB free"));
    tsr_buffer_free(buf);
    CHECK(used("FAKE2") == 0);
    CHECK_OK(tsr_buffer_alloc(tsr_device_buffer_type(dev("FAKE2")), 0, &buf)); /* size 0 is legal */
    tsr_buffer_free(buf);
}

/* ---- a small llama-shaped model --------------------------------------------------- */

typedef struct model {
    int n_layers, n_embd, n_head, n_head_kv, n_ff, n_vocab;
    tsr_type wtype;
} model;

static const model SMALL = {4, 64, 4, 2, 96, 80, TSR_TYPE_F32};

static void declare(tsr_backend *b, const model *m, bool rope_freqs) {
    int64_t E = m->n_embd, D = m->n_embd / m->n_head, KV = D * m->n_head_kv, F = m->n_ff, V = m->n_vocab;
    int64_t ne_emb[2] = {E, V}, ne_e[1] = {E}, ne_rf[1] = {D / 2};
    CHECK_OK(tsr_backend_declare_weight(b, "token_embd.weight", m->wtype, 2, ne_emb));
    CHECK_OK(tsr_backend_declare_weight(b, "output_norm.weight", TSR_TYPE_F32, 1, ne_e));
    CHECK_OK(tsr_backend_declare_weight(b, "output.weight", m->wtype, 2, ne_emb));
    if (rope_freqs)
        CHECK_OK(tsr_backend_declare_weight(b, "rope_freqs.weight", TSR_TYPE_F32, 1, ne_rf));
    for (int il = 0; il < m->n_layers; il++) {
        char name[64];
        struct {
            const char *n;
            int64_t ne0, ne1;
            int nd;
        } w[] = {{"attn_norm", E, 1, 1}, {"attn_q", E, E, 2},   {"attn_k", E, KV, 2}, {"attn_v", E, KV, 2},
                 {"attn_output", E, E, 2}, {"ffn_norm", E, 1, 1}, {"ffn_gate", E, F, 2}, {"ffn_up", E, F, 2},
                 {"ffn_down", F, E, 2}};
        for (size_t i = 0; i < sizeof w / sizeof *w; i++) {
            int64_t ne[2] = {w[i].ne0, w[i].ne1};
            snprintf(name, sizeof name, "blk.%d.%s.weight", il, w[i].n);
            CHECK_OK(tsr_backend_declare_weight(b, name, w[i].nd == 1 ? TSR_TYPE_F32 : m->wtype, w[i].nd, ne));
        }
    }
}

/* Deterministic data for every weight (norms near 1, rope factors in [1, 2]). */
static void fill_weights(tsr_backend *b) {
    for (size_t i = 0; i < tsr_backend_n_weights(b); i++) {
        tsr_tensor *w = tsr_backend_weight_at(b, i);
        size_t n = (size_t)tsr_tensor_nelements(w);
        float *x = malloc(n * sizeof *x);
        tsrtest_fill(x, n, 100 + i);
        bool norm = strstr(tsr_tensor_name(w), "norm") != NULL, rf = strstr(tsr_tensor_name(w), "rope") != NULL;
        for (size_t j = 0; j < n; j++)
            x[j] = norm ? 1.0f + 0.1f * x[j] : rf ? 1.5f + 0.5f * x[j] : 0.2f * x[j];
        CHECK_OK(tsr_tensor_write(w, x, 0, n * sizeof *x));
        free(x);
    }
}

static tsr_tensor *W(tsr_backend *b, int il, const char *n) {
    char name[64];
    if (il >= 0)
        snprintf(name, sizeof name, "blk.%d.%s.weight", il, n);
    else
        snprintf(name, sizeof name, "%s.weight", n);
    return tsr_backend_weight(b, name);
}

/* The forward pass of T tokens: logits [n_vocab, T] and argmax [T]. */
static tsr_tensor *forward(tsr_context *ctx, const model *m, int64_t T, bool rope_freqs, tsr_tensor **argmax) {
    tsr_backend *b = tsr_context_backend(ctx);
    int64_t E = m->n_embd, D = E / m->n_head, ne1[1] = {T}, ne2[2] = {T, T};
    int32_t *tok = malloc((size_t)T * 4), *pos = malloc((size_t)T * 4);
    float *mask = malloc((size_t)(T * T) * 4);
    for (int64_t i = 0; i < T; i++) {
        tok[i] = (int32_t)((i * 7 + 3) % m->n_vocab);
        pos[i] = (int32_t)i;
        for (int64_t j = 0; j < T; j++)
            mask[i * T + j] = j <= i ? 0.0f : -INFINITY;
    }
    tsr_tensor *tokens = tsr_input(ctx, TSR_TYPE_I32, 1, ne1, tok), *p = tsr_input(ctx, TSR_TYPE_I32, 1, ne1, pos);
    tsr_tensor *kq_mask = tsr_input(ctx, TSR_TYPE_F32, 2, ne2, mask);
    free(tok), free(pos), free(mask);
    tsr_tensor *rf = rope_freqs ? W(b, -1, "rope_freqs") : NULL;
    tsr_tensor *x = tsr_get_rows(ctx, W(b, -1, "token_embd"), tokens);
    for (int il = 0; il < m->n_layers; il++) {
        tsr_tensor *h = tsr_mul(ctx, tsr_rms_norm(ctx, x, 1e-5f), W(b, il, "attn_norm"));
        tsr_tensor *q = tsr_reshape_3d(ctx, tsr_mul_mat(ctx, W(b, il, "attn_q"), h), D, m->n_head, T);
        tsr_tensor *k = tsr_reshape_3d(ctx, tsr_mul_mat(ctx, W(b, il, "attn_k"), h), D, m->n_head_kv, T);
        tsr_tensor *v = tsr_reshape_3d(ctx, tsr_mul_mat(ctx, W(b, il, "attn_v"), h), D, m->n_head_kv, T);
        q = tsr_rope_ext(ctx, q, p, rf, (int)D, TSR_ROPE_NORMAL, 0, 10000.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
        k = tsr_rope_ext(ctx, k, p, rf, (int)D, TSR_ROPE_NORMAL, 0, 10000.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
        tsr_tensor *kq = tsr_mul_mat(ctx, tsr_permute(ctx, k, 0, 2, 1, 3), tsr_permute(ctx, q, 0, 2, 1, 3));
        kq = tsr_softmax_ext(ctx, kq, kq_mask, 1.0f / sqrtf((float)D));
        tsr_tensor *vt = tsr_cont(ctx, tsr_permute(ctx, v, 1, 2, 0, 3));
        tsr_tensor *o = tsr_cont(ctx, tsr_permute(ctx, tsr_mul_mat(ctx, vt, kq), 0, 2, 1, 3));
        x = tsr_add(ctx, x, tsr_mul_mat(ctx, W(b, il, "attn_output"), tsr_reshape_2d(ctx, o, E, T)));
        h = tsr_mul(ctx, tsr_rms_norm(ctx, x, 1e-5f), W(b, il, "ffn_norm"));
        tsr_tensor *g = tsr_swiglu(ctx, tsr_mul_mat(ctx, W(b, il, "ffn_gate"), h), tsr_mul_mat(ctx, W(b, il, "ffn_up"), h));
        x = tsr_add(ctx, x, tsr_mul_mat(ctx, W(b, il, "ffn_down"), g));
    }
    x = tsr_mul(ctx, tsr_rms_norm(ctx, x, 1e-5f), W(b, -1, "output_norm"));
    tsr_tensor *logits = tsr_mul_mat(ctx, W(b, -1, "output"), x);
    if (argmax)
        *argmax = tsr_argmax(ctx, logits);
    return logits;
}

static tsr_backend *model_backend(const char *d0, const char *d1, int ngl, const float *split, const model *m,
                                  bool rope_freqs) {
    tsr_backend *b = backend_on(d0, d1);
    if (!b)
        return NULL;
    declare(b, m, rope_freqs);
    tsr_load_params lp;
    tsr_load_params_init(&lp, sizeof lp);
    lp.n_gpu_layers = ngl;
    lp.tensor_split = split;
    CHECK_OK(tsr_backend_place_weights(b, &lp));
    fill_weights(b);
    return b;
}

/* ---- placement ----------------------------------------------------------------------- */

static const char *buft_of(tsr_backend *b, int il, const char *n) {
    return tsr_buffer_type_name(tsr_tensor_buffer_type(W(b, il, n)));
}

/* Expected device of each layer, and of the output layer, for one setting. */
typedef struct layer_case {
    int ngl;
    float split[2];
    bool use_split;
    const char *layers[4];
    const char *output;
} layer_case;

static void test_layers(void) {
    const layer_case cases[] = {
        {0, {0, 0}, false, {"CPU", "CPU", "CPU", "CPU"}, "CPU"},
        {3, {0, 0}, false, {"CPU", "FAKE0", "FAKE0", "FAKE1"}, "CPU"},     /* equal free memory */
        {4, {1, 3}, true, {"FAKE0", "FAKE1", "FAKE1", "FAKE1"}, "FAKE1"},  /* 1:3 */
        {-1, {1, 0}, true, {"FAKE0", "FAKE0", "FAKE0", "FAKE0"}, "FAKE0"}, /* all on FAKE0 */
        {99, {0, 2}, true, {"FAKE1", "FAKE1", "FAKE1", "FAKE1"}, "FAKE1"}, /* more than all */
        {2, {1, 1}, true, {"CPU", "CPU", "FAKE0", "FAKE1"}, "CPU"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const layer_case *lc = &cases[c];
        tsr_backend *b = model_backend("FAKE0", "FAKE1", lc->ngl, lc->use_split ? lc->split : NULL, &SMALL, true);
        if (!b)
            continue;
        CHECK(tsr_backend_n_layers(b) == 4);
        for (int il = 0; il < 4; il++) {
            CHECK(strcmp(tsr_buffer_type_name(tsr_backend_layer_buffer_type(b, il)), lc->layers[il]) == 0);
            CHECK(strcmp(buft_of(b, il, "ffn_up"), lc->layers[il]) == 0);
        }
        CHECK(strcmp(buft_of(b, -1, "token_embd"), "CPU") == 0);
        CHECK(strcmp(buft_of(b, -1, "output"), lc->output) == 0);
        CHECK(strcmp(buft_of(b, -1, "output_norm"), lc->output) == 0);
        /* rope_freqs: with layer 0, and a copy on every other device holding layers */
        tsr_tensor *rf = W(b, -1, "rope_freqs");
        CHECK(strcmp(tsr_buffer_type_name(tsr_tensor_buffer_type(rf)), lc->layers[0]) == 0);
        const char *devs[] = {"FAKE0", "FAKE1", "CPU"};
        for (int d = 0; d < 3; d++) {
            bool holds = false;
            for (int il = 0; il < 4; il++)
                holds |= strcmp(lc->layers[il], devs[d]) == 0;
            tsr_tensor *c2 = tsr_backend_weight_on(b, "rope_freqs.weight", dev(devs[d]));
            if (holds) {
                CHECK(strcmp(tsr_buffer_type_name(tsr_tensor_buffer_type(c2)), devs[d]) == 0);
                float x[8], y[8];
                CHECK_OK(tsr_tensor_read(rf, x, 0, sizeof x));
                CHECK(c2 == rf || tsr_tensor_read(c2, y, 0, sizeof y) == TSR_OK); /* filled at next compute */
            } else {
                CHECK(c2 == rf);
            }
        }
        /* the plan equals an independent sum of what each weight occupies, and the fake devices' usage */
        size_t want[3] = {0, 0, 0};
        for (size_t i = 0; i < tsr_backend_n_weights(b); i++) {
            tsr_tensor *w = tsr_backend_weight_at(b, i);
            for (int d = 0; d < 3; d++)
                if (strcmp(tsr_buffer_type_name(tsr_tensor_buffer_type(w)), devs[d]) == 0)
                    want[d] += (tsr_tensor_nbytes(w) + 63) / 64 * 64;
            for (int d = 0; d < 3 && strcmp(tsr_tensor_name(w), "rope_freqs.weight") == 0; d++) {
                tsr_tensor *c2 = tsr_backend_weight_on(b, "rope_freqs.weight", dev(devs[d]));
                if (c2 != w)
                    want[d] += 64;
            }
        }
        for (int d = 0; d < 3; d++) {
            size_t wb = 0;
            CHECK_OK(tsr_backend_memory_plan(b, (size_t)d, &wb, NULL, NULL));
            CHECK(wb == want[d]);
            if (d < 2)
                CHECK(used(devs[d]) == want[d]);
        }
        tsr_backend_free(b);
        CHECK(used("FAKE0") == 0 && used("FAKE1") == 0);
    }
    /* a shared weight that already has memory (the loader maps CPU weights first) still gets its copies */
    tsr_backend *b = backend_on("FAKE0", NULL);
    declare(b, &SMALL, true);
    tsr_buffer *mapped = NULL;
    tsr_tensor *rf = W(b, -1, "rope_freqs");
    CHECK_OK(tsr_buffer_alloc(tsr_buffer_type_by_name("CPU"), tsr_tensor_nbytes(rf), &mapped));
    rf->buffer = mapped;
    rf->data = mapped->base;
    rf->device_id = (int)tsr_backend_n_devices(b) - 1;
    tsr_load_params lp;
    tsr_load_params_init(&lp, sizeof lp);
    lp.n_gpu_layers = -1;
    CHECK_OK(tsr_backend_place_weights(b, &lp));
    tsr_tensor *rf0 = tsr_backend_weight_on(b, "rope_freqs.weight", dev("FAKE0"));
    CHECK(rf0 != rf && strcmp(tsr_buffer_type_name(tsr_tensor_buffer_type(rf0)), "FAKE0") == 0);
    tsr_backend_free(b);
    tsr_buffer_free(mapped);
    /* bad parameters */
    b = backend_on("FAKE0", NULL);
    declare(b, &SMALL, false);
    tsr_load_params_init(&lp, sizeof lp);
    lp.main_gpu = 1;
    CHECK_STATUS(tsr_backend_place_weights(b, &lp), TSR_E_INVALID);
    lp.main_gpu = 0;
    lp.n_gpu_layers = -2;
    CHECK_STATUS(tsr_backend_place_weights(b, &lp), TSR_E_INVALID);
    float bad[1] = {NAN};
    lp.n_gpu_layers = 1;
    lp.tensor_split = bad;
    CHECK_STATUS(tsr_backend_place_weights(b, &lp), TSR_E_INVALID);
    CHECK(used("FAKE0") == 0);
    tsr_backend_free(b);
}

/* ---- overrides ---------------------------------------------------------------------------- */

static void test_override_parse(void) {
    tsr_buft_override *l = NULL;
    CHECK_OK(tsr_buft_overrides_parse("blk\\.[0-3]\\.=FAKE1,ffn=cpu , exps=FAKE0_Host", &l));
    CHECK(l && strcmp(l[0].pattern, "blk\\.[0-3]\\.") == 0 && l[0].buft == tsr_buffer_type_by_name("FAKE1"));
    CHECK(l && strcmp(l[1].pattern, "ffn") == 0 && l[1].buft == tsr_buffer_type_by_name("CPU"));
    CHECK(l && strcmp(l[2].pattern, " exps") == 0 && l[2].buft == tsr_buffer_type_by_name("FAKE0_Host"));
    CHECK(l && l[3].pattern == NULL && l[3].buft == NULL);
    tsr_buft_overrides_free(l);
    CHECK_OK(tsr_buft_overrides_parse("blk\\.[0-9]{1,2}\\.ffn=CPU", &l)); /* comma inside braces */
    CHECK(l && strcmp(l[0].pattern, "blk\\.[0-9]{1,2}\\.ffn") == 0 && l[1].pattern == NULL);
    tsr_buft_overrides_free(l);
    CHECK_OK(tsr_buft_overrides_parse("", &l));
    CHECK(l && l[0].pattern == NULL);
    tsr_buft_overrides_free(l);
    CHECK_STATUS(tsr_buft_overrides_parse("ffn=GPU9", &l), TSR_E_NOT_FOUND);
    CHECK(l == NULL && strstr(tsr_last_error(), "GPU9") && strstr(tsr_last_error(), "FAKE0_Host") &&
          strstr(tsr_last_error(), "CPU"));
    CHECK_STATUS(tsr_buft_overrides_parse("(ffn=CPU", &l), TSR_E_INVALID);
    CHECK(l == NULL && strstr(tsr_last_error(), "(ffn"));
    CHECK_STATUS(tsr_buft_overrides_parse("ffn", &l), TSR_E_INVALID);
    CHECK_STATUS(tsr_buft_overrides_parse("=CPU", &l), TSR_E_INVALID);
    CHECK_STATUS(tsr_buft_overrides_parse("a=CPU,,b=CPU", &l), TSR_E_INVALID);
    CHECK_STATUS(tsr_buft_overrides_parse(NULL, &l), TSR_E_INVALID);
    /* every allocation failing in turn */
    for (int64_t nth = 0; nth < 3; nth++) {
        tsr__fail_alloc_after(nth);
        tsr_status s = tsr_buft_overrides_parse("a=CPU,b=FAKE0", &l);
        tsr__fail_alloc_after(-1);
        CHECK((s == TSR_OK) == (l != NULL));
        tsr_buft_overrides_free(l);
        l = NULL;
    }
}

/* -ngl on a backend without a GPU: every layer on the CPU, and a warning,
 * once per backend (placing again says nothing more); -ngl 0 says nothing. */
static void test_ngl_without_gpu(void) {
    for (int ngl = 0; ngl <= 99; ngl += 99) {
        tsr_backend *b = backend_on(NULL, NULL);
        declare(b, &SMALL, true);
        tsr_load_params lp;
        tsr_load_params_init(&lp, sizeof lp);
        lp.n_gpu_layers = ngl;
        n_no_gpu_logs = 0;
        tsr_log_set(capture, NULL);
        CHECK_OK(tsr_backend_place_weights(b, &lp));
        CHECK_OK(tsr_backend_place_weights(b, &lp));
        tsr_log_set(NULL, NULL);
        CHECK(n_no_gpu_logs == (ngl ? 1 : 0), "-ngl %d without a GPU: %d warnings", ngl, n_no_gpu_logs);
        for (int il = 0; il < 4; il++) CHECK(strcmp(buft_of(b, il, "ffn_up"), "CPU") == 0);
        tsr_backend_free(b);
    }
}

/* With a GPU in the backend, what the CPU computes lives in that GPU's
 * pinned host memory (FAKE0_Host), so copies to and from it need no
 * pageable bounce; CPU alone, in the CPU's own buffer type. */
static void test_pinned_host_compute(void) {
    for (int gpu = 0; gpu < 2; gpu++) {
        tsr_backend *b = backend_on(gpu ? "FAKE0" : NULL, NULL);
        tsr_context *ctx = tsr_context_new(b);
        float x[8] = {3, 1, 4, 1, 5, 9, 2, 6};
        int64_t ne[1] = {8};
        /* argmax: the fake device refuses it, so the CPU runs it */
        tsr_tensor *out = tsr_argmax(ctx, tsr_scale(ctx, tsr_input(ctx, TSR_TYPE_F32, 1, ne, x), 2.0f));
        CHECK_OK(tsr_compute(ctx, &out, 1));
        int32_t i = -1;
        CHECK_OK(tsr_tensor_read(out, &i, 0, sizeof i));
        CHECK(i == 5);
        const char *want = gpu ? "FAKE0_Host" : "CPU";
        CHECK(strcmp(tsr_buffer_type_name(tsr_tensor_buffer_type(out)), want) == 0, "CPU result in %s, not %s",
              tsr_buffer_type_name(tsr_tensor_buffer_type(out)), want);
        tsr_context_close(ctx);
        tsr_backend_free(b);
    }
}

static void test_override_place(void) {
    tsr_backend *b = backend_on("FAKE0", NULL);
    declare(b, &SMALL, true);
    tsr_buft_override *l = NULL;
    CHECK_OK(tsr_buft_overrides_parse("ffn_up=CPU,blk\\.1\\.=FAKE0_Host,blk\\.=CPU,nomatch=FAKE0,rope=CPU", &l));
    tsr_load_params lp;
    tsr_load_params_init(&lp, sizeof lp);
    lp.n_gpu_layers = -1;
    lp.overrides = l;
    n_override_logs = n_unmatched_logs = 0;
    tsr_log_set(capture, NULL);
    tsr_log_set_level(TSR_LOG_DEBUG);
    CHECK_OK(tsr_backend_place_weights(b, &lp));
    tsr_log_set(NULL, NULL);
    tsr_log_set_level(TSR_LOG_WARN);
    CHECK(strcmp(buft_of(b, 1, "ffn_up"), "CPU") == 0);       /* first match wins */
    CHECK(strcmp(buft_of(b, 1, "attn_q"), "FAKE0_Host") == 0); /* second pattern */
    CHECK(strcmp(buft_of(b, 2, "attn_q"), "CPU") == 0);        /* third */
    CHECK(strcmp(buft_of(b, -1, "output"), "FAKE0") == 0);     /* no match: placement */
    CHECK(strcmp(buft_of(b, -1, "rope_freqs"), "CPU") == 0);
    CHECK(tsr_backend_weight_on(b, "rope_freqs.weight", dev("FAKE0")) == W(b, -1, "rope_freqs")); /* no copies */
    CHECK(strcmp(override_buft_of_blk1_q, "FAKE0_Host") == 0);
    CHECK(n_override_logs == 4 * 9 + 1);
    CHECK(n_unmatched_logs == 1 && strcmp(unmatched_pattern, "nomatch") == 0);
    /* layers keep their device for the KV cache */
    CHECK(strcmp(tsr_buffer_type_name(tsr_backend_layer_buffer_type(b, 2)), "FAKE0") == 0);
    tsr_backend_free(b);
    /* an override to a device the backend does not use is an error */
    b = backend_on("FAKE0", NULL);
    declare(b, &SMALL, false);
    tsr_buft_override *l2 = NULL;
    CHECK_OK(tsr_buft_overrides_parse("attn=FAKE1", &l2));
    lp.overrides = l2;
    CHECK_STATUS(tsr_backend_place_weights(b, &lp), TSR_E_INVALID);
    CHECK(strstr(tsr_last_error(), "FAKE1") != NULL);
    CHECK(used("FAKE0") == 0 && used("FAKE1") == 0);
    tsr_backend_free(b);
    tsr_buft_overrides_free(l);
    tsr_buft_overrides_free(l2);
}

/* ---- computing across devices ----------------------------------------------------------------- */

static void read_all(tsr_tensor *t, float *out) {
    CHECK_OK(tsr_tensor_read(t, out, 0, tsr_tensor_nbytes(t)));
}

/* Logits of T tokens on a backend; n_splits/n_copies out. */
static bool run_model(tsr_backend *b, int64_t T, float *logits, int32_t *am) {
    tsr_context *ctx = tsr_context_new(b);
    tsr_tensor *arg = NULL, *out = forward(ctx, &SMALL, T, true, &arg);
    tsr_tensor *outs[2] = {out, arg};
    tsr_status s = tsr_compute(ctx, outs, 2);
    CHECK_OK(s);
    if (s == TSR_OK) {
        read_all(out, logits);
        CHECK_OK(tsr_tensor_read(arg, am, 0, (size_t)T * 4));
        CHECK(tsr_tensor_device(arg) == dev("CPU")); /* ARGMAX is not run by fake devices */
    }
    tsr_context_close(ctx);
    return s == TSR_OK;
}

static double max_rel_diff(const float *a, const float *b, size_t n) {
    double m = 0, scale = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(a[i]));
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]) / (scale > 0 ? scale : 1));
    return m;
}

static void test_split_model(void) {
    const int64_t T = 7;
    size_t n = (size_t)(SMALL.n_vocab * T);
    float *ref = calloc(n, 4), *got = calloc(n, 4);
    int32_t am_ref[7], am[7];
    tsr_backend *cpu = model_backend(NULL, NULL, 0, NULL, &SMALL, true);
    if (!cpu || !run_model(cpu, T, ref, am_ref))
        goto done;
    CHECK(tsr_backend_n_splits(cpu) == 1 && tsr_backend_n_copies(cpu) == 0);
    const struct {
        int ngl;
        float split[2];
    } cases[] = {{-1, {1, 1}}, {2, {1, 1}}, {3, {2, 1}}, {1, {0, 1}}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        tsr_backend *b = model_backend("FAKE0", "FAKE1", cases[c].ngl, cases[c].split, &SMALL, true);
        if (!b || !run_model(b, T, got, am))
            continue;
        double d = max_rel_diff(ref, got, n);
        if (d > 1e-5)
            fprintf(stderr, "case %zu: logits differ from the CPU by %g\n", c, d);
        CHECK(d <= 1e-5);
        CHECK(memcmp(am, am_ref, sizeof am) == 0);
        CHECK(tsr_backend_n_splits(b) >= 3);
        CHECK(tsr_backend_n_copies(b) >= 2);
        if (c == 0) {
            /* again with the same backend: reused buffers, same result */
            CHECK(run_model(b, T, got, am) && max_rel_diff(ref, got, n) <= 1e-5);
        }
        tsr_backend_free(b);
    }
done:
    tsr_backend_free(cpu);
    free(ref);
    free(got);
}

/* Three layers on CPU, FAKE0 and FAKE1, against a double-precision reference. */
static void test_split_reference(void) {
    enum { K = 33, M = 17, N = 5, T = 3 };
    tsr_backend *b = backend_on("FAKE0", "FAKE1");
    int64_t ne0[2] = {K, M}, ne1[2] = {M, M}, ne2[2] = {M, N};
    CHECK_OK(tsr_backend_declare_weight(b, "blk.0.w.weight", TSR_TYPE_F32, 2, ne0));
    CHECK_OK(tsr_backend_declare_weight(b, "blk.1.w.weight", TSR_TYPE_F32, 2, ne1));
    CHECK_OK(tsr_backend_declare_weight(b, "blk.2.w.weight", TSR_TYPE_F32, 2, ne2));
    tsr_load_params lp;
    tsr_load_params_init(&lp, sizeof lp);
    lp.n_gpu_layers = 2;
    float split[2] = {1, 1};
    lp.tensor_split = split;
    CHECK_OK(tsr_backend_place_weights(b, &lp));
    CHECK(strcmp(buft_of(b, 0, "w"), "CPU") == 0 && strcmp(buft_of(b, 1, "w"), "FAKE0") == 0 &&
          strcmp(buft_of(b, 2, "w"), "FAKE1") == 0);
    static float w0[K * M], w1[M * M], w2[M * N], x[K * T], bias[M * T];
    tsrtest_fill(w0, K * M, 1), tsrtest_fill(w1, M * M, 2), tsrtest_fill(w2, M * N, 3);
    tsrtest_fill(x, K * T, 4), tsrtest_fill(bias, M * T, 5);
    CHECK_OK(tsr_tensor_write(W(b, 0, "w"), w0, 0, sizeof w0));
    CHECK_OK(tsr_tensor_write(W(b, 1, "w"), w1, 0, sizeof w1));
    CHECK_OK(tsr_tensor_write(W(b, 2, "w"), w2, 0, sizeof w2));
    tsr_context *ctx = tsr_context_new(b);
    int64_t nx[2] = {K, T}, nb[2] = {M, T};
    tsr_tensor *tx = tsr_input(ctx, TSR_TYPE_F32, 2, nx, x), *tb = tsr_input(ctx, TSR_TYPE_F32, 2, nb, bias);
    tsr_tensor *h0 = tsr_silu(ctx, tsr_mul_mat(ctx, W(b, 0, "w"), tx));       /* CPU */
    tsr_tensor *h1 = tsr_add(ctx, tsr_mul_mat(ctx, W(b, 1, "w"), h0), tb);     /* FAKE0, bias copied in */
    tsr_tensor *s1 = tsr_add(ctx, h1, h0);                                     /* FAKE0 (follows h1), h0's copy reused */
    tsr_tensor *y = tsr_mul_mat(ctx, W(b, 2, "w"), s1);                        /* FAKE1, s1 copied in */
    CHECK_OK(tsr_compute(ctx, &y, 1));
    CHECK(tsr_tensor_device(h0) == dev("CPU") && tsr_tensor_device(h1) == dev("FAKE0") &&
          tsr_tensor_device(s1) == dev("FAKE0") && tsr_tensor_device(y) == dev("FAKE1"));
    CHECK(tsr_backend_n_splits(b) == 3);
    CHECK(tsr_backend_n_copies(b) == 3); /* h0 and bias to FAKE0 (each once), s1 to FAKE1 */
    double r0[M * T], r1[M * T], ry[N * T];
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < M; i++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += (double)w0[i * K + k] * x[t * K + k];
            r0[t * M + i] = s / (1 + exp(-s));
        }
        for (int i = 0; i < M; i++) {
            double s = 0;
            for (int k = 0; k < M; k++)
                s += (double)w1[i * M + k] * (float)r0[t * M + k];
            r1[t * M + i] = s + bias[t * M + i];
        }
        for (int i = 0; i < N; i++) {
            double s = 0;
            for (int k = 0; k < M; k++)
                s += (double)w2[i * M + k] * ((float)r1[t * M + k] + (float)r0[t * M + k]);
            ry[t * N + i] = s;
        }
    }
    float got[N * T];
    read_all(y, got);
    CHECK(tsrtest_nmse(got, ry, N * T) < 1e-10);
    tsr_context_close(ctx);
    tsr_backend_free(b);
}

/* ---- mixture of experts: the experts' weights on one device, the rest on another ------------- */

enum { MOE_E = 64, MOE_F = 32, MOE_X = 8, MOE_U = 2, MOE_T = 5 };

/* One MoE FFN layer's weights (Q8_0 experts), placed on FAKE0 with `overrides`. */
static tsr_backend *moe_backend(bool fake, const char *overrides) {
    tsr_backend *b = backend_on(fake ? "FAKE0" : NULL, NULL);
    const int64_t ne_g[2] = {MOE_E, MOE_X}, ne_ug[3] = {MOE_E, MOE_F, MOE_X}, ne_d[3] = {MOE_F, MOE_E, MOE_X};
    CHECK_OK(tsr_backend_declare_weight(b, "blk.0.ffn_gate_inp.weight", TSR_TYPE_F32, 2, ne_g));
    CHECK_OK(tsr_backend_declare_weight(b, "blk.0.ffn_up_exps.weight", TSR_TYPE_Q8_0, 3, ne_ug));
    CHECK_OK(tsr_backend_declare_weight(b, "blk.0.ffn_gate_exps.weight", TSR_TYPE_Q8_0, 3, ne_ug));
    CHECK_OK(tsr_backend_declare_weight(b, "blk.0.ffn_down_exps.weight", TSR_TYPE_Q8_0, 3, ne_d));
    tsr_buft_override *list = NULL;
    if (overrides)
        CHECK_OK(tsr_buft_overrides_parse(overrides, &list));
    tsr_load_params lp;
    tsr_load_params_init(&lp, sizeof lp);
    lp.n_gpu_layers = fake ? -1 : 0;
    lp.overrides = list;
    CHECK_OK(tsr_backend_place_weights(b, &lp));
    tsr_buft_overrides_free(list);
    for (size_t i = 0; i < tsr_backend_n_weights(b); i++) {
        tsr_tensor *w = tsr_backend_weight_at(b, i);
        const size_t n = (size_t)tsr_tensor_nelements(w);
        float *x = malloc(n * sizeof *x);
        tsrtest_fill(x, n, 300 + i);
        for (size_t j = 0; j < n; j++) x[j] *= 0.3f;
        void *q = malloc(tsr_tensor_nbytes(w));
        CHECK_OK(tsr_quantize(tsr_tensor_type(w), x, q, (int64_t)n));
        CHECK_OK(tsr_tensor_write(w, q, 0, tsr_tensor_nbytes(w)));
        free(q), free(x);
    }
    return b;
}

typedef struct moe_nodes {
    tsr_tensor *logits, *sel, *up, *down, *out;
} moe_nodes;

/* The MoE FFN block of test-moe on the backend's weights (x: [MOE_E, MOE_T]). */
static moe_nodes moe_build(tsr_context *ctx, const float *xs) {
    tsr_backend *b = tsr_context_backend(ctx);
    const int64_t ne_x[2] = {MOE_E, MOE_T};
    tsr_tensor *x = tsr_input(ctx, TSR_TYPE_F32, 2, ne_x, xs);
    moe_nodes n;
    n.logits = tsr_mul_mat(ctx, W(b, 0, "ffn_gate_inp"), x);
    tsr_tensor *probs = tsr_softmax(ctx, n.logits);
    n.sel = tsr_top_k(ctx, probs, MOE_U);
    tsr_tensor *w = tsr_get_rows(ctx, tsr_reshape_3d(ctx, probs, 1, MOE_X, MOE_T), n.sel);
    w = tsr_div(ctx, w, tsr_reshape_3d(ctx, tsr_sum_rows(ctx, tsr_reshape_2d(ctx, w, MOE_U, MOE_T)), 1, 1, MOE_T));
    tsr_tensor *x3 = tsr_reshape_3d(ctx, x, MOE_E, 1, MOE_T);
    n.up = tsr_mul_mat_id(ctx, W(b, 0, "ffn_up_exps"), x3, n.sel);
    tsr_tensor *g = tsr_mul_mat_id(ctx, W(b, 0, "ffn_gate_exps"), x3, n.sel);
    n.down = tsr_mul_mat_id(ctx, W(b, 0, "ffn_down_exps"), tsr_swiglu(ctx, g, n.up), n.sel);
    tsr_tensor *d = tsr_mul(ctx, n.down, w);
    n.out = tsr_view_2d(ctx, d, MOE_E, MOE_T, tsr_tensor_nb(d, 2), 0);
    for (int e = 1; e < MOE_U; e++)
        n.out = tsr_add(ctx, n.out, tsr_view_2d(ctx, d, MOE_E, MOE_T, tsr_tensor_nb(d, 2), (size_t)e * tsr_tensor_nb(d, 1)));
    return n;
}

/* Experts on the CPU (-ot exps=CPU), the rest on FAKE0: mul_mat_id runs where its
 * experts are, only activations cross (the input, the chosen ids and their
 * weights), and the result is the CPU-only one; then the reverse placement. */
static void test_moe_placement(void) {
    static float xs[MOE_E * MOE_T], want[MOE_E * MOE_T], got[MOE_E * MOE_T];
    tsrtest_fill(xs, MOE_E * MOE_T, 77);
    tsr_backend *cpu = moe_backend(false, NULL);
    tsr_context *ctx = tsr_context_new(cpu);
    moe_nodes n = moe_build(ctx, xs);
    CHECK(n.out != NULL, "building the MoE block: %s", tsr_context_error(ctx) ? tsr_context_error(ctx) : "");
    CHECK_OK(tsr_compute(ctx, &n.out, 1));
    read_all(n.out, want);
    tsr_context_close(ctx);
    tsr_backend_free(cpu);

    tsr_backend *b = moe_backend(true, "exps=CPU");
    CHECK(strcmp(buft_of(b, 0, "ffn_up_exps"), "CPU") == 0 && strcmp(buft_of(b, 0, "ffn_down_exps"), "CPU") == 0 &&
          strcmp(buft_of(b, 0, "ffn_gate_inp"), "FAKE0") == 0);
    const size_t fake_weights = used("FAKE0");
    CHECK(fake_weights < 4 * MOE_E * MOE_X + 4096, "only the router's weights on FAKE0: %zu bytes", fake_weights);
    ctx = tsr_context_new(b);
    n = moe_build(ctx, xs);
    CHECK_OK(tsr_compute(ctx, &n.out, 1));
    CHECK(tsr_tensor_device(n.logits) == dev("FAKE0") && tsr_tensor_device(n.sel) == dev("FAKE0"));
    CHECK(tsr_tensor_device(n.up) == dev("CPU") && tsr_tensor_device(n.down) == dev("CPU"),
          "mul_mat_id runs where its experts are: up on %s, down on %s", tsr_device_name(tsr_tensor_device(n.up)),
          tsr_device_name(tsr_tensor_device(n.down)));
    /* x to FAKE0 for the router; sel and the chosen weights back to the CPU: no weight moves */
    CHECK(tsr_backend_n_copies(b) == 3, "%zu copies", tsr_backend_n_copies(b));
    read_all(n.out, got);
    CHECK(memcmp(got, want, sizeof got) == 0, "the MoE block on FAKE0 + CPU differs from the CPU-only run: max rel %g",
          max_rel_diff(got, want, MOE_E * MOE_T));
    tsr_context_close(ctx);
    tsr_backend_free(b);
    CHECK(used("FAKE0") == 0);

    b = moe_backend(true, "gate_inp=CPU"); /* the reverse: experts on FAKE0, the router on the CPU */
    CHECK(strcmp(buft_of(b, 0, "ffn_up_exps"), "FAKE0") == 0 && strcmp(buft_of(b, 0, "ffn_gate_inp"), "CPU") == 0);
    ctx = tsr_context_new(b);
    n = moe_build(ctx, xs);
    CHECK_OK(tsr_compute(ctx, &n.out, 1));
    CHECK(tsr_tensor_device(n.logits) == dev("CPU") && tsr_tensor_device(n.up) == dev("FAKE0") &&
          tsr_tensor_device(n.down) == dev("FAKE0"));
    read_all(n.out, got);
    CHECK(memcmp(got, want, sizeof got) == 0, "experts on FAKE0: max rel %g", max_rel_diff(got, want, MOE_E * MOE_T));
    tsr_context_close(ctx);
    tsr_backend_free(b);
    CHECK(used("FAKE0") == 0);
}

/* Reserve the worst case, then forward passes allocate nothing (host or device). */
static void test_reserve_then_compute(void) {
    float split[2] = {1, 1};
    tsr_backend *b = model_backend("FAKE0", "FAKE1", 3, split, &SMALL, true);
    tsr_backend *cpu = model_backend(NULL, NULL, 0, NULL, &SMALL, true);
    if (!b || !cpu)
        goto done;
    tsr_context *ctx = tsr_context_new(b);
    tsr_tensor *worst = forward(ctx, &SMALL, 32, true, NULL);
    size_t sizes[3];
    CHECK_OK(tsr_measure(ctx, &worst, 1, sizes));
    CHECK_OK(tsr_reserve(ctx, &worst, 1));
    tsr_context_close(ctx);
    for (int d = 0; d < 3; d++) {
        size_t comp = 0;
        CHECK_OK(tsr_backend_memory_plan(b, (size_t)d, NULL, NULL, &comp));
        CHECK(comp == sizes[d] && sizes[d] > 0); /* the plan is the measure */
    }
    size_t fake0_used = used("FAKE0");
    const int64_t Ts[] = {1, 7, 32, 2};
    for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++) {
        ctx = tsr_context_new(b);
        tsr_tensor *arg = NULL, *out = forward(ctx, &SMALL, Ts[i], true, &arg);
        tsr_tensor *outs[2] = {out, arg};
        uint64_t before = tsr__alloc_count();
        CHECK_OK(tsr_compute(ctx, outs, 2));
        uint64_t after = tsr__alloc_count();
        if (after != before)
            fprintf(stderr, "T=%lld: %llu allocations after reserve\n", (long long)Ts[i],
                    (unsigned long long)(after - before));
        CHECK(after == before);
        CHECK(used("FAKE0") == fake0_used);
        size_t n = (size_t)(SMALL.n_vocab * Ts[i]);
        float *got = malloc(n * 4), *ref = malloc(n * 4);
        int32_t am[32];
        read_all(out, got);
        tsr_context_close(ctx);
        if (run_model(cpu, Ts[i], ref, am))
            CHECK(max_rel_diff(ref, got, n) <= 1e-5);
        free(got);
        free(ref);
    }
done:
    tsr_backend_free(b);
    tsr_backend_free(cpu);
}

/* ---- out of memory ---------------------------------------------------------------------------- */

static void test_out_of_memory(void) {
    /* the weights fit on FAKE2 (1 MiB), the worst-case compute buffer does not: reserve fails at start-up */
    model tiny = SMALL;
    tiny.n_layers = 2;
    tsr_backend *b = model_backend("FAKE2", NULL, -1, NULL, &tiny, false);
    if (b) {
        CHECK(strcmp(buft_of(b, 1, "attn_q"), "FAKE2") == 0);
        tsr_context *ctx = tsr_context_new(b);
        tsr_tensor *worst = forward(ctx, &tiny, 512, false, NULL);
        CHECK_STATUS(tsr_reserve(ctx, &worst, 1), TSR_E_DEVICE_NOMEM);
        CHECK(strstr(tsr_last_error(), "FAKE2") != NULL && strstr(tsr_last_error(), "compute buffer") != NULL);
        tsr_context_close(ctx);
        /* a small graph still runs */
        float logits[80 * 2];
        int32_t am[2];
        ctx = tsr_context_new(b);
        tsr_tensor *out = forward(ctx, &tiny, 2, false, NULL);
        CHECK_OK(tsr_compute(ctx, &out, 1));
        read_all(out, logits);
        (void)am;
        tsr_context_close(ctx);
        tsr_backend_free(b);
    }
    CHECK(used("FAKE2") == 0);

    /* weights that do not fit: the plan fails before anything is allocated, naming the device */
    model wide = {4, 128, 2, 1, 256, 80, TSR_TYPE_F32}; /* 0.56 MiB per layer */
    b = backend_on("FAKE2", NULL);
    declare(b, &wide, false);
    tsr_load_params lp;
    tsr_load_params_init(&lp, sizeof lp);
    lp.n_gpu_layers = -1;
    CHECK_STATUS(tsr_backend_place_weights(b, &lp), TSR_E_DEVICE_NOMEM);
    CHECK(strstr(tsr_last_error(), "FAKE2") && strstr(tsr_last_error(), "missing"));
    CHECK(used("FAKE2") == 0);
    for (size_t i = 0; i < tsr_backend_n_weights(b); i++)
        CHECK(tsr_tensor_buffer_type(tsr_backend_weight_at(b, i)) == NULL);
    size_t wb = 0;
    CHECK_OK(tsr_backend_memory_plan(b, 0, &wb, NULL, NULL));
    CHECK(wb > 1 * MIB); /* the plan that did not fit is readable */
    lp.n_gpu_layers = 1; /* fewer layers fit */
    CHECK_OK(tsr_backend_place_weights(b, &lp));
    CHECK(used("FAKE2") > 0 && used("FAKE2") < 1 * MIB);
    tsr_backend_free(b);
    CHECK(used("FAKE2") == 0);
}

/* Every allocation of a load failing in turn: an error, nothing left allocated, and a clean retry. */
static void test_load_failures(void) {
    float split[2] = {1, 1};
    int ok_at = -1;
    for (int64_t nth = 0; nth < 64 && ok_at < 0; nth++) {
        tsr_backend *b = backend_on("FAKE0", "FAKE1");
        declare(b, &SMALL, true);
        tsr_load_params lp;
        tsr_load_params_init(&lp, sizeof lp);
        lp.n_gpu_layers = 3;
        lp.tensor_split = split;
        tsr__fail_alloc_after(nth);
        tsr_status s = tsr_backend_place_weights(b, &lp);
        tsr__fail_alloc_after(-1);
        if (s == TSR_OK) {
            ok_at = (int)nth;
        } else {
            CHECK(s == TSR_E_NOMEM || s == TSR_E_DEVICE_NOMEM);
            CHECK(used("FAKE0") == 0 && used("FAKE1") == 0);
            for (size_t i = 0; i < tsr_backend_n_weights(b); i++)
                CHECK(tsr_tensor_buffer_type(tsr_backend_weight_at(b, i)) == NULL);
            CHECK_OK(tsr_backend_place_weights(b, &lp)); /* the state is clean: a retry works */
            CHECK(used("FAKE0") > 0 && used("FAKE1") > 0);
        }
        tsr_backend_free(b);
        CHECK(used("FAKE0") == 0 && used("FAKE1") == 0);
    }
    CHECK(ok_at > 3); /* several allocations were failed, device ones included */
}

/* ---- memory plan of a SmolLM2-135M-shaped model on FAKE0 (64 MiB) + CPU, 10 layers offloaded ---- */

static void test_plan_smollm2(void) {
    const model smol = {30, 576, 9, 3, 1536, 49152, TSR_TYPE_Q4_1};
    tsr_backend *b = backend_on("FAKE0", NULL);
    declare(b, &smol, false);
    tsr_load_params lp;
    tsr_load_params_init(&lp, sizeof lp);
    lp.n_gpu_layers = 10;
    lp.plan_only = 1;
    CHECK_OK(tsr_backend_place_weights(b, &lp));
    CHECK(used("FAKE0") == 0); /* plan only */
    /* KV cache (what the KV cache adds): F16 K and V, 2048 cells, 3 heads of 64, per layer on its device */
    size_t kv_layer = (size_t)2 * 2048 * 3 * 64 * 2;
    for (int il = 0; il < 30; il++) {
        tsr_buffer_type *bt = tsr_backend_layer_buffer_type(b, il);
        b->plan_kv[tsr__backend_device_index(b, tsr_buffer_type_device(bt))] += kv_layer;
    }
    /* compute: measured on the worst-case graph (512 tokens) before any weight is allocated */
    tsr_context *ctx = tsr_context_new(b);
    tsr_tensor *worst = forward(ctx, &smol, 512, false, NULL);
    size_t sizes[2];
    CHECK_OK(tsr_measure(ctx, &worst, 1, sizes));
    n_plan_lines = 0;
    tsr_log_set(capture, NULL);
    tsr_log_set_level(TSR_LOG_INFO);
    tsr_backend_log_plan(b);
    tsr_log_set(NULL, NULL);
    tsr_log_set_level(TSR_LOG_WARN);
    printf("memory plan, SmolLM2-135M shape (Q4_1 matrices), FAKE0:64MiB + CPU, n_gpu_layers=10, n_ctx 2048, "
           "batch 512:\n");
    for (int i = 0; i < n_plan_lines; i++)
        printf("  %s\n", plan_lines[i]);
    size_t plan_w[2], plan_c[2];
    for (int d = 0; d < 2; d++)
        CHECK_OK(tsr_backend_memory_plan(b, (size_t)d, &plan_w[d], NULL, &plan_c[d]));
    /* the real allocation: the same numbers */
    lp.plan_only = 0;
    CHECK_OK(tsr_backend_place_weights(b, &lp));
    size_t w0 = 0;
    CHECK_OK(tsr_backend_memory_plan(b, 0, &w0, NULL, NULL));
    CHECK(w0 == plan_w[0] && used("FAKE0") == plan_w[0]);
    CHECK_OK(tsr_reserve(ctx, &worst, 1));
    size_t c0 = 0, c1 = 0;
    CHECK_OK(tsr_backend_memory_plan(b, 0, NULL, NULL, &c0));
    CHECK_OK(tsr_backend_memory_plan(b, 1, NULL, NULL, &c1));
    CHECK(c0 == plan_c[0] && c1 == plan_c[1]);
    CHECK(used("FAKE0") == plan_w[0] + plan_c[0]);
    tsr_context_close(ctx);
    tsr_backend_free(b);
}

int main(void) {
    setenv("TSR_FAKE_DEVICES", "FAKE0:64MiB,FAKE1:64MiB,FAKE2:1MiB", 1);
    test_devices();
    test_layers();
    test_override_parse();
    test_override_place();
    test_ngl_without_gpu();
    test_pinned_host_compute();
    test_split_reference();
    test_split_model();
    test_moe_placement();
    test_reserve_then_compute();
    test_out_of_memory();
    test_load_failures();
    test_plan_smollm2();
    return tsrtest_done("test-sched");
}
