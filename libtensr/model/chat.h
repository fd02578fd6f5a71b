/* chat.h - chat templates for instruct models (libtensr/model).
 *
 * We do not run Jinja: a template is recognized by markers in the text of
 * tokenizer.chat_template (as llama.cpp's llama_chat_apply_template does)
 * and rendered by hand. Recognized: ChatML (<|im_start|>, with the default
 * system message some templates insert, e.g. SmolLM2's), llama-2 [INST]
 * (with/without <<SYS>>), Mistral v1/v3/v3-tekken/v7, llama-3
 * (<|start_header_id|>), zephyr (<|user|> ... <|endoftext|>), gemma
 * (<start_of_turn>) and phi-3 (<|assistant|> ... <|end|>). Anything else
 * fails with TSR_E_UNSUPPORTED, never a guess. */
#ifndef TSR_MODEL_CHAT_H
#define TSR_MODEL_CHAT_H

#include <stddef.h>

#include "bridge.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct chat_msg {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
} chat_msg;

typedef struct chat_template chat_template;

/* Recognizes a template from its Jinja text. */
tsr_status tsr__chat_template_detect(const char *text, chat_template **out);
/* By name: chatml, llama2, llama2-sys, mistral-v1, mistral-v3,
 * mistral-v3-tekken, mistral-v7, llama3, zephyr, gemma, phi3. */
tsr_status tsr__chat_template_by_name(const char *name, chat_template **out);
void tsr__chat_template_free(chat_template *t); /* NULL is a no-op */
const char *tsr__chat_template_name(const chat_template *t);
/* The system message the template inserts when the conversation has none
 * (NULL when it inserts none). */
const char *tsr__chat_template_default_system(const chat_template *t);

/* Renders msgs[0..n) into a prompt; add_assistant opens the assistant's
 * turn. *out is tsr__malloc'ed and NUL-terminated (free with tsr__free()). Tokenize it
 * with special-token parsing on. */
tsr_status tsr__chat_format(const chat_template *t, const chat_msg *msgs, size_t n, int add_assistant, char **out);

#ifdef __cplusplus
}
#endif

#endif
