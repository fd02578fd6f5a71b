/*
 * test-attention.c - the KV cache and the attention helper against a naive
 * double-precision attention: MHA and GQA shapes, several batches growing
 * the cache past the n_kv padding, two sequences in one batch, removal of a
 * range (holes in the mask), F32/F16/Q8_0 caches; the plain path, the
 * chunked plain path (attention max batch: steps over heads, parts of a KV
 * group, and token blocks) and the flash path all agree with the reference
 * and chunked results equal unchunked ones; the compute buffer stays under
 * the limit (tsr_measure); a batch that does not fit returns TSR_E_FULL and
 * changes nothing; argument errors; allocation failures leak nothing.
 * Sliding windows (n_swa, swa_layers): windows of 1, 16, 64 and 100
 * positions on one layer or on both, every path, against the reference
 * with the window. The latent cache (v_in_k: V read from the first values
 * of K, one or two KV heads) on every path.
 */
#include "tsrtest.h"

#include "internal.h"

/* ---- configuration -------------------------------------------------------------- */

typedef struct cfg {
    const char *name;
    int flash;
    size_t amb;
} cfg;

static const cfg CFGS[] = {
    {"plain", 0, 0},
    {"plain+amb64K", 0, 64 * 1024},     /* token blocks of one head */
    {"plain+amb600K", 0, 600 * 1024},   /* parts of a KV group or whole groups */
    {"plain+amb2M", 0, 2 * 1024 * 1024},
    {"flash", 1, 0},
};
#define N_CFGS (int)(sizeof CFGS / sizeof CFGS[0])

static tsr_backend *new_backend(int flash, size_t amb) {
    tsr_backend_params p;
    tsr_backend_params_init(&p, sizeof p);
    p.n_threads = 2;
    p.flash_attn = flash ? TSR_FLASH_ATTN_ON : TSR_FLASH_ATTN_OFF;
    p.attn_max_batch = amb;
    tsr_backend *b = NULL;
    CHECK_OK(tsr_backend_new(&p, &b));
    return b;
}

typedef struct shape {
    const char *name;
    int n_head, n_head_kv, hdk, hdv;
} shape;

/* ---- reference ------------------------------------------------------------------ */

/* The tokens the cache should hold, with their K/V for every layer. */
typedef struct ref_tok {
    int32_t pos, seq;
    int alive;
    float *k, *v; /* [n_layers][hdk * n_head_kv], [n_layers][hdv * n_head_kv] */
} ref_tok;

typedef struct ref_state {
    ref_tok *t;
    int n, cap;
} ref_state;

static void ref_free(ref_state *r) {
    for (int i = 0; i < r->n; i++) {
        free(r->t[i].k);
        free(r->t[i].v);
    }
    free(r->t);
    memset(r, 0, sizeof *r);
}

/* The window of the schedules being run (0 = none) and which of the
 * layers have it (NULL = both). */
static int64_t g_n_swa;
static int g_v_in_k; /* latent cache: V is the first hdv values of K (tsr_kv_cache_params.v_in_k) */
static const uint8_t *g_swa_layers;

static int windowed(int il) { return g_n_swa > 0 && (!g_swa_layers || g_swa_layers[il]); }

/* out[t][h * hdv + d] for query token t of (pos, seq), layer il. */
static void ref_attention(const ref_state *r, const shape *sh, int il, int n_layers, const float *q, int nt,
                          const int32_t *pos, const int32_t *seq, float scale, double *out) {
    (void)n_layers;
    int g = sh->n_head / sh->n_head_kv, kw = sh->hdk * sh->n_head_kv, vw = sh->hdv * sh->n_head_kv;
    double *w = malloc((size_t)(r->n > 0 ? r->n : 1) * sizeof *w);
    for (int t = 0; t < nt; t++)
        for (int h = 0; h < sh->n_head; h++) {
            const float *qr = q + ((size_t)t * sh->n_head + h) * sh->hdk;
            int hk = h / g;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < r->n; j++) {
                const ref_tok *c = &r->t[j];
                w[j] = -INFINITY;
                if (!c->alive || c->seq != seq[t] || c->pos > pos[t])
                    continue;
                if (windowed(il) && (int64_t)pos[t] - c->pos >= g_n_swa)
                    continue;
                double s = 0;
                for (int d = 0; d < sh->hdk; d++)
                    s += (double)qr[d] * c->k[(size_t)il * kw + hk * sh->hdk + d];
                w[j] = s * scale;
                if (w[j] > mx)
                    mx = w[j];
            }
            double *o = out + (size_t)t * sh->n_head * sh->hdv + (size_t)h * sh->hdv;
            for (int d = 0; d < sh->hdv; d++)
                o[d] = 0;
            for (int j = 0; j < r->n; j++) {
                if (w[j] == -INFINITY)
                    continue;
                double e = exp(w[j] - mx);
                sum += e;
                for (int d = 0; d < sh->hdv; d++)
                    o[d] += e * r->t[j].v[(size_t)il * vw + hk * sh->hdv + d];
            }
            for (int d = 0; d < sh->hdv && sum > 0; d++)
                o[d] /= sum;
        }
    free(w);
}

/* ---- one run of a batch schedule over every configuration -------------------------- */

typedef struct batch {
    int n;         /* tokens */
    int two_seqs;  /* alternate sequences 0 and 1 inside the batch */
    int remove_seq, remove_p0, remove_p1; /* removal before the batch (remove_seq -2 = none) */
} batch;

#define N_LAYERS 2

typedef struct run_state {
    tsr_backend *b;
    tsr_kv_cache *c;
} run_state;

/* Runs batch bi on one configuration; returns the outputs of both layers
 * (malloc'ed, [N_LAYERS][nt][n_head*hdv]). */
static float *run_batch(run_state *rs, const shape *sh, int nt, const float *q, const float *k, const float *v,
                        const int32_t *pos, const int32_t *seq, float scale) {
    tsr_context *ctx = tsr_context_new(rs->b);
    CHECK_OK(tsr_kv_cache_begin(rs->c, ctx, nt, pos, seq));
    int64_t neq[3] = {sh->hdk, sh->n_head, nt}, nek[3] = {sh->hdk, sh->n_head_kv, nt}, nev[3] = {sh->hdv, sh->n_head_kv, nt};
    size_t qn = (size_t)sh->hdk * sh->n_head * nt, kn = (size_t)sh->hdk * sh->n_head_kv * nt,
           vn = (size_t)sh->hdv * sh->n_head_kv * nt;
    tsr_tensor *outs[N_LAYERS];
    for (int il = 0; il < N_LAYERS; il++) {
        tsr_tensor *tq = tsr_input(ctx, TSR_TYPE_F32, 3, neq, q + il * qn);
        tsr_tensor *tk = tsr_input(ctx, TSR_TYPE_F32, 3, nek, k + il * kn);
        tsr_tensor *tv = g_v_in_k ? NULL : tsr_input(ctx, TSR_TYPE_F32, 3, nev, v + il * vn);
        outs[il] = tsr_attention(ctx, rs->c, il, tq, tk, tv, scale);
        CHECK(outs[il] != NULL);
    }
    size_t on = (size_t)sh->n_head * sh->hdv * nt;
    float *res = calloc(N_LAYERS * on + 1, sizeof *res);
    if (outs[0] && outs[1] && tsr_compute(ctx, outs, N_LAYERS) == TSR_OK) {
        for (int il = 0; il < N_LAYERS; il++) {
            CHECK(tsr_tensor_ne(outs[il], 0) == sh->n_head * sh->hdv && tsr_tensor_ne(outs[il], 1) == nt);
            CHECK_OK(tsr_tensor_read(outs[il], res + il * on, 0, on * sizeof(float)));
        }
    } else {
        CHECK(!"compute failed");
        fprintf(stderr, "  error: %s / %s\n", tsr_last_error(), tsr_context_error(ctx) ? tsr_context_error(ctx) : "");
    }
    tsr_context_close(ctx);
    return res;
}

static void fill_batch(const batch *bt, int32_t *next_pos, int32_t *pos, int32_t *seq) {
    for (int i = 0; i < bt->n; i++) {
        seq[i] = bt->two_seqs ? i % 2 : 0;
        pos[i] = next_pos[seq[i]]++;
    }
}

static void ref_add(ref_state *r, const shape *sh, int nt, const float *k, const float *v, const int32_t *pos,
                    const int32_t *seq) {
    size_t kw = (size_t)sh->hdk * sh->n_head_kv, vw = (size_t)sh->hdv * sh->n_head_kv;
    for (int i = 0; i < nt; i++) {
        if (r->n == r->cap) {
            r->cap = r->cap ? r->cap * 2 : 64;
            r->t = realloc(r->t, (size_t)r->cap * sizeof *r->t);
        }
        ref_tok *t = &r->t[r->n++];
        t->pos = pos[i];
        t->seq = seq[i];
        t->alive = 1;
        t->k = malloc(N_LAYERS * kw * sizeof(float));
        t->v = malloc(N_LAYERS * vw * sizeof(float));
        for (int il = 0; il < N_LAYERS; il++) {
            memcpy(t->k + il * kw, k + (size_t)il * kw * nt + i * kw, kw * sizeof(float));
            memcpy(t->v + il * vw, v + (size_t)il * vw * nt + i * vw, vw * sizeof(float));
        }
    }
}

static void ref_remove(ref_state *r, int seq, int p0, int p1) {
    for (int i = 0; i < r->n; i++)
        if (r->t[i].alive && (seq < 0 || r->t[i].seq == seq) && r->t[i].pos >= p0 && (p1 < 0 || r->t[i].pos < p1))
            r->t[i].alive = 0;
}

static double tol_of(tsr_type tk, tsr_type tv) {
    if (tk == TSR_TYPE_Q8_0 || tv == TSR_TYPE_Q8_0)
        return 2e-4;
    if (tk == TSR_TYPE_F16 || tv == TSR_TYPE_F16)
        return 5e-6;
    return 1e-9;
}

/* Runs the schedule on every configuration that accepts the cache types,
 * comparing each batch with the reference and with the unchunked plain run. */
static void run_schedule(const shape *sh, tsr_type tk, tsr_type tv, int64_t n_ctx, const batch *bs, int n_batches) {
    run_state rs[N_CFGS];
    int on[N_CFGS];
    for (int ci = 0; ci < N_CFGS; ci++) {
        rs[ci].b = new_backend(CFGS[ci].flash, CFGS[ci].amb);
        tsr_kv_cache_params p;
        tsr_kv_cache_params_init(&p, sizeof p);
        p.n_layers = N_LAYERS;
        p.n_ctx = n_ctx;
        p.n_head_kv = sh->n_head_kv;
        p.head_dim_k = sh->hdk;
        p.head_dim_v = sh->hdv;
        p.type_k = tk;
        p.type_v = tv;
        p.n_seq = 2;
        p.n_swa = g_n_swa;
        p.swa_layers = g_swa_layers;
        p.v_in_k = g_v_in_k;
        rs[ci].c = NULL;
        tsr_status s = tsr_kv_cache_new(rs[ci].b, &p, &rs[ci].c);
        on[ci] = s == TSR_OK;
        if (tv == TSR_TYPE_Q8_0 && !CFGS[ci].flash && !g_v_in_k)
            CHECK_STATUS(s, TSR_E_UNSUPPORTED);
        else
            CHECK_OK(s);
    }
    ref_state ref = {0};
    int32_t next_pos[2] = {0, 0};
    const float scale = 1.0f / sqrtf((float)sh->hdk);
    for (int bi = 0; bi < n_batches; bi++) {
        const batch *bt = &bs[bi];
        if (bt->remove_seq != -2) {
            ref_remove(&ref, bt->remove_seq, bt->remove_p0, bt->remove_p1);
            for (int ci = 0; ci < N_CFGS; ci++)
                if (on[ci])
                    CHECK_OK(tsr_kv_cache_remove(rs[ci].c, bt->remove_seq, bt->remove_p0, bt->remove_p1));
        }
        int nt = bt->n;
        size_t qn = (size_t)N_LAYERS * sh->hdk * sh->n_head * nt, kn = (size_t)N_LAYERS * sh->hdk * sh->n_head_kv * nt,
               vn = (size_t)N_LAYERS * sh->hdv * sh->n_head_kv * nt, on_n = (size_t)sh->n_head * sh->hdv * nt;
        float *q = malloc((qn + 1) * 4), *k = malloc((kn + 1) * 4), *v = malloc((vn + 1) * 4);
        tsrtest_fill(q, qn, 100 + bi);
        tsrtest_fill(k, kn, 200 + bi);
        tsrtest_fill(v, vn, 300 + bi);
        if (g_v_in_k) /* V: the first hdv values of each K head */
            for (size_t row = 0; row < (size_t)N_LAYERS * sh->n_head_kv * nt; row++)
                memcpy(v + row * sh->hdv, k + row * sh->hdk, (size_t)sh->hdv * sizeof(float));
        for (size_t i = 0; i < qn; i++)
            q[i] *= 3.0f; /* peaky softmax: differences between paths would show */
        int32_t *pos = malloc((nt + 1) * sizeof *pos), *seq = malloc((nt + 1) * sizeof *seq);
        fill_batch(bt, next_pos, pos, seq);
        ref_add(&ref, sh, nt, k, v, pos, seq);
        double *want = malloc((N_LAYERS * on_n + 1) * sizeof *want);
        for (int il = 0; il < N_LAYERS; il++)
            ref_attention(&ref, sh, il, N_LAYERS, q + (size_t)il * sh->hdk * sh->n_head * nt, nt, pos, seq, scale,
                          want + il * on_n);
        float *base = NULL;
        for (int ci = 0; ci < N_CFGS; ci++) {
            if (!on[ci])
                continue;
            float *got = run_batch(&rs[ci], sh, nt, q, k, v, pos, seq, scale);
            double e = tsrtest_nmse(got, want, N_LAYERS * on_n);
            if (getenv("TSR_TEST_VERBOSE"))
                printf("%s %s/%s %s swa %lld batch %d: nmse %.3g\n", sh->name, tsr_type_name(tk), tsr_type_name(tv),
                       CFGS[ci].name, (long long)g_n_swa, bi, e);
            if (!(e < tol_of(tk, tv)))
                fprintf(stderr, "%s %s/%s %s swa %lld batch %d (%d tokens): nmse %g\n", sh->name, tsr_type_name(tk),
                        tsr_type_name(tv), CFGS[ci].name, (long long)g_n_swa, bi, nt, e);
            CHECK(e < tol_of(tk, tv));
            if (!CFGS[ci].flash && !base) {
                base = got;
                continue;
            }
            if (!CFGS[ci].flash && base) { /* chunked equals unchunked */
                double d = 0;
                for (size_t i = 0; i < N_LAYERS * on_n; i++)
                    d = fmax(d, fabs((double)got[i] - base[i]));
                if (!(d < 1e-5))
                    fprintf(stderr, "%s %s: chunked differs from unchunked by %g\n", sh->name, CFGS[ci].name, d);
                CHECK(d < 1e-5);
            }
            free(got);
        }
        free(base);
        free(want);
        free(q);
        free(k);
        free(v);
        free(pos);
        free(seq);
        for (int ci = 0; ci < N_CFGS; ci++)
            if (on[ci]) {
                int alive = 0;
                for (int i = 0; i < ref.n; i++)
                    alive += ref.t[i].alive;
                CHECK(tsr_kv_cache_used(rs[ci].c) == alive);
            }
    }
    for (int ci = 0; ci < N_CFGS; ci++) {
        tsr_kv_cache_free(rs[ci].c);
        tsr_backend_free(rs[ci].b);
    }
    ref_free(&ref);
}

/* ---- a graph built once and computed again (tsr_kv_cache_begin_again) ---------- */

typedef struct kept_graph {
    tsr_context *ctx;
    tsr_tensor *q[N_LAYERS], *k[N_LAYERS], *v[N_LAYERS], *out[N_LAYERS];
} kept_graph;

static void kept_build(run_state *rs, const shape *sh, kept_graph *g, int nt, const int32_t *pos, const int32_t *seq,
                       float scale) {
    g->ctx = tsr_context_new(rs->b);
    CHECK_OK(tsr_kv_cache_begin(rs->c, g->ctx, nt, pos, seq));
    int64_t neq[3] = {sh->hdk, sh->n_head, nt}, nek[3] = {sh->hdk, sh->n_head_kv, nt}, nev[3] = {sh->hdv, sh->n_head_kv, nt};
    for (int il = 0; il < N_LAYERS; il++) {
        g->q[il] = tsr_input(g->ctx, TSR_TYPE_F32, 3, neq, NULL);
        g->k[il] = tsr_input(g->ctx, TSR_TYPE_F32, 3, nek, NULL);
        g->v[il] = tsr_input(g->ctx, TSR_TYPE_F32, 3, nev, NULL);
        g->out[il] = tsr_attention(g->ctx, rs->c, il, g->q[il], g->k[il], g->v[il], scale);
        CHECK(g->out[il] != NULL);
    }
}

/* One token at a time on a kept graph after a 250-token prompt, against the
 * reference: on sequence 0 and 1 in turn, a cell removed on the way, the
 * 256-cell bound crossed (TSR_E_STATE, nothing changed, a new graph); and
 * the statuses of begin_again. */
static void test_again(void) {
    const shape sh = {"gqa", 4, 2, 32, 32};
    const float scale = 1.0f / sqrtf((float)sh.hdk);
    const size_t qw = (size_t)sh.hdk * sh.n_head, kw = (size_t)sh.hdk * sh.n_head_kv, vw = (size_t)sh.hdv * sh.n_head_kv,
                 ow = (size_t)sh.hdv * sh.n_head;
    for (int flash = 0; flash < 2; flash++) {
        run_state rs = {new_backend(flash, 0), NULL};
        tsr_kv_cache_params p;
        tsr_kv_cache_params_init(&p, sizeof p);
        p.n_layers = N_LAYERS;
        p.n_ctx = 600;
        p.n_head_kv = sh.n_head_kv;
        p.head_dim_k = sh.hdk;
        p.head_dim_v = sh.hdv;
        p.n_seq = 2;
        CHECK_OK(tsr_kv_cache_new(rs.b, &p, &rs.c));
        if (!rs.c) {
            tsr_backend_free(rs.b);
            continue;
        }
        int32_t one_pos = 0, one_seq = 0;
        tsr_context *other = tsr_context_new(rs.b);
        CHECK_STATUS(tsr_kv_cache_begin_again(rs.c, other, 1, &one_pos, NULL), TSR_E_STATE); /* no begin yet */
        CHECK_STATUS(tsr_kv_cache_begin_again(NULL, other, 1, &one_pos, NULL), TSR_E_INVALID);
        CHECK_STATUS(tsr_kv_cache_begin_again(rs.c, NULL, 1, &one_pos, NULL), TSR_E_INVALID);
        ref_state ref = {0};
        const int n_prompt = 250;
        int32_t next_pos[2] = {0, 0}, pos[250], seq[250];
        const batch prompt = {n_prompt, 0, -2, 0, 0};
        fill_batch(&prompt, next_pos, pos, seq);
        size_t n = (size_t)n_prompt * N_LAYERS;
        float *q = malloc(n * qw * 4), *k = malloc(n * kw * 4), *v = malloc(n * vw * 4);
        tsrtest_fill(q, n * qw, 11);
        tsrtest_fill(k, n * kw, 12);
        tsrtest_fill(v, n * vw, 13);
        ref_add(&ref, &sh, n_prompt, k, v, pos, seq);
        free(run_batch(&rs, &sh, n_prompt, q, k, v, pos, seq, scale));
        kept_graph g = {0};
        int builds = 0;
        for (int step = 0; step < 20; step++) {
            if (step == 9) { /* sequence 0's last token goes: its cell is taken again */
                ref_remove(&ref, 0, next_pos[0] - 1, -1);
                CHECK_OK(tsr_kv_cache_remove(rs.c, 0, next_pos[0] - 1, -1));
                next_pos[0]--;
            }
            one_seq = step % 2;
            one_pos = next_pos[one_seq]++;
            tsrtest_fill(q, N_LAYERS * qw, 100 + step);
            tsrtest_fill(k, N_LAYERS * kw, 200 + step);
            tsrtest_fill(v, N_LAYERS * vw, 300 + step);
            for (size_t i = 0; i < N_LAYERS * qw; i++) q[i] *= 3.0f;
            ref_add(&ref, &sh, 1, k, v, &one_pos, &one_seq);
            const int64_t used = tsr_kv_cache_used(rs.c);
            tsr_status st = g.ctx ? tsr_kv_cache_begin_again(rs.c, g.ctx, 1, &one_pos, &one_seq) : TSR_E_STATE;
            const bool built = st == TSR_E_STATE;
            if (st == TSR_E_STATE) {
                CHECK(tsr_kv_cache_used(rs.c) == used);
                tsr_context_close(g.ctx);
                kept_build(&rs, &sh, &g, 1, &one_pos, &one_seq, scale);
                builds++;
            } else {
                CHECK_OK(st);
            }
            if (step == 12) { /* a tensor made in the graph's context: planned again */
                const int64_t ne1 = 4;
                CHECK(tsr_input(g.ctx, TSR_TYPE_F32, 1, &ne1, NULL) != NULL);
            }
            if (step == 14) { /* another graph computed in between: planned again */
                const int64_t ne1 = 4;
                const float a[4] = {1, 2, 3, 4};
                float r[4] = {0};
                tsr_tensor *x = tsr_input(other, TSR_TYPE_F32, 1, &ne1, a), *y = tsr_add(other, x, x);
                CHECK_OK(tsr_compute(other, &y, 1));
                CHECK_OK(tsr_tensor_read(y, r, 0, sizeof r));
                CHECK(r[3] == 8.0f);
            }
            if (step == 16) { /* a measure of another graph in between: planned again */
                const int64_t ne1 = 4;
                tsr_tensor *x = tsr_input(other, TSR_TYPE_F32, 1, &ne1, NULL), *y = tsr_mul(other, x, x);
                size_t sizes[8];
                CHECK(tsr_backend_n_devices(rs.b) <= 8);
                CHECK_OK(tsr_measure(other, &y, 1, sizes));
            }
            for (int il = 0; il < N_LAYERS; il++) {
                CHECK_OK(tsr_tensor_write(g.q[il], q + il * qw, 0, qw * 4));
                CHECK_OK(tsr_tensor_write(g.k[il], k + il * kw, 0, kw * 4));
                CHECK_OK(tsr_tensor_write(g.v[il], v + il * vw, 0, vw * 4));
            }
            float got[N_LAYERS * 128];
            double want[N_LAYERS * 128];
            const uint64_t p0 = tsr__plan_count();
            CHECK_OK(tsr_compute(g.ctx, g.out, N_LAYERS));
            /* planned when built, after a tensor made in its context, another compute or a measure */
            const bool planned = built || step == 12 || step == 14 || step == 16;
            CHECK((tsr__plan_count() != p0) == planned, "step %d: planned %d, expected %d", step,
                  tsr__plan_count() != p0, planned);
            for (int il = 0; il < N_LAYERS; il++) {
                CHECK_OK(tsr_tensor_read(g.out[il], got + il * ow, 0, ow * 4));
                ref_attention(&ref, &sh, il, N_LAYERS, q + il * qw, 1, &one_pos, &one_seq, scale, want + il * ow);
            }
            const double e = tsrtest_nmse(got, want, N_LAYERS * ow);
            CHECK(e < tol_of(TSR_TYPE_F16, TSR_TYPE_F16), "%s step %d: nmse %g", flash ? "flash" : "plain", step, e);
        }
        CHECK(builds == 2, "%d graphs built for 20 steps; expected 2 (the 256-cell bound crossed once)", builds);
        const int64_t used = tsr_kv_cache_used(rs.c);
        int32_t two_pos[2] = {500, 501};
        CHECK_STATUS(tsr_kv_cache_begin_again(rs.c, g.ctx, 2, two_pos, NULL), TSR_E_STATE); /* 1 token graph */
        CHECK_STATUS(tsr_kv_cache_begin_again(rs.c, other, 1, two_pos, NULL), TSR_E_STATE);  /* not its begin */
        tsr_context_close(g.ctx);
        tsr_context *again = tsr_context_new(rs.b); /* perhaps where the closed one was: still another */
        CHECK_STATUS(tsr_kv_cache_begin_again(rs.c, again, 1, two_pos, NULL), TSR_E_STATE);
        CHECK(tsr_kv_cache_used(rs.c) == used);
        tsr_context_close(again);
        tsr_context_close(other);
        free(q);
        free(k);
        free(v);
        ref_free(&ref);
        tsr_kv_cache_free(rs.c);
        tsr_backend_free(rs.b);
    }
}

static const batch SCHEDULE[] = {
    {37, 0, -2, 0, 0},
    {1, 0, -2, 0, 0},
    {150, 1, -2, 0, 0},  /* two sequences, n_kv past 256 on the plain path */
    {3, 1, 1, 10, 40},   /* holes: seq 1 positions 10..39 removed */
    {100, 1, -2, 0, 0},  /* reuses the freed cells */
    {1, 0, -1, 0, 5},    /* positions 0..4 of both sequences removed */
};

static void test_paths(void) {
    static const shape SHAPES[] = {
        {"mha", 4, 4, 32, 32},
        {"gqa", 9, 3, 64, 64},
        {"gqa-odd", 6, 2, 32, 64},
    };
    int nb = (int)(sizeof SCHEDULE / sizeof SCHEDULE[0]);
    for (int si = 0; si < 3; si++)
        run_schedule(&SHAPES[si], TSR_TYPE_F16, TSR_TYPE_F16, 300, SCHEDULE, nb);
    run_schedule(&SHAPES[1], TSR_TYPE_Q8_0, TSR_TYPE_Q8_0, 300, SCHEDULE, nb);
    run_schedule(&SHAPES[2], TSR_TYPE_Q8_0, TSR_TYPE_F16, 300, SCHEDULE, 3);
    run_schedule(&SHAPES[0], TSR_TYPE_F32, TSR_TYPE_F32, 200, SCHEDULE, 3);
    static const shape ODD = {"odd", 3, 1, 5, 7};
    run_schedule(&ODD, TSR_TYPE_F32, TSR_TYPE_F16, 77, SCHEDULE, 2);
}

/* The latent cache (v_in_k): one KV head whose first hdv values are V, as
 * DeepSeek's MLA uses it (kv_lora_rank + rope keys, kv_lora_rank values),
 * and two, on every path, F16, F32 and Q8_0 caches. */
static void test_v_in_k(void) {
    static const shape MLA = {"mla", 8, 1, 80, 64};
    static const shape MLA2 = {"mla-2kv", 6, 2, 48, 16};
    int nb = (int)(sizeof SCHEDULE / sizeof SCHEDULE[0]);
    g_v_in_k = 1;
    run_schedule(&MLA, TSR_TYPE_F16, TSR_TYPE_F16, 300, SCHEDULE, nb);
    run_schedule(&MLA2, TSR_TYPE_F32, TSR_TYPE_F32, 200, SCHEDULE, 3);
    static const shape MLA_Q8 = {"mla-q8", 8, 1, 96, 64};
    run_schedule(&MLA_Q8, TSR_TYPE_Q8_0, TSR_TYPE_Q8_0, 300, SCHEDULE, 3);
    g_v_in_k = 0;
}

/* The same schedules with sliding windows: on layer 1 only (layer 0 keeps
 * the plain causal mask, so both masks of one batch are checked) or on
 * both layers (swa_layers NULL); windows shorter than one batch, than the
 * holes, and longer than some sequences. Gemma 3's shape (head dim 256,
 * one KV head) included. */
static void test_windows(void) {
    static const shape SHAPES[] = {
        {"gqa", 9, 3, 64, 64},
        {"gemma", 4, 1, 256, 256},
        {"mha", 4, 4, 32, 32},
    };
    static const uint8_t SECOND[N_LAYERS] = {0, 1};
    int nb = (int)(sizeof SCHEDULE / sizeof SCHEDULE[0]);
    static const struct {
        int shape;
        int64_t n_swa;
        const uint8_t *layers;
        tsr_type tk, tv;
        int n_batches;
    } RUNS[] = {
        {0, 16, SECOND, TSR_TYPE_F16, TSR_TYPE_F16, 6},   {0, 100, NULL, TSR_TYPE_F16, TSR_TYPE_F16, 6},
        {1, 64, SECOND, TSR_TYPE_F16, TSR_TYPE_F16, 6},   {2, 1, NULL, TSR_TYPE_F32, TSR_TYPE_F32, 4},
        {0, 16, SECOND, TSR_TYPE_Q8_0, TSR_TYPE_Q8_0, 4},
    };
    for (size_t i = 0; i < sizeof RUNS / sizeof RUNS[0]; i++) {
        g_n_swa = RUNS[i].n_swa;
        g_swa_layers = RUNS[i].layers;
        run_schedule(&SHAPES[RUNS[i].shape], RUNS[i].tk, RUNS[i].tv, 300, SCHEDULE,
                     RUNS[i].n_batches < nb ? RUNS[i].n_batches : nb);
    }
    g_n_swa = 0;
    g_swa_layers = NULL;
}

static tsr_kv_cache *small_cache(tsr_backend *b, int64_t n_ctx, int n_seq);

/* ---- the cache-less variant -------------------------------------------------- */

static void test_nocache(void) {
    const shape sh = {"nocache", 6, 2, 32, 16};
    const int nt = 13, n_kv = 29;
    size_t qn = (size_t)sh.hdk * sh.n_head * nt, kn = (size_t)sh.hdk * sh.n_head_kv * n_kv,
           vn = (size_t)sh.hdv * sh.n_head_kv * n_kv, on = (size_t)sh.hdv * sh.n_head * nt;
    float *q = malloc(qn * 4), *k = malloc(kn * 4), *v = malloc(vn * 4), *mask = malloc((size_t)n_kv * nt * 4);
    tsrtest_fill(q, qn, 1);
    tsrtest_fill(k, kn, 2);
    tsrtest_fill(v, vn, 3);
    ref_state ref = {0};
    int32_t *kpos = malloc(n_kv * sizeof *kpos), *kseq = calloc(n_kv, sizeof *kseq);
    int32_t qpos[13], qseq[13] = {0};
    for (int j = 0; j < n_kv; j++)
        kpos[j] = j;
    for (int t = 0; t < nt; t++)
        qpos[t] = n_kv - nt + t;
    /* reference through the same helper (it stores N_LAYERS layers: both the same) */
    float *k2 = malloc(2 * kn * 4), *v2 = malloc(2 * vn * 4);
    memcpy(k2, k, kn * 4);
    memcpy(k2 + kn, k, kn * 4);
    memcpy(v2, v, vn * 4);
    memcpy(v2 + vn, v, vn * 4);
    ref_add(&ref, &sh, n_kv, k2, v2, kpos, kseq);
    double *want = malloc(on * sizeof *want);
    const float scale = 0.3f;
    ref_attention(&ref, &sh, 0, 2, q, nt, qpos, qseq, scale, want);
    for (int t = 0; t < nt; t++)
        for (int j = 0; j < n_kv; j++)
            mask[t * n_kv + j] = kpos[j] <= qpos[t] ? 0.0f : -INFINITY;
    for (int ci = 0; ci < N_CFGS; ci++) {
        tsr_backend *b = new_backend(CFGS[ci].flash, CFGS[ci].amb ? CFGS[ci].amb / 64 : 0);
        tsr_context *ctx = tsr_context_new(b);
        int64_t neq[3] = {sh.hdk, sh.n_head, nt}, nek[3] = {sh.hdk, sh.n_head_kv, n_kv},
                nev[3] = {sh.hdv, sh.n_head_kv, n_kv}, nem[2] = {n_kv, nt};
        tsr_tensor *tq = tsr_input(ctx, TSR_TYPE_F32, 3, neq, q), *tk = tsr_input(ctx, TSR_TYPE_F32, 3, nek, k),
                   *tv = tsr_input(ctx, TSR_TYPE_F32, 3, nev, v), *tm = tsr_input(ctx, TSR_TYPE_F32, 2, nem, mask);
        tsr_tensor *o = tsr_attention_nocache(ctx, tq, tk, tv, tm, scale);
        /* without a mask every key is visible: compare the last token only */
        tsr_tensor *o2 = tsr_attention_nocache(ctx, tq, tk, tv, NULL, scale);
        tsr_tensor *outs[2] = {o, o2};
        CHECK(o && o2);
        float *got = malloc(on * 4), *got2 = malloc(on * 4);
        if (o && o2 && tsr_compute(ctx, outs, 2) == TSR_OK) {
            CHECK_OK(tsr_tensor_read(o, got, 0, on * 4));
            CHECK_OK(tsr_tensor_read(o2, got2, 0, on * 4));
            double e = tsrtest_nmse(got, want, on);
            if (!(e < 1e-9))
                fprintf(stderr, "nocache %s: nmse %g\n", CFGS[ci].name, e);
            CHECK(e < (CFGS[ci].flash ? 1e-6 : 1e-9));
            size_t last = (size_t)(nt - 1) * sh.n_head * sh.hdv;
            CHECK(tsrtest_nmse(got2 + last, want + last, (size_t)sh.n_head * sh.hdv) < 1e-6);
        } else {
            CHECK(!"nocache compute failed");
        }
        free(got);
        free(got2);
        tsr_context_close(ctx);
        tsr_backend_free(b);
    }
    ref_free(&ref);
    free(q), free(k), free(v), free(mask), free(kpos), free(kseq), free(want), free(k2), free(v2);
}

/* Empty batches and an empty key set: legal, zero-sized or zero results. */
static void test_empty(void) {
    for (int ci = 0; ci < N_CFGS; ci++) {
        tsr_backend *b = new_backend(CFGS[ci].flash, CFGS[ci].amb);
        tsr_kv_cache *c = small_cache(b, 32, 1);
        tsr_context *ctx = tsr_context_new(b);
        CHECK_OK(tsr_kv_cache_begin(c, ctx, 0, NULL, NULL));
        int64_t neq[3] = {32, 2, 0}, nek[3] = {32, 1, 0};
        tsr_tensor *q = tsr_input(ctx, TSR_TYPE_F32, 3, neq, NULL), *k = tsr_input(ctx, TSR_TYPE_F32, 3, nek, NULL);
        tsr_tensor *o = tsr_attention(ctx, c, 0, q, k, k, 1.0f);
        CHECK(o && tsr_tensor_ne(o, 0) == 64 && tsr_tensor_ne(o, 1) == 0);
        if (o)
            CHECK_OK(tsr_compute(ctx, &o, 1));
        /* no keys at all: every query gets zeros */
        int64_t neq2[3] = {32, 2, 3};
        float qd[32 * 2 * 3], od[64 * 3];
        tsrtest_fill(qd, 32 * 2 * 3, 5);
        tsr_tensor *q2 = tsr_input(ctx, TSR_TYPE_F32, 3, neq2, qd);
        tsr_tensor *o2 = tsr_attention_nocache(ctx, q2, k, k, NULL, 1.0f);
        CHECK(o2 && tsr_tensor_ne(o2, 0) == 64 && tsr_tensor_ne(o2, 1) == 3);
        if (o2 && tsr_compute(ctx, &o2, 1) == TSR_OK) {
            CHECK_OK(tsr_tensor_read(o2, od, 0, sizeof od));
            int zeros = 0;
            for (int i = 0; i < 64 * 3; i++)
                zeros += od[i] == 0.0f;
            CHECK(zeros == 64 * 3);
        } else {
            CHECK(!"empty key set failed");
        }
        CHECK(tsr_kv_cache_used(c) == 0);
        tsr_context_close(ctx);
        tsr_kv_cache_free(c);
        tsr_backend_free(b);
    }
}

/* Layers of different shapes in one cache (per-layer params). */
static void test_layer_shapes(void) {
    static const shape LS[2] = {{"l0", 4, 2, 32, 32}, {"l1", 4, 1, 64, 16}};
    static const int nkvh[2] = {2, 1}, hdk[2] = {32, 64}, hdv[2] = {32, 16};
    static const int sizes[2] = {5, 3};
    for (int ci = 0; ci < N_CFGS; ci++) {
        tsr_backend *b = new_backend(CFGS[ci].flash, CFGS[ci].amb ? 2048 : 0);
        tsr_kv_cache_params p;
        tsr_kv_cache_params_init(&p, sizeof p);
        p.n_layers = 2, p.n_ctx = 40;
        p.n_head_kv_layer = nkvh, p.head_dim_k_layer = hdk, p.head_dim_v_layer = hdv;
        tsr_kv_cache *c = NULL;
        CHECK_OK(tsr_kv_cache_new(b, &p, &c));
        ref_state ref[2] = {{0}, {0}};
        int32_t next = 0;
        for (int bi = 0; bi < 2 && c; bi++) {
            int nt = sizes[bi];
            int32_t pos[8], seq[8] = {0};
            for (int i = 0; i < nt; i++)
                pos[i] = next++;
            tsr_context *ctx = tsr_context_new(b);
            CHECK_OK(tsr_kv_cache_begin(c, ctx, nt, pos, NULL));
            float *q[2], *k[2], *v[2];
            double *want[2];
            tsr_tensor *outs[2];
            for (int il = 0; il < 2; il++) {
                const shape *sh = &LS[il];
                size_t qn = (size_t)sh->hdk * sh->n_head * nt, kn = (size_t)sh->hdk * sh->n_head_kv * nt,
                       vn = (size_t)sh->hdv * sh->n_head_kv * nt;
                q[il] = malloc(qn * 4), k[il] = malloc(2 * kn * 4), v[il] = malloc(2 * vn * 4);
                tsrtest_fill(q[il], qn, 10 * bi + il + 1);
                tsrtest_fill(k[il], kn, 20 * bi + il + 1);
                tsrtest_fill(v[il], vn, 30 * bi + il + 1);
                memcpy(k[il] + kn, k[il], kn * 4); /* the reference keeps two identical layers */
                memcpy(v[il] + vn, v[il], vn * 4);
                ref_add(&ref[il], sh, nt, k[il], v[il], pos, seq);
                want[il] = malloc((size_t)sh->n_head * sh->hdv * nt * sizeof(double));
                ref_attention(&ref[il], sh, 0, 2, q[il], nt, pos, seq, 0.2f, want[il]);
                int64_t neq[3] = {sh->hdk, sh->n_head, nt}, nek[3] = {sh->hdk, sh->n_head_kv, nt},
                        nev[3] = {sh->hdv, sh->n_head_kv, nt};
                outs[il] = tsr_attention(ctx, c, il, tsr_input(ctx, TSR_TYPE_F32, 3, neq, q[il]),
                                         tsr_input(ctx, TSR_TYPE_F32, 3, nek, k[il]),
                                         tsr_input(ctx, TSR_TYPE_F32, 3, nev, v[il]), 0.2f);
            }
            CHECK(outs[0] && outs[1]);
            if (outs[0] && outs[1] && tsr_compute(ctx, outs, 2) == TSR_OK) {
                for (int il = 0; il < 2; il++) {
                    size_t on = (size_t)LS[il].n_head * LS[il].hdv * nt;
                    float *got = malloc(on * 4);
                    CHECK_OK(tsr_tensor_read(outs[il], got, 0, on * 4));
                    double e = tsrtest_nmse(got, want[il], on);
                    if (!(e < 5e-6))
                        fprintf(stderr, "layer shapes %s layer %d batch %d: nmse %g\n", CFGS[ci].name, il, bi, e);
                    CHECK(e < 5e-6);
                    free(got);
                }
            } else {
                CHECK(!"per-layer shapes: compute failed");
            }
            for (int il = 0; il < 2; il++)
                free(q[il]), free(k[il]), free(v[il]), free(want[il]);
            tsr_context_close(ctx);
        }
        /* a layer's own shape is checked */
        tsr_context *ctx = tsr_context_new(b);
        CHECK_OK(tsr_kv_cache_begin(c, ctx, 1, NULL, NULL));
        int64_t neq[3] = {32, 4, 1}, nek[3] = {32, 2, 1};
        tsr_tensor *tq = tsr_input(ctx, TSR_TYPE_F32, 3, neq, NULL), *tk = tsr_input(ctx, TSR_TYPE_F32, 3, nek, NULL);
        CHECK(tsr_attention(ctx, c, 1, tq, tk, tk, 1.0f) == NULL);
        tsr_context_close(ctx);
        ref_free(&ref[0]);
        ref_free(&ref[1]);
        tsr_kv_cache_free(c);
        tsr_backend_free(b);
    }
}

/* ---- step plans -------------------------------------------------------------- */

static void check_plan(int64_t n_kv, int64_t nt, int64_t nh, int64_t nkvh, size_t amb) {
    tsr_attn_steps pl;
    tsr__attention_plan(n_kv, nt, nh, nkvh, amb, &pl);
    size_t unit = (size_t)n_kv * 4; /* one score row (softmax is in place) */
    /* the bound is hard whenever one score row fits */
    if (amb >= unit)
        CHECK(unit * (size_t)pl.heads * (size_t)pl.tokens <= amb || pl.n_steps == 1);
    if (amb == 0 || unit * (size_t)nh * (size_t)nt <= amb)
        CHECK(pl.n_steps == 1 && pl.heads == nh && pl.tokens == nt);
    else
        CHECK(pl.n_steps > 1);
    int64_t g = nh / nkvh;
    if (pl.heads >= g && pl.tokens == nt)
        CHECK(pl.heads % g == 0);
}

static void test_plan(void) {
    tsr_attn_steps pl;
    /* SmolLM2 at 32k, 512 tokens, 64 MiB: 512 score rows: 1 head of 512 tokens per step */
    tsr__attention_plan(32768, 512, 9, 3, 64u << 20, &pl);
    CHECK(pl.heads == 1 && pl.tokens == 512 && pl.n_steps == 9);
    /* 256 MiB: 2048 rows, 4 heads of 512 tokens >= a group of 3: whole groups */
    tsr__attention_plan(32768, 512, 9, 3, 256u << 20, &pl);
    CHECK(pl.heads == 3 && pl.tokens == 512 && pl.n_steps == 3);
    /* 8k: 2048 rows per 64 MiB: whole groups; 2k: 36 MiB of scores fit in one step */
    tsr__attention_plan(8192, 512, 9, 3, 64u << 20, &pl);
    CHECK(pl.heads == 3 && pl.n_steps == 3);
    tsr__attention_plan(2048, 512, 9, 3, 64u << 20, &pl);
    CHECK(pl.n_steps == 1);
    /* 32k with 16 MiB: 128 rows: 1 head, blocks of 128 tokens */
    tsr__attention_plan(32768, 512, 9, 3, 16u << 20, &pl);
    CHECK(pl.heads == 1 && pl.tokens == 128 && pl.n_steps == 36);
    /* fits: one step */
    tsr__attention_plan(2048, 512, 9, 3, 256u << 20, &pl);
    CHECK(pl.n_steps == 1);
    /* not even one score row fits: one row per step */
    tsr__attention_plan(1 << 20, 3, 2, 1, 1024, &pl);
    CHECK(pl.heads == 1 && pl.tokens == 1 && pl.n_steps == 6);
    for (int64_t n_kv = 1; n_kv <= 4096; n_kv *= 4)
        for (int64_t nt = 1; nt <= 600; nt = nt * 3 + 1)
            for (size_t amb = 4096; amb <= (64u << 20); amb *= 8) {
                check_plan(n_kv, nt, 9, 3, amb);
                check_plan(n_kv, nt, 32, 8, amb);
                check_plan(n_kv, nt, 7, 7, amb);
                check_plan(n_kv, nt, 8, 1, amb);
            }
}

/* ---- compute-buffer bound ------------------------------------------------------ */

static size_t measure_attention(int flash, size_t amb, int64_t n_ctx, int64_t nt) {
    tsr_backend *b = new_backend(flash, amb);
    tsr_kv_cache_params p;
    tsr_kv_cache_params_init(&p, sizeof p);
    p.n_layers = 1;
    p.n_ctx = n_ctx;
    p.n_head_kv = 3;
    p.head_dim_k = p.head_dim_v = 64;
    tsr_kv_cache *c = NULL;
    CHECK_OK(tsr_kv_cache_new(b, &p, &c));
    tsr_context *ctx = tsr_context_new(b);
    CHECK_OK(tsr_kv_cache_begin_reserve(c, ctx, nt));
    int64_t neq[3] = {64, 9, nt}, nek[3] = {64, 3, nt};
    tsr_tensor *q = tsr_input(ctx, TSR_TYPE_F32, 3, neq, NULL), *k = tsr_input(ctx, TSR_TYPE_F32, 3, nek, NULL),
               *v = tsr_input(ctx, TSR_TYPE_F32, 3, nek, NULL);
    tsr_tensor *o = tsr_attention(ctx, c, 0, q, k, v, 0.125f);
    size_t sizes[8] = {0};
    CHECK(o != NULL);
    CHECK_OK(tsr_measure(ctx, &o, 1, sizes));
    CHECK(tsr_kv_cache_used(c) == 0);
    size_t cpu = tsr_backend_n_devices(b) - 1, r = sizes[cpu];
    tsr_context_close(ctx);
    tsr_kv_cache_free(c);
    tsr_backend_free(b);
    return r;
}

static void test_bound(void) {
    const int64_t nt = 512;
    const size_t out_bytes = 64 * 9 * nt * 4, amb = 4u << 20;
    size_t plain = measure_attention(0, 0, 4096, nt), chunked = measure_attention(0, amb, 4096, nt),
           flash = measure_attention(1, 0, 4096, nt);
    size_t scores = (size_t)4096 * nt * 9 * 4; /* softmax overwrites the scores in place */
    printf("compute buffer at n_ctx 4096, 512 tokens: plain %.2f MiB, amb 4 MiB %.2f MiB, flash %.2f MiB\n",
           plain / 1048576.0, chunked / 1048576.0, flash / 1048576.0);
    CHECK(plain >= scores);
    CHECK(chunked <= amb + 2 * out_bytes + 4096);
    CHECK(flash <= 2 * out_bytes + 4096);
    /* the bound does not grow with the context */
    size_t chunked_big = measure_attention(0, amb, 32768, nt);
    CHECK(chunked_big <= amb + 2 * out_bytes + 4096);
}

/* ---- cache bookkeeping and errors ---------------------------------------------- */

static tsr_kv_cache *small_cache(tsr_backend *b, int64_t n_ctx, int n_seq) {
    tsr_kv_cache_params p;
    tsr_kv_cache_params_init(&p, sizeof p);
    p.n_layers = 1;
    p.n_ctx = n_ctx;
    p.n_head_kv = 1;
    p.head_dim_k = p.head_dim_v = 32;
    p.n_seq = n_seq;
    p.n_batch_max = 64;
    tsr_kv_cache *c = NULL;
    CHECK_OK(tsr_kv_cache_new(b, &p, &c));
    return c;
}

static void test_full(void) {
    tsr_backend *b = new_backend(0, 0);
    tsr_kv_cache *c = small_cache(b, 16, 2);
    size_t kv0 = 0;
    CHECK_OK(tsr_backend_memory_plan(b, tsr_backend_n_devices(b) - 1, NULL, &kv0, NULL));
    CHECK(kv0 >= 2 * 16 * 32 * 2);
    tsr_context *ctx = tsr_context_new(b);
    int32_t pos[20], seq[20] = {0};
    for (int i = 0; i < 20; i++)
        pos[i] = i;
    CHECK_OK(tsr_kv_cache_begin(c, ctx, 10, pos, NULL));
    CHECK(tsr_kv_cache_used(c) == 10);
    tsr_tensor *m = tsr_kv_cache_mask(c);
    CHECK(m && tsr_tensor_ne(m, 0) == 16 && tsr_tensor_ne(m, 1) == 10);
    if (m) { /* causal: row i sees cells 0..i */
        uint16_t row[16];
        CHECK_OK(tsr_tensor_read(m, row, 3 * sizeof row, sizeof row));
        CHECK(row[3] == 0 && row[4] == 0xFC00 && row[0] == 0);
    }
    CHECK_STATUS(tsr_kv_cache_begin(c, ctx, 7, pos + 10, NULL), TSR_E_FULL);
    CHECK(tsr_kv_cache_used(c) == 10);
    CHECK_OK(tsr_kv_cache_begin(c, ctx, 6, pos + 10, NULL));
    CHECK(tsr_kv_cache_used(c) == 16);
    CHECK_STATUS(tsr_kv_cache_begin(c, ctx, 1, pos, seq), TSR_E_FULL);
    CHECK_OK(tsr_kv_cache_begin(c, ctx, 0, pos, NULL)); /* an empty batch always fits */
    CHECK_OK(tsr_kv_cache_remove(c, 0, 12, -1));
    CHECK(tsr_kv_cache_used(c) == 12);
    CHECK_OK(tsr_kv_cache_remove(c, 1, 0, -1)); /* other sequence: nothing */
    CHECK(tsr_kv_cache_used(c) == 12);
    /* default positions continue the sequence: 12, 13 */
    CHECK_OK(tsr_kv_cache_begin(c, ctx, 2, NULL, NULL));
    CHECK(tsr_kv_cache_used(c) == 14);
    /* sequence 1 sees only itself */
    seq[0] = 1;
    CHECK_OK(tsr_kv_cache_begin(c, ctx, 1, pos, seq));
    m = tsr_kv_cache_mask(c);
    if (m) {
        uint16_t row[16];
        CHECK_OK(tsr_tensor_read(m, row, 0, sizeof row));
        int seen = 0;
        for (int j = 0; j < 16; j++)
            seen += row[j] == 0;
        CHECK(seen == 1);
    }
    CHECK_STATUS(tsr_kv_cache_remove(c, 2, 0, -1), TSR_E_INVALID);
    tsr_kv_cache_clear(c);
    CHECK(tsr_kv_cache_used(c) == 0);
    CHECK(tsr_kv_cache_n_ctx(c) == 16);
    tsr_context_close(ctx);
    tsr_kv_cache_free(c);
    size_t kv1 = 1;
    CHECK_OK(tsr_backend_memory_plan(b, tsr_backend_n_devices(b) - 1, NULL, &kv1, NULL));
    CHECK(kv1 == 0);
    tsr_backend_free(b);
}

static void test_errors(void) {
    tsr_backend *b = new_backend(0, 0);
    tsr_kv_cache_params p;
    tsr_kv_cache_params_init(&p, sizeof p);
    CHECK(p.type_k == TSR_TYPE_F16 && p.type_v == TSR_TYPE_F16 && p.n_seq == 1 && p.n_batch_max == 512);
    tsr_kv_cache *c = NULL;
    CHECK_STATUS(tsr_kv_cache_new(b, &p, &c), TSR_E_INVALID); /* no layers */
    CHECK(c == NULL);
    CHECK_STATUS(tsr_kv_cache_new(NULL, &p, &c), TSR_E_INVALID);
    p.n_layers = 1, p.n_ctx = 8, p.n_head_kv = 1, p.head_dim_k = p.head_dim_v = 32;
    p.type_v = TSR_TYPE_Q8_0;
    CHECK_STATUS(tsr_kv_cache_new(b, &p, &c), TSR_E_UNSUPPORTED); /* transposed V cannot be q8_0 */
    p.type_v = TSR_TYPE_Q4_K;
    CHECK_STATUS(tsr_kv_cache_new(b, &p, &c), TSR_E_UNSUPPORTED);
    p.type_v = TSR_TYPE_F16, p.type_k = TSR_TYPE_Q8_0, p.head_dim_k = 16;
    CHECK_STATUS(tsr_kv_cache_new(b, &p, &c), TSR_E_INVALID); /* 16 is not a multiple of 32 */
    /* far more than the machine has: fails cleanly, nothing counted */
    p.type_k = TSR_TYPE_F32, p.head_dim_k = 128, p.head_dim_v = 128, p.n_head_kv = 64, p.n_layers = 64;
    p.n_ctx = (int64_t)1 << 30;
    tsr_status s = tsr_kv_cache_new(b, &p, &c);
    CHECK(s == TSR_E_DEVICE_NOMEM || s == TSR_E_NOMEM || s == TSR_E_INVALID);
    CHECK(c == NULL);
    size_t kv = 1;
    CHECK_OK(tsr_backend_memory_plan(b, tsr_backend_n_devices(b) - 1, NULL, &kv, NULL));
    CHECK(kv == 0);

    c = small_cache(b, 32, 1);
    tsr_context *ctx = tsr_context_new(b);
    int64_t ne[3] = {32, 2, 4}, nek[3] = {32, 1, 4};
    tsr_tensor *q = tsr_input(ctx, TSR_TYPE_F32, 3, ne, NULL), *k = tsr_input(ctx, TSR_TYPE_F32, 3, nek, NULL);
    CHECK(tsr_attention(ctx, c, 0, q, k, k, 1.0f) == NULL); /* no begin yet */
    CHECK(tsr_context_status(ctx) == TSR_E_STATE);
    tsr_context_close(ctx);
    ctx = tsr_context_new(b);
    q = tsr_input(ctx, TSR_TYPE_F32, 3, ne, NULL), k = tsr_input(ctx, TSR_TYPE_F32, 3, nek, NULL);
    int32_t pos[65] = {0}, seq[1] = {3};
    CHECK_STATUS(tsr_kv_cache_begin(c, ctx, 65, pos, NULL), TSR_E_RANGE);
    CHECK_STATUS(tsr_kv_cache_begin(c, ctx, 1, pos, seq), TSR_E_INVALID);
    pos[0] = -1;
    CHECK_STATUS(tsr_kv_cache_begin(c, ctx, 1, pos, NULL), TSR_E_INVALID);
    CHECK(tsr_kv_cache_used(c) == 0);
    for (int i = 0; i < 4; i++)
        pos[i] = i;
    CHECK_OK(tsr_kv_cache_begin(c, ctx, 4, pos, NULL));
    CHECK(tsr_attention(ctx, c, 1, q, k, k, 1.0f) == NULL); /* layer 1 of 1 */
    CHECK(tsr_context_status(ctx) == TSR_E_RANGE);
    tsr_context_close(ctx);
    ctx = tsr_context_new(b);
    CHECK_OK(tsr_kv_cache_begin(c, ctx, 3, NULL, NULL));
    q = tsr_input(ctx, TSR_TYPE_F32, 3, ne, NULL), k = tsr_input(ctx, TSR_TYPE_F32, 3, nek, NULL);
    CHECK(tsr_attention(ctx, c, 0, q, k, k, 1.0f) == NULL); /* 4 tokens, batch of 3 */
    CHECK(tsr_context_status(ctx) == TSR_E_INVALID);
    CHECK(tsr_attention(ctx, c, 0, NULL, k, k, 1.0f) == NULL);
    CHECK(tsr_attention(NULL, c, 0, q, k, k, 1.0f) == NULL);
    tsr_context_close(ctx);
    ctx = tsr_context_new(b);
    int64_t ne5[3] = {32, 3, 4};
    q = tsr_input(ctx, TSR_TYPE_F32, 3, ne5, NULL);
    k = tsr_input(ctx, TSR_TYPE_F32, 3, ne, NULL);
    CHECK(tsr_attention_nocache(ctx, q, k, k, NULL, 1.0f) == NULL); /* 3 heads over 2 KV heads */
    CHECK(tsr_context_status(ctx) == TSR_E_INVALID);
    tsr_context_close(ctx);
    tsr_kv_cache_free(c);
    tsr_kv_cache_free(NULL);
    tsr_kv_cache_clear(NULL);
    CHECK(tsr_kv_cache_used(NULL) == 0 && tsr_kv_cache_mask(NULL) == NULL);
    tsr_backend_free(b);
}

/* Every allocation failing in turn: a clean status and no crash; leaks
 * show under valgrind/ASan. */
static void test_alloc_failures(void) {
    tsr_backend *b = new_backend(0, 256);
    for (int64_t n = 0; n < 200; n++) {
        tsr__fail_alloc_after(n);
        tsr_kv_cache_params p;
        tsr_kv_cache_params_init(&p, sizeof p);
        p.n_layers = 2, p.n_ctx = 64, p.n_head_kv = 1, p.head_dim_k = p.head_dim_v = 32;
        tsr_kv_cache *c = NULL;
        tsr_context *ctx = NULL;
        tsr_status s = tsr_kv_cache_new(b, &p, &c);
        if (s == TSR_OK && (ctx = tsr_context_new(b)) != NULL && tsr_kv_cache_begin(c, ctx, 5, NULL, NULL) == TSR_OK) {
            int64_t ne[3] = {32, 2, 5}, nek[3] = {32, 1, 5};
            tsr_tensor *q = tsr_input(ctx, TSR_TYPE_F32, 3, ne, NULL), *k = tsr_input(ctx, TSR_TYPE_F32, 3, nek, NULL);
            tsr_tensor *o = tsr_attention(ctx, c, 1, q, k, k, 1.0f);
            if (o)
                tsr_compute(ctx, &o, 1);
        }
        tsr__fail_alloc_after(-1);
        tsr_context_close(ctx);
        tsr_kv_cache_free(c);
    }
    size_t kv = 1;
    CHECK_OK(tsr_backend_memory_plan(b, tsr_backend_n_devices(b) - 1, NULL, &kv, NULL));
    CHECK(kv == 0);
    tsr_backend_free(b);
}

/* ---- batch invariance (tsr_backend_params.batch_invariant) ------------------------
 * On a batch-invariant backend the first query row of a fused attention and
 * the first column of a matmul (Q4_0, Q4_1, Q8_0, Q4_K, F16 and F32 weights,
 * and an expert's through mul_mat_id) have the same bits whatever the
 * number of other rows or columns computed with them: 1, 2, 3, 7, 16, 37 and
 * 100 query tokens against 40, 300 and 700 keys (one, two and three key
 * splits; padding cells masked), GQA. TSR_TEST_VARIANT=1 runs it on an
 * ordinary backend: then the AVX2 and AVX-512 kernels fail it. */
static float inv_val(uint64_t *st) { return (float)((tsrtest_rand_u64(st) >> 40) * (1.0 / 16777216.0)) - 0.5f; }

static tsr_backend *inv_backend(void) {
    tsr_backend_params p;
    tsr_backend_params_init(&p, sizeof p);
    p.n_threads = 2;
    p.flash_attn = TSR_FLASH_ATTN_ON;
    p.batch_invariant = !getenv("TSR_TEST_VARIANT");
    tsr_backend *b = NULL;
    CHECK_OK(tsr_backend_new(&p, &b));
    return b;
}

static void inv_attention(tsr_backend *b, int64_t n_kv) {
    enum { HD = 64, NH = 6, NKV = 2, MAXQ = 100 };
    uint64_t st = 0xA77E + (uint64_t)n_kv;
    float *q = malloc(sizeof(float) * HD * MAXQ * NH), *kf = malloc(sizeof(float) * HD * n_kv * NKV);
    float *vf = malloc(sizeof(float) * HD * n_kv * NKV), *mask = malloc(sizeof(float) * n_kv * MAXQ);
    uint16_t *k16 = malloc(2 * HD * n_kv * NKV), *v16 = malloc(2 * HD * n_kv * NKV);
    float first[HD * NH], out[HD * NH];
    for (int64_t i = 0; i < HD * MAXQ * NH; i++) q[i] = 2 * inv_val(&st);
    for (int64_t i = 0; i < HD * n_kv * NKV; i++) {
        kf[i] = inv_val(&st);
        vf[i] = inv_val(&st);
    }
    for (int64_t i = 0; i < HD * n_kv * NKV; i++) {
        k16[i] = tsr_fp32_to_fp16(kf[i]);
        v16[i] = tsr_fp32_to_fp16(vf[i]);
    }
    const int64_t live = n_kv - 13; /* the last cells: padding, masked for every row */
    static const int NQ[] = {1, 2, 3, 7, 16, 37, 100};
    for (size_t c = 0; c < sizeof NQ / sizeof NQ[0]; c++) {
        const int64_t nq = NQ[c];
        /* q rows token-major in [HD, nq, NH]: the first token's rows stay the same */
        float *qq = malloc(sizeof(float) * HD * nq * NH);
        for (int64_t h = 0; h < NH; h++)
            for (int64_t t = 0; t < nq; t++)
                memcpy(qq + (h * nq + t) * HD, q + (h * MAXQ + t) * HD, sizeof(float) * HD);
        for (int64_t t = 0; t < nq; t++) /* token t sees keys [0, live - 2 * t): causal-like */
            for (int64_t j = 0; j < n_kv; j++) mask[t * n_kv + j] = j < live - 2 * t ? 0.0f : -INFINITY;
        tsr_context *ctx = tsr_context_new(b);
        int64_t nqe[3] = {HD, nq, NH}, nke[3] = {HD, n_kv, NKV}, nme[2] = {n_kv, nq};
        tsr_tensor *o = tsr_flash_attn(
            ctx, tsr_input(ctx, TSR_TYPE_F32, 3, nqe, qq), tsr_input(ctx, TSR_TYPE_F16, 3, nke, k16),
            tsr_input(ctx, TSR_TYPE_F16, 3, nke, v16), tsr_input(ctx, TSR_TYPE_F32, 2, nme, mask), 0.125f);
        CHECK(o && tsr_compute(ctx, &o, 1) == TSR_OK, "%s", tsr_last_error());
        if (o) {
            CHECK_OK(tsr_tensor_read(o, nq == 1 ? first : out, 0, sizeof out)); /* token 0: [HD, NH] */
            if (nq > 1)
                CHECK(memcmp(first, out, sizeof out) == 0,
                      "flash attention, %lld keys: token 0 of %lld differs from alone", (long long)n_kv, (long long)nq);
        }
        tsr_context_close(ctx);
        free(qq);
    }
    free(q);
    free(kf);
    free(vf);
    free(mask);
    free(k16);
    free(v16);
}

static void inv_matmul(tsr_backend *b, const char *tname, int id) {
    enum { K = 512, M = 96, MAXN = 37, NX = 4 };
    tsr_type t;
    CHECK_OK(tsr_type_by_name(tname, &t));
    uint64_t st = 0x3A7 + (uint64_t)t;
    const int64_t nw = id ? NX : 1;
    float *w = malloc(sizeof(float) * K * M * nw), *x = malloc(sizeof(float) * K * MAXN);
    for (int64_t i = 0; i < K * M * nw; i++) w[i] = inv_val(&st);
    for (int64_t i = 0; i < K * MAXN; i++) x[i] = inv_val(&st);
    const size_t wb = tsr_row_size(t, K) * M * nw;
    void *wq = malloc(wb);
    CHECK_OK(tsr_quantize(t, w, wq, K * M * nw));
    float first[M], out[M];
    static const int NC[] = {1, 2, 3, 5, 8, 16, 37};
    for (size_t c = 0; c < sizeof NC / sizeof NC[0]; c++) {
        const int64_t n = NC[c];
        tsr_context *ctx = tsr_context_new(b);
        int64_t we[3] = {K, M, nw}, xe[2] = {K, n};
        tsr_tensor *W = tsr_input(ctx, t, id ? 3 : 2, we, wq), *o;
        if (id) { /* every token uses experts 2 and 0 (in that order): expert 2 gets n columns */
            int64_t xe3[3] = {K, 1, n}, ie[2] = {2, n};
            int32_t ids[2 * MAXN];
            for (int64_t i = 0; i < n; i++) {
                ids[2 * i] = 2;
                ids[2 * i + 1] = 0;
            }
            o = tsr_mul_mat_id(ctx, W, tsr_input(ctx, TSR_TYPE_F32, 3, xe3, x),
                               tsr_input(ctx, TSR_TYPE_I32, 2, ie, ids));
        } else {
            o = tsr_mul_mat(ctx, W, tsr_input(ctx, TSR_TYPE_F32, 2, xe, x));
        }
        CHECK(o && tsr_compute(ctx, &o, 1) == TSR_OK, "%s", tsr_last_error());
        if (o) {
            CHECK_OK(tsr_tensor_read(o, n == 1 ? first : out, 0, sizeof out)); /* column (token) 0, slot 0 */
            if (n > 1)
                CHECK(memcmp(first, out, sizeof out) == 0, "%s %s: column 0 of %lld differs from alone",
                      id ? "mul_mat_id" : "mul_mat", tname, (long long)n);
        }
        tsr_context_close(ctx);
    }
    free(w);
    free(x);
    free(wq);
}

static void test_invariant(void) {
    tsr_backend *b = inv_backend();
    if (!b)
        return;
    static const int64_t NKV[] = {40, 300, 700};
    for (size_t i = 0; i < sizeof NKV / sizeof NKV[0]; i++) inv_attention(b, NKV[i]);
    static const char *TYPES[] = {"q4_0", "q4_1", "q8_0", "q4_K", "q6_K", "f16", "f32"};
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) {
        inv_matmul(b, TYPES[i], 0);
        inv_matmul(b, TYPES[i], 1);
    }
    tsr_backend_free(b);
}

int main(void) {
    test_invariant();
    test_v_in_k();
    test_plan();
    test_errors();
    test_full();
    test_empty();
    test_layer_shapes();
    test_nocache();
    test_bound();
    test_paths();
    test_again();
    test_windows();
    test_alloc_failures();
    return tsrtest_done("test-attention");
}
