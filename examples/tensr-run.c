/* tensr-run.c - generates text from a llama/mistral GGUF model with
 * libtensr's model layer (tsr_model, tsr_session, tsr_sampler; the public
 * header only), or measures perplexity on a text file.
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
#include "fit-target.h"

#define DEFAULT_MODEL "SmolLM2-135M-Instruct.Q4_1.gguf"
#define MAX_GPUS 16

typedef struct opts {
    const char *model, *prompt, *prompt_file, *ppl_file, *overrides, *devices;
    int cap_ctx, n_predict, n_threads, n_gpu_layers, main_gpu, flash_attn, chat, verbose, list_devices, n_chunks;
    int mmap;
    int fit, fit_print, placement_given, ctx_given; /* fit: -1 = auto (on when no -ngl/-ts/-ot) */
    int ngl_given;                                  /* -ngl given (-ngl 0 too): the fit keeps it */
    const char *fit_target;
    int64_t fit_ctx;
    int64_t n_ctx, n_batch, n_ubatch;
    size_t amb;
    float tensor_split[MAX_GPUS];
    int n_split;
    tsr_sampler_params smp;
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
            "  -fit, --fit on|off        choose -ngl, -ts, expert overrides and -c that fit the devices' and\n"
            "                            system memory (default on unless -ngl, -ts or -ot is given)\n"
            "  --fit-target MiB[,...]    memory left free per GPU (one value: every GPU; default 1024)\n"
            "  --fit-ctx N               the fit never shrinks the context below N (default 4096)\n"
            "  --fit-print               print the fitted placement as flags and exit\n"
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

/* on/off/auto as a tsr_flash_attn_mode; -2 for another word. */
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
    else if (is(a, "-ot", "--override-tensor")) o->overrides = v, o->placement_given = 1;
    else if (is(a, "-fit", "--fit")) { if (strcmp(v, "on") && strcmp(v, "off")) return die("-fit: 'on' or 'off', not '%s'%s", v, ""); o->fit = !strcmp(v, "on"); }
    else if (is(a, "--fit-target", NULL)) o->fit_target = v;
    else if (is(a, "--fit-ctx", NULL)) { if (parse_int(a, v, 1, 1 << 30, &n)) return 1; o->fit_ctx = n; }
    else if (is(a, "-dev", "--device")) o->devices = v;
    else if (is(a, "--perplexity", NULL)) o->ppl_file = v;
    else if (is(a, "-ts", "--tensor-split")) return o->placement_given = 1, parse_split(v, o);
    else if (is(a, "-fa", "--flash-attn")) return parse_fa(v, &o->flash_attn);
    else if (is(a, "--temp", NULL)) return parse_float(a, v, &o->smp.temp);
    else if (is(a, "--top-p", NULL)) return parse_float(a, v, &o->smp.top_p);
    else if (is(a, "--min-p", NULL)) return parse_float(a, v, &o->smp.min_p);
    else if (is(a, "--repeat-penalty", NULL)) return parse_float(a, v, &o->smp.repeat_penalty);
    else if (is(a, "-n", "--n-predict")) { if (parse_int(a, v, -1, 1 << 30, &n)) return 1; o->n_predict = (int)n; }
    else if (is(a, "-c", "--ctx-size")) { if (parse_int(a, v, 0, 1 << 30, &n)) return 1; o->n_ctx = n; o->ctx_given = 1; }
    else if (is(a, "-b", "--batch-size")) { if (parse_int(a, v, 1, 1 << 30, &n)) return 1; o->n_batch = n; }
    else if (is(a, "-ub", "--ubatch-size")) { if (parse_int(a, v, 1, 1 << 30, &n)) return 1; o->n_ubatch = n; }
    else if (is(a, "-t", "--threads")) { if (parse_int(a, v, 1, 1024, &n)) return 1; o->n_threads = (int)n; }
    else if (is(a, "-ngl", "--n-gpu-layers")) { if (parse_int(a, v, -1, 1 << 20, &n)) return 1; o->n_gpu_layers = (int)n; o->placement_given = o->ngl_given = 1; }
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
    o->fit = -1;
    o->fit_ctx = 4096;
    tsr_sampler_params_init(&o->smp, sizeof o->smp);
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
        else if (is(a, "--fit-print", NULL)) o->fit_print = 1;
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

/* Loading or the session failed: the detail, and the plan when memory ran out. */
static int load_failed(const opts *o, tsr_backend *be, tsr_status st)
{
    if (st == TSR_E_DEVICE_NOMEM && o->verbose)
        tsr_backend_log_plan(be);
    return die("%s%s", tsr_last_error(), "");
}

/* The session's sizes: n_ctx cells; for perplexity one call takes a whole
 * chunk (n_batch = n_ctx) and each micro-batch may keep a logits row per
 * token (n_outputs_max = n_ubatch), for generation one row (the last). */
static void session_sizes(const opts *o, int perplexity, int64_t n_ctx, tsr_session_params *sp)
{
    sp->n_ctx = n_ctx;
    sp->n_batch = perplexity ? sp->n_ctx : o->n_batch;
    sp->n_ubatch = o->n_ubatch < o->n_batch ? o->n_ubatch : o->n_batch;
    /* the session caps n_ubatch at n_batch and n_outputs_max at n_ubatch, so
     * every micro-batch of a chunk may keep all its rows */
    sp->n_outputs_max = perplexity ? sp->n_ubatch : 1;
}

/* Runs tsr_fit on the options' placement and applies its answer to lp and
 * sp (the result owns the overrides until tsr_fit_result_free). */
static int run_fit(const opts *o, const tsr_backend_params *bp, const char *path, tsr_load_params *lp,
                   tsr_session_params *sp, tsr_fit_result *fr)
{
    size_t margins[TSR_FIT_MAX_DEVICES];
    tsr_fit_params fp;
    tsr_fit_params_init(&fp, sizeof fp);
    fp.n_ctx_min = o->fit_ctx;
    fp.keep_n_gpu_layers = o->ngl_given;
    fp.keep_n_ctx = o->ctx_given;
    if (o->fit_target && fit_target_parse(o->fit_target, &fp, margins))
        return die("--fit-target %s: expected MiB[,MiB...]%s", o->fit_target, "");
    if (tsr_fit(path, bp, lp, sp, &fp, fr) != TSR_OK)
        return die("fit: %s%s", tsr_last_error(), "");
    lp->n_gpu_layers = fr->n_gpu_layers;
    lp->tensor_split = fr->n_devices > 2 ? fr->tensor_split : lp->tensor_split;
    lp->overrides = fr->overrides;
    sp->n_ctx = fr->n_ctx;
    char flags[8192];
    size_t len;
    if (tsr_fit_result_flags(fr, flags, sizeof flags, &len) == TSR_OK)
        fprintf(o->fit_print ? stdout : stderr, o->fit_print ? "%s\n" : "fit: %s (%.1f ms)\n", flags,
                fr->seconds * 1e3);
    return 0;
}

/* Creates the backend, loads the model with the options' placement (or
 * the fit's) and makes the session. Returns 3 after --fit-print. */
static int open_model(const opts *o, int perplexity, tsr_backend **be, tsr_model **m, tsr_session **s)
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
    tsr_session_params sp;
    tsr_session_params_init(&sp, sizeof sp);
    session_sizes(o, perplexity, o->n_ctx, &sp);
    tsr_fit_result fr;
    memset(&fr, 0, sizeof fr);
    fr.size = sizeof fr;
    int fitted = o->fit == 1 || (o->fit == -1 && !o->placement_given) || o->fit_print;
    int rc = fitted ? run_fit(o, &bp, path, &lp, &sp, &fr) : 0;
    if (rc || o->fit_print) {
        tsr_fit_result_free(&fr);
        tsr_buft_overrides_free(ov);
        if (rc && !o->model && access(path, R_OK) != 0)
            return die("no model given and %s is not there: run examples/get-model.sh, or pass -m FILE%s", path, "");
        return rc ? rc : 3;
    }
    tsr_status st = tsr_backend_new(&bp, be);
    if (st == TSR_OK)
        st = tsr_model_load(*be, path, &lp, m);
    tsr_fit_result_free(&fr);
    tsr_buft_overrides_free(ov);
    if (st != TSR_OK && !*be)
        return die("backend: %s%s", tsr_last_error(), "");
    if (st != TSR_OK) {
        if (!o->model && access(path, R_OK) != 0)
            return die("no model given and %s is not there: run examples/get-model.sh, or pass -m FILE%s", path, "");
        return load_failed(o, *be, st);
    }
    int64_t n_ctx = fitted ? sp.n_ctx : o->n_ctx ? o->n_ctx : tsr_model_n_ctx_train(*m);
    if (o->cap_ctx && n_ctx > tsr_model_n_ctx_train(*m))
        n_ctx = tsr_model_n_ctx_train(*m);
    session_sizes(o, perplexity, n_ctx, &sp);
    if ((st = tsr_session_new(*m, &sp, s)) != TSR_OK)
        return load_failed(o, *be, st);
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

/* text[0..len) as token ids (*ids malloc'ed); 0, or 1 after the message. */
static int tokenize(const tsr_model *m, const char *text, size_t len, unsigned flags, int32_t **ids, size_t *n)
{
    size_t cap = len + 8;
    *ids = NULL;
    for (;;) {
        int32_t *t = realloc(*ids, cap * sizeof *t);
        if (!t) {
            free(*ids);
            *ids = NULL;
            return die("tokenizer: out of memory%s%s", "", "");
        }
        *ids = t;
        tsr_status st = tsr_model_tokenize(m, text, len, flags, *ids, cap, n);
        if (st == TSR_OK)
            return 0;
        if (st != TSR_E_RANGE || *n <= cap) {
            free(*ids);
            *ids = NULL;
            return die("tokenizer: %s%s", tsr_last_error(), "");
        }
        cap = *n;
    }
}

/* The prompt's token ids, through the chat template with --chat. */
static int make_prompt(const opts *o, const tsr_model *m, int32_t **ids, size_t *n)
{
    size_t len = 0;
    char *file = NULL, *chat = NULL;
    const char *text = o->prompt ? o->prompt : "Once upon a time";
    if (o->prompt_file && !(text = file = read_file(o->prompt_file, &len)))
        return die("%s: %s", o->prompt_file, strerror(errno));
    unsigned flags = TSR_TOKENIZE_ADD_SPECIAL;
    if (o->chat) {
        tsr_chat_message msg = {"user", text};
        size_t chat_len = 0;
        tsr_status st = tsr_model_chat_format(m, &msg, 1, 1, NULL, 0, &chat_len);
        if (st == TSR_E_RANGE && (chat = malloc(chat_len + 1)) != NULL)
            st = tsr_model_chat_format(m, &msg, 1, 1, chat, chat_len + 1, &chat_len);
        if (st != TSR_OK) {
            free(chat);
            free(file);
            return st == TSR_E_RANGE ? die("--chat: out of memory%s%s", "", "")
                                     : die("--chat: %s%s", tsr_last_error(), "");
        }
        text = chat;
        flags |= TSR_TOKENIZE_PARSE_SPECIAL;
    }
    int rc = tokenize(m, text, strlen(text), flags, ids, n);
    free(file);
    free(chat);
    if (rc)
        return rc;
    if (*n == 0)
        return die("the prompt is empty%s%s", "", "");
    return 0;
}

/* Streamed output: token pieces may end inside a UTF-8 character, so the
 * bytes of an incomplete sequence wait for the next piece; only valid UTF-8
 * is written (a malformed byte becomes U+FFFD). */
typedef struct utf8_out {
    char *buf; /* pending bytes (n_pend), then the next piece */
    size_t cap, n_pend;
} utf8_out;

/* Length of the valid UTF-8 sequence at u[0..n), 0 if malformed, or -1 if
 * it is a valid but incomplete start. */
static int utf8_seq(const unsigned char *u, size_t n)
{
    int need = u[0] < 0x80 ? 1 : u[0] < 0xC2 ? 0 : u[0] < 0xE0 ? 2 : u[0] < 0xF0 ? 3 : u[0] < 0xF5 ? 4 : 0;
    for (int k = 1; k < need; k++) {
        unsigned char lo = 0x80, hi = 0xBF;
        if ((size_t)k >= n)
            return -1;
        if (k == 1 && u[0] == 0xE0) lo = 0xA0; /* overlong */
        if (k == 1 && u[0] == 0xED) hi = 0x9F; /* surrogates */
        if (k == 1 && u[0] == 0xF0) lo = 0x90; /* overlong */
        if (k == 1 && u[0] == 0xF4) hi = 0x8F; /* past U+10FFFF */
        if (u[k] < lo || u[k] > hi)
            return 0;
    }
    return need;
}

/* Writes the complete characters of buf[0..n) and keeps an incomplete tail. */
static void utf8_write(utf8_out *u, size_t n)
{
    const unsigned char *b = (const unsigned char *)u->buf;
    size_t i = 0, run = 0; /* run: valid bytes from i - run not yet written */
    while (i < n) {
        int l = utf8_seq(b + i, n - i);
        if (l < 0)
            break;
        if (l == 0) {
            fwrite(b + i - run, 1, run, stdout);
            fwrite("\xef\xbf\xbd", 1, 3, stdout);
            run = 0;
            i++;
        } else {
            run += (size_t)l;
            i += (size_t)l;
        }
    }
    fwrite(b + i - run, 1, run, stdout);
    u->n_pend = n - i; /* at most 3 bytes */
    memmove(u->buf, u->buf + i, u->n_pend);
}

static void emit(utf8_out *u, const tsr_model *m, int32_t id)
{
    size_t len = 0;
    tsr_status st = tsr_model_token_piece(m, id, 0, u->buf + u->n_pend, u->cap - u->n_pend, &len);
    if (st == TSR_E_RANGE) {
        char *b = realloc(u->buf, u->n_pend + len);
        if (!b)
            return;
        u->buf = b;
        u->cap = u->n_pend + len;
        st = tsr_model_token_piece(m, id, 0, u->buf + u->n_pend, u->cap - u->n_pend, &len);
    }
    if (st != TSR_OK || len == 0)
        return;
    utf8_write(u, u->n_pend + len);
    fflush(stdout);
}

/* Ends the stream: a pending incomplete sequence is written as U+FFFD. */
static void emit_end(utf8_out *u)
{
    if (u->n_pend)
        fwrite("\xef\xbf\xbd", 1, 3, stdout);
    u->n_pend = 0;
}

/* The prompt as llama.cpp shows it (control tokens not rendered). */
static void show_prompt(const tsr_model *m, const int32_t *ids, size_t n)
{
    size_t len = 0;
    char *text = NULL;
    if (tsr_model_detokenize(m, ids, n, 0, NULL, 0, &len) != TSR_E_RANGE || !(text = malloc(len + 1)))
        return;
    if (tsr_model_detokenize(m, ids, n, 0, text, len + 1, &len) == TSR_OK) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    free(text);
}

/* The next token: plain argmax (first index on ties, as the sampler) when
 * the sampler would do nothing else; it saves sorting the vocabulary. The
 * repetition penalty sees the prompt too (tsr_sampler_accept in generate). */
static int32_t next_token(const opts *o, tsr_sampler *smp, const float *logits, int64_t nv)
{
    if (o->smp.temp > 0.0f || o->smp.repeat_penalty != 1.0f)
        return tsr_sampler_sample(smp, logits);
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

/* The prompt in calls of at most n_batch tokens (the cache's size, when
 * smaller), each keeping the logits of its last token: *last is the index
 * of the prompt's last token in the last call. */
static tsr_status decode_prompt(const opts *o, tsr_session *s, const int32_t *ids, size_t n, size_t *last)
{
    size_t step = (size_t)o->n_batch;
    if ((int64_t)step > tsr_session_n_ctx(s))
        step = (size_t)tsr_session_n_ctx(s);
    tsr_status st = TSR_OK;
    for (size_t i = 0; st == TSR_OK && i < n; i += step) {
        size_t k = n - i < step ? n - i : step;
        st = tsr_session_decode(s, k, ids + i, NULL, NULL, NULL);
        *last = k - 1;
    }
    return st;
}

static int generate(const opts *o, tsr_model *m, tsr_session *s, const int32_t *ids, size_t n, gen_stats *gs)
{
    int64_t nv = tsr_model_n_vocab(m);
    tsr_sampler *smp = NULL;
    utf8_out u = {malloc(256), 256, 0};
    if (!u.buf)
        return die("out of memory%s%s", "", "");
    if ((int64_t)n > tsr_session_n_ctx(s)) { /* before a first part of it fills the cache */
        char what[96];
        snprintf(what, sizeof what, "%zu tokens > n_ctx %lld", n, (long long)tsr_session_n_ctx(s));
        free(u.buf);
        return die("context is full: the prompt has %s%s", what, " (see -c)");
    }
    if (tsr_sampler_new(m, &o->smp, &smp) != TSR_OK) {
        free(u.buf);
        return die("sampler: %s%s", tsr_last_error(), "");
    }
    for (size_t i = 0; i < n; i++) /* the penalties see the prompt, as llama.cpp's do */
        tsr_sampler_accept(smp, ids[i]);
    if (!o->chat)
        show_prompt(m, ids, n);
    double t0 = now();
    size_t last = 0;
    tsr_status st = decode_prompt(o, s, ids, n, &last);
    gs->t_prompt = now() - t0;
    gs->n_prompt = n;
    const float *logits = st == TSR_OK ? tsr_session_logits(s, last) : NULL;
    for (int i = 0; st == TSR_OK && (o->n_predict < 0 || i < o->n_predict); i++) {
        int32_t id = next_token(o, smp, logits, nv);
        if (tsr_model_token_is_eog(m, id))
            break;
        emit(&u, m, id);
        if (tsr_session_n_past(s, 0) >= tsr_session_n_ctx(s) || (o->n_predict >= 0 && i + 1 == o->n_predict))
            break;
        t0 = now();
        st = tsr_session_decode(s, 1, &id, NULL, NULL, NULL);
        gs->t_gen += now() - t0;
        gs->n_gen++;
        logits = tsr_session_logits(s, 0);
    }
    emit_end(&u);
    printf("\n");
    fflush(stdout); /* before the speeds on stderr */
    free(u.buf);
    tsr_sampler_free(smp);
    return st == TSR_OK ? 0 : die("%s%s", tsr_last_error(), "");
}

/* ---- perplexity ------------------------------------------------------------ */

/* llama-perplexity's way: chunks of n_ctx tokens from an empty cache (first
 * token BOS when the model adds one), the second half of each scored: the
 * logits of positions first..n_ctx-2 predict the tokens after them. */
static int perplexity(const opts *o, tsr_model *m, tsr_session *s)
{
    size_t len, n;
    int32_t *ids = NULL;
    char *text = read_file(o->ppl_file, &len);
    if (!text)
        return die("%s: %s", o->ppl_file, strerror(errno));
    int rc = tokenize(m, text, len, TSR_TOKENIZE_ADD_SPECIAL, &ids, &n);
    free(text);
    if (rc)
        return rc;
    /* without parse_special the text cannot yield BOS: a leading one is the
     * tokenizer's, so the model adds BOS */
    int32_t bos = tsr_model_token_bos(m);
    int add_bos = bos >= 0 && n > 0 && ids[0] == bos;
    int64_t n_ctx = tsr_session_n_ctx(s), first = n_ctx / 2, nv = tsr_model_n_vocab(m);
    int64_t n_chunks = (int64_t)n / n_ctx;
    if (o->n_chunks > 0 && o->n_chunks < n_chunks)
        n_chunks = o->n_chunks;
    if (n_chunks == 0) {
        free(ids);
        return die("%s: fewer tokens than one chunk of -c tokens%s", o->ppl_file, "");
    }
    tsr_status st = TSR_OK;
    int8_t *want = calloc((size_t)n_ctx, 1);
    for (int64_t j = first; want && j < n_ctx - 1; j++)
        want[j] = 1;
    double nll = 0, t0 = now();
    int64_t count = 0;
    fprintf(stderr, "perplexity: %zu tokens, %lld chunks of %lld\n", n, (long long)n_chunks, (long long)n_ctx);
    for (int64_t c = 0; want && st == TSR_OK && c < n_chunks; c++) {
        int32_t *chunk = ids + c * n_ctx;
        if (add_bos)
            chunk[0] = bos;
        if ((st = tsr_session_remove(s, -1, 0, -1)) != TSR_OK ||
            (st = tsr_session_decode(s, (size_t)n_ctx, chunk, NULL, NULL, want)) != TSR_OK)
            break;
        for (int64_t j = first; j < n_ctx - 1; j++) {
            const float *row = tsr_session_logits(s, (size_t)j);
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
    free(want);
    free(ids);
    if (!want)
        return die("out of memory%s%s", "", "");
    if (st != TSR_OK)
        return die("%s%s", tsr_last_error(), "");
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
    tsr_model *m = NULL;
    tsr_session *s = NULL;
    rc = open_model(&o, o.ppl_file != NULL, &be, &m, &s);
    if (rc == 3) { /* --fit-print */
        rc = 0;
    } else if (!rc && o.ppl_file) {
        rc = perplexity(&o, m, s);
    } else if (!rc) {
        int32_t *ids = NULL;
        size_t n = 0;
        gen_stats gs = {0};
        rc = make_prompt(&o, m, &ids, &n);
        if (!rc)
            rc = generate(&o, m, s, ids, n, &gs);
        free(ids);
        if (!rc)
            fprintf(stderr, "prompt: %zu tokens, %.2f tokens/s | generation: %zu tokens, %.2f tokens/s\n",
                    gs.n_prompt, gs.t_prompt > 0 ? (double)gs.n_prompt / gs.t_prompt : 0.0, gs.n_gen,
                    gs.t_gen > 0 ? (double)gs.n_gen / gs.t_gen : 0.0);
    }
    tsr_session_free(s);
    tsr_model_free(m);
    tsr_backend_free(be);
    return rc;
}
