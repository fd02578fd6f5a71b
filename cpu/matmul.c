/*
 * matmul.c - CPU matrix multiplication. The activations (src1) are
 * converted once into the weight type's dot type (Q8_0, Q8_1, Q8_K, F16 or
 * F32) in the work buffer, all threads sharing the conversion, and a later
 * matmul of the same unchanged activations reads that conversion again
 * (conv_reusable); then the output is cut into tiles of weight rows x
 * activation columns, handed out dynamically (an atomic counter), so each
 * weight row is reused from cache across the columns of its tile. One
 * activation column (decode) is different: each thread converts it itself
 * and takes claims of weight rows (below), with no barrier inside the matmul.
 * A batch-invariant node (TSR_FLAG_BATCHINV) takes one path whatever its
 * column count, so that a column's bits do not depend on the others: the
 * gemm where the weight type has one (each result the same whatever the
 * tile: the kernel table's rule), else the dots one column at a time (the
 * gemv's bits are the dot's). One column of such a node goes through the
 * kernel table's gemm1 where it has one (the gemm's bits, read as the gemv
 * reads, with the gemv's split into row ranges and claims), else through
 * the gemm, which packs the weight rows for it.
 */
#include "cpu.h"

#define TILE_ROWS 16
#define TILE_COLS 16
#define GEMM_TILE_COLS 24 /* F16: a multiple of the AVX2 gemm's 3 and the AVX-512 gemm's 6 columns */
/* Quantized: each 16- or 8-row repack serves up to 512 columns, halved
 * while that leaves fewer than 4 tiles per thread, down to 128 (with 128
 * the repack of Q4_0 rows took a fifth of the time of the VPDPBUSD passes;
 * pp512 SmolLM2 Q4_0, best of 6: 2129 -> 2400 t/s). */
#define QGEMM_TILE_ROWS 32 /* AVX-512: passes of 32 rows */
#define QGEMM_TILE_COLS 512
#define QGEMM_TILE_COLS_MIN 128
/* A few columns (n <= FEW_TILES_COLS: the decode of a few streams, which
 * the kernels compute from the weights as stored, no pack) read like one:
 * FEW_TILES tiles of rows per thread, so that each call prefetches ahead
 * through its rows (1B-class Q4_K_M, 2 columns, batch invariant, Zen 4, 2
 * threads: 32-row tiles gave 1.8x a column's time). */
#define FEW_TILES_COLS 4
#define FEW_TILES 4
/* One column (decode): the weight rows' 8-row groups are cut into one
 * contiguous range per thread, so that the gemv's prefetch runs through it
 * (measured: tg128 SmolLM2 Q4_0 ~320 t/s with one range per thread, ~300
 * with 2, ~280 with 4 handed out dynamically). A thread takes its range
 * GEMV_CLAIM groups at a time from the front (a power of two times more
 * when a range would need more claims than a claim word counts, 4095), and
 * when it is done it takes what is left of the others' from their backs,
 * so that a thread slowed down (by the memory, or by the machine) is
 * helped instead of waited for.
 * A claim word holds the node's sequence number (stale words are the
 * range untouched), so no barrier resets them. Each thread converts the
 * activation row itself (it is one row), so the matmul has no barrier of
 * its own either. */
#define GEMV_CLAIM 8
#define CLAIM_BITS 12 /* claims per range in a word: front and back */

/* How dst is computed: the kernel table's register-tiled gemm (>= 2
 * activation columns), its multi-row matrix-vector products (one column),
 * or the dot products; returns the type the activations are converted to. */
typedef enum { MM_DOT, MM_GEMM, MM_GEMV } mm_path;

/* The one-column kernel with the gemm's bits for weight a, or NULL. */
static void (*gemm1_of(const tsr_cpu_kernels *k, const tsr_tensor *a))(int64_t, int64_t, int64_t, const void *, size_t,
                                                                       const void *, float *) {
    return (a->flags & TSR_FLAG_IL8 ? k->gemm1_il8 : k->gemm1)[a->type];
}

/* A one-column node through gemm1 (mm_plan's MM_GEMV of a batch-invariant node). */
static bool mm_one(const tsr_cpu_kernels *k, const tsr_tensor *dst, mm_path path) {
    return path == MM_GEMV && (dst->flags & TSR_FLAG_BATCHINV) && k->gemm[dst->src[0]->type];
}

static tsr_type mm_plan(const tsr_cpu_kernels *k, const tsr_tensor *dst, mm_path *path) {
    const tsr_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t nr1 = b->ne[1] * b->ne[2] * b->ne[3];
    const bool inv = dst->flags & TSR_FLAG_BATCHINV;
    if (inv && k->gemm[a->type] && dst->nb[0] == sizeof(float)) { /* any column count */
        *path = nr1 == 1 && gemm1_of(k, a) ? MM_GEMV : MM_GEMM;
        return k->gemm_type[a->type];
    }
    if (k->gemv[a->type] && nr1 == 1 && dst->nb[0] == sizeof(float)) {
        *path = MM_GEMV; /* one column: the multi-row matrix-vector products */
        return k->dot_type[a->type];
    }
    /* (one column in each of several matrices, as deepseek2's per-head
     * k_b / v_b in decode: the gemm would pack each matrix's rows for one
     * column; the dots read them as stored) */
    if (k->gemm[a->type] && nr1 >= 2 && b->ne[1] >= 2 && dst->nb[0] == sizeof(float)) {
        *path = MM_GEMM;
        return k->gemm_type[a->type];
    }
    *path = MM_DOT;
    return k->dot_type[a->type];
}

/* The activations of the integer gemms are tsr_cpu_q8s rows, not rows of a type. */
static bool mm_q8s(const tsr_cpu_kernels *k, const tsr_tensor *dst, mm_path path) {
    return (path == MM_GEMM || mm_one(k, dst, path)) && k->gemm_q8s[dst->src[0]->type];
}

static size_t conv_bytes(const tsr_tensor *dst, tsr_type dt, bool q8s, size_t *row_bytes) {
    const tsr_tensor *b = dst->src[1];
    *row_bytes = tsr__pad(q8s ? TSR_CPU_Q8S_ROW(b->ne[0]) : tsr_row_size(dt, b->ne[0]), 4);
    return tsr__pad(*row_bytes * (size_t)(b->ne[1] * b->ne[2] * b->ne[3]), TSR_ALIGN);
}

/* Per-thread scratch: a row of src1 as F32 (conversion), then the gemm's. */
static size_t thread_bytes(const tsr_tensor *dst, mm_path path) {
    const int64_t k = dst->src[1]->ne[0];
    size_t b = (size_t)k * sizeof(float);
    if (path == MM_GEMM && TSR_CPU_GEMM_SCRATCH(k) > b)
        b = TSR_CPU_GEMM_SCRATCH(k);
    return tsr__pad(b, TSR_ALIGN);
}

size_t tsr__cpu_mul_mat_work(const tsr_tensor *dst, int nth) {
    size_t row_bytes;
    mm_path path;
    const tsr_cpu_kernels *k = tsr__cpu_kernels();
    const tsr_type dt = mm_plan(k, dst, &path);
    const size_t conv = conv_bytes(dst, dt, mm_q8s(k, dst, path), &row_bytes);
    if (path == MM_GEMV) /* a converted row per thread */
        return (size_t)nth * (conv + thread_bytes(dst, path));
    return (size_t)nth * thread_bytes(dst, path); /* the conversion: at the stream's conv_off */
}

size_t tsr__cpu_mul_mat_conv(const tsr_tensor *dst) {
    size_t row_bytes;
    mm_path path;
    const tsr_cpu_kernels *k = tsr__cpu_kernels();
    const tsr_type dt = mm_plan(k, dst, &path);
    return path == MM_GEMV ? 0 : conv_bytes(dst, dt, mm_q8s(k, dst, path), &row_bytes);
}

/* ---- activations converted once for several matmuls ---------------------------- */

static int conv_kind(tsr_type dt, bool q8s) { return q8s ? -1 : 1 + (int)dt; }

static bool same_tensor(const tsr_tensor *a, const tsr_tensor *b) {
    if (a->data != b->data || a->type != b->type)
        return false;
    for (int d = 0; d < 4; d++)
        if (a->ne[d] != b->ne[d] || a->nb[d] != b->nb[d])
            return false;
    return true;
}

/* b's rows are at the stream's conv_off already, converted the way wanted
 * (kind) by an earlier node of this job, and no node since (that one
 * included) wrote into b's bytes. The same answer on every thread. */
static bool conv_reusable(const tsr_compute_params *p, const tsr_tensor *b, int kind) {
    const tsr_stream *s = p->stream;
    if (!s->conv_seq || s->conv_kind != kind || !b->data || !same_tensor(&s->conv_src, b))
        return false;
    const char *lo = b->data, *hi = lo + tsr__nbytes(b);
    for (uint64_t q = s->conv_seq; q < p->seq; q++) {
        const tsr_tensor *n = s->nodes[q - s->seq];
        if (n->op == TSR_OP_NONE || n->op == TSR_OP_VIEW || !n->data)
            continue;
        const char *nlo = n->data, *nhi = nlo + tsr__nbytes(n);
        if (nlo < hi && lo < nhi)
            return false;
    }
    return true;
}

/* ---- one column: claims of row groups --------------------------------------- */

typedef struct gemv_split {
    int64_t groups;    /* 8-row groups of the weight rows */
    int64_t per_claim; /* groups per claim */
} gemv_split;

static gemv_split gemv_split_of(int64_t rows, int nth) {
    gemv_split g = {(rows + 7) / 8, GEMV_CLAIM};
    while ((g.groups / nth + 1 + g.per_claim - 1) / g.per_claim >= (1 << CLAIM_BITS)) g.per_claim *= 2;
    return g;
}

/* Thread t's range of groups [*g0, *g1) and its claims. */
static int64_t gemv_range(const gemv_split *g, int t, int nth, int64_t *g0, int64_t *g1) {
    *g0 = g->groups * t / nth, *g1 = g->groups * (t + 1) / nth;
    return (*g1 - *g0 + g->per_claim - 1) / g->per_claim;
}

#define CLAIM_MASK ((UINT64_C(1) << CLAIM_BITS) - 1)

/* Takes claim *c of a range of n claims, from its front or back, in the
 * claim word of node seq; false when none is left. */
static bool take_claim(tsr_claim *cl, uint64_t seq, int64_t n, bool back, int64_t *c) {
    const uint64_t tag = seq << (2 * CLAIM_BITS);
    uint64_t w = atomic_load_explicit(&cl->w, memory_order_acquire);
    for (;;) {
        const bool cur = (w >> (2 * CLAIM_BITS)) == (seq & (UINT64_MAX >> (2 * CLAIM_BITS)));
        int64_t f = cur ? (int64_t)((w >> CLAIM_BITS) & CLAIM_MASK) : 0, e = cur ? (int64_t)(w & CLAIM_MASK) : n;
        if (f >= e)
            return false;
        *c = back ? e - 1 : f;
        back ? e-- : f++;
        if (atomic_compare_exchange_weak_explicit(&cl->w, &w, tag | (uint64_t)f << CLAIM_BITS | (uint64_t)e,
                                                  memory_order_acq_rel, memory_order_acquire))
            return true;
    }
}

bool tsr__cpu_mul_mat_gemv(const tsr_cpu_kernels *k, const tsr_tensor *dst, int *kind) {
    mm_path path;
    const tsr_type t = mm_plan(k, dst, &path);
    if (kind)
        *kind = conv_kind(t, mm_q8s(k, dst, path));
    return path == MM_GEMV;
}

bool tsr__cpu_mul_mat_rows(const tsr_cpu_kernels *k, const tsr_tensor *dst, int ith, int nth, tsr_prefetch *pf) {
    mm_path path;
    mm_plan(k, dst, &path);
    const tsr_tensor *a = dst->src[0];
    if (path != MM_GEMV || !a->data || a->ne[2] * a->ne[3] != 1)
        return false;
    const gemv_split g = gemv_split_of(a->ne[1], nth);
    int64_t g0, g1;
    gemv_range(&g, ith, nth, &g0, &g1);
    const int64_t i0s = 8 * g0, i0e = 8 * g1 < a->ne[1] ? 8 * g1 : a->ne[1];
    if (i0s >= i0e)
        return false;
    pf->cur = (const char *)a->data + i0s * (int64_t)a->nb[1];
    pf->end = (const char *)a->data + (i0e - 1) * (int64_t)a->nb[1] + tsr_row_size(a->type, a->ne[0]);
    return true;
}

/* The rows of dst = a x b for one column b: each thread its range, then the others' leftovers. */
static void gemv_rows(const tsr_compute_params *p, tsr_tensor *dst, const void *y) {
    const tsr_tensor *a = dst->src[0];
    void (*const gemv)(int64_t, int64_t, int64_t, const void *, size_t, const void *,
                       float *) = mm_one(p->k, dst, MM_GEMV) ? gemm1_of(p->k, a)
                                  : a->flags & TSR_FLAG_IL8  ? p->k->gemv_il8[a->type]
                                                             : p->k->gemv[a->type];
    const int64_t nr0 = a->ne[1];
    const gemv_split g = gemv_split_of(nr0, p->nth);
    for (int o = 0; o < p->nth; o++) { /* its own range (o = 0), then the others' from their backs */
        const int t = (p->ith + o) % p->nth;
        int64_t g0, g1, c;
        const int64_t n = gemv_range(&g, t, p->nth, &g0, &g1);
        while (take_claim(&p->stream->claims[p->slot * p->nth + t], p->seq, n, o > 0, &c)) {
            const int64_t i0s = 8 * (g0 + c * g.per_claim);
            const int64_t cend = 8 * (g0 + (c + 1) * g.per_claim < g1 ? g0 + (c + 1) * g.per_claim : g1);
            const int64_t i0e = cend < nr0 ? cend : nr0, rend = 8 * g1 < nr0 ? 8 * g1 : nr0;
            gemv(a->ne[0], i0e - i0s, o == 0 ? rend - i0e : 0, (const char *)a->data + i0s * (int64_t)a->nb[1],
                 a->nb[1], y, (float *)dst->data + i0s);
        }
    }
}

/* Phase 1: rows of src1 -> dot type, split over threads. */
static void convert_src1(const tsr_compute_params *p, const tsr_tensor *b, tsr_from_float_fn conv, char *wdata,
                         size_t row_bytes, float *tmp) {
    int64_t r0, r1;
    tsr__cpu_split(b->ne[1] * b->ne[2] * b->ne[3], p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % b->ne[1], i2 = (r / b->ne[1]) % b->ne[2], i3 = r / (b->ne[1] * b->ne[2]);
        const char *src = (const char *)b->data + i1 * (int64_t)b->nb[1] + i2 * (int64_t)b->nb[2] +
                          i3 * (int64_t)b->nb[3];
        const float *x = (const float *)src;
        if (b->type != TSR_TYPE_F32 || b->nb[0] != sizeof(float)) {
            for (int64_t i = 0; i < b->ne[0]; i++) tmp[i] = tsr__cpu_load_f(b->type, src + i * (int64_t)b->nb[0]);
            x = tmp;
        }
        conv(x, wdata + (size_t)r * row_bytes, b->ne[0]);
    }
}

void tsr__cpu_op_mul_mat(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *a = dst->src[0], *b = dst->src[1];
    const tsr_cpu_kernels *k = p->k;
    mm_path path;
    const tsr_type dt = mm_plan(k, dst, &path);
    const tsr_vec_dot_fn dot = k->vec_dot[a->type];
    void (*const dot4)(int64_t, float *, const void *, const void *, size_t) = k->vec_dot4[a->type];
    size_t row_bytes;
    const bool q8s = mm_q8s(k, dst, path);
    const size_t conv = conv_bytes(dst, dt, q8s, &row_bytes);
    if ((a->flags & TSR_FLAG_IL8) && path == MM_DOT) { /* (the job's preparation rules it out: cpu.c) */
        if (p->ith == 0)
            tsr__cpu_fail(p->stream, TSR_E_STATE, "mul_mat node '%s': interleaved weight '%s' on the dot path",
                          dst->name, a->name);
        return;
    }
    if (path == MM_GEMV) { /* its own converted row, no barrier */
        char *own = (char *)p->work + (size_t)p->ith * (conv + thread_bytes(dst, path));
        if (p->conv_ready) { /* converted by an earlier matmul of the phase (cpu.c) */
            gemv_rows(p, dst, own);
            return;
        }
        const float *x = b->data;
        if (b->type != TSR_TYPE_F32 || b->nb[0] != sizeof(float)) {
            float *tmp = (float *)(own + conv);
            for (int64_t i = 0; i < b->ne[0]; i++)
                tmp[i] = tsr__cpu_load_f(b->type, (const char *)b->data + i * (int64_t)b->nb[0]);
            x = tmp;
        }
        (q8s ? k->q8s_from_float : k->from_float[dt])(x, own, b->ne[0]);
        gemv_rows(p, dst, own);
        return;
    }
    char *wdata = (char *)p->work + p->stream->conv_off;
    void *scratch = (char *)p->work + (size_t)p->ith * thread_bytes(dst, path);
    const int kind = conv_kind(dt, q8s);
    const bool reuse = conv_reusable(p, b, kind);
    if (!reuse)
        convert_src1(p, b, q8s ? k->q8s_from_float : k->from_float[dt], wdata, row_bytes, scratch);
    if (p->ith == 0)
        atomic_store(&p->stream->chunk, p->nth);
    tsr__tp_barrier(p->stream->tp);
    if (!reuse && p->ith == 0) { /* every thread has read the record (above) */
        p->stream->conv_src = *b;
        p->stream->conv_kind = kind;
        p->stream->conv_seq = p->seq;
    }

    const int64_t nr0 = a->ne[1], nr1 = b->ne[1] * b->ne[2] * b->ne[3];
    const int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    const bool qgemm = path == MM_GEMM && tsr_type_block_size(a->type) > 1;
    int64_t blk0 = nr1 == 1 ? 4 * TILE_ROWS : qgemm ? QGEMM_TILE_ROWS : TILE_ROWS;
    if (qgemm && nr1 <= FEW_TILES_COLS) /* decode of a few streams: long runs of rows, which the kernel prefetches */
        blk0 = tsr__pad((size_t)((nr0 + FEW_TILES * p->nth - 1) / (FEW_TILES * p->nth)), QGEMM_TILE_ROWS);
    const int64_t nc0 = (nr0 + blk0 - 1) / blk0;
    int64_t blk1 = path != MM_GEMM ? TILE_COLS : qgemm ? QGEMM_TILE_COLS : GEMM_TILE_COLS;
    while (blk1 > QGEMM_TILE_COLS_MIN && nc0 * ((nr1 + blk1 - 1) / blk1) < 4 * (int64_t)p->nth) blk1 /= 2;
    const int64_t nc1 = (nr1 + blk1 - 1) / blk1;
    for (int64_t c = p->ith; c < nc0 * nc1; c = atomic_fetch_add(&p->stream->chunk, 1)) {
        const int64_t i0s = (c % nc0) * blk0, i0e = i0s + blk0 < nr0 ? i0s + blk0 : nr0;
        const int64_t j0s = (c / nc0) * blk1, j0e = j0s + blk1 < nr1 ? j0s + blk1 : nr1;
        for (int64_t j = j0s; j < j0e;) {
            const int64_t i11 = j % b->ne[1], i12 = (j / b->ne[1]) % b->ne[2], i13 = j / (b->ne[1] * b->ne[2]);
            const char *arow = (const char *)a->data + (i12 / r2) * (int64_t)a->nb[2] + (i13 / r3) * (int64_t)a->nb[3];
            const char *yrow = wdata + (size_t)j * row_bytes;
            char *drow = (char *)dst->data + i11 * (int64_t)dst->nb[1] + i12 * (int64_t)dst->nb[2] +
                         i13 * (int64_t)dst->nb[3];
            if (path == MM_GEMM) { /* the columns of this tile in the same matrix, at once */
                const int64_t je = j0e < j - i11 + b->ne[1] ? j0e : j - i11 + b->ne[1];
                (a->flags & TSR_FLAG_IL8 ? k->gemm_il8 : k->gemm)[a->type](
                    a->ne[0], i0e - i0s, je - j, arow + i0s * (int64_t)a->nb[1], a->nb[1], yrow, row_bytes,
                    (float *)drow + i0s, dst->nb[1] / sizeof(float), scratch);
                j = je;
                continue;
            }
            if (dot4 && !(dst->flags & TSR_FLAG_BATCHINV) && j + 4 <= j0e &&
                i11 + 4 <= b->ne[1]) { /* four columns of the same matrix */
                for (int64_t i = i0s; i < i0e; i++) {
                    float s4[4];
                    dot4(a->ne[0], s4, arow + i * (int64_t)a->nb[1], yrow, row_bytes);
                    for (int c = 0; c < 4; c++)
                        *(float *)(drow + c * (int64_t)dst->nb[1] + i * (int64_t)dst->nb[0]) = s4[c];
                }
                j += 4;
                continue;
            }
            for (int64_t i = i0s; i < i0e; i++)
                dot(a->ne[0], (float *)(drow + i * (int64_t)dst->nb[0]), arow + i * (int64_t)a->nb[1], yrow);
            j++;
        }
    }
}

/* ---- mul_mat_id: the experts' matmul ------------------------------------------
 * The batch's (token, slot) pairs are grouped by expert first (thread 0: a
 * counting sort over the ids, token order kept within an expert), and the
 * activation rows are converted to the dot type once and laid out
 * expert-contiguous. Each expert used is then an ordinary matmul of its own
 * [k, m] matrix against its gathered columns, cut into tiles of ID_ROWS
 * weight rows x up to ID_COLS columns that the threads take dynamically:
 * each weight row of an expert is read from memory once per ID_COLS of its
 * columns (once per batch when no expert has more), instead of once per
 * (token, slot) pair, and experts no token uses are never read. An expert
 * with two columns or more goes through the kernel table's register-tiled
 * gemm where there is one (its columns gathered in the gemm's activation
 * format, its tile's results scattered to their pairs), as a dense matmul
 * of two columns or more does; one column, through the dots (the dense
 * gemv's bits). Every output element's value depends on its expert's
 * column count and the tiling, never on the thread count. Work buffer
 * (planned by tsr__cpu_mul_mat_id_work): the grouping, the converted rows
 * of b when several slots share one (n_b == 1; for the dots), the gathered
 * rows, per-thread scratch (a row of b as F32 or the gemm's scratch, then
 * the gemm's tile of results).
 * Measured (synthetic qwen3moe, 12 layers, 32 experts of 512 x 256, 4 per
 * token; pp512, Zen 4, 2 threads, Q4_0): mul_mat_id 1060-1270 us of
 * thread time per token with the dots, 435-490 with the gemm (pp512
 * 1140-1480 -> 1840-2120 t/s). */

#define ID_ROWS 16
#define ID_COLS 64
#define ID_GEMM_ROWS QGEMM_TILE_ROWS /* an expert's gemm tile: weight rows x columns */
#define ID_GEMM_COLS 128

typedef struct mmid_layout {
    size_t row_bytes; /* one converted activation row (the larger of the two formats) */
    size_t off_group, off_pairs, off_a, off_b, off_tmp, tmp_bytes, tile_off;
    int64_t n_expert, n_pairs; /* n_pairs = n_used * n_tokens */
    bool stage;                /* n_b == 1 < n_used: b's rows converted once, then copied per pair */
    bool gemm;                 /* experts of >= 2 columns through k->gemm */
    bool inv;                  /* batch invariant: ... of any column count, and no dot4 */
    bool q8s;                  /* ... whose activation rows are tsr_cpu_q8s rows */
    tsr_type gemm_type;
} mmid_layout;

static mmid_layout mmid_plan(const tsr_cpu_kernels *k, const tsr_tensor *dst) {
    const tsr_tensor *as = dst->src[0], *b = dst->src[1], *ids = dst->src[2];
    const tsr_type dt = k->dot_type[as->type];
    mmid_layout l;
    l.n_expert = as->ne[2];
    l.n_pairs = ids->ne[0] * ids->ne[1];
    l.inv = dst->flags & TSR_FLAG_BATCHINV;
    l.gemm = k->gemm[as->type] && dst->nb[0] == sizeof(float) && (l.n_pairs >= 2 || l.inv);
    l.q8s = l.gemm && k->gemm_q8s[as->type];
    l.gemm_type = k->gemm_type[as->type];
    size_t rb = tsr_row_size(dt, b->ne[0]);
    if (l.gemm) {
        const size_t g = l.q8s ? TSR_CPU_Q8S_ROW(b->ne[0]) : tsr_row_size(l.gemm_type, b->ne[0]);
        rb = g > rb ? g : rb;
    }
    l.row_bytes = tsr__pad(rb, 4);
    l.stage = b->ne[1] == 1 && ids->ne[0] > 1; /* (for the one-column experts: the gemm's convert their own) */
    size_t tb = (size_t)b->ne[0] * sizeof(float);
    if (l.gemm && TSR_CPU_GEMM_SCRATCH(b->ne[0]) > tb)
        tb = TSR_CPU_GEMM_SCRATCH(b->ne[0]);
    l.tile_off = tsr__pad(tb, TSR_ALIGN);
    l.tmp_bytes = l.tile_off + (l.gemm ? tsr__pad((size_t)ID_GEMM_ROWS * ID_GEMM_COLS * sizeof(float), TSR_ALIGN) : 0);
    /* a header (the grouping's verdict), then per expert (n_expert + 1 each):
     * first pair, first tile, fill cursor */
    l.off_group = TSR_ALIGN;
    l.off_pairs = l.off_group + tsr__pad(3 * (size_t)(l.n_expert + 1) * sizeof(int64_t), TSR_ALIGN);
    l.off_a = l.off_pairs + tsr__pad((size_t)l.n_pairs * sizeof(int64_t), TSR_ALIGN);
    l.off_b = l.off_a + (l.stage ? tsr__pad(l.row_bytes * (size_t)b->ne[2], TSR_ALIGN) : 0);
    l.off_tmp = l.off_b + tsr__pad(l.row_bytes * (size_t)l.n_pairs, TSR_ALIGN);
    return l;
}

size_t tsr__cpu_mul_mat_id_work(const tsr_tensor *dst, int nth) {
    const mmid_layout l = mmid_plan(tsr__cpu_kernels(), dst);
    return l.off_tmp + (size_t)nth * l.tmp_bytes;
}

/* An expert's columns through the gemm (in its format) or the dots. */
static bool mmid_gemm(const mmid_layout *l, int64_t cols) { return l->gemm && (cols >= 2 || l->inv); }

static int32_t mmid_id(const tsr_tensor *ids, int64_t slot, int64_t t) {
    int32_t v;
    memcpy(&v, (const char *)ids->data + slot * (int64_t)ids->nb[0] + t * (int64_t)ids->nb[1], sizeof v);
    return v;
}

/* Weight rows and columns per tile: more rows when an expert has one column (decode). */
static int64_t mmid_blk0(const mmid_layout *l, int64_t cols) {
    return mmid_gemm(l, cols) ? ID_GEMM_ROWS : cols == 1 ? 8 * ID_ROWS : ID_ROWS;
}
static int64_t mmid_blk1(const mmid_layout *l, int64_t cols) { return mmid_gemm(l, cols) ? ID_GEMM_COLS : ID_COLS; }

/* Thread 0: expert e's pairs (t * n_used + slot, in token order) are
 * pairs[first[e] .. first[e + 1]), its tiles tile[e] .. tile[e + 1]; false,
 * with the failure recorded, on an id outside 0..n_expert-1. */
static bool mmid_group(const tsr_compute_params *p, const tsr_tensor *dst, const mmid_layout *l) {
    const tsr_tensor *ids = dst->src[2];
    const int64_t ne = l->n_expert, n_used = ids->ne[0], n_tokens = ids->ne[1], m = dst->src[0]->ne[1];
    int64_t *first = (int64_t *)((char *)p->work + l->off_group), *tile = first + ne + 1, *cur = tile + ne + 1;
    int64_t *pairs = (int64_t *)((char *)p->work + l->off_pairs);
    memset(first, 0, (size_t)(ne + 1) * sizeof *first);
    for (int64_t t = 0; t < n_tokens; t++)
        for (int64_t e = 0; e < n_used; e++) {
            const int32_t id = mmid_id(ids, e, t);
            if (id < 0 || id >= ne) {
                tsr__cpu_fail(p->stream, TSR_E_RANGE,
                              "mul_mat_id node '%s': expert id %d (token %lld, slot %lld) is outside 0..%lld "
                              "(n_expert %lld)",
                              dst->name[0] ? dst->name : "(unnamed)", (int)id, (long long)t, (long long)e,
                              (long long)ne - 1, (long long)ne);
                return false;
            }
            first[id + 1]++;
        }
    tile[0] = 0;
    for (int64_t x = 0; x < ne; x++) {
        const int64_t cnt = first[x + 1], blk0 = mmid_blk0(l, cnt), blk1 = mmid_blk1(l, cnt);
        tile[x + 1] = tile[x] + (cnt ? (m + blk0 - 1) / blk0 * ((cnt + blk1 - 1) / blk1) : 0);
        first[x + 1] += first[x];
        cur[x] = first[x];
    }
    for (int64_t t = 0; t < n_tokens; t++)
        for (int64_t e = 0; e < n_used; e++) pairs[cur[mmid_id(ids, e, t)]++] = t * n_used + e;
    return true;
}

/* The gathered, converted activation rows: row g of the work area is pair
 * pairs[g]'s row of b (its slot's, or the token's one row when n_b == 1),
 * in its expert's format (mmid_gemm). */
static void mmid_gather(const tsr_compute_params *p, const tsr_tensor *dst, const mmid_layout *l, tsr_type dt) {
    const tsr_tensor *b = dst->src[1];
    const int64_t n_used = dst->src[2]->ne[0], n_b = b->ne[1];
    const int64_t *pairs = (const int64_t *)((const char *)p->work + l->off_pairs);
    const int64_t *first = (const int64_t *)((const char *)p->work + l->off_group);
    char *rows = (char *)p->work + l->off_b;
    const char *staged = (const char *)p->work + l->off_a;
    float *tmp = (float *)((char *)p->work + l->off_tmp + (size_t)p->ith * l->tmp_bytes);
    int64_t g0, g1;
    tsr__cpu_split(l->n_pairs, p->ith, p->nth, &g0, &g1);
    int64_t x = 0; /* the expert of pair g: first[x] <= g < first[x + 1] */
    for (int64_t g = g0; g < g1; g++) {
        while (first[x + 1] <= g) x++;
        const bool gm = mmid_gemm(l, first[x + 1] - first[x]);
        const int64_t t = pairs[g] / n_used, slot = pairs[g] % n_used;
        char *y = rows + (size_t)g * l->row_bytes;
        if (l->stage && !gm) {
            memcpy(y, staged + (size_t)t * l->row_bytes, l->row_bytes);
            continue;
        }
        const char *src = (const char *)b->data + (slot % n_b) * (int64_t)b->nb[1] + t * (int64_t)b->nb[2];
        const float *xf = (const float *)src;
        if (b->nb[0] != sizeof(float)) {
            for (int64_t i = 0; i < b->ne[0]; i++) memcpy(&tmp[i], src + i * (int64_t)b->nb[0], sizeof(float));
            xf = tmp;
        }
        if (!gm)
            p->k->from_float[dt](xf, y, b->ne[0]);
        else if (l->q8s)
            p->k->q8s_from_float(xf, y, b->ne[0]);
        else
            p->k->from_float[l->gemm_type](xf, y, b->ne[0]);
    }
}

/* The output row of pair q (token q / n_used, slot q % n_used). */
static char *mmid_out(const tsr_tensor *dst, int64_t n_used, int64_t q) {
    return (char *)dst->data + (q % n_used) * (int64_t)dst->nb[1] + (q / n_used) * (int64_t)dst->nb[2];
}

/* One tile: weight rows [i0s, i0e) of expert x against its gathered columns [j0s, j0e). */
static void mmid_tile(const tsr_compute_params *p, const tsr_tensor *dst, const mmid_layout *l, int64_t x, int64_t i0s,
                      int64_t i0e, int64_t j0s, int64_t j0e) {
    const tsr_tensor *as = dst->src[0];
    const tsr_cpu_kernels *k = p->k;
    const tsr_vec_dot_fn dot = k->vec_dot[as->type];
    void (*const dot4)(int64_t, float *, const void *, const void *, size_t) = k->vec_dot4[as->type];
    const int64_t n_used = dst->src[2]->ne[0];
    const int64_t *first = (const int64_t *)((const char *)p->work + l->off_group);
    const int64_t *pairs = (const int64_t *)((const char *)p->work + l->off_pairs) + first[x];
    const char *rows = (const char *)p->work + l->off_b + (size_t)first[x] * l->row_bytes;
    const char *w = (const char *)as->data + x * (int64_t)as->nb[2];
    if (mmid_gemm(l, first[x + 1] - first[x])) { /* the tile at once into scratch, then to its pairs */
        char *scratch = (char *)p->work + l->off_tmp + (size_t)p->ith * l->tmp_bytes;
        float *c = (float *)(scratch + l->tile_off);
        const int64_t nr = i0e - i0s;
        k->gemm[as->type](as->ne[0], nr, j0e - j0s, w + i0s * (int64_t)as->nb[1], as->nb[1],
                          rows + (size_t)j0s * l->row_bytes, l->row_bytes, c, (size_t)nr, scratch);
        for (int64_t j = j0s; j < j0e; j++) {
            memcpy((float *)mmid_out(dst, n_used, pairs[j]) + i0s, c + (j - j0s) * nr, (size_t)nr * sizeof(float));
        }
        return;
    }
    if (j0e - j0s == 1 && k->gemv[as->type] &&
        dst->nb[0] == sizeof(float)) { /* one column: the gemv (the dots' bits) */
        float *d = (float *)mmid_out(dst, n_used, pairs[j0s]);
        k->gemv[as->type](as->ne[0], i0e - i0s, 0, w + i0s * (int64_t)as->nb[1], as->nb[1],
                          rows + (size_t)j0s * l->row_bytes, d + i0s);
        return;
    }
    for (int64_t j = j0s; j < j0e;) {
        const int nc = dot4 && !l->inv && j + 4 <= j0e ? 4 : 1;
        char *d[4];
        for (int c = 0; c < nc; c++) d[c] = mmid_out(dst, n_used, pairs[j + c]);
        const char *y = rows + (size_t)j * l->row_bytes;
        for (int64_t i = i0s; i < i0e; i++) {
            const char *arow = w + i * (int64_t)as->nb[1];
            if (nc == 4) {
                float s4[4];
                dot4(as->ne[0], s4, arow, y, l->row_bytes);
                for (int c = 0; c < 4; c++) *(float *)(d[c] + i * (int64_t)dst->nb[0]) = s4[c];
            } else {
                dot(as->ne[0], (float *)(d[0] + i * (int64_t)dst->nb[0]), arow, y);
            }
        }
        j += nc;
    }
}

void tsr__cpu_op_mul_mat_id(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *as = dst->src[0], *b = dst->src[1];
    const tsr_type dt = p->k->dot_type[as->type];
    const mmid_layout l = mmid_plan(p->k, dst);
    int64_t *first = (int64_t *)((char *)p->work + l.off_group), *tile = first + l.n_expert + 1;
    int32_t *ok = (int32_t *)p->work; /* the header: written by thread 0 before the barrier */
    if (l.stage) {                    /* each token's row converted once */
        int64_t r0, r1;
        tsr__cpu_split(b->ne[2], p->ith, p->nth, &r0, &r1);
        float *tmp = (float *)((char *)p->work + l.off_tmp + (size_t)p->ith * l.tmp_bytes);
        for (int64_t t = r0; t < r1; t++) {
            const char *src = (const char *)b->data + t * (int64_t)b->nb[2];
            const float *x = (const float *)src;
            if (b->nb[0] != sizeof(float)) {
                for (int64_t i = 0; i < b->ne[0]; i++) memcpy(&tmp[i], src + i * (int64_t)b->nb[0], sizeof(float));
                x = tmp;
            }
            p->k->from_float[dt](x, (char *)p->work + l.off_a + (size_t)t * l.row_bytes, b->ne[0]);
        }
    }
    if (p->ith == 0) {
        *ok = mmid_group(p, dst, &l);
        atomic_store(&p->stream->chunk, p->nth);
    }
    tsr__tp_barrier(p->stream->tp);
    if (!*ok)
        return;           /* every thread sees the same verdict; the runner's barrier follows */
    if (as->ne[0] == 0) { /* empty sums (the ids were still checked) */
        if (p->ith == 0)
            memset(dst->data, 0, tsr__nbytes(dst));
        return;
    }
    mmid_gather(p, dst, &l, dt);
    tsr__tp_barrier(p->stream->tp);

    const int64_t m = as->ne[1], n_tiles = tile[l.n_expert];
    for (int64_t c = p->ith; c < n_tiles; c = atomic_fetch_add(&p->stream->chunk, 1)) {
        int64_t lo = 0, hi = l.n_expert; /* the expert x with tile[x] <= c < tile[x + 1] */
        while (hi - lo > 1) {
            const int64_t mid = (lo + hi) / 2;
            if (tile[mid] <= c)
                lo = mid;
            else
                hi = mid;
        }
        const int64_t x = lo, cnt = first[x + 1] - first[x], blk0 = mmid_blk0(&l, cnt), blk1 = mmid_blk1(&l, cnt);
        const int64_t nc0 = (m + blk0 - 1) / blk0, local = c - tile[x];
        const int64_t i0s = (local % nc0) * blk0, j0s = (local / nc0) * blk1;
        mmid_tile(p, dst, &l, x, i0s, i0s + blk0 < m ? i0s + blk0 : m, j0s, j0s + blk1 < cnt ? j0s + blk1 : cnt);
    }
}
