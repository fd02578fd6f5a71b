/* deepseek2.c - placeholder row of the architecture table: refused. */
#include "model.h"

tsr_status deepseek2_hparams_read(const tsr_gguf *g, llm_hparams *hp) {
    (void)hp;
    return tsr__error(TSR_E_UNSUPPORTED, "%s: architecture 'deepseek2' is not supported yet", tsr_gguf_path(g));
}
int deepseek2_known_tensor(const llm_hparams *hp, const char *suffix) {
    (void)hp;
    (void)suffix;
    return -1;
}
tsr_status deepseek2_bind_layer(tsr_model *m, int il) { return llm_bind_layer_std(m, il); }
tsr_tensor *deepseek2_graph(llm_fwd *f, tsr_tensor *tokens) { return llama_graph(f, tokens); }
