#!/usr/bin/env python3
"""Writes a random-weight mixture of experts (F16) to benchmark with.

Usage: bench/make-moe.py [--arch qwen3moe|deepseek2] OUT.gguf

No real MoE model small enough for this machine is at hand, and the speed of
a matmul does not depend on its weights' values, so the MoE comparison runs
on a synthetic one: 12 layers, n_embd 512, 8 query / 2 KV heads of 64,
32 experts of 512 x 256 (4 per token, q/k norms), a tiny byte-level BPE
vocabulary -- about 151M expert parameters (319 MB as F16), written with
tests/make_tiny_models.py's deterministic weights. Requantize it with
llama.cpp's llama-quantize (bench/build-llama.sh builds it) and compare:

    bench/make-moe.py /tmp/moe-f16.gguf
    ~/.cache/libtensr/llama.cpp-*/build-native/bin/llama-quantize /tmp/moe-f16.gguf /tmp/moe-q4_0.gguf Q4_0
    bench/compare.sh -m /tmp/moe-q4_0.gguf

(generation's % of the bandwidth ceiling counts the whole file there, not the
experts a token reads.)

--arch deepseek2 writes DeepSeek-V2-Lite's proportions at a quarter of its
width: 27 layers (the first dense, FFN 2736), n_embd 512, 16 heads of
multi-head latent attention (plain attn_q, kv LoRA 512, rope 64, nope 128,
v 128, split attn_k_b / attn_v_b as newer conversions write them), 64
routed experts of 512 x 352 (6 per token, softmax gating, not renormalised)
plus 2 shared -- about 1.04B parameters (2.1 GB as F16). Quantized to
Q4_K_M, the experts' down matrices (352 wide) take llama-quantize's
fallback type, as V2-Lite's (1408 wide) do.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import make_tiny_models as m  # noqa: E402

CFG = dict(arch="qwen3moe", seed=31, vocab="bpe", ftype="f16", n_embd=512, n_head=8, n_head_kv=2, head_dim=64,
           n_layer=12, n_ff=1024, n_ctx=4096, rope_base=1000000.0, eps=1e-6, qk_norm=True, n_expert=32,
           n_expert_used=4, n_ff_exp=256, gate_scale=2.0)
DS_CFG = dict(arch="deepseek2", seed=37, vocab="bpe", ftype="f16", n_embd=512, n_head=16, n_head_kv=1, head_dim=0,
              n_layer=27, n_ff=2736, n_ctx=4096, rope_base=10000.0, eps=1e-6, q_lora=0, kv_lora=512, rope=64,
              nope=128, v_mla=128, legacy_kv_b=False, n_expert=64, n_expert_used=6, n_ff_exp=352, n_shared=2,
              n_dense_lead=1, gating=1, w_norm=False, w_scale=1.0, gate_scale=2.0)


def main(argv):
    args = argv[1:]
    cfg, name = CFG, "bench-qwen3moe"
    if len(args) == 3 and args[0] == "--arch" and args[1] in ("qwen3moe", "deepseek2"):
        if args[1] == "deepseek2":
            cfg, name = DS_CFG, "bench-deepseek2"
        args = args[2:]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    m.ALL_MODELS[name] = cfg
    m.write_model(name, args[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
