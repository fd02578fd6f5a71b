#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets in tests/fuzz/ (except gguf
and overrides, whose seeds are committed as they are).

Usage: make-corpora.py [DIR]   (default: the directory of this script)

The input formats are described at the top of each target's source
(fuzz-tokenizer.c, fuzz-chat.c, fuzz-model-load.c, fuzz-graph.c). The
seeds are deterministic; rerunning rewrites the same files, and files
with other names (regression inputs) are left alone.
"""
import os
import random
import struct
import sys


def write(d, name, data):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


TEXTS = [b"Hello world", b"The quick brown fox", b" the cat  is in", "caf\u00e9 w\u00f6rld".encode(),
         b"\n\n  12345 123\t", "\U0001F642 ok \u2581x".encode(), b"<|eot_id|><s>hi</s>",
         b"\xff\xfe\xc3(\xe2\x82", b""]


def tokenizer(d):
    for i, t in enumerate(TEXTS):
        for which in range(3):
            flags = which | (0 if i % 2 else 0x0C) | (0x30 if i % 3 == 0 else 0)
            write(d, f"t{i}-v{which}", bytes([flags]) + t)


TEMPLATES = [(0, b"{% for m in messages %}<|im_start|>{{ m.role }}\n..."),
             (0, b"{{ bos_token }}{% ... '<<SYS>>\\n' ... '[INST] ' ... %}"),
             (0, b"{{ '[SYSTEM_PROMPT]' }} [INST]"),
             (0, b"<|start_header_id|>' + message['role'] + '<|end_header_id|>"),
             (0, b"<|user|>\n{{ content }}<|endoftext|>"),
             (0, b"<start_of_turn>user"),
             (0, b"<|assistant|> <|end|>"),
             (0, b"messages[0]['role'] != 'system' <|im_start|>system\nYou are a bot<|im_end|>"),
             (1, b"mistral-v3-tekken"), (1, b"llama2-sys"), (1, b"nope"), (0, b"unknown")]


def chat(d):
    conv = [b"\x00Be brief.", b"\x01Hi", b"\x02Hello!", b"\x01 Bye ", b"\x03tool says"]
    for i, (by_name, t) in enumerate(TEMPLATES):
        msgs = conv[: 1 + i % len(conv)] if i % 3 else conv[1:]
        write(d, f"c{i}", bytes([by_name | (2 if i % 2 else 0)]) + t + b"\x00" + b"\x00".join(msgs))


KEYS = ["context_length", "embedding_length", "block_count", "feed_forward_length", "head_count",
        "head_count_kv", "key_length", "value_length", "rope_dim", "freq_base", "eps", "vocab_size",
        "scaling_type", "scaling_factor", "scale_linear", "orig_ctx", "sliding_window", "arch", "bos",
        "eos", "unk", "eot", "add_bos", "add_space_prefix", "tok_model", "tok_pre", "chat_template",
        "alignment"]
TYPES = ["i32", "u32", "i64", "u64", "f32", "f64", "bool", "str", "arr"]


def key(name, typ, value):
    k, t = KEYS.index(name), TYPES.index(typ)
    if typ in ("i32", "u32", "i64", "u64"):
        v = struct.pack("<q", value) if value < 0 else struct.pack("<Q", value)
    elif typ == "f32":
        v = struct.pack("<f", value) + b"\0" * 4
    elif typ == "f64":
        v = struct.pack("<d", value)
    elif typ == "arr":
        v = struct.pack("<ii", *value)
    else:
        v = (value if isinstance(value, bytes) else bytes([value])).ljust(8, b"\0")[:8]
    return bytes([0, k, t]) + v


def tensor(op, idx, arg, value=0):
    return bytes([op, idx, arg]) + struct.pack("<Q", value)


def model_load(d):
    seeds = {
        "base-spm": [], "base-bpe": [],
        "heads-negative": [key("head_count", "i32", -2)],
        "heads-huge": [key("head_count", "i64", 1 << 40)],
        "heads-trunc": [key("head_count", "i64", (1 << 32) + 2)],
        "kv-not-divisor": [key("head_count_kv", "u32", 3)],
        "kv-zero": [key("head_count_kv", "u32", 0)],
        "embd-huge": [key("embedding_length", "u64", 1 << 62)],
        "embd-16": [key("embedding_length", "i32", 16)],
        "layers-3": [key("block_count", "u32", 3)],
        "ff-mismatch": [key("feed_forward_length", "i32", 13)],
        "keylen-0": [key("key_length", "i32", 0)],
        "keylen-8": [key("key_length", "i32", 8), key("value_length", "i32", 2)],
        "rope-odd": [key("rope_dim", "i32", 3)],
        "eps-nan": [key("eps", "f32", float("nan"))],
        "base-neg": [key("freq_base", "f64", -1.0)],
        "ctx-str": [key("context_length", "str", b"32")],
        "ctx-arr": [key("context_length", "arr", (32, 32))],
        "yarn": [key("scaling_type", "str", b"yarn"), key("scaling_factor", "f32", 4.0)],
        "linear": [key("scaling_type", "str", b"linear"), key("scaling_factor", "f32", -2.0)],
        "window": [key("sliding_window", "i64", 4)],
        "arch-gpt2": [key("arch", "str", b"gpt2")],
        "bos-huge": [key("bos", "u32", 1 << 31), key("eos", "i32", -1)],
        "tok-bert": [key("tok_model", "str", b"bert")],
        "tok-pre": [key("tok_pre", "str", b"qwen2")],
        "vocab-size": [key("vocab_size", "i64", 7)],
        "align-3": [key("alignment", "u32", 3)],
        "embd-shape": [tensor(1, 0, 0, 9)],
        "q-shape": [tensor(1, 2, 1, 7)],
        "out-3d": [tensor(1, 11, 2, 2)],
        "zero-dim": [tensor(1, 5, 1, 0)],
        "no-output": [tensor(2, 11, 0)],
        "no-norm": [tensor(2, 1, 0)],
        "f16-q8": [tensor(3, 7, 0), tensor(3, 3, 0), tensor(1, 3, 0, 32), key("embedding_length", "i32", 32)],
        "norm-f16": [tensor(3, 10, 0)],
    }
    for name, recs in seeds.items():
        write(d, name, bytes([1 if name.endswith("bpe") or "tok" in name else 0]) + b"".join(recs))


def graph(d):
    f32 = lambda dims: bytes([0, len(dims) - 1] + dims) + bytes(range(64, 64 + 8 * 8))
    seeds = {
        # two F32 [4, 3] inputs, add, mul_mat of the sum with the second
        "add-mul-mat": bytes([1, 0, 1, 4, 3]) + bytes(12) + bytes([0, 1, 4, 3]) + bytes(range(12)) +
                       bytes([0, 0, 1, 0, 0]) + bytes([5, 2, 1, 0, 0]),
        "get-rows": bytes([1, 0, 1, 4, 3]) + bytes(range(12)) + bytes([3, 0, 2]) + bytes([0, 2, 1]) +
                    bytes([6, 0, 1, 0, 0]),
        "rope": bytes([1, 0, 2, 4, 2, 3]) + bytes(range(24)) + bytes([3, 0, 3]) + bytes([0, 1, 2]) +
                bytes([10, 0, 1, 0, 0, 4, 0, 0, 96, 96]),
        "flash-attn": bytes([2, 0, 2, 4, 3, 2]) + bytes(range(24)) + bytes([1, 2, 4, 5, 2]) + bytes(range(40)) +
                      bytes([26, 0, 1, 1, 0, 80]),
        "softmax-mask": bytes([1, 0, 1, 5, 2]) + bytes(range(10)) + bytes([0, 1, 5, 2]) + bytes(10) +
                        bytes([13, 0, 0, 0, 1, 1, 80]),
        "q8-mul-mat": bytes([1, 4, 1, 0, 2]) + bytes(range(68)) + bytes([0, 1, 0, 1]) + bytes(range(32)) +
                      bytes([5, 0, 1, 0, 0]),
        "views": f32([8, 8]) + bytes([21, 0, 0, 0, 0, 3, 4, 4, 4, 2, 1, 3, 2, 1]) +
                 bytes([24, 1, 0, 0, 0, 5]) + bytes([19, 2, 0, 0, 0]),
        "concat-cpy": f32([4, 4]) + bytes([16, 0, 0, 0, 0, 2]) + bytes([27, 0, 0, 0, 0, 4, 8, 1, 1, 1, 1]) +
                      bytes([18, 1, 2, 0, 0]),
        "reshape-norm": f32([4, 4]) + bytes([22, 0, 0, 0, 0, 2, 8, 2, 1, 1]) + bytes([8, 1, 0, 0, 0, 5]),
        # experts F32 [4, 3, 2], b F32 [4, 1, 2], ids I32 [1, 2] = {1, 0} (then {5, 0}: out of range), mul_mat_id
        "moe": bytes([2, 0, 2, 4, 3, 2]) + bytes(range(24)) + bytes([0, 2, 4, 1, 2]) + bytes(range(8)) +
               bytes([3, 1, 1, 2, 0, 1, 0, 0]) + bytes([30, 0, 1, 2, 0]),
        "moe-range": bytes([2, 0, 2, 4, 3, 2]) + bytes(range(24)) + bytes([0, 2, 4, 1, 2]) + bytes(range(8)) +
                     bytes([3, 1, 1, 2, 0, 5, 0, 0]) + bytes([30, 0, 1, 2, 0]),
        # one F32 [8, 3] input: top_k 3, argsort descending, sigmoid then sum_rows
        "top-k": bytes([0, 0, 1, 8, 3]) + bytes(range(100, 124)) + bytes([31, 0, 0, 0, 0, 3]),
        "argsort": bytes([0, 0, 1, 8, 3]) + bytes([7, 9, 7, 1] * 6) + bytes([32, 0, 0, 0, 0, 1]),
        "sigmoid-sum-rows": bytes([0, 0, 1, 8, 3]) + bytes(range(100, 124)) + bytes([33, 0, 0, 0, 0, 1]) +
                            bytes([33, 1, 0, 0, 0, 0]),
    }
    rng = random.Random(1234)
    for i in range(8):
        seeds[f"random-{i}"] = bytes(rng.randrange(256) for _ in range(64 + 32 * i))
    for name, data in seeds.items():
        write(d, name, data)


def main(argv):
    top = argv[1] if len(argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    tokenizer(os.path.join(top, "corpus-tokenizer"))
    chat(os.path.join(top, "corpus-chat"))
    model_load(os.path.join(top, "corpus-model-load"))
    graph(os.path.join(top, "corpus-graph"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
