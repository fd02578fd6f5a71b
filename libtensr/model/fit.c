/*
 * fit.c - tsr_fit: the largest placement of a model that fits the devices
 * and system memory, found by dry runs of the real planner.
 *
 * One planning backend (tsr__backend_set_plan_mode) over the caller's
 * devices costs every candidate: tsr_model_load with plan_only places the
 * weights (declared, never read or allocated), tsr_session_new plans the KV
 * cache and measures the worst micro-batch's compute buffers, the devices
 * report what their streams hold beside buffers (cuBLAS workspace,
 * scratch), and the plan per device is compared with what the fit has: the
 * device's free memory (read before the planning backend exists) less its
 * margin; for the CPU, system memory (MemAvailable, cgroup) less the host
 * margin. CPU-resident weights count in full whether they will be mapped or
 * read: a mapping needs them as page cache.
 *
 * A candidate is (n_gpu_layers, n_cpu_moe, n_ctx): the caller's overrides
 * always come first, then "blk\.(...)\.ffn_.*_exps" = CPU for the last
 * n_cpu_moe layers. The order of retreat: routed experts to system memory
 * (layer by layer from the last), then fewer GPU layers, then a smaller
 * context down to the floor; TSR_FIT_PREFER_SPEED shrinks the context first.
 * Each step is a binary search (the plan grows with each of the three).
 * With several GPUs and no split from the caller, a partial offload ends
 * with the split as whole layer counts, each GPU given one more layer while
 * one fits there (fill_split), so no GPU keeps room for another layer.
 *
 * Free memory is read as it is at the call: a backend the caller made
 * before already holds its streams' workspace and scratch, which the plan
 * counts again, so callers fit first and make their backend after.
 */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FIT_MAX TSR_FIT_MAX_DEVICES
#define FIT_PAT_MAX 2048

typedef struct fit_cand {
    int ngl, n_cpu_moe;
    int64_t n_ctx;
} fit_cand;

typedef struct fit_state {
    const char *path;
    tsr_backend *b;
    tsr_load_params lp;
    tsr_session_params sp;
    tsr_fit_params fp;
    size_t n_dev, n_gpu, host;
    size_t avail[FIT_MAX], free_mem[FIT_MAX], margin[FIT_MAX];
    size_t need[FIT_MAX];  /* of the last candidate costed */
    size_t fixed[FIT_MAX]; /* its compute buffer and stream memory (what is not weights or KV) */
    float split[FIT_MAX];
    const tsr_buft_override *user_ov;
    size_t n_user_ov;
    int n_layers, n_exp_layers; /* n_exp_layers: layers with routed experts */
    int64_t n_ctx_train;
    int n_candidates;
    int ngl_min, ngl_max;     /* the GPU layer counts the caller allows */
    tsr_gguf *gguf;           /* the model file, parsed once */
    size_t reg_free[FIT_MAX]; /* free memory of the registry's devices before the planning backend */
} fit_state;

void tsr_fit_params_init(tsr_fit_params *p, size_t size) {
    if (!p || size < sizeof(size_t))
        return;
    tsr_fit_params d;
    memset(&d, 0, sizeof d);
    d.gpu_margin = (size_t)1 << 30;
    d.host_margin = 0;
    d.n_ctx_min = 4096;
    d.prefer = TSR_FIT_PREFER_CONTEXT;
    d.size = size < sizeof d ? size : sizeof d;
    memcpy(p, &d, d.size);
    p->size = size;
}

/* The caller's struct over the defaults (only the fields it knows). */
static void read_over(void *out, size_t out_size, const void *in) {
    if (!in || *(const size_t *)in <= sizeof(size_t))
        return;
    size_t n = *(const size_t *)in < out_size ? *(const size_t *)in : out_size;
    memcpy((char *)out + sizeof(size_t), (const char *)in + sizeof(size_t), n - sizeof(size_t));
}

/* "2[0-9]|30|31": layers [a, b) as decades where whole. */
static void layer_alternation(int a, int b, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int il = a; il < b && len < cap;) {
        const char *sep = len ? "|" : "";
        int n;
        if (il % 10 == 0 && il >= 10 && il + 10 <= b) {
            n = snprintf(buf + len, cap - len, "%s%d[0-9]", sep, il / 10);
            il += 10;
        } else {
            n = snprintf(buf + len, cap - len, "%s%d", sep, il);
            il++;
        }
        len += n > 0 ? (size_t)n : 0;
    }
}

/* The fit's expert pattern for the last n_cpu_moe layers (buf "" when none). */
static void expert_pattern(const fit_state *st, int n_cpu_moe, char *buf, size_t cap) {
    buf[0] = '\0';
    if (n_cpu_moe <= 0)
        return;
    char alt[FIT_PAT_MAX - 64];
    layer_alternation(st->n_layers - n_cpu_moe, st->n_layers, alt, sizeof alt);
    snprintf(buf, cap, "blk\\.(%s)\\.ffn_.*_exps", alt);
}

/* The caller's overrides, then the fit's pattern: a list into ov (n_user_ov + 2 entries). */
static void build_overrides(const fit_state *st, const char *pattern, tsr_buft_override *ov) {
    for (size_t i = 0; i < st->n_user_ov; i++) ov[i] = st->user_ov[i];
    size_t n = st->n_user_ov;
    if (pattern[0])
        ov[n++] = (tsr_buft_override){pattern, tsr_buffer_type_by_name("CPU")};
    ov[n] = (tsr_buft_override){NULL, NULL};
}

/* Learns the model's shape from the first dry run's declared weights. */
static void learn_model(fit_state *st, const tsr_model *m) {
    st->n_layers = tsr_backend_n_layers(st->b);
    st->n_ctx_train = tsr_model_n_ctx_train(m);
    int last = -1;
    st->n_exp_layers = 0;
    for (size_t i = 0; i < tsr_backend_n_weights(st->b); i++) {
        const char *name = tsr_tensor_name(tsr_backend_weight_at(st->b, i));
        int il = -1;
        if (strstr(name, "_exps") && sscanf(name, "blk.%d.", &il) == 1 && il != last) {
            st->n_exp_layers++;
            last = il;
        }
    }
}

/* The session and plan of one candidate; st->need filled. */
static tsr_status plan_session(fit_state *st, tsr_model *m, int64_t n_ctx) {
    tsr_session_params sp = st->sp;
    sp.n_ctx = n_ctx;
    tsr_session *s = NULL;
    tsr_status rc = tsr_session_new(m, &sp, &s);
    for (size_t d = 0; rc == TSR_OK && d < st->n_dev; d++) {
        size_t w = 0, kv = 0, c = 0;
        tsr_backend_memory_plan(st->b, d, &w, &kv, &c);
        st->fixed[d] = c + tsr__backend_plan_stream(st->b, d);
        st->need[d] = w + kv + st->fixed[d];
    }
    tsr_session_free(s);
    return rc;
}

/* Costs candidate c with the planner (st->need). */
static tsr_status cost(fit_state *st, const fit_cand *c) {
    char pattern[FIT_PAT_MAX];
    expert_pattern(st, c->n_cpu_moe, pattern, sizeof pattern);
    tsr_buft_override *ov = tsr__calloc(st->n_user_ov + 2, sizeof *ov);
    if (!ov)
        return tsr__error(TSR_E_NOMEM, "tsr_fit: out of host memory");
    build_overrides(st, pattern, ov);
    tsr_load_params lp = st->lp;
    lp.n_gpu_layers = c->ngl;
    lp.tensor_split = st->n_gpu ? st->split : NULL;
    lp.overrides = ov;
    tsr__backend_plan_reset(st->b);
    tsr_model *m = NULL;
    tsr_status rc = tsr_model_load(st->b, st->path, &lp, &m);
    if (rc == TSR_OK && st->n_candidates == 0)
        learn_model(st, m);
    if (rc == TSR_OK)
        rc = plan_session(st, m, c->n_ctx < 0 ? 0 : c->n_ctx);
    tsr_model_free(m);
    tsr__free(ov);
    st->n_candidates++;
    return rc;
}

static bool fits(const fit_state *st) {
    for (size_t d = 0; d < st->n_dev; d++)
        if (st->need[d] > st->avail[d])
            return false;
    return true;
}

/* Costs c: *ok when it fits. */
static tsr_status try_cand(fit_state *st, const fit_cand *c, bool *ok) {
    tsr_status rc = cost(st, c);
    *ok = rc == TSR_OK && fits(st);
    return rc;
}

/* Largest v in [lo, hi] with make(v) fitting, given that lo fits and hi
 * does not (monotone): binary search. field: which part of c varies. */
typedef enum { VARY_NGL, VARY_MOE_DOWN, VARY_CTX } fit_vary;

static void set_field(fit_cand *c, fit_vary what, int64_t v) {
    if (what == VARY_NGL)
        c->ngl = (int)v;
    else if (what == VARY_MOE_DOWN)
        c->n_cpu_moe = (int)-v; /* fewer experts off is "larger" */
    else
        c->n_ctx = v;
}

static tsr_status search(fit_state *st, fit_cand *c, fit_vary what, int64_t lo, int64_t hi, int64_t step) {
    while (hi - lo > step) {
        int64_t mid = lo + (hi - lo) / 2;
        mid -= (mid - lo) % step;
        if (mid <= lo)
            mid = lo + step;
        fit_cand t = *c;
        set_field(&t, what, mid);
        bool ok;
        tsr_status rc = try_cand(st, &t, &ok);
        if (rc != TSR_OK)
            return rc;
        if (ok)
            lo = mid;
        else
            hi = mid;
    }
    set_field(c, what, lo);
    return TSR_OK;
}

/* GPU layers per GPU for n_gpu_layers ngl and st->split, as the planner
 * places them (tsr__place_layers: layer j of the ngl goes to the first GPU
 * whose share of the cumulated split exceeds j / ngl). */
static void layer_counts(const fit_state *st, int ngl, int *counts) {
    double cum[FIT_MAX], sum = 0;
    for (size_t g = 0; g < st->n_gpu; g++) cum[g] = sum += st->split[g];
    for (size_t g = 0; g < st->n_gpu; g++) counts[g] = 0;
    for (int j = 0; j < ngl; j++) {
        size_t g = sum > 0 ? 0 : (size_t)st->lp.main_gpu;
        while (sum > 0 && g + 1 < st->n_gpu && !((double)j / ngl < cum[g] / sum)) g++;
        if (g < st->n_gpu)
            counts[g]++;
    }
}

/* Several GPUs and the fit's own split: the split was drawn from each GPU's
 * room at full offload, which a partial offload does not see (the output
 * layer and its compute buffer then stay on the CPU), so after the search
 * for the layer count the split becomes whole layer counts and each GPU
 * takes one more layer for as long as one fits there: no GPU is left with
 * room for another layer (the others keeping theirs). */
static tsr_status fill_split(fit_state *st, fit_cand *c) {
    if (st->n_gpu < 2 || st->lp.tensor_split || st->fp.keep_n_gpu_layers || c->ngl >= st->n_layers)
        return TSR_OK;
    int counts[FIT_MAX];
    float before[FIT_MAX];
    layer_counts(st, c->ngl, counts);
    for (size_t g = 0; g < st->n_gpu; g++) before[g] = st->split[g], st->split[g] = (float)counts[g];
    for (bool grew = true; grew;) {
        grew = false;
        for (size_t g = 0; g < st->n_gpu && c->ngl < st->n_layers; g++) {
            fit_cand t = *c;
            t.ngl++;
            st->split[g] += 1;
            bool ok;
            tsr_status rc = try_cand(st, &t, &ok);
            if (rc != TSR_OK)
                return rc;
            if (ok)
                *c = t, grew = true;
            else
                st->split[g] -= 1;
        }
    }
    for (size_t g = 0; c->ngl == 0 && g < st->n_gpu; g++) st->split[g] = before[g]; /* no layer: no counts to show */
    return TSR_OK;
}

/* The largest (ngl, n_cpu_moe) at context c->n_ctx: *found false when not
 * even the smallest fits. c->ngl comes in as the most allowed. */
static tsr_status place_at(fit_state *st, fit_cand *c, int ngl_min, bool *found) {
    bool ok;
    c->n_cpu_moe = 0;
    tsr_status rc = try_cand(st, c, &ok);
    if (rc != TSR_OK || (*found = ok))
        return rc;
    int e_all = st->n_gpu && st->n_exp_layers ? st->n_layers : 0;
    if (e_all) { /* experts off from the last layer: the fewest that fit */
        fit_cand t = *c;
        t.n_cpu_moe = e_all;
        if ((rc = try_cand(st, &t, &ok)) != TSR_OK)
            return rc;
        if (ok) {
            *found = true;
            return search(st, c, VARY_MOE_DOWN, -e_all, 0, 1);
        }
        c->n_cpu_moe = e_all;
    }
    if (c->ngl <= ngl_min)
        return TSR_OK;
    fit_cand t = *c;
    t.ngl = ngl_min;
    if ((rc = try_cand(st, &t, &ok)) != TSR_OK || !(*found = ok))
        return rc;
    if ((rc = search(st, c, VARY_NGL, ngl_min, c->ngl, 1)) != TSR_OK || (rc = fill_split(st, c)) != TSR_OK || !e_all)
        return rc;
    /* with fewer GPU layers, some of their experts may come back: experts
     * of CPU layers are in system memory anyway (n_cpu_moe <= ngl) */
    c->n_cpu_moe = c->ngl < e_all ? c->ngl : e_all;
    t = *c;
    t.n_cpu_moe = 0;
    if (c->n_cpu_moe == 0 || (rc = try_cand(st, &t, &ok)) != TSR_OK)
        return rc;
    if (ok) {
        *c = t;
        return TSR_OK;
    }
    return search(st, c, VARY_MOE_DOWN, -c->n_cpu_moe, 0, 1);
}

static int64_t ctx_floor(const fit_state *st, int64_t ctx_hi) {
    if (st->fp.keep_n_ctx || ctx_hi <= st->fp.n_ctx_min)
        return ctx_hi;
    return st->fp.n_ctx_min > 0 ? st->fp.n_ctx_min : 1;
}

static tsr_status fail_smallest(fit_state *st, const fit_cand *c);

/* The search: speed (smallest context first, then grow it) or context. */
static tsr_status fit_search(fit_state *st, fit_cand *c, int ngl_max, int ngl_min, int64_t ctx_hi) {
    int64_t ctx_lo = ctx_floor(st, ctx_hi);
    bool found;
    tsr_status rc;
    c->ngl = ngl_max;
    c->n_ctx = st->fp.prefer == TSR_FIT_PREFER_SPEED ? ctx_lo : ctx_hi;
    if ((rc = place_at(st, c, ngl_min, &found)) != TSR_OK)
        return rc;
    if (found && st->fp.prefer == TSR_FIT_PREFER_SPEED && ctx_hi > ctx_lo) {
        fit_cand t = *c;
        t.n_ctx = ctx_hi;
        bool ok;
        if ((rc = try_cand(st, &t, &ok)) != TSR_OK)
            return rc;
        return ok ? (*c = t, TSR_OK) : search(st, c, VARY_CTX, ctx_lo, ctx_hi, ctx_lo < 256 ? 1 : 256);
    }
    if (found || ctx_lo == ctx_hi)
        return found ? TSR_OK : fail_smallest(st, c);
    /* context preferred, and nothing fits at full context: the largest context
     * the smallest placement allows, then the largest placement there */
    fit_cand t = {ngl_min, c->n_cpu_moe, ctx_lo};
    bool ok;
    if ((rc = try_cand(st, &t, &ok)) != TSR_OK)
        return rc;
    if (!ok)
        return fail_smallest(st, &t);
    if ((rc = search(st, &t, VARY_CTX, ctx_lo, ctx_hi, ctx_lo < 256 ? 1 : 256)) != TSR_OK)
        return rc;
    c->ngl = ngl_max;
    c->n_ctx = t.n_ctx;
    if ((rc = place_at(st, c, ngl_min, &found)) != TSR_OK)
        return rc;
    return found ? TSR_OK : fail_smallest(st, c);
}

/* Bytes missing over all devices for the last candidate costed. */
static double missing(const fit_state *st) {
    double m = 0;
    for (size_t d = 0; d < st->n_dev; d++)
        if (st->need[d] > st->avail[d])
            m += (double)(st->need[d] - st->avail[d]);
    return m;
}

/* TSR_E_DEVICE_NOMEM: nothing the caller allows fits. The detail shows the
 * closest of the smallest candidates (c's context, all experts in system
 * memory, the fewest or the most GPU layers allowed: the first empties the
 * GPUs, the second system memory) and every device short of memory. */
static tsr_status fail_smallest(fit_state *st, const fit_cand *c) {
    fit_cand lo = {st->ngl_min, st->n_gpu && st->n_exp_layers ? st->n_layers : 0, c->n_ctx}, hi = lo;
    hi.ngl = st->ngl_max;
    tsr_status rc = cost(st, &hi);
    double miss_hi = missing(st);
    if (rc == TSR_OK && hi.ngl != lo.ngl && (rc = cost(st, &lo)) == TSR_OK && missing(st) >= miss_hi)
        rc = cost(st, &hi);
    const fit_cand *w = missing(st) == miss_hi ? &hi : &lo;
    if (rc != TSR_OK)
        return rc;
    char detail[1024];
    size_t len = 0;
    for (size_t d = 0; d < st->n_dev && len < sizeof detail; d++) {
        if (st->need[d] <= st->avail[d])
            continue;
        size_t miss = st->need[d] - st->avail[d];
        int n = snprintf(detail + len, sizeof detail - len,
                         "%s%s: needs %.2f MiB but %.2f MiB are available (%.2f MiB %s less a margin of %.2f MiB): "
                         "%.2f MiB (%zu bytes) missing",
                         len ? "; " : "", tsr_device_name(tsr_backend_device(st->b, d)), st->need[d] / 1048576.0,
                         st->avail[d] / 1048576.0, st->free_mem[d] / 1048576.0,
                         d == st->host ? "of system memory" : "free", st->margin[d] / 1048576.0, miss / 1048576.0,
                         miss);
        len += n > 0 ? (size_t)n : 0;
    }
    return tsr__error(TSR_E_DEVICE_NOMEM,
                      "tsr_fit: no placement allowed fits; the closest (n_gpu_layers %d, experts of %d layers in "
                      "system memory, n_ctx %lld): %s",
                      w->ngl, w->n_cpu_moe, (long long)w->n_ctx, len ? detail : "?");
}

/* ---- setup and result ------------------------------------------------------------ */

/* The caller's tensor_split, else one in proportion to what each GPU has
 * (whole MiB, so that the printed flags reproduce it exactly). */
static void choose_split(fit_state *st, const float *user) {
    for (size_t g = 0; g < st->n_gpu; g++) st->split[g] = user ? user[g] : (float)(st->avail[g] >> 20);
    bool any = false;
    for (size_t g = 0; g < st->n_gpu; g++) any = any || st->split[g] > 0;
    if (!any && st->n_gpu)
        st->split[0] = 1; /* nothing anywhere: the plan tells */
}

/* Free memory and margins per device, read before the planning backend exists. */
static tsr_status read_memory(fit_state *st) {
    st->n_dev = tsr_backend_n_devices(st->b);
    if (st->n_dev > FIT_MAX)
        return tsr__error(TSR_E_UNSUPPORTED, "tsr_fit: %zu devices; at most %d", st->n_dev, FIT_MAX);
    st->n_gpu = 0;
    for (size_t d = 0; d < st->n_dev; d++) {
        tsr_device *dev = tsr_backend_device(st->b, d);
        bool host = tsr_device_kind(dev) == TSR_DEVICE_CPU;
        st->margin[d] = d < st->fp.n_margins && st->fp.margins ? st->fp.margins[d]
                        : host                                 ? st->fp.host_margin
                                                               : st->fp.gpu_margin;
        if (host) {
            st->host = d;
            st->free_mem[d] = tsr__system_memory_available();
        } else {
            st->n_gpu++;
            for (size_t i = 0; i < tsr_device_count() && i < FIT_MAX; i++)
                if (tsr_device_get(i) == dev)
                    st->free_mem[d] = st->reg_free[i];
        }
        st->avail[d] = st->free_mem[d] > st->margin[d] ? st->free_mem[d] - st->margin[d] : 0;
    }
    choose_split(st, st->lp.tensor_split);
    return TSR_OK;
}

static tsr_status fit_init(fit_state *st, const char *path, const tsr_backend_params *bp, const tsr_load_params *lp,
                           const tsr_session_params *sp, const tsr_fit_params *fp) {
    memset(st, 0, sizeof *st);
    st->path = path;
    tsr_fit_params_init(&st->fp, sizeof st->fp);
    read_over(&st->fp, sizeof st->fp, fp);
    st->fp.size = sizeof st->fp;
    tsr_load_params_init(&st->lp, sizeof st->lp);
    read_over(&st->lp, sizeof st->lp, lp);
    st->lp.size = sizeof st->lp;
    st->lp.plan_only = 1;
    st->lp.vocab_only = 0;
    st->lp.progress = NULL;
    tsr_session_params_init(&st->sp, sizeof st->sp);
    read_over(&st->sp, sizeof st->sp, sp);
    st->sp.size = sizeof st->sp;
    if (st->fp.n_ctx_min < 0 || (st->fp.n_margins && !st->fp.margins))
        return tsr__error(TSR_E_INVALID, "tsr_fit: n_ctx_min %lld is negative or margins is NULL with n_margins %zu",
                          (long long)st->fp.n_ctx_min, st->fp.n_margins);
    for (const tsr_buft_override *o = st->lp.overrides; o && o->pattern; o++) st->n_user_ov++;
    st->user_ov = st->lp.overrides;
    tsr_backend_params b;
    tsr_backend_params_init(&b, sizeof b);
    read_over(&b, sizeof b, bp);
    b.size = sizeof b;
    b.n_threads = 1;                                                 /* nothing runs: no threadpool to speak of */
    for (size_t i = 0; i < tsr_device_count() && i < FIT_MAX; i++) { /* before our own streams take any */
        size_t total = 0;
        tsr_device_memory(tsr_device_get(i), &st->reg_free[i], &total);
    }
    tsr_status rc = tsr_gguf_open(path, &st->gguf); /* parsed once for every dry run */
    if (rc == TSR_OK)
        rc = tsr_backend_new(&b, &st->b);
    if (rc == TSR_OK) {
        tsr__backend_set_plan_mode(st->b, true);
        tsr__backend_set_plan_gguf(st->b, st->gguf);
    }
    return rc;
}

static tsr_status dup_overrides(const fit_state *st, const fit_cand *c, tsr_buft_override **out) {
    char pattern[FIT_PAT_MAX];
    expert_pattern(st, c->n_cpu_moe, pattern, sizeof pattern);
    size_t n = st->n_user_ov + (pattern[0] ? 1 : 0);
    *out = NULL;
    if (n == 0)
        return TSR_OK;
    tsr_buft_override *ov = tsr__calloc(n + 1, sizeof *ov);
    if (!ov)
        return tsr__error(TSR_E_NOMEM, "tsr_fit: out of host memory");
    build_overrides(st, pattern, ov);
    for (size_t i = 0; i < n; i++) {
        char *p = tsr__strdup(ov[i].pattern);
        ov[i].pattern = p;
        if (!p) {
            for (size_t j = 0; j < i; j++) tsr__free((void *)ov[j].pattern);
            tsr__free(ov);
            return tsr__error(TSR_E_NOMEM, "tsr_fit: out of host memory");
        }
    }
    *out = ov;
    return TSR_OK;
}

/* The fields of r within r->size. */
#define FIT_HAS(r, field) ((r)->size >= offsetof(tsr_fit_result, field) + sizeof(r)->field)

static tsr_status fill_result(fit_state *st, const fit_cand *c, tsr_fit_result *r) {
    tsr_status rc = cost(st, c); /* the plan of the answer, for planned[] */
    if (rc != TSR_OK)
        return rc;
    tsr_fit_result full;
    memset(&full, 0, sizeof full);
    full.size = r->size;
    full.n_gpu_layers = c->ngl;
    full.n_cpu_moe = c->n_cpu_moe;
    full.n_ctx = c->n_ctx;
    for (size_t g = 0; g < st->n_gpu; g++) full.tensor_split[g] = st->split[g];
    full.n_devices = st->n_dev;
    for (size_t d = 0; d < st->n_dev; d++) {
        full.planned[d] = st->need[d];
        full.available[d] = st->avail[d];
    }
    full.n_layers = st->n_layers;
    full.n_candidates = st->n_candidates;
    if (FIT_HAS(r, overrides) && (rc = dup_overrides(st, c, &full.overrides)) != TSR_OK)
        return rc;
    memcpy(r, &full, r->size < sizeof full ? r->size : sizeof full);
    return TSR_OK;
}

/* Several GPUs and no split from the caller: what each GPU has for
 * weights and KV cache is its memory less its compute buffer and stream
 * memory at full offload, so the split follows that (a small GPU whose
 * compute buffer alone fills it gets no layers) instead of the raw memory. */
static tsr_status rebalance(fit_state *st, int ngl_max, int64_t n_ctx) {
    if (st->n_gpu < 2 || st->lp.tensor_split || ngl_max == 0)
        return TSR_OK;
    fit_cand c = {ngl_max, 0, n_ctx};
    tsr_status rc = cost(st, &c);
    if (rc != TSR_OK)
        return rc;
    size_t room[FIT_MAX], any = 0;
    for (size_t g = 0; g < st->n_gpu; g++) {
        room[g] = st->avail[g] > st->fixed[g] ? st->avail[g] - st->fixed[g] : 0;
        any += room[g];
    }
    for (size_t g = 0; any && g < st->n_gpu; g++) st->split[g] = (float)(room[g] >> 10); /* whole KiB: exact */
    return TSR_OK;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static tsr_status fit_run(fit_state *st, tsr_fit_result *out) {
    fit_cand c = {0, 0, 0};
    tsr_status rc = read_memory(st);
    int ngl_min = st->fp.keep_n_gpu_layers ? st->lp.n_gpu_layers : 0;
    if (rc == TSR_OK) { /* the first dry run learns the model (layers, experts, training context) */
        c.ngl = ngl_min;
        c.n_ctx = st->sp.n_ctx;
        rc = cost(st, &c);
    }
    if (rc != TSR_OK)
        return rc;
    if (ngl_min < 0 || ngl_min > st->n_layers)
        ngl_min = st->n_layers;
    int ngl_max = st->fp.keep_n_gpu_layers ? ngl_min : st->n_gpu ? st->n_layers : 0;
    if (!st->n_gpu)
        ngl_min = ngl_max = 0;
    st->ngl_min = ngl_min;
    st->ngl_max = ngl_max;
    int64_t ctx_hi = st->sp.n_ctx > 0 ? st->sp.n_ctx : st->n_ctx_train;
    if ((rc = rebalance(st, ngl_max, st->fp.prefer == TSR_FIT_PREFER_SPEED ? ctx_floor(st, ctx_hi) : ctx_hi)) != TSR_OK)
        return rc;
    if ((rc = fit_search(st, &c, ngl_max, ngl_min, ctx_hi)) != TSR_OK)
        return rc;
    return fill_result(st, &c, out);
}

tsr_status tsr_fit(const char *path, const tsr_backend_params *bp, const tsr_load_params *lp,
                   const tsr_session_params *sp, const tsr_fit_params *fp, tsr_fit_result *out) {
    if (!path || !out)
        return tsr__error(TSR_E_INVALID, "tsr_fit: NULL %s", path ? "out" : "path");
    if (out->size < sizeof(size_t) || (bp && bp->size < sizeof(size_t)) || (lp && lp->size < sizeof(size_t)) ||
        (sp && sp->size < sizeof(size_t)) || (fp && fp->size < sizeof(size_t)))
        return tsr__error(TSR_E_INVALID, "tsr_fit: a params or result size is unset (call the _init functions and "
                                         "set out->size = sizeof *out)");
    const size_t size = out->size;
    memset((char *)out + sizeof(size_t), 0, size < sizeof *out ? size - sizeof(size_t) : sizeof *out - sizeof(size_t));
    double t0 = now_s();
    fit_state st;
    tsr_status rc = fit_init(&st, path, bp, lp, sp, fp);
    if (rc == TSR_OK)
        rc = fit_run(&st, out);
    tsr_backend_free(st.b);
    tsr_gguf_close(st.gguf);
    if (rc == TSR_OK && FIT_HAS(out, seconds))
        out->seconds = now_s() - t0;
    if (rc == TSR_OK) {
        char a[32], b[32], c[32], d[32];
        tsr__log(TSR_LOG_INFO, "fit", 4, "n_gpu_layers", (snprintf(a, sizeof a, "%d", out->n_gpu_layers), a),
                 "n_cpu_moe", (snprintf(b, sizeof b, "%d", out->n_cpu_moe), b), "n_ctx",
                 (snprintf(c, sizeof c, "%lld", (long long)out->n_ctx), c), "candidates",
                 (snprintf(d, sizeof d, "%d", st.n_candidates), d));
    }
    return rc;
}

void tsr_fit_result_free(tsr_fit_result *r) {
    if (!r || !FIT_HAS(r, overrides) || !r->overrides)
        return;
    for (tsr_buft_override *o = r->overrides; o->pattern; o++) tsr__free((void *)o->pattern);
    tsr__free(r->overrides);
    r->overrides = NULL;
}

static void append(char *buf, size_t cap, size_t *len, const char *s) {
    size_t n = strlen(s);
    if (*len < cap)
        memcpy(buf + *len, s, *len + n < cap ? n : cap - *len);
    *len += n;
}

tsr_status tsr_fit_result_flags(const tsr_fit_result *r, char *buf, size_t cap, size_t *len) {
    if (!r || !len || (!buf && cap) || !FIT_HAS(r, overrides))
        return tsr__error(TSR_E_INVALID, "tsr_fit_result_flags: NULL %s or a result too old", !r ? "result" : "out");
    size_t n = 0;
    char tmp[64];
    snprintf(tmp, sizeof tmp, "-ngl %d", r->n_gpu_layers);
    append(buf, cap, &n, tmp);
    size_t n_gpu = r->n_devices > 0 ? r->n_devices - 1 : 0;
    for (size_t g = 0; n_gpu > 1 && g < n_gpu && g < TSR_FIT_MAX_DEVICES; g++) {
        snprintf(tmp, sizeof tmp, "%s%.9g", g ? "," : " -ts ", (double)r->tensor_split[g]);
        append(buf, cap, &n, tmp);
    }
    for (const tsr_buft_override *o = r->overrides; o && o->pattern; o++) {
        append(buf, cap, &n, " -ot \"");
        append(buf, cap, &n, o->pattern);
        append(buf, cap, &n, "=");
        append(buf, cap, &n, o->buft ? tsr_buffer_type_name(o->buft) : "CPU");
        append(buf, cap, &n, "\"");
    }
    snprintf(tmp, sizeof tmp, " -c %lld", (long long)r->n_ctx);
    append(buf, cap, &n, tmp);
    *len = n;
    if (n >= cap)
        return tsr__error(TSR_E_RANGE, "tsr_fit_result_flags: %zu bytes needed, %zu given", n + 1, cap);
    buf[n] = '\0';
    return TSR_OK;
}
