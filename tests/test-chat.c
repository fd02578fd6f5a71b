/* test-chat.c - chat templates of the model example: recognition by markers,
 * each format on a small conversation (expected strings written from
 * llama.cpp's built-in templates), failure on an unknown template, and — when
 * the SmolLM2 model is present ($TSR_MODEL or the get-model.sh cache) — its
 * real template rendered exactly as Jinja renders it, tokenized into the
 * prompt ids recorded in tests/data/refs/greedy-smollm2.json. The same for
 * Gemma 3 270M (its GGUF has no chat template: the model layer gives
 * gemma3 files Gemma's turns, and llama.cpp's built-in "gemma" rendering
 * recorded in greedy-gemma3.json must come out) when it is cached. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "libtensr/model/chat.h"
#include "libtensr/model/tokenizer.h"

#include "tsrtest.h"

static const chat_msg conv[] = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};

static void expect(const char *tmpl_text, const char *name, const char *want)
{
    chat_template *t = NULL;
    char *out = NULL;
    tsr_status st = tsr__chat_template_detect(tmpl_text, &t);
    CHECK(st == TSR_OK, "detect %s: %s", name, tsr_last_error());
    if (st != TSR_OK)
        return;
    CHECK(!strcmp(tsr__chat_template_name(t), name), "detected %s, expected %s", tsr__chat_template_name(t), name);
    CHECK(tsr__chat_format(t, conv, 4, 1, &out) == TSR_OK, "format: %s", tsr_last_error());
    CHECK(out && !strcmp(out, want), "%s rendered\n%s\nexpected\n%s", name, out ? out : "(null)", want);
    tsr__free(out);
    tsr__chat_template_free(t);
}

static void test_templates(void)
{
    chat_template *t = NULL;
    char *out = NULL;
    expect("{% for m in messages %}<|im_start|>{{ m.role }}\n...", "chatml",
           "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
           "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
    expect("{{ bos_token }}{% ... '<<SYS>>\\n' ... '[INST] ' ... %}", "llama2-sys",
           "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]Hello!</s>[INST] Bye [/INST]");
    expect("{%- if messages[0]['role'] == 'system' %}...{{ '[INST] ' + content }}", "llama2",
           "[INST] Be brief.\nHi [/INST]Hello!</s>[INST] Bye [/INST]");
    expect("{{ '[SYSTEM_PROMPT]' }} [INST]", "mistral-v7",
           "[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST] Hi[/INST] Hello!</s>[INST] Bye[/INST]");
    expect("{{ bos_token }}{{ ' [INST] ' + system_message }}", "mistral-v1",
           " [INST] Be brief.\n\nHi [/INST] Hello!</s> [INST] Bye [/INST]");
    expect("<|start_header_id|>' + message['role'] + '<|end_header_id|>", "llama3",
           "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect("<|user|>\n{{ content }}<|endoftext|>", "zephyr",
           "<|system|>\nBe brief.<|endoftext|>\n<|user|>\nHi<|endoftext|>\n<|assistant|>\nHello!<|endoftext|>\n"
           "<|user|>\nBye<|endoftext|>\n<|assistant|>\n");
    expect("<start_of_turn>{{ role }}", "gemma",
           "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
           "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
    expect("<|assistant|> ... <|end|>", "phi3",
           "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n<|user|>\nBye<|end|>\n"
           "<|assistant|>\n");

    CHECK(tsr__chat_template_detect("{{ messages | tojson }}", &t) == TSR_E_UNSUPPORTED, "unknown template fails");
    CHECK(strstr(tsr_last_error(), "unknown chat template"), "message: %s", tsr_last_error());
    CHECK(tsr__chat_template_by_name("nope", &t) == TSR_E_NOT_FOUND, "unknown name");
    CHECK(tsr__chat_template_by_name("chatml", &t) == TSR_OK, "by name");
    CHECK(tsr__chat_format(t, NULL, 0, 1, &out) == TSR_OK && !strcmp(out, "<|im_start|>assistant\n"), "empty chat");
    tsr__free(out);
    tsr__chat_template_free(t);
    tsr__chat_template_free(NULL);
}

/* SmolLM2's template inserts its own system turn when there is none. */
static void test_default_system(void)
{
    const char *tmpl = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                       "{{ '<|im_start|>system\nYou are SmolLM<|im_end|>\n' }}{% endif %}"
                       "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
                       "{% endfor %}";
    chat_template *t = NULL;
    char *out = NULL;
    CHECK(tsr__chat_template_detect(tmpl, &t) == TSR_OK, "detect");
    CHECK(t && tsr__chat_template_default_system(t) && !strcmp(tsr__chat_template_default_system(t), "You are SmolLM"),
          "default system");
    CHECK(tsr__chat_format(t, conv + 1, 1, 1, &out) == TSR_OK, "format");
    CHECK(!strcmp(out, "<|im_start|>system\nYou are SmolLM<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                       "<|im_start|>assistant\n"),
          "rendered %s", out);
    tsr__free(out);
    CHECK(tsr__chat_format(t, conv, 2, 0, &out) == TSR_OK, "format");
    CHECK(!strcmp(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"),
          "own system kept: %s", out);
    tsr__free(out);
    tsr__chat_template_free(t);
}

/* Decodes the JSON string value of key in line (\n \" \\ \uXXXX). */
static char *json_str(const char *line, const char *key)
{
    char pat[64], *out, *o;
    const char *p;
    snprintf(pat, sizeof pat, "\"%s\": \"", key);
    if (!(p = strstr(line, pat)) || !(out = o = malloc(strlen(p) + 1)))
        return NULL;
    for (p += strlen(pat); *p && *p != '"'; p++) {
        if (*p != '\\') {
            *o++ = *p;
            continue;
        }
        p++;
        if (*p == 'n')
            *o++ = '\n';
        else if (*p == 't')
            *o++ = '\t';
        else if (*p == 'u') { /* the refs only escape ASCII this way */
            unsigned x = 0;
            sscanf(p + 1, "%4x", &x);
            *o++ = (char)x;
            p += 4;
        } else
            *o++ = *p;
    }
    *o = '\0';
    return out;
}

static void test_model(const char *label, const char *model, const char *refs)
{
    tsr_gguf *g = NULL;
    const char *text;
    chat_template *t = NULL;
    tok_vocab *v = NULL;
    FILE *f;
    char *line = NULL;
    size_t cap = 0;
    int n_chat = 0;

    if (tsr_gguf_open(model, &g) != TSR_OK) {
        CHECK(0, "open %s: %s", model, tsr_last_error());
        return;
    }
    if (tsr_gguf_find_key(g, "tokenizer.chat_template") < 0) { /* gemma3: what api.c's load_template picks */
        const char *arch = "";
        CHECK(tsr_gguf_get_str(g, "general.architecture", &arch, NULL) == TSR_OK && !strcmp(arch, "gemma3"),
              "%s: no chat template, architecture %s", label, arch);
        CHECK(tsr__chat_template_by_name("gemma", &t) == TSR_OK, "gemma: %s", tsr_last_error());
    } else {
        CHECK(tsr_gguf_get_str(g, "tokenizer.chat_template", &text, NULL) == TSR_OK, "chat template key");
        CHECK(tsr__chat_template_detect(text, &t) == TSR_OK, "detect: %s", tsr_last_error());
    }
    CHECK(tsr__tok_vocab_load(g, &v) == TSR_OK, "vocab: %s", tsr_last_error());
    tsr_gguf_close(g);
    if (!t || !v || !(f = fopen(refs, "r"))) {
        CHECK(0, "setup for %s", refs);
        goto done;
    }
    while (getline(&line, &cap, f) > 0) {
        char *want = json_str(line, "prompt"), *sys = json_str(line, "content"), *out = NULL;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (!strstr(line, "\"chat\": 1") || !want) {
            free(want), free(sys);
            continue;
        }
        /* the recorded conversations: one user message, or system + user */
        chat_msg m[2];
        const char *user = strstr(line, "\"role\": \"user\", \"content\": \"");
        char *u = user ? json_str(user, "content") : NULL;
        size_t n = 0;
        if (strstr(line, "\"role\": \"system\""))
            m[n++] = (chat_msg){"system", sys};
        m[n++] = (chat_msg){"user", u ? u : ""};
        CHECK(tsr__chat_format(t, m, n, 1, &out) == TSR_OK && !strcmp(out, want), "%s chat prompt\n%s\nllama.cpp gave\n%s",
              label, out ? out : "", want);
        CHECK(out && tsr__tok_tokenize(v, out, strlen(out), 1, 1, &ids, &n_ids) == TSR_OK, "tokenize");
        if (ids) {
            const char *p = strstr(line, "\"prompt_ids\": [");
            size_t k = 0;
            int same = p != NULL;
            for (p = p ? p + 15 : NULL; p && *p != ']' && k < n_ids; k++) {
                char *end;
                same &= strtol(p, &end, 10) == ids[k];
                p = end + (end[0] == ',' ? 2 : 0);
            }
            CHECK(same && k == n_ids && p && *p == ']', "prompt ids differ from llama.cpp's");
        }
        n_chat++;
        tsr__free(ids), tsr__free(out), free(want), free(sys), free(u);
    }
    CHECK(n_chat == 2, "%d chat cases in %s", n_chat, refs);
    printf("%s chat template: %d recorded prompts rendered and tokenized identically\n", label, n_chat);
    fclose(f);
done:
    free(line);
    tsr__chat_template_free(t);
    tsr__tok_vocab_free(v);
}

int main(void)
{
    char model[4096], refs[4096];
    const char *env = getenv("TSR_MODEL"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    const char *top = getenv("top_srcdir");
    FILE *f;

    test_templates();
    test_default_system();
    if (env && *env)
        snprintf(model, sizeof model, "%s", env);
    else if (xdg && *xdg)
        snprintf(model, sizeof model, "%s/libtensr/SmolLM2-135M-Instruct.Q4_1.gguf", xdg);
    else
        snprintf(model, sizeof model, "%s/.cache/libtensr/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : ".");
    snprintf(refs, sizeof refs, "%s/tests/data/refs/greedy-smollm2.json", top ? top : ".");
    if ((f = fopen(model, "rb"))) {
        fclose(f);
        test_model("SmolLM2", model, refs);
    } else {
        printf("note: %s absent, the SmolLM2 template check did not run\n", model);
    }
    if (xdg && *xdg)
        snprintf(model, sizeof model, "%s/libtensr/gemma-3-270m-q4_k_m.gguf", xdg);
    else
        snprintf(model, sizeof model, "%s/.cache/libtensr/gemma-3-270m-q4_k_m.gguf", home ? home : ".");
    snprintf(refs, sizeof refs, "%s/tests/data/refs/greedy-gemma3.json", top ? top : ".");
    if ((f = fopen(model, "rb"))) {
        fclose(f);
        test_model("Gemma 3", model, refs);
    } else {
        printf("note: %s absent, the Gemma 3 template check did not run (test-model-gemma3.py fetches it)\n", model);
    }
    return tsrtest_done("test-chat");
}
