#!/usr/bin/env python3
"""Generates tests/data/quant-golden.bin ONCE from the `gguf` Python package
(gguf.quants), whose quantizers are bit-exact with llama.cpp's reference
quantizer and whose dequantizers follow ggml. test-quants.c compares libtensr
against these bytes. Run: python3 tests/gen-quant-golden.py tests/data/quant-golden.bin

Record layout (little-endian): u32 type, u32 kind (0 = quantize floats ->
bytes, 1 = dequantize bytes -> floats), u32 n_elements, u32 n_bytes, then
n_elements float32 and n_bytes bytes."""
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

rng = np.random.default_rng(1234)


def quant_inputs(bs):
    blocks = [rng.standard_normal(bs).astype(np.float32),
              (rng.standard_normal(bs) * 1e-3).astype(np.float32),
              np.zeros(bs, np.float32),
              np.full(bs, 0.75, np.float32),
              (rng.uniform(-5, 5, bs)).astype(np.float32)]
    b = rng.standard_normal(bs).astype(np.float32)
    b[7] = -40.0  # one outlier of negative sign decides d's sign
    blocks.append(b)
    b = rng.uniform(0.5, 2.0, bs).astype(np.float32)  # all positive (Q4_1 min > 0)
    blocks.append(b)
    return np.concatenate(blocks)


# (type, block elements, block bytes, byte offsets of f16 scale fields)
DEQ = [(T.Q4_0, 32, 18, [0]), (T.Q4_1, 32, 20, [0, 2]), (T.Q5_0, 32, 22, [0]),
       (T.Q5_1, 32, 24, [0, 2]), (T.Q8_0, 32, 34, [0]), (T.Q2_K, 256, 84, [80, 82]),
       (T.Q3_K, 256, 110, [108]), (T.Q4_K, 256, 144, [0, 2]), (T.Q5_K, 256, 176, [0, 2]),
       (T.Q6_K, 256, 210, [208]), (T.IQ4_NL, 32, 18, [0]), (T.IQ4_XS, 256, 136, [0])]


def random_blocks(bs, nbytes, f16_offsets, n):
    raw = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    for off in f16_offsets:
        vals = rng.uniform(-0.1, 0.1, size=n).astype(np.float16)
        raw[:, off:off + 2] = vals.view(np.uint8).reshape(n, 2)
    return raw


def main(path):
    out = bytearray()

    def rec(t, kind, floats, data):
        out.extend(struct.pack("<IIII", int(t), kind, floats.size, len(data)))
        out.extend(floats.astype("<f4").tobytes())
        out.extend(bytes(data))

    for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        x = quant_inputs(32)
        rec(t, 0, x, quants.quantize(x.reshape(-1, 32), t).tobytes())
    for t, bs, nbytes, offs in DEQ:
        raw = random_blocks(bs, nbytes, offs, 3)
        y = quants.dequantize(raw, t).astype(np.float32).reshape(-1)
        rec(t, 1, y, raw.tobytes())
    x = rng.standard_normal(64).astype(np.float32)
    x[:4] = [np.inf, -np.inf, 65520.0, 1e-7]
    rec(T.BF16, 0, x, quants.quantize(x, T.BF16).tobytes())
    rec(T.F16, 0, x, x.astype(np.float16).tobytes())
    with open(path, "wb") as f:
        f.write(out)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/quant-golden.bin")
