#!/usr/bin/env python3
"""Writes a random-weight qwen3moe GGUF (F16) to benchmark mixtures of experts.

Usage: bench/make-moe.py OUT.gguf

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
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import make_tiny_models as m  # noqa: E402

CFG = dict(arch="qwen3moe", seed=31, vocab="bpe", ftype="f16", n_embd=512, n_head=8, n_head_kv=2, head_dim=64,
           n_layer=12, n_ff=1024, n_ctx=4096, rope_base=1000000.0, eps=1e-6, qk_norm=True, n_expert=32,
           n_expert_used=4, n_ff_exp=256, gate_scale=2.0)


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    m.ALL_MODELS["bench-qwen3moe"] = CFG
    m.write_model("bench-qwen3moe", argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
