/*
 * kvseq.c - one sequence of the KV cache as a whole: its cells copied to
 * another sequence (a shared prompt prefix decoded once), and saved to or
 * restored from host memory (a prompt cache in RAM).
 *
 * A cell belongs to one sequence (kvcache.c), so a copy is a copy of the
 * data into new cells. The saved state is laid out independently of which
 * cells held the sequence: a header, the positions in increasing order,
 * then per layer K (per KV head, the cells' rows in position order) and V
 * (the same, or on the plain path, per row of the transposed tensor, the
 * cells' elements in position order). Runs of consecutive cells move as
 * one span, so a sequence decoded in one piece moves in a few calls per
 * head. Save and load walk the same order, each with its own cells.
 */
#include "attention/kvcache.h"

#define TSR_KVSEQ_MAGIC 0x5153564bu /* "KVSQ" */
#define TSR_KVSEQ_VERSION 1u

typedef struct kvseq_header {
    uint32_t magic, version;
    uint32_t n_layers, flash;
    uint32_t type_k, type_v;
    uint64_t n_cells;
    uint64_t cell_bytes; /* K and V bytes of one cell over all layers: the shapes, in one number */
} kvseq_header;

/* Bytes of one cell over every layer's K and V. */
static size_t cell_bytes(const tsr_kv_cache *c) {
    size_t n = 0;
    for (int il = 0; il < c->p.n_layers; il++) {
        n += (size_t)c->k[il].nb[1] * (size_t)c->k[il].ne[2];
        bool trans = !c->flash;
        n += trans ? (size_t)c->v[il].nb[0] * (size_t)c->v[il].ne[1] : (size_t)c->v[il].nb[1] * (size_t)c->v[il].ne[2];
    }
    return n;
}

static int cmp_by_pos(const void *a, const void *b, const int32_t *pos) {
    int32_t x = pos[*(const int64_t *)a], y = pos[*(const int64_t *)b];
    return (x > y) - (x < y);
}

/* Cells of seq with p0 <= pos < p1 (p1 < 0: no bound), in position order
 * (insertion sort on a copy is fine: n is a sequence's length, once). */
static int64_t seq_cells(const tsr_kv_cache *c, int seq, int32_t p0, int32_t p1, int64_t *cells) {
    int64_t n = 0;
    for (int64_t i = 0; i < c->p.n_ctx; i++) {
        int32_t pos = c->cell_pos[i];
        if (pos < 0 || c->cell_seq[i] != seq || pos < p0 || (p1 >= 0 && pos >= p1))
            continue;
        int64_t j = n++;
        while (j > 0 && cmp_by_pos(&cells[j - 1], &i, c->cell_pos) > 0) {
            cells[j] = cells[j - 1];
            j--;
        }
        cells[j] = i;
    }
    return n;
}

/* Moves the n cells' spans of one slice between the tensor and host
 * memory at *io: the slice starts at byte base, a cell is stride bytes
 * apart and width bytes long (width == stride for whole rows). */
static tsr_status move_slice(tsr_tensor *t, size_t base, size_t stride, size_t width, const int64_t *cells, int64_t n,
                             char **io, bool save) {
    for (int64_t j = 0; j < n;) {
        int64_t r = j + 1;
        while (r < n && cells[r] == cells[r - 1] + 1 && width == stride) r++;
        size_t off = base + (size_t)cells[j] * stride, bytes = (size_t)(r - j) * width;
        tsr_status s = save ? tsr_tensor_read(t, *io, off, bytes) : tsr_tensor_write(t, *io, off, bytes);
        if (s != TSR_OK)
            return s;
        *io += bytes;
        j = r;
    }
    return TSR_OK;
}

/* Every layer's K and V of the cells, in the saved order. */
static tsr_status move_cells(tsr_kv_cache *c, const int64_t *cells, int64_t n, char *io, bool save) {
    tsr_status s = TSR_OK;
    for (int il = 0; il < c->p.n_layers && s == TSR_OK; il++) {
        tsr_tensor *k = &c->k[il], *v = &c->v[il];
        for (int64_t h = 0; h < k->ne[2] && s == TSR_OK; h++)
            s = move_slice(k, (size_t)h * k->nb[2], k->nb[1], k->nb[1], cells, n, &io, save);
        if (c->flash)
            for (int64_t h = 0; h < v->ne[2] && s == TSR_OK; h++)
                s = move_slice(v, (size_t)h * v->nb[2], v->nb[1], v->nb[1], cells, n, &io, save);
        else /* transposed: a cell is one element of each row; consecutive cells are one span */
            for (int64_t r = 0; r < v->ne[1] && s == TSR_OK; r++)
                for (int64_t j = 0; j < n && s == TSR_OK;) {
                    int64_t e = j + 1;
                    while (e < n && cells[e] == cells[e - 1] + 1) e++;
                    size_t off = (size_t)r * v->nb[1] + (size_t)cells[j] * v->nb[0], bytes = (size_t)(e - j) * v->nb[0];
                    s = save ? tsr_tensor_read(v, io, off, bytes) : tsr_tensor_write(v, io, off, bytes);
                    io += bytes;
                    j = e;
                }
    }
    return s;
}

static size_t state_size(const tsr_kv_cache *c, int64_t n) {
    return sizeof(kvseq_header) + (size_t)n * sizeof(int32_t) + (size_t)n * cell_bytes(c);
}

tsr_status tsr_kv_cache_seq_save(const tsr_kv_cache *c, int seq, void *buf, size_t cap, size_t *size) {
    if (!c || !size || (cap > 0 && !buf))
        return tsr__error(TSR_E_INVALID, "tsr_kv_cache_seq_save: NULL %s", !c ? "cache" : !size ? "size" : "buf");
    if (seq < 0 || seq >= c->p.n_seq)
        return tsr__error(TSR_E_INVALID, "tsr_kv_cache_seq_save: sequence %d is not 0..%d", seq, c->p.n_seq - 1);
    int64_t *cells = tsr__malloc((size_t)c->p.n_ctx * sizeof *cells);
    if (!cells)
        return tsr__error(TSR_E_NOMEM, "tsr_kv_cache_seq_save: out of host memory");
    int64_t n = seq_cells(c, seq, 0, -1, cells);
    *size = state_size(c, n);
    tsr_status s = TSR_OK;
    if (*size > cap)
        s = tsr__error(TSR_E_RANGE, "tsr_kv_cache_seq_save: the state of sequence %d is %zu bytes, the buffer %zu", seq,
                       *size, cap);
    if (s == TSR_OK) {
        kvseq_header h = {TSR_KVSEQ_MAGIC, TSR_KVSEQ_VERSION,     (uint32_t)c->p.n_layers,
                          c->flash,        (uint32_t)c->p.type_k, (uint32_t)c->p.type_v,
                          (uint64_t)n,     cell_bytes(c)};
        char *p = buf;
        memcpy(p, &h, sizeof h);
        p += sizeof h;
        for (int64_t j = 0; j < n; j++, p += sizeof(int32_t)) memcpy(p, &c->cell_pos[cells[j]], sizeof(int32_t));
        s = move_cells((tsr_kv_cache *)c, cells, n, p, true);
    }
    tsr__free(cells);
    return s;
}

/* The header of a saved state, checked against this cache. */
static tsr_status check_state(const tsr_kv_cache *c, const void *buf, size_t size, kvseq_header *h) {
    if (size < sizeof *h)
        return tsr__error(TSR_E_MALFORMED, "tsr_kv_cache_seq_load: %zu bytes are no sequence state", size);
    memcpy(h, buf, sizeof *h);
    if (h->magic != TSR_KVSEQ_MAGIC || h->version != TSR_KVSEQ_VERSION)
        return tsr__error(TSR_E_MALFORMED, "tsr_kv_cache_seq_load: not a sequence state (magic %08x, version %u)",
                          h->magic, h->version);
    if (h->n_layers != (uint32_t)c->p.n_layers || h->flash != (uint32_t)c->flash ||
        h->type_k != (uint32_t)c->p.type_k || h->type_v != (uint32_t)c->p.type_v || h->cell_bytes != cell_bytes(c))
        return tsr__error(TSR_E_INVALID,
                          "tsr_kv_cache_seq_load: the state is of another cache (%u layers, %llu bytes a cell, "
                          "flash %u; this one: %d, %zu, %d)",
                          h->n_layers, (unsigned long long)h->cell_bytes, h->flash, c->p.n_layers, cell_bytes(c),
                          (int)c->flash);
    /* n_cells bounded by the bytes first (no overflow), then exact; more
     * cells than the cache has is TSR_E_FULL (put_cells), not malformed */
    if (h->n_cells > size / (sizeof(int32_t) + cell_bytes(c)) || size != state_size(c, (int64_t)h->n_cells))
        return tsr__error(TSR_E_MALFORMED, "tsr_kv_cache_seq_load: %zu bytes for %llu cells", size,
                          (unsigned long long)h->n_cells);
    const char *p = (const char *)buf + sizeof *h;
    for (uint64_t j = 0; j < h->n_cells; j++) {
        int32_t pos, prev = -1;
        memcpy(&pos, p + j * sizeof pos, sizeof pos);
        if (j > 0)
            memcpy(&prev, p + (j - 1) * sizeof pos, sizeof pos);
        if (pos < 0 || pos <= prev)
            return tsr__error(TSR_E_MALFORMED, "tsr_kv_cache_seq_load: cell %llu: position %d after %d",
                              (unsigned long long)j, pos, prev);
    }
    return TSR_OK;
}

/* Replaces sequence seq with n cells at positions pos[] whose data is at
 * data: TSR_E_FULL with nothing changed when the free cells and the
 * sequence's own are too few. */
static tsr_status put_cells(tsr_kv_cache *c, int seq, int64_t n, const char *pos, const char *data) {
    int64_t own = 0, free_cells = 0, c0, c1;
    tsr__kv_seq_range(c, seq, &c0, &c1);
    for (int64_t i = c0; i < c1; i++) {
        own += c->cell_pos[i] >= 0 && c->cell_seq[i] == seq;
        free_cells += c->cell_pos[i] < 0;
    }
    if (n > free_cells + own)
        return tsr__error(TSR_E_FULL, "%lld cells needed; %lld are free and sequence %d holds %lld", (long long)n,
                          (long long)free_cells, seq, (long long)own);
    int64_t *cells = tsr__malloc((size_t)(n > 0 ? n : 1) * sizeof *cells);
    if (!cells)
        return tsr__error(TSR_E_NOMEM, "out of host memory");
    tsr_kv_cache_remove(c, seq, 0, -1);
    int64_t found = 0;
    for (int64_t i = c0; i < c1 && found < n; i++)
        if (c->cell_pos[i] < 0)
            cells[found++] = i;
    tsr_status s = move_cells(c, cells, n, (char *)data, false);
    if (s == TSR_OK)
        for (int64_t j = 0; j < n; j++) {
            memcpy(&c->cell_pos[cells[j]], pos + (size_t)j * sizeof(int32_t), sizeof(int32_t));
            c->cell_seq[cells[j]] = seq;
        }
    c->n_used += s == TSR_OK ? n : 0;
    tsr__free(cells);
    return s;
}

tsr_status tsr_kv_cache_seq_load(tsr_kv_cache *c, int seq, const void *buf, size_t size) {
    if (!c || !buf)
        return tsr__error(TSR_E_INVALID, "tsr_kv_cache_seq_load: NULL %s", !c ? "cache" : "buf");
    if (seq < 0 || seq >= c->p.n_seq)
        return tsr__error(TSR_E_INVALID, "tsr_kv_cache_seq_load: sequence %d is not 0..%d", seq, c->p.n_seq - 1);
    kvseq_header h;
    tsr_status s = check_state(c, buf, size, &h);
    if (s != TSR_OK)
        return s;
    const char *pos = (const char *)buf + sizeof h;
    s = put_cells(c, seq, (int64_t)h.n_cells, pos, pos + h.n_cells * sizeof(int32_t));
    if (s != TSR_OK)
        tsr__error_prefix("tsr_kv_cache_seq_load: sequence %d", seq);
    return s;
}

tsr_status tsr_kv_cache_seq_copy(tsr_kv_cache *c, int src, int dst, int32_t p0, int32_t p1) {
    if (!c)
        return tsr__error(TSR_E_INVALID, "tsr_kv_cache_seq_copy: NULL cache");
    if (src < 0 || src >= c->p.n_seq || dst < 0 || dst >= c->p.n_seq)
        return tsr__error(TSR_E_INVALID, "tsr_kv_cache_seq_copy: sequences %d and %d must be 0..%d", src, dst,
                          c->p.n_seq - 1);
    if (src == dst)
        return TSR_OK;
    int64_t *cells = tsr__malloc((size_t)c->p.n_ctx * sizeof *cells);
    if (!cells)
        return tsr__error(TSR_E_NOMEM, "tsr_kv_cache_seq_copy: out of host memory");
    int64_t n = seq_cells(c, src, p0 < 0 ? 0 : p0, p1, cells);
    char *tmp = tsr__malloc((size_t)n * (sizeof(int32_t) + cell_bytes(c)) + 1);
    tsr_status s = tmp ? TSR_OK
                       : tsr__error(TSR_E_NOMEM, "tsr_kv_cache_seq_copy: out of host memory for %lld cells",
                                    (long long)n);
    if (s == TSR_OK) {
        for (int64_t j = 0; j < n; j++) memcpy(tmp + j * sizeof(int32_t), &c->cell_pos[cells[j]], sizeof(int32_t));
        s = move_cells(c, cells, n, tmp + (size_t)n * sizeof(int32_t), true);
    }
    if (s == TSR_OK && (s = put_cells(c, dst, n, tmp, tmp + (size_t)n * sizeof(int32_t))) != TSR_OK)
        tsr__error_prefix("tsr_kv_cache_seq_copy: %d to %d", src, dst);
    tsr__free(tmp);
    tsr__free(cells);
    return s;
}
