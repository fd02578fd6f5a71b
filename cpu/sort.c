/*
 * sort.c - CPU kernels of argsort and top_k (a MoE router's expert choice):
 * per row, indices ordered by value (NaN above every number), equal values
 * in index order. argsort is a stable merge sort; top_k keeps the k best
 * seen so far in a sorted list (an insertion pass, O(ne0 * k) at worst, no
 * sort of the row) while k is small, and takes the first k of the sort
 * otherwise, so it always equals argsort DESC's first k. Rows are split over
 * the threads.
 */
#include "cpu.h"

#include <math.h>

#define TOP_K_INSERT_MAX 32 /* larger k: sort the row */

/* a before b in descending order (NaN first); ties are decided by index. */
static inline bool above(float a, float b) {
    if (isnan(a))
        return !isnan(b);
    return !isnan(b) && a > b;
}

/* Stable merge sort of idx[0..n) by x[idx[]] (desc: largest first), tmp n ints. */
static void merge_sort(const float *x, int32_t *idx, int32_t *tmp, int64_t n, bool desc) {
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            const int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) {
                /* the right one goes first only when strictly before the left one */
                const bool right = desc ? above(x[idx[j]], x[idx[i]]) : above(x[idx[i]], x[idx[j]]);
                tmp[o++] = right ? idx[j++] : idx[i++];
            }
            while (i < mid) tmp[o++] = idx[i++];
            while (j < hi) tmp[o++] = idx[j++];
        }
        memcpy(idx, tmp, (size_t)n * sizeof *idx);
    }
}

/* The k largest of x[0..n), largest first, ties to the lower index. */
static void top_k_insert(const float *x, int64_t n, int32_t *out, int64_t k) {
    int64_t have = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t pos = have;
        while (pos > 0 && above(x[i], x[out[pos - 1]])) pos--;
        if (pos >= k)
            continue;
        const int64_t last = have < k ? have : k - 1;
        memmove(out + pos + 1, out + pos, (size_t)(last - pos) * sizeof *out);
        out[pos] = (int32_t)i;
        if (have < k)
            have++;
    }
}

static size_t row_scratch(int64_t ne0) {
    return tsr__pad((size_t)ne0 * (sizeof(float) + 2 * sizeof(int32_t)), TSR_ALIGN);
}

size_t tsr__cpu_argsort_work(const tsr_tensor *dst, int nth) { return (size_t)nth * row_scratch(dst->src[0]->ne[0]); }

void tsr__cpu_op_argsort(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *a = dst->src[0];
    const int64_t n = a->ne[0], k = dst->ne[0];
    const bool desc = dst->op == TSR_OP_TOP_K || dst->op_params[0] == TSR_SORT_DESC;
    float *x = (float *)((char *)p->work + (size_t)p->ith * row_scratch(n));
    int32_t *idx = (int32_t *)(x + n), *tmp = idx + n;
    int64_t r0, r1;
    tsr__cpu_split(tsr__nrows(a), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % a->ne[1], i2 = (r / a->ne[1]) % a->ne[2], i3 = r / (a->ne[1] * a->ne[2]);
        const char *src = (const char *)a->data + i1 * (int64_t)a->nb[1] + i2 * (int64_t)a->nb[2] +
                          i3 * (int64_t)a->nb[3];
        for (int64_t i = 0; i < n; i++) memcpy(&x[i], src + i * (int64_t)a->nb[0], sizeof(float));
        int32_t *out = (int32_t *)((char *)dst->data + i1 * (int64_t)dst->nb[1] + i2 * (int64_t)dst->nb[2] +
                                   i3 * (int64_t)dst->nb[3]);
        if (dst->op == TSR_OP_TOP_K && k <= TOP_K_INSERT_MAX) {
            top_k_insert(x, n, out, k);
            continue;
        }
        for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)i;
        merge_sort(x, idx, tmp, n, desc);
        memcpy(out, idx, (size_t)k * sizeof *out);
    }
}
