/*
 * test-ops.c - every op x every supported type x awkward shapes (0, 1, odd,
 * non-contiguous views, permuted inputs), run through the PUBLIC API and
 * compared with a double-precision reference by normalized mean squared
 * error (NMSE), in the spirit of ggml's test-backend-ops. Inputs are
 * random with a fixed seed per case; quantized inputs are compared against
 * the reference applied to their dequantized values; NaN/Inf where the
 * reference has none (or the reverse) fails; the compute buffer is
 * poisoned with NaN before each case, so an element never written shows.
 *
 *   test-ops [test]           run all cases on the CPU (default)
 *   test-ops -d CUDA0 [test]  run them on another device, compared likewise
 *                             (and with the CPU's result); TSR_TEST_DEVICE=CUDA0
 *                             in the environment does the same as -d CUDA0
 *   test-ops list             op x type support table
 *   test-ops perf [-t N]      GFLOP/s and GB/s per op
 *   test-ops -o OP            only cases of OP (e.g. mul_mat)
 *   test-ops -L [-d DEV]      the large cases instead (cases_large: grid
 *                             limits, offsets past 2^31 bytes; TSR_TEST_LARGE=1)
 */
#include "internal.h" /* the op table; the test links the static library */
#include "tsrtest.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* The ops are the library's own table (TSR_OPS): an op without a case here
 * fails the run (check_coverage). */
typedef tsr_op op_t;

/* How a source reaches the op: contiguous, a view with padded rows (byte
 * strides larger than the data), or a permutation of a contiguous tensor. */
enum layout { L_CONT, L_PAD, L_PERM };
/* What a source holds. */
enum kind { K_NORMAL, K_INDEX, K_MASK, K_MASK_LIVE, K_POS, K_POSITIVE, K_CONST, K_TIES };

typedef struct src_spec {
    tsr_type type;
    int64_t ne[4];
    enum layout layout;
    int perm[4];     /* L_PERM: tsr_permute axes (dim i of the base becomes dim perm[i]) */
    enum kind kind;
    int64_t range;   /* K_INDEX: indices in [0, range); K_CONST: the value; K_TIES: distinct values */
} src_spec;

typedef struct test_case {
    op_t op;
    tsr_type type;   /* the type the case is about (for the table) */
    int n_src;
    src_spec src[4];
    float f[9];      /* op parameters */
    int i[4];
    double max_nmse;
} test_case;

typedef struct source {
    tsr_tensor *t;
    double *v;       /* logical values, row-major over ne (the values the library sees) */
    int64_t ne[4];
} source;

static int n_skip;
static double worst_nmse[TSR_OP_COUNT];
static const char *only_op;
static const char *device_name; /* -d */
/* With -d: the device's buffer type, where run_case puts every source and
 * target (src_buft is NULL while output_on makes the CPU's), so that the
 * scheduler runs each op the device claims on the device. */
static tsr_device *test_device;
static tsr_buffer_type *src_buft;
static int n_on_device, n_on_host; /* op nodes run there (-d) */

/* A tensor of bytes: an input in system memory, or (src_buft) one allocated
 * on the device and written there. */
static tsr_tensor *new_source(tsr_context *ctx, tsr_type type, const int64_t ne[4], const void *bytes) {
    if (!src_buft) return tsr_input(ctx, type, 4, ne, bytes);
    tsr_tensor *t = tsr_new_tensor(ctx, src_buft, type, 4, ne);
    if (t && tsr_tensor_nbytes(t) && tsr_tensor_write(t, bytes, 0, tsr_tensor_nbytes(t)) != TSR_OK) return NULL;
    return t;
}

/* ---- random numbers (deterministic per case) ------------------------------ */
static uint64_t rs;
static double urand(void) {
    rs ^= rs >> 12;
    rs ^= rs << 25;
    rs ^= rs >> 27;
    return (double)((rs * 2685821657736338717ull) >> 11) * 0x1p-53;
}
static double nrand(void) { return sqrt(-2 * log(urand() + 1e-300)) * cos(2 * M_PI * urand()); }

static int64_t nel(const int64_t ne[4]) { return ne[0] * ne[1] * ne[2] * ne[3]; }
static int64_t idx4(const int64_t ne[4], int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return ((i3 * ne[2] + i2) * ne[1] + i1) * ne[0] + i0;
}

/* Round-trips floats through a type, as the library would store them. */
static void through_type(tsr_type t, float *x, int64_t n) {
    if (t == TSR_TYPE_F32 || n == 0) return;
    if (t == TSR_TYPE_I32) {
        for (int64_t i = 0; i < n; i++) x[i] = (float)(int32_t)lrintf(x[i]);
        return;
    }
    /* to a fixed point: the tensor's bytes quantize these values again, and
     * a K-quant's search may pick other scales for dequantized values */
    void *q = malloc(tsr_row_size(t, n) + 1);
    float *y = malloc((size_t)n * sizeof *y);
    for (int it = 0; it < 8; it++) {
        tsr_quantize(t, x, q, n);
        tsr_dequantize(t, q, y, n);
        const int same = memcmp(x, y, (size_t)n * sizeof *y) == 0;
        memcpy(x, y, (size_t)n * sizeof *y);
        if (same)
            break;
    }
    free(y);
    free(q);
}

/* Bytes of n values in type t (I32/I64 from integers, others quantized). */
static void *to_bytes(tsr_type t, const float *x, int64_t n) {
    void *b = calloc(1, tsr_row_size(t, n) + 8);
    if (t == TSR_TYPE_I32)
        for (int64_t i = 0; i < n; i++) ((int32_t *)b)[i] = (int32_t)lrintf(x[i]);
    else if (t == TSR_TYPE_I64)
        for (int64_t i = 0; i < n; i++) ((int64_t *)b)[i] = (int64_t)llrintf(x[i]);
    else if (n)
        tsr_quantize(t, x, b, n);
    return b;
}

static float gen_value(const src_spec *s, int64_t pos_i) {
    switch (s->kind) {
    /* the core rejects out-of-range input indices when the op is built;
     * the kernels' own out-of-range handling is tested in test-cpu-kernels */
    case K_INDEX: return (float)(int64_t)(urand() * (double)s->range);
    case K_MASK: return urand() < 0.2 ? -INFINITY : (float)nrand();
    /* keys from range on masked in every row (a cache's unused cells); ne0 = keys */
    case K_MASK_LIVE: return pos_i % s->ne[0] >= s->range ? -INFINITY : (float)nrand();
    case K_POS: return (float)(pos_i * 7 + 3);
    case K_POSITIVE: return (float)(0.5 + urand());
    case K_CONST: return (float)s->range;
    case K_TIES: return (float)(int64_t)(urand() * (double)s->range) - 1.5f; /* few values: many ties */
    default: return (float)nrand();
    }
}

/* Makes a source: logical values, then the tensor in the asked layout. */
static int make_source(tsr_context *ctx, const src_spec *s, source *out) {
    const int64_t n = nel(s->ne);
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = gen_value(s, i);
    if (s->type == TSR_TYPE_I32 && s->kind == K_NORMAL)
        for (int64_t i = 0; i < n; i++) x[i] = (float)lrintf(x[i] * 1000);
    if (s->kind != K_INDEX && s->kind != K_POS && s->kind != K_CONST && s->type != TSR_TYPE_I32)
        through_type(s->type, x, n);
    memcpy(out->ne, s->ne, sizeof out->ne);
    out->v = malloc((size_t)(n ? n : 1) * sizeof *out->v);
    for (int64_t i = 0; i < n; i++) out->v[i] = x[i];
    int64_t bne[4];
    memcpy(bne, s->ne, sizeof bne);
    float *base = x;
    if (s->layout == L_PERM) { /* base dim i = logical dim perm[i] */
        for (int d = 0; d < 4; d++) bne[d] = s->ne[s->perm[d]];
        base = malloc((size_t)(n ? n : 1) * sizeof *base);
        int64_t b[4];
        for (b[3] = 0; b[3] < bne[3]; b[3]++)
            for (b[2] = 0; b[2] < bne[2]; b[2]++)
                for (b[1] = 0; b[1] < bne[1]; b[1]++)
                    for (b[0] = 0; b[0] < bne[0]; b[0]++) {
                        int64_t l[4];
                        for (int d = 0; d < 4; d++) l[s->perm[d]] = b[d];
                        base[idx4(bne, b[0], b[1], b[2], b[3])] = x[idx4(s->ne, l[0], l[1], l[2], l[3])];
                    }
    } else if (s->layout == L_PAD) { /* rows padded by one block */
        const int64_t pad = tsr_type_block_size(s->type), pn = (s->ne[0] + pad) * s->ne[1] * s->ne[2] * s->ne[3];
        bne[0] = s->ne[0] + pad;
        base = calloc((size_t)(pn ? pn : 1), sizeof *base);
        for (int64_t r = 0; r < n / (s->ne[0] ? s->ne[0] : 1) && s->ne[0]; r++)
            memcpy(base + r * bne[0], x + r * s->ne[0], (size_t)s->ne[0] * sizeof *x);
        for (int64_t r = 0; r < pn; r++)
            if (r % bne[0] >= s->ne[0]) base[r] = 1e30f; /* never read */
    }
    void *bytes = to_bytes(s->type, base, nel(bne));
    tsr_tensor *t = new_source(ctx, s->type, bne, bytes);
    free(bytes);
    if (base != x) free(base);
    free(x);
    if (t && s->layout == L_PERM) t = tsr_permute(ctx, t, s->perm[0], s->perm[1], s->perm[2], s->perm[3]);
    if (t && s->layout == L_PAD)
        t = tsr_view_4d(ctx, t, s->ne[0], s->ne[1], s->ne[2], s->ne[3], tsr_tensor_nb(t, 1), tsr_tensor_nb(t, 2),
                        tsr_tensor_nb(t, 3), 0);
    out->t = t;
    return t != NULL;
}

/* ---- double references ------------------------------------------------------- */

typedef struct ref_out {
    int64_t ne[4];
    double *v;
    tsr_type type; /* values pass through this type (cpy/set_rows targets) */
} ref_out;

static void ref_alloc(ref_out *r, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    r->ne[0] = n0, r->ne[1] = n1, r->ne[2] = n2, r->ne[3] = n3;
    r->v = calloc((size_t)(nel(r->ne) ? nel(r->ne) : 1), sizeof *r->v);
}

static double silu_d(double x) { return x / (1 + exp(-x)); }
static double gelu_d(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

static void ref_binary(const test_case *c, const source *s, ref_out *r) {
    const source *a = &s[0], *b = &s[1];
    ref_alloc(r, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
    for (int64_t i3 = 0; i3 < a->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < a->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < a->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < a->ne[0]; i0++) {
                    const double x = a->v[idx4(a->ne, i0, i1, i2, i3)];
                    const double y = b->v[idx4(b->ne, i0 % b->ne[0], i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3])];
                    r->v[idx4(r->ne, i0, i1, i2, i3)] = c->op == TSR_OP_ADD ? x + y : c->op == TSR_OP_SUB ? x - y
                                                      : c->op == TSR_OP_MUL ? x * y : x / y;
                }
}

static void ref_unary(const test_case *c, const source *s, ref_out *r) {
    const source *a = &s[0];
    ref_alloc(r, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
    for (int64_t i = 0; i < nel(a->ne); i++) {
        const double x = a->v[i], y = c->n_src > 1 ? s[1].v[i] : 0;
        switch (c->op) {
        case TSR_OP_SCALE: r->v[i] = x * c->f[0]; break;
        case TSR_OP_SILU: r->v[i] = silu_d(x); break;
        case TSR_OP_GELU: r->v[i] = gelu_d(x); break;
        case TSR_OP_SIGMOID: r->v[i] = 1 / (1 + exp(-x)); break;
        case TSR_OP_SWIGLU: r->v[i] = silu_d(x) * y; break;
        default: r->v[i] = gelu_d(x) * y; break;
        }
    }
}

static void ref_mul_mat(const source *s, ref_out *r) {
    const source *a = &s[0], *b = &s[1];
    const int64_t k = a->ne[0];
    ref_alloc(r, a->ne[1], b->ne[1], b->ne[2], b->ne[3]);
    for (int64_t i3 = 0; i3 < b->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < b->ne[2]; i2++)
            for (int64_t j = 0; j < b->ne[1]; j++)
                for (int64_t i = 0; i < a->ne[1]; i++) {
                    const double *x = a->v + idx4(a->ne, 0, i, i2 / (b->ne[2] / a->ne[2]), i3 / (b->ne[3] / a->ne[3]));
                    const double *y = b->v + idx4(b->ne, 0, j, i2, i3);
                    double sum = 0;
                    for (int64_t l = 0; l < k; l++) sum += x[l] * y[l];
                    r->v[idx4(r->ne, i, j, i2, i3)] = sum;
                }
}

/* result[t][e][i] = sum_k as[ids[t][e]][i][k] * b[t][e % n_b][k] */
static void ref_mul_mat_id(const source *s, ref_out *r) {
    const source *as = &s[0], *b = &s[1], *ids = &s[2];
    const int64_t k = as->ne[0], m = as->ne[1], n_used = ids->ne[0], n_tokens = ids->ne[1];
    ref_alloc(r, m, n_used, n_tokens, 1);
    for (int64_t t = 0; t < n_tokens; t++)
        for (int64_t e = 0; e < n_used; e++) {
            const int64_t id = (int64_t)ids->v[idx4(ids->ne, e, t, 0, 0)];
            for (int64_t i = 0; i < m; i++) {
                const double *x = as->v + idx4(as->ne, 0, i, id, 0), *y = b->v + idx4(b->ne, 0, e % b->ne[1], t, 0);
                double sum = 0;
                for (int64_t l = 0; l < k; l++) sum += x[l] * y[l];
                r->v[idx4(r->ne, i, e, t, 0)] = sum;
            }
        }
}

/* Stable: equal values keep index order; top_k is argsort descending's first k. */
static const double *sort_keys;
static int sort_desc;
static int cmp_idx(const void *pa, const void *pb) {
    const int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    const double x = sort_keys[a], y = sort_keys[b];
    if (x != y) return (x < y) == !sort_desc ? -1 : 1;
    return a < b ? -1 : 1;
}

static void ref_argsort(const test_case *c, const source *s, ref_out *r) {
    const source *a = &s[0];
    const int64_t n = a->ne[0], k = c->op == TSR_OP_TOP_K ? c->i[0] : n;
    ref_alloc(r, k, a->ne[1], a->ne[2], a->ne[3]);
    int64_t *ix = malloc((size_t)(n ? n : 1) * sizeof *ix);
    sort_desc = c->op == TSR_OP_TOP_K || c->i[0] == TSR_SORT_DESC;
    for (int64_t row = 0; row < nel(r->ne) / (k ? k : 1) && n; row++) {
        for (int64_t i = 0; i < n; i++) ix[i] = i;
        sort_keys = a->v + row * n;
        qsort(ix, (size_t)n, sizeof *ix, cmp_idx);
        for (int64_t i = 0; i < k; i++) r->v[row * k + i] = (double)ix[i];
    }
    free(ix);
}

static void ref_sum_rows(const source *s, ref_out *r) {
    const source *a = &s[0];
    ref_alloc(r, 1, a->ne[1], a->ne[2], a->ne[3]);
    for (int64_t row = 0; row < nel(r->ne); row++) {
        double sum = 0;
        for (int64_t i = 0; i < a->ne[0]; i++) sum += a->v[row * a->ne[0] + i];
        r->v[row] = sum;
    }
}

static void ref_get_rows(const source *s, ref_out *r) {
    const source *a = &s[0], *ix = &s[1];
    ref_alloc(r, a->ne[0], ix->ne[0], ix->ne[1], ix->ne[2]);
    for (int64_t i12 = 0; i12 < ix->ne[2]; i12++)
        for (int64_t i11 = 0; i11 < ix->ne[1]; i11++)
            for (int64_t j = 0; j < ix->ne[0]; j++) {
                const int64_t row = (int64_t)ix->v[idx4(ix->ne, j, i11, i12, 0)];
                for (int64_t i0 = 0; i0 < a->ne[0]; i0++)
                    r->v[idx4(r->ne, i0, j, i11, i12)] =
                        row < 0 || row >= a->ne[1] ? 0 : a->v[idx4(a->ne, i0, row, i11, i12)];
            }
}

static void ref_set_rows(const source *s, ref_out *r) {
    const source *t = &s[0], *src = &s[1], *ix = &s[2];
    ref_alloc(r, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    memcpy(r->v, t->v, (size_t)nel(t->ne) * sizeof *r->v);
    for (int64_t i13 = 0; i13 < src->ne[3]; i13++)
        for (int64_t i12 = 0; i12 < src->ne[2]; i12++)
            for (int64_t j = 0; j < src->ne[1]; j++) {
                const int64_t row = (int64_t)ix->v[idx4(ix->ne, j, i12 % ix->ne[1], i13 % ix->ne[2], 0)];
                if (row < 0 || row >= t->ne[1]) continue;
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++)
                    r->v[idx4(r->ne, i0, row, i12, i13)] = src->v[idx4(src->ne, i0, j, i12, i13)];
            }
}

static void ref_norm(const test_case *c, const source *s, ref_out *r) {
    const source *a = &s[0];
    const int64_t n0 = a->ne[0];
    ref_alloc(r, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
    for (int64_t row = 0; row < (n0 ? nel(a->ne) / n0 : 0); row++) {
        const double *x = a->v + row * n0;
        double mean = 0, var = 0;
        if (c->op == TSR_OP_NORM) {
            for (int64_t i = 0; i < n0; i++) mean += x[i];
            mean /= n0;
        }
        for (int64_t i = 0; i < n0; i++) var += (x[i] - mean) * (x[i] - mean);
        const double sc = 1 / sqrt(var / n0 + c->f[0]);
        for (int64_t i = 0; i < n0; i++) r->v[row * n0 + i] = (x[i] - mean) * sc;
    }
}

static double yarn_corr(int n_dims, int n_ctx, double n_rot, double base) {
    return n_dims * log(n_ctx / (n_rot * 2 * M_PI)) / (2 * log(base));
}

static void ref_rope(const test_case *c, const source *s, ref_out *r) {
    const source *a = &s[0], *pos = &s[1], *ff = c->n_src > 2 ? &s[2] : NULL;
    const int n_dims = c->i[0], mode = c->i[1], n_ctx = c->i[2];
    const double base = c->f[0], fs = c->f[1], ext = c->f[2], attn = c->f[3];
    double lo = 0, hi = 0;
    if (ext != 0) {
        lo = fmax(0, floor(yarn_corr(n_dims, n_ctx, c->f[4], base)));
        hi = fmin(n_dims - 1, ceil(yarn_corr(n_dims, n_ctx, c->f[5], base)));
    }
    ref_alloc(r, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
    memcpy(r->v, a->v, (size_t)nel(a->ne) * sizeof *r->v);
    for (int64_t i3 = 0; i3 < a->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < a->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < a->ne[1]; i1++) {
                const double *x = a->v + idx4(a->ne, 0, i1, i2, i3);
                double *y = r->v + idx4(a->ne, 0, i1, i2, i3);
                for (int i0 = 0; i0 < n_dims; i0 += 2) {
                    const double te = pos->v[i2] * pow(base, -(double)i0 / n_dims) / (ff ? ff->v[i0 / 2] : 1.0);
                    double th = fs * te, ms = attn;
                    if (ext != 0) {
                        const double ramp = (1 - fmin(1, fmax(0, (i0 / 2 - lo) / fmax(0.001, hi - lo)))) * ext;
                        th = th * (1 - ramp) + te * ramp;
                        ms *= 1 + 0.1 * log(1 / fs);
                    }
                    const int j0 = mode == 2 ? i0 / 2 : i0, j1 = mode == 2 ? i0 / 2 + n_dims / 2 : i0 + 1;
                    y[j0] = (x[j0] * cos(th) - x[j1] * sin(th)) * ms;
                    y[j1] = (x[j0] * sin(th) + x[j1] * cos(th)) * ms;
                }
            }
}

static void ref_softmax(const test_case *c, const source *s, ref_out *r) {
    const source *a = &s[0], *m = c->n_src > 1 ? &s[1] : NULL;
    ref_alloc(r, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
    for (int64_t i3 = 0; i3 < a->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < a->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < a->ne[1]; i1++) {
                double *y = r->v + idx4(a->ne, 0, i1, i2, i3), mx = -INFINITY, sum = 0;
                for (int64_t i0 = 0; i0 < a->ne[0]; i0++) {
                    y[i0] = a->v[idx4(a->ne, i0, i1, i2, i3)] * c->f[0] +
                            (m ? m->v[idx4(m->ne, i0, i1, i2 % m->ne[2], i3 % m->ne[3])] : 0);
                    mx = fmax(mx, y[i0]);
                }
                for (int64_t i0 = 0; i0 < a->ne[0]; i0++) sum += (y[i0] = mx == -INFINITY ? 0 : exp(y[i0] - mx));
                for (int64_t i0 = 0; i0 < a->ne[0]; i0++) y[i0] = sum > 0 ? y[i0] / sum : 0;
            }
}

static void ref_concat(const test_case *c, const source *s, ref_out *r) {
    const source *a = &s[0], *b = &s[1];
    const int dim = c->i[0];
    int64_t ne[4];
    memcpy(ne, a->ne, sizeof ne);
    ne[dim] += b->ne[dim];
    ref_alloc(r, ne[0], ne[1], ne[2], ne[3]);
    int64_t i[4];
    for (i[3] = 0; i[3] < ne[3]; i[3]++)
        for (i[2] = 0; i[2] < ne[2]; i[2]++)
            for (i[1] = 0; i[1] < ne[1]; i[1]++)
                for (i[0] = 0; i[0] < ne[0]; i[0]++) {
                    int64_t j[4] = {i[0], i[1], i[2], i[3]};
                    const source *src = a;
                    if (i[dim] >= a->ne[dim]) {
                        src = b;
                        j[dim] -= a->ne[dim];
                    }
                    r->v[idx4(ne, i[0], i[1], i[2], i[3])] = src->v[idx4(src->ne, j[0], j[1], j[2], j[3])];
                }
}

static void ref_argmax(const source *s, ref_out *r) {
    const source *a = &s[0];
    ref_alloc(r, a->ne[1], a->ne[2], a->ne[3], 1);
    for (int64_t row = 0; row < nel(r->ne); row++) {
        int64_t best = 0;
        for (int64_t i = 1; i < a->ne[0]; i++)
            if (a->v[row * a->ne[0] + i] > a->v[row * a->ne[0] + best]) best = i;
        r->v[row] = (double)best;
    }
}

static void ref_flash_attn(const test_case *c, const source *s, ref_out *r) {
    const source *q = &s[0], *k = &s[1], *v = &s[2], *m = c->n_src > 3 ? &s[3] : NULL;
    const int64_t dk = q->ne[0], dv = v->ne[0], nq = q->ne[1], nh = q->ne[2], nkv = k->ne[1];
    ref_alloc(r, dv, nh, nq, q->ne[3]);
    double *w = malloc((size_t)(nkv ? nkv : 1) * sizeof *w);
    for (int64_t sq = 0; sq < q->ne[3]; sq++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t iq = 0; iq < nq; iq++) {
                const int64_t hk = h / (nh / k->ne[2]);
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < nkv; j++) {
                    double d = 0;
                    for (int64_t l = 0; l < dk; l++)
                        d += q->v[idx4(q->ne, l, iq, h, sq)] * k->v[idx4(k->ne, l, j, hk, sq)];
                    w[j] = d * c->f[0] + (m ? m->v[idx4(m->ne, j, iq, 0, 0)] : 0);
                    mx = fmax(mx, w[j]);
                }
                for (int64_t j = 0; j < nkv; j++) sum += (w[j] = mx == -INFINITY ? 0 : exp(w[j] - mx));
                for (int64_t l = 0; l < dv; l++) {
                    double acc = 0;
                    for (int64_t j = 0; j < nkv; j++) acc += w[j] * v->v[idx4(v->ne, l, j, hk, sq)];
                    r->v[idx4(r->ne, l, h, iq, sq)] = sum > 0 ? acc / sum : 0;
                }
            }
    free(w);
}

static void reference(const test_case *c, const source *s, ref_out *r) {
    r->type = TSR_TYPE_F32;
    switch (c->op) {
    case TSR_OP_ADD: case TSR_OP_SUB: case TSR_OP_MUL: case TSR_OP_DIV: ref_binary(c, s, r); break;
    case TSR_OP_SCALE: case TSR_OP_SILU: case TSR_OP_GELU: case TSR_OP_SWIGLU: case TSR_OP_GEGLU: case TSR_OP_SIGMOID:
        ref_unary(c, s, r);
        break;
    case TSR_OP_MUL_MAT_ID: ref_mul_mat_id(s, r); break;
    case TSR_OP_ARGSORT: case TSR_OP_TOP_K: ref_argsort(c, s, r); break;
    case TSR_OP_SUM_ROWS: ref_sum_rows(s, r); break;
    case TSR_OP_MUL_MAT: ref_mul_mat(s, r); break;
    case TSR_OP_GET_ROWS: ref_get_rows(s, r); break;
    case TSR_OP_SET_ROWS: ref_set_rows(s, r); r->type = c->src[0].type; break;
    case TSR_OP_RMS_NORM: case TSR_OP_NORM: ref_norm(c, s, r); break;
    case TSR_OP_ROPE: ref_rope(c, s, r); break;
    case TSR_OP_SOFTMAX: ref_softmax(c, s, r); break;
    case TSR_OP_CONCAT: ref_concat(c, s, r); r->type = c->src[0].type; break;
    case TSR_OP_ARGMAX: ref_argmax(s, r); break;
    case TSR_OP_CPY: /* logical row-major order of both: the values, in b's shape and type */
        ref_alloc(r, s[1].ne[0], s[1].ne[1], s[1].ne[2], s[1].ne[3]);
        memcpy(r->v, s[0].v, (size_t)nel(s[0].ne) * sizeof *r->v);
        r->type = c->src[1].type;
        break;
    case TSR_OP_CONT:
        ref_alloc(r, s[0].ne[0], s[0].ne[1], s[0].ne[2], s[0].ne[3]);
        memcpy(r->v, s[0].v, (size_t)nel(s[0].ne) * sizeof *r->v);
        r->type = (tsr_type)c->i[0];
        break;
    case TSR_OP_FLASH_ATTN: ref_flash_attn(c, s, r); break;
    default: break;
    }
    if (r->type != TSR_TYPE_F32 && r->type != TSR_TYPE_I32) { /* the stored value is the converted one */
        const int64_t n = nel(r->ne);
        float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
        for (int64_t i = 0; i < n; i++) f[i] = (float)r->v[i];
        for (int64_t row = 0; row < (r->ne[0] ? n / r->ne[0] : 0); row++)
            through_type(r->type, f + row * r->ne[0], r->ne[0]);
        for (int64_t i = 0; i < n; i++) r->v[i] = f[i];
        free(f);
    }
}

/* ---- building the op through the public API ----------------------------------------- */

static tsr_tensor *build(tsr_context *ctx, const test_case *c, source *s) {
    tsr_tensor *a = s[0].t, *b = c->n_src > 1 ? s[1].t : NULL;
    switch (c->op) {
    case TSR_OP_ADD: return tsr_add(ctx, a, b);
    case TSR_OP_SUB: return tsr_sub(ctx, a, b);
    case TSR_OP_MUL: return tsr_mul(ctx, a, b);
    case TSR_OP_DIV: return tsr_div(ctx, a, b);
    case TSR_OP_SCALE: return tsr_scale(ctx, a, c->f[0]);
    case TSR_OP_MUL_MAT: return tsr_mul_mat(ctx, a, b);
    case TSR_OP_GET_ROWS: return tsr_get_rows(ctx, a, b);
    case TSR_OP_SET_ROWS: return tsr_set_rows(ctx, a, b, s[2].t);
    case TSR_OP_RMS_NORM: return tsr_rms_norm(ctx, a, c->f[0]);
    case TSR_OP_NORM: return tsr_norm(ctx, a, c->f[0]);
    case TSR_OP_ROPE:
        return tsr_rope_ext(ctx, a, b, c->n_src > 2 ? s[2].t : NULL, c->i[0], c->i[1], c->i[2], c->f[0], c->f[1],
                            c->f[2], c->f[3], c->f[4], c->f[5]);
    case TSR_OP_SOFTMAX: return tsr_softmax_ext(ctx, a, b, c->f[0]);
    case TSR_OP_SILU: return tsr_silu(ctx, a);
    case TSR_OP_GELU: return tsr_gelu(ctx, a);
    case TSR_OP_SWIGLU: return tsr_swiglu(ctx, a, b);
    case TSR_OP_GEGLU: return tsr_geglu(ctx, a, b);
    case TSR_OP_CONCAT: return tsr_concat(ctx, a, b, c->i[0]);
    case TSR_OP_ARGMAX: return tsr_argmax(ctx, a);
    case TSR_OP_CPY: return tsr_cpy(ctx, a, b);
    case TSR_OP_CONT: return (tsr_type)c->i[0] == c->src[0].type ? tsr_cont(ctx, a) : tsr_cast(ctx, a, (tsr_type)c->i[0]);
    case TSR_OP_FLASH_ATTN: return tsr_flash_attn(ctx, a, b, s[2].t, c->n_src > 3 ? s[3].t : NULL, c->f[0]);
    case TSR_OP_MUL_MAT_ID: return tsr_mul_mat_id(ctx, a, b, s[2].t);
    case TSR_OP_ARGSORT: return tsr_argsort(ctx, a, (tsr_sort_order)c->i[0]);
    case TSR_OP_TOP_K: return tsr_top_k(ctx, a, c->i[0]);
    case TSR_OP_SIGMOID: return tsr_sigmoid(ctx, a);
    case TSR_OP_SUM_ROWS: return tsr_sum_rows(ctx, a);
    default: return NULL;
    }
}

/* In-place targets (set_rows, cpy destinations) must be memory the graph
 * writes into: tsr_new_tensor, filled with the source's values. */
static int make_target(tsr_context *ctx, const src_spec *sp, source *s) {
    if (!make_source(ctx, sp, s)) return 0;
    tsr_tensor *t = tsr_new_tensor(ctx, src_buft, sp->type, 4, sp->ne);
    if (!t) return 0;
    const int64_t n = nel(sp->ne);
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    for (int64_t i = 0; i < n; i++) f[i] = (float)s->v[i];
    void *bytes = to_bytes(sp->type, f, n);
    tsr_status st = tsr_tensor_write(t, bytes, 0, tsr_tensor_nbytes(t));
    free(bytes);
    free(f);
    s->t = t;
    return st == TSR_OK;
}

/* ---- running and comparing --------------------------------------------------- */

static tsr_backend *make_backend(const char *device, int n_threads) {
    tsr_backend_params p;
    tsr_backend_params_init(&p, sizeof p);
    p.n_threads = n_threads;
    tsr_device *devs[2] = {NULL, NULL};
    if (device) {
        devs[0] = tsr_device_by_name(device);
        if (!devs[0]) return NULL;
        p.devices = devs;
    }
    tsr_backend *b = NULL;
    if (tsr_backend_new(&p, &b) != TSR_OK) {
        fprintf(stderr, "tsr_backend_new: %s\n", tsr_last_error());
        return NULL;
    }
    return b;
}

/* Fills the backend's compute memory with NaN: an output slot that the op
 * fails to write then reads as NaN, not as an old correct value. */
static void poison(tsr_backend *b, int64_t n) {
    tsr_context *ctx = tsr_context_new(b);
    if (!ctx) return;
    const int64_t ne = n > 0 ? n : 1;
    float *nan_data = malloc((size_t)ne * sizeof *nan_data);
    for (int64_t i = 0; i < ne; i++) nan_data[i] = NAN;
    tsr_tensor *x = tsr_input(ctx, TSR_TYPE_F32, 1, &ne, nan_data);
    tsr_tensor *y = tsr_scale(ctx, x, 1.0f);
    if (y) tsr_compute(ctx, &y, 1);
    tsr_context_close(ctx);
    free(nan_data);
}

static void case_label(const test_case *c, char *buf, size_t size) {
    int n = snprintf(buf, size, "%s(%s", tsr__op_name(c->op), tsr_type_name(c->type));
    for (int i = 0; i < c->n_src && n < (int)size; i++)
        n += snprintf(buf + n, size - (size_t)n, " %s[%lld,%lld,%lld,%lld]%s", tsr_type_name(c->src[i].type),
                      (long long)c->src[i].ne[0], (long long)c->src[i].ne[1], (long long)c->src[i].ne[2],
                      (long long)c->src[i].ne[3], c->src[i].layout == L_PAD ? "pad" : c->src[i].layout == L_PERM ? "perm" : "");
    if (n < (int)size) snprintf(buf + n, size - (size_t)n, ")");
}

/* Output values (as doubles) of out, read through the public API. */
static double *read_output(tsr_tensor *out, int64_t n) {
    const size_t nb = tsr_tensor_nbytes(out);
    void *raw = malloc(nb + 1);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (tsr_tensor_read(out, raw, 0, nb) != TSR_OK) {
        fprintf(stderr, "  tsr_tensor_read: %s\n", tsr_last_error());
        free(raw);
        free(v);
        return NULL;
    }
    const tsr_type t = tsr_tensor_type(out);
    if (t == TSR_TYPE_I32) {
        for (int64_t i = 0; i < n; i++) v[i] = ((int32_t *)raw)[i];
    } else {
        float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
        tsr_dequantize(t, raw, f, n);
        for (int64_t i = 0; i < n; i++) v[i] = f[i];
        free(f);
    }
    free(raw);
    return v;
}

/* 0 = pass, 1 = fail. NaN/Inf must match the reference exactly. */
static int compare(const test_case *c, const double *got, const ref_out *r, double *nmse_out) {
    const int64_t n = nel(r->ne);
    double err = 0, mag = 0;
    for (int64_t i = 0; i < n; i++) {
        const double x = got[i], y = r->v[i];
        if (!isfinite(y) || !isfinite(x)) {
            if ((isnan(x) && isnan(y)) || x == y) continue;
            fprintf(stderr, "  element %lld: got %g, reference %g\n", (long long)i, x, y);
            return 1;
        }
        err += (x - y) * (x - y);
        mag += y * y;
    }
    const double nmse = mag > 0 ? err / mag : err;
    *nmse_out = nmse;
    return nmse > c->max_nmse;
}

/* With -d: the CPU backend, which runs each case too, as a second reference. */
static tsr_backend *cpu_backend;

/* The case's output computed on backend be (same seed: same inputs); NULL on failure. */
static double *output_on(tsr_backend *be, const test_case *c, uint64_t seed, int64_t n) {
    rs = seed * 0x9E3779B97F4A7C15ull + 12345;
    tsr_context *ctx = tsr_context_new(be);
    source s[4] = {{0}};
    int ok = ctx != NULL;
    for (int i = 0; ok && i < c->n_src; i++) {
        const int target = (c->op == TSR_OP_SET_ROWS && i == 0) || (c->op == TSR_OP_CPY && i == 1);
        ok = target ? make_target(ctx, &c->src[i], &s[i]) : make_source(ctx, &c->src[i], &s[i]);
    }
    tsr_tensor *out = ok ? build(ctx, c, s) : NULL;
    double *v = out && tsr_compute(ctx, &out, 1) == TSR_OK ? read_output(out, n) : NULL;
    for (int i = 0; i < 4; i++) free(s[i].v);
    tsr_context_close(ctx);
    return v;
}

/* With -d, after a compute: every op node of out's graph that the device
 * claims (supports_op) ran on the device, not on the CPU; 0 = so. The
 * nodes are counted (n_on_device, n_on_host) for the summary. */
static int check_placement(tsr_tensor *out, const char *label) {
    enum { MAXN = 64 };
    tsr_tensor *stack[MAXN], *seen[MAXN];
    int n_stack = 0, n_seen = 0, bad = 0;
    stack[n_stack++] = out;
    while (n_stack > 0) {
        tsr_tensor *t = stack[--n_stack];
        int dup = 0;
        for (int i = 0; i < n_seen; i++) dup |= seen[i] == t;
        if (dup || n_seen == MAXN) continue;
        seen[n_seen++] = t;
        for (int j = 0; j < TSR_MAX_SRC; j++)
            if (t->src[j] && n_stack < MAXN) stack[n_stack++] = t->src[j];
        if (t->op == TSR_OP_NONE || t->op == TSR_OP_VIEW || tsr_tensor_nbytes(t) == 0) continue; /* (empty: never run) */
        const tsr_device *ran = tsr_tensor_device(t);
        if (ran == test_device) {
            n_on_device++;
        } else {
            n_on_host++;
            int has_data = 0; /* (sources all empty: no device holds them, any may run it) */
            for (int j = 0; j < TSR_MAX_SRC; j++) has_data |= t->src[j] && tsr_tensor_nbytes(t->src[j]) > 0;
            if (has_data && test_device->iface->supports_op(test_device, t)) {
                fprintf(stderr, "FAIL %s: node %s ran on %s although %s claims it\n", label, tsr__op_name(t->op),
                        ran ? ran->name : "no device", test_device->name);
                bad = 1;
            }
        }
    }
    return bad;
}

/* With -d, the device against the CPU element by element: every element
 * within 2e-3 of the output's largest magnitude, plus five times the CPU's
 * own RMS distance from the float64 reference (the CPU quantizes a matrix
 * product's activations to Q8_0/Q8_K, a GPU to Q8_1 or F16: each is near
 * the reference, and their noises differ; for float ops the term is ~0);
 * one element 1% off (TSR_FAKE_FAULT) shows even where the NMSE would hide
 * it; indices exactly. 0 = so. */
static int compare_elements(const double *got, const ref_out *cpu, const ref_out *ref, int integer) {
    const int64_t n = nel(cpu->ne);
    double mag = 0, err2 = 0;
    int64_t n_err = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isfinite(cpu->v[i])) mag = fmax(mag, fabs(cpu->v[i]));
        if (isfinite(cpu->v[i]) && isfinite(ref->v[i])) {
            err2 += (cpu->v[i] - ref->v[i]) * (cpu->v[i] - ref->v[i]);
            n_err++;
        }
    }
    const double tol = 2e-3 * mag + 5 * sqrt(n_err ? err2 / (double)n_err : 0) + 1e-30;
    for (int64_t i = 0; i < n; i++) {
        const double x = got[i], y = cpu->v[i];
        if (!isfinite(x) || !isfinite(y) ? !((isnan(x) && isnan(y)) || x == y)
                                         : fabs(x - y) > (integer ? 0 : tol)) {
            fprintf(stderr, "  element %lld: %.9g on the device, %.9g on the CPU (largest magnitude %g)\n",
                    (long long)i, x, y, mag);
            return 1;
        }
    }
    return 0;
}

static int run_case(tsr_backend *b, const test_case *c, uint64_t seed, int verbose, int *supported) {
    char label[512];
    case_label(c, label, sizeof label);
    rs = seed * 0x9E3779B97F4A7C15ull + 12345;
    tsr_context *ctx = tsr_context_new(b);
    source s[4] = {{0}};
    ref_out r;
    memset(&r, 0, sizeof r);
    int ok = ctx != NULL, result = 1;
    src_buft = test_device ? tsr_device_buffer_type(test_device) : NULL;
    for (int i = 0; ok && i < c->n_src; i++) {
        const int target = (c->op == TSR_OP_SET_ROWS && i == 0) || (c->op == TSR_OP_CPY && i == 1);
        ok = target ? make_target(ctx, &c->src[i], &s[i]) : make_source(ctx, &c->src[i], &s[i]);
    }
    src_buft = NULL;
    tsr_tensor *out = ok ? build(ctx, c, s) : NULL;
    *supported = 1;
    if (!out) {
        const tsr_status st = ctx ? tsr_context_status(ctx) : TSR_E_NOMEM;
        *supported = st != TSR_E_UNSUPPORTED;
        fprintf(stderr, "%s %s: build failed: %s\n", *supported ? "FAIL" : "skip", label,
                ctx && tsr_context_error(ctx) ? tsr_context_error(ctx) : tsr_last_error());
        result = *supported;
        goto done;
    }
    if (test_device && (c->op == TSR_OP_SET_ROWS || c->op == TSR_OP_CPY) &&
        !test_device->iface->supports_op(test_device, out)) {
        /* the target is in the device's memory, and only the device may write there */
        fprintf(stderr, "skip %s: %s does not run it, and its target is in that device's memory\n", label,
                test_device->name);
        *supported = 0;
        result = 0;
        goto done;
    }
    reference(c, s, &r);
    poison(b, nel(r.ne) + 64);
    tsr_status st = tsr_compute(ctx, &out, 1);
    if (st != TSR_OK) { /* the build succeeded, so a device claimed the node: it must run */
        fprintf(stderr, "FAIL %s: compute: %s%s\n", label, tsr_last_error(),
                st == TSR_E_UNSUPPORTED ? " (a device's supports_op claimed the node, no kernel ran it)" : "");
        goto done;
    }
    int shape_ok = 1;
    for (int d = 0; d < 4; d++) shape_ok &= tsr_tensor_ne(out, d) == r.ne[d];
    double *got = shape_ok ? read_output(out, nel(r.ne)) : NULL;
    double nmse = 0;
    result = !got || compare(c, got, &r, &nmse);
    if (nmse > worst_nmse[c->op]) worst_nmse[c->op] = nmse;
    if (test_device && check_placement(out, label)) result = 1;
    if (got && cpu_backend && !result) { /* the device against the CPU */
        ref_out cr = r;
        cr.v = output_on(cpu_backend, c, seed, nel(r.ne));
        double nmse_cpu = 0;
        result = !cr.v || compare(c, got, &cr, &nmse_cpu) ||
                 compare_elements(got, &cr, &r, tsr_tensor_type(out) == TSR_TYPE_I32);
        if (result) fprintf(stderr, "  differs from the CPU: NMSE %.3g\n", nmse_cpu);
        free(cr.v);
    }
    if (result || verbose)
        fprintf(result ? stderr : stdout, "%s %s: NMSE %.3g (max %.1g)%s\n", result ? "FAIL" : "ok  ", label, nmse,
                c->max_nmse, shape_ok ? "" : " wrong output shape");
    free(got);
done:
    for (int i = 0; i < 4; i++) free(s[i].v);
    free(r.v);
    tsr_context_close(ctx);
    return result;
}

/* ---- the cases ------------------------------------------------------------------------ */

#define MAX_CASES 4096
static test_case cases[MAX_CASES];
static int n_cases;

static src_spec S(tsr_type t, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    src_spec s = {t, {n0, n1, n2, n3}, L_CONT, {0, 1, 2, 3}, K_NORMAL, 0};
    return s;
}
static src_spec P(src_spec s, int a0, int a1, int a2, int a3) {
    s.layout = L_PERM;
    s.perm[0] = a0, s.perm[1] = a1, s.perm[2] = a2, s.perm[3] = a3;
    return s;
}
static src_spec PAD(src_spec s) {
    s.layout = L_PAD;
    return s;
}
static src_spec KIND(src_spec s, enum kind k, int64_t range) {
    s.kind = k;
    s.range = range;
    return s;
}
static test_case *add_case(op_t op, tsr_type type, double nmse, int n_src, ...) {
    test_case *c = &cases[n_cases++];
    memset(c, 0, sizeof *c);
    c->op = op;
    c->type = type;
    c->max_nmse = nmse;
    c->n_src = n_src;
    va_list ap;
    va_start(ap, n_src);
    for (int i = 0; i < n_src; i++) c->src[i] = va_arg(ap, src_spec);
    va_end(ap);
    return c;
}

static const tsr_type float_types[] = {TSR_TYPE_F32, TSR_TYPE_F16, TSR_TYPE_BF16};
static const tsr_type mm_types[] = {TSR_TYPE_F32, TSR_TYPE_F16, TSR_TYPE_BF16, TSR_TYPE_Q8_0, TSR_TYPE_Q4_0,
                                    TSR_TYPE_Q4_1, TSR_TYPE_Q5_0, TSR_TYPE_Q5_1, TSR_TYPE_Q4_K, TSR_TYPE_Q5_K,
                                    TSR_TYPE_Q6_K};
static const tsr_type setrows_types[] = {TSR_TYPE_F32, TSR_TYPE_F16, TSR_TYPE_BF16, TSR_TYPE_Q8_0,
                                         TSR_TYPE_Q4_0, TSR_TYPE_Q4_1, TSR_TYPE_Q5_0, TSR_TYPE_Q5_1};
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* Precision of a float type's inputs sets how exact the output can be. */
static double tol_for(tsr_type t, double base) { return t == TSR_TYPE_BF16 || t == TSR_TYPE_F16 ? fmax(base, 1e-6) : base; }

static void cases_elementwise(void) {
    const op_t bin[] = {TSR_OP_ADD, TSR_OP_SUB, TSR_OP_MUL, TSR_OP_DIV};
    for (size_t o = 0; o < N_OF(bin); o++)
        for (size_t ta = 0; ta < N_OF(float_types); ta++)
            for (size_t tb = 0; tb < N_OF(float_types); tb++) {
                const tsr_type a = float_types[ta], b = float_types[tb];
                src_spec pb = KIND(S(b, 7, 1, 3, 1), bin[o] == TSR_OP_DIV ? K_POSITIVE : K_NORMAL, 0);
                add_case(bin[o], a, 1e-7, 2, S(a, 10, 5, 3, 2), S(b, 10, 5, 3, 2));
                add_case(bin[o], a, 1e-7, 2, S(a, 7, 4, 3, 2), pb); /* broadcast */
                add_case(bin[o], a, 1e-7, 2, PAD(S(a, 33, 3, 2, 1)), P(S(b, 33, 3, 1, 1), 1, 0, 2, 3));
                add_case(bin[o], a, 1e-7, 2, S(a, 0, 3, 1, 1), S(b, 1, 3, 1, 1));
                /* one value of b per row of a (MoE's expert weights), and one in all */
                add_case(bin[o], a, 1e-7, 2, S(a, 37, 4, 3, 1),
                         KIND(S(b, 1, 4, 3, 1), bin[o] == TSR_OP_DIV ? K_POSITIVE : K_NORMAL, 0));
                add_case(bin[o], a, 1e-7, 2, S(a, 19, 4, 2, 1),
                         KIND(S(b, 1, 1, 1, 1), bin[o] == TSR_OP_DIV ? K_POSITIVE : K_NORMAL, 0));
                add_case(bin[o], a, 1e-7, 2, P(S(a, 19, 4, 2, 1), 1, 0, 2, 3),
                         KIND(S(b, 1, 1, 1, 1), bin[o] == TSR_OP_DIV ? K_POSITIVE : K_NORMAL, 0));
                add_case(bin[o], a, 1e-7, 2, S(a, 1, 1, 1, 1), S(b, 1, 1, 1, 1));
            }
    /* scale, unary and gated ops take F32 (the core's contract) */
    const tsr_type a = TSR_TYPE_F32;
    add_case(TSR_OP_SCALE, a, 1e-7, 1, S(a, 17, 3, 2, 1))->f[0] = 0.37f;
    add_case(TSR_OP_SCALE, a, 1e-7, 1, P(S(a, 5, 9, 2, 1), 1, 0, 2, 3))->f[0] = -2.5f;
    const op_t un[] = {TSR_OP_SILU, TSR_OP_GELU};
    for (int u = 0; u < 2; u++) {
        add_case(un[u], a, 1e-7, 1, S(a, 31, 4, 3, 1));
        add_case(un[u], a, 1e-7, 1, PAD(S(a, 16, 5, 1, 1)));
        add_case(un[u], a, 1e-7, 1, P(S(a, 16, 5, 2, 1), 2, 0, 1, 3));
        add_case(un[u], a, 1e-7, 1, S(a, 0, 4, 1, 1));
        add_case(un[u], a, 1e-7, 1, S(a, 1001, 1, 1, 1)); /* one row: the threads share its values */
    }
    const op_t glu[] = {TSR_OP_SWIGLU, TSR_OP_GEGLU};
    for (int u = 0; u < 2; u++) {
        add_case(glu[u], a, 1e-7, 2, S(a, 29, 4, 3, 1), S(a, 29, 4, 3, 1));
        add_case(glu[u], a, 1e-7, 2, P(S(a, 8, 6, 1, 1), 1, 0, 2, 3), S(a, 8, 6, 1, 1));
        add_case(glu[u], a, 1e-7, 2, S(a, 1001, 1, 1, 1), S(a, 1001, 1, 1, 1));
    }
}

static void cases_mul_mat(void) {
    for (size_t t = 0; t < N_OF(mm_types); t++) {
        const tsr_type w = mm_types[t];
        const int64_t bs = tsr_type_block_size(w), k = bs == 256 ? 256 : 64, k2 = bs == 256 ? 512 : 96;
        add_case(TSR_OP_MUL_MAT, w, 5e-4, 2, S(w, k, 16, 1, 1), S(TSR_TYPE_F32, k, 1, 1, 1));
        add_case(TSR_OP_MUL_MAT, w, 5e-4, 2, S(w, k2, 33, 1, 1), S(TSR_TYPE_F32, k2, 7, 1, 1));
        add_case(TSR_OP_MUL_MAT, w, 5e-4, 2, S(w, k, 19, 2, 1), S(TSR_TYPE_F32, k, 5, 6, 1)); /* broadcast dim 2 */
        add_case(TSR_OP_MUL_MAT, w, 5e-4, 2, S(w, k, 4, 1, 2), S(TSR_TYPE_F32, k, 3, 2, 4));  /* broadcast dim 3 */
        add_case(TSR_OP_MUL_MAT, w, 5e-4, 2, S(w, k, 9, 1, 1), P(S(TSR_TYPE_F32, k, 5, 1, 1), 1, 0, 2, 3));
        add_case(TSR_OP_MUL_MAT, w, 5e-4, 2, PAD(S(w, k, 10, 2, 1)), PAD(S(TSR_TYPE_F32, k, 3, 2, 1)));
        add_case(TSR_OP_MUL_MAT, w, 5e-4, 2, S(w, k, 0, 1, 1), S(TSR_TYPE_F32, k, 3, 1, 1));
        add_case(TSR_OP_MUL_MAT, w, 5e-4, 2, S(w, k, 5, 1, 1), S(TSR_TYPE_F32, k, 0, 1, 1));
        add_case(TSR_OP_MUL_MAT, w, 5e-4, 2, S(w, k, 70, 1, 1), S(TSR_TYPE_F32, k, 40, 1, 1)); /* several tiles */
        /* the batched kernels' register tiles: rows and columns not multiples of them, 1 and 33 columns */
        add_case(TSR_OP_MUL_MAT, w, 5e-4, 2, S(w, k2, 37, 1, 1), S(TSR_TYPE_F32, k2, 33, 1, 1));
        add_case(TSR_OP_MUL_MAT, w, 5e-4, 2, S(w, k2, 37, 1, 1), S(TSR_TYPE_F32, k2, 1, 1, 1));
        add_case(TSR_OP_MUL_MAT, w, 5e-4, 2, S(w, k, 21, 1, 1), S(TSR_TYPE_F32, k, 26, 2, 1)); /* across matrices */
        if (bs == 1) /* k not a multiple of the vector width */
            add_case(TSR_OP_MUL_MAT, w, 5e-4, 2, S(w, 100, 13, 1, 1), S(TSR_TYPE_F32, 100, 33, 1, 1));
    }
    /* one column over many rows: the matrix-vector products' row claims, more
     * than a claim word counts (4095) on one thread, so claims grow */
    add_case(TSR_OP_MUL_MAT, TSR_TYPE_Q4_0, 5e-4, 2, S(TSR_TYPE_Q4_0, 32, 270001, 1, 1), S(TSR_TYPE_F32, 32, 1, 1, 1));
    /* k = 0 and permuted activations (attention's K*Q on views) */
    add_case(TSR_OP_MUL_MAT, TSR_TYPE_F32, 5e-4, 2, S(TSR_TYPE_F32, 0, 4, 1, 1), S(TSR_TYPE_F32, 0, 3, 1, 1));
    add_case(TSR_OP_MUL_MAT, TSR_TYPE_F16, 5e-4, 2, P(S(TSR_TYPE_F16, 32, 5, 2, 1), 0, 2, 1, 3),
             P(S(TSR_TYPE_F32, 32, 4, 6, 1), 0, 2, 1, 3));
    add_case(TSR_OP_MUL_MAT, TSR_TYPE_F32, 5e-4, 2, S(TSR_TYPE_F32, 31, 5, 1, 1), S(TSR_TYPE_F32, 31, 3, 1, 1));
    /* no matrices (ne[2] or ne[3] 0): nothing to do, on the GEMM and the
     * matrix-vector paths (a device's host code must not divide by them) */
    add_case(TSR_OP_MUL_MAT, TSR_TYPE_F32, 5e-4, 2, S(TSR_TYPE_F32, 32, 5, 0, 1), S(TSR_TYPE_F32, 32, 12, 0, 1));
    add_case(TSR_OP_MUL_MAT, TSR_TYPE_F16, 5e-4, 2, S(TSR_TYPE_F16, 32, 5, 1, 0), S(TSR_TYPE_F32, 32, 12, 1, 0));
    add_case(TSR_OP_MUL_MAT, TSR_TYPE_Q8_0, 5e-4, 2, S(TSR_TYPE_Q8_0, 32, 5, 0, 1), S(TSR_TYPE_F32, 32, 12, 0, 1));
    add_case(TSR_OP_MUL_MAT, TSR_TYPE_F32, 5e-4, 2, S(TSR_TYPE_F32, 32, 5, 0, 1), S(TSR_TYPE_F32, 32, 3, 0, 1));
}

static void cases_rows(void) {
    const tsr_type gr[] = {TSR_TYPE_F32, TSR_TYPE_F16, TSR_TYPE_BF16, TSR_TYPE_Q8_0, TSR_TYPE_Q4_0, TSR_TYPE_Q4_1,
                           TSR_TYPE_Q5_0, TSR_TYPE_Q5_1, TSR_TYPE_Q4_K, TSR_TYPE_Q5_K, TSR_TYPE_Q6_K, TSR_TYPE_I32};
    for (size_t t = 0; t < N_OF(gr); t++) {
        const tsr_type w = gr[t];
        const int64_t k = tsr_type_block_size(w) == 256 ? 256 : 64;
        add_case(TSR_OP_GET_ROWS, w, 1e-7, 2, S(w, k, 10, 1, 1), KIND(S(TSR_TYPE_I32, 6, 1, 1, 1), K_INDEX, 10));
        add_case(TSR_OP_GET_ROWS, w, 1e-7, 2, S(w, k, 5, 3, 2), KIND(S(TSR_TYPE_I32, 4, 3, 2, 1), K_INDEX, 5));
        add_case(TSR_OP_GET_ROWS, w, 1e-7, 2, S(w, k, 5, 1, 1), KIND(S(TSR_TYPE_I32, 0, 1, 1, 1), K_INDEX, 5));
    }
    for (size_t t = 0; t < N_OF(setrows_types); t++) {
        const tsr_type w = setrows_types[t];
        add_case(TSR_OP_SET_ROWS, w, 1e-6, 3, S(w, 64, 12, 1, 1), S(TSR_TYPE_F32, 64, 3, 1, 1),
                 KIND(S(TSR_TYPE_I64, 3, 1, 1, 1), K_INDEX, 12));
        add_case(TSR_OP_SET_ROWS, w, 1e-6, 3, S(w, 32, 6, 2, 3), S(TSR_TYPE_F32, 32, 2, 2, 3),
                 KIND(S(TSR_TYPE_I32, 2, 1, 3, 1), K_INDEX, 6)); /* idx broadcast over dim 2 */
        add_case(TSR_OP_SET_ROWS, w, 1e-6, 3, S(w, 32, 4, 1, 1), PAD(S(TSR_TYPE_F32, 32, 2, 1, 1)),
                 KIND(S(TSR_TYPE_I32, 2, 1, 1, 1), K_INDEX, 4));
        /* repeated indices: the last source row wins, as in a sequential loop */
        add_case(TSR_OP_SET_ROWS, w, 1e-6, 3, S(w, 32, 3, 1, 1), S(TSR_TYPE_F32, 32, 9, 1, 1),
                 KIND(S(TSR_TYPE_I32, 9, 1, 1, 1), K_INDEX, 3));
    }
}

static void cases_norm_rope_softmax(void) {
    const op_t norms[] = {TSR_OP_RMS_NORM, TSR_OP_NORM};
    for (int o = 0; o < 2; o++) {
        add_case(norms[o], TSR_TYPE_F32, 1e-7, 1, S(TSR_TYPE_F32, 64, 5, 3, 1))->f[0] = 1e-6f;
        add_case(norms[o], TSR_TYPE_F32, 1e-7, 1, S(TSR_TYPE_F32, 1, 3, 1, 1))->f[0] = 1e-5f;
        add_case(norms[o], TSR_TYPE_F32, 1e-7, 1, PAD(S(TSR_TYPE_F32, 33, 4, 2, 1)))->f[0] = 1e-5f;
        add_case(norms[o], TSR_TYPE_F32, 1e-7, 1, S(TSR_TYPE_F32, 576, 7, 1, 1))->f[0] = 1e-5f;
    }
    for (int mode = 0; mode <= 2; mode += 2) {
        for (int v = 0; v < 4; v++) {
            const int64_t hd = v == 3 ? 96 : 64, nh = 3, nt = 5;
            const int n_dims = v == 1 ? 32 : (int)hd;
            src_spec a = S(TSR_TYPE_F32, hd, nh, nt, 1);
            if (v == 2) a = P(S(TSR_TYPE_F32, hd, nh, nt, 1), 0, 2, 1, 3);
            test_case *c = v == 3 ? add_case(TSR_OP_ROPE, TSR_TYPE_F32, 1e-7, 3, a, KIND(S(TSR_TYPE_I32, nt, 1, 1, 1), K_POS, 0),
                                             KIND(S(TSR_TYPE_F32, n_dims / 2, 1, 1, 1), K_POSITIVE, 0))
                                  : add_case(TSR_OP_ROPE, TSR_TYPE_F32, 1e-7, 2, a, KIND(S(TSR_TYPE_I32, nt, 1, 1, 1), K_POS, 0));
            c->i[0] = n_dims, c->i[1] = mode, c->i[2] = 4096;
            c->f[0] = 10000.0f, c->f[1] = v == 3 ? 0.25f : 1.0f, c->f[2] = v == 3 ? 1.0f : 0.0f;
            c->f[3] = 1.0f, c->f[4] = 32.0f, c->f[5] = 1.0f;
        }
    }
    for (int m = 0; m < 3; m++) {
        const tsr_type mt = m == 2 ? TSR_TYPE_F16 : TSR_TYPE_F32;
        test_case *c = m == 0 ? add_case(TSR_OP_SOFTMAX, TSR_TYPE_F32, 1e-6, 1, S(TSR_TYPE_F32, 37, 5, 3, 1))
                              : add_case(TSR_OP_SOFTMAX, TSR_TYPE_F32, 1e-6, 2, S(TSR_TYPE_F32, 37, 5, 4, 1),
                                         KIND(S(mt, 37, 8, 2, 1), K_MASK, 0));
        c->f[0] = m == 0 ? 1.0f : 0.125f;
    }
    add_case(TSR_OP_SOFTMAX, TSR_TYPE_F32, 1e-6, 1, S(TSR_TYPE_F32, 1, 4, 1, 1))->f[0] = 1.0f;
    add_case(TSR_OP_SOFTMAX, TSR_TYPE_F32, 1e-6, 1, S(TSR_TYPE_F32, 4096, 2, 1, 1))->f[0] = 1.0f;
}

static void cases_copy(void) {
    const tsr_type ct[] = {TSR_TYPE_F32, TSR_TYPE_F16, TSR_TYPE_BF16, TSR_TYPE_I32};
    for (size_t t = 0; t < N_OF(ct); t++)
        for (int dim = 0; dim < 4; dim++) {
            src_spec a = S(ct[t], 6, 5, 4, 3), b = a;
            b.ne[dim] = 2;
            add_case(TSR_OP_CONCAT, ct[t], 1e-7, 2, a, b)->i[0] = dim;
            add_case(TSR_OP_CONCAT, ct[t], 1e-7, 2, P(S(ct[t], 6, 5, 4, 3), 1, 0, 2, 3), b)->i[0] = dim;
        }
    add_case(TSR_OP_ARGMAX, TSR_TYPE_F32, 0, 1, S(TSR_TYPE_F32, 100, 7, 1, 1));
    add_case(TSR_OP_ARGMAX, TSR_TYPE_F32, 0, 1, S(TSR_TYPE_F32, 1, 3, 2, 1));
    const tsr_type from[] = {TSR_TYPE_F32, TSR_TYPE_F16, TSR_TYPE_BF16, TSR_TYPE_Q8_0};
    const tsr_type to[] = {TSR_TYPE_F32, TSR_TYPE_F16, TSR_TYPE_BF16, TSR_TYPE_Q8_0, TSR_TYPE_Q4_0,
                           TSR_TYPE_Q4_1, TSR_TYPE_Q5_0, TSR_TYPE_Q5_1};
    for (size_t i = 0; i < N_OF(from); i++)
        for (size_t j = 0; j < N_OF(to); j++) {
            const tsr_type a = from[i], b = to[j];
            if (tsr_type_is_quantized(a) && tsr_type_is_quantized(b) && a != b) continue;
            add_case(TSR_OP_CPY, b, 1e-6, 2, S(a, 64, 3, 2, 1), S(b, 64, 3, 2, 1));
            if (!tsr_type_is_quantized(a)) {
                add_case(TSR_OP_CPY, b, 1e-6, 2, P(S(a, 3, 64, 2, 1), 1, 0, 2, 3), S(b, 64, 3, 2, 1));
                add_case(TSR_OP_CPY, b, 1e-6, 2, PAD(S(a, 64, 3, 1, 1)), S(b, 64, 3, 1, 1));
            }
            if (!tsr_type_is_quantized(b)) add_case(TSR_OP_CPY, b, 1e-6, 2, S(a, 32, 6, 1, 1), S(b, 16, 4, 3, 1));
            if (!tsr_type_is_quantized(a)) add_case(TSR_OP_CONT, b, 1e-6, 1, P(S(a, 64, 4, 3, 1), 1, 0, 2, 3))->i[0] = b;
        }
    add_case(TSR_OP_CONT, TSR_TYPE_I32, 0, 1, P(S(TSR_TYPE_I32, 5, 7, 2, 1), 2, 0, 1, 3))->i[0] = TSR_TYPE_I32;
    add_case(TSR_OP_CPY, TSR_TYPE_F32, 0, 2, S(TSR_TYPE_F32, 0, 3, 1, 1), S(TSR_TYPE_F32, 0, 3, 1, 1));
}

static void cases_flash_attn(void) {
    const tsr_type kv[] = {TSR_TYPE_F32, TSR_TYPE_F16, TSR_TYPE_Q8_0};
    for (size_t t = 0; t < N_OF(kv); t++) {
        const tsr_type w = kv[t];
        for (int v = 0; v < 4; v++) {
            const int64_t dk = 64, nq = v == 1 ? 1 : 7, nh = 4, nhk = v == 2 ? 4 : 2, nkv = v == 3 ? 1 : 33;
            src_spec q = v == 2 ? P(S(TSR_TYPE_F32, dk, nq, nh, 1), 0, 2, 1, 3) : S(TSR_TYPE_F32, dk, nq, nh, 1);
            test_case *c = v == 0 ? add_case(TSR_OP_FLASH_ATTN, w, 5e-4, 3, q, S(w, dk, nkv, nhk, 1), S(w, dk, nkv, nhk, 1))
                                  : add_case(TSR_OP_FLASH_ATTN, w, 5e-4, 4, q, S(w, dk, nkv, nhk, 1), S(w, dk, nkv, nhk, 1),
                                             KIND(S(TSR_TYPE_F16, nkv, nq, 1, 1), K_MASK, 0));
            c->f[0] = 0.125f;
        }
    }
    /* zero-sized: an empty cache (no keys), no queries, K and Q heads of no
     * elements (scores all 0: the mean of V's rows), no V elements */
    const int64_t zero[5][4] = {{64, 5, 0, 64}, {64, 0, 9, 64}, {0, 3, 6, 8}, {0, 3, 6, 0}, {32, 3, 6, 0}};
    for (size_t t = 0; t < 2; t++)
        for (int z = 0; z < 5; z++) {
            const tsr_type w = kv[t];
            const int64_t dk = zero[z][0], nq = zero[z][1], nkv = zero[z][2], dv = zero[z][3];
            for (int masked = 0; masked < 2; masked++) {
                test_case *c =
                    masked ? add_case(TSR_OP_FLASH_ATTN, w, 5e-4, 4, S(TSR_TYPE_F32, dk, nq, 4, 1), S(w, dk, nkv, 2, 1),
                                      S(w, dv, nkv, 2, 1), KIND(S(TSR_TYPE_F16, nkv, nq, 1, 1), K_MASK, 0))
                           : add_case(TSR_OP_FLASH_ATTN, w, 5e-4, 3, S(TSR_TYPE_F32, dk, nq, 4, 1), S(w, dk, nkv, 2, 1),
                                      S(w, dv, nkv, 2, 1));
                c->f[0] = 0.125f;
            }
        }
}

/* Plans at their limits: decode over a cache whose unused cells (masked in
 * every row) cut the key splits (fewer keys may give more splits than the
 * work buffer's plan for all of them: Llama-3.2-1B-like 32 / 8 heads, 768
 * cells, 512 or 400 in use); a prompt whose heads per KV head (3) do not
 * divide the rows per task (256); decode over cache-laid-out K/V. */
static void cases_flash_attn_plans(void) {
    static const int64_t live[] = {512, 400};
    for (size_t i = 0; i < N_OF(live); i++)
        add_case(TSR_OP_FLASH_ATTN, TSR_TYPE_F16, 5e-4, 4, S(TSR_TYPE_F32, 64, 1, 32, 1),
                 S(TSR_TYPE_F16, 64, 768, 8, 1), S(TSR_TYPE_F16, 64, 768, 8, 1),
                 KIND(S(TSR_TYPE_F16, 768, 1, 1, 1), K_MASK_LIVE, live[i]))
            ->f[0] = 0.125f;
    add_case(TSR_OP_FLASH_ATTN, TSR_TYPE_F16, 5e-4, 4, S(TSR_TYPE_F32, 16, 1024, 9, 1),
             S(TSR_TYPE_F16, 16, 1024, 3, 1), S(TSR_TYPE_F16, 16, 1024, 3, 1),
             KIND(S(TSR_TYPE_F16, 1024, 1024, 1, 1), K_MASK, 0))
        ->f[0] = 0.25f;
    /* decode over K/V laid out as the cache lays them out (the KV heads of
     * a cell side by side in its row): the tasks of a key range go to one
     * thread in groups, the first head's task fetching every head's rows
     * (SmolLM2-like 9 / 3 heads; F16 and Q8_0 cells) */
    static const tsr_type cell[] = {TSR_TYPE_F16, TSR_TYPE_Q8_0};
    for (size_t i = 0; i < N_OF(cell); i++)
        add_case(TSR_OP_FLASH_ATTN, cell[i], 5e-4, 4, S(TSR_TYPE_F32, 64, 1, 9, 1),
                 P(S(cell[i], 64, 1000, 3, 1), 0, 2, 1, 3), P(S(cell[i], 64, 1000, 3, 1), 0, 2, 1, 3),
                 KIND(S(TSR_TYPE_F16, 1000, 1, 1, 1), K_MASK, 0))
            ->f[0] = 0.125f;
    add_case(TSR_OP_FLASH_ATTN, TSR_TYPE_F16, 5e-4, 4, S(TSR_TYPE_F32, 64, 1, 9, 2), /* two sequences */
             P(S(TSR_TYPE_F16, 64, 1000, 3, 2), 0, 2, 1, 3), P(S(TSR_TYPE_F16, 64, 1000, 3, 2), 0, 2, 1, 3),
             KIND(S(TSR_TYPE_F16, 1000, 1, 1, 1), K_MASK, 0))
        ->f[0] = 0.125f;
}

/* Head dimensions of the models (16 to 256), F16 K/V: decode and a prompt. */
static void cases_flash_attn_dims(void) {
    static const int64_t dims[] = {16, 40, 64, 80, 96, 112, 128, 192, 256};
    for (size_t d = 0; d < N_OF(dims); d++)
        for (int64_t nq = 1; nq <= 5; nq += 4) {
            const int64_t dk = dims[d], nkv = 67;
            test_case *c = add_case(TSR_OP_FLASH_ATTN, TSR_TYPE_F16, 5e-4, 4, S(TSR_TYPE_F32, dk, nq, 4, 1),
                                    S(TSR_TYPE_F16, dk, nkv, 2, 1), S(TSR_TYPE_F16, dk, nkv, 2, 1),
                                    KIND(S(TSR_TYPE_F16, nkv, nq, 1, 1), K_MASK, 0));
            c->f[0] = 1.0f / sqrtf((float)dk);
        }
}

/* -L (or TSR_TEST_LARGE=1): the sizes past the grid limits and 32-bit byte
 * offsets, for a GPU (tests/gpu/check.sh): mat-vec and GEMM over more than
 * 65,535 weight rows, get_rows of more than 65,535 indices, a copy of more
 * than 2^31 bytes. Minutes on a CPU and gigabytes of host memory. */
static int large;
static void cases_large(void) {
    const tsr_type mv[] = {TSR_TYPE_F16, TSR_TYPE_Q4_0, TSR_TYPE_Q8_0, TSR_TYPE_Q4_K, TSR_TYPE_Q6_K};
    for (size_t t = 0; t < N_OF(mv); t++) {
        const int64_t k = tsr_type_block_size(mv[t]) == 256 ? 256 : 64;
        add_case(TSR_OP_MUL_MAT, mv[t], 5e-4, 2, S(mv[t], k, 70001, 1, 1), S(TSR_TYPE_F32, k, 1, 1, 1));
        add_case(TSR_OP_MUL_MAT, mv[t], 5e-4, 2, S(mv[t], k, 66000, 1, 1), S(TSR_TYPE_F32, k, 20, 1, 1));
    }
    add_case(TSR_OP_GET_ROWS, TSR_TYPE_F16, 1e-7, 2, S(TSR_TYPE_F16, 64, 1000, 1, 1),
             KIND(S(TSR_TYPE_I32, 70000, 1, 1, 1), K_INDEX, 1000));
    add_case(TSR_OP_GET_ROWS, TSR_TYPE_Q4_K, 1e-7, 2, S(TSR_TYPE_Q4_K, 256, 100, 1, 1),
             KIND(S(TSR_TYPE_I32, 66000, 1, 1, 1), K_INDEX, 100));
    add_case(TSR_OP_CPY, TSR_TYPE_F16, 1e-6, 2, S(TSR_TYPE_F32, 32768, 16400, 1, 1),
             S(TSR_TYPE_F16, 32768, 16400, 1, 1)); /* 2.15e9 bytes read */
    add_case(TSR_OP_RMS_NORM, TSR_TYPE_F32, 1e-6, 1, S(TSR_TYPE_F32, 64, 70000, 1, 1))->f[0] = 1e-5f;
    add_case(TSR_OP_SOFTMAX, TSR_TYPE_F32, 1e-6, 1, S(TSR_TYPE_F32, 64, 70000, 1, 1))->f[0] = 1.0f;
}

/* The experts' matmul: as [k, m, n_expert], b [k, n_b, n_tokens], ids [n_used, n_tokens]. */
static src_spec IDS(int64_t n_used, int64_t n_tokens, enum kind kind, int64_t range) {
    return KIND(S(TSR_TYPE_I32, n_used, n_tokens, 1, 1), kind, range);
}

/* ids K_INDEX: experts in [0, range); K_CONST: all expert `range`. */
static void add_mmid(tsr_type w, int64_t k, int64_t m, int64_t n_expert, int64_t n_used, int64_t n_b, int64_t n_tokens,
                     enum kind kind, int64_t range) {
    add_case(TSR_OP_MUL_MAT_ID, w, 5e-4, 3, S(w, k, m, n_expert, 1), S(TSR_TYPE_F32, k, n_b, n_tokens, 1),
             IDS(n_used, n_tokens, kind, range));
}

static void cases_moe(void) {
    for (size_t t = 0; t < N_OF(mm_types); t++) {
        const tsr_type w = mm_types[t];
        const int64_t bs = tsr_type_block_size(w);
        const int64_t ks_f[] = {1, 31, 32, 33, 300}, ks_q[] = {32, 64, 320}, ks_k[] = {256, 512};
        const int64_t *ks = bs == 1 ? ks_f : bs == 32 ? ks_q : ks_k;
        const size_t nk = bs == 1 ? N_OF(ks_f) : bs == 32 ? N_OF(ks_q) : N_OF(ks_k);
        for (size_t i = 0; i < nk; i++) { /* every k: 3 experts, n_b = n_used, and 8 experts, one b row per token */
            add_mmid(w, ks[i], 19, 3, 2, 2, 7, K_INDEX, 3);
            add_mmid(w, ks[i], 33, 8, 4, 1, 33, K_INDEX, 8);
        }
        const int64_t k = ks[nk - 1];
        add_mmid(w, k, 16, 1, 1, 1, 1, K_INDEX, 1);         /* one expert, one token */
        add_mmid(w, k, 5, 60, 4, 4, 130, K_INDEX, 60);    /* many experts, many tokens */
        add_mmid(w, k, 70, 8, 2, 1, 130, K_CONST, 5);     /* every token on expert 5: 260 columns */
        add_mmid(w, k, 9, 60, 1, 1, 7, K_INDEX, 3);         /* experts 3..59 unused */
        add_mmid(w, k, 40, 3, 4, 4, 1, K_INDEX, 3);         /* decode, repeated experts in a row */
    }
    const tsr_type f = TSR_TYPE_F32;
    add_mmid(f, 32, 17, 3, 2, 2, 0, K_INDEX, 3); /* no tokens */
    add_mmid(f, 0, 17, 3, 2, 2, 5, K_INDEX, 3);  /* k = 0: empty sums */
    add_case(TSR_OP_MUL_MAT_ID, f, 5e-4, 3, S(f, 33, 12, 4, 1), P(S(f, 33, 2, 7, 1), 1, 0, 2, 3), /* strided b */
             P(IDS(2, 7, K_INDEX, 4), 1, 0, 2, 3));                                                 /* strided ids */
    add_case(TSR_OP_MUL_MAT_ID, TSR_TYPE_Q8_0, 5e-4, 3, S(TSR_TYPE_Q8_0, 64, 12, 4, 1), PAD(S(f, 64, 1, 9, 1)),
             IDS(3, 9, K_INDEX, 4));

    /* router ops */
    add_case(TSR_OP_SIGMOID, f, 1e-7, 1, S(f, 31, 4, 3, 1));
    add_case(TSR_OP_SIGMOID, f, 1e-7, 1, P(S(f, 16, 5, 2, 1), 2, 0, 1, 3));
    add_case(TSR_OP_SIGMOID, f, 1e-7, 1, S(f, 0, 4, 1, 1));
    add_case(TSR_OP_SUM_ROWS, f, 1e-10, 1, S(f, 60, 7, 3, 1));
    add_case(TSR_OP_SUM_ROWS, f, 1e-10, 1, S(f, 1, 5, 1, 1));
    add_case(TSR_OP_SUM_ROWS, f, 1e-10, 1, PAD(S(f, 33, 4, 2, 1)));
    add_case(TSR_OP_SUM_ROWS, f, 1e-10, 1, P(S(f, 4, 9, 2, 1), 1, 0, 2, 3));
    add_case(TSR_OP_SUM_ROWS, f, 1e-10, 1, S(f, 0, 3, 1, 1));
    for (int o = 0; o < 2; o++) {
        add_case(TSR_OP_ARGSORT, f, 0, 1, S(f, 37, 5, 3, 1))->i[0] = o;
        add_case(TSR_OP_ARGSORT, f, 0, 1, S(f, 1, 3, 1, 1))->i[0] = o;
        add_case(TSR_OP_ARGSORT, f, 0, 1, KIND(S(f, 300, 4, 1, 1), K_TIES, 4))->i[0] = o; /* stability */
        add_case(TSR_OP_ARGSORT, f, 0, 1, P(S(f, 6, 60, 1, 1), 1, 0, 2, 3))->i[0] = o;
        add_case(TSR_OP_ARGSORT, f, 0, 1, PAD(S(f, 33, 3, 2, 1)))->i[0] = o;
    }
    const struct { int64_t n, rows; int k; enum kind kind; } tk[] = {
        {60, 7, 1, K_NORMAL},  {60, 7, 4, K_NORMAL}, {8, 33, 2, K_NORMAL}, {8, 5, 8, K_NORMAL}, {1, 3, 1, K_NORMAL},
        {100, 3, 32, K_NORMAL}, {100, 3, 33, K_NORMAL}, {300, 2, 300, K_NORMAL}, {64, 9, 6, K_TIES},
        {128, 3, 64, K_TIES}};
    for (size_t i = 0; i < N_OF(tk); i++)
        add_case(TSR_OP_TOP_K, f, 0, 1, KIND(S(f, tk[i].n, tk[i].rows, 1, 1), tk[i].kind, 5))->i[0] = tk[i].k;
    add_case(TSR_OP_TOP_K, f, 0, 1, P(S(f, 3, 40, 2, 1), 1, 0, 2, 3))->i[0] = 2;
}

static void make_cases(void) {
    n_cases = 0;
    cases_flash_attn_dims();
    cases_flash_attn_plans();
    if (large) {
        cases_large();
        for (int i = 0; i < n_cases; i++) cases[i].max_nmse = tol_for(cases[i].src[0].type, cases[i].max_nmse);
        return;
    }
    cases_elementwise();
    cases_mul_mat();
    cases_rows();
    cases_norm_rope_softmax();
    cases_copy();
    cases_flash_attn();
    cases_moe();
    for (int i = 0; i < n_cases; i++) cases[i].max_nmse = tol_for(cases[i].src[0].type, cases[i].max_nmse);
}

/* ---- modes ------------------------------------------------------------------------------ */

/* Every op of the table has cases here and a complete CPU entry. */
static void check_coverage(void) {
    for (int o = 0; o < TSR_OP_COUNT; o++) {
        int n = 0;
        for (int i = 0; i < n_cases; i++) n += cases[i].op == (tsr_op)o;
        CHECK(n > 0 || o == TSR_OP_NONE || o == TSR_OP_VIEW, "op %s has no case in the op harness", tsr__op_name(o));
    }
    tsr_op no_cpu[TSR_OP_COUNT];
    size_t n_no_cpu = tsr__cpu_ops_missing(no_cpu, TSR_OP_COUNT);
    CHECK(n_no_cpu == 0, "%zu ops have no complete CPU entry, the first %s", n_no_cpu,
          n_no_cpu ? tsr__op_name(no_cpu[0]) : "");
}

/* mul_mat_id with ids out of range: the build succeeds (the values are not
 * known then, in general), tsr_compute returns TSR_E_RANGE naming the node,
 * the id and n_expert, and the backend computes the next graph normally. */
static void check_moe_range(tsr_backend *b) {
    enum { K = 32, M = 8, NE = 3, NU = 2, NT = 4 };
    static float w[K * M * NE], x[K * NT], probs[(NE + 2) * NT];
    for (int i = 0; i < K * M * NE; i++) w[i] = (float)nrand();
    for (int i = 0; i < K * NT; i++) x[i] = (float)nrand();
    for (int i = 0; i < (NE + 2) * NT; i++) probs[i] = (float)(i % (NE + 2)); /* the best is always NE + 1 */
    const int64_t ne_as[3] = {K, M, NE}, ne_b[3] = {K, 1, NT}, ne_ids[2] = {NU, NT}, ne_p[2] = {NE + 2, NT};
    const int32_t ids[3][NU * NT] = {{0, 1, 2, 0, 1, -1, 2, 2}, {0, 1, 2, 3, 1, 1, 2, 2}, {2, 2, 2, 2, 0, 1, 0, 1}};
    const char *want[3] = {"id -1 ", "id 3 ", "id 4 "};
    for (int i = 0; i < 4; i++) {
        tsr_context *ctx = tsr_context_new(b);
        tsr_tensor *as = tsr_input(ctx, TSR_TYPE_F32, 3, ne_as, w), *bx = tsr_input(ctx, TSR_TYPE_F32, 3, ne_b, x);
        tsr_tensor *sel = i < 2 || i == 3 ? tsr_input(ctx, TSR_TYPE_I32, 2, ne_ids, ids[i < 2 ? i : 2])
                                          : tsr_top_k(ctx, tsr_input(ctx, TSR_TYPE_F32, 2, ne_p, probs), NU);
        tsr_tensor *y = tsr_set_name(tsr_mul_mat_id(ctx, as, bx, sel), "moe_up");
        CHECK(y != NULL, "mul_mat_id build: %s", tsr_context_error(ctx) ? tsr_context_error(ctx) : "");
        const tsr_status st = y ? tsr_compute(ctx, &y, 1) : TSR_E_INVALID;
        if (i < 3) {
            CHECK(st == TSR_E_RANGE, "ids case %d: status %d (%s)", i, (int)st, tsr_last_error());
            CHECK(strstr(tsr_last_error(), "moe_up") && strstr(tsr_last_error(), want[i]) &&
                      strstr(tsr_last_error(), "n_expert 3"),
                  "the detail names the node, the id and n_expert: %s", tsr_last_error());
        } else { /* after the failures the same backend computes a good graph */
            CHECK(st == TSR_OK, "compute after range errors: %s", tsr_last_error());
            float got[M * NU * NT];
            CHECK_OK(tsr_tensor_read(y, got, 0, sizeof got));
            double err = 0, mag = 0;
            for (int t = 0; t < NT; t++)
                for (int e = 0; e < NU; e++)
                    for (int r = 0; r < M; r++) {
                        double sum = 0;
                        for (int k = 0; k < K; k++)
                            sum += (double)w[(ids[2][t * NU + e] * M + r) * K + k] * x[t * K + k];
                        err += (got[(t * NU + e) * M + r] - sum) * (got[(t * NU + e) * M + r] - sum);
                        mag += sum * sum;
                    }
            CHECK(err / mag < 1e-10, "mul_mat_id after the errors: NMSE %g", err / mag);
        }
        tsr_context_close(ctx);
    }
}

/* Bad shapes and types are refused when the op is built: NULL and the context's error. */
static void check_moe_build_errors(tsr_backend *b) {
    static const struct {
        int op; /* 0 mul_mat_id, 1 top_k, 2 argsort, 3 sum_rows, 4 sigmoid */
        tsr_type ta, tb, ti;
        int64_t as[4], bx[4], ids[4];
        int k;
    } bad[] = {
        {0, TSR_TYPE_F32, TSR_TYPE_F32, TSR_TYPE_I32, {32, 8, 3, 1}, {33, 1, 4, 1}, {2, 4, 1, 1}, 0}, /* k differs */
        {0, TSR_TYPE_F32, TSR_TYPE_F32, TSR_TYPE_I32, {32, 8, 3, 1}, {32, 3, 4, 1}, {2, 4, 1, 1}, 0}, /* n_b 3 */
        {0, TSR_TYPE_F32, TSR_TYPE_F32, TSR_TYPE_I32, {32, 8, 3, 1}, {32, 1, 4, 1}, {2, 5, 1, 1}, 0}, /* n_tokens */
        {0, TSR_TYPE_F32, TSR_TYPE_F32, TSR_TYPE_I32, {32, 8, 3, 2}, {32, 1, 4, 1}, {2, 4, 1, 1}, 0}, /* 4-D as */
        {0, TSR_TYPE_F32, TSR_TYPE_F32, TSR_TYPE_I32, {32, 8, 3, 1}, {32, 1, 4, 1}, {2, 4, 2, 1}, 0}, /* 3-D ids */
        {0, TSR_TYPE_F32, TSR_TYPE_F16, TSR_TYPE_I32, {32, 8, 3, 1}, {32, 1, 4, 1}, {2, 4, 1, 1}, 0}, /* b f16 */
        {0, TSR_TYPE_F32, TSR_TYPE_F32, TSR_TYPE_F32, {32, 8, 3, 1}, {32, 1, 4, 1}, {2, 4, 1, 1}, 0}, /* ids f32 */
        {0, TSR_TYPE_I32, TSR_TYPE_F32, TSR_TYPE_I32, {32, 8, 3, 1}, {32, 1, 4, 1}, {2, 4, 1, 1}, 0}, /* as i32 */
        {1, TSR_TYPE_F32, 0, 0, {8, 4, 1, 1}, {0}, {0}, 0},
        {1, TSR_TYPE_F32, 0, 0, {8, 4, 1, 1}, {0}, {0}, 9},
        {1, TSR_TYPE_F16, 0, 0, {8, 4, 1, 1}, {0}, {0}, 2},
        {2, TSR_TYPE_F32, 0, 0, {8, 4, 1, 1}, {0}, {0}, 2}, /* order 2 */
        {2, TSR_TYPE_F16, 0, 0, {8, 4, 1, 1}, {0}, {0}, 0},
        {3, TSR_TYPE_F16, 0, 0, {8, 4, 1, 1}, {0}, {0}, 0},
        {4, TSR_TYPE_F16, 0, 0, {8, 4, 1, 1}, {0}, {0}, 0},
    };
    static const char *names[] = {"tsr_mul_mat_id", "tsr_top_k", "tsr_argsort", "tsr_sum_rows", "tsr_sigmoid"};
    for (size_t i = 0; i < N_OF(bad); i++) {
        tsr_context *ctx = tsr_context_new(b);
        tsr_tensor *a = tsr_input(ctx, bad[i].ta, 4, bad[i].as, NULL), *t = NULL;
        switch (bad[i].op) {
        case 0:
            t = tsr_mul_mat_id(ctx, a, tsr_input(ctx, bad[i].tb, 4, bad[i].bx, NULL),
                               tsr_input(ctx, bad[i].ti, 4, bad[i].ids, NULL));
            break;
        case 1: t = tsr_top_k(ctx, a, bad[i].k); break;
        case 2: t = tsr_argsort(ctx, a, (tsr_sort_order)bad[i].k); break;
        case 3: t = tsr_sum_rows(ctx, a); break;
        default: t = tsr_sigmoid(ctx, a); break;
        }
        const char *err = tsr_context_error(ctx);
        CHECK(t == NULL && err && strstr(err, names[bad[i].op] + 4), "bad build %zu: %s", i, err ? err : "no error");
        tsr_context_close(ctx);
    }
    tsr_context *ctx = tsr_context_new(b); /* a NULL source: NULL, and the error names it */
    CHECK(tsr_mul_mat_id(ctx, NULL, NULL, NULL) == NULL && tsr_context_error(ctx));
    CHECK(tsr_top_k(ctx, NULL, 1) == NULL && tsr_argsort(ctx, NULL, TSR_SORT_ASC) == NULL);
    tsr_context_close(ctx);
}

/* The CPU's results do not depend on the thread count: every mul_mat and
 * flash_attn case (the kernels that hand out tiles dynamically) and the
 * unary and gated ones (a row shared between threads) on 1 thread and on
 * all the cores (2 at least), bit for bit. */
static void check_threads_identical(void) {
    tsr_backend *b1 = make_backend(NULL, 1), *bn = make_backend(NULL, 0);
    CHECK(b1 && bn, "CPU backends for the thread check");
    for (int i = 0; b1 && bn && i < n_cases; i++) {
        const test_case *c = &cases[i];
        if ((c->op != TSR_OP_MUL_MAT && c->op != TSR_OP_FLASH_ATTN && c->op != TSR_OP_SILU && c->op != TSR_OP_GELU &&
             c->op != TSR_OP_SWIGLU && c->op != TSR_OP_GEGLU) ||
            (only_op && strcmp(only_op, tsr__op_name(c->op)) != 0))
            continue;
        tsr_context *ctx = tsr_context_new(b1);
        source s[4] = {{0}};
        int ok = ctx != NULL;
        for (int k = 0; ok && k < c->n_src; k++) ok = make_source(ctx, &c->src[k], &s[k]);
        tsr_tensor *out = ok ? build(ctx, c, s) : NULL;
        const int64_t n =
            out ? tsr_tensor_ne(out, 0) * tsr_tensor_ne(out, 1) * tsr_tensor_ne(out, 2) * tsr_tensor_ne(out, 3) : 0;
        for (int k = 0; k < 4; k++) free(s[k].v);
        tsr_context_close(ctx);
        if (!out)
            continue; /* unsupported: the main loop reports it */
        double *v1 = output_on(b1, c, (uint64_t)i + 1, n), *vn = output_on(bn, c, (uint64_t)i + 1, n);
        char label[512];
        case_label(c, label, sizeof label);
        CHECK(v1 && vn && memcmp(v1, vn, (size_t)n * sizeof *v1) == 0, "%s: 1 thread and %d threads differ", label,
              tsr_backend_n_threads(bn));
        free(v1);
        free(vn);
    }
    tsr_backend_free(b1);
    tsr_backend_free(bn);
}

/* Matmuls of one input share its conversion (the CPU converts the
 * activations once for Q, K and V): A = W1 x X and B = W2 x X must both be
 * right, and C = W1 x X after a copy overwrote X must see the new values,
 * not the conversion of the old ones. */
static void check_shared_activations(tsr_backend *b) {
    enum { K = 64, M = 32, N = 8 };
    static float w[2][M * K], x[N * K], y[N * K];
    static char qw[M * K / 32 * 34]; /* Q8_0: 34 bytes per 32 values */
    rs = 91;
    for (int i = 0; i < M * K; i++) w[0][i] = (float)nrand(), w[1][i] = (float)nrand();
    for (int i = 0; i < N * K; i++) x[i] = (float)nrand(), y[i] = (float)nrand();
    CHECK_OK(tsr_quantize(TSR_TYPE_Q8_0, w[0], qw, M * K));
    const int64_t ne_w[2] = {K, M}, ne_x[2] = {K, N};
    tsr_context *ctx = tsr_context_new(b);
    tsr_tensor *w1 = tsr_input(ctx, TSR_TYPE_Q8_0, 2, ne_w, qw);
    tsr_tensor *xin = tsr_input(ctx, TSR_TYPE_F32, 2, ne_x, NULL);
    tsr_tensor *xt = tsr_scale(ctx, xin, 1.0f);
    tsr_tensor *out[3];
    out[0] = tsr_mul_mat(ctx, w1, xt);
    /* W2 quantized by a copy node between the two matmuls: a node with
     * scratch of its own, which must not reach the shared conversion */
    tsr_tensor *w2q = tsr_new_tensor(ctx, NULL, TSR_TYPE_Q8_0, 2, ne_w);
    tsr_tensor *w2f = tsr_input(ctx, TSR_TYPE_F32, 2, ne_w, w[1]);
    out[1] = w2q && w2f ? tsr_mul_mat(ctx, tsr_cpy(ctx, w2f, w2q), xt) : NULL;
    tsr_tensor *yin = tsr_input(ctx, TSR_TYPE_F32, 2, ne_x, NULL);
    out[2] = tsr_mul_mat(ctx, w1, tsr_cpy(ctx, yin, xt));
    CHECK(out[0] && out[1] && out[2], "shared activations: build: %s",
          tsr_context_error(ctx) ? tsr_context_error(ctx) : "");
    for (int pass = 0; pass < 2 && out[0] && out[1] && out[2]; pass++) { /* the second with new inputs */
        if (pass)
            for (int i = 0; i < N * K; i++) x[i] = (float)nrand(), y[i] = (float)nrand();
        if (tsr_tensor_write(xin, x, 0, sizeof x) != TSR_OK || tsr_tensor_write(yin, y, 0, sizeof y) != TSR_OK ||
            tsr_compute(ctx, out, 3) != TSR_OK) {
            CHECK(0, "shared activations: compute: %s", tsr_last_error());
            break;
        }
        for (int o = 0; o < 3; o++) {
            static float got[N * M];
            CHECK_OK(tsr_tensor_read(out[o], got, 0, sizeof got));
            const float *wm = w[o == 1], *xm = o == 2 ? y : x;
            double err = 0, mag = 0;
            for (int j = 0; j < N; j++)
                for (int i = 0; i < M; i++) {
                    double ref = 0;
                    for (int k = 0; k < K; k++) ref += (double)wm[i * K + k] * xm[j * K + k];
                    err += (got[j * M + i] - ref) * (got[j * M + i] - ref), mag += ref * ref;
                }
            CHECK(err / mag < 1e-3, "shared activations: pass %d, matmul %d: NMSE %g", pass, o, err / mag);
        }
    }
    tsr_context_close(ctx);
}

static int mode_test(tsr_backend *b, int verbose) {
    if (!large) check_coverage();
    if (!large && (!only_op || !strcmp(only_op, "mul_mat_id"))) {
        rs = 77;
        check_moe_range(b);
        check_moe_build_errors(b);
    }
    if (!large && (!only_op || !strcmp(only_op, "mul_mat")))
        check_shared_activations(b);
    if (!device_name)
        check_threads_identical();
    for (int i = 0; i < n_cases; i++) {
        if (only_op && strcmp(only_op, tsr__op_name(cases[i].op)) != 0) continue;
        int supported;
        const int r = run_case(b, &cases[i], (uint64_t)i + 1, verbose, &supported);
        if (!supported) n_skip++;
        else CHECK(!r, "case %d (%s), see above", i, tsr__op_name(cases[i].op));
    }
    printf("\nworst NMSE per op:\n");
    for (int o = 0; o < TSR_OP_COUNT; o++) printf("  %-10s %.3g\n", tsr__op_name(o), worst_nmse[o]);
    printf("%d passed, %d failed, %d unsupported\n", tsrtest_checks - tsrtest_failures, tsrtest_failures, n_skip);
    if (test_device) {
        printf("op nodes run on %s: %d, on the CPU: %d\n", test_device->name, n_on_device, n_on_host);
        CHECK(n_on_device > 0, "no op node ran on %s", test_device->name);
    }
    return tsrtest_done("test-ops");
}

static int mode_list(tsr_backend *b) {
    static const tsr_type cols[] = {TSR_TYPE_F32, TSR_TYPE_F16, TSR_TYPE_BF16, TSR_TYPE_Q8_0, TSR_TYPE_Q4_0,
                                    TSR_TYPE_Q4_1, TSR_TYPE_Q5_0, TSR_TYPE_Q5_1, TSR_TYPE_Q4_K, TSR_TYPE_Q5_K,
                                    TSR_TYPE_Q6_K, TSR_TYPE_I32};
    int status[TSR_OP_COUNT][N_OF(cols)]; /* 0 untested, 1 ok, 2 fail, 3 unsupported */
    memset(status, 0, sizeof status);
    for (int i = 0; i < n_cases; i++) {
        size_t col = 0;
        while (col < N_OF(cols) && cols[col] != cases[i].type) col++;
        if (col == N_OF(cols)) continue;
        int supported;
        const int r = run_case(b, &cases[i], (uint64_t)i + 1, 0, &supported);
        int *st = &status[cases[i].op][col];
        const int v = !supported ? 3 : r ? 2 : 1;
        if (*st == 0 || v == 2) *st = v;
    }
    printf("| op |");
    for (size_t c = 0; c < N_OF(cols); c++) printf(" %s |", tsr_type_name(cols[c]));
    printf("\n|---|");
    for (size_t c = 0; c < N_OF(cols); c++) printf("---|");
    printf("\n");
    for (int o = 0; o < TSR_OP_COUNT; o++) {
        printf("| %s |", tsr__op_name(o));
        for (size_t c = 0; c < N_OF(cols); c++)
            printf(" %s |", (const char *[]){" ", "yes", "FAIL", "no"}[status[o][c]]);
        printf("\n");
    }
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Best wall time of a few computes of out (inputs already in place), and
 * the least process CPU time of a run divided by the thread count: on a
 * machine shared with other work, the wall time mostly measures the
 * neighbours, the CPU time the kernels. */
static double time_compute(tsr_context *ctx, tsr_tensor *out, int n_threads, double *cpu_best) {
    double best = 1e30, total = 0;
    *cpu_best = 1e30;
    for (int rep = 0; rep < 20 && (rep < 3 || total < 1.0); rep++) {
        const double t0 = now_s(), c0 = cpu_s();
        if (tsr_compute(ctx, &out, 1) != TSR_OK) {
            fprintf(stderr, "perf: compute: %s\n", tsr_last_error());
            return -1;
        }
        const double dt = now_s() - t0, dc = (cpu_s() - c0) / n_threads;
        total += dt;
        if (dt < best) best = dt;
        if (dc < *cpu_best) *cpu_best = dc;
    }
    return best;
}

static void perf_mul_mat(tsr_backend *b, tsr_type w, int64_t k, int64_t m, int64_t n, int n_threads) {
    tsr_context *ctx = tsr_context_new(b);
    rs = 42;
    src_spec sw = S(w, k, m, 1, 1), sx = S(TSR_TYPE_F32, k, n, 1, 1);
    source a, x;
    if (!make_source(ctx, &sw, &a) || !make_source(ctx, &sx, &x)) {
        tsr_context_close(ctx);
        return;
    }
    tsr_tensor *out = tsr_mul_mat(ctx, a.t, x.t);
    double tc;
    const double t = out ? time_compute(ctx, out, n_threads, &tc) : -1;
    if (t > 0)
        printf("| mul_mat | %-5s | %d | k=%lld m=%lld n=%lld | %8.2f | %8.2f | %7.2f GB/s | %.3f ms |\n",
               tsr_type_name(w), n_threads, (long long)k, (long long)m, (long long)n, 2.0 * k * m * n / t * 1e-9,
               2.0 * k * m * n / tc * 1e-9, tsr_row_size(w, k) * (double)m / t * 1e-9, t * 1e3);
    free(a.v);
    free(x.v);
    tsr_context_close(ctx);
}

static void perf_op(tsr_backend *b, const test_case *c, int n_threads) {
    tsr_context *ctx = tsr_context_new(b);
    source s[4] = {{0}};
    rs = 7;
    int ok = 1;
    for (int i = 0; ok && i < c->n_src; i++) ok = make_source(ctx, &c->src[i], &s[i]);
    tsr_tensor *out = ok ? build(ctx, c, s) : NULL;
    double tc;
    const double t = out ? time_compute(ctx, out, n_threads, &tc) : -1;
    double bytes = tsr_tensor_nbytes(out ? out : s[0].t);
    for (int i = 0; i < c->n_src; i++) bytes += s[i].t ? tsr_tensor_nbytes(s[i].t) : 0;
    if (t > 0)
        printf("| %-8s | %-5s | %d | %lld elements | %7.2f GB/s | %7.2f GB/s | | %.3f ms |\n", tsr__op_name(c->op),
               tsr_type_name(c->type), n_threads, (long long)nel(c->src[0].ne), bytes / t * 1e-9,
               bytes / tc * 1e-9, t * 1e3);
    for (int i = 0; i < 4; i++) free(s[i].v);
    tsr_context_close(ctx);
}

static int mode_perf(const char *device, int max_threads) {
    /* threads 1..max_threads; -o restricts to one op */
    const tsr_type types[] = {TSR_TYPE_F16, TSR_TYPE_Q8_0, TSR_TYPE_Q4_0, TSR_TYPE_Q4_1, TSR_TYPE_Q4_K};
    for (int nt = 1; nt <= max_threads; nt++) {
        tsr_backend *b = make_backend(device, nt);
        if (!b) return 1;
        printf("\n| op | type | threads | shape | GFLOP/s (wall) | GFLOP/s (CPU time / threads) | weights GB/s | best wall time |\n"
               "|---|---|---|---|---|---|---|---|\n");
        for (size_t t = 0; t < N_OF(types) && (!only_op || !strcmp(only_op, "mul_mat")); t++) {
            perf_mul_mat(b, types[t], 4096, 4096, 1, nt);
            perf_mul_mat(b, types[t], 2048, 2048, 512, nt);
        }
        test_case pc[6];
        memset(pc, 0, sizeof pc);
        pc[0] = (test_case){.op = TSR_OP_ADD, .type = TSR_TYPE_F32, .n_src = 2,
                            .src = {S(TSR_TYPE_F32, 4096, 512, 1, 1), S(TSR_TYPE_F32, 4096, 512, 1, 1)}};
        pc[1] = (test_case){.op = TSR_OP_RMS_NORM, .type = TSR_TYPE_F32, .n_src = 1, .src = {S(TSR_TYPE_F32, 4096, 512, 1, 1)}, .f = {1e-5f}};
        pc[2] = (test_case){.op = TSR_OP_SOFTMAX, .type = TSR_TYPE_F32, .n_src = 1, .src = {S(TSR_TYPE_F32, 4096, 512, 1, 1)}, .f = {1.0f}};
        pc[3] = (test_case){.op = TSR_OP_SWIGLU, .type = TSR_TYPE_F32, .n_src = 2,
                            .src = {S(TSR_TYPE_F32, 4096, 512, 1, 1), S(TSR_TYPE_F32, 4096, 512, 1, 1)}};
        pc[4] = (test_case){.op = TSR_OP_CONT, .type = TSR_TYPE_F16, .n_src = 1,
                            .src = {P(S(TSR_TYPE_F32, 512, 4096, 1, 1), 1, 0, 2, 3)}, .i = {TSR_TYPE_F16}};
        pc[5] = (test_case){.op = TSR_OP_ROPE, .type = TSR_TYPE_F32, .n_src = 2,
                            .src = {S(TSR_TYPE_F32, 64, 32, 512, 1), KIND(S(TSR_TYPE_I32, 512, 1, 1, 1), K_POS, 0)},
                            .i = {64, 0, 4096}, .f = {10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f}};
        for (int i = 0; i < 6; i++)
            if (!only_op || !strcmp(only_op, tsr__op_name(pc[i].op))) perf_op(b, &pc[i], nt);
        tsr_backend_free(b);
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *device = getenv("TSR_TEST_DEVICE"), *mode = "test";
    int verbose = 0, threads = 2;
    if (device && !*device)
        device = NULL;
    const char *large_env = getenv("TSR_TEST_LARGE");
    large = large_env && strcmp(large_env, "1") == 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-d") == 0 && i + 1 < argc) device = argv[++i];
        else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) only_op = argv[++i];
        else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "-v") == 0) verbose = 1;
        else if (strcmp(argv[i], "-L") == 0) large = 1;
        else if (!strcmp(argv[i], "test") || !strcmp(argv[i], "perf") || !strcmp(argv[i], "list")) mode = argv[i];
        else {
            fprintf(stderr, "usage: %s [test|perf|list] [-d DEVICE] [-o OP] [-t THREADS] [-L] [-v]\n", argv[0]);
            return 2;
        }
    }
    if (device && !tsr_device_by_name(device))
        SKIP("device %s not present", device);
    make_cases();
    device_name = device;
    if (device && strcasecmp(device, "CPU") != 0) test_device = tsr_device_by_name(device);
    if (strcmp(mode, "perf") == 0) return mode_perf(device, threads);
    tsr_backend *b = make_backend(device, threads);
    if (!b) return 1;
    if (device && strcasecmp(device, "CPU") != 0 && !(cpu_backend = make_backend("CPU", threads))) return 1;
    printf("device %s, %d cases\n", device ? device : "CPU", n_cases);
    const int r = strcmp(mode, "list") == 0 ? mode_list(b) : mode_test(b, verbose);
    tsr_backend_free(b);
    tsr_backend_free(cpu_backend);
    return r;
}
