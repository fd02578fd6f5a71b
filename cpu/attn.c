/*
 * attn.c - fused attention (ggml's flash_attn_ext semantics), tiled:
 *
 *  - A task is one block of up to RB_MAX query rows of one KV group (the rows
 *    are (token, head) pairs of the heads sharing a KV head, token-major),
 *    so each K/V block converted to F32 serves every query row of the block.
 *  - For each block of BK keys: the mask rows are read first and a block
 *    every row of which is fully masked (causal future, unused padding
 *    cells) is skipped before any K/V is touched; then scores = Q x K^T as
 *    a small matmul against the stored K rows (gemm_f32_nt: F16 rows are
 *    converted once per block inside it, other types to F32 rows first),
 *    then one softmax_step per row (scale + mask + row max + exps, online
 *    softmax in F32: the accumulator is rescaled when the max moves), and
 *    O += P x V (gemm_f32, F16 V read in place).
 *  - When there are too few tasks for the threads (decode) the keys are
 *    split too: each split writes an unnormalized partial (O, max, sum) per
 *    row and, after a barrier, the partials are merged. With few query rows
 *    only the keys some mask row sees are split (live_keys).
 * The block kernels (gemm_f32, gemm_f32_nt, softmax_step) come from the
 * per-CPU kernel table, so the scalar table is the reference variant.
 *
 * A batch-invariant node (TSR_FLAG_BATCHINV) is planned from its keys
 * alone, never from its query rows: a task is one token's heads of a KV
 * group, and the keys are always split at fixed multiples of INV_SPLIT_KEYS,
 * the partials merged in key order (merge_row). So a query row's bits do not
 * depend on the other tokens of its batch. With few tasks (decode) the
 * splits are spread over the threads as above; with many (prefill) each
 * task runs its splits one after another into the thread's own partials
 * and merges them itself, so the work buffer does not grow with the rows.
 */
#include "cpu.h"

#include <math.h>

#define RB_MAX 256 /* query rows per task: each converted K/V block serves them all */
#define RB_MIN 64  /* ... but at least this many, when there are rows enough */
#define BK 64      /* keys per block */

#define INV_SPLIT_KEYS (4 * BK) /* batch invariant: keys per split */

typedef struct plan {
    int64_t group;     /* query heads per KV head */
    int64_t rows;      /* query rows of one KV group: group * n_q */
    int64_t rb;        /* rows per task */
    int64_t n_tasks;   /* n_seq * n_head_kv * ceil(rows / rb) */
    int64_t n_split;   /* key ranges per task */
    int64_t kv_split;  /* keys per range (a multiple of BK) */
    int64_t n_kv;      /* keys [0, n_kv) are looked at: past them every mask row is -inf */
    int64_t split_cap; /* n_split's bound for any n_kv up to this one (the work buffer's partials) */
    bool local;        /* batch invariant, many tasks: each task merges its own splits (thread's partials) */
    /* few mask rows (decode): each row's live keys [live_lo, live_hi), row
     * (s * live_nh + h) * live_nq + i (live_keys); live_nq 0: not known */
    int64_t live_nq, live_nh;
    int32_t live_lo[64], live_hi[64];
} plan;

/* Big row blocks (K/V traffic and conversion shrink with the rows served
 * per block) unless that leaves threads idle. A task holds whole tokens
 * (all heads of the group), and from BK / 2 tokens on a multiple of BK of
 * them: then causal masks cut through one key block per task, not two.
 * Too few tasks even then (decode): split the keys (each split costs a
 * partial per row and a merge). The plan is made for PLAN_THREADS threads
 * whatever the real count, so that the rows per task (which pick the score
 * kernel's path) and the key splits (which set the order the partials are
 * merged in) depend on the shapes (and the mask's values) alone: the result
 * is the same for any number of threads. The tasks are handed out
 * dynamically to the threads there are. */
#define PLAN_THREADS 16
static void make_plan(const tsr_tensor *dst, int64_t n_kv, plan *pl) {
    const int nth = PLAN_THREADS;
    const tsr_tensor *q = dst->src[0], *kt = dst->src[1];
    pl->group = q->ne[2] / kt->ne[2];
    pl->rows = pl->group * q->ne[1];
    const int64_t groups = q->ne[3] * kt->ne[2], g = pl->group > 0 ? pl->group : 1;
    const int64_t want = (pl->rows * groups + 2 * (int64_t)nth - 1) / (2 * (int64_t)nth);
    int64_t rb = want > RB_MAX ? RB_MAX : want < RB_MIN ? RB_MIN : want;
    int64_t tq = (rb + g - 1) / g; /* tokens per task */
    if (tq >= BK / 2 && ((tq + BK - 1) / BK) * BK * g <= RB_MAX)
        tq = (tq + BK - 1) / BK * BK;
    if (tq * g > RB_MAX) /* g not dividing RB_MAX: whole tokens, at most RB_MAX rows (g > RB_MAX: one token) */
        tq = RB_MAX / g > 0 ? RB_MAX / g : 1;
    rb = tq * g;
    const bool inv = dst->flags & TSR_FLAG_BATCHINV;
    if (inv) /* one token per task, whatever the batch */
        rb = g;
    if (rb > pl->rows)
        rb = pl->rows;
    pl->rb = rb < 1 ? 1 : rb;
    pl->n_tasks = groups * ((pl->rows + pl->rb - 1) / pl->rb);
    pl->n_kv = n_kv;
    pl->local = false;
    pl->live_nq = 0;
    if (inv) { /* fixed key ranges (more keys, never fewer splits: split_cap holds) */
        pl->kv_split = INV_SPLIT_KEYS;
        pl->n_split = n_kv > 0 ? (n_kv + INV_SPLIT_KEYS - 1) / INV_SPLIT_KEYS : 1;
        pl->split_cap = pl->n_split;
        pl->local = pl->n_split > 1 && pl->n_tasks >= (int64_t)nth;
        return;
    }
    const int64_t n_blk = (n_kv + BK - 1) / BK;
    pl->n_split = 1;
    if (pl->n_tasks > 0 && pl->n_tasks < (int64_t)nth && n_blk > 1) {
        const int64_t n = (4 * (int64_t)nth + pl->n_tasks - 1) / pl->n_tasks;
        pl->n_split = n < n_blk ? n : n_blk;
    }
    /* fewer keys never give more splits than this (the rounding below can
     * give more than the same for more keys) */
    pl->split_cap = pl->n_split;
    pl->kv_split = (n_blk + pl->n_split - 1) / pl->n_split * BK;
    if (pl->kv_split < BK)
        pl->kv_split = BK;
    pl->n_split = n_kv > 0 ? (n_kv + pl->kv_split - 1) / pl->kv_split : 1;
}

/* ---- work buffer ------------------------------------------------------------- */

typedef struct scratch {
    float *qf, *kb, *vb, *s; /* rb x dk, BK x dk, BK x dv, rb x BK */
    float *o, *m, *l, *mtmp; /* rb x dv, rb, rb, rb x BK (converted mask rows) */
    const float **mrow;      /* rb: a row's mask in the block (load_mask) */
    bool *dead;              /* rb: the row is fully masked in the block */
    float *part;             /* plan.local: split_cap partials of the task (partial_floats each) */
} scratch;

static size_t fbytes(int64_t n) { return tsr__pad((size_t)n * sizeof(float), TSR_ALIGN); }

static size_t per_thread(const tsr_tensor *dst, const plan *pl, scratch *sc, char *base) {
    const int64_t dk = dst->src[0]->ne[0], dv = dst->src[2]->ne[0], rb = pl->rb;
    size_t off = 0;
#define TAKE(field, T, bytes)            \
    do {                                 \
        if (sc)                          \
            sc->field = (T)(base + off); \
        off += (bytes);                  \
    } while (0)
    TAKE(qf, float *, fbytes(rb * dk));
    TAKE(kb, float *, fbytes(dk * BK));
    TAKE(vb, float *, fbytes(BK * dv));
    TAKE(s, float *, fbytes(rb * BK));
    TAKE(o, float *, fbytes(rb * dv));
    TAKE(m, float *, fbytes(rb));
    TAKE(l, float *, fbytes(rb));
    TAKE(mtmp, float *, fbytes(rb * BK));
    TAKE(mrow, const float **, tsr__pad((size_t)rb * sizeof(float *), TSR_ALIGN));
    TAKE(dead, bool *, tsr__pad((size_t)rb, TSR_ALIGN));
    /* a task's partials, split after split (plan.local) */
    TAKE(part, float *, pl->local ? fbytes(rb * (dst->src[2]->ne[0] + 2) * pl->split_cap) : 0);
#undef TAKE
    return off;
}

/* Partials of every (task, split): rb rows of dv sums, then rb maxes, rb sums. */
static size_t partial_floats(const tsr_tensor *dst, const plan *pl) {
    return (size_t)pl->rb * (size_t)(dst->src[2]->ne[0] + 2);
}
static size_t partials_of(const tsr_tensor *dst, const plan *pl, int64_t n_split) {
    if (pl->local || n_split <= 1)
        return 0;
    return tsr__pad(partial_floats(dst, pl) * 4 * (size_t)(pl->n_tasks * n_split), TSR_ALIGN);
}
static size_t partial_bytes(const tsr_tensor *dst, const plan *pl) { return partials_of(dst, pl, pl->n_split); }

size_t tsr__cpu_flash_attn_work(const tsr_tensor *dst, int nth) {
    plan pl;
    (void)nth;
    make_plan(dst, dst->src[1]->ne[1], &pl); /* the op plans for the live keys, at most these */
    return partials_of(dst, &pl, pl.split_cap) + (size_t)nth * per_thread(dst, &pl, NULL, NULL);
}

/* ---- one task ---------------------------------------------------------------------- */

typedef struct task {
    int64_t s, hk, r0, nr; /* sequence, KV head, first row of the group, rows */
    int64_t j0, j1;        /* key range */
    int64_t slot;          /* partial: task * n_split + split */
    bool span;             /* prefetch_kv: the first KV head's task fetches them all */
} task;

static void task_at(const tsr_tensor *dst, const plan *pl, int64_t item, task *t) {
    const tsr_tensor *kt = dst->src[1];
    /* the tasks of one key range next to each other: the KV heads of a cell
     * share its cache rows, so with splits (decode) their reads meet in cache */
    const int64_t it = item % pl->n_tasks, sp = item / pl->n_tasks;
    const int64_t n_rb = (pl->rows + pl->rb - 1) / pl->rb;
    t->r0 = (it % n_rb) * pl->rb;
    t->nr = pl->rows - t->r0 < pl->rb ? pl->rows - t->r0 : pl->rb;
    t->hk = (it / n_rb) % kt->ne[2];
    t->s = it / (n_rb * kt->ne[2]);
    t->j0 = sp * pl->kv_split;
    t->slot = it * pl->n_split + sp;
    t->j1 = t->j0 + pl->kv_split < pl->n_kv ? t->j0 + pl->kv_split : pl->n_kv;
    t->span = false;
}

/* Address off bytes into x's data. A zero-sized tensor (heads of no
 * elements, say) may have no data: NULL then, never arithmetic on NULL; the
 * rows read there are empty. */
static inline const char *at(const tsr_tensor *x, int64_t off) { return x->data ? (const char *)x->data + off : NULL; }

/* Row r of a task: token and head. */
static void row_at(const plan *pl, const task *t, int64_t r, int64_t *iq, int64_t *h) {
    const int64_t idx = t->r0 + r;
    *iq = idx / pl->group;
    *h = t->hk * pl->group + idx % pl->group;
}

static void load_q(const tsr_tensor *dst, const plan *pl, const task *t, const scratch *sc) {
    const tsr_tensor *q = dst->src[0];
    const int64_t dk = q->ne[0];
    for (int64_t r = 0; r < t->nr; r++) {
        int64_t iq, h;
        row_at(pl, t, r, &iq, &h);
        const char *row = at(q, iq * (int64_t)q->nb[1] + h * (int64_t)q->nb[2] + t->s * (int64_t)q->nb[3]);
        float *qf = sc->qf + r * dk;
        if (dk == 0)
            continue;
        if (q->nb[0] == sizeof(float))
            memcpy(qf, row, (size_t)dk * sizeof(float));
        else
            for (int64_t i = 0; i < dk; i++) memcpy(&qf[i], row + i * (int64_t)q->nb[0], 4);
    }
}

/* How a mask row segment of n elements of esz bytes reads: all zeros (no
 * add needed), all -inf (row dead there) or anything else. Compares bits,
 * so the common causal blocks need no conversion. */
enum { SEG_ZERO, SEG_DEAD, SEG_MIXED };

static int classify(const char *src, int64_t n, size_t esz) {
    const uint64_t ninf = esz == 2 ? 0xFC00FC00FC00FC00u : 0xFF800000FF800000u;
    const int64_t bytes = n * (int64_t)esz;
    uint64_t any = 0, not_ninf = 0;
    int64_t b = 0;
    for (; b + 8 <= bytes; b += 8) { /* 8 bytes at a time */
        uint64_t w;
        memcpy(&w, src + b, 8);
        any |= w;
        not_ninf |= w ^ ninf;
    }
    for (; b < bytes; b += (int64_t)esz) {
        uint32_t w = 0;
        memcpy(&w, src + b, esz);
        any |= w;
        not_ninf |= w ^ (esz == 2 ? 0xFC00u : 0xFF800000u); /* one element's -inf */
    }
    return !any ? SEG_ZERO : !not_ninf ? SEG_DEAD : SEG_MIXED;
}

/* Mask rows of the block [j0, j0 + n) as F32 (mrow[r]; NULL: nothing to
 * add), dead[r] when row r is fully masked there; returns false when every
 * row is. Rows of the same token and mask head share one look. */
static bool load_mask(const tsr_compute_params *p, const tsr_tensor *dst, const plan *pl, const task *t, int64_t j0,
                      int64_t n, const scratch *sc, const float **mrow, bool *dead) {
    const tsr_tensor *mask = dst->src[3];
    if (!mask) {
        for (int64_t r = 0; r < t->nr; r++) mrow[r] = NULL, dead[r] = false;
        return true;
    }
    const size_t esz = mask->type == TSR_TYPE_F32 ? 4 : 2;
    const char *prev = NULL;
    bool any = false;
    for (int64_t r = 0; r < t->nr; r++) {
        int64_t iq, h;
        row_at(pl, t, r, &iq, &h);
        const char *src = at(mask, iq * (int64_t)mask->nb[1] + (h % mask->ne[2]) * (int64_t)mask->nb[2] +
                                       (t->s % mask->ne[3]) * (int64_t)mask->nb[3] + j0 * (int64_t)mask->nb[0]);
        if (src == prev) {
            mrow[r] = mrow[r - 1];
            dead[r] = dead[r - 1];
            continue;
        }
        prev = src;
        /* the rows are far apart (one per token): fetch the next block's
         * segment now, or every look waits on memory */
        for (size_t b = 0; b < (size_t)BK * esz && mask->nb[0] == esz; b += 64) __builtin_prefetch(src + BK * esz + b);
        float *m = sc->mtmp + r * BK;
        if (mask->nb[0] != esz) { /* strided mask: convert, then look */
            for (int64_t j = 0; j < n; j++) m[j] = tsr__cpu_load_f(mask->type, src + j * (int64_t)mask->nb[0]);
            src = (const char *)m;
        }
        const int c = classify(src, n, mask->nb[0] != esz ? 4 : esz);
        dead[r] = c == SEG_DEAD;
        any |= !dead[r];
        if (c != SEG_MIXED)
            mrow[r] = NULL;
        else if (mask->type == TSR_TYPE_F32 || mask->nb[0] != esz)
            mrow[r] = (const float *)src;
        else {
            p->k->to_float[mask->type](src, m, n);
            mrow[r] = m;
        }
    }
    return any;
}

/* Whether the task's first row is fully masked in [j0, j0 + n) (false when
 * the mask is strided or absent): a dead block's look ahead, which keys to
 * fetch. With the cells of each sequence together (per_seq_cells) a decode
 * token's row is dead but for its own sequence's cells; fetching every
 * block after a dead one took 12% of tensr-server's time at 8 streams
 * (SmolLM2, 8 slots of 1024 cells, Zen 4). */
static bool row0_dead(const tsr_tensor *dst, const plan *pl, const task *t, int64_t j0, int64_t n) {
    const tsr_tensor *mask = dst->src[3];
    const size_t esz = mask && mask->type == TSR_TYPE_F32 ? 4 : 2;
    if (!mask || !mask->data || mask->nb[0] != esz)
        return false;
    int64_t iq, h;
    row_at(pl, t, 0, &iq, &h);
    const char *src = at(mask, iq * (int64_t)mask->nb[1] + (h % mask->ne[2]) * (int64_t)mask->nb[2] +
                                   (t->s % mask->ne[3]) * (int64_t)mask->nb[3] + j0 * (int64_t)mask->nb[0]);
    return classify(src, n, esz) == SEG_DEAD;
}

static const char *kv_row(const tsr_tensor *x, int64_t j, const task *t) {
    return at(x, j * (int64_t)x->nb[1] + t->hk * (int64_t)x->nb[2] + t->s * (int64_t)x->nb[3]);
}

/* Row r of S, columns c to c + n - 1: q_r . k_j for the keys j0 + c to
 * j0 + c + n - 1 of the block (each score the same whatever the keys of
 * the call). */
static void scores(const tsr_compute_params *p, const tsr_tensor *dst, const task *t, int64_t j0, int64_t c, int64_t n,
                   const scratch *sc) {
    const tsr_tensor *kt = dst->src[1];
    const tsr_cpu_kernels *k = p->k;
    const int64_t dk = kt->ne[0];
    float *const s = sc->s + c;
    j0 += c;
    if (kt->type == TSR_TYPE_F32 || kt->type == TSR_TYPE_F16) { /* read in place */
        const size_t esz = kt->type == TSR_TYPE_F32 ? 4 : 2;
        k->gemm_f32_nt(t->nr, n, dk, sc->qf, dk, kv_row(kt, j0, t), esz == 2, (int64_t)(kt->nb[1] / esz), s, BK);
        return;
    }
    for (int64_t j = 0; j < n; j++) k->to_float[kt->type](kv_row(kt, j0 + j, t), sc->kb + j * dk, dk);
    k->gemm_f32_nt(t->nr, n, dk, sc->qf, dk, sc->kb, false, dk, s, BK);
}

/* Online softmax of the block's scores, row by row; S becomes P. The
 * running max m of a row is raised only when a score passes it by more than
 * SLACK: the exps stay below e^SLACK (P, l and O alike, the same ratios),
 * and the accumulator is rescaled rarely instead of at nearly every block
 * of a causal prompt. The first block of a row needs no rescale at all. */
#define SLACK 8.0f
static void softmax_block(const tsr_compute_params *p, const tsr_tensor *dst, const task *t, int64_t n,
                          const scratch *sc, const float *const *mrow, const bool *dead) {
    const float scale = tsr__get_f32_param(dst, 0);
    const int64_t dv = dst->src[2]->ne[0];
    for (int64_t r = 0; r < t->nr; r++) {
        float *s = sc->s + r * BK;
        if (dead[r]) { /* fully masked here: no weight */
            memset(s, 0, (size_t)n * sizeof *s);
            continue;
        }
        const float mold = sc->m[r];
        const float sum = p->k->softmax_step(n, s, scale, mrow[r], &sc->m[r], SLACK);
        if (sc->m[r] != mold && mold != -INFINITY) { /* -inf: nothing summed yet, O and l are 0 */
            const float alpha = expf(mold - sc->m[r]);
            float *o = sc->o + r * dv;
            for (int64_t i = 0; i < dv; i++) o[i] *= alpha;
            sc->l[r] *= alpha;
        }
        sc->l[r] += sum;
    }
}

/* O += P x V over the keys j0 + c to j0 + c + n - 1 of the block (key after key
 * into O: cutting the keys changes nothing). */
static void v_block(const tsr_compute_params *p, const tsr_tensor *dst, const task *t, int64_t j0, int64_t c, int64_t n,
                    const scratch *sc) {
    const tsr_tensor *v = dst->src[2];
    const int64_t dv = v->ne[0];
    const float *const s = sc->s + c;
    j0 += c;
    if (v->type == TSR_TYPE_F32 || v->type == TSR_TYPE_F16) { /* read in place (F16 converted in registers) */
        const size_t esz = v->type == TSR_TYPE_F32 ? 4 : 2;
        p->k->gemm_f32(t->nr, dv, n, s, BK, kv_row(v, j0, t), esz == 2, (int64_t)(v->nb[1] / esz), sc->o, dv, true);
        return;
    }
    for (int64_t j = 0; j < n; j++) p->k->to_float[v->type](kv_row(v, j0 + j, t), sc->vb + j * dv, dv);
    p->k->gemm_f32(t->nr, dv, n, s, BK, sc->vb, false, dv, sc->o, dv, true);
}

static float *dst_row(const tsr_tensor *dst, const plan *pl, const task *t, int64_t r) {
    int64_t iq, h;
    row_at(pl, t, r, &iq, &h);
    return (float *)((char *)dst->data + h * (int64_t)dst->nb[1] + iq * (int64_t)dst->nb[2] +
                     t->s * (int64_t)dst->nb[3]);
}

/* With few rows a block's work is short next to fetching its K and V rows
 * (strided: one head's part of each cell), which the hardware prefetchers
 * do not run ahead of, and a core has few requests in flight: the rows are
 * requested (into L2) PF_KEYS keys at a time between kernel calls of as
 * many keys, each half a block ahead (a block's values while its scores
 * are computed, the next block's keys while its values are summed).
 * Measured, decode at depth 4096, 2 threads, attention alone (Zen 5,
 * SmolLM2, prefetches into L1 then): 8-9.8 ms per token with the whole
 * next block requested at once, 6.0-7.0 ms with two requests per block,
 * 4.3-4.9 ms with 16 keys per request. */
#define PREFETCH_ROWS 16
#define PF_KEYS 16 /* keys per request (and per kernel call) */
static void prefetch_kv(const tsr_tensor *dst, const task *t, int64_t j0, int64_t n, int z) {
    const tsr_tensor *x = dst->src[z]; /* 1: K, 2: V */
    size_t bytes = tsr_row_size(x->type, x->ne[0]);
    if (!x->data)
        return;
    if (t->span) { /* the first KV head's task fetches every head's rows (span_heads) */
        if (t->hk != 0)
            return;
        bytes += (size_t)(x->ne[2] - 1) * x->nb[2];
    }
    for (int64_t j = 0; j < n; j++) {
        const char *row = kv_row(x, j0 + j, t);
        for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 0, 2); /* to L2 */
    }
}

/* Decode, the KV heads of a task group on one thread one after the other
 * (the op's loop): when the heads of a cell lie in one span of its row, in
 * K and in V (K and V laid out a token's heads per row, as tsr_attention
 * without a cache gives them; the KV cache keeps each head's cells
 * together instead, which streams best of all), the hardware prefetchers stream whole rows much
 * better than one head's part of each, so the first head's task fetches
 * the span and the other heads' tasks find it in L2 -- while the group's
 * spans fit there (GROUP_SPAN_MAX bytes, a part of the 1 MiB or more of a
 * core's L2 on current x86 server cores); past that (very long contexts,
 * few splits) each task fetches its own head's part. (With a mask of
 * several heads, a block dead for the first head but not for the others is
 * not fetched ahead: slower, not wrong.) Measured, depth 4096, SmolLM2 (3
 * KV heads of 64), Zen 4, 2 threads, the 30 layers' attention alone:
 * 12.3-13.3 ms per token with each task fetching its own part into L1
 * (before), 7.7 ms with the span into L2; depth 32768 (span off: each head
 * its own part, into L2 and grouped) 35-36 ms before, 12.2-12.9 ms. */
#define GROUP_SPAN_MAX (512 * 1024)
static size_t heads_span(const tsr_tensor *x) { /* bytes of a cell's heads; 0: not in one span */
    const size_t bytes = tsr_row_size(x->type, x->ne[0]);
    if (bytes == 0 || x->ne[2] < 2 || x->nb[2] >= x->nb[1])
        return 0;
    const size_t span = (size_t)(x->ne[2] - 1) * x->nb[2] + bytes;
    return span <= x->nb[1] ? span : 0;
}
static bool span_heads(const tsr_tensor *dst, const plan *pl) {
    const size_t k = heads_span(dst->src[1]), v = heads_span(dst->src[2]);
    return k && v && (size_t)pl->kv_split * (k + v) <= GROUP_SPAN_MAX;
}

/* The keys of [t->j0, t->j1) some row of the task sees, widened to its
 * blocks: [*lo, *hi) (empty: none). */
static void task_live(const tsr_tensor *dst, const plan *pl, const task *t, int64_t *lo, int64_t *hi) {
    *lo = t->j0, *hi = t->j1;
    if (!pl->live_nq)
        return;
    const tsr_tensor *mask = dst->src[3];
    int64_t a = INT64_MAX, b = 0, prev = -1;
    for (int64_t r = 0; r < t->nr; r++) {
        int64_t iq, h;
        row_at(pl, t, r, &iq, &h);
        const int64_t idx = ((t->s % mask->ne[3]) * pl->live_nh + h % mask->ne[2]) * pl->live_nq + iq;
        if (idx == prev)
            continue;
        prev = idx;
        if (pl->live_lo[idx] < pl->live_hi[idx]) {
            a = pl->live_lo[idx] < a ? pl->live_lo[idx] : a;
            b = pl->live_hi[idx] > b ? pl->live_hi[idx] : b;
        }
    }
    if (a < *lo)
        a = *lo;
    if (b > *hi)
        b = *hi;
    if (a >= b) {
        *hi = *lo;
        return;
    }
    *lo = t->j0 + (a - t->j0) / BK * BK;
    *hi = b;
}

static void run_task(const tsr_compute_params *p, const tsr_tensor *dst, const plan *pl, const task *t,
                     const scratch *sc, float *partial) {
    const int64_t dv = dst->src[2]->ne[0];
    const float **mrow = sc->mrow;
    bool *dead = sc->dead;
    int64_t lo, hi; /* the keys the rows see: the blocks outside are dead (skipped below anyway) */
    task_live(dst, pl, t, &lo, &hi);
    if (lo < hi)
        load_q(dst, pl, t, sc);
    memset(sc->o, 0, (size_t)(t->nr * dv) * sizeof(float));
    for (int64_t r = 0; r < t->nr; r++) {
        sc->m[r] = -INFINITY;
        sc->l[r] = 0.0f;
    }
    /* few rows: the first block's keys now, then PF_KEYS at a time (prefetch_kv) */
    const bool pf = t->nr <= PREFETCH_ROWS;
    /* 8 rows and more: AVX-512's gemm_f32_nt packs 32 keys at a time */
    const int64_t step = !pf ? BK : t->nr >= 8 ? 2 * PF_KEYS : PF_KEYS;
    if (pf && lo < hi)
        prefetch_kv(dst, t, lo, hi - lo < BK ? hi - lo : BK, 1);
    for (int64_t j0 = lo; j0 < hi; j0 += BK) {
        const int64_t n = t->j1 - j0 < BK ? t->j1 - j0 : BK;
        const int64_t nn = hi - j0 - BK < BK ? hi - j0 - BK : BK;
        if (!load_mask(p, dst, pl, t, j0, n, sc, mrow, dead)) {
            if (pf && nn > 0 && !row0_dead(dst, pl, t, j0 + BK, nn)) /* nothing here: the next block's keys now */
                prefetch_kv(dst, t, j0 + BK, nn, 1);
            continue;
        }
        for (int64_t c = 0; c < n; c += step) {
            if (pf)
                prefetch_kv(dst, t, j0 + c, n - c < step ? n - c : step, 2);
            scores(p, dst, t, j0, c, n - c < step ? n - c : step, sc);
        }
        softmax_block(p, dst, t, n, sc, mrow, dead);
        for (int64_t c = 0; c < n; c += step) {
            if (pf && c < nn)
                prefetch_kv(dst, t, j0 + BK + c, nn - c < step ? nn - c : step, 1);
            v_block(p, dst, t, j0, c, n - c < step ? n - c : step, sc);
        }
    }
    if (partial) { /* unnormalized, merged after the barrier */
        memcpy(partial, sc->o, (size_t)(t->nr * dv) * sizeof(float));
        memcpy(partial + pl->rb * dv, sc->m, (size_t)t->nr * sizeof(float));
        memcpy(partial + pl->rb * (dv + 1), sc->l, (size_t)t->nr * sizeof(float));
        return;
    }
    for (int64_t r = 0; r < t->nr; r++) {
        float *out = dst_row(dst, pl, t, r);
        const float inv = sc->l[r] > 0 ? 1.0f / sc->l[r] : 0.0f;
        for (int64_t i = 0; i < dv; i++) out[i] = sc->o[r * dv + i] * inv;
    }
}

/* Row r of task it from its n_split partials (base: the task's first). */
static void merge_row(const tsr_tensor *dst, const plan *pl, const float *base, int64_t it, int64_t r) {
    const int64_t dv = dst->src[2]->ne[0];
    const size_t pf = partial_floats(dst, pl);
    task t;
    task_at(dst, pl, it, &t); /* item it: task it, split 0 */
    float mx = -INFINITY, l = 0;
    for (int64_t sp = 0; sp < pl->n_split; sp++) {
        const float m = base[sp * pf + pl->rb * dv + r];
        if (m > mx)
            mx = m;
    }
    float *out = dst_row(dst, pl, &t, r);
    memset(out, 0, (size_t)dv * sizeof *out);
    if (mx == -INFINITY)
        return; /* fully masked row: zeros */
    for (int64_t sp = 0; sp < pl->n_split; sp++) {
        const float *part = base + sp * pf;
        const float m = part[pl->rb * dv + r];
        if (m == -INFINITY)
            continue;
        const float w = expf(m - mx);
        l += w * part[pl->rb * (dv + 1) + r];
        for (int64_t i = 0; i < dv; i++) out[i] += w * part[r * dv + i];
    }
    const float inv = l > 0 ? 1.0f / l : 0.0f;
    for (int64_t i = 0; i < dv; i++) out[i] *= inv;
}

/* Keys past the last one any query row may see (its mask not -inf there):
 * with few query rows (decode), the cache's padding cells and the unused
 * cells past the sequences are -inf in every row, and neither a split nor a
 * block should go to them. Found from the mask's values, the same for every
 * thread count. Many rows: all keys (the masked blocks are skipped anyway).
 * With few rows each row's live keys are kept too (pl->live_lo, live_hi):
 * a task skips the keys none of its rows sees before looking at any block
 * (with each sequence's cells together, per_seq_cells, a decode token sees
 * its own sequence's cells only: tensr-server, 8 slots of 1024 cells). */
#define LIVE_SCAN_ROWS 64
static bool live_cell(const char *row, const tsr_tensor *mask, int64_t j, bool f16, uint32_t ninf) {
    const char *e = row + j * (int64_t)mask->nb[0];
    uint32_t v;
    if (f16) {
        uint16_t hv;
        memcpy(&hv, e, 2);
        v = hv;
    } else
        memcpy(&v, e, 4);
    return v != ninf;
}

/* Whether the mask's cells are packed (looked at 64 bytes at a time), and
 * whether the 64 bytes at e are all -inf. */
static bool dead_words(const tsr_tensor *mask) { return mask->nb[0] == (mask->type == TSR_TYPE_F32 ? 4u : 2u); }
static bool dead64(const char *e, bool f16) {
    const uint64_t ninf = f16 ? 0xFC00FC00FC00FC00u : 0xFF800000FF800000u;
    uint64_t v[8], d = 0;
    memcpy(v, e, sizeof v);
    for (int i = 0; i < 8; i++) d |= v[i] ^ ninf;
    return d == 0;
}

static int64_t live_keys(const tsr_tensor *dst, plan *pl) {
    const tsr_tensor *q = dst->src[0], *mask = dst->src[3];
    const int64_t n_kv = dst->src[1]->ne[1];
    pl->live_nq = 0;
    if (!mask || !mask->data || n_kv == 0 || n_kv > INT32_MAX)
        return n_kv;
    const int64_t nq = q->ne[1], nh = mask->ne[2] < q->ne[2] ? mask->ne[2] : q->ne[2],
                  ns = mask->ne[3] < q->ne[3] ? mask->ne[3] : q->ne[3];
    if (nq * nh * ns > LIVE_SCAN_ROWS)
        return n_kv;
    const bool f16 = mask->type != TSR_TYPE_F32;
    const uint32_t ninf = f16 ? 0xFC00u : 0xFF800000u;
    int64_t end = 0;
    for (int64_t s = 0; s < ns; s++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t i = 0; i < nq; i++) {
                const char *row = at(mask,
                                     i * (int64_t)mask->nb[1] + h * (int64_t)mask->nb[2] + s * (int64_t)mask->nb[3]);
                int64_t hi = n_kv, lo = 0;
                const int64_t w = dead_words(mask) ? 64 / (f16 ? 2 : 4) : 0; /* cells per 64-byte look */
                while (w && hi >= w && dead64(row + (hi - w) * (int64_t)mask->nb[0], f16)) hi -= w;
                while (hi > 0 && !live_cell(row, mask, hi - 1, f16, ninf)) hi--;
                while (w && lo + w <= hi && dead64(row + lo * (int64_t)mask->nb[0], f16)) lo += w;
                while (lo < hi && !live_cell(row, mask, lo, f16, ninf)) lo++;
                const int64_t r = (s * nh + h) * nq + i;
                pl->live_lo[r] = (int32_t)lo;
                pl->live_hi[r] = (int32_t)hi;
                end = hi > end ? hi : end;
            }
    pl->live_nq = nq, pl->live_nh = nh;
    return end;
}

void tsr__cpu_op_flash_attn(const tsr_compute_params *p, tsr_tensor *dst) {
    plan pl;
    const int64_t n_live = live_keys(dst, &pl), live_nq = pl.live_nq;
    make_plan(dst, n_live, &pl);
    pl.live_nq = live_nq; /* (make_plan leaves the rows' ranges) */
    const size_t pb = partial_bytes(dst, &pl), pf = partial_floats(dst, &pl);
    scratch sc;
    const size_t pt = per_thread(dst, &pl, NULL, NULL);
    per_thread(dst, &pl, &sc, (char *)p->work + pb + (size_t)p->ith * pt);
    if (pl.local) { /* each task's splits in turn, merged by its thread (batch invariant) */
        const bool tagged_l = pl.n_tasks < TSR_CPU_TAGGED_MAX;
        if (!tagged_l) {
            if (p->ith == 0)
                atomic_store(&p->stream->chunk, p->nth);
            tsr__tp_barrier(p->stream->tp);
        }
        for (int64_t it = p->ith; it < pl.n_tasks;
             it = tagged_l ? tsr__cpu_next_task(p->stream, p->seq, p->nth) : atomic_fetch_add(&p->stream->chunk, 1)) {
            task t;
            for (int64_t sp = 0; sp < pl.n_split; sp++) {
                task_at(dst, &pl, sp * pl.n_tasks + it, &t);
                run_task(p, dst, &pl, &t, &sc, sc.part + (size_t)sp * pf);
            }
            for (int64_t r = 0; r < t.nr; r++) merge_row(dst, &pl, sc.part, it, r);
        }
        return;
    }
    float *partials = pl.n_split > 1 ? (float *)p->work : NULL;
    const int64_t n_items = pl.n_tasks * pl.n_split;
    const bool tagged = n_items < TSR_CPU_TAGGED_MAX; /* (else the counter is reset, behind a barrier) */
    if (!tagged) {
        if (p->ith == 0)
            atomic_store(&p->stream->chunk, p->nth);
        tsr__tp_barrier(p->stream->tp);
    }
    /* Decode (key splits, one block of few rows per KV head): the tasks of
     * one key range in groups of every KV head, a group at a time to a
     * thread, where that leaves at least 2 groups per thread (the partial of
     * each task is the same whichever thread runs it, so the grouping
     * changes no result). Else one task at a time. */
    const int64_t n_rb = (pl.rows + pl.rb - 1) / pl.rb, n_hk = dst->src[1]->ne[2];
    const bool grouped = partials && n_rb == 1 && pl.rb <= PREFETCH_ROWS && n_hk > 1 &&
                         n_items / n_hk >= 2 * (int64_t)p->nth;
    const int64_t gsz = grouped ? n_hk : 1; /* items c of one group: c / n_hk equal (n_tasks = n_seq * n_hk) */
    const bool span = grouped && span_heads(dst, &pl);
    for (int64_t g = p->ith; g * gsz < n_items;
         g = tagged ? tsr__cpu_next_task(p->stream, p->seq, p->nth) : atomic_fetch_add(&p->stream->chunk, 1))
        for (int64_t c = g * gsz; c < (g + 1) * gsz; c++) {
            task t;
            task_at(dst, &pl, c, &t);
            t.span = span;
            run_task(p, dst, &pl, &t, &sc, partials ? partials + (size_t)t.slot * pf : NULL);
        }
    if (!partials)
        return;
    tsr__tp_barrier(p->stream->tp);
    int64_t r0, r1;
    tsr__cpu_split(pl.n_tasks * pl.rb, p->ith, p->nth, &r0, &r1);
    for (int64_t i = r0; i < r1; i++) {
        task t;
        task_at(dst, &pl, i / pl.rb, &t);
        if (i % pl.rb < t.nr)
            merge_row(dst, &pl, partials + (size_t)(i / pl.rb) * pl.n_split * pf, i / pl.rb, i % pl.rb);
    }
}
