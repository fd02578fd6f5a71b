#!/usr/bin/env python3
"""Writes a random-weight dense llama (F16) of TinyLlama-1.1B's shape.

Usage: bench/make-dense.py OUT.gguf

A 135M model sits in the caches; people run models whose weights stream
from DRAM every token. No 1B-class model is at hand on the machines here,
and the speed of a matmul does not depend on its weights' values, so the
1B-class comparison runs on a synthetic one: TinyLlama-1.1B's shape (22
layers, n_embd 2048, 32 query / 4 KV heads of 64, FFN 5632, untied output,
a 32000-token vocabulary: a tiny byte-level BPE padded with unused tokens,
a ChatML chat template for server benchmarks),
about 1.1B parameters (2.2 GB as F16), written with
tests/make_tiny_models.py's deterministic weights. Requantize it with
llama.cpp's llama-quantize (bench/build-llama.sh builds it) and compare:

    bench/make-dense.py /tmp/dense-f16.gguf
    ~/.cache/libtensr/llama.cpp-*/build-native/bin/llama-quantize /tmp/dense-f16.gguf /tmp/dense-q4_k_m.gguf Q4_K_M
    bench/compare.sh -m /tmp/dense-q4_k_m.gguf,/tmp/dense-f16.gguf

make bench-compare BENCH_DENSE=1 does all of this (files cached).
"""
import os
import sys
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import make_tiny_models as m  # noqa: E402

N_VOCAB = 32000
CFG = dict(arch="llama", seed=41, vocab="bpe", ftype="f16", n_embd=2048, n_head=32, n_head_kv=4, head_dim=64,
           n_layer=22, n_ff=5632, n_ctx=4096 + 640, rope_base=10000.0, eps=1e-5)


# ChatML, so that a server benchmark's chat requests have a template
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class Writer(m.gguf.GGUFWriter):
    def write_header_to_file(self, *args, **kwargs):
        self.add_chat_template(CHAT_TEMPLATE)
        return super().write_header_to_file(*args, **kwargs)


def padded_bpe_vocab(base=m.bpe_vocab):
    toks, types, merges = base()
    # keep the specials last (their ids are taken from the end)
    n_spec = 3
    body, spec = toks[:-n_spec], toks[-n_spec:]
    tbody, tspec = types[:-n_spec], types[-n_spec:]
    pad = [f"<unused{i}>" for i in range(N_VOCAB - len(toks))]
    return body + pad + spec, tbody + [4] * len(pad) + tspec, merges


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    m.bpe_vocab = padded_bpe_vocab
    shim = types.ModuleType("gguf")  # make_tiny_models' gguf, with the writer above
    shim.__dict__.update(m.gguf.__dict__)
    shim.GGUFWriter = Writer
    m.gguf = shim
    m.ALL_MODELS["bench-dense-1b"] = CFG
    m.write_model("bench-dense-1b", argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
