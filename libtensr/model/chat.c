/* chat.c - recognizes chat templates by their markers and renders
 * conversations the way llama.cpp's built-in templates do (see chat.h). */
#include "chat.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum kind {
    K_CHATML,
    K_LLAMA2,
    K_LLAMA2_SYS,
    K_LLAMA2_SYS_BOS,
    K_LLAMA2_SYS_STRIP,
    K_MISTRAL_V1,
    K_MISTRAL_V3,
    K_MISTRAL_V3_TEKKEN,
    K_MISTRAL_V7,
    K_LLAMA3,
    K_ZEPHYR,
    K_GEMMA,
    K_PHI3
} kind;

static const char *const kind_names[] = {"chatml",
                                         "llama2",
                                         "llama2-sys",
                                         "llama2-sys-bos",
                                         "llama2-sys-strip",
                                         "mistral-v1",
                                         "mistral-v3",
                                         "mistral-v3-tekken",
                                         "mistral-v7",
                                         "llama3",
                                         "zephyr",
                                         "gemma",
                                         "phi3"};

struct chat_template {
    kind k;
    char *default_system;
};

static tsr_status make(kind k, chat_template **out) {
    if (!(*out = tsr__calloc(1, sizeof **out)))
        return tsr__error(TSR_E_NOMEM, "chat: out of memory");
    (*out)->k = k;
    return TSR_OK;
}

/* SmolLM2-style templates open with a fixed system turn when the first
 * message is not a system one: find that literal in the template text. */
static char *find_default_system(const char *text) {
    static const char *const opens[] = {"<|im_start|>system\n", "<|im_start|>system\\n"};
    const char *p, *e;
    char *s;
    size_t n = 0;
    if (!strstr(text, "messages[0]['role'] != 'system'") && !strstr(text, "messages[0].role != 'system'"))
        return NULL;
    for (size_t i = 0; i < 2; i++) {
        if (!(p = strstr(text, opens[i])))
            continue;
        p += strlen(opens[i]);
        if (!(e = strstr(p, "<|im_end|>")) || !(s = tsr__malloc((size_t)(e - p) + 1)))
            return NULL;
        for (; p < e; p++) { /* undo Jinja string escapes */
            if (p[0] == '\\' && p + 1 < e && (p[1] == 'n' || p[1] == '\'' || p[1] == '\\')) {
                s[n++] = p[1] == 'n' ? '\n' : p[1];
                p++;
            } else {
                s[n++] = *p;
            }
        }
        s[n] = '\0';
        return s;
    }
    return NULL;
}

static int has(const char *t, const char *s) { return strstr(t, s) != NULL; }

static int detect_inst(const char *t) {
    if (has(t, "[SYSTEM_PROMPT]"))
        return K_MISTRAL_V7;
    if (has(t, "' [INST] ' + system_message") || has(t, "[AVAILABLE_TOOLS]")) {
        if (has(t, " [INST]"))
            return K_MISTRAL_V1;
        return has(t, "\"[INST]\"") ? K_MISTRAL_V3_TEKKEN : K_MISTRAL_V3;
    }
    if (has(t, "content.strip()"))
        return K_LLAMA2_SYS_STRIP;
    if (has(t, "bos_token + '[INST]"))
        return K_LLAMA2_SYS_BOS;
    return has(t, "<<SYS>>") ? K_LLAMA2_SYS : K_LLAMA2;
}

tsr_status tsr__chat_template_detect(const char *t, chat_template **out) {
    int k = -1;
    tsr_status st;
    if (!t || !out)
        return tsr__error(TSR_E_INVALID, "chat_template_detect: NULL argument");
    if (has(t, "<|im_start|>") && !has(t, "<|im_sep|>") && !has(t, "<end_of_utterance>"))
        k = K_CHATML;
    else if (strncmp(t, "mistral", 7) == 0 || has(t, "[INST]"))
        k = detect_inst(t);
    else if (has(t, "<|assistant|>") && has(t, "<|end|>"))
        k = K_PHI3;
    else if (has(t, "<|user|>") && has(t, "<|endoftext|>"))
        k = K_ZEPHYR;
    else if (has(t, "<start_of_turn>"))
        k = K_GEMMA;
    else if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>"))
        k = K_LLAMA3;
    if (k < 0)
        return tsr__error(TSR_E_UNSUPPORTED,
                          "chat: unknown chat template (starts with '%.60s'); "
                          "supported: chatml, llama2, mistral, llama3, zephyr, gemma, phi3",
                          t);
    if ((st = make((kind)k, out)) != TSR_OK)
        return st;
    if (k == K_CHATML)
        (*out)->default_system = find_default_system(t);
    return TSR_OK;
}

tsr_status tsr__chat_template_by_name(const char *name, chat_template **out) {
    if (!name || !out)
        return tsr__error(TSR_E_INVALID, "chat_template_by_name: NULL argument");
    for (size_t i = 0; i < sizeof kind_names / sizeof kind_names[0]; i++)
        if (strcmp(name, kind_names[i]) == 0)
            return make((kind)i, out);
    return tsr__error(TSR_E_NOT_FOUND, "chat: no chat template named '%s'", name);
}

void tsr__chat_template_free(chat_template *t) {
    if (!t)
        return;
    tsr__free(t->default_system);
    tsr__free(t);
}

const char *tsr__chat_template_name(const chat_template *t) { return kind_names[t->k]; }
const char *tsr__chat_template_default_system(const chat_template *t) { return t->default_system; }

/* ---- rendering ----------------------------------------------------------- */

typedef struct sbuf {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void put_n(sbuf *b, const char *s, size_t n) {
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        char *p;
        while (cap < b->n + n + 1) cap *= 2;
        if (!(p = tsr__realloc(b->s, cap))) {
            b->oom = 1;
            return;
        }
        b->s = p, b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void put(sbuf *b, const char *s) { put_n(b, s, strlen(s)); }

/* Appends s without leading and trailing white space. */
static void put_trim(sbuf *b, const char *s) {
    size_t n = strlen(s);
    while (n && isspace((unsigned char)*s)) s++, n--;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    put_n(b, s, n);
}

static int is_role(const chat_msg *m, const char *r) { return strcmp(m->role, r) == 0; }

static void render_mistral(sbuf *b, kind k, const chat_msg *m, size_t n) {
    const char *lead = k == K_MISTRAL_V1 ? " " : "", *trail = k == K_MISTRAL_V3_TEKKEN ? "" : " ";
    int inside = 0;
    for (size_t i = 0; i < n; i++) {
        if (!inside) {
            put(b, lead), put(b, "[INST]"), put(b, trail);
            inside = 1;
        }
        if (is_role(&m[i], "system")) {
            put(b, m[i].content), put(b, "\n\n");
        } else if (is_role(&m[i], "user")) {
            put(b, m[i].content), put(b, lead), put(b, "[/INST]");
        } else {
            put(b, trail);
            if (k == K_MISTRAL_V3)
                put_trim(b, m[i].content);
            else
                put(b, m[i].content);
            put(b, "</s>");
            inside = 0;
        }
    }
}

static void render_mistral_v7(sbuf *b, const chat_msg *m, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (is_role(&m[i], "system"))
            put(b, "[SYSTEM_PROMPT] "), put(b, m[i].content), put(b, "[/SYSTEM_PROMPT]");
        else if (is_role(&m[i], "user"))
            put(b, "[INST] "), put(b, m[i].content), put(b, "[/INST]");
        else
            put(b, " "), put(b, m[i].content), put(b, "</s>");
    }
}

static void render_llama2(sbuf *b, kind k, const chat_msg *m, size_t n) {
    int inside = 1; /* the first [INST] comes without BOS: the tokenizer adds it */
    put(b, "[INST] ");
    for (size_t i = 0; i < n; i++) {
        if (!inside) {
            put(b, k == K_LLAMA2_SYS_BOS ? "<s>[INST] " : "[INST] ");
            inside = 1;
        }
        if (is_role(&m[i], "system")) {
            put(b, k == K_LLAMA2 ? "" : "<<SYS>>\n");
            k == K_LLAMA2_SYS_STRIP ? put_trim(b, m[i].content) : put(b, m[i].content);
            put(b, k == K_LLAMA2 ? "\n" : "\n<</SYS>>\n\n");
        } else if (is_role(&m[i], "user")) {
            k == K_LLAMA2_SYS_STRIP ? put_trim(b, m[i].content) : put(b, m[i].content);
            put(b, " [/INST]");
        } else {
            k == K_LLAMA2_SYS_STRIP ? put_trim(b, m[i].content) : put(b, m[i].content);
            put(b, "</s>");
            inside = 0;
        }
    }
}

static void render_gemma(sbuf *b, const chat_msg *m, size_t n, int add) {
    sbuf sys = {0};
    for (size_t i = 0; i < n; i++) {
        int model = is_role(&m[i], "assistant");
        if (is_role(&m[i], "system")) { /* gemma has no system turn: it joins the next user turn */
            put_trim(&sys, m[i].content);
            continue;
        }
        put(b, "<start_of_turn>"), put(b, model ? "model" : m[i].role), put(b, "\n");
        if (sys.n && !model) {
            put(b, sys.s), put(b, "\n\n");
            sys.n = 0;
        }
        put_trim(b, m[i].content), put(b, "<end_of_turn>\n");
    }
    if (add)
        put(b, "<start_of_turn>model\n");
    b->oom |= sys.oom;
    tsr__free(sys.s);
}

static void render_simple(sbuf *b, kind k, const chat_msg *m, size_t n, int add) {
    for (size_t i = 0; i < n; i++) {
        if (k == K_CHATML) {
            put(b, "<|im_start|>"), put(b, m[i].role), put(b, "\n"), put(b, m[i].content);
            put(b, "<|im_end|>\n");
        } else if (k == K_LLAMA3) {
            put(b, "<|start_header_id|>"), put(b, m[i].role), put(b, "<|end_header_id|>\n\n");
            put_trim(b, m[i].content), put(b, "<|eot_id|>");
        } else if (k == K_ZEPHYR) {
            put(b, "<|"), put(b, m[i].role), put(b, "|>\n"), put(b, m[i].content), put(b, "<|endoftext|>\n");
        } else { /* phi3 */
            put(b, "<|"), put(b, m[i].role), put(b, "|>\n"), put(b, m[i].content), put(b, "<|end|>\n");
        }
    }
    if (add)
        put(b, k == K_CHATML   ? "<|im_start|>assistant\n"
               : k == K_LLAMA3 ? "<|start_header_id|>assistant<|end_header_id|>\n\n"
                               : "<|assistant|>\n");
}

tsr_status tsr__chat_format(const chat_template *t, const chat_msg *msgs, size_t n, int add_assistant, char **out) {
    sbuf b = {0};
    chat_msg *all = NULL;

    if (!t || (!msgs && n) || !out)
        return tsr__error(TSR_E_INVALID, "chat_format: NULL argument");
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return tsr__error(TSR_E_INVALID, "chat_format: message %zu has no role or content", i);
    *out = NULL;
    if (t->default_system && (n == 0 || !is_role(&msgs[0], "system"))) {
        if (!(all = tsr__malloc((n + 1) * sizeof *all)))
            return tsr__error(TSR_E_NOMEM, "chat: out of memory");
        all[0] = (chat_msg){"system", t->default_system};
        if (n)
            memcpy(all + 1, msgs, n * sizeof *msgs);
        msgs = all, n++;
    }
    put(&b, "");
    if (t->k == K_MISTRAL_V1 || t->k == K_MISTRAL_V3 || t->k == K_MISTRAL_V3_TEKKEN)
        render_mistral(&b, t->k, msgs, n);
    else if (t->k == K_MISTRAL_V7)
        render_mistral_v7(&b, msgs, n);
    else if (t->k >= K_LLAMA2 && t->k <= K_LLAMA2_SYS_STRIP)
        render_llama2(&b, t->k, msgs, n);
    else if (t->k == K_GEMMA)
        render_gemma(&b, msgs, n, add_assistant);
    else
        render_simple(&b, t->k, msgs, n, add_assistant);
    tsr__free(all);
    if (b.oom) {
        tsr__free(b.s);
        return tsr__error(TSR_E_NOMEM, "chat: out of memory");
    }
    *out = b.s;
    return TSR_OK;
}
