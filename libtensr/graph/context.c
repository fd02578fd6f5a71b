/*
 * context.c - contexts: an arena of tensor structs plus the list of every
 * piece of memory allocated through the context (inputs in aligned system
 * memory, buffers of tsr_new_tensor), all freed by tsr_context_close on
 * every path. Also the leaf constructors tsr_input, tsr_new_tensor, tsr_empty.
 */
#include "core.h"

#include <stdatomic.h>
#include <stdio.h>

#define TSR_CHUNK_TENSORS 128

/* Context ids and versions: unique in the process (sched.c, kvcache.c). */
static _Atomic uint64_t tsr_versions;

struct tsr_tensor_chunk {
    tsr_tensor_chunk *next;
    tsr_tensor t[TSR_CHUNK_TENSORS];
};

tsr_context *tsr_context_new(tsr_backend *b) {
    if (!b) {
        tsr__error(TSR_E_INVALID, "tsr_context_new: NULL backend");
        return NULL;
    }
    tsr_context *ctx = tsr__calloc(1, sizeof *ctx);
    if (!ctx) {
        tsr__error(TSR_E_NOMEM, "tsr_context_new: out of host memory (%zu bytes)", sizeof *ctx);
        return NULL;
    }
    ctx->backend = b;
    ctx->id = ctx->version = atomic_fetch_add(&tsr_versions, 1) + 1;
    ctx->chunk_used = TSR_CHUNK_TENSORS; /* first tensor allocates the first chunk */
    b->n_open_contexts++;
    return ctx;
}

void tsr_context_close(tsr_context *ctx) {
    if (!ctx)
        return;
    for (size_t i = ctx->n_owned; i-- > 0;) {
        if (ctx->owned[i].kind == 0)
            tsr__aligned_free(ctx->owned[i].ptr);
        else
            tsr_buffer_free(ctx->owned[i].ptr);
    }
    tsr__free(ctx->owned);
    for (tsr_tensor_chunk *c = ctx->chunks; c;) {
        tsr_tensor_chunk *next = c->next;
        tsr__free(c);
        c = next;
    }
    tsr_backend *b = ctx->backend;
    if (b && b->n_open_contexts > 0)
        b->n_open_contexts--;
    tsr__free(ctx);
    tsr__backend_release(b);
}

const char *tsr_context_error(const tsr_context *ctx) {
    if (!ctx)
        return "NULL context";
    return ctx->status == TSR_OK ? NULL : ctx->error;
}

tsr_status tsr_context_status(const tsr_context *ctx) { return ctx ? ctx->status : TSR_E_INVALID; }

tsr_backend *tsr_context_backend(const tsr_context *ctx) { return ctx ? ctx->backend : NULL; }

tsr_tensor *tsr__op_error(tsr_context *ctx, tsr_status s, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tsr__error(s, "%s", msg);
    if (ctx && ctx->status == TSR_OK) {
        ctx->status = s;
        snprintf(ctx->error, sizeof ctx->error, "%s", msg);
    }
    return NULL;
}

tsr_tensor *tsr__new_tensor_struct(tsr_context *ctx) {
    if (ctx->chunk_used == TSR_CHUNK_TENSORS) {
        tsr_tensor_chunk *c = tsr__malloc(sizeof *c);
        if (!c)
            return tsr__op_error(ctx, TSR_E_NOMEM, "out of host memory for tensor metadata (%zu bytes)", sizeof *c);
        c->next = ctx->chunks;
        ctx->chunks = c;
        ctx->chunk_used = 0;
    }
    tsr_tensor *t = &ctx->chunks->t[ctx->chunk_used++];
    memset(t, 0, sizeof *t);
    ctx->version = atomic_fetch_add(&tsr_versions, 1) + 1;
    t->ctx = ctx;
    t->device_id = -1;
    return t;
}

static tsr_status context_own(tsr_context *ctx, void *ptr, int kind) {
    if (!TSR_GROW(ctx->owned, ctx->cap_owned, ctx->n_owned + 1))
        return tsr__error(TSR_E_NOMEM, "out of host memory");
    ctx->owned[ctx->n_owned].ptr = ptr;
    ctx->owned[ctx->n_owned].kind = kind;
    ctx->n_owned++;
    return TSR_OK;
}

tsr_status tsr__context_own_host(tsr_context *ctx, void *mem) { return context_own(ctx, mem, 0); }

tsr_status tsr__context_own_buffer(tsr_context *ctx, tsr_buffer *buf) { return context_own(ctx, buf, 1); }

/* A leaf tensor struct with a checked shape and contiguous strides. */
static tsr_tensor *new_leaf(tsr_context *ctx, tsr_type type, int n_dims, const int64_t *ne, const char *what) {
    if (!ctx) {
        tsr__error(TSR_E_INVALID, "%s: NULL context", what);
        return NULL;
    }
    if (n_dims < 1 || n_dims > TSR_MAX_DIMS || !ne)
        return tsr__op_error(ctx, TSR_E_INVALID, "%s: n_dims must be 1..4 with a shape, got %d%s", what, n_dims,
                             ne ? "" : " and a NULL shape");
    const tsr_type_traits *tr = tsr__type_traits(type);
    if (!tr || tr->block_size == 0 || type == TSR_TYPE_Q8_K)
        return tsr__op_error(ctx, TSR_E_UNSUPPORTED, "%s: type %d is not a tensor type this library knows", what,
                             (int)type);
    for (int i = 0; i < n_dims; i++)
        if (ne[i] < 0)
            return tsr__op_error(ctx, TSR_E_INVALID, "%s: dimension %d is negative (%lld)", what, i, (long long)ne[i]);
    if (ne[0] % tr->block_size != 0)
        return tsr__op_error(ctx, TSR_E_INVALID, "%s: ne[0] = %lld is not a multiple of %s's block of %lld", what,
                             (long long)ne[0], tr->name, (long long)tr->block_size);
    tsr_tensor *t = tsr__new_tensor_struct(ctx);
    if (!t)
        return NULL;
    t->type = type;
    t->n_dims = n_dims;
    for (int i = 0; i < TSR_MAX_DIMS; i++) t->ne[i] = i < n_dims ? ne[i] : 1;
    if (!tsr__set_contiguous_strides(t))
        return tsr__op_error(ctx, TSR_E_INVALID, "%s: tensor size overflows", what);
    return t;
}

tsr_tensor *tsr_input(tsr_context *ctx, tsr_type type, int n_dims, const int64_t *ne, const void *data) {
    tsr_tensor *t = new_leaf(ctx, type, n_dims, ne, "tsr_input");
    if (!t)
        return NULL;
    size_t size = tsr_tensor_nbytes(t);
    t->flags = TSR_FLAG_INPUT;
    if (size == 0)
        return t;
    void *mem = tsr__aligned_alloc(TSR_ALIGN, tsr__pad(size, TSR_ALIGN));
    if (!mem)
        return tsr__op_error(ctx, TSR_E_NOMEM, "tsr_input: out of host memory (%zu bytes)", size);
    if (tsr__context_own_host(ctx, mem) != TSR_OK) {
        tsr__aligned_free(mem);
        return tsr__op_error(ctx, TSR_E_NOMEM, "tsr_input: out of host memory");
    }
    if (data)
        memcpy(mem, data, size);
    else
        memset(mem, 0, size);
    t->data = mem;
    return t;
}

tsr_tensor *tsr_new_tensor(tsr_context *ctx, tsr_buffer_type *buft, tsr_type type, int n_dims, const int64_t *ne) {
    tsr_tensor *t = new_leaf(ctx, type, n_dims, ne, "tsr_new_tensor");
    if (!t)
        return NULL;
    t->flags = TSR_FLAG_PERSIST;
    if (!buft)
        buft = tsr_device_buffer_type(tsr__host_device());
    size_t size = tsr_tensor_nbytes(t);
    if (size == 0)
        return t;
    tsr_buffer *buf = NULL;
    tsr_status s = tsr_buffer_alloc(buft, size, &buf);
    if (s != TSR_OK)
        return tsr__op_error(ctx, s, "tsr_new_tensor: %s", tsr_last_error());
    if (tsr__context_own_buffer(ctx, buf) != TSR_OK) {
        tsr_buffer_free(buf);
        return tsr__op_error(ctx, TSR_E_NOMEM, "tsr_new_tensor: out of host memory");
    }
    t->buffer = buf;
    t->data = buf->base;
    if (buft->iface->memset && (s = buft->iface->memset(buf, buf->base, 0, size)) != TSR_OK)
        return tsr__op_error(ctx, s, "tsr_new_tensor: %s", tsr_last_error());
    return t;
}

tsr_tensor *tsr_empty(tsr_context *ctx, tsr_type type, int n_dims, const int64_t *ne) {
    return new_leaf(ctx, type, n_dims, ne, "tsr_empty");
}
