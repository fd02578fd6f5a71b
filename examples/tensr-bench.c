/* tensr-bench.c - prompt-processing (pp), generation (tg) and combined (pg)
 * speed of libtensr's model layer (tsr_session_decode; the public header
 * only) in tokens/s, measured as llama-bench measures them: random tokens,
 * each run from a cache holding -d DEPTH tokens (filled untimed), one
 * warm-up run, the mean and standard deviation of -r runs; tokenization and
 * sampling are not part of it. Every flag takes several values (a comma
 * list, or the flag repeated) and every combination is measured. Prints a
 * markdown table and/or JSON. When llama.cpp's llama-bench is at hand (on
 * PATH or --llama-bench) it measures llama.cpp on the same models, threads
 * and tests and prints both side by side; bench/compare.sh alternates the
 * two tools run by run and adds the machine's ceilings. */
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
#define MAXV 16 /* values per flag */

typedef struct list {
    int64_t v[MAXV];
    int n;
} list;

typedef struct strlist {
    const char *v[MAXV];
    int n;
} strlist;

typedef struct test {
    int n_prompt, n_gen; /* pp: (p, 0), tg: (0, n), pg: (p, n) */
} test;

typedef struct bench_opts {
    strlist models, overrides;
    const char *llama_bench, *output;
    list prompt, gen, depth, threads, fa, batch, ubatch, ngl;
    test pg[MAXV];
    int n_pg, reps, compare, verbose, warmup, profile;
    int placement_given; /* -ngl or -ot */
} bench_opts;

/* -fit on|off (-1: on unless -ngl or -ot is given), --fit-target, --fit-ctx;
 * ngl_given: -ngl was given (-ngl 0 too), so the fit keeps it. */
static struct {
    int on;
    const char *target;
    int64_t ctx;
    int ngl_given;
} fit_opt = {-1, NULL, 4096, 0};

typedef struct result {
    double mean, sd; /* tokens/s; mean < 0: not measured */
} result;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int die(const char *what, const char *detail) {
    fprintf(stderr, "tensr-bench: %s: %s\n", what, detail);
    return 1;
}

static void usage(void) {
    printf("usage: tensr-bench [options]   (every option but -r, -o takes a comma list or repeats)\n"
           "  -m, --model FILE          GGUF model (default: the cached %s)\n"
           "  -p, --n-prompt N          prompt tokens of a pp test (default 512; 0 skips it)\n"
           "  -n, --n-gen N             tokens of a tg test (default 128; 0 skips it)\n"
           "  -pg P,N                   a pp P then tg N test, tokens/s over both (repeat for more)\n"
           "  -d, --n-depth N           tokens already in the cache before each run (default 0)\n"
           "  -t, --threads N           CPU threads (default: all cores)\n"
           "  -b, --batch-size N        logical batch (default 2048)\n"
           "  -ub, --ubatch-size N      physical batch (default 512)\n"
           "  -ngl, --n-gpu-layers N    layers on GPUs (default 0)\n"
           "  -fa, --flash-attn on|off|auto   flash attention (default auto)\n"
           "  -ot LIST                  tensor placement overrides, as for tensr-run (repeat for more)\n"
           "  -fit on|off               fit -ngl and expert overrides to the devices' and system memory\n"
           "                            (default on unless -ngl or -ot is given); the context is the test's\n"
           "  --fit-target MiB[,...]    memory left free per GPU (one value: every GPU; default 1024)\n"
           "  --fit-ctx N               the fit's context floor (default 4096)\n"
           "  --batch-invariant on|off  results independent of the batch, as tensr-server's default\n"
           "                            (default off)\n"
           "  -r, --repetitions N       measured runs of each test (default 5)\n"
           "  -o, --output md|json      markdown table (default) or JSON\n"
           "  --no-warmup               no warm-up run before each test\n"
           "  --profile                 per-token profile of each test (TSR_PROFILE=1) on stderr; the CUDA\n"
           "                            module adds its kernel launches per compute (a tg test's: per token)\n"
           "  --llama-bench PATH        llama.cpp's llama-bench to run beside (default: llama-bench on PATH)\n"
           "  --no-llama                do not measure llama.cpp\n"
           "  -v, --verbose             log at debug level\n",
           DEFAULT_MODEL);
}

static int is(const char *a, const char *s1, const char *s2) { return !strcmp(a, s1) || (s2 && !strcmp(a, s2)); }

static int parse_num(const char *flag, const char *v, int64_t lo, int64_t *out) {
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno || end == v || *end || n < lo || n > (1 << 30))
        return die(flag, "expects an integer in range");
    *out = n;
    return 0;
}

static int parse_fa(const char *flag, const char *v, int64_t *out) {
    if (!strcmp(v, "on") || !strcmp(v, "1"))
        *out = 1;
    else if (!strcmp(v, "off") || !strcmp(v, "0"))
        *out = 0;
    else if (!strcmp(v, "auto") || !strcmp(v, "-1"))
        *out = TSR_FLASH_ATTN_AUTO;
    else
        return die(flag, "expects on, off or auto");
    return 0;
}

/* Appends the comma-separated values of v to l (lo: smallest allowed). */
static int parse_list(const char *flag, const char *v, int64_t lo, int fa, list *l) {
    char buf[256];
    if (strlen(v) >= sizeof buf)
        return die(flag, "value too long");
    strcpy(buf, v);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (l->n == MAXV)
            return die(flag, "too many values");
        if (fa ? parse_fa(flag, tok, &l->v[l->n]) : parse_num(flag, tok, lo, &l->v[l->n]))
            return 1;
        l->n++;
    }
    if (l->n == 0)
        return die(flag, "expects a value");
    return 0;
}

static int add_str(const char *flag, const char *v, strlist *l) {
    if (l->n == MAXV)
        return die(flag, "too many values");
    l->v[l->n++] = v;
    return 0;
}

/* Options that take a value; 0 done, 1 error, -1 unknown. */
/* --batch-invariant: the backend's batch_invariant (as tensr-server's default) */
static int batch_invariant;

static int parse_value(bench_opts *o, list *seen, const char *a, const char *v) {
    list *l = NULL;
    int64_t lo = 0, r;
    int fa = 0;
    if (is(a, "-m", "--model"))
        return add_str(a, v, &o->models);
    if (is(a, "-ot", "--override-tensor"))
        return o->placement_given = 1, add_str(a, v, &o->overrides);
    if (is(a, "-fit", "--fit")) {
        if (strcmp(v, "on") && strcmp(v, "off"))
            return die(a, "expects on or off");
        fit_opt.on = !strcmp(v, "on");
        return 0;
    }
    if (is(a, "--fit-target", NULL)) {
        fit_opt.target = v;
        return 0;
    }
    if (is(a, "--fit-ctx", NULL))
        return parse_num(a, v, 1, &fit_opt.ctx);
    if (is(a, "--batch-invariant", NULL)) {
        if (strcmp(v, "on") && strcmp(v, "off"))
            return die(a, "expects on or off");
        batch_invariant = !strcmp(v, "on");
        return 0;
    }
    if (is(a, "--llama-bench", NULL)) {
        o->llama_bench = v;
        return 0;
    }
    if (is(a, "-o", "--output")) {
        if (strcmp(v, "md") && strcmp(v, "json"))
            return die(a, "expects md or json");
        o->output = v;
        return 0;
    }
    if (is(a, "-r", "--repetitions")) {
        if (parse_num(a, v, 1, &r))
            return 1;
        o->reps = (int)r;
        return 0;
    }
    if (is(a, "-pg", NULL)) {
        int p, n, k;
        if (sscanf(v, "%d,%d%n", &p, &n, &k) != 2 || v[k] || p < 0 || n < 0 || p + n == 0)
            return die(a, "expects P,N");
        if (o->n_pg == MAXV)
            return die(a, "too many values");
        o->pg[o->n_pg++] = (test){p, n};
        return 0;
    }
    if (is(a, "-p", "--n-prompt"))
        l = &o->prompt;
    else if (is(a, "-n", "--n-gen"))
        l = &o->gen;
    else if (is(a, "-d", "--n-depth"))
        l = &o->depth;
    else if (is(a, "-t", "--threads"))
        l = &o->threads, lo = 1;
    else if (is(a, "-b", "--batch-size"))
        l = &o->batch, lo = 1;
    else if (is(a, "-ub", "--ubatch-size"))
        l = &o->ubatch, lo = 1;
    else if (is(a, "-ngl", "--n-gpu-layers"))
        l = &o->ngl, lo = -1, o->placement_given = fit_opt.ngl_given = 1;
    else if (is(a, "-fa", "--flash-attn"))
        l = &o->fa, fa = 1;
    else
        return -1;
    /* the first use of a flag replaces its default */
    list *s = &seen[l - &o->prompt];
    if (!s->n)
        l->n = 0, s->n = 1;
    return parse_list(a, v, lo, fa, l);
}

static void set1(list *l, int64_t v) { l->v[0] = v, l->n = 1; }

static int parse(int argc, char **argv, bench_opts *o) {
    list seen[8]; /* prompt .. ngl, in struct order */
    memset(o, 0, sizeof *o);
    memset(seen, 0, sizeof seen);
    set1(&o->prompt, 512), set1(&o->gen, 128), set1(&o->depth, 0), set1(&o->threads, 0);
    set1(&o->fa, TSR_FLASH_ATTN_AUTO), set1(&o->batch, 2048), set1(&o->ubatch, 512), set1(&o->ngl, 0);
    o->reps = 5, o->compare = 1, o->output = "md", o->warmup = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (is(a, "-h", "--help")) {
            usage();
            return 2;
        }
        if (is(a, "--no-llama", NULL) || is(a, "--no-warmup", NULL) || is(a, "--profile", NULL) ||
            is(a, "-v", "--verbose")) {
            if (a[2] == 'n' && a[5] == 'l')
                o->compare = 0;
            else if (a[2] == 'n')
                o->warmup = 0;
            else if (a[2] == 'p')
                o->profile = 1;
            else
                o->verbose = 1;
            continue;
        }
        int r = i + 1 < argc ? parse_value(o, seen, a, argv[i + 1]) : -1;
        if (r > 0)
            return 1;
        if (r < 0)
            return die(a, i + 1 < argc ? "unknown option (see tensr-bench -h)" : "unknown option or missing value");
        i++;
    }
    if (fit_opt.on == -1) /* as llama.cpp: on unless the placement was given */
        fit_opt.on = !o->placement_given;
    return 0;
}

/* The tests of one configuration: each -p, each -n, each -pg (zeros skipped). */
static int tests_of(const bench_opts *o, test *t) {
    int n = 0;
    for (int i = 0; i < o->prompt.n; i++)
        if (o->prompt.v[i] > 0)
            t[n++] = (test){(int)o->prompt.v[i], 0};
    for (int i = 0; i < o->gen.n; i++)
        if (o->gen.v[i] > 0)
            t[n++] = (test){0, (int)o->gen.v[i]};
    for (int i = 0; i < o->n_pg; i++) t[n++] = o->pg[i];
    return n;
}

static void test_name(char *buf, size_t size, test t, int64_t depth) {
    int k = t.n_prompt && t.n_gen ? snprintf(buf, size, "pp%d+tg%d", t.n_prompt, t.n_gen)
            : t.n_prompt          ? snprintf(buf, size, "pp%d", t.n_prompt)
                                  : snprintf(buf, size, "tg%d", t.n_gen);
    if (depth > 0 && k > 0 && (size_t)k < size)
        snprintf(buf + k, size - (size_t)k, " @ d%lld", (long long)depth);
}

/* ---- our side --------------------------------------------------------------- */

static uint64_t rng_state = 1;

static int32_t random_token(int64_t n_vocab) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((rng_state >> 33) % (uint64_t)n_vocab);
}

/* Decodes n random tokens in calls of at most n_batch (the logits of each
 * call's last token kept, as llama-bench's batches). */
static tsr_status prompt(tsr_session *s, int64_t n_batch, int32_t *ids, int n) {
    tsr_status st = TSR_OK;
    for (int i = 0; st == TSR_OK && i < n; i += (int)n_batch) {
        int k = n - i < n_batch ? n - i : (int)n_batch;
        st = tsr_session_decode(s, (size_t)k, ids + i, NULL, NULL, NULL);
    }
    return st;
}

/* One run of t from a cache holding depth tokens (filled untimed). */
static tsr_status run_once(tsr_session *s, int64_t n_batch, int64_t nv, test t, int64_t depth, int32_t *ids,
                           double *tps) {
    const int n = (int)depth + t.n_prompt + t.n_gen;
    for (int i = 0; i < n; i++) ids[i] = random_token(nv);
    tsr_status st = tsr_session_remove(s, -1, 0, -1);
    if (st == TSR_OK)
        st = prompt(s, n_batch, ids, (int)depth);
    double t0 = now();
    if (st == TSR_OK)
        st = prompt(s, n_batch, ids + depth, t.n_prompt);
    for (int i = 0; st == TSR_OK && i < t.n_gen; i++)
        st = tsr_session_decode(s, 1, ids + depth + t.n_prompt + i, NULL, NULL, NULL);
    *tps = (t.n_prompt + t.n_gen) / (now() - t0);
    return st;
}

static tsr_status measure(const bench_opts *o, tsr_session *s, int64_t n_batch, int64_t nv, test t, int64_t depth,
                          result *r) {
    double sum = 0, sum2 = 0, tps;
    const int64_t n = depth + t.n_prompt + t.n_gen;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    if (!ids)
        return TSR_E_NOMEM;
    r->mean = -1;
    tsr_status st = o->warmup ? run_once(s, n_batch, nv, t, depth, ids, &tps) : TSR_OK;
    for (int i = 0; st == TSR_OK && i < o->reps; i++) {
        st = run_once(s, n_batch, nv, t, depth, ids, &tps);
        sum += tps;
        sum2 += tps * tps;
    }
    if (st == TSR_OK) {
        r->mean = sum / o->reps;
        r->sd = o->reps > 1 ? sqrt(fmax(0.0, (sum2 - sum * sum / o->reps) / (o->reps - 1))) : 0.0;
    }
    free(ids);
    return st;
}

/* ---- llama.cpp's side ------------------------------------------------------ */

typedef struct llama_row {
    int n_prompt, n_gen;
    int64_t depth;
    result r;
} llama_row;

/* llama-bench -o jsonl: one object per test with n_prompt, n_gen, n_depth, avg_ts, stddev_ts. */
static int read_llama_bench(const char *cmd, llama_row *rows, int max, int *n) {
    FILE *f = popen(cmd, "r");
    char line[16384];
    *n = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f)) {
        const char *np = strstr(line, "\"n_prompt\":"), *ng = strstr(line, "\"n_gen\":");
        const char *nd = strstr(line, "\"n_depth\":");
        const char *ts = strstr(line, "\"avg_ts\":"), *sd = strstr(line, "\"stddev_ts\":");
        if (!np || !ng || !ts || !sd || *n == max)
            continue;
        rows[*n] = (llama_row){atoi(np + 11), atoi(ng + 8), nd ? atoll(nd + 10) : 0, {atof(ts + 9), atof(sd + 12)}};
        (*n)++;
    }
    return pclose(f) == 0;
}

static void join(char *buf, size_t size, const list *l) {
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < l->n && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? "," : "", (long long)l->v[i]);
}

/* Measures one configuration with llama-bench; *how says with what, or why not. */
static int llama_side(const bench_opts *o, const char *model, int n_threads, int fa, int64_t nb, int64_t ub,
                      int64_t ngl, const char *ot, llama_row *rows, int max, const char **how) {
    char cmd[8192], p[256], n[256], d[256], pg[512] = "";
    int nrows = 0;
    *how = "unavailable (no llama-bench on PATH; bench/build-llama.sh builds one)";
    if (!o->compare) {
        *how = "not measured (--no-llama)";
        return 0;
    }
    const char *lb = o->llama_bench;
    if (!lb && system("command -v llama-bench >/dev/null 2>&1") == 0)
        lb = "llama-bench";
    if (!lb)
        return 0;
    join(p, sizeof p, &o->prompt);
    join(n, sizeof n, &o->gen);
    join(d, sizeof d, &o->depth);
    for (int i = 0; i < o->n_pg; i++) {
        size_t k = strlen(pg);
        snprintf(pg + k, sizeof pg - k, " -pg %d,%d", o->pg[i].n_prompt, o->pg[i].n_gen);
    }
    char otf[1100] = "";
    if (ot)
        snprintf(otf, sizeof otf, " -ot '%s'", ot);
    snprintf(cmd, sizeof cmd,
             "'%s' -m '%s' -t %d -p %s -n %s%s -d %s -r %d -b %lld -ub %lld -ngl %lld -fa %d%s -o jsonl "
             "2>/dev/null",
             lb, model, n_threads, p, n, pg, d, o->reps, (long long)nb, (long long)ub, (long long)ngl, fa, otf);
    *how = read_llama_bench(cmd, rows, max, &nrows) ? "llama-bench" : "llama-bench failed";
    return nrows;
}

/* ---- one configuration --------------------------------------------------------- */

typedef struct config {
    const char *model, *ot;
    int64_t threads, fa, batch, ubatch, ngl;
} config;

/* tsr_fit for the configuration at the test's context (kept): its -ngl,
 * split and expert overrides go into ldp (the result owns the overrides). */
static int fit(const config *c, const tsr_backend_params *bp, tsr_load_params *ldp, const tsr_session_params *sp,
               tsr_fit_result *fr) {
    size_t margins[MAXV];
    tsr_fit_params fp;
    tsr_fit_params_init(&fp, sizeof fp);
    fp.n_ctx_min = fit_opt.ctx;
    fp.keep_n_ctx = 1;
    fp.keep_n_gpu_layers = fit_opt.ngl_given;
    if (fit_opt.target) {
        list l = {{0}, 0};
        if (parse_list("--fit-target", fit_opt.target, 0, 0, &l))
            return 1;
        for (int i = 0; i < l.n; i++) margins[i] = (size_t)l.v[i] << 20;
        if (l.n == 1)
            fp.gpu_margin = margins[0];
        else
            fp.margins = margins, fp.n_margins = (size_t)l.n;
    }
    if (tsr_fit(c->model, bp, ldp, sp, &fp, fr) != TSR_OK)
        return die("fit", tsr_last_error());
    ldp->n_gpu_layers = fr->n_gpu_layers;
    ldp->tensor_split = fr->n_devices > 2 ? fr->tensor_split : NULL;
    ldp->overrides = fr->overrides;
    char flags[8192];
    size_t len;
    if (tsr_fit_result_flags(fr, flags, sizeof flags, &len) == TSR_OK)
        fprintf(stderr, "fit: %s (%.1f ms)\n", flags, fr->seconds * 1e3);
    return 0;
}

/* Backend, model and session of a configuration; n_ctx holds the largest test. */
static int open_model(const config *c, int64_t n_ctx, tsr_backend **be, tsr_model **m, tsr_session **s) {
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = (int)c->threads;
    bp.flash_attn = (int)c->fa;
    bp.batch_invariant = batch_invariant;
    tsr_load_params ldp;
    tsr_load_params_init(&ldp, sizeof ldp);
    ldp.n_gpu_layers = (int)c->ngl;
    tsr_buft_override *ov = NULL;
    tsr_session_params sp;
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = n_ctx > 0 ? n_ctx : 1;
    sp.n_batch = c->batch;
    sp.n_ubatch = c->ubatch < c->batch ? c->ubatch : c->batch;
    if (tsr_backend_new(&bp, be) != TSR_OK)
        return die("backend", tsr_last_error());
    if (c->ot && tsr_buft_overrides_parse(c->ot, &ov) != TSR_OK)
        return die("-ot", tsr_last_error());
    ldp.overrides = ov;
    tsr_fit_result fr;
    memset(&fr, 0, sizeof fr);
    fr.size = sizeof fr;
    if (fit_opt.on == 1 && fit(c, &bp, &ldp, &sp, &fr)) {
        tsr_buft_overrides_free(ov);
        return 1;
    }
    tsr_status st = tsr_model_load(*be, c->model, &ldp, m);
    tsr_fit_result_free(&fr);
    tsr_buft_overrides_free(ov);
    if (st != TSR_OK)
        return die(c->model, tsr_last_error());
    if (tsr_session_new(*m, &sp, s) != TSR_OK)
        return die("session", tsr_last_error());
    return 0;
}

static int64_t file_size(const char *path) {
    FILE *f = fopen(path, "rb");
    int64_t size = -1;
    if (f && fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    if (f)
        fclose(f);
    return size;
}

static void cell(char *buf, size_t size, const result *r) {
    if (r->mean < 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.2f ± %.2f", r->mean, r->sd);
}

static int json_first = 1;

static int run_config(const bench_opts *o, const config *c) {
    test tests[3 * MAXV];
    const int nt = tests_of(o, tests);
    int64_t maxd = 0, maxt = 0;
    for (int i = 0; i < o->depth.n; i++) maxd = o->depth.v[i] > maxd ? o->depth.v[i] : maxd;
    for (int i = 0; i < nt; i++)
        maxt = tests[i].n_prompt + tests[i].n_gen > maxt ? tests[i].n_prompt + tests[i].n_gen : maxt;
    tsr_backend *be = NULL;
    tsr_model *m = NULL;
    tsr_session *s = NULL;
    result ours[3 * MAXV][MAXV];
    int rc = open_model(c, maxd + maxt, &be, &m, &s);
    for (int i = 0; rc == 0 && i < nt; i++)
        for (int d = 0; rc == 0 && d < o->depth.n; d++) {
            const int64_t nv = tsr_model_n_vocab(m);
            const int64_t nb = tsr_session_n_ctx(s) < c->batch ? tsr_session_n_ctx(s) : c->batch;
            if (measure(o, s, nb, nv, tests[i], o->depth.v[d], &ours[i][d]) != TSR_OK)
                rc = die("decode", tsr_last_error());
        }
    const int fa = be ? tsr_backend_flash_attn(be) : 0, n_threads = be ? tsr_backend_n_threads(be) : 0;
    const char *arch = m ? tsr_model_arch(m) : "";
    char archbuf[64];
    snprintf(archbuf, sizeof archbuf, "%s", arch ? arch : "");
    tsr_session_free(s);
    tsr_model_free(m);
    tsr_backend_free(be); /* before llama.cpp runs: the cores are all its */
    if (rc)
        return rc;
    llama_row rows[4 * MAXV * MAXV];
    const char *how;
    const int nrows = llama_side(o, c->model, n_threads, fa, c->batch, c->ubatch, c->ngl, c->ot, rows,
                                 (int)(sizeof rows / sizeof rows[0]), &how);
    const char *name = strrchr(c->model, '/') ? strrchr(c->model, '/') + 1 : c->model;
    const int md = strcmp(o->output, "json") != 0, js = !md;
    const int64_t size = file_size(c->model);
    for (int i = 0; i < nt; i++)
        for (int d = 0; d < o->depth.n; d++) {
            result theirs = {-1, 0};
            for (int k = 0; k < nrows; k++)
                if (rows[k].n_prompt == tests[i].n_prompt && rows[k].n_gen == tests[i].n_gen &&
                    rows[k].depth == o->depth.v[d])
                    theirs = rows[k].r;
            char test[64], a[64], b[64];
            test_name(test, sizeof test, tests[i], o->depth.v[d]);
            if (md) {
                cell(a, sizeof a, &ours[i][d]);
                cell(b, sizeof b, &theirs);
                printf("| %s | %d | %d | %lld | %s | %s | %s | ", name, n_threads, fa, (long long)c->ubatch, test, a,
                       b);
                if (theirs.mean > 0)
                    printf("%.2f |\n", ours[i][d].mean / theirs.mean);
                else
                    printf("- |\n");
            }
            if (js)
                for (int e = 0; e < 2; e++) {
                    const result *r = e ? &theirs : &ours[i][d];
                    if (r->mean < 0)
                        continue;
                    printf("%s  {\"engine\": \"%s\", \"model\": \"%s\", \"arch\": \"%s\", \"size\": %lld, "
                           "\"backend\": \"%s\", \"kernels\": \"%s\", \"threads\": %d, \"threads_asked\": %lld, "
                           "\"flash_attn\": %d, "
                           "\"n_batch\": %lld, \"n_ubatch\": %lld, \"n_gpu_layers\": %lld, \"test\": \"%s\", "
                           "\"n_prompt\": %d, \"n_gen\": %d, \"n_depth\": %lld, \"avg_ts\": %.3f, "
                           "\"stddev_ts\": %.3f}",
                           json_first ? "[\n" : ",\n", e ? "llama.cpp" : "libtensr", name, archbuf, (long long)size,
                           tsr_backends_available(), getenv("TSR_CPU_KERNELS") ? getenv("TSR_CPU_KERNELS") : "auto",
                           n_threads, (long long)(c->threads > 0 ? c->threads : n_threads), fa, (long long)c->batch,
                           (long long)c->ubatch, (long long)c->ngl, test, tests[i].n_prompt, tests[i].n_gen,
                           (long long)o->depth.v[d], r->mean, r->sd);
                    json_first = 0;
                }
        }
    if (md && o->compare)
        fprintf(stderr, "tensr-bench: llama.cpp: %s\n", how);
    return 0;
}

int main(int argc, char **argv) {
    bench_opts o;
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc == 2 ? 0 : 1;
    if (o.verbose)
        tsr_log_set_level(TSR_LOG_DEBUG);
    if (o.profile)
        setenv("TSR_PROFILE", "1", 1);
    char path[4096];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (!o.models.n) {
        if (xdg && *xdg)
            snprintf(path, sizeof path, "%s/libtensr/%s", xdg, DEFAULT_MODEL);
        else
            snprintf(path, sizeof path, "%s/.cache/libtensr/%s", home ? home : ".", DEFAULT_MODEL);
        o.models.v[o.models.n++] = path;
    }
    if (!o.overrides.n)
        o.overrides.v[o.overrides.n++] = NULL;
    if (strcmp(o.output, "json"))
        printf("| model | threads | fa | ub | test | tensr t/s | llama.cpp t/s | ratio |\n"
               "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |\n");
    for (int mi = 0; mi < o.models.n && !rc; mi++)
        for (int ti = 0; ti < o.threads.n && !rc; ti++)
            for (int fi = 0; fi < o.fa.n && !rc; fi++)
                for (int bi = 0; bi < o.batch.n && !rc; bi++)
                    for (int ui = 0; ui < o.ubatch.n && !rc; ui++)
                        for (int gi = 0; gi < o.ngl.n && !rc; gi++)
                            for (int oi = 0; oi < o.overrides.n && !rc; oi++) {
                                config c = {o.models.v[mi], o.overrides.v[oi], o.threads.v[ti], o.fa.v[fi],
                                            o.batch.v[bi],  o.ubatch.v[ui],    o.ngl.v[gi]};
                                rc = run_config(&o, &c);
                                fflush(stdout);
                            }
    if (!json_first)
        printf("\n]\n");
    return rc;
}
