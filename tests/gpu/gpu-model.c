/*
 * gpu-model.c - for tests/gpu/check.sh: writes a llama-architecture model
 * with random weights through the project's GGUF writer (SmolLM2-135M's
 * shape by default: 576 wide, 30 layers, 9 heads, 3 KV heads, FFN 1536,
 * 49,152 tokens; F16 weights), since the real file is over the GPU
 * machine's carry limit. The tokenizer is a synthetic SPM vocabulary
 * (model-eval feeds token ids). Plain public API: builds with
 *   cc -I. tests/gpu/gpu-model.c .libs/libtensr.so -lm
 *
 *   gpu-model OUT.gguf [small [N_LAYER]]   (small: 64 wide, 2 layers, 512 tokens)
 *   gpu-model kl REF.txt OTHER.txt [LIMIT]
 *
 * kl compares two model-eval "logits" answers (tests/model-eval.c): per
 * position the softmax of each, KL(reference || other) in double, and the
 * top-1 agreement; prints "KL mean M max X top1 A/N" and exits 1 unless the
 * mean is below LIMIT (default 0.01).
 */
#include "libtensr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t seed = 12345;
static float frand(void) {
    seed = seed * 1664525u + 1013904223u;
    return (float)((seed >> 8) & 0xffffff) / 16777216.0f - 0.5f;
}

static int add(tsr_gguf_writer *w, const char *name, int64_t ne0, int64_t ne1, float scale, float offset, void **keep,
               int *n_keep) {
    const int64_t n = ne0 * (ne1 ? ne1 : 1), ne[2] = {ne0, ne1};
    const int f16 = ne1 > 0; /* matrices F16, vectors F32 */
    float *f = malloc((size_t)n * sizeof *f);
    void *data = malloc((size_t)n * (f16 ? 2 : 4));
    if (!f || !data)
        return 1;
    for (int64_t i = 0; i < n; i++) f[i] = offset + scale * frand();
    if (f16)
        tsr_quantize(TSR_TYPE_F16, f, data, n);
    else
        memcpy(data, f, (size_t)n * 4);
    free(f);
    keep[(*n_keep)++] = data;
    return tsr_gguf_writer_add_tensor(w, name, f16 ? TSR_TYPE_F16 : TSR_TYPE_F32, ne1 ? 2 : 1, ne, data) != TSR_OK;
}

/* One "pos v0 v1 ..." line into row (n values); 0 at "end" or EOF. */
static int read_row(FILE *f, double *row, int cap, int *n) {
    static char line[1 << 22];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "end", 3))
            return 0;
        char *p = line, *e;
        strtol(p, &e, 10);
        if (e == p)
            continue;
        *n = 0;
        for (p = e; *n < cap; p = e) {
            const double v = strtod(p, &e);
            if (e == p)
                break;
            row[(*n)++] = v;
        }
        return 1;
    }
    return 0;
}

static void softmax(const double *x, double *p, int n) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int i = 0; i < n; i++) s += p[i] = exp(x[i] - m);
    for (int i = 0; i < n; i++) p[i] /= s;
}

static int argmax(const double *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) b = x[i] > x[b] ? i : b;
    return b;
}

static int kl_main(int argc, char **argv) {
    FILE *fa = fopen(argv[2], "r"), *fb = fopen(argv[3], "r");
    const double limit = argc > 4 ? atof(argv[4]) : 0.01;
    enum { CAP = 1 << 18 };
    double *a = malloc(CAP * sizeof *a), *b = malloc(CAP * sizeof *b), *pa = malloc(CAP * sizeof *pa),
           *pb = malloc(CAP * sizeof *pb);
    if (!fa || !fb || !a || !b || !pa || !pb) {
        fprintf(stderr, "gpu-model kl: cannot read %s or %s\n", argv[2], argv[3]);
        return 1;
    }
    int na, nb, rows = 0, top = 0;
    double sum = 0, mx = 0;
    while (read_row(fa, a, CAP, &na)) {
        if (!read_row(fb, b, CAP, &nb) || nb != na) {
            fprintf(stderr, "gpu-model kl: position %d differs in length\n", rows);
            return 1;
        }
        softmax(a, pa, na);
        softmax(b, pb, nb);
        double kl = 0;
        for (int i = 0; i < na; i++)
            if (pa[i] > 0)
                kl += pa[i] * (log(pa[i]) - log(pb[i] > 1e-300 ? pb[i] : 1e-300));
        sum += kl;
        mx = kl > mx ? kl : mx;
        top += argmax(a, na) == argmax(b, nb);
        rows++;
    }
    const double mean = rows ? sum / rows : INFINITY;
    printf("KL mean %.3g max %.3g top1 %d/%d\n", mean, mx, top, rows);
    fclose(fa), fclose(fb), free(a), free(b), free(pa), free(pb);
    return rows > 0 && mean < limit ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "kl"))
        return kl_main(argc, argv);
    if (argc < 2) {
        fprintf(stderr, "usage: gpu-model OUT.gguf [small [N_LAYER]]\n");
        return 2;
    }
    const int small = argc > 2 && !strcmp(argv[2], "small");
    const uint32_t n_layer = argc > 3 ? (uint32_t)atoi(argv[3]) : small ? 2 : 30;
    const uint32_t n_embd = small ? 64 : 576, n_head = small ? 4 : 9,
                   n_head_kv = small ? 2 : 3, n_ff = small ? 128 : 1536, n_vocab = small ? 512 : 49152;
    const uint32_t head_dim = n_embd / n_head, ctx = 2048;
    const float eps = 1e-5f, base = 100000.0f;
    tsr_gguf_writer *w;
    if (tsr_gguf_writer_new(&w) != TSR_OK)
        return 1;
    int bad = 0;
    bad |= tsr_gguf_writer_set_str(w, "general.architecture", "llama") != TSR_OK;
    bad |= tsr_gguf_writer_set(w, "llama.context_length", TSR_GGUF_UINT32, &ctx) != TSR_OK;
    bad |= tsr_gguf_writer_set(w, "llama.embedding_length", TSR_GGUF_UINT32, &n_embd) != TSR_OK;
    bad |= tsr_gguf_writer_set(w, "llama.feed_forward_length", TSR_GGUF_UINT32, &n_ff) != TSR_OK;
    bad |= tsr_gguf_writer_set(w, "llama.block_count", TSR_GGUF_UINT32, &n_layer) != TSR_OK;
    bad |= tsr_gguf_writer_set(w, "llama.attention.head_count", TSR_GGUF_UINT32, &n_head) != TSR_OK;
    bad |= tsr_gguf_writer_set(w, "llama.attention.head_count_kv", TSR_GGUF_UINT32, &n_head_kv) != TSR_OK;
    bad |= tsr_gguf_writer_set(w, "llama.attention.layer_norm_rms_epsilon", TSR_GGUF_FLOAT32, &eps) != TSR_OK;
    bad |= tsr_gguf_writer_set(w, "llama.rope.freq_base", TSR_GGUF_FLOAT32, &base) != TSR_OK;
    bad |= tsr_gguf_writer_set(w, "llama.rope.dimension_count", TSR_GGUF_UINT32, &head_dim) != TSR_OK;
    bad |= tsr_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama") != TSR_OK;
    char **toks = malloc(n_vocab * sizeof *toks);
    float *scores = malloc(n_vocab * sizeof *scores);
    int32_t *types = malloc(n_vocab * sizeof *types);
    for (uint32_t i = 0; i < n_vocab; i++) {
        toks[i] = malloc(16);
        if (i < 3)
            snprintf(toks[i], 16, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
        else if (i < 3 + 256)
            snprintf(toks[i], 16, "<0x%02X>", i - 3);
        else
            snprintf(toks[i], 16, "t%u", i);
        scores[i] = -(float)i;
        types[i] = i < 3 ? (i == 0 ? 2 : 3) : i < 3 + 256 ? 6 : 1;
    }
    bad |= tsr_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, n_vocab) != TSR_OK;
    bad |= tsr_gguf_writer_set_arr(w, "tokenizer.ggml.scores", TSR_GGUF_FLOAT32, scores, n_vocab) != TSR_OK;
    bad |= tsr_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", TSR_GGUF_INT32, types, n_vocab) != TSR_OK;
    void **keep = malloc((size_t)(16 * n_layer + 8) * sizeof *keep);
    int n_keep = 0;
    const float s = 0.08f;
    bad |= add(w, "token_embd.weight", n_embd, n_vocab, 1.0f, 0.0f, keep, &n_keep);
    bad |= add(w, "output_norm.weight", n_embd, 0, 0.2f, 1.0f, keep, &n_keep);
    for (uint32_t l = 0; l < n_layer && !bad; l++) {
        char name[64];
        const int64_t nk = (int64_t)n_head_kv * head_dim;
        struct {
            const char *s;
            int64_t ne0, ne1;
        } t[] = {{"attn_norm.weight", n_embd, 0},        {"attn_q.weight", n_embd, n_embd},
                 {"attn_k.weight", n_embd, nk},          {"attn_v.weight", n_embd, nk},
                 {"attn_output.weight", n_embd, n_embd}, {"ffn_norm.weight", n_embd, 0},
                 {"ffn_gate.weight", n_embd, n_ff},      {"ffn_up.weight", n_embd, n_ff},
                 {"ffn_down.weight", n_ff, n_embd}};
        for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
            snprintf(name, sizeof name, "blk.%u.%s", l, t[i].s);
            bad |= add(w, name, t[i].ne0, t[i].ne1, t[i].ne1 ? s : 0.2f, t[i].ne1 ? 0.0f : 1.0f, keep, &n_keep);
        }
    }
    if (!bad && tsr_gguf_writer_write_file(w, argv[1]) != TSR_OK)
        bad = 1;
    if (bad)
        fprintf(stderr, "gpu-model: %s\n", tsr_last_error());
    tsr_gguf_writer_free(w);
    for (int i = 0; i < n_keep; i++) free(keep[i]);
    for (uint32_t i = 0; i < n_vocab; i++) free(toks[i]);
    free(keep), free(toks), free(scores), free(types);
    return bad;
}
