/*
 * job.c - how the CPU stream runs a job (a split's nodes): the phases
 * (plan_phases: neighbouring nodes that touch none of each other's memory
 * share the barrier after them), the job cache (plan_of: the plan of the
 * same nodes is made once), the work buffer, the prefetch of the next
 * matmul's weights while a thread waits at a barrier, and the runner
 * (run_job: every node split over all threads).
 */
#include "cpu.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void tsr__cpu_stream_set_invariant(tsr_stream *s) {
    if (s)
        s->invariant = true;
}

static tsr_status ensure_work(tsr_stream *s, size_t need) {
    if (need <= s->work_size)
        return TSR_OK;
    void *w = tsr__aligned_alloc(TSR_ALIGN, tsr__pad(need, TSR_ALIGN));
    if (!w)
        return tsr__error(TSR_E_NOMEM, "cpu: cannot allocate %zu bytes of work buffer", need);
    tsr__aligned_free(s->work);
    s->work = w;
    s->work_size = need;
    return TSR_OK;
}

static tsr_cpu_kernel_fn kernel_of(tsr_op op) { return tsr__cpu_op_kernel(op); }

/* Whether the job runs node (leafs, views and empty results do not). */
static bool node_runs(const tsr_tensor *node) { return kernel_of(node->op) && tsr__nelements(node) != 0; }

static bool node_shares(const tsr_stream *s, const tsr_tensor *node) {
    if (!s->phases || !tsr__cpu_op_shares(node->op))
        return false;
    if (node->op == TSR_OP_MUL_MAT) /* (an empty sum is a memset by thread 0) */
        return node->src[0]->ne[0] != 0 && tsr__cpu_mul_mat_gemv(s->k, node, NULL);
    return true;
}

static bool overlap(const tsr_tensor *a, const tsr_tensor *b) {
    if (!a || !b || !a->data || !b->data)
        return false;
    const char *alo = a->data, *blo = b->data;
    return alo < blo + tsr__nbytes(b) && blo < alo + tsr__nbytes(a);
}

/* Whether x and y may not run at once: one writes bytes the other reads or
 * writes (a node writes only its own bytes; views and sources are spans). */
static bool conflict(const tsr_tensor *x, const tsr_tensor *y) {
    if (overlap(x, y))
        return true;
    for (int j = 0; j < TSR_MAX_SRC; j++)
        if (overlap(x, y->src[j]) || overlap(y, x->src[j]))
            return true;
    return false;
}

/* Ops whose kernel (ops.c) gives thread ith the rows tsr__cpu_split(nrows
 * of dst) gives it, and computes a row of dst from the same row (i1, i2,
 * i3) of each source of dst's shape, nothing else. */
static bool row_op(const tsr_tensor *node) {
    switch (node->op) {
    case TSR_OP_ADD:
    case TSR_OP_SUB:
    case TSR_OP_MUL:
    case TSR_OP_DIV:
    case TSR_OP_SCALE:
    case TSR_OP_RMS_NORM:
    case TSR_OP_NORM: return true;
    default: return false;
    }
}

/* a and b overlapping are the same contiguous bytes laid out alike, rows of
 * the shape `rows` (dims 1-3) of the ops that read or write them. */
static bool same_rows(const tsr_tensor *a, const tsr_tensor *b, const tsr_tensor *rows) {
    if (a->data != b->data || a->type != b->type || !tsr__is_contiguous(a))
        return false;
    for (int d = 0; d < 4; d++)
        if (a->ne[d] != b->ne[d] || a->nb[d] != b->nb[d] || (d > 0 && a->ne[d] != rows->ne[d]))
            return false;
    return true;
}

/* Row ops x and y (x after y) of the same rows may share a phase despite
 * touching each other's bytes when every such touch is of the same rows
 * (same_rows): each thread then reads and writes only its own rows in
 * both, in program order (a norm and the multiply by its weights in place,
 * the residual add before them). */
static bool rows_aligned(const tsr_tensor *x, const tsr_tensor *y) {
    if (!row_op(x) || !row_op(y))
        return false;
    for (int d = 1; d < 4; d++)
        if (x->ne[d] != y->ne[d])
            return false;
    if (overlap(x, y) && !same_rows(x, y, x))
        return false;
    for (int j = 0; j < TSR_MAX_SRC; j++) {
        if (overlap(x->src[j], y) && !same_rows(x->src[j], y, x))
            return false;
        if (overlap(x, y->src[j]) && !same_rows(x, y->src[j], x))
            return false;
    }
    return true;
}

/* The job's phases (s->plan) and its work buffer: each phase's nodes'
 * scratch one after the other from offset 0 (a one-column matmul of the
 * activations an earlier one of the phase converted the same way shares
 * that one's: each thread converted the row there already), then, at
 * *conv_off, the batched matmuls' converted activations. Greedy: a node
 * joins the phase before it when it and every node there share
 * (node_shares), it conflicts with none of them (or only row by row:
 * rows_aligned) and the phase has room;
 * nodes the job skips change nothing. Returns the bytes, or 0 with
 * *conv_off = SIZE_MAX when the plan could not be allocated. */
static size_t plan_phases(tsr_stream *s, tsr_tensor *const *nodes, size_t n, size_t *conv_off) {
    if (!TSR_GROW(s->plan, s->cap_plan, n ? n : 1)) {
        *conv_off = SIZE_MAX;
        return 0;
    }
    size_t need = 0, conv = 0, work = 0, member[TSR_CPU_PHASE_MAX];
    int nm = 0;
    bool sharing = false;
    for (size_t i = 0; i < n; i++) {
        tsr_tensor *node = nodes[i];
        s->plan[i] = (tsr_cpu_node_plan){0, 0, false, false};
        if (!node_runs(node))
            continue;
        size_t w = tsr__pad(tsr__cpu_work_size(node, s->n_threads), TSR_ALIGN), c;
        if (node->op == TSR_OP_MUL_MAT && (c = tsr__cpu_mul_mat_conv(node)) > conv)
            conv = c;
        const bool sh = node_shares(s, node);
        bool join = nm > 0 && nm < TSR_CPU_PHASE_MAX && sh && sharing;
        for (int m = 0; join && m < nm; m++)
            join = !conflict(node, nodes[member[m]]) || rows_aligned(node, nodes[member[m]]);
        if (!join && nm > 0) { /* the phase before ends */
            s->plan[member[nm - 1]].barrier = true;
            need = work > need ? work : need;
            nm = 0;
            work = 0;
        }
        if (nm == 0)
            sharing = sh;
        tsr_cpu_node_plan *pl = &s->plan[i];
        pl->slot = (uint8_t)nm;
        pl->woff = work;
        int dt, dm; /* the activations' conversions */
        if (sh && node->op == TSR_OP_MUL_MAT && tsr__cpu_mul_mat_gemv(s->k, node, &dt))
            for (int m = nm - 1; m >= 0; m--) {
                const tsr_tensor *o = nodes[member[m]];
                if (o->op == TSR_OP_MUL_MAT && o->src[1] == node->src[1] && tsr__cpu_mul_mat_gemv(s->k, o, &dm) &&
                    dm == dt && !s->plan[member[m]].conv_ready) {
                    pl->woff = s->plan[member[m]].woff;
                    pl->conv_ready = true;
                    break;
                }
            }
        if (!pl->conv_ready)
            work += w;
        member[nm++] = i;
    }
    if (nm > 0) {
        s->plan[member[nm - 1]].barrier = true;
        need = work > need ? work : need;
    }
    *conv_off = tsr__pad(need, TSR_ALIGN);
    return *conv_off + conv;
}

static uint64_t nodes_hash(tsr_tensor *const *nodes, size_t n) {
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ (uint64_t)(uintptr_t)nodes[i]) * 0x100000001b3u;
        h = (h ^ (uint64_t)(uintptr_t)nodes[i]->data) * 0x100000001b3u;
    }
    return h;
}

/* Whether the stream's plan is of these nodes (plan_of). */
static bool plan_is_of(const tsr_stream *s, tsr_tensor *const *nodes, size_t n) {
    return s->plan_n == n && s->plan_nodes == nodes && s->plan_epoch == tsr__plan_count() &&
           s->plan_hash == nodes_hash(nodes, n);
}

/* plan_phases, or its last plan when the job is the same nodes again: the
 * same array and count, no graph planned by any scheduler since (tensors
 * never change once made; only a plan binds them elsewhere), and the same
 * nodes at the same addresses (a caller reusing an array). A decode step
 * run on the scheduler's last plan takes about 1 us here instead of 80. */
static size_t plan_of(tsr_stream *s, tsr_tensor *const *nodes, size_t n, size_t *conv_off) {
    if (s->invariant) /* before anything sizes, plans or runs a node (a graph made again may reuse addresses) */
        for (size_t i = 0; i < n; i++) nodes[i]->flags |= TSR_FLAG_BATCHINV;
    if (s->plan_n && plan_is_of(s, nodes, n)) {
        *conv_off = s->plan_conv_off;
        return s->plan_need;
    }
    s->plan_n = 0;
    s->plan_prepared = false;
    const size_t need = plan_phases(s, nodes, n, conv_off);
    if (*conv_off != SIZE_MAX) {
        s->plan_nodes = nodes;
        s->plan_n = n;
        s->plan_epoch = tsr__plan_count();
        s->plan_hash = nodes_hash(nodes, n);
        s->plan_need = need;
        s->plan_conv_off = *conv_off;
    }
    return need;
}

tsr_status tsr__cpu_reserve(tsr_stream *s, tsr_tensor *const *nodes, size_t n) {
    size_t conv_off, need = plan_of(s, nodes, n, &conv_off);
    if (conv_off == SIZE_MAX)
        return tsr__error(TSR_E_NOMEM, "cpu: out of host memory planning %zu nodes", n);
    return ensure_work(s, need);
}

int64_t tsr__cpu_next_task(tsr_stream *s, uint64_t seq, int nth) {
    const uint64_t tag = seq & ((UINT64_C(1) << 40) - 1);
    uint64_t w = atomic_load_explicit(&s->tagged, memory_order_relaxed);
    for (;;) {
        const uint64_t c = (w >> 24) == tag ? (w & (uint64_t)TSR_CPU_TAGGED_MAX) : (uint64_t)nth;
        if (c >= (uint64_t)TSR_CPU_TAGGED_MAX)
            return TSR_CPU_TAGGED_MAX;
        if (atomic_compare_exchange_weak_explicit(&s->tagged, &w, tag << 24 | (c + 1), memory_order_relaxed,
                                                  memory_order_relaxed))
            return (int64_t)c;
    }
}

void tsr__cpu_fail(tsr_stream *s, tsr_status st, const char *fmt, ...) {
    int expected = TSR_OK;
    if (!atomic_compare_exchange_strong(&s->error, &expected, (int)TSR_E_DEVICE))
        return; /* an earlier failure wins */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->error_msg, sizeof s->error_msg, fmt, ap);
    va_end(ap);
    atomic_store(&s->error, (int)st);
}

/* Prefetch at the barriers: a thread that waits requests the rows it will
 * read first in the next one-column matmul (within PF_NODES nodes), at most
 * PF_BYTES of them, so that memory is read while threads wait. */
#define PF_NODES 16
#define PF_BYTES (192 << 10)

static void next_prefetch(const tsr_stream *s, size_t i, int ith, int nth, size_t *target, tsr_prefetch *pf) {
    if (*target > i && *target < s->n_nodes)
        return; /* still prefetching for a node ahead */
    pf->cur = pf->end = NULL;
    *target = s->n_nodes;
    for (size_t j = i + 1; j < s->n_nodes && j <= i + PF_NODES; j++) {
        const tsr_tensor *n = s->nodes[j];
        if (n->op != TSR_OP_MUL_MAT || tsr__nelements(n) == 0)
            continue;
        if (tsr__cpu_mul_mat_rows(s->k, n, ith, nth, pf)) {
            if (pf->end - pf->cur > PF_BYTES)
                pf->end = pf->cur + PF_BYTES;
            *target = j;
        }
        return;
    }
}

/* The job every thread runs: all nodes, a barrier after each phase. */
static void run_job(void *arg, int ith, int nth) {
    tsr_stream *s = arg;
    tsr_compute_params p = {ith, nth, 0, 0, false, s->work, s->work_size, s, s->k};
    tsr_prefetch pf = {NULL, NULL};
    size_t target = 0;
    for (size_t i = 0; i < s->n_nodes; i++) {
        tsr_tensor *node = s->nodes[i];
        if (!node_runs(node))
            continue;
        const tsr_cpu_node_plan *pl = &s->plan[i];
        const int64_t t0 = s->prof ? tsr__prof_now() : 0;
        p.seq = s->seq + i;
        p.slot = pl->slot;
        p.conv_ready = pl->conv_ready;
        p.work = (char *)s->work + pl->woff;
        p.work_size = s->work_size - pl->woff;
        if (node->op == TSR_OP_MUL_MAT && node->src[0]->ne[0] == 0) {
            if (ith == 0)
                memset(node->data, 0, tsr__nbytes(node)); /* empty sums */
        } else {
            kernel_of(node->op)(&p, node);
        }
        if (!pl->barrier) { /* the phase goes on */
            if (s->prof)
                tsr__prof_add(TSR_PROF_OP0 + (int)node->op, tsr__prof_now() - t0);
            continue;
        }
        if (nth > 1)
            next_prefetch(s, i, ith, nth, &target, &pf);
        if (s->prof) {
            const int64_t t1 = tsr__prof_now();
            tsr__tp_barrier_pf(s->tp, &pf);
            tsr__prof_add(TSR_PROF_OP0 + (int)node->op, t1 - t0);
            tsr__prof_add(TSR_PROF_BARRIER, tsr__prof_now() - t1);
        } else {
            tsr__tp_barrier_pf(s->tp, &pf);
        }
    }
}

/* The job's checks, plan, work buffer and weights, skipped for the nodes
 * of the job before run again (plan_of; s->plan_prepared): every op has a
 * kernel, and il8_prepare changes nothing the second time. A weight's
 * layout only ever goes back to stored for good after a job of these
 * nodes was prepared (another stream, a read: TSR_FLAG_NOREPACK), and the
 * matmuls read each weight by its flag, so such a change costs speed,
 * never a result. */
static tsr_status prepare(tsr_stream *s, tsr_tensor *const *nodes, size_t n, size_t *conv_off) {
    if (s->plan_prepared && plan_is_of(s, nodes, n)) {
        if (s->invariant)
            for (size_t i = 0; i < n; i++) nodes[i]->flags |= TSR_FLAG_BATCHINV;
        *conv_off = s->plan_conv_off;
        return TSR_OK;
    }
    for (size_t i = 0; i < n; i++) {
        if (nodes[i]->op != TSR_OP_NONE && nodes[i]->op != TSR_OP_VIEW && !kernel_of(nodes[i]->op))
            return tsr__error(TSR_E_UNSUPPORTED, "cpu: node '%s': op %s has no CPU kernel", nodes[i]->name,
                              tsr__op_name(nodes[i]->op));
    }
    const size_t need = plan_of(s, nodes, n, conv_off);
    if (*conv_off == SIZE_MAX)
        return tsr__error(TSR_E_NOMEM, "cpu: out of host memory planning %zu nodes", n);
    tsr_status st = ensure_work(s, need);
    if (st == TSR_OK)
        st = tsr__cpu_il8_prepare(s, nodes, n);
    s->plan_prepared = st == TSR_OK && s->plan_n == n;
    return st;
}

tsr_status tsr__cpu_run_nodes(tsr_stream *s, tsr_tensor *const *nodes, size_t n) {
    size_t conv_off;
    tsr_status st = prepare(s, nodes, n, &conv_off);
    if (st != TSR_OK)
        return st;
    s->conv_off = conv_off;
    s->conv_seq = 0; /* nothing converted in this job yet */
    s->nodes = nodes;
    s->n_nodes = n;
    atomic_store(&s->error, (int)TSR_OK);
    s->prof = tsr__prof_on();
    const int64_t t0 = s->prof ? tsr__prof_now() : 0;
    tsr__tp_run(s->tp, run_job, s);
    s->seq += n;
    if (s->prof)
        tsr__prof_add(TSR_PROF_RUN, tsr__prof_now() - t0);
    s->nodes = NULL;
    s->n_nodes = 0;
    const int err = atomic_load(&s->error);
    return err == TSR_OK ? TSR_OK : tsr__error((tsr_status)err, "cpu: %s", s->error_msg);
}
