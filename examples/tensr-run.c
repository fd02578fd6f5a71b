/* tensr-run.c - generates text from a llama/mistral GGUF model with
 * libtensr (the model in examples/model/llama.c; tokenizer, sampler and
 * chat templates beside it), or measures perplexity on a text file.
 *
 * Flags follow llama.cpp's (tensr-run -h). Tokens are printed as they come;
 * the load progress bar goes to stderr when it is a terminal; speeds are
 * reported at the end. Every error is one line on stderr and a non-zero
 * exit status. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "libtensr.h"
#include "model/chat.h"
#include "model/llama.h"
#include "model/sampler.h"
#include "model/tokenizer.h"

#define DEFAULT_MODEL "SmolLM2-135M-Instruct.Q4_1.gguf"
#define MAX_GPUS 16

typedef struct opts {
    const char *model, *prompt, *prompt_file, *ppl_file, *overrides, *devices;
    int cap_ctx, n_predict, n_threads, n_gpu_layers, main_gpu, flash_attn, chat, verbose, list_devices, n_chunks;
    int mmap;
    int64_t n_ctx, n_batch, n_ubatch;
    size_t amb;
    float tensor_split[MAX_GPUS];
    int n_split;
    smp_params smp;
} opts;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int die(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "tensr-run: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    return 1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tensr-run [options]\n"
            "  -m, --model FILE          GGUF model (default: the cached %s)\n"
            "  -p, --prompt TEXT         prompt (default: \"Once upon a time\")\n"
            "  -f, --file FILE           read the prompt from FILE\n"
            "  -n, --n-predict N         tokens to generate (default 128; -1 = until the end or a full context)\n"
            "  -c, --ctx-size N          context size (default 4096 or the model's, if smaller; 0 = the model's)\n"
            "  -b, --batch-size N        logical batch size (default 2048)\n"
            "  -ub, --ubatch-size N      micro-batch size (default 512)\n"
            "  -t, --threads N           CPU threads (default: all cores)\n"
            "  -ngl, --n-gpu-layers N    layers on GPUs (default 0; -1 = all)\n"
            "  -mg, --main-gpu N         main GPU\n"
            "  -ts, --tensor-split A,B   split of layers across GPUs\n"
            "  -ot, --override-tensor P=BUFT[,...]  place tensors matching regex P on buffer type BUFT\n"
            "  -dev, --device A,B        devices to use (default: all)\n"
            "  -fa, --flash-attn [on|off|auto]  flash attention (default auto; the flag alone: on)\n"
            "  -amb, --attn-max-batch N  attention max batch, MiB of K*Q per step (default 0 = no limit)\n"
            "  --temp T                  temperature (default 0.8; 0 = greedy)\n"
            "  --top-k N, --top-p P, --min-p P   sampling filters (defaults 40, 0.95, 0.05)\n"
            "  --repeat-penalty R, --repeat-last-n N   repetition penalty (default 1.0 = off; 64)\n"
            "  -s, --seed N              sampling seed\n"
            "  --chat                    format the prompt with the model's chat template\n"
            "  --perplexity FILE         perplexity of FILE (chunks of -c tokens, default 512)\n"
            "  --chunks N                at most N perplexity chunks\n"
            "  --list-devices            list devices and exit\n"
            "  --mmap, --no-mmap         map CPU-resident weights from the file, or copy them (default)\n"
            "  -v, --verbose             log at debug level (memory plan, devices, overrides)\n"
            "  -h, --help                this help\n",
            DEFAULT_MODEL);
}

/* ---- arguments ------------------------------------------------------------ */

static int parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "tensr-run: %s: '%s' is not an integer in %lld..%lld\n", flag, s, lo, hi);
        return 1;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *flag, const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v)) {
        fprintf(stderr, "tensr-run: %s: '%s' is not a number\n", flag, s);
        return 1;
    }
    *out = v;
    return 0;
}

static int parse_split(const char *s, opts *o)
{
    char buf[512], *save = NULL;
    snprintf(buf, sizeof buf, "%s", s);
    o->n_split = 0;
    for (char *t = strtok_r(buf, ",/", &save); t; t = strtok_r(NULL, ",/", &save)) {
        if (o->n_split == MAX_GPUS)
            return die("-ts: more than 16 values in '%s'%s", s, "");
        if (parse_float("-ts", t, &o->tensor_split[o->n_split]) || o->tensor_split[o->n_split] < 0)
            return 1;
        o->n_split++;
    }
    return 0;
}

/* on/off/auto as a tsr_flash_attn_t; -2 for another word. */
static int parse_fa_word(const char *s)
{
    if (!strcmp(s, "on") || !strcmp(s, "1") || !strcmp(s, "true"))
        return TSR_FLASH_ATTN_ON;
    if (!strcmp(s, "off") || !strcmp(s, "0") || !strcmp(s, "false"))
        return TSR_FLASH_ATTN_OFF;
    if (!strcmp(s, "auto") || !strcmp(s, "-1"))
        return TSR_FLASH_ATTN_AUTO;
    return -2;
}

static int parse_fa(const char *s, int *out)
{
    *out = parse_fa_word(s);
    return *out == -2 ? die("-fa: '%s' is not on, off or auto%s", s, "") : 0;
}

static int is(const char *a, const char *s1, const char *s2) { return !strcmp(a, s1) || (s2 && !strcmp(a, s2)); }

/* Flags that take a number or a string; returns 0 done, 1 error, -1 unknown. */
static int parse_value_flag(opts *o, const char *a, const char *v)
{
    long long n;
    if (is(a, "-m", "--model")) o->model = v;
    else if (is(a, "-p", "--prompt")) o->prompt = v;
    else if (is(a, "-f", "--file")) o->prompt_file = v;
    else if (is(a, "-ot", "--override-tensor")) o->overrides = v;
    else if (is(a, "-dev", "--device")) o->devices = v;
    else if (is(a, "--perplexity", NULL)) o->ppl_file = v;
    else if (is(a, "-ts", "--tensor-split")) return parse_split(v, o);
    else if (is(a, "-fa", "--flash-attn")) return parse_fa(v, &o->flash_attn);
    else if (is(a, "--temp", NULL)) return parse_float(a, v, &o->smp.temp);
    else if (is(a, "--top-p", NULL)) return parse_float(a, v, &o->smp.top_p);
    else if (is(a, "--min-p", NULL)) return parse_float(a, v, &o->smp.min_p);
    else if (is(a, "--repeat-penalty", NULL)) return parse_float(a, v, &o->smp.repeat_penalty);
    else if (is(a, "-n", "--n-predict")) { if (parse_int(a, v, -1, 1 << 30, &n)) return 1; o->n_predict = (int)n; }
    else if (is(a, "-c", "--ctx-size")) { if (parse_int(a, v, 0, 1 << 30, &n)) return 1; o->n_ctx = n; }
    else if (is(a, "-b", "--batch-size")) { if (parse_int(a, v, 1, 1 << 30, &n)) return 1; o->n_batch = n; }
    else if (is(a, "-ub", "--ubatch-size")) { if (parse_int(a, v, 1, 1 << 30, &n)) return 1; o->n_ubatch = n; }
    else if (is(a, "-t", "--threads")) { if (parse_int(a, v, 1, 1024, &n)) return 1; o->n_threads = (int)n; }
    else if (is(a, "-ngl", "--n-gpu-layers")) { if (parse_int(a, v, -1, 1 << 20, &n)) return 1; o->n_gpu_layers = (int)n; }
    else if (is(a, "-mg", "--main-gpu")) { if (parse_int(a, v, 0, MAX_GPUS - 1, &n)) return 1; o->main_gpu = (int)n; }
    else if (is(a, "-amb", "--attn-max-batch")) { if (parse_int(a, v, 0, 1 << 20, &n)) return 1; o->amb = (size_t)n << 20; }
    else if (is(a, "--top-k", NULL)) { if (parse_int(a, v, 0, 1 << 30, &n)) return 1; o->smp.top_k = (int32_t)n; }
    else if (is(a, "--repeat-last-n", NULL)) { if (parse_int(a, v, 0, 1 << 20, &n)) return 1; o->smp.repeat_last_n = (int32_t)n; }
    else if (is(a, "-s", "--seed")) { if (parse_int(a, v, 0, INT64_MAX, &n)) return 1; o->smp.seed = (uint64_t)n; }
    else if (is(a, "--chunks", NULL)) { if (parse_int(a, v, 1, 1 << 30, &n)) return 1; o->n_chunks = (int)n; }
    else return -1;
    return 0;
}

/* Returns 0 to go on, 1 on an error, 2 after -h. */
static int parse_args(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->n_ctx = -1;
    o->n_batch = 2048;
    o->n_ubatch = 512;
    o->flash_attn = TSR_FLASH_ATTN_AUTO;
    smp_params_default(&o->smp);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (is(a, "-h", "--help")) {
            usage(stdout);
            return 2;
        }
        if (is(a, "-fa", "--flash-attn") && (i + 1 >= argc || parse_fa_word(argv[i + 1]) == -2)) {
            o->flash_attn = TSR_FLASH_ATTN_ON; /* the flag alone, as in llama.cpp */
            continue;
        }
        if (is(a, "--chat", NULL)) o->chat = 1;
        else if (is(a, "-v", "--verbose")) o->verbose = 1;
        else if (is(a, "--list-devices", NULL)) o->list_devices = 1;
        else if (is(a, "--mmap", NULL)) o->mmap = 1;
        else if (is(a, "--no-mmap", NULL)) o->mmap = 0;
        else {
            if (i + 1 >= argc) {
                int known = parse_value_flag(o, a, "0") != -1;
                return known ? die("%s needs a value%s", a, "") : die("unknown option '%s' (see tensr-run -h)%s", a, "");
            }
            int r = parse_value_flag(o, a, argv[i + 1]);
            if (r < 0)
                return die("unknown option '%s' (see tensr-run -h)%s", a, "");
            if (r > 0)
                return 1;
            i++;
        }
    }
    return 0;
}

/* ---- devices, backend, loading -------------------------------------------- */

static int list_devices(void)
{
    printf("available devices (backends: %s):\n", tsr_backends_available());
    for (size_t i = 0; i < tsr_device_count(); i++) {
        tsr_device *d = tsr_device_get(i);
        size_t free_b = 0, total = 0;
        tsr_device_memory(d, &free_b, &total);
        tsr_buffer_type *host = tsr_device_host_buffer_type(d);
        printf("  %-8s %s (%zu MiB, %zu MiB free); buffer types for -ot: %s%s%s\n", tsr_device_name(d),
               tsr_device_description(d), total >> 20, free_b >> 20,
               tsr_buffer_type_name(tsr_device_buffer_type(d)), host ? ", " : "", host ? tsr_buffer_type_name(host) : "");
    }
    return 0;
}

/* -dev A,B -> NULL-terminated device list in devs (MAX_GPUS + 2 entries). */
static int pick_devices(const char *spec, tsr_device **devs)
{
    char buf[512], *save = NULL;
    int n = 0;
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        tsr_device *d = tsr_device_by_name(t);
        if (!d)
            return die("-dev: no device '%s' (see --list-devices)%s", t, "");
        if (n == MAX_GPUS + 1)
            return die("-dev: too many devices in '%s'%s", spec, "");
        devs[n++] = d;
    }
    devs[n] = NULL;
    return 0;
}

static int progress(uint64_t done, uint64_t total, void *user)
{
    int *last = user, pct = total ? (int)(100 * done / total) : 100;
    if (pct == *last)
        return 0;
    *last = pct;
    char bar[41];
    for (int i = 0; i < 40; i++)
        bar[i] = i < pct * 40 / 100 ? '#' : ' ';
    bar[40] = 0;
    fprintf(stderr, "\rloading [%s] %3d%%", bar, pct);
    if (done >= total)
        fprintf(stderr, "\r%60s\r", "");
    fflush(stderr);
    return 0;
}

static const char *default_model(char *buf, size_t size)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg)
        snprintf(buf, size, "%s/libtensr/%s", xdg, DEFAULT_MODEL);
    else
        snprintf(buf, size, "%s/.cache/libtensr/%s", home ? home : ".", DEFAULT_MODEL);
    return buf;
}

/* Creates the backend and opens the model with the options' placement. */
static int open_model(const opts *o, int perplexity, tsr_backend **be, llm **m)
{
    tsr_device *devs[MAX_GPUS + 2];
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = o->n_threads;
    bp.flash_attn = o->flash_attn;
    bp.attn_max_batch = o->amb;
    if (o->devices && pick_devices(o->devices, devs))
        return 1;
    bp.devices = o->devices ? devs : NULL;
    if (tsr_backend_new(&bp, be) != TSR_OK)
        return die("backend: %s%s", tsr_last_error(), "");

    tsr_buft_override *ov = NULL;
    if (o->overrides && tsr_buft_overrides_parse(o->overrides, &ov) != TSR_OK)
        return die("-ot: %s%s", tsr_last_error(), "");
    int last = -1;
    tsr_load_params lp;
    tsr_load_params_init(&lp, sizeof lp);
    lp.n_gpu_layers = o->n_gpu_layers;
    lp.main_gpu = o->main_gpu;
    lp.tensor_split = o->n_split ? o->tensor_split : NULL;
    lp.overrides = ov;
    /* copies are the default: they get huge pages, and with 4 KiB mapped
     * pages the first pass and decoding measured slower (220 vs 21 prompt
     * tokens/s on the first 5 tokens, 130 vs 100 generated tokens/s) */
    lp.use_mmap = o->mmap;
    lp.progress = isatty(2) ? progress : NULL;
    lp.progress_user = &last;

    char buf[4096];
    const char *path = o->model ? o->model : default_model(buf, sizeof buf);
    llm_params p;
    llm_params_default(&p);
    p.n_ctx = o->n_ctx;
    tsr_gguf *g = NULL;
    llm_hparams hp;
    if (o->cap_ctx && tsr_gguf_open(path, &g) == TSR_OK && llm_hparams_read(g, &hp) == TSR_OK &&
        p.n_ctx > hp.n_ctx_train)
        p.n_ctx = hp.n_ctx_train;
    tsr_gguf_close(g);
    p.n_ubatch = o->n_ubatch < o->n_batch ? o->n_ubatch : o->n_batch;
    p.n_outputs_max = perplexity ? p.n_ubatch : 1;
    tsr_status st = llm_open(*be, path, &lp, &p, m);
    tsr_buft_overrides_free(ov);
    if (st != TSR_OK) {
        if (!o->model && access(path, R_OK) != 0)
            return die("no model given and %s is not there: run examples/get-model.sh, or pass -m FILE%s", path, "");
        if (st == TSR_E_DEVICE_NOMEM && o->verbose)
            tsr_backend_log_plan(*be);
        return die("%s%s", llm_last_error(), "");
    }
    if (o->verbose)
        tsr_backend_log_plan(*be);
    return 0;
}

/* ---- generation ------------------------------------------------------------ */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0, r;
    char *s = malloc(cap + 1);
    while (s && (r = fread(s + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *t = realloc(s, 2 * cap + 1);
            if (!t) {
                free(s);
                s = NULL;
                break;
            }
            s = t;
            cap *= 2;
        }
    }
    if (s && ferror(f)) {
        free(s);
        s = NULL;
    }
    fclose(f);
    if (s) {
        s[n] = 0;
        *len = n;
    }
    return s;
}

/* The prompt's token ids, through the chat template with --chat. */
static int make_prompt(const opts *o, const llm *m, const tok_vocab *v, int32_t **ids, size_t *n)
{
    size_t len = 0;
    char *file = NULL, *chat = NULL;
    const char *text = o->prompt ? o->prompt : "Once upon a time";
    if (o->prompt_file && !(text = file = read_file(o->prompt_file, &len)))
        return die("%s: %s", o->prompt_file, strerror(errno));
    int parse_special = 0;
    if (o->chat) {
        const char *tmpl = NULL;
        chat_template *t = NULL;
        if (tsr_gguf_get_str(llm_get_gguf(m), "tokenizer.chat_template", &tmpl, NULL) != TSR_OK) {
            free(file);
            return die("--chat: the model has no tokenizer.chat_template%s%s", "", "");
        }
        chat_msg msg = {"user", text};
        if (chat_template_detect(tmpl, &t) != TSR_OK || chat_format(t, &msg, 1, 1, &chat) != TSR_OK) {
            chat_template_free(t);
            free(file);
            return die("--chat: %s%s", chat_last_error(), "");
        }
        chat_template_free(t);
        text = chat;
        parse_special = 1;
    }
    tsr_status st = tok_tokenize(v, text, strlen(text), 1, parse_special, ids, n);
    free(file);
    free(chat);
    if (st != TSR_OK)
        return die("tokenizer: %s%s", tok_last_error(), "");
    if (*n == 0)
        return die("the prompt is empty%s%s", "", "");
    return 0;
}

static void emit(tok_stream *ts, const tok_vocab *v, int32_t id)
{
    size_t len, out_len;
    const char *piece = tok_piece(v, id, 0, &len), *out;
    if (tok_stream_push(ts, piece, len, &out, &out_len) == TSR_OK && out_len) {
        fwrite(out, 1, out_len, stdout);
        fflush(stdout);
    }
}

/* The next token: plain argmax (first index on ties, as the sampler) when
 * the sampler would do nothing else; it saves sorting the vocabulary. */
static int32_t next_token(const opts *o, smp_sampler *smp, const float *logits, int64_t nv)
{
    if (o->smp.temp > 0.0f || o->smp.repeat_penalty != 1.0f || o->smp.freq_penalty != 0.0f ||
        o->smp.presence_penalty != 0.0f)
        return smp_sample(smp, logits);
    int64_t best = 0;
    for (int64_t i = 1; i < nv; i++)
        if (logits[i] > logits[best])
            best = i;
    return (int32_t)best;
}

typedef struct gen_stats {
    size_t n_prompt, n_gen;
    double t_prompt, t_gen;
} gen_stats;

static int generate(const opts *o, llm *m, const tok_vocab *v, const int32_t *ids, size_t n, gen_stats *gs)
{
    int64_t nv = llm_get_hparams(m)->n_vocab;
    float *logits = malloc((size_t)nv * sizeof *logits);
    smp_sampler *smp = NULL;
    tok_stream ts;
    tok_stream_init(&ts);
    if (!logits || smp_new(&o->smp, (int32_t)nv, &smp) != TSR_OK) {
        free(logits);
        return die("out of memory%s%s", "", "");
    }
    for (size_t i = 0; i < n; i++)
        smp_accept(smp, ids[i]);
    char *shown = NULL;
    size_t shown_len = 0;
    if (!o->chat && tok_detokenize(v, ids, n, 1, 0, &shown, &shown_len) == TSR_OK) {
        fwrite(shown, 1, shown_len, stdout); /* the prompt, as llama.cpp shows it */
        fflush(stdout);
    }
    free(shown);
    double t0 = now();
    tsr_status st = llm_decode(m, ids, (int64_t)n, (int64_t)n - 1, logits);
    gs->t_prompt = now() - t0;
    gs->n_prompt = n;
    for (int i = 0; st == TSR_OK && (o->n_predict < 0 || i < o->n_predict); i++) {
        int32_t id = next_token(o, smp, logits, nv);
        smp_accept(smp, id);
        if (tok_is_eog(v, id))
            break;
        emit(&ts, v, id);
        if (llm_n_past(m) >= llm_n_ctx(m) || (o->n_predict >= 0 && i + 1 == o->n_predict))
            break;
        t0 = now();
        st = llm_decode(m, &id, 1, 0, logits);
        gs->t_gen += now() - t0;
        gs->n_gen++;
    }
    const char *out;
    size_t out_len;
    if (tok_stream_flush(&ts, &out, &out_len) == TSR_OK)
        fwrite(out, 1, out_len, stdout);
    printf("\n");
    fflush(stdout); /* before the speeds on stderr */
    tok_stream_free(&ts);
    smp_free(smp);
    free(logits);
    return st == TSR_OK ? 0 : die("%s%s", llm_last_error(), "");
}

/* ---- perplexity ------------------------------------------------------------ */

/* llama-perplexity's way: chunks of n_ctx tokens from an empty cache (first
 * token BOS when the model adds one), the second half of each scored. */
static int perplexity(const opts *o, llm *m, const tok_vocab *v)
{
    size_t len, n;
    int32_t *ids = NULL;
    char *text = read_file(o->ppl_file, &len);
    if (!text)
        return die("%s: %s", o->ppl_file, strerror(errno));
    tsr_status st = tok_tokenize(v, text, len, 1, 0, &ids, &n);
    free(text);
    if (st != TSR_OK)
        return die("tokenizer: %s%s", tok_last_error(), "");
    int64_t n_ctx = llm_n_ctx(m), first = n_ctx / 2, nv = llm_get_hparams(m)->n_vocab;
    int64_t n_chunks = (int64_t)n / n_ctx;
    if (o->n_chunks > 0 && o->n_chunks < n_chunks)
        n_chunks = o->n_chunks;
    if (n_chunks == 0) {
        free(ids);
        return die("%s: fewer tokens than one chunk of -c tokens%s", o->ppl_file, "");
    }
    float *logits = malloc((size_t)(n_ctx - first) * (size_t)nv * sizeof *logits);
    double nll = 0, t0 = now();
    int64_t count = 0;
    fprintf(stderr, "perplexity: %zu tokens, %lld chunks of %lld\n", n, (long long)n_chunks, (long long)n_ctx);
    for (int64_t c = 0; logits && st == TSR_OK && c < n_chunks; c++) {
        int32_t *chunk = ids + c * n_ctx;
        if (tok_add_bos(v) && tok_bos(v) >= 0)
            chunk[0] = tok_bos(v);
        llm_reset(m);
        if ((st = llm_decode(m, chunk, n_ctx, first, logits)) != TSR_OK)
            break;
        for (int64_t j = first; j < n_ctx - 1; j++) {
            const float *row = logits + (j - first) * nv;
            float mx = row[0];
            for (int64_t k = 1; k < nv; k++)
                mx = row[k] > mx ? row[k] : mx;
            double sum = 0;
            for (int64_t k = 0; k < nv; k++)
                sum += exp((double)row[k] - mx);
            nll += mx + log(sum) - row[chunk[j + 1]];
            count++;
        }
        fprintf(stderr, "[%lld] %.4f\n", (long long)c + 1, exp(nll / (double)count));
    }
    double dt = now() - t0;
    free(logits);
    free(ids);
    if (!logits)
        return die("out of memory for the logits%s%s", "", "");
    if (st != TSR_OK)
        return die("%s%s", llm_last_error(), "");
    printf("perplexity: %.4f (%lld chunks of %lld tokens, %.1f tokens/s)\n", exp(nll / (double)count),
           (long long)n_chunks, (long long)n_ctx, (double)(n_chunks * n_ctx) / dt);
    return 0;
}

/* ---- main ------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc == 2 ? 0 : 1;
    if (o.verbose)
        tsr_log_set_level(TSR_LOG_DEBUG); /* else TSR_LOG_LEVEL or the library's default */
    if (o.list_devices)
        return list_devices();
    if (o.n_ctx < 0) {
        o.n_ctx = o.ppl_file ? 512 : 4096;
        o.cap_ctx = 1; /* the default never exceeds what the model was trained for */
    }

    tsr_backend *be = NULL;
    llm *m = NULL;
    tok_vocab *v = NULL;
    rc = open_model(&o, o.ppl_file != NULL, &be, &m);
    if (!rc && tok_vocab_load(llm_get_gguf(m), &v) != TSR_OK)
        rc = die("tokenizer: %s%s", tok_last_error(), "");
    if (!rc && o.ppl_file) {
        rc = perplexity(&o, m, v);
    } else if (!rc) {
        int32_t *ids = NULL;
        size_t n = 0;
        gen_stats gs = {0};
        rc = make_prompt(&o, m, v, &ids, &n);
        if (!rc)
            rc = generate(&o, m, v, ids, n, &gs);
        free(ids);
        if (!rc)
            fprintf(stderr, "prompt: %zu tokens, %.2f tokens/s | generation: %zu tokens, %.2f tokens/s\n",
                    gs.n_prompt, gs.t_prompt > 0 ? (double)gs.n_prompt / gs.t_prompt : 0.0, gs.n_gen,
                    gs.t_gen > 0 ? (double)gs.n_gen / gs.t_gen : 0.0);
    }
    tok_vocab_free(v);
    llm_free(m);
    tsr_backend_free(be);
    return rc;
}
