#!/usr/bin/env python3
"""generate.py - greedy text generation with a llama-family GGUF model (made
for SmolLM2-135M-Instruct) written entirely in Python on libtensr's public
ops: the proof that the API is enough to write a model outside C.

    python3 generate.py [-m model.gguf] [-p prompt] [-n tokens] [-t threads] [--chat]

The tokenizer is a minimal GPT-2 byte-level BPE read from the file's
metadata (tokenizer.ggml.tokens / merges) through the binding's GGUF
inspection; the forward pass is get_rows, rms_norm, mul_mat, rope, the
attention helper with a KV cache, swiglu and argmax. With --no-cache the
attention is built from primitive ops instead (permute, mul_mat, masked
softmax, cont) and every step recomputes the whole sequence.
"""
import argparse
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import libtensr as tsr  # noqa: E402

DEFAULT_MODEL = os.path.expanduser("~/.cache/libtensr/SmolLM2-135M-Instruct.Q4_1.gguf")

# ---------------------------------------------------------------------------
# Tokenizer: GPT-2 byte-level BPE
# ---------------------------------------------------------------------------


def byte_to_unicode():
    """GPT-2's reversible map of the 256 bytes to printable characters."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


try:  # the `regex` module knows \p{L}; plain `re` gets an approximation
    import regex as _re
    _SPLIT = _re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
except ImportError:
    _SPLIT = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d| ?[^\s\w]+|\s+(?!\S)|\s+|_+")


class Tokenizer:
    def __init__(self, gguf):
        self.tokens = gguf["tokenizer.ggml.tokens"]
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.ranks = {tuple(m.split(" ", 1)): i for i, m in enumerate(gguf["tokenizer.ggml.merges"])}
        types = gguf.get("tokenizer.ggml.token_type")
        self.special = [t for t, ty in zip(self.tokens, types) if ty == 3] if types is not None else []
        self.eos = gguf.get("tokenizer.ggml.eos_token_id", -1)
        self.b2u = byte_to_unicode()
        self.u2b = {u: b for b, u in self.b2u.items()}
        alt = "|".join(re.escape(s) for s in sorted(self.special, key=len, reverse=True))
        self.special_re = re.compile("(%s)" % alt) if alt else None

    def _bpe(self, word):
        parts = list(word)
        while len(parts) > 1:
            pairs = [(self.ranks.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            rank, i = min(pairs)
            if rank == 1 << 30:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [self.ids[p] for p in parts if p in self.ids]

    def encode(self, text):
        out = []
        pieces = self.special_re.split(text) if self.special_re else [text]
        for piece in pieces:
            if piece in self.ids and piece in self.special:
                out.append(self.ids[piece])
                continue
            for word in _SPLIT.findall(piece):
                out += self._bpe("".join(self.b2u[b] for b in word.encode("utf-8")))
        return out

    def decode(self, ids):
        data = bytearray()
        for i in ids:
            tok = self.tokens[i]
            if tok in self.special:
                continue
            data += bytes(self.u2b[c] for c in tok if c in self.u2b)
        return data.decode("utf-8", "replace")

# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


class Llama:
    def __init__(self, path, n_threads, n_ctx, use_cache=True, kv_type="f16"):
        with tsr.GGUF(path) as g:
            arch = g["general.architecture"]
            self.n_layers = g["%s.block_count" % arch]
            self.n_embd = g["%s.embedding_length" % arch]
            self.n_head = g["%s.attention.head_count" % arch]
            self.n_head_kv = g.get("%s.attention.head_count_kv" % arch, self.n_head)
            self.head_dim = self.n_embd // self.n_head
            self.eps = g["%s.attention.layer_norm_rms_epsilon" % arch]
            self.rope_base = g.get("%s.rope.freq_base" % arch, 10000.0)
            self.n_rot = g.get("%s.rope.dimension_count" % arch, self.head_dim)
            self.tokenizer = Tokenizer(g)
        self.be = tsr.Backend(n_threads=n_threads)
        self.be.load(path)
        names = set(self.be.weight_names())
        self.w = self.be.weight
        self.out_name = "output.weight" if "output.weight" in names else "token_embd.weight"
        self.cache = None
        if use_cache:
            self.cache = self.be.kv_cache(self.n_layers, n_ctx, self.n_head_kv, self.head_dim,
                                          type_k=kv_type, n_batch_max=min(n_ctx, 512))
            self.reserve(min(n_ctx, 512))
        self.history = []  # tokens so far, for the no-cache path

    def attention_primitive(self, ctx, q, k, v, mask):
        """softmax(K.Q / sqrt(d) + mask) V from primitive ops: q [hd, n_head, n],
        k/v [hd, n_head_kv, n] -> [hd * n_head, n]."""
        q = ctx.permute(q, 0, 2, 1, 3)                 # [hd, n, n_head]
        k = ctx.permute(k, 0, 2, 1, 3)                 # [hd, n_kv, n_head_kv]
        kq = ctx.mul_mat(k, q)                         # [n_kv, n, n_head]; heads share kv heads
        kq = ctx.softmax(kq, mask, 1.0 / np.sqrt(self.head_dim))
        vt = ctx.cont(ctx.permute(v, 1, 2, 0, 3))      # [n_kv, hd, n_head_kv]
        kqv = ctx.mul_mat(vt, kq)                      # [hd, n, n_head]
        out = ctx.cont(ctx.permute(kqv, 0, 2, 1, 3))   # [hd, n_head, n]
        n = q.ne[1]
        return ctx.reshape(out, (n, self.head_dim * self.n_head))

    def build(self, ctx, tokens, pos, mask):
        """The forward graph: token ids -> id of the most likely next token."""
        n, w, hd = tokens.ne[0], self.w, self.head_dim
        x = ctx.get_rows(w("token_embd.weight"), tokens)
        for il in range(self.n_layers):
            def W(name):
                return w("blk.%d.%s.weight" % (il, name))
            h = ctx.mul(ctx.rms_norm(x, self.eps), W("attn_norm"))
            q = ctx.reshape(ctx.mul_mat(W("attn_q"), h), (n, self.n_head, hd))
            k = ctx.reshape(ctx.mul_mat(W("attn_k"), h), (n, self.n_head_kv, hd))
            v = ctx.reshape(ctx.mul_mat(W("attn_v"), h), (n, self.n_head_kv, hd))
            q = ctx.rope(q, pos, self.n_rot, tsr.ROPE_NORMAL, self.rope_base)
            k = ctx.rope(k, pos, self.n_rot, tsr.ROPE_NORMAL, self.rope_base)
            if self.cache is not None:
                a = ctx.attention(self.cache, il, q, k, v, 1.0 / np.sqrt(hd))
            else:
                a = self.attention_primitive(ctx, q, k, v, mask)
            x = ctx.add(x, ctx.mul_mat(W("attn_output"), a))
            h = ctx.mul(ctx.rms_norm(x, self.eps), W("ffn_norm"))
            ff = ctx.swiglu(ctx.mul_mat(W("ffn_gate"), h), ctx.mul_mat(W("ffn_up"), h))
            x = ctx.add(x, ctx.mul_mat(W("ffn_down"), ff))
        last = ctx.view(x, [self.n_embd], offset=(n - 1) * x.nb[1])
        last = ctx.mul(ctx.rms_norm(last, self.eps), w("output_norm.weight"))
        return ctx.argmax(ctx.mul_mat(w(self.out_name), last))

    def reserve(self, n_batch):
        """Allocates the compute buffers for the largest batch up front, so
        that generation allocates nothing (and fails now if memory is short)."""
        with self.be.context() as ctx:
            self.cache.begin_reserve(ctx, n_batch)
            ids = ctx.input(np.zeros(n_batch, np.int32))
            pos = ctx.input(np.arange(n_batch, dtype=np.int32))
            ctx.reserve(self.build(ctx, ids, pos, None))

    def forward(self, tokens, p0):
        """Runs tokens at positions p0.. and returns the id of the most likely next token."""
        if self.cache is None:  # recompute the whole sequence
            self.history = self.history[:p0] + list(tokens)
            tokens, p0 = self.history, 0
        n = len(tokens)
        with self.be.context() as ctx:
            mask = None
            if self.cache is not None:
                self.cache.begin(ctx, np.arange(p0, p0 + n, dtype=np.int32))
            else:
                mask = ctx.input(np.triu(np.full((n, n), -np.inf, np.float32), 1))
            pos = ctx.input(np.arange(p0, p0 + n, dtype=np.int32))
            best = self.build(ctx, ctx.input(np.array(tokens, np.int32)), pos, mask)
            ctx.compute(best)
            return int(best.numpy().reshape(-1)[0])

    def close(self):
        if self.cache is not None:
            self.cache.close()
        self.be.close()


def generate(model, prompt, n_predict, chat=False, out=sys.stdout):
    tok = model.tokenizer
    if chat:
        prompt = "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n" % prompt
    ids = tok.encode(prompt)
    t0 = time.time()
    nxt = model.forward(ids, 0)
    t1 = time.time()
    got = [nxt]
    for i in range(n_predict - 1):
        if nxt == tok.eos:
            break
        nxt = model.forward([nxt], len(ids) + i)
        got.append(nxt)
    t2 = time.time()
    text = tok.decode(got)
    if out:
        out.write(text + "\n")
        out.write("[prompt %d tokens %.1f t/s, generated %d tokens %.1f t/s]\n" % (
            len(ids), len(ids) / max(t1 - t0, 1e-9), len(got), (len(got) - 1) / max(t2 - t1, 1e-9)))
    return ids, got, text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=DEFAULT_MODEL)
    ap.add_argument("-p", "--prompt", default="The capital of France is")
    ap.add_argument("-n", "--n-predict", type=int, default=16)
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--kv-type", default="f16", help="KV cache type: f16 (default), f32, q8_0")
    ap.add_argument("--no-cache", action="store_true",
                    help="attention from primitive ops, recomputing the sequence each step")
    args = ap.parse_args()
    try:
        model = Llama(args.model, args.threads, args.ctx_size, not args.no_cache, args.kv_type)
        try:
            generate(model, args.prompt, args.n_predict, args.chat)
        finally:
            model.close()
    except tsr.Error as e:
        sys.exit("generate.py: %s" % e)


if __name__ == "__main__":
    main()
