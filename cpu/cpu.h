/*
 * cpu.h - private interface of the CPU backend: the stream (threadpool +
 * work buffer), the per-CPU-feature kernel table, the op kernels, and the
 * entry points the fake test devices (cpu/fake.c) reuse to run nodes on
 * host memory with their own buffer type.
 */
#ifndef TSR_CPU_H
#define TSR_CPU_H

#ifdef HAVE_CONFIG_H
#include "config.h" /* TSR_HAVE_AVX2_BUILD / TSR_HAVE_AVX512_BUILD */
#endif

#include "device.h"
#include "quant/quants.h"

#include <math.h> /* INFINITY */
#include <stdatomic.h>

/* ---- the 8-row interleaved layout of CPU matmul weights (repack.c) -------------------- */
/* The flags of the layout (the core knows them as its buffer type's own). */
#define TSR_FLAG_IL8 TSR_FLAG_OWN_LAYOUT       /* weight rows in the 8-row interleaved layout */
#define TSR_FLAG_NOREPACK TSR_FLAG_KEEP_STORED /* used otherwise than as a CPU matmul's src0: stays stored */
/* */
/* Q4_0, Q4_1, Q5_0, Q8_0 and Q4_K have one. */
bool tsr__il8_type(tsr_type t);
/* t (a weight in host memory) can take it: a 2-D matrix of such a type,
 * rows stored one after another, a multiple of 8 of them. */
bool tsr__il8_fits(const tsr_tensor *t);
/* Rearranges t in place into the layout (TSR_FLAG_IL8; true when it is
 * now); false, with t unchanged and no error set, when it cannot. */
bool tsr__il8_repack(tsr_tensor *t);
/* Groups [g0, g1) of t's 8-row groups (t fits) into the layout or back,
 * through tmp (8 rows' bytes); leaves the flags to the caller, which does
 * every group (several threads may do parts). */
void tsr__il8_groups(tsr_tensor *t, int64_t g0, int64_t g1, bool to_il8, void *tmp);
/* Block b of row r of an interleaved t, as stored (tsr_type_block_bytes). */
void tsr__il8_block(const tsr_tensor *t, int64_t r, int64_t b, void *blk);
/* t's memory (its view root's) back in the stored layout, to stay so
 * (TSR_FLAG_NOREPACK): before anything but a CPU matmul reads it. */
tsr_status tsr__il8_canonical(tsr_tensor *t);

/* ---- threadpool (threadpool.c) ------------------------------------------- */
typedef struct tsr_threadpool tsr_threadpool;
/* fn(arg, ith, nth) runs on every thread (the caller is thread 0). */
typedef void (*tsr_tp_fn)(void *arg, int ith, int nth);
tsr_status tsr__tp_new(int n_threads, tsr_threadpool **out);
void tsr__tp_free(tsr_threadpool *tp);
int tsr__tp_n_threads(const tsr_threadpool *tp);
/* Runs fn on all threads and returns when every thread has finished. */
void tsr__tp_run(tsr_threadpool *tp, tsr_tp_fn fn, void *arg);
/* Barrier among the threads of the running job (spins briefly, then sleeps). */
void tsr__tp_barrier(tsr_threadpool *tp);
/* Bytes a thread may read into its cache while it waits (the next matmul's
 * weight rows it will read): [cur, end), advanced as lines are requested. */
typedef struct tsr_prefetch {
    const char *cur, *end;
} tsr_prefetch;
/* The barrier, prefetching pf's bytes while it waits (pf may be NULL). */
void tsr__tp_barrier_pf(tsr_threadpool *tp, tsr_prefetch *pf);

/* ---- kernel table (ref.c; avx2/, avx512/) -------------------------------- */
/* s = dot(x, y) over n elements; x a row of the weight type, y a row of its
 * dot type (activations converted once per matmul, or once for consecutive
 * matmuls of the same activations; once per thread for one column). */
typedef void (*tsr_vec_dot_fn)(int64_t n, float *s, const void *x, const void *y);

#define TSR_GELU_C 0.7978845608028654f /* sqrt(2/pi) */

typedef struct tsr_cpu_kernels {
    const char *name;                             /* "scalar", "avx2", "avx512", "avx512_vnni" */
    tsr_type dot_type[TSR_TYPE_COUNT];            /* activation type of a weight type's dot product */
    tsr_vec_dot_fn vec_dot[TSR_TYPE_COUNT];       /* NULL: matmul not supported for the type */
    tsr_from_float_fn from_float[TSR_TYPE_COUNT]; /* fast quantize (activations, cache writes) */
    tsr_to_float_fn to_float[TSR_TYPE_COUNT];     /* fast dequantize */
    /* Four dot products of one weight row with four activation rows y,
     * y + ystride, ...: the row is unpacked once (batched matmul). May be NULL. */
    void (*vec_dot4[TSR_TYPE_COUNT])(int64_t n, float s[4], const void *x, const void *y, size_t ystride);
    /* y[i] = exp(y[i] - max) in place; returns the sum (softmax). */
    double (*exp_sum)(int64_t n, float *y, float max);
    /* y = silu(x) * g (g may be NULL: plain silu). */
    void (*silu_mul)(int64_t n, float *y, const float *x, const float *g);
    /* y = gelu(x) * g (g may be NULL: plain gelu), GELU's tanh form
     * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), computed as
     * x / (1 + exp(-2 sqrt(2/pi) (x + 0.044715 x^3))). */
    void (*gelu_mul)(int64_t n, float *y, const float *x, const float *g);
    /* Rows of the element-wise ops, F32 and contiguous: y = x + g, y = x * g
     * (y may be x or g itself, not a partial overlap). */
    void (*add)(int64_t n, float *y, const float *x, const float *g);
    void (*mul)(int64_t n, float *y, const float *x, const float *g);
    /* y = x / sqrt(mean(x^2) + eps) over one row of n (y may be x); the
     * squares in float summed in double as ggml, the SIMD variants in
     * another order (rarely an ulp from the reference's scale). */
    void (*rms_norm)(int64_t n, float *y, const float *x, float eps);
    /* The rotation of rope over the first n_dims values of a row (n_dims
     * even; the rest is the caller's): pairs (2i, 2i+1), or (i, i + n_dims/2)
     * when neox, turned by cs[2i] = cos and cs[2i+1] = sin (scaled) of pair
     * i: y0 = x0 cs[2i] - x1 cs[2i+1], y1 = x0 cs[2i+1] + x1 cs[2i], each a
     * fused multiply-add of the other product rounded, the same bits in
     * every variant. y may be x. */
    void (*rope)(int64_t n_dims, bool neox, float *y, const float *x, const float *cs);
    /* Fused attention's blocks: C[m x n] = (acc ? C : 0) + A[m x k] * B[k x n],
     * row-major with row strides lda, ldb, ldc (in elements); A and C F32,
     * B F32 or (b_f16) F16, converted in registers. */
    void (*gemm_f32)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b, bool b_f16,
                     int64_t ldb, float *c, int64_t ldc, bool acc);
    /* ... and C[m x n] = A[m x k] * B^T for B n rows of k (F32 or F16), ldb
     * apart: the scores of query rows A against key rows B. */
    void (*gemm_f32_nt)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b, bool b_f16,
                        int64_t ldb, float *c, int64_t ldc);
    /* Register-tiled matmul for batches (tsr__cpu_op_mul_mat uses it for >= 2
     * activation columns, tsr__cpu_op_mul_mat_id for an expert's >= 2;
     * NULL: none): s[j * ss + i] = dot(x row i, y row j)
     * for i < m, j < n over k elements; x rows xs bytes apart (weight type),
     * y rows ys bytes apart in gemm_type[weight type] (activations converted
     * as for dot_type); scratch: TSR_CPU_GEMM_SCRATCH(k)
     * bytes of the calling thread (aligned to 32). Each result is the same
     * whatever m, n and its place in the tile, so results do not depend on
     * the tiling or the threads. */
    tsr_type gemm_type[TSR_TYPE_COUNT];
    void (*gemm[TSR_TYPE_COUNT])(int64_t k, int64_t m, int64_t n, const void *x, size_t xs, const void *y, size_t ys,
                                 float *s, size_t ss, void *scratch);
    /* gemm_q8s[wt]: gemm[wt]'s activation rows are tsr_cpu_q8s blocks
     * (TSR_CPU_Q8S_ROW(k) bytes, k % 32 == 0) made by q8s_from_float, not
     * rows of gemm_type[wt]. */
    bool gemm_q8s[TSR_TYPE_COUNT];
    void (*q8s_from_float)(const float *x, void *y, int64_t k);
    /* Matrix-vector products (tsr__cpu_op_mul_mat uses them for one
     * activation column; NULL: the dots): s[i] = dot(x row i, y) for i < m
     * over k elements, x rows xs bytes apart in the weight type, read as
     * stored; y one row of dot_type[wt]. Each s[i] is the same bits as
     * vec_dot[wt] of that row (the reference), whatever m and the row's place,
     * so results do not depend on the tiling or threads. The `ahead` rows
     * after the m (readable) are the caller's next: the call prefetches
     * into them as into its own. */
    void (*gemv[TSR_TYPE_COUNT])(int64_t k, int64_t m, int64_t ahead, const void *x, size_t xs, const void *y,
                                 float *s);
    /* gemv and gemm of weights in the 8-row interleaved layout
     * (TSR_FLAG_IL8, repack.c), the same arguments, x the
     * first row of whole 8-row groups (m % 8 == 0). gemm_il8 gives the
     * bits of gemm[wt] over the same rows stored plainly; gemv_il8 sums a
     * row's blocks in order as one float lane (its own bits, the same
     * whatever m and the row's place). NULL: weights keep the stored layout. */
    void (*gemv_il8[TSR_TYPE_COUNT])(int64_t k, int64_t m, int64_t ahead, const void *x, size_t xs, const void *y,
                                     float *s);
    void (*gemm_il8[TSR_TYPE_COUNT])(int64_t k, int64_t m, int64_t n, const void *x, size_t xs, const void *y,
                                     size_t ys, float *s, size_t ss, void *scratch);
    /* One step of the fused attention's online softmax over a row of scores:
     * y = y * scale + mask (mask may be NULL); with mx = max(y), the running
     * max *m becomes mx where *m is -inf or mx > *m + slack; then y =
     * exp(y - *m) and the sum of y is returned. A row all -inf (or n == 0)
     * leaves *m, gives y = 0 and returns 0. */
    float (*softmax_step)(int64_t n, float *y, float scale, const float *mask, float *m, float slack);
    /* gemm1[wt], gemm1_il8[wt]: one column of gemm[wt] (gemm_il8[wt]) read
     * as the gemv reads (NULL: none): gemv's arguments, y one activation
     * row in the gemm's format, s[i] the bits the gemm gives for that
     * column, whatever m and the row's place. The batch-invariant decode. */
    void (*gemm1[TSR_TYPE_COUNT])(int64_t k, int64_t m, int64_t ahead, const void *x, size_t xs, const void *y,
                                  float *s);
    void (*gemm1_il8[TSR_TYPE_COUNT])(int64_t k, int64_t m, int64_t ahead, const void *x, size_t xs, const void *y,
                                      float *s);
} tsr_cpu_kernels;

/* Per-thread scratch of a gemm call with k elements per row: 8, 16 or 32
 * rows repacked to an interleaved int8 layout (at most 1280 bytes per 32
 * elements), or two rows dequantized (the reference). */
#define TSR_CPU_GEMM_SCRATCH(k) ((size_t)((k) / 32 + 1) * 1280 + (size_t)(k)*8 + 64)

/* The activations of the integer gemms (gemm_q8s), per 32 values: the scale
 * d and d * sum(qs), each rounded to F16 (stored as floats) as in Q8_0's and
 * Q8_1's blocks, so that a batch's rows agree with the one-column dot
 * products over those (unrounded, a mixed batch's logits moved by 1.7% of
 * the largest from the same sequence's alone; a d * sum past F16's range
 * stays the float, not infinity); -128 times the sum of all 32
 * and of the first 16 values, exact, so that a kernel can multiply unsigned
 * bytes (a weight + 128) and take the offset back out in integers; then the
 * values qs = round(x * 127 / max|x|) (values are d * qs).
 * Non-finite values, the same in every variant: NaNs are left out of the
 * max and quantize to 0; an infinity makes max|x| (so d) infinite and the
 * multiplier 0, so every value of its block is 0 (d is infinite: the
 * block's products are NaN, as inf * 0 would be). So |qs| <= 127 and the sums stay exact in any
 * case; a variant that meets a NaN product (a NaN or an infinity) hands
 * the block to the reference, tsr__cpu_q8s_from_float_ref. */
typedef struct tsr_cpu_q8s {
    float d;
    float ds;
    int32_t c;
    int32_t c_lo;
    int8_t qs[32];
} tsr_cpu_q8s;
#define TSR_CPU_Q8S_ROW(k) ((size_t)(k) / 32 * sizeof(tsr_cpu_q8s))
/* 127 / max|x| for the values (d = max|x| / 127), 0 when d is 0 or the
 * quotient is not finite (max|x| below 127 / FLT_MAX: the block is zeros,
 * not values rounded from infinities). */
static inline float tsr__cpu_q8s_inv(float d, float amax) {
    const float id = d != 0.0f ? 127.0f / amax : 0.0f;
    return id <= 0x1.fffffep127f ? id : 0.0f;
}
/* A block's scales and sums from d = max|x| / 127 and the integer sums of its
 * values (all 32, the first 16): the same in every variant. */
static inline void tsr__cpu_q8s_finish(tsr_cpu_q8s *y, float d, int32_t sum, int32_t lo) {
    const float ds = d * (float)sum;
    const uint16_t h = tsr__fp32_to_fp16(ds);
    y->d = TSR_FP16_TO_FP32(tsr__fp32_to_fp16(d));
    y->ds = (h & 0x7C00) != 0x7C00 ? TSR_FP16_TO_FP32(h)
                                   : ds; /* past F16's range (a block summing past 65504): the float */
    y->c = -128 * sum;
    y->c_lo = -128 * lo;
}
/* Installs a q8s gemm for weight type t (the activations' gemm_type is
 * unused). The one-column kernels of the gemm it replaces (a table built
 * over another's) give that gemm's bits, not this one's: they go with it. */
static inline void tsr__cpu_set_q8s_gemm(tsr_cpu_kernels *k, tsr_type t,
                                         void (*fn)(int64_t, int64_t, int64_t, const void *, size_t, const void *,
                                                    size_t, float *, size_t, void *)) {
    k->gemm[t] = fn;
    k->gemm_type[t] = TSR_TYPE_Q8_0;
    k->gemm_q8s[t] = true;
    k->gemm1[t] = k->gemm1_il8[t] = NULL;
}
/* The plain versions (ref.c): k % 32 == 0. */
void tsr__cpu_q8s_from_float_ref(const float *x, void *y, int64_t k);
void tsr__cpu_q8s_to_float(const void *y, float *x, int64_t k);

/* The reference of every gemm (ref.c): rows dequantized (x: weight type wt,
 * y: gemm type gt), products summed in double. */
void tsr__cpu_gemm_ref(tsr_type wt, tsr_type gt, int64_t k, int64_t m, int64_t n, const void *x, size_t xs,
                       const void *y, size_t ys, float *s, size_t ss, void *scratch);

void tsr__cpu_kernels_scalar(tsr_cpu_kernels *k);
/* The scalar rope rotation (the variants' tails). */
void tsr__cpu_rope_ref(int64_t n_dims, bool neox, float *y, const float *x, const float *cs);
/* One folder per instruction set, the same files in each (cpu/README.md):
 * table.c fills the table (tsr__cpu_kernels_ISA: the table below it, here
 * the scalar one and for AVX-512 the AVX2 one, with this folder's kernels
 * put over it) by calling the installer at the end of each other file,
 * which sets the entries that file implements. */
#ifdef TSR_HAVE_AVX2_BUILD
void tsr__cpu_kernels_avx2(tsr_cpu_kernels *k);
void tsr__cpu_avx2_dot(tsr_cpu_kernels *k);      /* vec_dot, vec_dot4 */
void tsr__cpu_avx2_gemv(tsr_cpu_kernels *k);     /* gemv, gemv_il8 */
void tsr__cpu_avx2_gemm(tsr_cpu_kernels *k);     /* gemm (q8s), gemm_il8, gemm_f32, gemm_f32_nt */
void tsr__cpu_avx2_quantize(tsr_cpu_kernels *k); /* from_float, to_float */
void tsr__cpu_avx2_rows(tsr_cpu_kernels *k);     /* row ops, softmax_step */
#endif
#ifdef TSR_HAVE_AVX512_BUILD
/* vnni: the 8-bit kernels (VPDPBUSD) too. */
void tsr__cpu_kernels_avx512(tsr_cpu_kernels *k, bool vnni);
void tsr__cpu_avx512_dot(tsr_cpu_kernels *k, bool vnni);
void tsr__cpu_avx512_gemv(tsr_cpu_kernels *k, bool vnni);
void tsr__cpu_avx512_gemm(tsr_cpu_kernels *k, bool vnni);
void tsr__cpu_avx512_rows(tsr_cpu_kernels *k);
#endif
/* The kernels chosen for this CPU (TSR_CPU_KERNELS=scalar|avx2|avx512 in the
 * environment caps the choice, for tests). Thread-safe; filled once. */
const tsr_cpu_kernels *tsr__cpu_kernels(void);
/* Fills k with the best variant not above `cap` ("scalar", "avx2", "avx512"; NULL = best). */
void tsr__cpu_kernels_select(tsr_cpu_kernels *k, const char *cap);
const char *tsr__cpu_features_string(void);

/* ---- stream -------------------------------------------------------------- */
typedef struct tsr_claim {
    _Alignas(64) _Atomic uint64_t w;
} tsr_claim;

/* Nodes of a job run in phases (cpu.c: plan_phases): neighbours that read
 * and write no memory of each other's, whose kernels have no barrier of
 * their own (element-wise and row ops, one-column matmuls), run between the
 * same two barriers, at most TSR_CPU_PHASE_MAX of them, each in its own part
 * of the work buffer and with its own claim words (slot). */
#define TSR_CPU_PHASE_MAX 8
typedef struct tsr_cpu_node_plan {
    size_t woff;     /* the node's scratch: work + woff */
    uint8_t slot;    /* its place in the phase: claim words slot * n_threads + t */
    bool barrier;    /* the last node of its phase: a barrier follows */
    bool conv_ready; /* a one-column matmul whose converted activation row an
                        earlier matmul of the phase left in the same scratch */
} tsr_cpu_node_plan;

struct tsr_stream {
    tsr_device *device;
    tsr_threadpool *tp;
    int n_threads;
    void *work; /* per-stream scratch (aligned) */
    size_t work_size;
    const tsr_cpu_kernels *k;
    atomic_int_fast64_t chunk; /* next chunk of the current node (dynamic scheduling) */
    /* The same, needing no reset (no barrier): the node's sequence number
     * (low 40 bits) over a 24-bit count (tsr__cpu_next_task). */
    _Atomic uint64_t tagged;
    /* One-column matmuls: thread t's claims of weight rows (matmul.c), one
     * cache line each, TSR_CPU_PHASE_MAX sets of n_threads (a phase's
     * matmuls use one set each); the sequence number of the job's first node
     * (node i is seq + i), advanced by tsr__cpu_run_nodes past the job's
     * nodes. */
    tsr_claim *claims;
    uint64_t seq;
    tsr_tensor *const *nodes; /* the job being run */
    size_t n_nodes;
    /* A node's failure found while the job runs (an expert id out of range):
     * set once by one thread (tsr__cpu_fail), reported by tsr__cpu_run_nodes
     * after the job, on the calling thread. TSR_OK while none. */
    atomic_int error;
    char error_msg[256];
    tsr_cpu_node_plan *plan; /* the job's phases, a plan per node (grown only) */
    bool invariant;          /* batch invariant: nodes planned here get TSR_FLAG_BATCHINV */
    size_t cap_plan;
    /* What the plan is of (cpu.c: plan_of): the nodes array and count, the
     * schedulers' plan count and a hash of the nodes and their data pointers
     * when it was made; and its results. plan_n 0: none. */
    tsr_tensor *const *plan_nodes;
    size_t plan_n, plan_need, plan_conv_off;
    uint64_t plan_epoch, plan_hash;
    bool plan_prepared; /* a job of those nodes ran its checks and il8_prepare */
    bool phases;        /* TSR_CPU_PHASES is not "0" (else a barrier after every node) */
    bool prof;          /* TSR_PROFILE: time kernels and barriers */
    bool repack;        /* matmul weights take the interleaved layout (repack.c: tsr__cpu_il8_prepare) */
    /* Batched matmuls convert their activations into the work buffer at
     * conv_off, past every node's own scratch, where they stay until the
     * next conversion: a matmul whose activations are the last ones
     * converted, the same way and unwritten since (Q, K and V of one input,
     * gate and up), reads them there instead (matmul.c). conv_seq: the
     * converting node's sequence number (0: none). */
    size_t conv_off;
    uint64_t conv_seq;
    tsr_tensor conv_src; /* a copy of the converted tensor's shape, type and data */
    int conv_kind;       /* the conversion: 1 + dot type, or -1 for q8s */
};

/* Dynamic scheduling of node seq's items without a reset: the next item
 * (the first call of the node's first thread gets nth; each thread starts
 * at its own ith), read from s->tagged whose tag is the node's sequence
 * number. Items beyond TSR_CPU_TAGGED_MAX are never handed out: a node
 * with more resets chunk and meets a barrier instead. */
#define TSR_CPU_TAGGED_MAX ((INT64_C(1) << 24) - 1)
int64_t tsr__cpu_next_task(tsr_stream *s, uint64_t seq, int nth);

/* Records the job's first failure (thread-safe; later ones are dropped). */
void tsr__cpu_fail(tsr_stream *s, tsr_status st, const char *fmt, ...) TSR_PRINTF(3, 4);

tsr_status tsr__cpu_stream_new(tsr_device *d, int n_threads, tsr_stream **out);
void tsr__cpu_stream_free(tsr_stream *s);
/* Work-buffer bytes node needs with nth threads. */
size_t tsr__cpu_work_size(const tsr_tensor *node, int nth);
tsr_status tsr__cpu_reserve(tsr_stream *s, tsr_tensor *const *nodes, size_t n);
/* Runs nodes (all data in host memory) on the stream's threads. Grows the
 * work buffer only when reserve did not size it. */
tsr_status tsr__cpu_run_nodes(tsr_stream *s, tsr_tensor *const *nodes, size_t n);
bool tsr__cpu_supports_op(const tsr_tensor *op);
/* Before a job (job.c): the weights its nodes use otherwise than as a
 * matmul's src0 back in the stored layout, and those only multiplied into
 * the interleaved one (repack.c). */
tsr_status tsr__cpu_il8_prepare(tsr_stream *s, tsr_tensor *const *nodes, size_t n);
/* Ops of TSR_OPS without a complete CPU entry (support, and a kernel for
 * every op but NONE and VIEW): writes up to max of them, returns the count.
 * The tests require 0. */
size_t tsr__cpu_ops_missing(tsr_op *missing, size_t max);
/* Host buffer type operations (aligned malloc), for fake devices too. */
extern const tsr_buft_iface tsr__cpu_buft_iface;

/* ---- op kernels (ops.c, matmul.c, attn.c) ---------------------------------- */
typedef struct tsr_compute_params {
    int ith, nth;
    uint64_t seq;    /* the node's sequence number in the stream (tsr_claim) */
    int slot;        /* its claim words: stream->claims + slot * nth */
    bool conv_ready; /* one column: the converted activations are in this thread's scratch */
    void *work;      /* the node's part of the work buffer (kernels partition it by ith) */
    size_t work_size;
    tsr_stream *stream;
    const tsr_cpu_kernels *k;
} tsr_compute_params;

/* The kernel of op (cpu.c's op table; NULL: none). */
typedef void (*tsr_cpu_kernel_fn)(const tsr_compute_params *p, tsr_tensor *dst);
tsr_cpu_kernel_fn tsr__cpu_op_kernel(tsr_op op);
/* Whether op's kernel may share a phase with other nodes (job.c: plan_phases). */
bool tsr__cpu_op_shares(tsr_op op);

void tsr__cpu_op_binary(const tsr_compute_params *p, tsr_tensor *dst);
void tsr__cpu_op_scale(const tsr_compute_params *p, tsr_tensor *dst);
void tsr__cpu_op_unary(const tsr_compute_params *p, tsr_tensor *dst);
void tsr__cpu_op_glu(const tsr_compute_params *p, tsr_tensor *dst);
void tsr__cpu_op_norm(const tsr_compute_params *p, tsr_tensor *dst);
void tsr__cpu_op_rope(const tsr_compute_params *p, tsr_tensor *dst);
void tsr__cpu_op_softmax(const tsr_compute_params *p, tsr_tensor *dst);
void tsr__cpu_op_concat(const tsr_compute_params *p, tsr_tensor *dst);
void tsr__cpu_op_argmax(const tsr_compute_params *p, tsr_tensor *dst);
void tsr__cpu_op_get_rows(const tsr_compute_params *p, tsr_tensor *dst);
void tsr__cpu_op_set_rows(const tsr_compute_params *p, tsr_tensor *dst);
void tsr__cpu_op_cpy(const tsr_compute_params *p, tsr_tensor *dst);
void tsr__cpu_op_mul_mat(const tsr_compute_params *p, tsr_tensor *dst);
void tsr__cpu_op_flash_attn(const tsr_compute_params *p, tsr_tensor *dst);
void tsr__cpu_op_mul_mat_id(const tsr_compute_params *p, tsr_tensor *dst);
void tsr__cpu_op_argsort(const tsr_compute_params *p, tsr_tensor *dst); /* ARGSORT and TOP_K */
void tsr__cpu_op_sum_rows(const tsr_compute_params *p, tsr_tensor *dst);
size_t tsr__cpu_mul_mat_id_work(const tsr_tensor *dst, int nth);
size_t tsr__cpu_argsort_work(const tsr_tensor *dst, int nth);
size_t tsr__cpu_mul_mat_work(const tsr_tensor *dst, int nth);
/* The bytes of a batched matmul's converted activations (at the stream's
 * conv_off; 0: none, the one-column matmuls convert in their scratch). */
size_t tsr__cpu_mul_mat_conv(const tsr_tensor *dst);
/* Whether dst is a one-column matmul (no barrier inside, claims of rows;
 * *kind: how its activation row is converted, equal for equal conversions). */
bool tsr__cpu_mul_mat_gemv(const tsr_cpu_kernels *k, const tsr_tensor *dst, int *kind);
/* The weight bytes thread ith of nth reads first in the matmul dst when
 * that is known before it runs (one activation column); false otherwise. */
bool tsr__cpu_mul_mat_rows(const tsr_cpu_kernels *k, const tsr_tensor *dst, int ith, int nth, tsr_prefetch *pf);
size_t tsr__cpu_flash_attn_work(const tsr_tensor *dst, int nth);

/* Element of a non-quantized F32/F16/BF16/I32 tensor as a float. */
/* one line per type */
// clang-format off
static inline float tsr__cpu_load_f(tsr_type t, const char *p) {
    switch (t) {
    case TSR_TYPE_F32: { float v; memcpy(&v, p, 4); return v; }
    case TSR_TYPE_F16: { uint16_t h; memcpy(&h, p, 2); return TSR_FP16_TO_FP32(h); }
    case TSR_TYPE_BF16: { uint16_t h; memcpy(&h, p, 2); return tsr__bf16_to_fp32(h); }
    case TSR_TYPE_I32: { int32_t v; memcpy(&v, p, 4); return (float)v; }
    default: return 0.0f;
    }
}
// clang-format on

/* The middle of every softmax_step variant: a row whose max x is -inf gets
 * y = 0 (false: its sum is 0); else the running max *m moves to x when it
 * is -inf or x passes it by more than slack. */
static inline bool tsr__cpu_softmax_max(float x, float *y, int64_t n, float *m, float slack) {
    if (x == -INFINITY) {
        memset(y, 0, (size_t)n * sizeof *y);
        return false;
    }
    if (*m == -INFINITY || x > *m + slack)
        *m = x;
    return true;
}

/* Rows [*r0, *r1) of nr that thread ith of nth handles. */
static inline void tsr__cpu_split(int64_t nr, int ith, int nth, int64_t *r0, int64_t *r1) {
    const int64_t per = (nr + nth - 1) / nth;
    *r0 = per * ith < nr ? per * ith : nr;
    *r1 = *r0 + per < nr ? *r0 + per : nr;
}

#endif /* TSR_CPU_H */
