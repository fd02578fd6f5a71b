/*
 * tensr-attn-bench.c - what the attention paths cost, on a model shaped like
 * SmolLM2-135M (30 layers, 576 wide, 9 query heads over 3 KV heads of 64,
 * FFN 1536, vocabulary 49152, tied output; Q8_0 weights with random values):
 * for each context length and each path (plain, plain with an attention max
 * batch, flash) it prints the compute buffer a worst-case reserve needs (full
 * context, full ubatch, only the logits rows asked for) and the prefill speed
 * of the last ubatch of the context (every cell attended), so the cost of
 * chunking is visible next to the memory it saves.
 *
 *   tensr-attn-bench [-c 2048,8192,32768] [-b 512] [-l 30] [-t threads]
 *                    [-r reps] [-o logits_rows] [-p plain,amb64,amb256,flash]
 *                    [--no-speed] [--cpu-time]
 */
#include <libtensr.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { N_EMBD = 576, N_HEAD = 9, N_HEAD_KV = 3, HEAD_DIM = 64, N_FF = 1536, N_VOCAB = 49152 };

typedef struct opts {
    int64_t ctxs[8];
    int n_ctxs;
    int64_t n_ubatch;
    int n_layers, n_threads, reps, n_outputs, speed;
    char paths[128];
} opts;

typedef struct path {
    const char *name;
    int flash;
    size_t amb;
} path;

static const path PATHS[] = {
    {"plain", 0, 0},
    {"amb64", 0, (size_t)64 << 20},
    {"amb256", 0, (size_t)256 << 20},
    {"flash", 1, 0},
};

/* Wall time, or with --cpu-time the process CPU time: on a shared, loaded
 * machine (use -t 1 then) it measures the work instead of the waiting. */
static int use_cpu_time;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(use_cpu_time ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int die(const char *what, tsr_status s) {
    fprintf(stderr, "tensr-attn-bench: %s: %s: %s\n", what, tsr_status_string(s), tsr_last_error());
    return 1;
}

/* ---- weights ---------------------------------------------------------------------- */

static tsr_status declare(tsr_backend *b, const char *name, tsr_type type, int64_t ne0, int64_t ne1) {
    int64_t ne[2] = {ne0, ne1};
    return tsr_backend_declare_weight(b, name, type, ne1 > 1 ? 2 : 1, ne);
}

/* Fills every row of a weight with one random row (speed does not depend on
 * the values; norms get ones). */
static tsr_status fill(tsr_tensor *w, unsigned seed) {
    int64_t ne0 = tsr_tensor_ne(w, 0), rows = tsr_tensor_nelements(w) / (ne0 > 0 ? ne0 : 1);
    tsr_type type = tsr_tensor_type(w);
    size_t rb = tsr_row_size(type, ne0);
    float *x = malloc((size_t)ne0 * sizeof *x);
    char *q = malloc(rb);
    tsr_status s = x && q ? TSR_OK : TSR_E_NOMEM;
    srand(seed);
    for (int64_t i = 0; i < ne0 && s == TSR_OK; i++)
        x[i] = rows > 1 ? (float)((double)rand() / RAND_MAX - 0.5) * 0.1f : 1.0f;
    if (s == TSR_OK)
        s = type == TSR_TYPE_F32 ? (memcpy(q, x, rb), TSR_OK) : tsr_quantize(type, x, q, ne0);
    for (int64_t r = 0; r < rows && s == TSR_OK; r++)
        s = tsr_tensor_write(w, q, (size_t)r * rb, rb);
    free(x);
    free(q);
    return s;
}

static tsr_status make_weights(tsr_backend *b, int n_layers) {
    char name[64];
    tsr_status s = declare(b, "token_embd.weight", TSR_TYPE_Q8_0, N_EMBD, N_VOCAB);
    if (s == TSR_OK)
        s = declare(b, "output_norm.weight", TSR_TYPE_F32, N_EMBD, 1);
    static const struct { const char *n; int64_t ne0, ne1; } L[] = {
        {"attn_norm", N_EMBD, 1}, {"attn_q", N_EMBD, N_HEAD * HEAD_DIM}, {"attn_k", N_EMBD, N_HEAD_KV * HEAD_DIM},
        {"attn_v", N_EMBD, N_HEAD_KV * HEAD_DIM}, {"attn_output", N_HEAD * HEAD_DIM, N_EMBD}, {"ffn_norm", N_EMBD, 1},
        {"ffn_gate", N_EMBD, N_FF}, {"ffn_up", N_EMBD, N_FF}, {"ffn_down", N_FF, N_EMBD},
    };
    for (int il = 0; il < n_layers && s == TSR_OK; il++)
        for (size_t j = 0; j < sizeof L / sizeof L[0] && s == TSR_OK; j++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", il, L[j].n);
            s = declare(b, name, L[j].ne1 > 1 ? TSR_TYPE_Q8_0 : TSR_TYPE_F32, L[j].ne0, L[j].ne1);
        }
    if (s == TSR_OK)
        s = tsr_backend_place_weights(b, NULL);
    for (size_t i = 0; i < tsr_backend_n_weights(b) && s == TSR_OK; i++)
        s = fill(tsr_backend_weight_at(b, i), (unsigned)i + 1);
    return s;
}

static tsr_tensor *W(tsr_backend *b, int il, const char *n) {
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s.weight", il, n);
    return tsr_backend_weight(b, name);
}

/* ---- the forward pass ---------------------------------------------------------------- */

static tsr_tensor *norm(tsr_context *ctx, tsr_tensor *x, tsr_tensor *w) {
    return tsr_mul(ctx, tsr_rms_norm(ctx, x, 1e-5f), w);
}

static tsr_tensor *layer(tsr_context *ctx, tsr_backend *b, tsr_kv_cache *c, int il, tsr_tensor *x, tsr_tensor *pos,
                         int64_t nt) {
    tsr_tensor *h = norm(ctx, x, W(b, il, "attn_norm"));
    tsr_tensor *q = tsr_reshape_3d(ctx, tsr_mul_mat(ctx, W(b, il, "attn_q"), h), HEAD_DIM, N_HEAD, nt);
    tsr_tensor *k = tsr_reshape_3d(ctx, tsr_mul_mat(ctx, W(b, il, "attn_k"), h), HEAD_DIM, N_HEAD_KV, nt);
    tsr_tensor *v = tsr_reshape_3d(ctx, tsr_mul_mat(ctx, W(b, il, "attn_v"), h), HEAD_DIM, N_HEAD_KV, nt);
    q = tsr_rope(ctx, q, pos, HEAD_DIM, TSR_ROPE_NEOX, 100000.0f, 1.0f);
    k = tsr_rope(ctx, k, pos, HEAD_DIM, TSR_ROPE_NEOX, 100000.0f, 1.0f);
    tsr_tensor *a = tsr_attention(ctx, c, il, q, k, v, 1.0f / sqrtf((float)HEAD_DIM));
    x = tsr_add(ctx, x, tsr_mul_mat(ctx, W(b, il, "attn_output"), a));
    h = norm(ctx, x, W(b, il, "ffn_norm"));
    h = tsr_swiglu(ctx, tsr_mul_mat(ctx, W(b, il, "ffn_gate"), h), tsr_mul_mat(ctx, W(b, il, "ffn_up"), h));
    return tsr_add(ctx, x, tsr_mul_mat(ctx, W(b, il, "ffn_down"), h));
}

/* Logits of the last n_out tokens only: the output matrix never sees the
 * other rows, so their logits cost no compute memory. */
static tsr_tensor *forward(tsr_context *ctx, tsr_backend *b, tsr_kv_cache *c, int n_layers, int64_t nt, int64_t p0,
                           int n_out) {
    int32_t *tok = malloc((size_t)nt * sizeof *tok), *pp = malloc((size_t)nt * sizeof *pp);
    for (int64_t i = 0; tok && pp && i < nt; i++) {
        tok[i] = (int32_t)((i * 7919) % N_VOCAB);
        pp[i] = (int32_t)(p0 + i);
    }
    int64_t ne[1] = {nt};
    tsr_tensor *tokens = tok ? tsr_input(ctx, TSR_TYPE_I32, 1, ne, tok) : NULL;
    tsr_tensor *pos = pp ? tsr_input(ctx, TSR_TYPE_I32, 1, ne, pp) : NULL;
    free(tok);
    free(pp);
    tsr_tensor *embd = tsr_backend_weight(b, "token_embd.weight");
    tsr_tensor *x = tsr_get_rows(ctx, embd, tokens);
    for (int il = 0; il < n_layers; il++)
        x = layer(ctx, b, c, il, x, pos, nt);
    int64_t n = n_out < nt ? n_out : nt;
    if (!x)
        return NULL;
    x = tsr_view_2d(ctx, x, N_EMBD, n, tsr_tensor_nb(x, 1), (size_t)(nt - n) * tsr_tensor_nb(x, 1));
    x = norm(ctx, x, tsr_backend_weight(b, "output_norm.weight"));
    return tsr_mul_mat(ctx, embd, x);
}

/* ---- one path at one context length ---------------------------------------------------- */

typedef struct result {
    double compute_mib, kv_mib, tok_s;
} result;

static tsr_status reserve(tsr_backend *b, tsr_kv_cache *c, const opts *o, result *r) {
    tsr_context *ctx = tsr_context_new(b);
    if (!ctx)
        return TSR_E_NOMEM;
    tsr_status s = tsr_kv_cache_begin_reserve(c, ctx, o->n_ubatch);
    tsr_tensor *out = s == TSR_OK ? forward(ctx, b, c, o->n_layers, o->n_ubatch, 0, o->n_outputs) : NULL;
    size_t sizes[16] = {0}, cpu = tsr_backend_n_devices(b) - 1;
    if (s == TSR_OK)
        s = out ? tsr_measure(ctx, &out, 1, sizes) : tsr_context_status(ctx);
    r->compute_mib = sizes[cpu] / 1048576.0;
    if (s == TSR_OK && o->speed)
        s = tsr_reserve(ctx, &out, 1);
    tsr_context_close(ctx);
    return s;
}

/* Marks cells [0, depth) used (contents stay zero: the speed is the same)
 * and times a ubatch at positions depth.. */
static tsr_status timed_ubatch(tsr_backend *b, tsr_kv_cache *c, const opts *o, int64_t depth, double *secs) {
    tsr_kv_cache_clear(c);
    tsr_status s = TSR_OK;
    for (int64_t p = 0; p < depth && s == TSR_OK; p += o->n_ubatch) {
        tsr_context *ctx = tsr_context_new(b);
        int64_t n = depth - p < o->n_ubatch ? depth - p : o->n_ubatch;
        s = ctx ? tsr_kv_cache_begin(c, ctx, n, NULL, NULL) : TSR_E_NOMEM;
        tsr_context_close(ctx);
    }
    double best = INFINITY;
    for (int rep = 0; rep < o->reps && s == TSR_OK; rep++) {
        tsr_kv_cache_remove(c, -1, (int32_t)depth, -1);
        tsr_context *ctx = tsr_context_new(b);
        double t0 = now_s();
        s = ctx ? tsr_kv_cache_begin(c, ctx, o->n_ubatch, NULL, NULL) : TSR_E_NOMEM;
        tsr_tensor *out = s == TSR_OK ? forward(ctx, b, c, o->n_layers, o->n_ubatch, depth, o->n_outputs) : NULL;
        if (s == TSR_OK)
            s = out ? tsr_compute(ctx, &out, 1) : tsr_context_status(ctx);
        double t = now_s() - t0;
        if (t < best)
            best = t;
        tsr_context_close(ctx);
    }
    *secs = best;
    return s;
}

static tsr_status run_path(const path *pa, int64_t n_ctx, const opts *o, result *r) {
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = o->n_threads;
    bp.flash_attn = pa->flash ? TSR_FLASH_ATTN_ON : TSR_FLASH_ATTN_OFF;
    bp.attn_max_batch = pa->amb;
    tsr_backend *b = NULL;
    tsr_kv_cache *c = NULL;
    tsr_status s = tsr_backend_new(&bp, &b);
    if (s == TSR_OK)
        s = make_weights(b, o->n_layers);
    tsr_kv_cache_params kp;
    tsr_kv_cache_params_init(&kp, sizeof kp);
    kp.n_layers = o->n_layers;
    kp.n_ctx = n_ctx;
    kp.n_head_kv = N_HEAD_KV;
    kp.head_dim_k = kp.head_dim_v = HEAD_DIM;
    kp.n_batch_max = o->n_ubatch;
    if (s == TSR_OK)
        s = tsr_kv_cache_new(b, &kp, &c);
    size_t kv = 0;
    if (s == TSR_OK)
        tsr_backend_memory_plan(b, tsr_backend_n_devices(b) - 1, NULL, &kv, NULL);
    r->kv_mib = kv / 1048576.0;
    if (s == TSR_OK)
        s = reserve(b, c, o, r);
    r->tok_s = 0;
    if (s == TSR_OK && o->speed) {
        double secs = 0;
        s = timed_ubatch(b, c, o, n_ctx - o->n_ubatch, &secs);
        r->tok_s = o->n_ubatch / secs;
    }
    tsr_kv_cache_free(c);
    tsr_backend_free(b);
    return s;
}

/* ---- command line ------------------------------------------------------------------------ */

static int parse(int argc, char **argv, opts *o) {
    *o = (opts){{2048, 8192, 32768}, 3, 512, 30, 0, 1, 1, 1, "plain,amb64,amb256,flash"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-speed") || !strcmp(a, "--cpu-time")) {
            if (a[2] == 'n')
                o->speed = 0;
            else
                use_cpu_time = 1;
            continue;
        }
        if (!v || a[0] != '-' || strlen(a) != 2)
            return fprintf(stderr, "usage: %s [-c n_ctx,...] [-b ubatch] [-l layers] [-t threads] [-r reps] "
                                   "[-o logits_rows] [-p plain,amb64,amb256,flash] [--no-speed] [--cpu-time]\n", argv[0]), 1;
        i++;
        switch (a[1]) {
        case 'c': {
            o->n_ctxs = 0;
            for (char *s = (char *)v, *e; *s && o->n_ctxs < 8; s = e + (*e == ',')) {
                o->ctxs[o->n_ctxs++] = strtoll(s, &e, 10);
                if (e == s || o->ctxs[o->n_ctxs - 1] <= 0)
                    return fprintf(stderr, "bad context list '%s'\n", v), 1;
            }
            break;
        }
        case 'b': o->n_ubatch = atoll(v); break;
        case 'l': o->n_layers = atoi(v); break;
        case 't': o->n_threads = atoi(v); break;
        case 'r': o->reps = atoi(v); break;
        case 'o': o->n_outputs = atoi(v); break;
        case 'p': snprintf(o->paths, sizeof o->paths, "%s", v); break;
        default: return fprintf(stderr, "unknown option %s\n", a), 1;
        }
    }
    return o->n_ubatch <= 0 || o->n_layers <= 0 || o->reps <= 0 || o->n_outputs < 0;
}

int main(int argc, char **argv) {
    opts o;
    if (parse(argc, argv, &o))
        return 2;
    printf("SmolLM2-135M shape: %d layers, ubatch %lld, %d logits row(s), F16 KV cache, Q8_0 weights, %s time\n\n",
           o.n_layers, (long long)o.n_ubatch, o.n_outputs, use_cpu_time ? "CPU" : "wall");
    printf("| n_ctx | path | KV cache MiB | compute buffer MiB | pp%lld tok/s (last ubatch) |\n", (long long)o.n_ubatch);
    printf("|------:|:-----|-------------:|-------------------:|------------------------:|\n");
    fflush(stdout);
    for (int ci = 0; ci < o.n_ctxs; ci++)
        for (size_t pi = 0; pi < sizeof PATHS / sizeof PATHS[0]; pi++) {
            if (!strstr(o.paths, PATHS[pi].name))
                continue;
            result r = {0};
            tsr_status s = run_path(&PATHS[pi], o.ctxs[ci], &o, &r);
            if (s != TSR_OK)
                return die(PATHS[pi].name, s);
            if (o.speed)
                printf("| %lld | %s | %.1f | %.2f | %.1f |\n", (long long)o.ctxs[ci], PATHS[pi].name, r.kv_mib,
                       r.compute_mib, r.tok_s);
            else
                printf("| %lld | %s | %.1f | %.2f | - |\n", (long long)o.ctxs[ci], PATHS[pi].name, r.kv_mib,
                       r.compute_mib);
            fflush(stdout);
        }
    return 0;
}
