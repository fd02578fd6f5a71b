/*
 * place.c - backend weights: declaration, placement on devices and
 * allocation (one buffer per device), lookup by name.
 */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>

void tsr_load_params_init(tsr_load_params *p, size_t size) {
    if (!p || size < sizeof(size_t))
        return;
    tsr_load_params d = {0};
    d.size = size < sizeof d ? size : sizeof d;
    d.n_gpu_layers = 0;
    d.main_gpu = 0;
    d.use_mmap = 0;
    d.n_io_threads = 0;
    memcpy(p, &d, d.size);
    p->size = size;
}

void tsr__load_params_read(const tsr_load_params *in, tsr_load_params *out) {
    tsr_load_params_init(out, sizeof *out);
    if (in && in->size >= sizeof(size_t))
        TSR_PARAMS_COPY(out, in);
    out->size = sizeof *out;
}

static int tsr_layer_of(const char *name) {
    if (strncmp(name, "blk.", 4) != 0)
        return -1;
    char *end;
    long il = strtol(name + 4, &end, 10);
    return end != name + 4 && *end == '.' && il >= 0 && il < 100000 ? (int)il : -1;
}

tsr_status tsr_backend_declare_weight(tsr_backend *b, const char *name, tsr_type type, int n_dims, const int64_t *ne) {
    if (!b || !name || !ne)
        return tsr__error(TSR_E_INVALID, "tsr_backend_declare_weight: NULL %s", !b ? "backend" : !name ? "name" : "shape");
    if (strlen(name) >= TSR_MAX_NAME || name[0] == '\0')
        return tsr__error(TSR_E_INVALID, "tsr_backend_declare_weight: name '%s' is empty or longer than %d bytes", name,
                          TSR_MAX_NAME - 1);
    if (tsr_backend_weight(b, name))
        return tsr__error(TSR_E_INVALID, "tsr_backend_declare_weight: weight '%s' exists already", name);
    tsr_clear_error();
    const tsr_type_traits *tr = tsr__type_traits(type);
    if (!tr || tr->block_size == 0)
        return tsr__error(TSR_E_UNSUPPORTED, "weight '%s': unknown type %d", name, (int)type);
    if (n_dims < 1 || n_dims > TSR_MAX_DIMS)
        return tsr__error(TSR_E_INVALID, "weight '%s': n_dims %d is not 1..4", name, n_dims);
    tsr_tensor *t = tsr__calloc(1, sizeof *t);
    if (!t)
        return tsr__error(TSR_E_NOMEM, "out of host memory declaring weight '%s'", name);
    t->type = type;
    t->n_dims = n_dims;
    t->device_id = -1;
    t->flags = TSR_FLAG_WEIGHT;
    snprintf(t->name, sizeof t->name, "%s", name);
    for (int i = 0; i < TSR_MAX_DIMS; i++) {
        t->ne[i] = i < n_dims ? ne[i] : 1;
        if (t->ne[i] < 0) {
            tsr__free(t);
            return tsr__error(TSR_E_INVALID, "weight '%s': dimension %d is negative", name, i);
        }
    }
    if (t->ne[0] % tr->block_size != 0 || !tsr__set_contiguous_strides(t)) {
        tsr__free(t);
        return tsr__error(TSR_E_INVALID, "weight '%s': ne[0] %lld is not a multiple of %s's block or the size overflows",
                          name, (long long)ne[0], tr->name);
    }
    tsr_weight_set *w = &b->weights;
    if (w->n == w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 64;
        tsr_tensor **p = tsr__realloc(w->tensors, nc * sizeof *p);
        if (!p) {
            tsr__free(t);
            return tsr__error(TSR_E_NOMEM, "out of host memory declaring weight '%s'", name);
        }
        w->tensors = p;
        w->cap = nc;
    }
    w->tensors[w->n++] = t;
    int il = tsr_layer_of(name);
    if (il + 1 > b->n_layers)
        b->n_layers = il + 1;
    return TSR_OK;
}

tsr_tensor *tsr_backend_weight(const tsr_backend *b, const char *name) {
    if (!b || !name) {
        tsr__error(TSR_E_INVALID, "tsr_backend_weight: NULL %s", b ? "name" : "backend");
        return NULL;
    }
    for (size_t i = 0; i < b->weights.n; i++)
        if (strcmp(b->weights.tensors[i]->name, name) == 0)
            return b->weights.tensors[i];
    tsr__error(TSR_E_NOT_FOUND, "no weight named '%s'", name);
    return NULL;
}

tsr_tensor *tsr_backend_weight_on(const tsr_backend *b, const char *name, const tsr_device *dev) {
    (void)dev;
    return tsr_backend_weight(b, name);
}

size_t tsr_backend_n_weights(const tsr_backend *b) { return b ? b->weights.n : 0; }

tsr_tensor *tsr_backend_weight_at(const tsr_backend *b, size_t i) {
    return b && i < b->weights.n ? b->weights.tensors[i] : NULL;
}

int tsr_backend_n_layers(const tsr_backend *b) { return b ? b->n_layers : 0; }

tsr_buffer_type *tsr_backend_layer_buffer_type(const tsr_backend *b, int il) {
    if (!b || il < 0 || il >= b->n_layers || !b->layer_buft)
        return NULL;
    return b->layer_buft[il];
}

static tsr_status tsr_add_weight_buffer(tsr_backend *b, tsr_buffer *buf) {
    tsr_weight_set *w = &b->weights;
    if (w->n_buffers == w->cap_buffers) {
        size_t nc = w->cap_buffers ? w->cap_buffers * 2 : 8;
        tsr_buffer **p = tsr__realloc(w->buffers, nc * sizeof *p);
        if (!p)
            return tsr__error(TSR_E_NOMEM, "out of host memory");
        w->buffers = p;
        w->cap_buffers = nc;
    }
    w->buffers[w->n_buffers++] = buf;
    return TSR_OK;
}

/* Every unplaced weight goes to the CPU in one buffer. With plan_only the
 * plan (per-device bytes, each weight's device_id) is made and nothing is
 * allocated: the loader relies on this to find the CPU-resident weights it
 * can map. */
tsr_status tsr__place_weights(tsr_backend *b, const tsr_load_params *p) {
    size_t cpu = tsr__backend_cpu_index(b), total = 0;
    for (size_t i = 0; i < b->weights.n; i++)
        if (!b->weights.tensors[i]->buffer)
            total += tsr__pad(tsr_tensor_nbytes(b->weights.tensors[i]), TSR_ALIGN);
    if (p && p->plan_only) {
        for (size_t i = 0; i < b->weights.n; i++)
            if (!b->weights.tensors[i]->buffer)
                b->weights.tensors[i]->device_id = (int)cpu;
        b->plan_weights[cpu] += total;
        return TSR_OK;
    }
    if (total == 0)
        return TSR_OK;
    tsr_buffer *buf = NULL;
    tsr_status s = tsr_buffer_alloc(b->devices[cpu]->buft, total, &buf);
    if (s != TSR_OK)
        return s;
    if ((s = tsr_add_weight_buffer(b, buf)) != TSR_OK) {
        tsr_buffer_free(buf);
        return s;
    }
    size_t off = 0;
    for (size_t i = 0; i < b->weights.n; i++) {
        tsr_tensor *t = b->weights.tensors[i];
        if (t->buffer)
            continue;
        t->buffer = buf;
        t->data = (char *)buf->base + off;
        t->device_id = (int)cpu;
        off += tsr__pad(tsr_tensor_nbytes(t), TSR_ALIGN);
    }
    b->plan_weights[cpu] += total;
    return TSR_OK;
}

tsr_status tsr_backend_place_weights(tsr_backend *b, const tsr_load_params *p) {
    if (!b)
        return tsr__error(TSR_E_INVALID, "tsr_backend_place_weights: NULL backend");
    if (p && p->size < sizeof(size_t))
        return tsr__error(TSR_E_INVALID, "tsr_backend_place_weights: params.size is %zu; call tsr_load_params_init", p->size);
    tsr_load_params prm;
    tsr__load_params_read(p, &prm);
    return tsr__place_weights(b, &prm);
}

void tsr__weights_free(tsr_backend *b) {
    for (size_t i = 0; i < b->weights.n; i++)
        tsr__free(b->weights.tensors[i]);
    for (size_t i = 0; i < b->weights.n_buffers; i++)
        tsr_buffer_free(b->weights.buffers[i]);
    tsr__free(b->weights.tensors);
    tsr__free(b->weights.buffers);
    memset(&b->weights, 0, sizeof b->weights);
}
