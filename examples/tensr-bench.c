/* tensr-bench.c - prompt-processing (pp) and generation (tg) speed of
 * libtensr's model layer (tsr_session_decode; the public header only) in
 * tokens/s, measured as llama-bench measures them: random tokens, each test
 * from an empty cache, one warm-up run, the mean and standard deviation of
 * -r runs. Prints a markdown table and a JSON line; when llama.cpp is at
 * hand (llama-bench on PATH, or llama-cpp-python in the venv
 * tests/make-llama-refs.sh builds) it measures llama.cpp on the same model
 * and threads and prints both side by side, otherwise it says that
 * llama.cpp is unavailable. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "libtensr.h"

#ifndef TSR_SRCDIR
#define TSR_SRCDIR "."
#endif
#define DEFAULT_MODEL "SmolLM2-135M-Instruct.Q4_1.gguf"

typedef struct bench_opts {
    const char *model, *llama_bench, *llama_python, *overrides, *output;
    int n_threads, n_prompt, n_gen, reps, flash_attn, compare, n_gpu_layers, verbose;
    int64_t n_batch, n_ubatch;
} bench_opts;

typedef struct result {
    double mean, sd; /* tokens/s; mean < 0: not measured */
} result;

/* What the JSON report says of the model (read from its GGUF metadata). */
typedef struct model_info {
    int64_t n_embd;
    int n_layer;
} model_info;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int die(const char *what, const char *detail)
{
    fprintf(stderr, "tensr-bench: %s: %s\n", what, detail);
    return 1;
}

static void usage(void)
{
    printf("usage: tensr-bench [options]\n"
           "  -m, --model FILE          GGUF model (default: the cached %s)\n"
           "  -p, --n-prompt N          prompt tokens of the pp test (default 512; 0 skips it)\n"
           "  -n, --n-gen N             tokens of the tg test (default 128; 0 skips it)\n"
           "  -t, --threads N           CPU threads (default: all cores)\n"
           "  -b, --batch-size N        logical batch (default 2048)\n"
           "  -ub, --ubatch-size N      physical batch (default 512)\n"
           "  -ngl, --n-gpu-layers N    layers on GPUs (default 0)\n"
           "  -fa, --flash-attn on|off|auto   flash attention (default auto)\n"
           "  -ot LIST                  tensor placement overrides, as for tensr-run\n"
           "  -r, --repetitions N       measured runs of each test (default 5)\n"
           "  -o, --output md|json      markdown table (default) or JSON\n"
           "  --llama-bench PATH        llama.cpp's llama-bench to run beside (default: llama-bench on PATH)\n"
           "  --llama-python PYTHON     else a Python with llama-cpp-python (default: the venv of\n"
           "                            tests/make-llama-refs.sh in ~/.cache/libtensr/llama-venv)\n"
           "  --no-llama                do not measure llama.cpp\n"
           "  -v, --verbose             log at debug level\n",
           DEFAULT_MODEL);
}

static int is(const char *a, const char *s1, const char *s2) { return !strcmp(a, s1) || (s2 && !strcmp(a, s2)); }

static int parse_num(const char *flag, const char *v, int64_t lo, int64_t *out)
{
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno || end == v || *end || n < lo || n > (1 << 30))
        return die(flag, "expects an integer in range");
    *out = n;
    return 0;
}

/* Options that take a value; 0 done, 1 error, -1 unknown. */
static int parse_value(bench_opts *o, const char *a, const char *v)
{
    int64_t n = 0;
    if (is(a, "-m", "--model")) o->model = v;
    else if (is(a, "--llama-bench", NULL)) o->llama_bench = v;
    else if (is(a, "--llama-python", NULL)) o->llama_python = v;
    else if (is(a, "-ot", "--override-tensor")) o->overrides = v;
    else if (is(a, "-o", "--output")) {
        if (strcmp(v, "md") && strcmp(v, "json"))
            return die(a, "expects md or json");
        o->output = v;
    } else if (is(a, "-fa", "--flash-attn")) {
        o->flash_attn = !strcmp(v, "on") || !strcmp(v, "1") ? 1 : !strcmp(v, "off") || !strcmp(v, "0") ? 0 : -1;
        if (o->flash_attn < 0 && strcmp(v, "auto") && strcmp(v, "-1"))
            return die(a, "expects on, off or auto");
    } else if (is(a, "-p", "--n-prompt")) { if (parse_num(a, v, 0, &n)) return 1; o->n_prompt = (int)n; }
    else if (is(a, "-n", "--n-gen")) { if (parse_num(a, v, 0, &n)) return 1; o->n_gen = (int)n; }
    else if (is(a, "-t", "--threads")) { if (parse_num(a, v, 1, &n)) return 1; o->n_threads = (int)n; }
    else if (is(a, "-b", "--batch-size")) { if (parse_num(a, v, 1, &n)) return 1; o->n_batch = n; }
    else if (is(a, "-ub", "--ubatch-size")) { if (parse_num(a, v, 1, &n)) return 1; o->n_ubatch = n; }
    else if (is(a, "-ngl", "--n-gpu-layers")) { if (parse_num(a, v, -1, &n)) return 1; o->n_gpu_layers = (int)n; }
    else if (is(a, "-r", "--repetitions")) { if (parse_num(a, v, 1, &n)) return 1; o->reps = (int)n; }
    else return -1;
    return 0;
}

static int parse(int argc, char **argv, bench_opts *o)
{
    memset(o, 0, sizeof *o);
    o->n_prompt = 512, o->n_gen = 128, o->reps = 5, o->n_batch = 2048, o->n_ubatch = 512;
    o->flash_attn = TSR_FLASH_ATTN_AUTO, o->compare = 1, o->output = "md";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (is(a, "-h", "--help")) {
            usage();
            return 2;
        }
        if (is(a, "--no-llama", NULL)) {
            o->compare = 0;
            continue;
        }
        if (is(a, "-v", "--verbose")) {
            o->verbose = 1;
            continue;
        }
        int r = i + 1 < argc ? parse_value(o, a, argv[i + 1]) : -1;
        if (r > 0)
            return 1;
        if (r < 0)
            return die(a, i + 1 < argc ? "unknown option (see tensr-bench -h)" : "unknown option or missing value");
        i++;
    }
    return 0;
}

/* ---- our side --------------------------------------------------------------- */

static uint64_t rng_state = 1;

static int32_t random_token(int64_t n_vocab)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((rng_state >> 33) % (uint64_t)n_vocab);
}

/* One run: tokens/s of a pp test (n tokens in calls of at most n_batch, the
 * logits of each call's last token kept, as llama-bench's batches) or a tg
 * test (n single-token calls), from an empty cache. */
static tsr_status run_once(tsr_session *s, int64_t n_batch, int64_t nv, int pp, int n, double *tps)
{
    int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    if (!ids)
        return TSR_E_NOMEM;
    for (int i = 0; i < n; i++)
        ids[i] = random_token(nv);
    tsr_status st = tsr_session_remove(s, -1, 0, -1);
    double t0 = now();
    for (int i = 0; st == TSR_OK && pp && i < n; i += (int)n_batch) {
        int k = n - i < n_batch ? n - i : (int)n_batch;
        st = tsr_session_decode(s, (size_t)k, ids + i, NULL, NULL, NULL);
    }
    for (int i = 0; st == TSR_OK && !pp && i < n; i++)
        st = tsr_session_decode(s, 1, ids + i, NULL, NULL, NULL);
    *tps = n / (now() - t0);
    free(ids);
    return st;
}

static tsr_status measure(tsr_session *s, int64_t n_batch, int64_t nv, int pp, int n, int reps, result *r)
{
    double sum = 0, sum2 = 0, tps;
    r->mean = -1;
    if (n <= 0)
        return TSR_OK;
    tsr_status st = run_once(s, n_batch, nv, pp, n, &tps); /* warm-up */
    for (int i = 0; st == TSR_OK && i < reps; i++) {
        st = run_once(s, n_batch, nv, pp, n, &tps);
        sum += tps;
        sum2 += tps * tps;
    }
    if (st == TSR_OK) {
        r->mean = sum / reps;
        r->sd = reps > 1 ? sqrt(fmax(0.0, (sum2 - sum * sum / reps) / (reps - 1))) : 0.0;
    }
    return st;
}

/* ---- llama.cpp's side ------------------------------------------------------ */

static int executable(const char *path) { return path && access(path, X_OK) == 0; }

/* Runs cmd and reads "pp<N> <mean> <sd>" / "tg<N> <mean> <sd>" lines. */
static int read_llama_lines(const char *cmd, result *pp, result *tg)
{
    FILE *f = popen(cmd, "r");
    char line[256];
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f)) {
        double mean, sd;
        int n;
        if (sscanf(line, "pp%d %lf %lf", &n, &mean, &sd) == 3)
            pp->mean = mean, pp->sd = sd;
        else if (sscanf(line, "tg%d %lf %lf", &n, &mean, &sd) == 3)
            tg->mean = mean, tg->sd = sd;
    }
    return pclose(f) == 0;
}

/* llama-bench -o jsonl: one object per test with n_prompt, n_gen, avg_ts, stddev_ts. */
static int read_llama_bench(const char *cmd, result *pp, result *tg)
{
    FILE *f = popen(cmd, "r");
    char line[8192];
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f)) {
        const char *np = strstr(line, "\"n_prompt\":"), *ng = strstr(line, "\"n_gen\":");
        const char *ts = strstr(line, "\"avg_ts\":"), *sd = strstr(line, "\"stddev_ts\":");
        if (!np || !ng || !ts || !sd)
            continue;
        result *r = atoi(np + 11) > 0 ? pp : tg;
        r->mean = atof(ts + 9);
        r->sd = atof(sd + 12);
    }
    return pclose(f) == 0;
}

/* Measures llama.cpp; *how says with what, or why not. */
static void llama_side(const bench_opts *o, const char *model, int n_threads, int fa, result *pp, result *tg,
                       const char **how)
{
    char cmd[8192], venv[4096];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    pp->mean = tg->mean = -1;
    *how = "unavailable (no llama-bench on PATH and no llama-cpp-python venv; tests/make-llama-refs.sh builds one)";
    if (!o->compare) {
        *how = "not measured (--no-llama)";
        return;
    }
    const char *lb = o->llama_bench;
    if (!lb && system("command -v llama-bench >/dev/null 2>&1") == 0)
        lb = "llama-bench";
    if (lb) {
        snprintf(cmd, sizeof cmd,
                 "'%s' -m '%s' -t %d -p %d -n %d -r %d -b %lld -ub %lld -ngl %d -fa %d -o jsonl 2>/dev/null", lb,
                 model, n_threads, o->n_prompt, o->n_gen, o->reps, (long long)o->n_batch, (long long)o->n_ubatch,
                 o->n_gpu_layers, fa);
        *how = read_llama_bench(cmd, pp, tg) ? "llama-bench" : "llama-bench failed";
        return;
    }
    if (o->llama_python)
        snprintf(venv, sizeof venv, "%s", o->llama_python);
    else if (xdg && *xdg)
        snprintf(venv, sizeof venv, "%s/libtensr/llama-venv/bin/python", xdg);
    else
        snprintf(venv, sizeof venv, "%s/.cache/libtensr/llama-venv/bin/python", home ? home : ".");
    if (!executable(venv))
        return;
    snprintf(cmd, sizeof cmd, "'%s' '%s/examples/llama-cpp-bench.py' '%s' %d %d %d %d %d 2>/dev/null", venv,
             TSR_SRCDIR, model, n_threads, o->n_prompt, o->n_gen, o->reps, fa);
    fprintf(stderr, "tensr-bench: measuring llama.cpp through llama-cpp-python (%s)\n", venv);
    *how = read_llama_lines(cmd, pp, tg) ? "llama.cpp via llama-cpp-python" : "llama-cpp-python run failed";
}

/* ---- report --------------------------------------------------------------------- */

static void cell(char *buf, size_t size, const result *r)
{
    if (r->mean < 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.2f ± %.2f", r->mean, r->sd);
}

static void report_md(const bench_opts *o, const char *name, int n_threads, const result *ours,
                      const result *theirs, const char *how, int fa)
{
    char a[64], b[64], test[32];
    printf("| model | threads | fa | test | tensr t/s | llama.cpp t/s | ratio |\n");
    printf("| --- | ---: | ---: | --- | ---: | ---: | ---: |\n");
    for (int k = 0; k < 2; k++) {
        if (ours[k].mean < 0)
            continue;
        snprintf(test, sizeof test, "%s%d", k ? "tg" : "pp", k ? o->n_gen : o->n_prompt);
        cell(a, sizeof a, &ours[k]);
        cell(b, sizeof b, &theirs[k]);
        printf("| %s | %d | %d | %s | %s | %s | ", name, n_threads, fa, test, a, b);
        if (theirs[k].mean > 0)
            printf("%.2f |\n", ours[k].mean / theirs[k].mean);
        else
            printf("- |\n");
    }
    printf("\nllama.cpp: %s\n", how);
}

/* JSON: one object per test and engine. */
static void report_json(const bench_opts *o, const char *name, const model_info *mi, int64_t size,
                        int n_threads, const result *ours, const result *theirs, const char *how, int fa)
{
    int first = 1;
    printf("[\n");
    for (int e = 0; e < 2; e++) {
        const result *r = e ? theirs : ours;
        for (int k = 0; k < 2; k++) {
            if (r[k].mean < 0)
                continue;
            printf("%s  {\"engine\": \"%s\", \"model\": \"%s\", \"size\": %lld, \"n_embd\": %lld, "
                   "\"n_layer\": %d, \"backend\": \"%s\", \"threads\": %d, \"flash_attn\": %d, "
                   "\"n_batch\": %lld, \"n_ubatch\": %lld, \"test\": \"%s%d\", \"tokens\": %d, "
                   "\"avg_ts\": %.3f, \"stddev_ts\": %.3f}",
                   first ? "" : ",\n", e ? how : "libtensr", name, (long long)size, (long long)mi->n_embd,
                   mi->n_layer, tsr_backends_available(), n_threads, fa, (long long)o->n_batch,
                   (long long)o->n_ubatch, k ? "tg" : "pp", k ? o->n_gen : o->n_prompt,
                   k ? o->n_gen : o->n_prompt, r[k].mean, r[k].sd);
            first = 0;
        }
    }
    printf("\n]\n");
}

/* n_embd and n_layer from the model's GGUF metadata (0 when absent). */
static void read_info(const char *path, const char *arch, model_info *mi)
{
    char key[128];
    tsr_gguf *g = NULL;
    int64_t v;
    mi->n_embd = 0;
    mi->n_layer = 0;
    if (!arch || tsr_gguf_open(path, &g) != TSR_OK)
        return;
    snprintf(key, sizeof key, "%s.embedding_length", arch);
    if (tsr_gguf_get_i64(g, key, &v) == TSR_OK)
        mi->n_embd = v;
    snprintf(key, sizeof key, "%s.block_count", arch);
    if (tsr_gguf_get_i64(g, key, &v) == TSR_OK)
        mi->n_layer = (int)v;
    tsr_gguf_close(g);
}

/* Backend, model and session from the options: the cache holds one pp and
 * one tg test (n_prompt + n_gen cells, as llama-bench's context). */
static int open_model(const bench_opts *o, tsr_backend **be, tsr_model **m, tsr_session **s)
{
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = o->n_threads;
    bp.flash_attn = o->flash_attn;
    tsr_load_params ldp;
    tsr_load_params_init(&ldp, sizeof ldp);
    ldp.n_gpu_layers = o->n_gpu_layers;
    tsr_buft_override *ov = NULL;
    tsr_session_params sp;
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = o->n_prompt + o->n_gen > 0 ? o->n_prompt + o->n_gen : 1;
    sp.n_batch = o->n_batch;
    sp.n_ubatch = o->n_ubatch < o->n_batch ? o->n_ubatch : o->n_batch;
    if (tsr_backend_new(&bp, be) != TSR_OK)
        return die("backend", tsr_last_error());
    if (o->overrides && tsr_buft_overrides_parse(o->overrides, &ov) != TSR_OK)
        return die("-ot", tsr_last_error());
    ldp.overrides = ov;
    tsr_status st = tsr_model_load(*be, o->model, &ldp, m);
    tsr_buft_overrides_free(ov);
    if (st != TSR_OK)
        return die(o->model, tsr_last_error());
    if (tsr_session_new(*m, &sp, s) != TSR_OK)
        return die("session", tsr_last_error());
    return 0;
}

int main(int argc, char **argv)
{
    bench_opts o;
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc == 2 ? 0 : 1;
    if (o.verbose)
        tsr_log_set_level(TSR_LOG_DEBUG);
    char path[4096];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (!o.model) {
        if (xdg && *xdg)
            snprintf(path, sizeof path, "%s/libtensr/%s", xdg, DEFAULT_MODEL);
        else
            snprintf(path, sizeof path, "%s/.cache/libtensr/%s", home ? home : ".", DEFAULT_MODEL);
        o.model = path;
    }
    tsr_backend *be = NULL;
    tsr_model *m = NULL;
    tsr_session *s = NULL;
    result ours[2], theirs[2];
    model_info mi = {0, 0};
    const char *how;
    rc = open_model(&o, &be, &m, &s);
    if (rc == 0) {
        int64_t nv = tsr_model_n_vocab(m), nb = tsr_session_n_ctx(s) < o.n_batch ? tsr_session_n_ctx(s) : o.n_batch;
        if (measure(s, nb, nv, 1, o.n_prompt, o.reps, &ours[0]) != TSR_OK ||
            measure(s, nb, nv, 0, o.n_gen, o.reps, &ours[1]) != TSR_OK)
            rc = die("decode", tsr_last_error());
        read_info(o.model, tsr_model_arch(m), &mi);
    }
    int fa = be ? tsr_backend_flash_attn(be) : 0, n_threads = be ? tsr_backend_n_threads(be) : 0;
    tsr_session_free(s);
    tsr_model_free(m);
    tsr_backend_free(be); /* before llama.cpp runs: the cores are all its */
    if (rc == 0) {
        const char *name = strrchr(o.model, '/') ? strrchr(o.model, '/') + 1 : o.model;
        FILE *f = fopen(o.model, "rb");
        int64_t size = -1;
        if (f && fseek(f, 0, SEEK_END) == 0)
            size = ftell(f);
        if (f)
            fclose(f);
        llama_side(&o, o.model, n_threads, fa, &theirs[0], &theirs[1], &how);
        if (!strcmp(o.output, "json"))
            report_json(&o, name, &mi, size, n_threads, ours, theirs, how, fa);
        else
            report_md(&o, name, n_threads, ours, theirs, how, fa);
    }
    return rc;
}
