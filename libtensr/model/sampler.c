/* sampler.c - penalties, top-k, top-p, min-p, temperature and the seeded
 * draw of the model example, with llama.cpp's semantics (see sampler.h). */
#include "sampler.h"

#include "bridge.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct smp_sampler {
    smp_params p;
    int32_t n_vocab;
    smp_cand *cands; /* [n_vocab] */
    int32_t *counts; /* [n_vocab]: occurrences in the history window */
    int32_t *hist;   /* ring of the last repeat_last_n accepted ids */
    size_t n_hist, hist_pos;
    uint64_t rng;
    int32_t *bias_ids; /* [n_bias]: logit_bias, applied first */
    float *bias;
    size_t n_bias;
};

void tsr__smp_params_default(smp_params *p) {
    p->temp = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->freq_penalty = 0.0f;
    p->presence_penalty = 0.0f;
    p->min_keep = 1;
    p->seed = 0x5EED;
}

double tsr__smp_uniform(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static int cmp_cand(const void *a, const void *b) {
    const smp_cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

void tsr__smp_sort(smp_cands *c) {
    if (!c->sorted)
        qsort(c->data, c->size, sizeof *c->data, cmp_cand);
    c->sorted = 1;
}

/* A repeated token's logit is divided by the penalty when positive and
 * multiplied when not (so it always becomes less likely); frequency and
 * presence penalties are subtracted. */
void tsr__smp_apply_penalties(smp_cands *c, const int32_t *counts, float repeat, float freq, float present) {
    if (!counts || (repeat == 1.0f && freq == 0.0f && present == 0.0f))
        return;
    for (size_t i = 0; i < c->size; i++) {
        int32_t n = counts[c->data[i].id];
        if (n <= 0)
            continue;
        if (c->data[i].logit <= 0)
            c->data[i].logit *= repeat;
        else
            c->data[i].logit /= repeat;
        c->data[i].logit -= (float)n * freq + present;
    }
    c->sorted = 0;
}

/* Moves the k best candidates (cmp_cand's order) to a[0 .. k), in no
 * order: a quickselect with three-way partitions (O(n) on average), so a
 * top-k of a 50k-token vocabulary sorts only its k. */
static void select_best(smp_cand *a, size_t n, size_t k) {
    size_t lo = 0, hi = n; /* a[0 .. lo) beat a[lo ..); a[hi ..) lose to a[.. hi) */
    while (hi - lo > 1) {
        const smp_cand piv = a[lo + (hi - lo) / 2];
        size_t i = lo, j = lo, g = hi; /* [lo, i) better than piv, [i, j) equal, [g, hi) worse */
        while (j < g) {
            const int r = cmp_cand(&a[j], &piv);
            smp_cand t = a[j];
            if (r < 0) {
                a[j++] = a[i];
                a[i++] = t;
            } else if (r > 0) {
                a[j] = a[--g];
                a[g] = t;
            } else {
                j++;
            }
        }
        if (k <= i)
            hi = i;
        else if (k <= j)
            return;
        else
            lo = j;
    }
}

void tsr__smp_top_k(smp_cands *c, int32_t k) {
    if (k <= 0)
        return;
    if (!c->sorted && (size_t)k < c->size) {
        select_best(c->data, c->size, (size_t)k);
        c->size = (size_t)k;
    }
    tsr__smp_sort(c);
    if ((size_t)k < c->size)
        c->size = (size_t)k;
}

void tsr__smp_softmax(smp_cands *c) {
    float max_l = -INFINITY, sum = 0.0f;
    for (size_t i = 0; i < c->size; i++) max_l = c->data[i].logit > max_l ? c->data[i].logit : max_l;
    for (size_t i = 0; i < c->size; i++) {
        c->data[i].p = expf(c->data[i].logit - max_l);
        sum += c->data[i].p;
    }
    for (size_t i = 0; i < c->size; i++) c->data[i].p /= sum;
}

/* Keeps the most likely tokens whose probabilities add up to at least p. */
void tsr__smp_top_p(smp_cands *c, float p, size_t min_keep) {
    float cum = 0.0f;
    if (p >= 1.0f || c->size == 0)
        return;
    tsr__smp_softmax(c);
    tsr__smp_sort(c);
    for (size_t i = 0; i < c->size; i++) {
        cum += c->data[i].p;
        if (cum >= p && i + 1 >= min_keep) {
            c->size = i + 1;
            return;
        }
    }
}

/* Keeps the tokens at least p times as likely as the most likely one. */
void tsr__smp_min_p(smp_cands *c, float p, size_t min_keep) {
    size_t i = 1;
    float min_logit;
    if (p <= 0.0f || c->size == 0)
        return;
    tsr__smp_sort(c);
    min_logit = c->data[0].logit + logf(p);
    for (; i < c->size; i++)
        if (c->data[i].logit < min_logit && i >= min_keep)
            break;
    c->size = i;
}

/* temp <= 0 leaves only the first highest logit finite. */
void tsr__smp_temp(smp_cands *c, float temp) {
    if (c->size == 0)
        return;
    if (temp <= 0.0f) {
        size_t best = 0;
        for (size_t i = 1; i < c->size; i++)
            if (c->data[i].logit > c->data[best].logit)
                best = i;
        for (size_t i = 0; i < c->size; i++)
            if (i != best)
                c->data[i].logit = -INFINITY;
        return;
    }
    for (size_t i = 0; i < c->size; i++) c->data[i].logit /= temp;
}

tsr_status tsr__smp_new(const smp_params *p, int32_t n_vocab, smp_sampler **out) {
    smp_sampler *s;
    size_t n_hist;
    if (!out || n_vocab <= 0)
        return tsr__error(TSR_E_INVALID, "smp_new: %s", out ? "a vocabulary of no tokens" : "NULL out");
    *out = NULL;
    if (!(s = tsr__calloc(1, sizeof *s)))
        return tsr__error(TSR_E_NOMEM, "tsr_sampler_new: out of host memory");
    if (p)
        s->p = *p;
    else
        tsr__smp_params_default(&s->p);
    n_hist = s->p.repeat_last_n > 0 ? (size_t)s->p.repeat_last_n : 0;
    s->n_vocab = n_vocab;
    s->cands = tsr__malloc((size_t)n_vocab * sizeof *s->cands);
    s->counts = tsr__calloc((size_t)n_vocab, sizeof *s->counts);
    s->hist = tsr__malloc((n_hist + 1) * sizeof *s->hist);
    if (!s->cands || !s->counts || !s->hist) {
        tsr__smp_free(s);
        return tsr__error(TSR_E_NOMEM, "tsr_sampler_new: out of host memory for %d candidates", n_vocab);
    }
    tsr__smp_reset(s);
    *out = s;
    return TSR_OK;
}

void tsr__smp_free(smp_sampler *s) {
    if (!s)
        return;
    tsr__free(s->cands);
    tsr__free(s->counts);
    tsr__free(s->hist);
    tsr__free(s->bias_ids);
    tsr__free(s->bias);
    tsr__free(s);
}

void tsr__smp_reset(smp_sampler *s) {
    memset(s->counts, 0, (size_t)s->n_vocab * sizeof *s->counts);
    s->n_hist = s->hist_pos = 0;
    s->rng = s->p.seed;
}

void tsr__smp_accept(smp_sampler *s, int32_t id) {
    size_t cap = s->p.repeat_last_n > 0 ? (size_t)s->p.repeat_last_n : 0;
    if (cap == 0 || id < 0 || id >= s->n_vocab)
        return;
    if (s->n_hist == cap) /* the oldest leaves the window */
        s->counts[s->hist[s->hist_pos]]--;
    else
        s->n_hist++;
    s->hist[s->hist_pos] = id;
    s->counts[id]++;
    s->hist_pos = (s->hist_pos + 1) % cap;
}

static int32_t argmax(const float *logits, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

int32_t tsr__smp_sample(smp_sampler *s, const float *logits) {
    smp_cands c = {s->cands, (size_t)s->n_vocab, 0};
    const smp_params *p = &s->p;
    double u, cum = 0.0;

    for (int32_t i = 0; i < s->n_vocab; i++) s->cands[i] = (smp_cand){i, logits[i], 0.0f};
    for (size_t i = 0; i < s->n_bias; i++) s->cands[s->bias_ids[i]].logit += s->bias[i];
    tsr__smp_apply_penalties(&c, s->n_hist ? s->counts : NULL, p->repeat_penalty, p->freq_penalty, p->presence_penalty);
    if (p->temp <= 0.0f) { /* greedy, after the penalties: the highest logit, the lowest id of a tie */
        size_t best = 0;
        for (size_t i = 1; i < c.size; i++)
            if (cmp_cand(&c.data[i], &c.data[best]) < 0)
                best = i;
        return c.data[best].id;
    }
    tsr__smp_top_k(&c, p->top_k);
    tsr__smp_top_p(&c, p->top_p, p->min_keep);
    tsr__smp_min_p(&c, p->min_p, p->min_keep);
    tsr__smp_temp(&c, p->temp);
    tsr__smp_softmax(&c);
    u = tsr__smp_uniform(&s->rng);
    for (size_t i = 0; i < c.size; i++) {
        cum += c.data[i].p;
        if (u < cum)
            return c.data[i].id;
    }
    return c.size ? c.data[c.size - 1].id : argmax(logits, s->n_vocab);
}

tsr_status tsr__smp_set_bias(smp_sampler *s, const int32_t *ids, const float *bias, size_t n) {
    int32_t *ni = n ? tsr__malloc(n * sizeof *ni) : NULL;
    float *nb = n ? tsr__malloc(n * sizeof *nb) : NULL;
    if (n && (!ni || !nb)) {
        tsr__free(ni);
        tsr__free(nb);
        return tsr__error(TSR_E_NOMEM, "tsr_sampler_new: out of host memory for %zu biases", n);
    }
    if (n) {
        memcpy(ni, ids, n * sizeof *ni);
        memcpy(nb, bias, n * sizeof *nb);
    }
    tsr__free(s->bias_ids);
    tsr__free(s->bias);
    s->bias_ids = ni;
    s->bias = nb;
    s->n_bias = n;
    return TSR_OK;
}

void tsr__smp_biased(const smp_sampler *s, const float *logits, float *out) {
    memcpy(out, logits, (size_t)s->n_vocab * sizeof *out);
    for (size_t i = 0; i < s->n_bias; i++) out[s->bias_ids[i]] += s->bias[i];
}
