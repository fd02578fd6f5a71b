/* model-eval.c - a small driver of the model layer (public API only) for
 * tests/test-model.py: evaluates token ids given on the command line and
 * prints logits or greedy continuations as plain text, so the test can
 * compare them with llama.cpp's recorded answers.
 *
 *   model-eval [-t N] [-c N] [-ub N] [-fa 0|1] [-amb BYTES] [-ngl N] [-ot SPEC] MODEL < commands
 *
 * -ngl and -ot place the weights as tensr-run's flags do (the last N layers
 * on GPU devices, e.g. fake ones from TSR_FAKE_DEVICES; pattern=BUFT
 * overrides).
 * One command a line (the KV cache is emptied before each); the answer ends
 * with a line "end":
 *   logits ID...        every position: "pos v0 v1 ..."
 *   top K ID...         every position: "pos id:v id:v ..." (K best)
 *   greedy N EOS ID...  per step: "id1 logit1 id2 logit2", stopping after EOS
 *                       (-1: none; -2: the model's tokenizer.ggml.eos_token_id)
 *   placement           per weight "weight NAME BUFT BYTES", then per device
 *                       "plan DEVICE WEIGHTS KV_CACHE COMPUTE" (bytes)
 *   pick N S1..SN ID... every position: "pos lse argmax v(S1) .. v(SN)": the
 *                       log-sum-exp of the row, its argmax and the logits
 *                       of the N selected ids (for a KL against a reference
 *                       that kept a few ids per step, without printing a
 *                       large vocabulary whole)
 *
 * Exit status: 0 on success, 1 with one line on stderr on failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "libtensr.h"

static int die(const char *what, const char *detail)
{
    fprintf(stderr, "model-eval: %s: %s\n", what, detail);
    return 1;
}

/* Indices of the k largest values of row (ties: lower index first). */
static void top_k(const float *row, int64_t n, int k, int64_t *idx)
{
    for (int j = 0; j < k; j++)
        idx[j] = -1;
    for (int64_t i = 0; i < n; i++) {
        for (int j = 0; j < k; j++) {
            if (idx[j] < 0 || row[i] > row[idx[j]]) {
                memmove(idx + j + 1, idx + j, (size_t)(k - j - 1) * sizeof *idx);
                idx[j] = i;
                break;
            }
        }
    }
}

typedef struct eval {
    tsr_backend *be;
    tsr_model *m;
    tsr_session *s;
    int64_t n_vocab;
} eval;

static int print_logits(eval *e, const int32_t *ids, int64_t n, int k)
{
    int64_t nv = e->n_vocab, idx[64];
    int8_t *want = malloc((size_t)n);
    if (!want)
        return die("logits", "out of memory");
    memset(want, 1, (size_t)n);
    tsr_status st = tsr_session_decode(e->s, (size_t)n, ids, NULL, NULL, want);
    free(want);
    if (st != TSR_OK)
        return die("decode", tsr_last_error());
    for (int64_t p = 0; p < n; p++) {
        const float *row = tsr_session_logits(e->s, (size_t)p);
        printf("%lld", (long long)p);
        if (k <= 0) {
            for (int64_t i = 0; i < nv; i++)
                printf(" %.7g", row[i]);
        } else {
            top_k(row, nv, k, idx);
            for (int j = 0; j < k; j++)
                printf(" %lld:%.7g", (long long)idx[j], row[idx[j]]);
        }
        printf("\n");
    }
    return 0;
}

/* The pick command's rows: see the header. */
static int print_picked(eval *e, const int32_t *ids, int64_t n, const int32_t *sel, int n_sel)
{
    int8_t *want = malloc((size_t)n);
    if (!want)
        return die("pick", "out of memory");
    memset(want, 1, (size_t)n);
    tsr_status st = tsr_session_decode(e->s, (size_t)n, ids, NULL, NULL, want);
    free(want);
    if (st != TSR_OK)
        return die("decode", tsr_last_error());
    for (int64_t p = 0; p < n; p++) {
        const float *row = tsr_session_logits(e->s, (size_t)p);
        int64_t arg = 0;
        for (int64_t i = 1; i < e->n_vocab; i++)
            if (row[i] > row[arg])
                arg = i;
        double sum = 0;
        for (int64_t i = 0; i < e->n_vocab; i++)
            sum += exp((double)row[i] - row[arg]);
        printf("%lld %.10g %lld", (long long)p, row[arg] + log(sum), (long long)arg);
        for (int j = 0; j < n_sel; j++)
            printf(" %.7g", sel[j] >= 0 && sel[j] < e->n_vocab ? row[sel[j]] : 0.0f);
        printf("\n");
    }
    return 0;
}

static int greedy(eval *e, const int32_t *ids, int64_t n, int n_gen, int32_t eos)
{
    int64_t nv = e->n_vocab, idx[2];
    tsr_status st = tsr_session_decode(e->s, (size_t)n, ids, NULL, NULL, NULL);
    for (int i = 0; st == TSR_OK && i < n_gen; i++) {
        const float *logits = tsr_session_logits(e->s, n - 1);
        top_k(logits, nv, 2, idx);
        printf("%lld %.7g %lld %.7g\n", (long long)idx[0], logits[idx[0]], (long long)idx[1], logits[idx[1]]);
        fflush(stdout);
        int32_t tok = (int32_t)idx[0];
        if (tok == eos || i + 1 == n_gen)
            break;
        n = 1;
        st = tsr_session_decode(e->s, 1, &tok, NULL, NULL, NULL);
    }
    return st == TSR_OK ? 0 : die("decode", tsr_last_error());
}

static void print_placement(eval *e)
{
    tsr_backend *be = e->be;
    for (size_t i = 0; i < tsr_backend_n_weights(be); i++) {
        tsr_tensor *t = tsr_backend_weight_at(be, i);
        tsr_buffer_type *bt = tsr_tensor_buffer_type(t);
        printf("weight %s %s %zu\n", tsr_tensor_name(t), bt ? tsr_buffer_type_name(bt) : "-", tsr_tensor_nbytes(t));
    }
    for (size_t i = 0; i < tsr_backend_n_devices(be); i++) {
        size_t w = 0, kv = 0, c = 0;
        tsr_backend_memory_plan(be, i, &w, &kv, &c);
        printf("plan %s %zu %zu %zu\n", tsr_device_name(tsr_backend_device(be, i)), w, kv, c);
    }
}

/* Runs one command line; the cache is emptied first. */
static int run_line(eval *e, char *line)
{
    char *words[8192];
    int nw = 0;
    for (char *w = strtok(line, " \t\n"); w && nw < 8192; w = strtok(NULL, " \t\n"))
        words[nw++] = w;
    if (nw == 0)
        return 0;
    const char *mode = words[0];
    if (!strcmp(mode, "placement")) {
        print_placement(e);
        printf("end\n");
        fflush(stdout);
        return 0;
    }
    int n_fixed = !strcmp(mode, "logits") ? 1 : !strcmp(mode, "top") ? 2 : 3;
    if (!strcmp(mode, "pick"))
        n_fixed = nw > 1 && atoi(words[1]) >= 0 && atoi(words[1]) < nw ? 2 + atoi(words[1]) : nw;
    if (nw <= n_fixed)
        return die("usage", "logits ID... | top K ID... | greedy N EOS ID... | pick N S1..SN ID...");
    int64_t n = nw - n_fixed;
    int32_t ids[8192];
    for (int64_t i = 0; i < n; i++)
        ids[i] = atoi(words[n_fixed + i]);
    tsr_session_remove(e->s, -1, 0, -1);
    int rc;
    if (!strcmp(mode, "logits"))
        rc = print_logits(e, ids, n, 0);
    else if (!strcmp(mode, "top"))
        rc = print_logits(e, ids, n, atoi(words[1]) > 64 ? 64 : atoi(words[1]));
    else if (!strcmp(mode, "pick")) {
        static int32_t sel[8192];
        for (int j = 0; j < n_fixed - 2; j++)
            sel[j] = atoi(words[2 + j]);
        rc = print_picked(e, ids, n, sel, n_fixed - 2);
    }
    else if (!strcmp(mode, "greedy")) {
        int32_t eos = atoi(words[2]);
        if (eos == -2)
            eos = tsr_model_token_eos(e->m);
        rc = greedy(e, ids, n, atoi(words[1]), eos);
    }
    else
        rc = die("unknown command", mode);
    printf("end\n");
    fflush(stdout);
    return rc;
}

int main(int argc, char **argv)
{
    tsr_backend_params bp;
    tsr_session_params sp;
    tsr_backend_params_init(&bp, sizeof bp);
    tsr_session_params_init(&sp, sizeof sp);
    bp.n_threads = 2;
    bp.flash_attn = TSR_FLASH_ATTN_OFF; /* the references were recorded without it */
    sp.n_ctx = 512;
    tsr_load_params lp;
    tsr_load_params_init(&lp, sizeof lp);
    tsr_buft_override *ot = NULL;
    int a = 1;
    for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
        if (!strcmp(argv[a], "-t"))
            bp.n_threads = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "-c"))
            sp.n_ctx = atoll(argv[a + 1]);
        else if (!strcmp(argv[a], "-fa"))
            bp.flash_attn = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "-ub"))
            sp.n_ubatch = atoll(argv[a + 1]);
        else if (!strcmp(argv[a], "-amb"))
            bp.attn_max_batch = (size_t)atoll(argv[a + 1]);
        else if (!strcmp(argv[a], "-ngl"))
            lp.n_gpu_layers = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "-ot")) {
            tsr_buft_overrides_free(ot);
            if (tsr_buft_overrides_parse(argv[a + 1], &ot) != TSR_OK)
                return die("-ot", tsr_last_error());
        }
        else
            return die("usage", argv[a]);
    }
    if (argc - a != 1)
        return die("usage", "model-eval [-t N] [-c N] [-ub N] [-fa 0|1] [-amb BYTES] [-ngl N] [-ot SPEC] MODEL < commands");
    lp.overrides = ot;
    sp.n_batch = sp.n_ctx;               /* a whole command in one decode */
    sp.n_outputs_max = sp.n_ubatch > 0 ? sp.n_ubatch : 512; /* every row of a micro-batch */
    tsr_backend *be = NULL;
    eval e = {NULL, NULL, NULL, 0};
    int rc = 0;
    if (tsr_backend_new(&bp, &be) != TSR_OK)
        rc = die("backend", tsr_last_error());
    else if (tsr_model_load(e.be = be, argv[a], &lp, &e.m) != TSR_OK)
        rc = die("open", tsr_last_error());
    else if (tsr_session_new(e.m, &sp, &e.s) != TSR_OK)
        rc = die("session", tsr_last_error());
    e.n_vocab = e.m ? tsr_model_n_vocab(e.m) : 0;
    static char line[1 << 17];
    while (rc == 0 && fgets(line, sizeof line, stdin))
        rc = run_line(&e, line);
    tsr_session_free(e.s);
    tsr_model_free(e.m);
    tsr_backend_free(be);
    tsr_buft_overrides_free(ot);
    return rc;
}
