/* tensr-bench.c - prompt-processing (pp) and generation (tg) speed of the
 * model runner in tokens/s, measured as llama-bench measures them: random
 * tokens, each test from an empty cache, one warm-up run, the mean and
 * standard deviation of -r runs. Prints a markdown table and a JSON line;
 * when llama.cpp is at hand (llama-bench on PATH, or llama-cpp-python in
 * the venv tests/make-llama-refs.sh builds) it measures llama.cpp on the
 * same model and threads and prints both side by side, otherwise it says
 * that llama.cpp is unavailable. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "libtensr.h"
#include "model/llama.h"

#ifndef TSR_SRCDIR
#define TSR_SRCDIR "."
#endif
#define DEFAULT_MODEL "SmolLM2-135M-Instruct.Q4_1.gguf"

typedef struct bench_opts {
    const char *model, *llama_python;
    int n_threads, n_prompt, n_gen, reps, flash_attn, compare;
    int64_t n_ubatch;
} bench_opts;

typedef struct result {
    double mean, sd; /* tokens/s; mean < 0: not measured */
} result;

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
    printf("usage: tensr-bench [-m MODEL] [-t THREADS] [-p N_PROMPT] [-n N_GEN] [-r REPS] [-ub N] [-fa on|off|auto]\n"
           "                   [--llama-python PYTHON] [--no-llama]\n"
           "defaults: the cached %s, -t 2, -p 512, -n 128, -r 5, -ub 512, -fa auto\n",
           DEFAULT_MODEL);
}

static int parse(int argc, char **argv, bench_opts *o)
{
    memset(o, 0, sizeof *o);
    o->n_threads = 2, o->n_prompt = 512, o->n_gen = 128, o->reps = 5, o->n_ubatch = 512;
    o->flash_attn = TSR_FLASH_ATTN_AUTO, o->compare = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 2;
        } else if (!strcmp(a, "--no-llama")) {
            o->compare = 0;
            continue;
        }
        if (!v)
            return die(a, "needs a value (see tensr-bench -h)");
        int n = atoi(v);
        if (!strcmp(a, "-m")) o->model = v;
        else if (!strcmp(a, "--llama-python")) o->llama_python = v;
        else if (!strcmp(a, "-fa")) o->flash_attn = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? 0 : -1;
        else if (n < 0 || (n == 0 && strcmp(v, "0"))) return die(a, "expects a non-negative integer");
        else if (!strcmp(a, "-t")) o->n_threads = n;
        else if (!strcmp(a, "-p")) o->n_prompt = n;
        else if (!strcmp(a, "-n")) o->n_gen = n;
        else if (!strcmp(a, "-r")) o->reps = n > 0 ? n : 1;
        else if (!strcmp(a, "-ub")) o->n_ubatch = n > 0 ? n : 512;
        else return die(a, "unknown option (see tensr-bench -h)");
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

/* One run: tokens/s of a pp test (n_prompt tokens in one call) or a tg test
 * (n_gen single-token calls), from an empty cache. */
static tsr_status run_once(llm *m, int pp, int n, double *tps)
{
    int64_t nv = llm_get_hparams(m)->n_vocab;
    int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    float *logits = malloc((size_t)nv * sizeof *logits);
    tsr_status st = ids && logits ? TSR_OK : TSR_E_NOMEM;
    for (int i = 0; st == TSR_OK && i < n; i++)
        ids[i] = random_token(nv);
    llm_reset(m);
    double t0 = now();
    if (st == TSR_OK && pp)
        st = llm_decode(m, ids, n, n - 1, logits);
    for (int i = 0; st == TSR_OK && !pp && i < n; i++)
        st = llm_decode(m, ids + i, 1, 0, logits);
    *tps = n / (now() - t0);
    free(ids);
    free(logits);
    return st;
}

static tsr_status measure(llm *m, int pp, int n, int reps, result *r)
{
    double sum = 0, sum2 = 0, tps;
    r->mean = -1;
    if (n <= 0)
        return TSR_OK;
    tsr_status st = run_once(m, pp, n, &tps); /* warm-up */
    for (int i = 0; st == TSR_OK && i < reps; i++) {
        st = run_once(m, pp, n, &tps);
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
static void llama_side(const bench_opts *o, const char *model, int fa, result *pp, result *tg, const char **how)
{
    char cmd[8192], venv[4096];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    pp->mean = tg->mean = -1;
    *how = "unavailable (no llama-bench on PATH and no llama-cpp-python venv; tests/make-llama-refs.sh builds one)";
    if (!o->compare) {
        *how = "not measured (--no-llama)";
        return;
    }
    if (system("command -v llama-bench >/dev/null 2>&1") == 0) {
        snprintf(cmd, sizeof cmd, "llama-bench -m '%s' -t %d -p %d -n %d -r %d -ub %lld -fa %d -o jsonl 2>/dev/null",
                 model, o->n_threads, o->n_prompt, o->n_gen, o->reps, (long long)o->n_ubatch, fa);
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
             TSR_SRCDIR, model, o->n_threads, o->n_prompt, o->n_gen, o->reps, fa);
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

static void report(const bench_opts *o, const char *model, const result *ours, const result *theirs,
                   const char *how, int fa)
{
    const char *name = strrchr(model, '/') ? strrchr(model, '/') + 1 : model;
    char a[64], b[64], test[32];
    printf("| model | threads | fa | test | tensr t/s | llama.cpp t/s | ratio |\n");
    printf("| --- | ---: | ---: | --- | ---: | ---: | ---: |\n");
    for (int k = 0; k < 2; k++) {
        if (ours[k].mean < 0)
            continue;
        snprintf(test, sizeof test, "%s%d", k ? "tg" : "pp", k ? o->n_gen : o->n_prompt);
        cell(a, sizeof a, &ours[k]);
        cell(b, sizeof b, &theirs[k]);
        printf("| %s | %d | %d | %s | %s | %s | ", name, o->n_threads, fa, test, a, b);
        if (theirs[k].mean > 0)
            printf("%.2f |\n", ours[k].mean / theirs[k].mean);
        else
            printf("- |\n");
    }
    printf("\nllama.cpp: %s\n", how);
    printf("{\"model\": \"%s\", \"threads\": %d, \"flash_attn\": %d, \"n_prompt\": %d, \"n_gen\": %d, \"reps\": %d, "
           "\"tensr\": {\"pp_ts\": %.3f, \"pp_sd\": %.3f, \"tg_ts\": %.3f, \"tg_sd\": %.3f}, "
           "\"llama_cpp\": {\"how\": \"%s\", \"pp_ts\": %.3f, \"pp_sd\": %.3f, \"tg_ts\": %.3f, \"tg_sd\": %.3f}}\n",
           name, o->n_threads, fa, o->n_prompt, o->n_gen, o->reps, ours[0].mean, ours[0].sd, ours[1].mean,
           ours[1].sd, how, theirs[0].mean, theirs[0].sd, theirs[1].mean, theirs[1].sd);
}

int main(int argc, char **argv)
{
    bench_opts o;
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc == 2 ? 0 : 1;
    char path[4096];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (!o.model) {
        if (xdg && *xdg)
            snprintf(path, sizeof path, "%s/libtensr/%s", xdg, DEFAULT_MODEL);
        else
            snprintf(path, sizeof path, "%s/.cache/libtensr/%s", home ? home : ".", DEFAULT_MODEL);
        o.model = path;
    }
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = o.n_threads;
    bp.flash_attn = o.flash_attn;
    llm_params lp;
    llm_params_default(&lp);
    lp.n_ctx = o.n_prompt + o.n_gen > 0 ? o.n_prompt + o.n_gen : 1;
    lp.n_ubatch = o.n_ubatch;
    tsr_backend *be = NULL;
    llm *m = NULL;
    result ours[2], theirs[2];
    const char *how;
    if (tsr_backend_new(&bp, &be) != TSR_OK)
        rc = die("backend", tsr_last_error());
    else if (llm_open(be, o.model, NULL, &lp, &m) != TSR_OK)
        rc = die(o.model, llm_last_error());
    else if (measure(m, 1, o.n_prompt, o.reps, &ours[0]) != TSR_OK || measure(m, 0, o.n_gen, o.reps, &ours[1]))
        rc = die("decode", llm_last_error());
    int fa = be ? tsr_backend_flash_attn(be) : 0;
    llm_free(m);
    tsr_backend_free(be);
    if (rc == 0) {
        llama_side(&o, o.model, fa, &theirs[0], &theirs[1], &how);
        report(&o, o.model, ours, theirs, how, fa);
    }
    return rc;
}
