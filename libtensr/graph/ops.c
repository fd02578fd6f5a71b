/*
 * ops.c - the graph-building functions of the public API. Each checks the
 * shapes and types of its sources when it is called: a bad call records the
 * first error in the context and returns NULL; an op given a NULL source
 * returns NULL. Nothing here touches tensor data except build-time checks
 * of index inputs whose values are already known.
 */
#include "core.h"

#include <math.h>
#include <stdio.h>

static const tsr_op_info tsr_op_table[] = {
#define TSR_OP_INFO_(NAME, name, n_src, donors, writes, params) {name, n_src, donors, writes, params},
    TSR_OPS(TSR_OP_INFO_)
#undef TSR_OP_INFO_
};
_Static_assert(sizeof tsr_op_table / sizeof *tsr_op_table == TSR_OP_COUNT, "one op table entry per op");
_Static_assert(TSR_MAX_OP_PARAMS >= 9, "op_params holds the longest params layout (rope)");

const tsr_op_info *tsr__op_info(tsr_op op) { return (unsigned)op < TSR_OP_COUNT ? &tsr_op_table[op] : NULL; }
const char *tsr__op_name(tsr_op op) { return (unsigned)op < TSR_OP_COUNT ? tsr_op_table[op].name : "?"; }

/* Context of an op from its first source; records a NULL-source error. */
static bool srcs_ok(tsr_context *ctx, const char *op, int n, tsr_tensor *const *srcs) {
    if (!ctx) {
        tsr__error(TSR_E_INVALID, "tsr_%s: NULL context", op);
        return false;
    }
    for (int i = 0; i < n; i++)
        if (!srcs[i]) {
            if (ctx->status == TSR_OK)
                tsr__op_error(ctx, TSR_E_INVALID, "tsr_%s: source %d is NULL", op, i);
            return false;
        }
    return true;
}

#define TSR_CHECK_SRCS(ctx, name, ...)                                                   \
    do {                                                                                 \
        tsr_tensor *const tsr_srcs_[] = {__VA_ARGS__};                                   \
        if (!srcs_ok(ctx, name, (int)(sizeof tsr_srcs_ / sizeof *tsr_srcs_), tsr_srcs_)) \
            return NULL;                                                                 \
    } while (0)

static const char *tname(tsr_type t) {
    const char *n = tsr_type_name(t);
    return n ? n : "?";
}

/* Formats a shape "[a, b, c, d]" into buf. */
static const char *shape_str(char *buf, size_t size, const tsr_tensor *t) {
    snprintf(buf, size, "[%lld, %lld, %lld, %lld]", (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
             (long long)t->ne[3]);
    return buf;
}

static int max_int(int a, int b) { return a > b ? a : b; }

/* A new op node with contiguous strides. */
static tsr_tensor *new_node(tsr_context *ctx, tsr_op op, tsr_type type, int n_dims, const int64_t ne[4]) {
    tsr_tensor *t = tsr__new_tensor_struct(ctx);
    if (!t)
        return NULL;
    t->op = op;
    t->type = type;
    t->n_dims = n_dims < 1 ? 1 : n_dims;
    for (int i = 0; i < TSR_MAX_DIMS; i++) t->ne[i] = ne[i];
    if (!tsr__set_contiguous_strides(t))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_%s: result size overflows", tsr__op_name(op));
    return t;
}

static tsr_tensor *node_like(tsr_context *ctx, tsr_op op, tsr_type type, const tsr_tensor *a) {
    return new_node(ctx, op, type, a->n_dims, a->ne);
}

/* Which types (and layouts) an op takes is each device's fact, stated in its
 * op table (cpu/cpu.c): a finished node that no device of the backend runs is
 * refused here, when it is built, instead of at compute. */
static tsr_tensor *supported(tsr_context *ctx, tsr_tensor *t) {
    if (!t)
        return NULL;
    const tsr_backend *b = ctx->backend;
    for (size_t i = 0; i < b->n_devices; i++) {
        const tsr_device *d = b->devices[i];
        if (d->iface->supports_op && d->iface->supports_op(d, t))
            return t;
    }
    char types[192] = "";
    size_t len = 0;
    for (int j = 0; j < tsr__op_info(t->op)->n_src && len < sizeof types; j++)
        len += (size_t)snprintf(types + len, sizeof types - len, "%s%s", j ? ", " : "",
                                t->src[j] ? tname(t->src[j]->type) : "none");
    return tsr__op_error(ctx, TSR_E_UNSUPPORTED,
                         "tsr_%s: no device of the backend runs %s with sources of types (%s) "
                         "and a %s result",
                         tsr__op_name(t->op), tsr__op_name(t->op), types, tname(t->type));
}

/* ---- element-wise --------------------------------------------------------- */

static tsr_tensor *binary(tsr_context *ctx, tsr_op op, tsr_tensor *a, tsr_tensor *b) {
    const char *name = tsr__op_name(op);
    TSR_CHECK_SRCS(ctx, name, a, b);
    if (!tsr__can_repeat(b, a)) {
        char sa[96], sb[96];
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_%s: b %s does not broadcast over a %s", name,
                             shape_str(sb, sizeof sb, b), shape_str(sa, sizeof sa, a));
    }
    tsr_tensor *t = node_like(ctx, op, TSR_TYPE_F32, a);
    if (t) {
        t->src[0] = a;
        t->src[1] = b;
    }
    return supported(ctx, t);
}

tsr_tensor *tsr_add(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b) { return binary(ctx, TSR_OP_ADD, a, b); }
tsr_tensor *tsr_sub(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b) { return binary(ctx, TSR_OP_SUB, a, b); }
tsr_tensor *tsr_mul(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b) { return binary(ctx, TSR_OP_MUL, a, b); }
tsr_tensor *tsr_div(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b) { return binary(ctx, TSR_OP_DIV, a, b); }

/* Unary F32 op with optional f32 parameter; rows must be contiguous when asked. */
static tsr_tensor *unary(tsr_context *ctx, tsr_op op, tsr_tensor *a, float param, bool rows) {
    const char *name = tsr__op_name(op);
    TSR_CHECK_SRCS(ctx, name, a);
    if (rows && !tsr__is_contiguous_rows(a))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_%s: rows of a must be contiguous (nb[0] = %zu)", name, a->nb[0]);
    tsr_tensor *t = node_like(ctx, op, TSR_TYPE_F32, a);
    if (t) {
        t->src[0] = a;
        tsr__set_f32_param(t, 0, param);
    }
    return supported(ctx, t);
}

tsr_tensor *tsr_scale(tsr_context *ctx, tsr_tensor *a, float s) { return unary(ctx, TSR_OP_SCALE, a, s, false); }
tsr_tensor *tsr_silu(tsr_context *ctx, tsr_tensor *a) { return unary(ctx, TSR_OP_SILU, a, 0.0f, false); }
tsr_tensor *tsr_gelu(tsr_context *ctx, tsr_tensor *a) { return unary(ctx, TSR_OP_GELU, a, 0.0f, false); }

static tsr_tensor *norm_op(tsr_context *ctx, tsr_op op, tsr_tensor *a, float eps) {
    if (ctx && a && !(eps >= 0.0f))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_%s: eps must be >= 0, got %g", tsr__op_name(op), eps);
    return unary(ctx, op, a, eps, true);
}

tsr_tensor *tsr_rms_norm(tsr_context *ctx, tsr_tensor *a, float eps) { return norm_op(ctx, TSR_OP_RMS_NORM, a, eps); }
tsr_tensor *tsr_norm(tsr_context *ctx, tsr_tensor *a, float eps) { return norm_op(ctx, TSR_OP_NORM, a, eps); }

static tsr_tensor *glu(tsr_context *ctx, tsr_op op, tsr_tensor *a, tsr_tensor *b) {
    const char *name = tsr__op_name(op);
    TSR_CHECK_SRCS(ctx, name, a, b);
    if (!tsr__same_shape(a, b)) {
        char sa[96], sb[96];
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_%s: a %s and b %s differ in shape", name,
                             shape_str(sa, sizeof sa, a), shape_str(sb, sizeof sb, b));
    }
    tsr_tensor *t = node_like(ctx, op, TSR_TYPE_F32, a);
    if (t) {
        t->src[0] = a;
        t->src[1] = b;
    }
    return supported(ctx, t);
}

tsr_tensor *tsr_swiglu(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b) { return glu(ctx, TSR_OP_SWIGLU, a, b); }
tsr_tensor *tsr_geglu(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b) { return glu(ctx, TSR_OP_GEGLU, a, b); }

/* ---- matrix multiplication ---------------------------------------------------- */

tsr_tensor *tsr_mul_mat(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b) {
    TSR_CHECK_SRCS(ctx, "mul_mat", a, b);
    char sa[96], sb[96];
    if (a->ne[0] != b->ne[0] || (a->ne[2] == 0 ? b->ne[2] != 0 : b->ne[2] % a->ne[2] != 0) ||
        (a->ne[3] == 0 ? b->ne[3] != 0 : b->ne[3] % a->ne[3] != 0))
        return tsr__op_error(ctx, TSR_E_INVALID,
                             "tsr_mul_mat: a %s and b %s do not match (need a.ne[0] == b.ne[0] and b.ne[2], "
                             "b.ne[3] multiples of a's)",
                             shape_str(sa, sizeof sa, a), shape_str(sb, sizeof sb, b));
    if (!tsr__is_contiguous_rows(a))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_mul_mat: rows of a must be contiguous");
    int64_t ne[4] = {a->ne[1], b->ne[1], b->ne[2], b->ne[3]};
    tsr_tensor *t = new_node(ctx, TSR_OP_MUL_MAT, TSR_TYPE_F32, max_int(2, b->n_dims), ne);
    if (t) {
        t->src[0] = a;
        t->src[1] = b;
    }
    return supported(ctx, t);
}

/* The experts' weights as [k, m, n_expert], b [k, n_b, n_tokens] with n_b 1 or
 * n_used, ids [n_used, n_tokens]. The id values are checked by the kernel
 * when they are known (they are usually computed by top_k in the same graph). */
tsr_tensor *tsr_mul_mat_id(tsr_context *ctx, tsr_tensor *as, tsr_tensor *b, tsr_tensor *ids) {
    TSR_CHECK_SRCS(ctx, "mul_mat_id", as, b, ids);
    char sa[96], sb[96], si[96];
    if (b->type != TSR_TYPE_F32 || ids->type != TSR_TYPE_I32)
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_mul_mat_id: b must be f32 and ids i32, got %s and %s",
                             tname(b->type), tname(ids->type));
    const int64_t n_used = ids->ne[0], n_tokens = ids->ne[1];
    if (as->ne[3] != 1 || b->ne[3] != 1 || ids->ne[2] != 1 || ids->ne[3] != 1 || as->ne[0] != b->ne[0] ||
        b->ne[2] != n_tokens || (b->ne[1] != 1 && b->ne[1] != n_used))
        return tsr__op_error(ctx, TSR_E_INVALID,
                             "tsr_mul_mat_id: as %s, b %s and ids %s do not match (need as [k, m, n_expert], "
                             "b [k, 1 or n_used, n_tokens], ids [n_used, n_tokens])",
                             shape_str(sa, sizeof sa, as), shape_str(sb, sizeof sb, b), shape_str(si, sizeof si, ids));
    if (!tsr__is_contiguous_rows(as))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_mul_mat_id: rows of as must be contiguous");
    int64_t ne[4] = {as->ne[1], n_used, n_tokens, 1};
    tsr_tensor *t = new_node(ctx, TSR_OP_MUL_MAT_ID, TSR_TYPE_F32, 3, ne);
    if (t) {
        t->src[0] = as;
        t->src[1] = b;
        t->src[2] = ids;
    }
    return supported(ctx, t);
}

/* ---- rows ---------------------------------------------------------------- */

/* Checks known index values (inputs already filled) against [0, limit). */
static tsr_tensor *check_indices(tsr_context *ctx, const char *op, const tsr_tensor *idx, int64_t limit) {
    if (!(idx->flags & TSR_FLAG_INPUT) || !idx->data || !tsr__is_contiguous(idx) ||
        (idx->type != TSR_TYPE_I32 && idx->type != TSR_TYPE_I64))
        return (tsr_tensor *)idx; /* other index types: refused by the devices (supported) */
    int64_t n = tsr__nelements(idx);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = idx->type == TSR_TYPE_I32 ? ((const int32_t *)idx->data)[i] : ((const int64_t *)idx->data)[i];
        if (v < 0 || v >= limit)
            return tsr__op_error(ctx, TSR_E_RANGE, "tsr_%s: index %lld at position %lld is outside 0..%lld", op,
                                 (long long)v, (long long)i, (long long)limit - 1);
    }
    return (tsr_tensor *)idx;
}

tsr_tensor *tsr_get_rows(tsr_context *ctx, tsr_tensor *a, tsr_tensor *idx) {
    TSR_CHECK_SRCS(ctx, "get_rows", a, idx);
    char sa[96], si[96];
    if (idx->ne[3] != 1 || a->ne[2] != idx->ne[1] || a->ne[3] != idx->ne[2])
        return tsr__op_error(ctx, TSR_E_INVALID,
                             "tsr_get_rows: idx %s does not match a %s (need idx [n, a.ne[2], a.ne[3]])",
                             shape_str(si, sizeof si, idx), shape_str(sa, sizeof sa, a));
    if (!check_indices(ctx, "get_rows", idx, a->ne[1]))
        return NULL;
    int64_t ne[4] = {a->ne[0], idx->ne[0], idx->ne[1], idx->ne[2]};
    tsr_tensor *t = new_node(ctx, TSR_OP_GET_ROWS, TSR_TYPE_F32, max_int(2, idx->n_dims + 1), ne);
    if (t) {
        t->src[0] = a;
        t->src[1] = idx;
    }
    return supported(ctx, t);
}

/* The in-place result of SET_ROWS/CPY: a view of `target` carrying the op. */
static tsr_tensor *inplace_node(tsr_context *ctx, tsr_op op, tsr_tensor *target) {
    tsr_tensor *t = tsr__new_tensor_struct(ctx);
    if (!t)
        return NULL;
    t->op = op;
    t->type = target->type;
    t->n_dims = target->n_dims;
    memcpy(t->ne, target->ne, sizeof t->ne);
    memcpy(t->nb, target->nb, sizeof t->nb);
    t->view_src = target;
    t->view_offs = 0;
    t->flags = TSR_FLAG_INPLACE;
    return t;
}

tsr_tensor *tsr_set_rows(tsr_context *ctx, tsr_tensor *dst, tsr_tensor *src, tsr_tensor *idx) {
    TSR_CHECK_SRCS(ctx, "set_rows", dst, src, idx);
    char sd[96], ss[96], si[96];
    if (dst->ne[0] != src->ne[0] || idx->ne[0] != src->ne[1] || dst->ne[2] != src->ne[2] || dst->ne[3] != src->ne[3] ||
        idx->ne[3] != 1 || (idx->ne[1] == 0 ? src->ne[2] != 0 : src->ne[2] % idx->ne[1]) ||
        (idx->ne[2] == 0 ? src->ne[3] != 0 : src->ne[3] % idx->ne[2]))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_set_rows: dst %s, src %s and idx %s do not match",
                             shape_str(sd, sizeof sd, dst), shape_str(ss, sizeof ss, src),
                             shape_str(si, sizeof si, idx));
    if (!tsr__is_contiguous_rows(dst))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_set_rows: rows of dst must be contiguous");
    if (!check_indices(ctx, "set_rows", idx, dst->ne[1]))
        return NULL;
    tsr_tensor *t = inplace_node(ctx, TSR_OP_SET_ROWS, dst);
    if (t) {
        t->src[0] = dst;
        t->src[1] = src;
        t->src[2] = idx;
    }
    return supported(ctx, t);
}

/* ---- rope, softmax ------------------------------------------------------- */

tsr_tensor *tsr_rope_ext(tsr_context *ctx, tsr_tensor *a, tsr_tensor *pos, tsr_tensor *freq_factors, int n_dims,
                         int mode, int n_ctx_orig, float freq_base, float freq_scale, float ext_factor,
                         float attn_factor, float beta_fast, float beta_slow) {
    TSR_CHECK_SRCS(ctx, "rope", a, pos);
    if (mode != TSR_ROPE_NORMAL && mode != TSR_ROPE_NEOX)
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_rope: mode %d is neither normal (0) nor neox (2)", mode);
    if (n_dims <= 0 || n_dims % 2 != 0 || n_dims > a->ne[0])
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_rope: n_dims %d must be even, > 0 and <= head_dim %lld", n_dims,
                             (long long)a->ne[0]);
    if (tsr__nelements(pos) != a->ne[2] || a->ne[3] != 1)
        return tsr__op_error(ctx, TSR_E_INVALID,
                             "tsr_rope: pos has %lld elements, a has %lld tokens (ne[2]) and ne[3] %lld",
                             (long long)tsr__nelements(pos), (long long)a->ne[2], (long long)a->ne[3]);
    if (!(freq_base > 0.0f) || !(freq_scale > 0.0f))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_rope: freq_base %g and freq_scale %g must be > 0", freq_base,
                             freq_scale);
    if (freq_factors && (freq_factors->type != TSR_TYPE_F32 || tsr__nelements(freq_factors) < n_dims / 2))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_rope: freq_factors must be f32 with >= %d elements", n_dims / 2);
    if (!tsr__is_contiguous_rows(a))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_rope: rows of a must be contiguous");
    if (n_ctx_orig < 0 || !isfinite(ext_factor) || !isfinite(attn_factor) || !isfinite(beta_fast) ||
        !isfinite(beta_slow))
        return tsr__op_error(ctx, TSR_E_INVALID,
                             "tsr_rope_ext: n_ctx_orig %d must be >= 0; ext_factor %g, attn_factor %g, beta_fast %g "
                             "and beta_slow %g finite",
                             n_ctx_orig, ext_factor, attn_factor, beta_fast, beta_slow);
    tsr_tensor *t = node_like(ctx, TSR_OP_ROPE, TSR_TYPE_F32, a);
    if (!t)
        return NULL;
    t->src[0] = a;
    t->src[1] = pos;
    t->src[2] = freq_factors;
    t->op_params[TSR_ROPE_P_N_DIMS] = n_dims;
    t->op_params[TSR_ROPE_P_MODE] = mode;
    t->op_params[TSR_ROPE_P_N_CTX_ORIG] = n_ctx_orig;
    tsr__set_f32_param(t, TSR_ROPE_P_FREQ_BASE, freq_base);
    tsr__set_f32_param(t, TSR_ROPE_P_FREQ_SCALE, freq_scale);
    tsr__set_f32_param(t, TSR_ROPE_P_EXT_FACTOR, ext_factor);
    tsr__set_f32_param(t, TSR_ROPE_P_ATTN_FACTOR, attn_factor);
    tsr__set_f32_param(t, TSR_ROPE_P_BETA_FAST, beta_fast);
    tsr__set_f32_param(t, TSR_ROPE_P_BETA_SLOW, beta_slow);
    return supported(ctx, t);
}

tsr_tensor *tsr_rope(tsr_context *ctx, tsr_tensor *a, tsr_tensor *pos, int n_dims, int mode, float freq_base,
                     float freq_scale) {
    return tsr_rope_ext(ctx, a, pos, NULL, n_dims, mode, 0, freq_base, freq_scale, 0.0f, 1.0f, 32.0f, 1.0f);
}

tsr_tensor *tsr_softmax_ext(tsr_context *ctx, tsr_tensor *a, tsr_tensor *mask, float scale) {
    TSR_CHECK_SRCS(ctx, "softmax", a);
    if (!tsr__is_contiguous_rows(a))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_softmax: rows of a must be contiguous");
    if (!isfinite(scale))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_softmax_ext: scale %g is not finite", scale);
    if (mask) {
        char sa[96], sm[96];
        if (mask->ne[0] != a->ne[0] || mask->ne[1] < a->ne[1] ||
            (mask->ne[2] == 0 ? a->ne[2] != 0 : a->ne[2] % mask->ne[2]) ||
            (mask->ne[3] == 0 ? a->ne[3] != 0 : a->ne[3] % mask->ne[3]))
            return tsr__op_error(ctx, TSR_E_INVALID, "tsr_softmax: mask %s does not fit a %s",
                                 shape_str(sm, sizeof sm, mask), shape_str(sa, sizeof sa, a));
        if (!tsr__is_contiguous_rows(mask))
            return tsr__op_error(ctx, TSR_E_INVALID, "tsr_softmax: rows of mask must be contiguous");
    }
    tsr_tensor *t = node_like(ctx, TSR_OP_SOFTMAX, TSR_TYPE_F32, a);
    if (t) {
        t->src[0] = a;
        t->src[1] = mask;
        tsr__set_f32_param(t, 0, scale);
    }
    return supported(ctx, t);
}

tsr_tensor *tsr_softmax(tsr_context *ctx, tsr_tensor *a) { return tsr_softmax_ext(ctx, a, NULL, 1.0f); }

/* ---- concat, argmax, copies ------------------------------------------------ */

tsr_tensor *tsr_concat(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b, int dim) {
    TSR_CHECK_SRCS(ctx, "concat", a, b);
    if (dim < 0 || dim >= TSR_MAX_DIMS)
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_concat: dim %d is not 0..3", dim);
    int64_t ne[4];
    for (int i = 0; i < TSR_MAX_DIMS; i++) {
        if (i != dim && a->ne[i] != b->ne[i]) {
            char sa[96], sb[96];
            return tsr__op_error(ctx, TSR_E_INVALID, "tsr_concat: a %s and b %s differ outside dim %d",
                                 shape_str(sa, sizeof sa, a), shape_str(sb, sizeof sb, b), dim);
        }
        ne[i] = i == dim ? a->ne[i] + b->ne[i] : a->ne[i];
    }
    tsr_tensor *t = new_node(ctx, TSR_OP_CONCAT, a->type, max_int(max_int(a->n_dims, b->n_dims), dim + 1), ne);
    if (t) {
        t->src[0] = a;
        t->src[1] = b;
        t->op_params[0] = dim;
    }
    return supported(ctx, t);
}

tsr_tensor *tsr_argmax(tsr_context *ctx, tsr_tensor *a) {
    TSR_CHECK_SRCS(ctx, "argmax", a);
    if (!tsr__is_contiguous_rows(a))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_argmax: rows of a must be contiguous");
    int64_t ne[4] = {a->ne[1], a->ne[2], a->ne[3], 1};
    tsr_tensor *t = new_node(ctx, TSR_OP_ARGMAX, TSR_TYPE_I32, max_int(1, a->n_dims - 1), ne);
    if (t)
        t->src[0] = a;
    return supported(ctx, t);
}

tsr_tensor *tsr_sigmoid(tsr_context *ctx, tsr_tensor *a) { return unary(ctx, TSR_OP_SIGMOID, a, 0.0f, false); }

tsr_tensor *tsr_sum_rows(tsr_context *ctx, tsr_tensor *a) {
    TSR_CHECK_SRCS(ctx, "sum_rows", a);
    if (a->type != TSR_TYPE_F32)
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_sum_rows: a must be f32, got %s", tname(a->type));
    int64_t ne[4] = {1, a->ne[1], a->ne[2], a->ne[3]};
    tsr_tensor *t = new_node(ctx, TSR_OP_SUM_ROWS, TSR_TYPE_F32, a->n_dims, ne);
    if (t)
        t->src[0] = a;
    return supported(ctx, t);
}

/* Row-wise index ops (argsort, top_k): F32 rows in, I32 [k, ne1, ne2, ne3] out. */
static tsr_tensor *row_index_op(tsr_context *ctx, tsr_op op, tsr_tensor *a, int64_t k, int param) {
    int64_t ne[4] = {k, a->ne[1], a->ne[2], a->ne[3]};
    tsr_tensor *t = new_node(ctx, op, TSR_TYPE_I32, a->n_dims, ne);
    if (t) {
        t->src[0] = a;
        t->op_params[0] = param;
    }
    return supported(ctx, t);
}

tsr_tensor *tsr_argsort(tsr_context *ctx, tsr_tensor *a, tsr_sort_order order) {
    TSR_CHECK_SRCS(ctx, "argsort", a);
    if (a->type != TSR_TYPE_F32)
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_argsort: a must be f32, got %s", tname(a->type));
    if (order != TSR_SORT_ASC && order != TSR_SORT_DESC)
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_argsort: order %d is neither TSR_SORT_ASC (0) nor DESC (1)",
                             (int)order);
    if (a->ne[0] > INT32_MAX)
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_argsort: rows of %lld elements do not fit i32 indices",
                             (long long)a->ne[0]);
    return row_index_op(ctx, TSR_OP_ARGSORT, a, a->ne[0], (int)order);
}

tsr_tensor *tsr_top_k(tsr_context *ctx, tsr_tensor *a, int k) {
    TSR_CHECK_SRCS(ctx, "top_k", a);
    if (a->type != TSR_TYPE_F32)
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_top_k: a must be f32, got %s", tname(a->type));
    if (k < 1 || k > a->ne[0])
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_top_k: k %d is outside 1..ne[0] = %lld", k, (long long)a->ne[0]);
    if (a->ne[0] > INT32_MAX)
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_top_k: rows of %lld elements do not fit i32 indices",
                             (long long)a->ne[0]);
    return row_index_op(ctx, TSR_OP_TOP_K, a, k, k);
}

tsr_tensor *tsr_cpy(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b) {
    TSR_CHECK_SRCS(ctx, "cpy", a, b);
    if (tsr__nelements(a) != tsr__nelements(b))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_cpy: a has %lld elements, b has %lld",
                             (long long)tsr__nelements(a), (long long)tsr__nelements(b));
    if ((tsr_type_is_quantized(b->type) && !tsr__is_contiguous_rows(b)) ||
        (tsr_type_is_quantized(a->type) && !tsr__is_contiguous_rows(a)))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_cpy: quantized rows must be contiguous");
    if (tsr_type_is_quantized(a->type) && tsr_type_is_quantized(b->type) && a->ne[0] != b->ne[0])
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_cpy: quantized copies need equal row lengths");
    tsr_tensor *t = inplace_node(ctx, TSR_OP_CPY, b);
    if (t) {
        t->src[0] = a;
        t->src[1] = b;
    }
    return supported(ctx, t);
}

tsr_tensor *tsr_cast(tsr_context *ctx, tsr_tensor *a, tsr_type type) {
    TSR_CHECK_SRCS(ctx, "cont", a);
    const tsr_type_traits *tr = tsr__type_traits(type);
    if (!tr || !tr->block_size)
        return tsr__op_error(ctx, TSR_E_UNSUPPORTED, "tsr_cast: no conversion from %s to an unknown type",
                             tname(a->type));
    if (a->ne[0] % tr->block_size != 0)
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_cast: ne[0] %lld is not a multiple of %s's block %lld",
                             (long long)a->ne[0], tr->name, (long long)tr->block_size);
    if (tsr_type_is_quantized(a->type) && !tsr__is_contiguous_rows(a))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_cast: quantized rows must be contiguous");
    tsr_tensor *t = node_like(ctx, TSR_OP_CONT, type, a);
    if (t)
        t->src[0] = a;
    return supported(ctx, t);
}

tsr_tensor *tsr_cont(tsr_context *ctx, tsr_tensor *a) {
    return a ? tsr_cast(ctx, a, a->type) : tsr_cast(ctx, a, TSR_TYPE_F32);
}

/* ---- views ----------------------------------------------------------------- */

/* Bytes from a view's first element to the end of its last (tsr__nbytes),
 * false when that overflows: the view's sizes and strides are the caller's. */
static bool view_extent(const tsr_tensor *t, size_t *extent) {
    const tsr_type_traits *tr = tsr__type_traits(t->type);
    size_t bs = (size_t)tr->block_size, n, step;
    *extent = 0;
    for (int i = 0; i < TSR_MAX_DIMS; i++)
        if (t->ne[i] == 0)
            return true;
    if (bs == 1) {
        if (tsr__mul_overflow((size_t)(t->ne[0] - 1), t->nb[0], &n) || tsr__add_overflow(n, tr->block_bytes, &n))
            return false;
    } else if (tsr__mul_overflow((size_t)t->ne[0] / bs, t->nb[0], &n)) {
        return false;
    }
    for (int i = 1; i < TSR_MAX_DIMS; i++)
        if (tsr__mul_overflow((size_t)(t->ne[i] - 1), t->nb[i], &step) || tsr__add_overflow(n, step, &n))
            return false;
    *extent = n;
    return true;
}

static tsr_tensor *view_nd(tsr_context *ctx, tsr_tensor *a, int n_dims, const int64_t ne[4], const size_t nb[4],
                           size_t offset, const char *name) {
    TSR_CHECK_SRCS(ctx, name, a);
    const tsr_type_traits *tr = tsr__type_traits(a->type);
    for (int i = 0; i < TSR_MAX_DIMS; i++)
        if (ne[i] < 0)
            return tsr__op_error(ctx, TSR_E_INVALID, "tsr_%s: dimension %d is negative", name, i);
    if (ne[0] % tr->block_size != 0)
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_%s: ne[0] %lld is not a multiple of the block size %lld", name,
                             (long long)ne[0], (long long)tr->block_size);
    tsr_tensor *t = tsr__new_tensor_struct(ctx);
    if (!t)
        return NULL;
    t->op = TSR_OP_VIEW;
    t->type = a->type;
    t->n_dims = n_dims;
    memcpy(t->ne, ne, sizeof t->ne);
    memcpy(t->nb, nb, sizeof t->nb);
    t->view_src = a;
    t->view_offs = offset;
    t->src[0] = a;
    size_t extent, end, avail = tsr__nbytes(a);
    if (!view_extent(t, &extent) || tsr__add_overflow(offset, extent, &end) || (extent && end > avail))
        return tsr__op_error(ctx, TSR_E_RANGE, "tsr_%s: view of %zu bytes at offset %zu exceeds the %zu bytes of '%s'",
                             name, extent, offset, avail, a->name);
    if (a->data && tsr__has_static_data(a))
        t->data = (char *)a->data + offset; /* views of inputs and weights are readable at once */
    return t;
}

tsr_tensor *tsr_view_4d(tsr_context *ctx, tsr_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, size_t nb1,
                        size_t nb2, size_t nb3, size_t offset) {
    int64_t ne[4] = {ne0, ne1, ne2, ne3};
    size_t nb[4] = {a ? a->nb[0] : 0, nb1, nb2, nb3};
    return view_nd(ctx, a, 4, ne, nb, offset, "view_4d");
}

tsr_tensor *tsr_view_3d(tsr_context *ctx, tsr_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2, size_t nb1, size_t nb2,
                        size_t offset) {
    int64_t ne[4] = {ne0, ne1, ne2, 1};
    size_t nb[4] = {a ? a->nb[0] : 0, nb1, nb2, nb2 * (size_t)(ne2 > 0 ? ne2 : 1)};
    return view_nd(ctx, a, 3, ne, nb, offset, "view_3d");
}

tsr_tensor *tsr_view_2d(tsr_context *ctx, tsr_tensor *a, int64_t ne0, int64_t ne1, size_t nb1, size_t offset) {
    int64_t ne[4] = {ne0, ne1, 1, 1};
    size_t nb2 = nb1 * (size_t)(ne1 > 0 ? ne1 : 1);
    size_t nb[4] = {a ? a->nb[0] : 0, nb1, nb2, nb2};
    return view_nd(ctx, a, 2, ne, nb, offset, "view_2d");
}

tsr_tensor *tsr_view_1d(tsr_context *ctx, tsr_tensor *a, int64_t ne0, size_t offset) {
    if (!a)
        return view_nd(ctx, a, 1, NULL, NULL, offset, "view_1d");
    int64_t ne[4] = {ne0, 1, 1, 1};
    size_t row = tsr_row_size(a->type, ne0);
    size_t nb[4] = {a->nb[0], row, row, row};
    return view_nd(ctx, a, 1, ne, nb, offset, "view_1d");
}

tsr_tensor *tsr_reshape(tsr_context *ctx, tsr_tensor *a, int n_dims, const int64_t *ne_in) {
    TSR_CHECK_SRCS(ctx, "reshape", a);
    if (n_dims < 1 || n_dims > TSR_MAX_DIMS || !ne_in)
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_reshape: n_dims must be 1..4, got %d", n_dims);
    if (!tsr__is_contiguous(a))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_reshape: '%s' is not contiguous (use tsr_cont first)", a->name);
    int64_t ne[4] = {1, 1, 1, 1}, n = 1;
    for (int i = 0; i < n_dims; i++) {
        if (ne_in[i] < 0)
            return tsr__op_error(ctx, TSR_E_INVALID, "tsr_reshape: dimension %d is negative", i);
        ne[i] = ne_in[i];
        if (__builtin_mul_overflow(n, ne[i], &n))
            return tsr__op_error(ctx, TSR_E_INVALID, "tsr_reshape: size overflows");
    }
    if (n != tsr__nelements(a))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_reshape: %lld elements cannot become %lld",
                             (long long)tsr__nelements(a), (long long)n);
    tsr_tensor tmp = {0};
    tmp.type = a->type;
    memcpy(tmp.ne, ne, sizeof ne);
    if (!tsr__set_contiguous_strides(&tmp) || ne[0] % tsr_type_block_size(a->type) != 0)
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_reshape: ne[0] %lld does not fit the type's blocks",
                             (long long)ne[0]);
    return view_nd(ctx, a, n_dims, ne, tmp.nb, 0, "reshape");
}

tsr_tensor *tsr_reshape_1d(tsr_context *ctx, tsr_tensor *a, int64_t ne0) {
    int64_t ne[1] = {ne0};
    return tsr_reshape(ctx, a, 1, ne);
}
tsr_tensor *tsr_reshape_2d(tsr_context *ctx, tsr_tensor *a, int64_t ne0, int64_t ne1) {
    int64_t ne[2] = {ne0, ne1};
    return tsr_reshape(ctx, a, 2, ne);
}
tsr_tensor *tsr_reshape_3d(tsr_context *ctx, tsr_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2) {
    int64_t ne[3] = {ne0, ne1, ne2};
    return tsr_reshape(ctx, a, 3, ne);
}
tsr_tensor *tsr_reshape_4d(tsr_context *ctx, tsr_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    int64_t ne[4] = {ne0, ne1, ne2, ne3};
    return tsr_reshape(ctx, a, 4, ne);
}

tsr_tensor *tsr_permute(tsr_context *ctx, tsr_tensor *a, int axis0, int axis1, int axis2, int axis3) {
    TSR_CHECK_SRCS(ctx, "permute", a);
    int ax[4] = {axis0, axis1, axis2, axis3};
    int seen = 0;
    for (int i = 0; i < 4; i++) {
        if (ax[i] < 0 || ax[i] > 3 || (seen & (1 << ax[i])))
            return tsr__op_error(ctx, TSR_E_INVALID, "tsr_permute: axes (%d, %d, %d, %d) are not a permutation of 0..3",
                                 axis0, axis1, axis2, axis3);
        seen |= 1 << ax[i];
    }
    if (tsr_type_is_quantized(a->type) && ax[0] != 0)
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_permute: dim 0 of a quantized tensor cannot move");
    int64_t ne[4];
    size_t nb[4];
    int n_dims = a->n_dims;
    for (int i = 0; i < 4; i++) {
        ne[ax[i]] = a->ne[i];
        nb[ax[i]] = a->nb[i];
        if (a->ne[i] != 1 && ax[i] + 1 > n_dims)
            n_dims = ax[i] + 1;
    }
    tsr_tensor *t = view_nd(ctx, a, n_dims, ne, nb, 0, "permute");
    return t;
}

tsr_tensor *tsr_transpose(tsr_context *ctx, tsr_tensor *a) { return tsr_permute(ctx, a, 1, 0, 2, 3); }

/* ---- flash attention ------------------------------------------------------- */

tsr_tensor *tsr_flash_attn(tsr_context *ctx, tsr_tensor *q, tsr_tensor *k, tsr_tensor *v, tsr_tensor *mask,
                           float scale) {
    TSR_CHECK_SRCS(ctx, "flash_attn", q, k, v);
    char sq[96], sk[96], sv[96];
    if (!isfinite(scale))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_flash_attn: scale %g is not finite", scale);
    if (q->ne[0] != k->ne[0] || k->ne[1] != v->ne[1] || k->ne[2] != v->ne[2] || k->ne[2] == 0 ||
        q->ne[2] % k->ne[2] != 0 || q->ne[3] != k->ne[3] || k->ne[3] != v->ne[3])
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_flash_attn: q %s, k %s, v %s do not match",
                             shape_str(sq, sizeof sq, q), shape_str(sk, sizeof sk, k), shape_str(sv, sizeof sv, v));
    if (!tsr__is_contiguous_rows(q) || !tsr__is_contiguous_rows(k) || !tsr__is_contiguous_rows(v))
        return tsr__op_error(ctx, TSR_E_INVALID, "tsr_flash_attn: rows of q, k and v must be contiguous");
    if (mask) {
        if (mask->ne[0] != k->ne[1] || mask->ne[1] < q->ne[1] || !tsr__is_contiguous_rows(mask))
            return tsr__op_error(ctx, TSR_E_INVALID, "tsr_flash_attn: mask %s must be [n_kv = %lld, >= n_q = %lld]",
                                 shape_str(sk, sizeof sk, mask), (long long)k->ne[1], (long long)q->ne[1]);
    }
    int64_t ne[4] = {v->ne[0], q->ne[2], q->ne[1], q->ne[3]};
    tsr_tensor *t = new_node(ctx, TSR_OP_FLASH_ATTN, TSR_TYPE_F32, 4, ne);
    if (t) {
        t->src[0] = q;
        t->src[1] = k;
        t->src[2] = v;
        t->src[3] = mask;
        tsr__set_f32_param(t, 0, scale);
    }
    return supported(ctx, t);
}
