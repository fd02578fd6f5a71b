/* sampler.h - choosing the next token from logits (libtensr/model).
 *
 * llama.cpp's semantics and default order: repetition penalties (over the
 * last repeat_last_n accepted tokens), top-k, top-p, min-p, temperature,
 * then a draw from the softmax with a seeded RNG. temp <= 0 is greedy
 * (argmax, first index on ties). The RNG is our own (splitmix64), so draws
 * are reproducible for a seed but differ from llama.cpp's mt19937 draws.
 *
 * The filter steps are exposed on a candidate array so they can be tested
 * and combined. A sampler is not thread-safe; use one per sequence. */
#ifndef TSR_MODEL_SAMPLER_H
#define TSR_MODEL_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "libtensr.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct smp_params {
    float temp;             /* <= 0: greedy (default 0.8) */
    int32_t top_k;          /* <= 0: off (default 40) */
    float top_p;            /* >= 1: off (default 0.95) */
    float min_p;            /* <= 0: off (default 0.05) */
    float repeat_penalty;   /* 1: off (default 1.0) */
    int32_t repeat_last_n;  /* tokens of history for the penalties (default 64) */
    float freq_penalty;     /* default 0 */
    float presence_penalty; /* default 0 */
    size_t min_keep;        /* top-p / min-p keep at least this many (default 1) */
    uint64_t seed;          /* default 0x5EED */
} smp_params;

void tsr__smp_params_default(smp_params *p);

/* One candidate token. */
typedef struct smp_cand {
    int32_t id;
    float logit;
    float p;
} smp_cand;

typedef struct smp_cands {
    smp_cand *data;
    size_t size;
    int sorted; /* data sorted by logit, descending (ties: lower id first) */
} smp_cands;

/* The steps, in llama.cpp's semantics. counts[id] is how often id occurs in
 * the recent history (NULL: no history). */
void tsr__smp_apply_penalties(smp_cands *c, const int32_t *counts, float repeat, float freq, float present);
void tsr__smp_sort(smp_cands *c);
void tsr__smp_top_k(smp_cands *c, int32_t k);
void tsr__smp_softmax(smp_cands *c); /* sets p (does not sort) */
void tsr__smp_top_p(smp_cands *c, float p, size_t min_keep);
void tsr__smp_min_p(smp_cands *c, float p, size_t min_keep);
void tsr__smp_temp(smp_cands *c, float temp);

typedef struct smp_sampler smp_sampler;

/* p may be NULL (defaults). */
tsr_status tsr__smp_new(const smp_params *p, int32_t n_vocab, smp_sampler **out);
void tsr__smp_free(smp_sampler *s); /* NULL is a no-op */
/* Forgets the history and restarts the RNG from the seed. */
void tsr__smp_reset(smp_sampler *s);
/* Picks a token from logits[n_vocab]. Does not accept it: call tsr__smp_accept
 * with the token actually used (it feeds the repetition penalties). */
int32_t tsr__smp_sample(smp_sampler *s, const float *logits);
void tsr__smp_accept(smp_sampler *s, int32_t id);
/* Sets the biases added to the logits before every other step (copied;
 * ids within the vocabulary, checked by the caller). */
tsr_status tsr__smp_set_bias(smp_sampler *s, const int32_t *ids, const float *bias, size_t n);
/* logits[i] plus its bias (the row the sampler starts from) into out[n_vocab]. */
void tsr__smp_biased(const smp_sampler *s, const float *logits, float *out);

/* Next uniform number in [0, 1) of a splitmix64 state (exposed for tests). */
double tsr__smp_uniform(uint64_t *state);

#ifdef __cplusplus
}
#endif

#endif
