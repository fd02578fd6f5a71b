#!/usr/bin/env python3
"""Writes tiny random-weight llama/Mistral-style GGUF models, deterministically.

Usage: make_tiny_models.py OUTDIR [NAME...]   (default: all models)

The models exercise what real Mistral-style files have and SmolLM2 lacks:
a head dimension different from n_embd / n_head (attention.key_length and
value_length), grouped-query attention, an untied output.weight, F32 or F16
weights, and a small SentencePiece or byte-level BPE vocabulary written into
the metadata (so llama.cpp can load them and tokenizers can be compared).

Weights do not come from numpy's RNG (whose streams may change between
versions) but from a fixed formula that any language can reproduce:
tensor number t (0-based, in the order written), element i (row-major over
the numpy shape, i.e. GGUF order) gets

    z = splitmix64((seed << 48) ^ (t << 32) ^ i)
    u = (z >> 11) * 2**-53                      # in [0, 1)
    w = (2u - 1) * scale                        # scale = sqrt(3 / fan_in)

norm weights are 1 + 0.25 * (2u - 1); F16 tensors are rounded to nearest
even. splitmix64(x): x += 0x9E3779B97F4A7C15; x = (x ^ x>>30) *
0xBF58476D1CE4E5B9; x = (x ^ x>>27) * 0x94D049BB133111EB; x ^= x>>31 (all
mod 2**64).
"""
import json
import sys

import numpy as np
import gguf

M64 = (1 << 64) - 1

MODELS = {
    # SentencePiece vocabulary, F32 weights, head_dim 32 != 64 / 4.
    "tiny-mistral-spm-f32": dict(seed=7, vocab="spm", ftype="f32", n_embd=64, n_head=4, n_head_kv=2,
                                 head_dim=32, n_layer=2, n_ff=96, n_ctx=256, rope_base=10000.0,
                                 eps=1e-5),
    # byte-level BPE (llama-bpe pre-tokenizer), F16 weights, head_dim 16 != 48 / 6.
    "tiny-mistral-bpe-f16": dict(seed=11, vocab="bpe", ftype="f16", n_embd=48, n_head=6, n_head_kv=2,
                                 head_dim=16, n_layer=3, n_ff=80, n_ctx=256, rope_base=500000.0,
                                 eps=1e-6),
}

SPM_PIECES = [
    "▁", "e", "t", "a", "o", "i", "n", "s", "h", "r", "d", "l", "u", "c", "m", "w", "f", "g",
    "y", "p", "b", "v", "k", "x", "j", "q", "z", ".", ",", "!", "?", "'", "T", "H", "I", "A",
    "▁t", "he", "▁the", "in", "▁a", "er", "on", "▁of", "is", "ll", "▁is", "es", "at", "re",
    "▁w", "or", "an", "nd", "▁and", "ing", "▁in", "en", "▁b", "▁s", "▁c", "ou", "it", "▁to",
    "▁T", "▁The", "▁H", "▁Hello", "ello", "▁world", "orld", "▁I", "▁quick", "▁brown", "▁fox",
    "é", "▁caf", "▁café", "ö", "▁wö", "▁▁", "▁▁▁▁", "12", "3", "1", "2", "0", "9",
]

BPE_WORDS = ["the", "Ġthe", "Ġa", "in", "Ġin", "er", "on", "Ġof", "and", "Ġand", "Ġto", "ing",
             "Ġis", "Hello", "ĠHello", "Ġworld", "Ġquick", "Ġbrown", "Ġfox", "ĊĊ", "ĠĠ",
             "ĠĠĠĠ", "12", "123", "ĠThe", "Ġcaf", "Ã©", "ĠcafÃ©"]


def uniform(seed, t, n):
    """n values in [0, 1) for tensor number t."""
    with np.errstate(over="ignore"):
        i = np.arange(n, dtype=np.uint64)
        key = np.uint64((seed << 48) ^ (t << 32)) ^ i
        x = key + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) * (2.0 ** -53)


def spm_vocab():
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES
    types = [2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES)
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(SPM_PIECES))]
    # a longer piece scores higher than its parts, as a trained model tends to
    for k, p in enumerate(SPM_PIECES):
        scores[259 + k] += 2.0 * len(p)
    return toks, types, scores


def gpt2_byte_chars():
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def bpe_vocab():
    chars = gpt2_byte_chars()
    toks = [chars[b] for b in range(256)]
    merges = []
    have = set(toks)
    for w in BPE_WORDS:
        # merge left to right: w[:k] + w[k] for every prefix
        cur = w[0]
        for ch in w[1:]:
            if cur + ch not in have:
                merges.append(f"{cur} {ch}")
                toks.append(cur + ch)
                have.add(cur + ch)
            cur += ch
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    types = [1] * len(toks) + [3] * len(specials)
    return toks + specials, types, merges


def tensors(cfg):
    """(name, numpy shape, is_norm) in writing order."""
    e, hd, nh, nkv, ff = cfg["n_embd"], cfg["head_dim"], cfg["n_head"], cfg["n_head_kv"], cfg["n_ff"]
    v = cfg["n_vocab"]
    out = [("token_embd.weight", (v, e), False)]
    for il in range(cfg["n_layer"]):
        p = f"blk.{il}."
        out += [(p + "attn_norm.weight", (e,), True),
                (p + "attn_q.weight", (nh * hd, e), False),
                (p + "attn_k.weight", (nkv * hd, e), False),
                (p + "attn_v.weight", (nkv * hd, e), False),
                (p + "attn_output.weight", (e, nh * hd), False),
                (p + "ffn_norm.weight", (e,), True),
                (p + "ffn_gate.weight", (ff, e), False),
                (p + "ffn_up.weight", (ff, e), False),
                (p + "ffn_down.weight", (e, ff), False)]
    out += [("output_norm.weight", (e,), True), ("output.weight", (v, e), False)]
    return out


def write_model(name, path):
    cfg = dict(MODELS[name])
    if cfg["vocab"] == "spm":
        toks, types, scores = spm_vocab()
        merges = None
    else:
        toks, types, merges = bpe_vocab()
        scores = None
    cfg["n_vocab"] = len(toks)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(name)
    w.add_context_length(cfg["n_ctx"])
    w.add_embedding_length(cfg["n_embd"])
    w.add_block_count(cfg["n_layer"])
    w.add_feed_forward_length(cfg["n_ff"])
    w.add_head_count(cfg["n_head"])
    w.add_head_count_kv(cfg["n_head_kv"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_base"])
    w.add_layer_norm_rms_eps(cfg["eps"])
    w.add_vocab_size(cfg["n_vocab"])
    w.add_file_type(0 if cfg["ftype"] == "f32" else 1)
    if cfg["vocab"] == "spm":
        w.add_tokenizer_model("llama")
        w.add_token_list(toks)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
    else:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("llama-bpe")
        w.add_token_list(toks)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(len(toks) - 3)
        w.add_eos_token_id(len(toks) - 2)
        w.add_add_bos_token(True)
    for t, (tname, shape, is_norm) in enumerate(tensors(cfg)):
        n = int(np.prod(shape))
        u = uniform(cfg["seed"], t, n)
        if is_norm:
            a = 1.0 + 0.25 * (2.0 * u - 1.0)
        else:
            a = (2.0 * u - 1.0) * np.sqrt(3.0 / shape[-1])
        a = a.reshape(shape)
        if cfg["ftype"] == "f16" and not is_norm:
            a = a.astype(np.float16)
        else:
            a = a.astype(np.float32)
        w.add_tensor(tname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return cfg


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    names = argv[2:] or list(MODELS)
    for n in names:
        cfg = write_model(n, f"{argv[1]}/{n}.gguf")
        print(json.dumps({"name": n, **cfg}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
