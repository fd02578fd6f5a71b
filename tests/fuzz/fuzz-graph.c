/*
 * fuzz-graph.c - fuzz target for graph building and computing: the input is
 * a program. Op builders must validate what they are given and return NULL
 * with the error recorded in the context; tsr_compute must run what they
 * accepted or fail with a status. Errors are allowed, crashes are not.
 *
 * Program (bytes past the end read as 0):
 *   n_inputs (1 + b % 4) inputs: type (F32 F16 BF16 I32 Q8_0 Q4_0), n_dims
 *   (1 + b % 4), each dimension b % 9 (quantized rows 0, 32 or 64), then
 *   the data: small integers as floats, indices b % 9 for I32 (so some are
 *   out of range), raw bytes for quantized blocks;
 *   then ops until the input ends (64 tensors at most): an op byte, operand
 *   bytes picking earlier tensors, parameter bytes (dims, strides, offsets,
 *   axes, eps, scales, rope modes, top_k's k, sort orders) - see build_op().
 * The last tensor built is computed on a one-thread CPU backend (made once)
 * and read back; the context is closed every time (FUZZ_VERBOSE=1 prints
 * what each compute said). Shapes stay under 9 per
 * dimension, so an iteration takes microseconds.
 *
 * make fuzz builds it with libFuzzer against a sanitized static library;
 * make check replays tests/fuzz/corpus-graph/ (fuzz-replay.h).
 */
#include "libtensr.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_TENSORS 64

typedef struct prog {
    const uint8_t *p;
    size_t n, at;
} prog;

static unsigned u8(prog *g) { return g->at < g->n ? g->p[g->at++] : 0; }
static int64_t dim(prog *g) { return (int64_t)(u8(g) % 9); }

static const tsr_type in_types[] = {TSR_TYPE_F32, TSR_TYPE_F16,  TSR_TYPE_BF16,
                                    TSR_TYPE_I32, TSR_TYPE_Q8_0, TSR_TYPE_Q4_0};

static void fill(prog *g, tsr_type type, int64_t n, size_t nbytes, uint8_t *buf) {
    for (int64_t i = 0; i < n && type != TSR_TYPE_Q8_0 && type != TSR_TYPE_Q4_0; i++) {
        float f = (float)((int)u8(g) - 128) / 16.0f;
        switch (type) {
        case TSR_TYPE_F32: memcpy(buf + 4 * i, &f, 4); break;
        case TSR_TYPE_F16: {
            uint16_t h = tsr_fp32_to_fp16(f);
            memcpy(buf + 2 * i, &h, 2);
            break;
        }
        case TSR_TYPE_BF16: {
            uint16_t h = tsr_fp32_to_bf16(f);
            memcpy(buf + 2 * i, &h, 2);
            break;
        }
        default: {
            int32_t x = (int32_t)(u8(g) % 9);
            memcpy(buf + 4 * i, &x, 4);
        }
        }
    }
    if (type == TSR_TYPE_Q8_0 || type == TSR_TYPE_Q4_0)
        for (size_t i = 0; i < nbytes; i++) buf[i] = (uint8_t)u8(g);
}

static tsr_tensor *make_input(tsr_context *ctx, prog *g) {
    static uint8_t buf[9 * 9 * 9 * 64 * 4];
    tsr_type type = in_types[u8(g) % 6];
    int n_dims = 1 + (int)(u8(g) % 4);
    int64_t ne[4] = {1, 1, 1, 1}, n = 1;
    for (int d = 0; d < n_dims; d++) ne[d] = dim(g);
    if (tsr_type_is_quantized(type)) ne[0] = 32 * (int64_t)(u8(g) % 3);
    for (int d = 0; d < 4; d++) n *= ne[d];
    size_t nbytes = tsr_row_size(type, ne[0]) * (size_t)(ne[1] * ne[2] * ne[3]);
    memset(buf, 0, nbytes);
    fill(g, type, n, nbytes, buf);
    return tsr_input(ctx, type, n_dims, ne, buf);
}

static float small_float(prog *g) { return (float)((int)u8(g) - 64) / 32.0f; }

static tsr_tensor *build_view(tsr_context *ctx, prog *g, tsr_tensor *a, unsigned kind) {
    int64_t ne0 = dim(g), ne1 = dim(g), ne2 = dim(g), ne3 = dim(g);
    size_t nb1 = u8(g) * 4u, nb2 = u8(g) * 16u, nb3 = u8(g) * 64u, off = u8(g) * 4u;
    switch (kind % 4) {
    case 0: return tsr_view_1d(ctx, a, ne0, off);
    case 1: return tsr_view_2d(ctx, a, ne0, ne1, nb1, off);
    case 2: return tsr_view_3d(ctx, a, ne0, ne1, ne2, nb1, nb2, off);
    default: return tsr_view_4d(ctx, a, ne0, ne1, ne2, ne3, nb1, nb2, nb3, off);
    }
}

static tsr_tensor *build_reshape(tsr_context *ctx, prog *g, tsr_tensor *a, unsigned kind) {
    int64_t ne[4] = {dim(g), dim(g), dim(g), dim(g)};
    if (kind % 5 == 4) ne[0] = tsr_tensor_nelements(a); /* often valid */
    switch (kind % 5) {
    case 0: return tsr_reshape_1d(ctx, a, ne[0]);
    case 1: return tsr_reshape_2d(ctx, a, ne[0], ne[1]);
    case 2: return tsr_reshape_3d(ctx, a, ne[0], ne[1], ne[2]);
    case 3: return tsr_reshape_4d(ctx, a, ne[0], ne[1], ne[2], ne[3]);
    default: return tsr_reshape(ctx, a, 1, ne);
    }
}

static tsr_tensor *build_op(tsr_context *ctx, prog *g, tsr_tensor **t, int n) {
    unsigned op = u8(g) % 34;
    tsr_tensor *a = t[u8(g) % (unsigned)n], *b = t[u8(g) % (unsigned)n], *c = t[u8(g) % (unsigned)n];
    tsr_tensor *d = u8(g) & 1 ? t[u8(g) % (unsigned)n] : NULL;
    switch (op) {
    case 0: return tsr_add(ctx, a, b);
    case 1: return tsr_sub(ctx, a, b);
    case 2: return tsr_mul(ctx, a, b);
    case 3: return tsr_div(ctx, a, b);
    case 4: return tsr_scale(ctx, a, small_float(g));
    case 5: return tsr_mul_mat(ctx, a, b);
    case 6: return tsr_get_rows(ctx, a, b);
    case 7: return tsr_set_rows(ctx, a, b, c);
    case 8: return tsr_rms_norm(ctx, a, (float)u8(g) * 1e-3f);
    case 9: return tsr_norm(ctx, a, (float)u8(g) * 1e-3f);
    case 10: {
        int n_rot = (int)(u8(g) % 10), mode = u8(g) & 1 ? TSR_ROPE_NEOX : (int)(u8(g) % 4);
        return tsr_rope(ctx, a, b, n_rot, mode, 10000.0f * small_float(g), small_float(g));
    }
    case 11: {
        int n_rot = (int)(u8(g) % 10), mode = u8(g) & 1 ? TSR_ROPE_NEOX : TSR_ROPE_NORMAL;
        return tsr_rope_ext(ctx, a, b, d, n_rot, mode, (int)u8(g), 10000.0f, small_float(g), small_float(g),
                            small_float(g), 32.0f * small_float(g), small_float(g));
    }
    case 12: return tsr_softmax(ctx, a);
    case 13: return tsr_softmax_ext(ctx, a, d, small_float(g));
    case 14: return u8(g) & 1 ? tsr_silu(ctx, a) : tsr_gelu(ctx, a);
    case 15: return u8(g) & 1 ? tsr_swiglu(ctx, a, b) : tsr_geglu(ctx, a, b);
    case 16: return tsr_concat(ctx, a, b, (int)(u8(g) % 6) - 1);
    case 17: return tsr_argmax(ctx, a);
    case 18: return tsr_cpy(ctx, a, b);
    case 19: return tsr_cont(ctx, a);
    case 20: return tsr_cast(ctx, a, in_types[u8(g) % 6]);
    case 21: return build_view(ctx, g, a, u8(g));
    case 22: return build_reshape(ctx, g, a, u8(g));
    case 23: {
        int ax[4] = {(int)(u8(g) % 5), (int)(u8(g) % 5), (int)(u8(g) % 5), (int)(u8(g) % 5)};
        return tsr_permute(ctx, a, ax[0], ax[1], ax[2], ax[3]);
    }
    case 24: {
        unsigned p = u8(g) % 24; /* a valid permutation, p-th in order */
        int ax[4], used[4] = {0}, f[3] = {6, 2, 1};
        for (int i = 0; i < 3; i++) {
            unsigned k = p / (unsigned)f[i];
            p %= (unsigned)f[i];
            for (int j = 0; j < 4; j++)
                if (!used[j] && k-- == 0) {
                    ax[i] = j, used[j] = 1;
                    break;
                }
        }
        for (int j = 0; j < 4; j++)
            if (!used[j]) ax[3] = j;
        return tsr_permute(ctx, a, ax[0], ax[1], ax[2], ax[3]);
    }
    case 25: return tsr_transpose(ctx, a);
    case 26: return tsr_flash_attn(ctx, a, b, c, d, small_float(g));
    case 27: {
        int64_t ne[4] = {dim(g), dim(g), dim(g), dim(g)};
        return tsr_empty(ctx, in_types[u8(g) % 6], 1 + (int)(u8(g) % 4), ne);
    }
    case 28: return make_input(ctx, g);
    case 30: return tsr_mul_mat_id(ctx, a, b, c); /* I32 inputs are b % 9: ids out of range too */
    case 31: return tsr_top_k(ctx, a, (int)(u8(g) % 10));
    case 32: return tsr_argsort(ctx, a, (tsr_sort_order)(u8(g) % 3));
    case 33: return u8(g) & 1 ? tsr_sigmoid(ctx, a) : tsr_sum_rows(ctx, a);
    default: return tsr_mul_mat(ctx, a, tsr_cont(ctx, tsr_transpose(ctx, b)));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static tsr_backend *be;
    if (!be) {
        tsr_backend_params bp;
        tsr_backend_params_init(&bp, sizeof bp);
        bp.n_threads = 1;
        if (tsr_backend_new(&bp, &be) != TSR_OK) abort();
    }
    prog g = {data, size, 0};
    tsr_context *ctx = tsr_context_new(be);
    if (!ctx) abort();
    tsr_tensor *t[MAX_TENSORS];
    int n = 0, n_inputs = 1 + (int)(u8(&g) % 4);
    for (int i = 0; i < n_inputs; i++)
        if ((t[n] = make_input(ctx, &g))) n++;
    while (n > 0 && n < MAX_TENSORS && g.at < g.n) {
        tsr_tensor *r = build_op(ctx, &g, t, n);
        if (r) t[n++] = r;
    }
    if (n > 0) {
        tsr_tensor *out = t[n - 1];
        tsr_status st = tsr_compute(ctx, &out, 1);
        if (getenv("FUZZ_VERBOSE"))
            fprintf(stderr, "fuzz-graph: %d tensors: %s\n", n, st ? tsr_last_error() : "computed");
        if (st == TSR_OK) {
            size_t nb = tsr_tensor_nbytes(out);
            void *buf = malloc(nb ? nb : 1);
            if (buf && tsr_tensor_read(out, buf, 0, nb) != TSR_OK) abort();
            free(buf);
        } else if (!tsr_last_error()[0] && !tsr_context_error(ctx)[0]) {
            abort();
        }
    }
    tsr_context_close(ctx);
    return 0;
}

#define FUZZ_NAME "graph"
#include "fuzz-replay.h"
