#!/usr/bin/env python3
"""Writes tiny random-weight GGUF models of the llama family, deterministically.

Usage: make_tiny_models.py OUTDIR [NAME...]   (default: all models)

The models exercise what real Mistral-style files have and SmolLM2 lacks:
a head dimension different from n_embd / n_head (attention.key_length and
value_length), grouped-query attention, an untied output.weight, F32 or F16
weights, and a small SentencePiece or byte-level BPE vocabulary written into
the metadata (so llama.cpp can load them and tokenizers can be compared);
and the other architectures of the model layer (ARCH_MODELS): qwen2 (Q/K/V
biases, NEOX rope, tied head), qwen3 (per-head q/k norms), llama with
experts (Mixtral-style; F32 and Q8_0 experts) and qwen3moe.

reference() is a plain float64 numpy forward pass of these models (as
llama.cpp's graphs define them) that also gives, per token and MoE layer,
the margin between the last expert chosen and the first one left out, so
that a test can find the near-ties at which two implementations may choose
different experts.

Weights do not come from numpy's RNG (whose streams may change between
versions) but from a fixed formula that any language can reproduce:
tensor number t (0-based, in the order written), element i (row-major over
the numpy shape, i.e. GGUF order) gets

    z = splitmix64((seed << 48) ^ (t << 32) ^ i)
    u = (z >> 11) * 2**-53                      # in [0, 1)
    w = (2u - 1) * scale                        # scale = sqrt(3 / fan_in)

norm weights are 1 + 0.25 * (2u - 1), biases 0.25 * (2u - 1), expert
routers (ffn_gate_inp) get gate_scale x the usual scale (so that near-ties
between experts are rare); F16 tensors are rounded to nearest even, Q8_0
experts quantized by gguf-py. splitmix64(x): x += 0x9E3779B97F4A7C15; x = (x ^ x>>30) *
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

# Other architectures; test-model.py and make_llama_refs.py's "arch" part.
ARCH_MODELS = {
    # qwen2: Q/K/V biases, NEOX rope, tied output (token_embd), n_embd == n_head * head_dim.
    "tiny-qwen2-bpe-f32": dict(arch="qwen2", seed=21, vocab="bpe", ftype="f32", n_embd=64, n_head=4, n_head_kv=2,
                               head_dim=16, n_layer=2, n_ff=96, n_ctx=256, rope_base=1000000.0, eps=1e-6,
                               qkv_bias=True, tied=True, key_length=False),
    # qwen3: per-head q/k RMS norms, head_dim 32 != 64 / 4 (key_length), GQA 6:2, F16.
    "tiny-qwen3-spm-f16": dict(arch="qwen3", seed=23, vocab="spm", ftype="f16", n_embd=64, n_head=6, n_head_kv=2,
                               head_dim=32, n_layer=3, n_ff=80, n_ctx=256, rope_base=1000000.0, eps=1e-6,
                               qk_norm=True),
    # llama with experts (Mixtral): 4 experts, 2 per token, n_ff wide, F32 and Q8_0 experts.
    "tiny-mixtral-spm-f32": dict(arch="llama", seed=25, vocab="spm", ftype="f32", n_embd=64, n_head=4, n_head_kv=2,
                                 head_dim=16, n_layer=2, n_ff=64, n_ctx=256, rope_base=10000.0, eps=1e-5,
                                 n_expert=4, n_expert_used=2, gate_scale=2.0),
    "tiny-mixtral-bpe-q8": dict(arch="llama", seed=27, vocab="bpe", ftype="f32", n_embd=64, n_head=4, n_head_kv=1,
                                head_dim=16, n_layer=2, n_ff=64, n_ctx=256, rope_base=10000.0, eps=1e-5,
                                n_expert=4, n_expert_used=2, gate_scale=2.0, exps_type="q8_0"),
    # qwen3moe: 8 experts, 2 per token, expert_feed_forward_length 32, q/k norms, GQA 4:1.
    "tiny-qwen3moe-bpe-f32": dict(arch="qwen3moe", seed=29, vocab="bpe", ftype="f32", n_embd=48, n_head=4,
                                  n_head_kv=1, head_dim=32, n_layer=2, n_ff=96, n_ctx=256, rope_base=1000000.0,
                                  eps=1e-6, qk_norm=True, n_expert=8, n_expert_used=2, n_ff_exp=32,
                                  gate_scale=2.0),
}
# deepseek2 (DeepSeek V2-Lite and V3 shapes, multi-head latent attention);
# test-model.py and make_llama_refs.py's "deepseek2" part. The first layer
# dense (leading_dense_block_count 1), then 8 experts, 2 per token, 32 wide,
# plus one shared expert. "q8": every matrix whose rows are a multiple of 32
# wide in Q8_0 (attn_kv_b included), the others F32. Seeds and router scales
# picked for the largest router margins of make_tiny_models.reference over
# make_llama_refs.py's ids (8e-3 to 5e-2 in the scores), so rounding does not
# flip experts.
_DS = dict(arch="deepseek2", vocab="bpe", n_embd=64, n_head=4, n_layer=3, n_ff=96, n_ctx=256, rope_base=10000.0,
           eps=1e-6, kv_lora=32, rope=16, n_expert=8, n_expert_used=2, n_ff_exp=32, n_shared=1, n_dense_lead=1,
           gate_scale=2.0, head_dim=0, n_head_kv=1)
DS_MODELS = {
    # V2-Lite: plain attn_q, legacy attn_kv_b, softmax gating, no groups, weights not renormalised.
    "tiny-ds2lite-bpe-f32": dict(_DS, seed=73, ftype="f32", q_lora=0, nope=32, v_mla=32, legacy_kv_b=True,
                                 gating=1, w_norm=False, w_scale=1.0),
    "tiny-ds2lite-bpe-q8": dict(_DS, seed=67, ftype="q8", q_lora=0, nope=32, v_mla=32, legacy_kv_b=True,
                                gating=1, w_norm=False, w_scale=1.0),
    # V3: q LoRA, split attn_k_b / attn_v_b, sigmoid gating with exp_probs_b, 4 groups of which 2 used,
    # weights renormalised and scaled by 2.5, YaRN (factor 4, log multiplier 0.1 * 0.707).
    "tiny-ds3-bpe-f32": dict(_DS, seed=53, ftype="f32", gate_scale=4.0, q_lora=64, nope=24, v_mla=24, legacy_kv_b=False,
                             gating=2, w_norm=True, w_scale=2.5, probs_b=True, n_group=4, n_group_used=2,
                             yarn=4.0, yarn_orig=64, yarn_log_mul=0.0707),
    "tiny-ds3-bpe-q8": dict(_DS, seed=157, ftype="q8", gate_scale=16.0, q_lora=64, nope=24, v_mla=24, legacy_kv_b=False,
                            gating=2, w_norm=True, w_scale=2.5, probs_b=True, n_group=4, n_group_used=2,
                            yarn=4.0, yarn_orig=64, yarn_log_mul=0.0707),
}
ALL_MODELS = {**MODELS, **ARCH_MODELS, **DS_MODELS}

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


def ds_tensors(cfg):
    """deepseek2's tensors (numpy shapes: ggml's reversed)."""
    e, nh, v, ff = cfg["n_embd"], cfg["n_head"], cfg["n_vocab"], cfg["n_ff"]
    ql, kvl, r, nope, vm = cfg["q_lora"], cfg["kv_lora"], cfg["rope"], cfg["nope"], cfg["v_mla"]
    nx, fx, ns = cfg["n_expert"], cfg["n_ff_exp"], cfg["n_shared"]
    out = [("token_embd.weight", (v, e), "embd")]
    for il in range(cfg["n_layer"]):
        p = f"blk.{il}."
        out += [(p + "attn_norm.weight", (e,), "norm")]
        if ql:
            out += [(p + "attn_q_a.weight", (ql, e), "w"), (p + "attn_q_a_norm.weight", (ql,), "norm"),
                    (p + "attn_q_b.weight", (nh * (nope + r), ql), "w")]
        else:
            out += [(p + "attn_q.weight", (nh * (nope + r), e), "w")]
        out += [(p + "attn_kv_a_mqa.weight", (kvl + r, e), "w"), (p + "attn_kv_a_norm.weight", (kvl,), "norm")]
        if cfg["legacy_kv_b"]:
            out += [(p + "attn_kv_b.weight", (nh * (nope + vm), kvl), "w")]
        else:
            out += [(p + "attn_k_b.weight", (nh, kvl, nope), "w"), (p + "attn_v_b.weight", (nh, vm, kvl), "w")]
        out += [(p + "attn_output.weight", (e, nh * vm), "w"), (p + "ffn_norm.weight", (e,), "norm")]
        if il < cfg["n_dense_lead"]:
            out += [(p + "ffn_gate.weight", (ff, e), "w"), (p + "ffn_up.weight", (ff, e), "w"),
                    (p + "ffn_down.weight", (e, ff), "w")]
        else:
            out += [(p + "ffn_gate_inp.weight", (nx, e), "gate")]
            if cfg.get("probs_b"):
                out += [(p + "exp_probs_b.bias", (nx,), "bias")]
            out += [(p + "ffn_gate_exps.weight", (nx, fx, e), "exps"),
                    (p + "ffn_up_exps.weight", (nx, fx, e), "exps"),
                    (p + "ffn_down_exps.weight", (nx, e, fx), "exps"),
                    (p + "ffn_gate_shexp.weight", (fx * ns, e), "w"),
                    (p + "ffn_up_shexp.weight", (fx * ns, e), "w"),
                    (p + "ffn_down_shexp.weight", (e, fx * ns), "w")]
    out += [("output_norm.weight", (e,), "norm"), ("output.weight", (v, e), "w")]
    return out


def tensors(cfg):
    """(name, numpy shape, kind) in writing order; kind: "w" (matrix),
    "norm", "bias", "gate" (expert router), "exps" (experts)."""
    if cfg.get("arch") == "deepseek2":
        return ds_tensors(cfg)
    e, hd, nh, nkv, ff = cfg["n_embd"], cfg["head_dim"], cfg["n_head"], cfg["n_head_kv"], cfg["n_ff"]
    v = cfg["n_vocab"]
    nx = cfg.get("n_expert", 0)
    fx = cfg.get("n_ff_exp", ff)
    out = [("token_embd.weight", (v, e), "w")]
    for il in range(cfg["n_layer"]):
        p = f"blk.{il}."
        out += [(p + "attn_norm.weight", (e,), "norm"),
                (p + "attn_q.weight", (nh * hd, e), "w"),
                (p + "attn_k.weight", (nkv * hd, e), "w"),
                (p + "attn_v.weight", (nkv * hd, e), "w")]
        if cfg.get("qkv_bias"):
            out += [(p + "attn_q.bias", (nh * hd,), "bias"),
                    (p + "attn_k.bias", (nkv * hd,), "bias"),
                    (p + "attn_v.bias", (nkv * hd,), "bias")]
        if cfg.get("qk_norm"):
            out += [(p + "attn_q_norm.weight", (hd,), "norm"),
                    (p + "attn_k_norm.weight", (hd,), "norm")]
        out += [(p + "attn_output.weight", (e, nh * hd), "w"),
                (p + "ffn_norm.weight", (e,), "norm")]
        if nx:
            out += [(p + "ffn_gate_inp.weight", (nx, e), "gate"),
                    (p + "ffn_gate_exps.weight", (nx, fx, e), "exps"),
                    (p + "ffn_up_exps.weight", (nx, fx, e), "exps"),
                    (p + "ffn_down_exps.weight", (nx, e, fx), "exps")]
        else:
            out += [(p + "ffn_gate.weight", (ff, e), "w"),
                    (p + "ffn_up.weight", (ff, e), "w"),
                    (p + "ffn_down.weight", (e, ff), "w")]
    out += [("output_norm.weight", (e,), "norm")]
    if not cfg.get("tied"):
        out += [("output.weight", (v, e), "w")]
    return out


def tensor_values(cfg):
    """(name, array to write, raw_dtype or None, float64 values as a reader
    sees them) in writing order."""
    from gguf.quants import quantize, dequantize
    from gguf import GGMLQuantizationType as QT
    for t, (tname, shape, kind) in enumerate(tensors(cfg)):
        n = int(np.prod(shape))
        u = uniform(cfg["seed"], t, n)
        if kind == "embd":
            a = (2.0 * u - 1.0) * np.sqrt(3.0 / shape[-1])
        elif kind == "norm":
            a = 1.0 + 0.25 * (2.0 * u - 1.0)
        elif kind == "bias":
            a = 0.25 * (2.0 * u - 1.0)
        else:
            a = (2.0 * u - 1.0) * np.sqrt(3.0 / shape[-1])
            if kind == "gate":
                a = a * cfg.get("gate_scale", 1.0)
        a = a.reshape(shape)
        if cfg["ftype"] == "q8" and kind in ("w", "exps") and shape[-1] % 32 == 0:
            q = quantize(a.astype(np.float32), QT.Q8_0)
            yield tname, q, QT.Q8_0, dequantize(q, QT.Q8_0).astype(np.float64).reshape(shape)
            continue
        if kind == "exps" and cfg.get("exps_type") == "q8_0":
            q = quantize(a.astype(np.float32), QT.Q8_0)
            yield tname, q, QT.Q8_0, dequantize(q, QT.Q8_0).astype(np.float64).reshape(shape)
            continue
        if cfg["ftype"] == "f16" and kind in ("w", "exps"):
            a = a.astype(np.float16)
        else:
            a = a.astype(np.float32)
        yield tname, a, None, a.astype(np.float64)


def write_ds_keys(w, cfg):
    """deepseek2's keys as llama.cpp's converter writes them: legacy files
    (attn_kv_b) with the expanded heads' sizes, newer ones (attn_k_b /
    attn_v_b) with the latent cache's (one KV head of kv_lora + rope, V
    kv_lora wide) and the heads' in key_length_mla / value_length_mla."""
    a = "deepseek2"
    kq = cfg["nope"] + cfg["rope"]
    if cfg["legacy_kv_b"]:
        w.add_uint32(f"{a}.attention.head_count_kv", cfg["n_head"])
        w.add_uint32(f"{a}.attention.key_length", kq)
        w.add_uint32(f"{a}.attention.value_length", cfg["v_mla"])
    else:
        w.add_uint32(f"{a}.attention.head_count_kv", 1)
        w.add_uint32(f"{a}.attention.key_length", cfg["kv_lora"] + cfg["rope"])
        w.add_uint32(f"{a}.attention.value_length", cfg["kv_lora"])
        w.add_uint32(f"{a}.attention.key_length_mla", kq)
        w.add_uint32(f"{a}.attention.value_length_mla", cfg["v_mla"])
    w.add_uint32(f"{a}.rope.dimension_count", cfg["rope"])
    w.add_uint32(f"{a}.attention.q_lora_rank", cfg["q_lora"])
    w.add_uint32(f"{a}.attention.kv_lora_rank", cfg["kv_lora"])
    w.add_uint32(f"{a}.leading_dense_block_count", cfg["n_dense_lead"])
    w.add_uint32(f"{a}.expert_shared_count", cfg["n_shared"])
    w.add_float32(f"{a}.expert_weights_scale", cfg["w_scale"])
    w.add_bool(f"{a}.expert_weights_norm", cfg["w_norm"])
    w.add_uint32(f"{a}.expert_gating_func", cfg["gating"])
    if cfg.get("n_group"):
        w.add_uint32(f"{a}.expert_group_count", cfg["n_group"])
        w.add_uint32(f"{a}.expert_group_used_count", cfg["n_group_used"])
    if cfg.get("yarn"):
        w.add_string(f"{a}.rope.scaling.type", "yarn")
        w.add_float32(f"{a}.rope.scaling.factor", cfg["yarn"])
        w.add_uint32(f"{a}.rope.scaling.original_context_length", cfg["yarn_orig"])
        w.add_float32(f"{a}.rope.scaling.yarn_log_multiplier", cfg["yarn_log_mul"])


def write_model(name, path):
    cfg = dict(ALL_MODELS[name])
    arch = cfg.get("arch", "llama")
    if cfg["vocab"] == "spm":
        toks, types, scores = spm_vocab()
        merges = None
    else:
        toks, types, merges = bpe_vocab()
        scores = None
    cfg["n_vocab"] = len(toks)
    w = gguf.GGUFWriter(path, arch)
    w.add_name(name)
    w.add_context_length(cfg["n_ctx"])
    if arch == "deepseek2":
        write_ds_keys(w, cfg)
    w.add_embedding_length(cfg["n_embd"])
    w.add_block_count(cfg["n_layer"])
    w.add_feed_forward_length(cfg["n_ff"])
    w.add_head_count(cfg["n_head"])
    if arch != "deepseek2":
        w.add_head_count_kv(cfg["n_head_kv"])
    if arch == "deepseek2":
        pass
    elif cfg.get("key_length", True):
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        w.add_rope_dimension_count(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_base"])
    w.add_layer_norm_rms_eps(cfg["eps"])
    if cfg.get("n_expert"):
        w.add_expert_count(cfg["n_expert"])
        w.add_expert_used_count(cfg["n_expert_used"])
        if "n_ff_exp" in cfg:
            w.add_expert_feed_forward_length(cfg["n_ff_exp"])
    w.add_vocab_size(cfg["n_vocab"])
    w.add_file_type({"f32": 0, "f16": 1, "q8": 7}[cfg["ftype"]])
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
    for tname, a, raw_dtype, _ in tensor_values(cfg):
        if raw_dtype is None:
            w.add_tensor(tname, a)
        else:
            w.add_tensor(tname, a, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return cfg


def _rms(x, wt, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * wt


def _rope(x, pos, base, neox):
    """x [n, heads, hd], rotated in full (n_rot = head_dim)."""
    n, _, hd = x.shape
    half = hd // 2
    theta = pos[:, None].astype(np.float64) * base ** (-2.0 * np.arange(half) / hd)  # [n, half]
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if neox:
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
    return out


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _moe(cfg, W, p, h):
    """llama.cpp's build_moe_ffn with softmax gating and renormalized top-k
    weights; returns the output and, per token, the margin between the
    last chosen expert's router logit and the first one left out."""
    k = cfg["n_expert_used"]
    logits = h @ W[p + "ffn_gate_inp.weight"].T  # [n, n_expert]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    order = np.argsort(-logits, axis=-1, kind="stable")
    srt = np.take_along_axis(logits, order, -1)
    margins = srt[:, k - 1] - srt[:, k]
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        sel = order[t, :k]
        wts = probs[t, sel] / probs[t, sel].sum()
        for j, x in zip(sel, wts):
            g = W[p + "ffn_gate_exps.weight"][j] @ h[t]
            u = W[p + "ffn_up_exps.weight"][j] @ h[t]
            out[t] += x * (W[p + "ffn_down_exps.weight"][j] @ (_silu(g) * u))
    return out, margins


def _rope_yarn(x, pos, cfg):
    """deepseek2's rope (adjacent pairs) of x [n, heads, rope] with YaRN as
    ggml computes it (ext_factor 1, beta 32/1) when cfg has "yarn"."""
    n_dims, base = cfg["rope"], cfg["rope_base"]
    i = np.arange(n_dims // 2)
    theta_ex = pos[:, None].astype(np.float64) * base ** (-2.0 * i / n_dims)
    theta, mscale = theta_ex, 1.0
    if cfg.get("yarn"):
        fs = 1.0 / cfg["yarn"]

        def corr(beta):
            return n_dims * np.log(cfg["yarn_orig"] / (beta * 2 * np.pi)) / (2 * np.log(base))
        lo, hi = max(0.0, np.floor(corr(32.0))), min(n_dims - 1.0, np.ceil(corr(1.0)))
        ramp = 1.0 - np.clip((i - lo) / max(0.001, hi - lo), 0.0, 1.0)
        theta = fs * theta_ex * (1 - ramp) + theta_ex * ramp
        # llama.cpp's attn_factor 1 / (1 + 0.1 ln f) cancels the kernel's (1 + 0.1 ln f)
        mscale = 1.0
    c, s_ = np.cos(theta)[:, None, :] * mscale, np.sin(theta)[:, None, :] * mscale
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * c - b * s_, a * s_ + b * c
    return out


def _ds_moe(cfg, W, p, h):
    """build_moe_ffn as deepseek2 calls it, plus the shared experts; the
    margin per token is the smallest of the choice's (last chosen expert -
    first left out, by the biased score) and the groups' (last group kept -
    first dropped)."""
    k, nx = cfg["n_expert_used"], cfg["n_expert"]
    logits = h @ W[p + "ffn_gate_inp.weight"].T
    if cfg["gating"] == 2:
        probs = 1.0 / (1.0 + np.exp(-logits))
    else:
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
    choice = probs + W.get(p + "exp_probs_b.bias", 0.0)
    margins = np.full(h.shape[0], np.inf)
    if cfg.get("n_group"):
        ng, gu = cfg["n_group"], cfg["n_group_used"]
        g = choice.reshape(-1, ng, nx // ng)
        gs = np.sort(g, axis=-1)[..., -2:].sum(-1)  # [n, ng]
        order = np.argsort(-gs, axis=-1, kind="stable")
        srt = np.take_along_axis(gs, order, -1)
        margins = np.minimum(margins, srt[:, gu - 1] - srt[:, gu])
        keep = np.zeros_like(gs, dtype=bool)
        np.put_along_axis(keep, order[:, :gu], True, -1)
        choice = np.where(np.repeat(keep, nx // ng, axis=-1), choice, -np.inf)
    order = np.argsort(-choice, axis=-1, kind="stable")
    srt = np.take_along_axis(choice, order, -1)
    margins = np.minimum(margins, np.where(np.isfinite(srt[:, k]), srt[:, k - 1] - srt[:, k], np.inf))
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        sel = order[t, :k]
        wts = probs[t, sel]
        if cfg["w_norm"]:
            wts = wts / wts.sum()
        if cfg["w_scale"] not in (0.0, 1.0):
            wts = wts * cfg["w_scale"]
        for j, x in zip(sel, wts):
            gg = W[p + "ffn_gate_exps.weight"][j] @ h[t]
            u = W[p + "ffn_up_exps.weight"][j] @ h[t]
            out[t] += x * (W[p + "ffn_down_exps.weight"][j] @ (_silu(gg) * u))
    sh = W[p + "ffn_down_shexp.weight"] @ (_silu(W[p + "ffn_gate_shexp.weight"] @ h.T) *
                                           (W[p + "ffn_up_shexp.weight"] @ h.T))
    return out + sh.T, margins


def ds_reference(cfg, W, ids):
    """deepseek2 in float64 the plain way (keys and values expanded per
    head, not the absorbed form libtensr runs)."""
    nh, eps, kvl, r, nope, vm = cfg["n_head"], cfg["eps"], cfg["kv_lora"], cfg["rope"], cfg["nope"], cfg["v_mla"]
    n = len(ids)
    pos = np.arange(n)
    f = cfg.get("yarn", 1.0)
    log_mul = cfg.get("yarn_log_mul", 0.0) / 0.1
    mscale = 1.0 + 0.1 * log_mul * np.log(f)
    scale = mscale * mscale / np.sqrt(nope + r)
    x = W["token_embd.weight"][ids]
    margins = []
    for il in range(cfg["n_layer"]):
        p = f"blk.{il}."
        h = _rms(x, W[p + "attn_norm.weight"], eps)
        if cfg["q_lora"]:
            q = _rms(h @ W[p + "attn_q_a.weight"].T, W[p + "attn_q_a_norm.weight"], eps) @ W[p + "attn_q_b.weight"].T
        else:
            q = h @ W[p + "attn_q.weight"].T
        q = q.reshape(n, nh, nope + r)
        q_nope, q_pe = q[..., :nope], _rope_yarn(q[..., nope:], pos, cfg)
        kva = h @ W[p + "attn_kv_a_mqa.weight"].T
        c = _rms(kva[:, :kvl], W[p + "attn_kv_a_norm.weight"], eps)
        k_pe = _rope_yarn(kva[:, None, kvl:], pos, cfg)[:, 0]
        if cfg["legacy_kv_b"]:
            kvb = W[p + "attn_kv_b.weight"].reshape(nh, nope + vm, kvl)
            wk, wv = kvb[:, :nope, :], kvb[:, nope:, :]  # [h, d, r]
        else:
            wk = W[p + "attn_k_b.weight"].transpose(0, 2, 1)  # [h, r, d] -> [h, d, r]
            wv = W[p + "attn_v_b.weight"]  # [h, e, r]
        k_nope = np.einsum("hdr,tr->thd", wk, c)
        v = np.einsum("her,tr->the", wv, c)
        att = np.empty((n, nh, vm))
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for hh in range(nh):
            sc = (q_nope[:, hh] @ k_nope[:, hh].T + q_pe[:, hh] @ k_pe.T) * scale + mask
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            att[:, hh] = (sc / sc.sum(-1, keepdims=True)) @ v[:, hh]
        x = x + att.reshape(n, nh * vm) @ W[p + "attn_output.weight"].T
        h = _rms(x, W[p + "ffn_norm.weight"], eps)
        if il < cfg["n_dense_lead"]:
            fo = (W[p + "ffn_down.weight"] @ (_silu(W[p + "ffn_gate.weight"] @ h.T) *
                                              (W[p + "ffn_up.weight"] @ h.T))).T
        else:
            fo, m = _ds_moe(cfg, W, p, h)
            margins.append(m)
        x = x + fo
    h = _rms(x, W["output_norm.weight"], eps)
    return h @ W["output.weight"].T, np.array(margins)


def reference(name, ids):
    """float64 forward pass of model name over ids (one sequence, positions
    0..n-1): (logits [n, n_vocab], router margins [n_layer, n] or None)."""
    cfg = dict(ALL_MODELS[name])
    cfg["n_vocab"] = len(spm_vocab()[0] if cfg["vocab"] == "spm" else bpe_vocab()[0])
    W = {tn: f for tn, _, _, f in tensor_values(cfg)}
    arch = cfg.get("arch", "llama")
    if arch == "deepseek2":
        return ds_reference(cfg, W, np.asarray(ids))
    neox = arch.startswith("qwen")
    nh, nkv, hd, eps = cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"], cfg["eps"]
    ids = np.asarray(ids)
    n = len(ids)
    pos = np.arange(n)
    x = W["token_embd.weight"][ids]
    margins = []
    for il in range(cfg["n_layer"]):
        p = f"blk.{il}."
        h = _rms(x, W[p + "attn_norm.weight"], eps)
        q, k, v = (h @ W[p + f"attn_{c}.weight"].T + W.get(p + f"attn_{c}.bias", 0.0) for c in "qkv")
        q, k, v = q.reshape(n, nh, hd), k.reshape(n, nkv, hd), v.reshape(n, nkv, hd)
        if cfg.get("qk_norm"):
            q, k = _rms(q, W[p + "attn_q_norm.weight"], eps), _rms(k, W[p + "attn_k_norm.weight"], eps)
        q, k = _rope(q, pos, cfg["rope_base"], neox), _rope(k, pos, cfg["rope_base"], neox)
        att = np.empty((n, nh, hd))
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for hh in range(nh):
            kv = hh // (nh // nkv)
            sc = q[:, hh] @ k[:, kv].T / np.sqrt(hd) + mask
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            att[:, hh] = (sc / sc.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + att.reshape(n, nh * hd) @ W[p + "attn_output.weight"].T
        h = _rms(x, W[p + "ffn_norm.weight"], eps)
        if cfg.get("n_expert"):
            f, m = _moe(cfg, W, p, h)
            margins.append(m)
        else:
            f = W[p + "ffn_down.weight"] @ (_silu(W[p + "ffn_gate.weight"] @ h.T) * (W[p + "ffn_up.weight"] @ h.T))
            f = f.T
        x = x + f
    h = _rms(x, W["output_norm.weight"], eps)
    out = W["output.weight"] if "output.weight" in W else W["token_embd.weight"]
    return h @ out.T, (np.array(margins) if margins else None)


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    names = argv[2:] or list(ALL_MODELS)
    for n in names:
        cfg = write_model(n, f"{argv[1]}/{n}.gguf")
        print(json.dumps({"name": n, **cfg}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
