/*
 * fuzz-server.c - fuzz target for tensr-server's request parser and its
 * parameter mapping (examples/server/tensr-server.c, included whole without
 * its main): the body's JSON depth check, jansson's parse, then the
 * mapping of an OpenAI request to sampler and request parameters
 * (parse_common: sampling ranges, logit_bias, logprobs, stop strings, the
 * unsupported fields) and the prompt (chat messages or a completion's
 * prompt), as the route does; and the response side's text mapping
 * (json_text: any bytes become a valid JSON string). Byte 0 picks a chat
 * (bit 0) and the rest is the body. No model is loaded: logit_bias ids are
 * all out of range and a chat stops at formatting, each with a 400's
 * message, which the target checks is set.
 *
 * make fuzz builds it with libFuzzer (when ./configure found the server's
 * libraries); make check replays tests/fuzz/corpus-server/ (fuzz-replay.h).
 */
#define TSR_SERVER_NO_MAIN
#pragma GCC diagnostic ignored "-Wunused-function"
#include "../../examples/server/tensr-server.c"

const char tsr_chat_page[] = "";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    int chat = data[0] & 1;
    const char *body_text = (const char *)data + 1;
    size_t n = size - 1;
    json_decref(json_text(body_text, n));
    if (json_depth(body_text, n, JSON_DEPTH_MAX) > JSON_DEPTH_MAX)
        return 0;
    json_error_t je;
    json_t *body = json_loadb(body_text, n, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(body)) {
        json_decref(body);
        return 0;
    }
    req r;
    memset(&r, 0, sizeof r);
    bad b = {NULL, ""};
    if (!parse_common(body, chat, &r, &b) || !(chat ? chat_prompt(body, &r, &b) : text_prompt(body, &r, &b))) {
        if (!b.msg[0])
            abort(); /* a refusal always says why */
    } else {
        /* the mapping's invariants */
        if (r.n_stop > MAX_STOP || r.n_top < 0 || r.n_top > TOP_MAX || r.sp.n_logit_bias > 300 || !r.prompt)
            abort();
    }
    free(r.prompt);
    json_decref(body);
    return 0;
}

#define FUZZ_NAME "server"
#include "fuzz-replay.h"
