/*
 * fuzz-chat.c - fuzz target for the chat-template detector and formatter
 * (libtensr/model/chat.h). The input is split at NUL bytes: byte 0 holds
 * the flags (bit 0: field 1 is a template name for tsr__chat_template_by_name
 * rather than Jinja text for tsr__chat_template_detect; bit 1: add_assistant),
 * field 1 is the template, each further field is a message whose first
 * byte picks the role (system, user, assistant, or an unknown "tool") and
 * whose rest is the content. Detection may fail (TSR_E_UNSUPPORTED, with a
 * message); a detected template must format any conversation into a
 * NUL-terminated string, or fail with a message.
 *
 * make fuzz builds it with libFuzzer; make check replays
 * tests/fuzz/corpus-chat/ (fuzz-replay.h).
 */
#include "libtensr.h"
#include "libtensr/model/chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_MSGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    if (size < 1) return 0;
    int by_name = data[0] & 1, add_assistant = data[0] >> 1 & 1;
    char *buf = malloc(size + 1); /* fields NUL-terminated in place */
    if (!buf) return 0;
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = '\0';
    char *end = buf + size - 1, *field = buf + strlen(buf) + 1;
    chat_msg msgs[MAX_MSGS];
    size_t n = 0;
    while (field <= end && n < MAX_MSGS) {
        size_t len = strlen(field);
        msgs[n].role = roles[len ? (unsigned char)field[0] % 4 : 1];
        msgs[n].content = len ? field + 1 : field;
        n++;
        field += len + 1;
    }
    chat_template *t = NULL;
    tsr_status st = by_name ? tsr__chat_template_by_name(buf, &t) : tsr__chat_template_detect(buf, &t);
    if (st != TSR_OK) {
        if (t || !tsr_last_error()[0]) abort();
        free(buf);
        return 0;
    }
    if (!t || !tsr__chat_template_name(t)) abort();
    const char *sys = tsr__chat_template_default_system(t);
    if (sys) (void)strlen(sys);
    char *out = NULL;
    st = tsr__chat_format(t, msgs, n, add_assistant, &out);
    if (st == TSR_OK) {
        if (!out) abort();
        (void)strlen(out);
    } else if (!tsr_last_error()[0]) {
        abort();
    }
    tsr__free(out);
    tsr__chat_template_free(t);
    free(buf);
    return 0;
}

#define FUZZ_NAME "chat"
#include "fuzz-replay.h"
