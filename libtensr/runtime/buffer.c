/*
 * buffer.c - buffers: memory of one buffer type, allocated through the
 * backend's buffer-type interface, and the copies between buffers and the
 * host that the core and the scheduler use.
 */
#include "core.h"

#include <stdio.h>

tsr_status tsr_buffer_alloc(tsr_buffer_type *bt, size_t size, tsr_buffer **out) {
    if (out)
        *out = NULL;
    if (!bt || !out)
        return tsr__error(TSR_E_INVALID, "tsr_buffer_alloc: NULL %s", bt ? "out" : "buffer type");
    tsr_buffer *b = tsr__calloc(1, sizeof *b);
    if (!b)
        return tsr__error(TSR_E_NOMEM, "tsr_buffer_alloc: out of host memory");
    b->buft = bt;
    b->size = size;
    tsr_status s = bt->iface->alloc(bt, size, &b->base, &b->handle);
    if (s != TSR_OK) {
        tsr__free(b);
        return s;
    }
    *out = b;
    return TSR_OK;
}

void tsr_buffer_free(tsr_buffer *b) {
    if (!b)
        return;
    b->buft->iface->free(b->buft, b->base, b->handle);
    tsr__free(b);
}

size_t tsr_buffer_size(const tsr_buffer *b) { return b ? b->size : 0; }

tsr_buffer_type *tsr_buffer_get_type(const tsr_buffer *b) { return b ? b->buft : NULL; }

tsr_status tsr__tensor_to_stored(tsr_tensor *t) {
    while (t->view_src) t = t->view_src;
    if (!(t->flags & TSR_FLAG_OWN_LAYOUT) || !t->buffer || !t->buffer->buft->iface->to_stored)
        return TSR_OK;
    return t->buffer->buft->iface->to_stored(t->buffer, t);
}

tsr_status tsr__buffer_set(tsr_buffer *buf, void *dst, const void *host, size_t size) {
    if (size == 0)
        return TSR_OK;
    if (buf->buft->iface->set)
        return buf->buft->iface->set(buf, dst, host, size);
    memcpy(dst, host, size);
    return TSR_OK;
}

tsr_status tsr__buffer_get(tsr_buffer *buf, const void *src, void *host, size_t size) {
    if (size == 0)
        return TSR_OK;
    if (buf->buft->iface->get)
        return buf->buft->iface->get(buf, src, host, size);
    memcpy(host, src, size);
    return TSR_OK;
}

tsr_status tsr__buffer_copy(tsr_buffer *dst_buf, void *dst, tsr_buffer *src_buf, const void *src, size_t size) {
    if (size == 0)
        return TSR_OK;
    /* NULL buffer = plain system memory */
    if (!src_buf)
        return dst_buf ? tsr__buffer_set(dst_buf, dst, src, size) : (memcpy(dst, src, size), TSR_OK);
    if (!dst_buf)
        return tsr__buffer_get(src_buf, src, dst, size);
    if (dst_buf->buft == src_buf->buft && dst_buf->buft->iface->copy)
        return dst_buf->buft->iface->copy(dst_buf, dst, src_buf, src, size);
    /* host-addressable memory is read or written in place by the other side */
    if (src_buf->buft->is_host)
        return tsr__buffer_set(dst_buf, dst, src, size);
    if (dst_buf->buft->is_host)
        return tsr__buffer_get(src_buf, src, dst, size);
    /* device to another device: bounce through host memory */
    void *tmp = tsr__malloc(size);
    if (!tmp)
        return tsr__error(TSR_E_NOMEM, "out of host memory copying %zu bytes between devices", size);
    tsr_status s = tsr__buffer_get(src_buf, src, tmp, size);
    if (s == TSR_OK)
        s = tsr__buffer_set(dst_buf, dst, tmp, size);
    tsr__free(tmp);
    return s;
}

tsr_status tsr__buffer_copy_staged(tsr_buffer *dst_buf, void *dst, tsr_buffer *src_buf, const void *src, size_t size,
                                   void *staging, size_t staging_size) {
    bool bounce = size && src_buf && dst_buf && src_buf->buft != dst_buf->buft && !src_buf->buft->is_host &&
                  !dst_buf->buft->is_host;
    if (!bounce || !staging || staging_size == 0)
        return tsr__buffer_copy(dst_buf, dst, src_buf, src, size);
    for (size_t done = 0; done < size;) {
        size_t n = size - done < staging_size ? size - done : staging_size;
        tsr_status s = tsr__buffer_get(src_buf, (const char *)src + done, staging, n);
        if (s == TSR_OK)
            s = tsr__buffer_set(dst_buf, (char *)dst + done, staging, n);
        if (s != TSR_OK)
            return s;
        done += n;
    }
    return TSR_OK;
}
