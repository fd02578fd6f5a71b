/*
 * test-fit.c - one tsr_fit scenario on the fake devices of TSR_FAKE_DEVICES
 * (tests/test-fit.sh runs the scenarios, one process each: the fake devices
 * are read once per process). Usage:
 *   test-fit MODEL LABEL [-ngl N] [-ts a,b] [-ot SPEC] [-c N] [--margin B,...]
 *            [--ctx-min N] [--speed] [--keep-ctx] [--expect ok|nomem]
 * With --expect ok (the default) it checks that
 *  - the placement fits: the model loads with it and tsr_session_new
 *    succeeds, the backend's real plan per device equals the fit's (less
 *    the stream memory the fit adds), and no fake device has more memory
 *    in use than the fit planned for it;
 *  - it is maximal (devices with margin 0, so the real planner judges): one
 *    more GPU layer does not load, with several GPUs and the fit's own
 *    split not on any one of them either (the others keeping their layer
 *    counts), and when the fit put experts of n layers in system memory,
 *    n - 1 do not fit either;
 *  - with --check-ctx 1 (a dense model whose context shrank), a context
 *    one step (256 cells) larger with the same placement does not fit,
 *    as the planner of tsr_fit itself says (system memory is the fit's);
 *  - with --old-abi 1: tsr_fit_params and tsr_fit_result as a caller
 *    compiled against an older header fills them (smaller sizes, garbage
 *    past them): defaults for the missing fields, nothing written past;
 *  - the caller's constraints were kept (its -ngl, -ts, its overrides first,
 *    n_ctx at most the one asked and at least the floor);
 * and prints one row of the scenario table (devices, model, flags,
 * placement, planned vs measured bytes per device, time of the fit).
 * With --expect nomem: TSR_E_DEVICE_NOMEM whose detail names a device and
 * the bytes missing.
 */
#include "libtensr.h"
#include "tsrtest.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define SLACK (16u << 10) /* fake allocation headers and padding per device */

static const char *g_model;

typedef struct scen {
    const char *model, *label, *ot, *expect;
    int ngl, keep_ngl, speed, keep_ctx, check_ctx, old_abi;
    float ts[TSR_FIT_MAX_DEVICES];
    int n_ts;
    int64_t ctx, ctx_min;
    size_t margins[TSR_FIT_MAX_DEVICES];
    size_t n_margins;
    tsr_buft_override *ov;
} scen;

static void parse_list(const char *s, double *out, int *n) {
    *n = 0;
    for (char *end; *s && *n < TSR_FIT_MAX_DEVICES; s = *end ? end + 1 : end) out[(*n)++] = strtod(s, &end);
}

static int parse_args(int argc, char **argv, scen *sc) {
    memset(sc, 0, sizeof *sc);
    sc->expect = "ok";
    sc->ctx_min = 4096;
    if (argc < 3)
        return 0;
    sc->model = argv[1];
    sc->label = argv[2];
    for (int i = 3; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        double vals[TSR_FIT_MAX_DEVICES];
        int n;
        if (!strcmp(k, "-ngl"))
            sc->ngl = atoi(v), sc->keep_ngl = 1;
        else if (!strcmp(k, "-ts")) {
            parse_list(v, vals, &n);
            for (int j = 0; j < n; j++) sc->ts[j] = (float)vals[j];
            sc->n_ts = n;
        } else if (!strcmp(k, "-ot"))
            sc->ot = v;
        else if (!strcmp(k, "-c"))
            sc->ctx = atoll(v);
        else if (!strcmp(k, "--ctx-min"))
            sc->ctx_min = atoll(v);
        else if (!strcmp(k, "--margin")) {
            parse_list(v, vals, &n);
            for (int j = 0; j < n; j++) sc->margins[j] = (size_t)vals[j];
            sc->n_margins = (size_t)n;
        } else if (!strcmp(k, "--speed"))
            sc->speed = atoi(v);
        else if (!strcmp(k, "--keep-ctx"))
            sc->keep_ctx = atoi(v);
        else if (!strcmp(k, "--check-ctx"))
            sc->check_ctx = atoi(v);
        else if (!strcmp(k, "--old-abi"))
            sc->old_abi = atoi(v);
        else if (!strcmp(k, "--expect"))
            sc->expect = v;
        else
            return 0;
    }
    return 1;
}

static void setup(const scen *sc, tsr_load_params *lp, tsr_session_params *sp, tsr_fit_params *fp) {
    tsr_load_params_init(lp, sizeof *lp);
    tsr_session_params_init(sp, sizeof *sp);
    tsr_fit_params_init(fp, sizeof *fp);
    lp->n_gpu_layers = sc->ngl;
    lp->tensor_split = sc->n_ts ? sc->ts : NULL;
    lp->overrides = sc->ov;
    sp->n_ctx = sc->ctx;
    fp->keep_n_gpu_layers = sc->keep_ngl;
    fp->keep_n_ctx = sc->keep_ctx;
    fp->n_ctx_min = sc->ctx_min;
    fp->prefer = sc->speed ? TSR_FIT_PREFER_SPEED : TSR_FIT_PREFER_CONTEXT;
    fp->margins = sc->n_margins ? sc->margins : NULL;
    fp->n_margins = sc->n_margins;
    fp->gpu_margin = 0; /* the real planner judges maximality: no margin unless given */
}

/* Loads with the placement (ngl and n_cpu_moe possibly changed); the
 * status of load + session. used[d]: device memory in use afterwards;
 * plan[d]: the backend's plan. */
static tsr_status load_split(const tsr_fit_result *r, const tsr_session_params *sp0, int ngl, const float *split,
                             const tsr_buft_override *ov, size_t *used, size_t *plan, int *layers) {
    tsr_backend *b = NULL;
    tsr_status st = tsr_backend_new(NULL, &b);
    if (st != TSR_OK)
        return st;
    tsr_load_params lp;
    tsr_load_params_init(&lp, sizeof lp);
    lp.n_gpu_layers = ngl;
    lp.tensor_split = split;
    lp.overrides = ov;
    tsr_session_params sp = *sp0;
    sp.n_ctx = r->n_ctx;
    tsr_model *m = NULL;
    tsr_session *s = NULL;
    st = tsr_model_load(b, g_model, &lp, &m);
    if (st == TSR_OK)
        st = tsr_session_new(m, &sp, &s);
    for (size_t d = 0; used && st == TSR_OK && d < tsr_backend_n_devices(b); d++) {
        size_t fr = 0, tot = 0, w = 0, kv = 0, c = 0;
        tsr_device_memory(tsr_backend_device(b, d), &fr, &tot);
        tsr_backend_memory_plan(b, d, &w, &kv, &c);
        used[d] = tot - fr;
        plan[d] = w + kv + c;
    }
    for (size_t d = 0; layers && st == TSR_OK && d < tsr_backend_n_devices(b); d++) {
        layers[d] = 0;
        for (int il = 0; il < r->n_layers; il++)
            layers[d] += tsr_backend_layer_buffer_type(b, il) == tsr_device_buffer_type(tsr_backend_device(b, d));
    }
    tsr_session_free(s);
    tsr_model_free(m);
    tsr_backend_free(b);
    return st;
}

static tsr_status load_with(const tsr_fit_result *r, const tsr_session_params *sp0, int ngl,
                            const tsr_buft_override *ov, size_t *used, size_t *plan) {
    return load_split(r, sp0, ngl, r->tensor_split, ov, used, plan, NULL);
}

/* Several GPUs and the fit's own split: one more layer on any one GPU
 * (the others keeping theirs: a split of whole layer counts, which the
 * placement follows exactly) does not fit either. */
static void check_split_maximal(const scen *sc, const tsr_fit_result *r, const tsr_session_params *sp,
                                const int *layers) {
    size_t n_gpu = r->n_devices - 1;
    for (size_t g = 0; g < n_gpu; g++) {
        float split[TSR_FIT_MAX_DEVICES] = {0};
        for (size_t h = 0; h < n_gpu; h++) split[h] = (float)(layers[h] + (h == g));
        tsr_status st = load_split(r, sp, r->n_gpu_layers + 1, split, r->overrides, NULL, NULL, NULL);
        CHECK(st == TSR_E_DEVICE_NOMEM, "%s: one more layer on %s (%d) loads too (%s): the split is not maximal",
              sc->label, tsr_device_name(tsr_device_get(g)), layers[g] + 1, tsr_status_string(st));
    }
}

/* The result's overrides with the fit's expert pattern for one layer fewer. */
static tsr_buft_override *fewer_experts(const tsr_fit_result *r, const scen *sc, char *pat, size_t cap) {
    size_t n = 0;
    while (r->overrides && r->overrides[n].pattern) n++;
    tsr_buft_override *ov = calloc(n + 1, sizeof *ov);
    memcpy(ov, r->overrides, n * sizeof *ov);
    /* the fit's pattern is the last one; rebuild it for layers n_layers - e + 1 .. */
    int first = r->n_layers - r->n_cpu_moe + 1;
    size_t len = (size_t)snprintf(pat, cap, "blk\\.(");
    for (int il = first; il < r->n_layers && len < cap; il++)
        len += (size_t)snprintf(pat + len, cap - len, "%s%d", il > first ? "|" : "", il);
    snprintf(pat + len, cap - len, ")\\.ffn_.*_exps");
    if (first < r->n_layers)
        ov[n - 1].pattern = pat;
    else
        ov[n - 1] = (tsr_buft_override){NULL, NULL};
    (void)sc;
    return ov;
}

static void check_constraints(const scen *sc, const tsr_fit_result *r, int64_t ctx_hi) {
    if (sc->keep_ngl)
        CHECK(r->n_gpu_layers == sc->ngl, "-ngl %d given, fit returned %d", sc->ngl, r->n_gpu_layers);
    for (int g = 0; g < sc->n_ts; g++)
        CHECK(r->tensor_split[g] == sc->ts[g], "-ts kept: [%d] %g vs %g", g, r->tensor_split[g], sc->ts[g]);
    for (size_t i = 0; sc->ov && sc->ov[i].pattern; i++)
        CHECK(r->overrides && r->overrides[i].pattern && !strcmp(r->overrides[i].pattern, sc->ov[i].pattern) &&
                  r->overrides[i].buft == sc->ov[i].buft,
              "the caller's override %zu (%s) is not kept first", i, sc->ov[i].pattern);
    CHECK(r->n_ctx <= ctx_hi, "n_ctx %lld above the %lld asked", (long long)r->n_ctx, (long long)ctx_hi);
    if (sc->keep_ctx)
        CHECK(r->n_ctx == ctx_hi, "n_ctx %lld, kept %lld asked", (long long)r->n_ctx, (long long)ctx_hi);
    CHECK(r->n_ctx >= (ctx_hi < sc->ctx_min ? ctx_hi : sc->ctx_min), "n_ctx %lld below the floor", (long long)r->n_ctx);
}

static void print_row(const scen *sc, const tsr_fit_result *r, const size_t *used, const size_t *plan) {
    char flags[4096];
    size_t len;
    CHECK_OK(tsr_fit_result_flags(r, flags, sizeof flags, &len));
    const char *devs = getenv("TSR_FAKE_DEVICES"), *sys = getenv("TSR_FIT_SYSMEM");
    printf("| %s | %s%s%s | %s | %s%s%s | %s | ", sc->label, devs ? devs : "-", sys ? " sys:" : "", sys ? sys : "",
           strrchr(sc->model, '/') ? strrchr(sc->model, '/') + 1 : sc->model, sc->keep_ngl ? "-ngl " : "",
           sc->keep_ngl ? "(kept)" : "", sc->ot ? sc->ot : "", flags);
    for (size_t d = 0; d < r->n_devices; d++) {
        tsr_device *dev = tsr_device_get(d);
        printf("%s%s %.2f/%.2f of %.2f", d ? ", " : "", tsr_device_name(dev), r->planned[d] / 1048576.0,
               (tsr_device_kind(dev) == TSR_DEVICE_CPU ? plan[d] : used[d]) / 1048576.0, r->available[d] / 1048576.0);
    }
    printf(" | %.1f ms (%d plans) |\n", r->seconds * 1e3, r->n_candidates);
}

/* The model's training context (a vocabulary-only load). */
static int64_t train_ctx(const char *path) {
    tsr_load_params lp;
    tsr_load_params_init(&lp, sizeof lp);
    lp.vocab_only = 1;
    tsr_model *m = NULL;
    CHECK_OK(tsr_model_load(NULL, path, &lp, &m));
    int64_t n = m ? tsr_model_n_ctx_train(m) : 0;
    tsr_model_free(m);
    return n;
}

/* A context one step larger with the placement kept does not fit. */
static void check_ctx_maximal(const scen *sc, const tsr_fit_result *r, const tsr_load_params *lp0,
                              const tsr_session_params *sp0, const tsr_fit_params *fp0) {
    tsr_load_params lp = *lp0;
    tsr_session_params sp = *sp0;
    tsr_fit_params fp = *fp0;
    lp.n_gpu_layers = r->n_gpu_layers;
    lp.tensor_split = r->tensor_split;
    lp.overrides = r->overrides;
    sp.n_ctx = r->n_ctx + (r->n_ctx >= 256 ? 256 : 1);
    fp.keep_n_gpu_layers = fp.keep_n_ctx = 1;
    tsr_fit_result r2;
    memset(&r2, 0, sizeof r2);
    r2.size = sizeof r2;
    tsr_status st = tsr_fit(sc->model, NULL, &lp, &sp, &fp, &r2);
    CHECK(st == TSR_E_DEVICE_NOMEM, "%s: n_ctx %lld fits too (%s): the context is not maximal", sc->label,
          (long long)sp.n_ctx, tsr_status_string(st));
    tsr_fit_result_free(&r2);
}

/* Fits, loads with it, and shows the next step would not fit. */
static void run_ok(const scen *sc, const tsr_fit_result *r, const tsr_session_params *sp) {
    size_t used[TSR_FIT_MAX_DEVICES] = {0}, plan[TSR_FIT_MAX_DEVICES] = {0};
    int layers[TSR_FIT_MAX_DEVICES] = {0};
    tsr_status st = load_split(r, sp, r->n_gpu_layers, r->tensor_split, r->overrides, used, plan, layers);
    CHECK(st == TSR_OK, "%s: the fit's placement does not load: %s", sc->label, tsr_last_error());
    for (size_t d = 0; st == TSR_OK && d < r->n_devices; d++) {
        tsr_device *dev = tsr_device_get(d);
        CHECK(plan[d] <= r->planned[d], "%s: %s plans %zu bytes, the fit %zu", sc->label, tsr_device_name(dev), plan[d],
              r->planned[d]);
        if (tsr_device_kind(dev) != TSR_DEVICE_CPU)
            CHECK(used[d] <= r->planned[d] + SLACK, "%s: %s has %zu bytes in use, the fit planned %zu", sc->label,
                  tsr_device_name(dev), used[d], r->planned[d]);
    }
    print_row(sc, r, used, plan);
    bool gpu_bound = r->n_devices > 1 && !getenv("TSR_FIT_SYSMEM") && !getenv("TSR_FIT_PROC_ROOT");
    if (!gpu_bound || sc->n_margins)
        return; /* maximality by the real planner needs margin 0 and the devices binding */
    if (!sc->keep_ngl && r->n_gpu_layers < r->n_layers) {
        st = load_with(r, sp, r->n_gpu_layers + 1, r->overrides, NULL, NULL);
        CHECK(st == TSR_E_DEVICE_NOMEM, "%s: one more layer (%d) loads too (%s): the fit is not maximal", sc->label,
              r->n_gpu_layers + 1, tsr_status_string(st));
        if (r->n_devices > 2 && !sc->n_ts)
            check_split_maximal(sc, r, sp, layers);
    }
    if (r->n_cpu_moe > 0) {
        char pat[2048];
        tsr_buft_override *ov = fewer_experts(r, sc, pat, sizeof pat);
        st = load_with(r, sp, r->n_gpu_layers, ov, NULL, NULL);
        CHECK(st == TSR_E_DEVICE_NOMEM, "%s: experts of one layer fewer in system memory load too (%s)", sc->label,
              tsr_status_string(st));
        free(ov);
    }
}

/* As a caller compiled against an older header: tsr_fit_params without
 * prefer/keep_* (size up to n_ctx_min) and a result that ends before
 * tensor_split, garbage past both sizes: the fit reads the defaults for
 * the missing fields and writes nothing past the result's size. */
static void old_abi(const scen *sc) {
    unsigned char raw_fp[sizeof(tsr_fit_params) + 64], raw_r[sizeof(tsr_fit_result) + 64];
    memset(raw_fp, 0xA5, sizeof raw_fp);
    memset(raw_r, 0xA5, sizeof raw_r);
    tsr_fit_params *fp = (tsr_fit_params *)raw_fp;
    size_t fp_size = offsetof(tsr_fit_params, n_ctx_min) + sizeof fp->n_ctx_min;
    tsr_fit_params_init(fp, fp_size);
    for (size_t i = fp_size; i < sizeof raw_fp; i++)
        CHECK(raw_fp[i] == 0xA5, "tsr_fit_params_init wrote byte %zu past the caller's size %zu", i, fp_size);
    fp->gpu_margin = 0;
    tsr_fit_result *r = (tsr_fit_result *)raw_r;
    r->size = offsetof(tsr_fit_result, tensor_split);
    tsr_status st = tsr_fit(sc->model, NULL, NULL, NULL, fp, r);
    CHECK(st == TSR_OK, "old-size fit: %s", tsr_last_error());
    for (size_t i = r->size; i < sizeof raw_r; i++)
        CHECK(raw_r[i] == 0xA5, "tsr_fit wrote byte %zu past the result's size %zu", i, r->size);
    CHECK(r->n_ctx > 0 && r->n_gpu_layers >= 0, "old-size result: n_gpu_layers %d n_ctx %lld", r->n_gpu_layers,
          (long long)r->n_ctx);
    tsr_fit_result_free(r); /* no overrides field: a no-op */
    size_t len;
    CHECK_STATUS(tsr_fit_result_flags(r, NULL, 0, &len), TSR_E_INVALID); /* too old to hold the placement */
}

int main(int argc, char **argv) {
    scen sc;
    if (!parse_args(argc, argv, &sc)) {
        fprintf(stderr, "usage: test-fit MODEL LABEL [-ngl N] [-ts a,b] [-ot SPEC] [-c N] [--margin B,...] "
                        "[--ctx-min N] [--speed 1] [--keep-ctx 1] [--expect ok|nomem]\n");
        return 2;
    }
    g_model = sc.model;
    if (sc.old_abi) {
        old_abi(&sc);
        return tsrtest_done(sc.label);
    }
    if (sc.ot)
        CHECK_OK(tsr_buft_overrides_parse(sc.ot, &sc.ov));
    tsr_load_params lp;
    tsr_session_params sp;
    tsr_fit_params fp;
    setup(&sc, &lp, &sp, &fp);
    tsr_load_params lp0 = lp;
    tsr_session_params sp0 = sp;
    tsr_fit_result r;
    memset(&r, 0, sizeof r);
    r.size = sizeof r;
    tsr_status st = tsr_fit(sc.model, NULL, &lp, &sp, &fp, &r);
    CHECK(!memcmp(&lp, &lp0, sizeof lp) && !memcmp(&sp, &sp0, sizeof sp), "tsr_fit changed the caller's params");
    if (!strcmp(sc.expect, "nomem")) {
        const char *e = tsr_last_error();
        CHECK(st == TSR_E_DEVICE_NOMEM, "%s: expected TSR_E_DEVICE_NOMEM, got %s", sc.label, tsr_status_string(st));
        CHECK(strstr(e, "missing") && strstr(e, "bytes") && (strstr(e, "FAKE") || strstr(e, "CPU")),
              "%s: the error names no device or bytes missing: %s", sc.label, e);
        printf("| %s | %s%s%s | %s | %s%s | %s | - | - |\n", sc.label, getenv("TSR_FAKE_DEVICES"),
               getenv("TSR_FIT_SYSMEM") ? " sys:" : "", getenv("TSR_FIT_SYSMEM") ? getenv("TSR_FIT_SYSMEM") : "",
               strrchr(sc.model, '/') + 1, sc.keep_ngl ? "-ngl (kept) " : "", sc.ot ? sc.ot : "", e);
    } else {
        CHECK(st == TSR_OK, "%s: tsr_fit: %s", sc.label, tsr_last_error());
        if (st == TSR_OK) {
            check_constraints(&sc, &r, sc.ctx ? sc.ctx : train_ctx(sc.model));
            run_ok(&sc, &r, &sp);
            if (sc.check_ctx && r.n_ctx < (sc.ctx ? sc.ctx : train_ctx(sc.model)))
                check_ctx_maximal(&sc, &r, &lp, &sp, &fp);
        }
    }
    tsr_fit_result_free(&r);
    tsr_buft_overrides_free(sc.ov);
    return tsrtest_done(sc.label);
}
