/*
 * tensor.c - tensor metadata helpers (sizes, strides, contiguity), the
 * public accessors, and reading/writing a tensor's contents from the host.
 */
#include "core.h"

#include <stdio.h>

int64_t tsr__nelements(const tsr_tensor *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }

int64_t tsr__nrows(const tsr_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

size_t tsr__row_bytes(const tsr_tensor *t) { return tsr_row_size(t->type, t->ne[0]); }

size_t tsr__nbytes(const tsr_tensor *t) {
    for (int i = 0; i < TSR_MAX_DIMS; i++)
        if (t->ne[i] == 0)
            return 0;
    const tsr_type_traits *tr = tsr__type_traits(t->type);
    size_t bs = tr ? (size_t)tr->block_size : 1;
    size_t unit = tr ? tr->block_bytes : t->nb[0];
    /* a row spans its blocks; the last element of a strided row ends one unit after its start */
    size_t n = bs == 1 ? unit + (size_t)(t->ne[0] - 1) * t->nb[0] : (size_t)t->ne[0] / bs * t->nb[0];
    for (int i = 1; i < TSR_MAX_DIMS; i++) n += (size_t)(t->ne[i] - 1) * t->nb[i];
    return n;
}

bool tsr__set_contiguous_strides(tsr_tensor *t) {
    const tsr_type_traits *tr = tsr__type_traits(t->type);
    if (!tr || tr->block_size == 0)
        return false;
    t->nb[0] = tr->block_bytes;
    size_t row = tsr_row_size(t->type, t->ne[0]);
    if (row == 0 && t->ne[0] != 0)
        return false;
    t->nb[1] = t->ne[0] == 0 ? tr->block_bytes : row;
    for (int i = 2; i < TSR_MAX_DIMS; i++) {
        size_t prev = t->ne[i - 1] > 0 ? (size_t)t->ne[i - 1] : 1;
        if (tsr__mul_overflow(t->nb[i - 1], prev, &t->nb[i]))
            return false;
    }
    size_t total;
    size_t last = t->ne[3] > 0 ? (size_t)t->ne[3] : 1;
    return !tsr__mul_overflow(t->nb[3], last, &total);
}

bool tsr__is_contiguous(const tsr_tensor *t) {
    const tsr_type_traits *tr = tsr__type_traits(t->type);
    if (!tr)
        return false;
    if (t->nb[0] != tr->block_bytes)
        return false;
    size_t next = tsr_row_size(t->type, t->ne[0]);
    for (int i = 1; i < TSR_MAX_DIMS; i++) {
        if (t->ne[i] != 1 && t->nb[i] != next)
            return false;
        next *= (size_t)t->ne[i];
    }
    return true;
}

bool tsr__is_contiguous_rows(const tsr_tensor *t) {
    const tsr_type_traits *tr = tsr__type_traits(t->type);
    return tr && t->nb[0] == tr->block_bytes;
}

bool tsr__same_shape(const tsr_tensor *a, const tsr_tensor *b) {
    for (int i = 0; i < TSR_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i])
            return false;
    return true;
}

bool tsr__can_repeat(const tsr_tensor *small, const tsr_tensor *big) {
    for (int i = 0; i < TSR_MAX_DIMS; i++) {
        if (small->ne[i] == 0)
            return big->ne[i] == 0 || tsr__nelements(big) == 0;
        if (big->ne[i] % small->ne[i] != 0)
            return false;
    }
    return true;
}

tsr_tensor *tsr__view_root(tsr_tensor *t) {
    while (t->view_src) t = t->view_src;
    return t;
}

bool tsr__has_static_data(const tsr_tensor *t) {
    const tsr_tensor *r = tsr__view_root((tsr_tensor *)t);
    return r->op == TSR_OP_NONE && (r->flags & (TSR_FLAG_INPUT | TSR_FLAG_WEIGHT | TSR_FLAG_PERSIST));
}

tsr_buffer *tsr__tensor_buffer(const tsr_tensor *t) {
    while (t->view_src && !t->buffer) t = t->view_src;
    return t->buffer;
}

bool tsr__tensor_has_data(const tsr_tensor *t) {
    if (!t->data && tsr__nbytes(t) != 0)
        return false;
    if (tsr__has_static_data(t))
        return true;
    /* a computed result: valid while its backend has not computed since */
    const tsr_context *ctx = t->ctx;
    return ctx && ctx->backend && t->generation != 0 && t->generation == ctx->backend->generation;
}

/* ---- public accessors ------------------------------------------------------ */

tsr_tensor *tsr_set_name(tsr_tensor *t, const char *name) {
    if (t && name)
        snprintf(t->name, sizeof t->name, "%s", name);
    return t;
}

const char *tsr_tensor_name(const tsr_tensor *t) { return t ? t->name : ""; }

tsr_type tsr_tensor_type(const tsr_tensor *t) { return t ? t->type : (tsr_type)-1; }

int tsr_tensor_n_dims(const tsr_tensor *t) { return t ? t->n_dims : 0; }

int64_t tsr_tensor_ne(const tsr_tensor *t, int dim) {
    if (!t || dim < 0)
        return -1;
    return dim < TSR_MAX_DIMS ? t->ne[dim] : 1;
}

size_t tsr_tensor_nb(const tsr_tensor *t, int dim) {
    if (!t || dim < 0 || dim >= TSR_MAX_DIMS)
        return 0;
    return t->nb[dim];
}

int64_t tsr_tensor_nelements(const tsr_tensor *t) { return t ? tsr__nelements(t) : 0; }

size_t tsr_tensor_nbytes(const tsr_tensor *t) {
    if (!t)
        return 0;
    return tsr__row_bytes(t) * (size_t)tsr__nrows(t);
}

int tsr_tensor_is_contiguous(const tsr_tensor *t) { return t ? tsr__is_contiguous(t) : 0; }

tsr_buffer_type *tsr_tensor_buffer_type(const tsr_tensor *t) {
    if (!t)
        return NULL;
    tsr_buffer *buf = tsr__tensor_buffer(t);
    return buf ? buf->buft : NULL;
}

/* ---- read / write --------------------------------------------------------- */

/* Copies between host memory and the tensor's storage, in contiguous order.
 * to_tensor selects the direction. */
static tsr_status tensor_xfer(tsr_tensor *t, void *host, size_t offset, size_t size, bool to_tensor) {
    /* a tensor its buffer type keeps in a layout of its own: its bytes as stored first */
    tsr_status st = tsr__tensor_to_stored(t);
    if (st != TSR_OK)
        return st;
    tsr_buffer *buf = tsr__tensor_buffer(t);
    if (tsr__is_contiguous(t)) {
        char *addr = (char *)t->data + offset;
        if (!buf) {
            if (to_tensor)
                memcpy(addr, host, size);
            else
                memcpy(host, addr, size);
            return TSR_OK;
        }
        return to_tensor ? tsr__buffer_set(buf, addr, host, size) : tsr__buffer_get(buf, addr, host, size);
    }
    /* strided: element (or block) units in logical order */
    const tsr_type_traits *tr = tsr__type_traits(t->type);
    size_t unit = tr->block_bytes;
    int64_t per_row = t->ne[0] / tr->block_size;
    size_t done = 0, pos = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < per_row; i0++, pos += unit) {
                    if (pos + unit <= offset || pos >= offset + size)
                        continue;
                    size_t lo = pos < offset ? offset - pos : 0;
                    size_t hi = pos + unit > offset + size ? offset + size - pos : unit;
                    char *addr = (char *)t->data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3] + lo;
                    char *h = (char *)host + (pos + lo - offset);
                    tsr_status s = TSR_OK;
                    if (!buf) {
                        if (to_tensor)
                            memcpy(addr, h, hi - lo);
                        else
                            memcpy(h, addr, hi - lo);
                    } else {
                        s = to_tensor ? tsr__buffer_set(buf, addr, h, hi - lo) : tsr__buffer_get(buf, addr, h, hi - lo);
                    }
                    if (s != TSR_OK)
                        return s;
                    done += hi - lo;
                }
    (void)done;
    return TSR_OK;
}

static tsr_status check_xfer(const tsr_tensor *t, const void *host, size_t offset, size_t size, const char *what) {
    if (!t || (!host && size))
        return tsr__error(TSR_E_INVALID, "%s: NULL %s", what, t ? "buffer" : "tensor");
    size_t total = tsr_tensor_nbytes(t), end;
    if (tsr__add_overflow(offset, size, &end) || end > total)
        return tsr__error(TSR_E_RANGE, "%s: tensor '%s': bytes %zu..%zu outside its %zu bytes", what, t->name, offset,
                          offset + size, total);
    if (!tsr__tensor_has_data(t))
        return tsr__error(TSR_E_STATE,
                          "%s: tensor '%s' holds no data (not computed, or its backend computed another "
                          "graph since)",
                          what, t->name);
    return TSR_OK;
}

tsr_status tsr_tensor_read(const tsr_tensor *t, void *dst, size_t offset, size_t size) {
    tsr_status s = check_xfer(t, dst, offset, size, "tsr_tensor_read");
    if (s != TSR_OK || size == 0)
        return s;
    return tensor_xfer((tsr_tensor *)t, dst, offset, size, false);
}

tsr_status tsr_tensor_write(tsr_tensor *t, const void *src, size_t offset, size_t size) {
    tsr_status s = check_xfer(t, src, offset, size, "tsr_tensor_write");
    if (s != TSR_OK || size == 0)
        return s;
    if (tsr__view_root(t)->flags & TSR_FLAG_WEIGHT)
        tsr__weights_touch(); /* per-device copies of shared weights follow (sched.c) */
    return tensor_xfer(t, (void *)src, offset, size, true);
}
