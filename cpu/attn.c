/*
 * attn.c - fused attention (ggml's flash_attn_ext semantics): for each query
 * row, one pass over the keys with an online softmax in F32, accumulating
 * V rows; K/V F32, F16 or Q8_0. The query row is converted once to K's dot
 * type so scores use the same dot kernels as matmul.
 */
#include "cpu.h"

#include <math.h>

static size_t per_thread(const tsr_tensor *dst) {
    const tsr_tensor *q = dst->src[0], *kt = dst->src[1], *v = dst->src[2];
    const tsr_type dt = tsr__cpu_kernels()->dot_type[kt->type];
    return tsr__pad(tsr_row_size(dt, q->ne[0]), TSR_ALIGN) + tsr__pad((size_t)q->ne[0] * 4, TSR_ALIGN) +
           2 * tsr__pad((size_t)v->ne[0] * 4, TSR_ALIGN);
}

size_t tsr__cpu_flash_attn_work(const tsr_tensor *dst, int nth) { return (size_t)nth * per_thread(dst); }

static void v_accumulate(const tsr_cpu_kernels *k, const tsr_tensor *v, const char *row, float w, float *acc,
                         float *tmp) {
    const int64_t n = v->ne[0];
    const float *x = (const float *)row;
    if (v->type != TSR_TYPE_F32) { /* F16 (F16C when the CPU has it) or Q8_0 */
        k->to_float[v->type](row, tmp, n);
        x = tmp;
    }
    for (int64_t i = 0; i < n; i++) acc[i] += w * x[i];
}

/* One query row against all keys of its KV head. */
static void attend_row(const tsr_compute_params *p, const tsr_tensor *dst, int64_t iq, int64_t h, int64_t s,
                       char *scratch) {
    const tsr_tensor *q = dst->src[0], *kt = dst->src[1], *v = dst->src[2], *mask = dst->src[3];
    const tsr_cpu_kernels *k = p->k;
    const float scale = tsr__get_f32_param(dst, 0);
    const int64_t hk = h / (q->ne[2] / kt->ne[2]);
    const tsr_type dt = k->dot_type[kt->type];
    char *qconv = scratch;
    float *qf = (float *)(scratch + tsr__pad(tsr_row_size(dt, q->ne[0]), TSR_ALIGN));
    float *acc = (float *)((char *)qf + tsr__pad((size_t)q->ne[0] * 4, TSR_ALIGN));
    float *tmp = (float *)((char *)acc + tsr__pad((size_t)v->ne[0] * 4, TSR_ALIGN));
    const char *qrow = (const char *)q->data + iq * (int64_t)q->nb[1] + h * (int64_t)q->nb[2] + s * (int64_t)q->nb[3];
    for (int64_t i = 0; i < q->ne[0]; i++) memcpy(&qf[i], qrow + i * (int64_t)q->nb[0], 4);
    k->from_float[dt](qf, qconv, q->ne[0]);
    memset(acc, 0, (size_t)v->ne[0] * 4);
    const char *mrow = mask ? (const char *)mask->data + iq * (int64_t)mask->nb[1] +
                                  (h % mask->ne[2]) * (int64_t)mask->nb[2] + (s % mask->ne[3]) * (int64_t)mask->nb[3]
                            : NULL;
    float M = -INFINITY, S = 0;
    for (int64_t j = 0; j < kt->ne[1]; j++) {
        const float mv = mrow ? tsr__cpu_load_f(mask->type, mrow + j * (int64_t)mask->nb[0]) : 0.0f;
        if (mv == -INFINITY) continue;
        float sc;
        k->vec_dot[kt->type](q->ne[0], &sc,
                             (const char *)kt->data + j * (int64_t)kt->nb[1] + hk * (int64_t)kt->nb[2] +
                                 s * (int64_t)kt->nb[3],
                             qconv);
        sc = sc * scale + mv;
        float w = 1.0f;
        if (sc > M) {
            const float ms = M == -INFINITY ? 0.0f : expf(M - sc);
            for (int64_t i = 0; i < v->ne[0]; i++) acc[i] *= ms;
            S *= ms;
            M = sc;
        } else {
            w = expf(sc - M);
        }
        v_accumulate(k, v,
                     (const char *)v->data + j * (int64_t)v->nb[1] + hk * (int64_t)v->nb[2] + s * (int64_t)v->nb[3],
                     w, acc, tmp);
        S += w;
    }
    float *out = (float *)((char *)dst->data + h * (int64_t)dst->nb[1] + iq * (int64_t)dst->nb[2] +
                           s * (int64_t)dst->nb[3]);
    const float inv = S > 0 ? 1.0f / S : 0.0f;
    for (int64_t i = 0; i < v->ne[0]; i++) out[i] = acc[i] * inv;
}

void tsr__cpu_op_flash_attn(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *q = dst->src[0];
    char *scratch = (char *)p->work + (size_t)p->ith * per_thread(dst);
    int64_t r0, r1;
    tsr__cpu_split(q->ne[1] * q->ne[2] * q->ne[3], p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t iq = r % q->ne[1], h = (r / q->ne[1]) % q->ne[2], s = r / (q->ne[1] * q->ne[2]);
        attend_row(p, dst, iq, h, s, scratch);
    }
}
