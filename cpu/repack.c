/*
 * repack.c - the 8-row interleaved layout (IL8) of CPU matmul weights.
 *
 * A weight that the CPU backend only ever multiplies (src0 of MUL_MAT) or
 * gathers rows of (get_rows: a tied embedding, tsr__il8_block) is
 * rearranged in place, 8 rows at a time, so that the matrix-vector
 * products of decode read one stream with the scales of 8 rows side by
 * side and the 4-byte groups of a block's values of 8 rows in one 32-byte
 * vector (the form the integer dot products multiply), and the batched
 * gemm unpacks 8 rows without a transpose. Per 32-value block of an 8-row
 * group (the group's 8 rows occupy the same bytes as before, so nothing is
 * allocated):
 *   Q4_0: d[8] (F16), then 4 vectors of 32 bytes: vector c holds bytes
 *         qs[4c .. 4c+3] of rows 0..7 (4 bytes each), i.e. values 4c..4c+3
 *         in the low nibbles and 16+4c.. in the high ones;
 *   Q4_1: d[8], m[8], then the 4 vectors as Q4_0;
 *   Q8_0: d[8], then 8 vectors: vector c holds qs[4c .. 4c+3] of rows 0..7;
 *   Q5_0: d[8], the 8 rows' 32-bit qh words, then the 4 vectors as Q4_0;
 *   Q4_K (per super-block of 256): d[8], dmin[8], 3 vectors of the rows'
 *         packed scales (bytes 4c..4c+3 each), then 32 vectors: vector
 *         8j + c holds qs[32j + 4c .. +3], values 4c.. of sub-block 2j in
 *         the low nibbles and of sub-block 2j+1 in the high ones;
 *   Q5_K: d[8], dmin[8], the 3 scale vectors, 8 vectors of the rows' qh
 *         (vector c: qh[4c .. 4c+3], bit j the fifth bit of sub-block j's
 *         values 4c..), then the 32 vectors of Q4_K.
 * The layout is invisible from outside: the core asks the CPU buffer type
 * for a tensor's stored layout (tsr_buft_iface.to_stored, which calls
 * tsr__il8_canonical) before it reads or writes its bytes or copies them
 * to another device (it knows the flags only as TSR_FLAG_OWN_LAYOUT and
 * TSR_FLAG_KEEP_STORED), and the CPU backend before any other op reads it;
 * once turned back, a weight stays in the stored layout (TSR_FLAG_NOREPACK).
 */
#include "cpu.h"

typedef struct il8_shape {
    int n_fields; /* F16 fields before the values: d, or d and m */
    int chunks;   /* 4-byte chunks of a block's values */
    size_t bs;    /* bytes of one stored block */
} il8_shape;

static bool il8_shape_of(tsr_type t, il8_shape *s) {
    switch (t) {
    case TSR_TYPE_Q4_0: *s = (il8_shape){1, 4, sizeof(tsr_block_q4_0)}; return true;
    case TSR_TYPE_Q4_1: *s = (il8_shape){2, 4, sizeof(tsr_block_q4_1)}; return true;
    case TSR_TYPE_Q8_0: *s = (il8_shape){1, 8, sizeof(tsr_block_q8_0)}; return true;
    case TSR_TYPE_Q5_0: *s = (il8_shape){1, 5, sizeof(tsr_block_q5_0)}; return true;  /* qh, then qs */
    case TSR_TYPE_Q4_K: *s = (il8_shape){2, 35, sizeof(tsr_block_q4_K)}; return true; /* scales, then qs */
    case TSR_TYPE_Q5_K: *s = (il8_shape){2, 43, sizeof(tsr_block_q5_K)}; return true; /* scales, qh, qs */
    default: return false;
    }
}

bool tsr__il8_type(tsr_type t) {
    il8_shape s;
    return il8_shape_of(t, &s);
}

/* Memory the CPU can rearrange in place. */
static bool il8_host(const tsr_tensor *t) {
    while (t->view_src && !t->buffer) t = t->view_src; /* (the buffer it lives in) */
    const tsr_buffer *buf = t->buffer;
    return buf && buf->buft && buf->buft->is_host;
}

/* Whether t can take the layout: a 2-D matrix of a layout type in host
 * memory whose rows are stored one after another, in whole groups of 8. */
bool tsr__il8_fits(const tsr_tensor *t) {
    il8_shape s;
    return il8_shape_of(t->type, &s) && t->data && il8_host(t) && !t->view_src && t->ne[2] == 1 && t->ne[3] == 1 &&
           t->ne[1] > 0 && t->ne[1] % 8 == 0 && t->ne[0] > 0 && t->ne[0] % tsr_type_block_size(t->type) == 0 &&
           t->nb[1] == tsr_row_size(t->type, t->ne[0]) && t->nb[0] == s.bs;
}

/* One group of 8 rows (nb blocks each): from the stored layout in src
 * (rows xs bytes apart) to the interleaved one in dst, or back. */
static void il8_group(const il8_shape *s, int64_t nb, size_t xs, const char *src, char *dst, bool to_il8) {
    const size_t head = 2 * (size_t)s->n_fields;
    for (int64_t b = 0; b < nb; b++) {
        char *g = (to_il8 ? dst : (char *)src) + (size_t)b * 8 * s->bs; /* the interleaved block */
        for (int r = 0; r < 8; r++) {
            char *row = (to_il8 ? (char *)src : dst) + (size_t)r * xs + (size_t)b * s->bs; /* the stored block */
            for (int f = 0; f < s->n_fields; f++) {
                char *il = g + 16 * (size_t)f + 2 * (size_t)r;
                to_il8 ? memcpy(il, row + 2 * f, 2) : memcpy(row + 2 * f, il, 2);
            }
            for (int c = 0; c < s->chunks; c++) {
                char *il = g + 16 * (size_t)s->n_fields + 32 * (size_t)c + 4 * (size_t)r;
                to_il8 ? memcpy(il, row + head + 4 * c, 4) : memcpy(row + head + 4 * c, il, 4);
            }
        }
    }
}

void tsr__il8_groups(tsr_tensor *t, int64_t g0, int64_t g1, bool to_il8, void *tmp) {
    il8_shape s;
    if (!il8_shape_of(t->type, &s))
        return;
    const size_t xs = t->nb[1], group = 8 * xs;
    const int64_t nb = t->ne[0] / tsr_type_block_size(t->type);
    for (int64_t g = g0; g < g1; g++) {
        char *base = (char *)t->data + (size_t)g * group;
        memcpy(tmp, base, group);
        il8_group(&s, nb, xs, tmp, base, to_il8);
    }
}

/* Rearranges all of t in place through a copy of one group; false when
 * that copy cannot be allocated (nothing changed). */
static bool il8_convert(tsr_tensor *t, bool to_il8) {
    char *tmp = tsr__malloc(8 * t->nb[1]);
    if (!tmp)
        return false;
    tsr__il8_groups(t, 0, t->ne[1] / 8, to_il8, tmp);
    tsr__free(tmp);
    if (to_il8)
        t->flags |= TSR_FLAG_IL8;
    else
        t->flags &= ~(uint32_t)TSR_FLAG_IL8;
    return true;
}

void tsr__il8_block(const tsr_tensor *t, int64_t r, int64_t b, void *blk) {
    il8_shape s;
    if (!il8_shape_of(t->type, &s))
        return;
    const char *g = (const char *)t->data + (size_t)(r / 8) * 8 * t->nb[1] + (size_t)b * 8 * s.bs;
    char *o = blk;
    const int rr = (int)(r % 8);
    for (int f = 0; f < s.n_fields; f++) memcpy(o + 2 * f, g + 16 * f + 2 * rr, 2);
    for (int c = 0; c < s.chunks; c++) memcpy(o + 2 * s.n_fields + 4 * c, g + 16 * s.n_fields + 32 * c + 4 * rr, 4);
}

/* An optimization: out of memory leaves the weight as it is, with no error set. */
bool tsr__il8_repack(tsr_tensor *t) {
    if (t->flags & TSR_FLAG_IL8)
        return true;
    return tsr__il8_fits(t) && il8_convert(t, true);
}

tsr_status tsr__il8_canonical(tsr_tensor *t) {
    while (t->view_src) t = t->view_src;
    if (!(t->flags & TSR_FLAG_IL8))
        return TSR_OK;
    if (!il8_host(t)) /* (only host weights are ever interleaved: a copy's flags are its own) */
        return tsr__error(TSR_E_STATE, "weight '%s': marked interleaved outside host memory", t->name);
    if (!il8_convert(t, false))
        return tsr__error(TSR_E_NOMEM, "weight '%s': out of host memory restoring its stored layout (%zu bytes)",
                          t->name, 8 * t->nb[1]);
    t->flags |= TSR_FLAG_NOREPACK;
    return TSR_OK;
}

/* ---- which weights take the layout (before each job: job.c) ----
 * Before a job: a weight that the job uses otherwise than as src0 of a
 * matmul into float rows or of a gather (get_rows, as a tied embedding
 * is), or through a view, goes back to its stored layout for good; then
 * every weight that is src0 of such a matmul and can take the interleaved
 * layout takes it, once (decode's kernels read it faster: avx2/gemv.c).
 * Uses on other devices and reads of its bytes are the core's to handle
 * (the buffer type's to_stored). TSR_CPU_REPACK=0 turns it off; kernel tables
 * without interleaved kernels never start it. */
static bool il8_direct_use(const tsr_tensor *node, int j, const tsr_tensor *src) {
    if (j != 0 || src->view_src)
        return false;
    if (node->op == TSR_OP_GET_ROWS) /* rows gathered block by block (ops.c), 1-D indices */
        return node->src[1] && node->src[1]->ne[1] == 1 && node->src[1]->ne[2] == 1 && node->src[1]->ne[3] == 1;
    return node->op == TSR_OP_MUL_MAT && node->nb[0] == sizeof(float);
}

/* The weights to rearrange, on all the stream's threads: each thread its
 * share of every weight's 8-row groups, through its own copy of a group. */
typedef struct il8_job {
    tsr_tensor **ts;
    size_t n;
    char *tmp;    /* n_threads copies of the largest group */
    size_t group; /* bytes of the largest group */
} il8_job;

static void il8_run(void *arg, int ith, int nth) {
    const il8_job *j = arg;
    for (size_t i = 0; i < j->n; i++) {
        int64_t g0, g1;
        tsr__cpu_split(j->ts[i]->ne[1] / 8, ith, nth, &g0, &g1);
        tsr__il8_groups(j->ts[i], g0, g1, true, j->tmp + (size_t)ith * j->group);
    }
}

/* Whether this stream's matmuls read weights of type t interleaved. */
static bool il8_reads(const tsr_stream *s, tsr_type t) { return s->repack && s->k->gemv_il8[t] && s->k->gemm_il8[t]; }

tsr_status tsr__cpu_il8_prepare(tsr_stream *s, tsr_tensor *const *nodes, size_t n) {
    /* Always: another stream (or an earlier setting) may have interleaved
     * a weight this job reads otherwise. */
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < TSR_MAX_SRC; j++) {
            tsr_tensor *src = nodes[i]->src[j], *root = src;
            if (!src)
                continue;
            while (root->view_src) root = root->view_src;
            if (!(root->flags & TSR_FLAG_WEIGHT) || !tsr__il8_type(root->type))
                continue;
            if (il8_direct_use(nodes[i], j, src) &&
                (nodes[i]->op != TSR_OP_MUL_MAT || !(root->flags & TSR_FLAG_IL8) || il8_reads(s, root->type)))
                continue;
            if (root->flags & TSR_FLAG_IL8) {
                tsr_status st = tsr__il8_canonical(root); /* (sets TSR_FLAG_NOREPACK) */
                if (st != TSR_OK)
                    return st;
            } else if (!il8_direct_use(nodes[i], j, src)) {
                root->flags |= TSR_FLAG_NOREPACK;
            }
        }
    if (!s->repack)
        return TSR_OK;
    il8_job job = {NULL, 0, NULL, 0};
    for (size_t i = 0; i < n; i++) {
        tsr_tensor *w = nodes[i]->src[0];
        if (nodes[i]->op != TSR_OP_MUL_MAT || !w || !il8_direct_use(nodes[i], 0, w) ||
            (w->flags & (TSR_FLAG_IL8 | TSR_FLAG_NOREPACK)) != 0 || !(w->flags & TSR_FLAG_WEIGHT) || !w->buffer ||
            w->buffer->buft->iface != &tsr__cpu_buft_iface || !il8_reads(s, w->type) || !tsr__il8_fits(w))
            continue;
        if (!job.ts && !(job.ts = tsr__malloc(n * sizeof *job.ts)))
            return TSR_OK;        /* (out of memory: the weights stay as they are) */
        w->flags |= TSR_FLAG_IL8; /* (marks it taken; the job rearranges it) */
        job.ts[job.n++] = w;
        if (8 * w->nb[1] > job.group)
            job.group = 8 * w->nb[1];
    }
    if (job.n && (job.tmp = tsr__malloc((size_t)s->n_threads * job.group)) != NULL)
        tsr__tp_run(s->tp, il8_run, &job);
    for (size_t i = 0; !job.tmp && i < job.n; i++) job.ts[i]->flags &= ~(uint32_t)TSR_FLAG_IL8; /* not done */
    tsr__free(job.tmp);
    tsr__free(job.ts);
    return TSR_OK;
}
