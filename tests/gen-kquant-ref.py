#!/usr/bin/env python3
"""Generates tests/data/kquant-ref.bin ONCE from llama.cpp's own ggml
(libggml-base.so, loaded with ctypes): its reference quantizers
(quantize_row_<type>_ref) and its dequantizers (dequantize_row_<type>) on a
few deterministic float arrays. test-kquant-ref.c checks libtensr against it:
byte identity for Q8_0/Q4_0/Q4_1/Q5_0/Q5_1, RMSE no worse than llama.cpp's
(+1%) for Q4_K/Q5_K/Q6_K, and bit-exact dequantization of llama.cpp's bytes.

Run (not part of make check; needs numpy and a libggml-base.so):
  python3 tests/gen-kquant-ref.py [path/to/libggml-base.so] [out.bin]
The library defaults to the llama-cpp-python venv under ~/.cache/libtensr.

File layout (little-endian):
  header: 8 bytes magic "TSRKQREF", u32 format version (1), 64 bytes
          NUL-padded ggml version string, u32 n_arrays, u32 n_records
  arrays: n_arrays x { 16 bytes NUL-padded name, u32 n, n float32 }
  records: n_records x { u32 tsr/ggml type, u32 array index, u32 n_bytes,
          f64 llama.cpp RMSE (double precision, over the array),
          n_bytes quantized bytes, n float32 ggml-dequantized values }
"""
import ctypes
import glob
import os
import struct
import sys

import numpy as np

# (ggml type number == tsr_type, name, block elements, block bytes)
TYPES = [(8, "q8_0", 32, 34), (2, "q4_0", 32, 18), (3, "q4_1", 32, 20),
         (6, "q5_0", 32, 22), (7, "q5_1", 32, 24),
         (12, "q4_K", 256, 144), (13, "q5_K", 256, 176), (14, "q6_K", 256, 210)]


def arrays():
    """Deterministic test inputs; every size is a multiple of 256."""
    rng = np.random.default_rng(20240611)
    f32 = np.float32
    out = [("normal", rng.standard_normal(768).astype(f32)),
           ("uniform", rng.uniform(-3.0, 3.0, 768).astype(f32))]
    # Heavy tails: Student t with 3 degrees of freedom plus rare big outliers
    # of both signs (they decide the block scale and starve the others).
    h = rng.standard_t(3, 768)
    idx = rng.choice(768, 12, replace=False)
    h[idx] = rng.choice([-1.0, 1.0], 12) * rng.uniform(20, 80, 12)
    out.append(("heavy", h.astype(f32)))
    # Constant rows and zeros: a positive constant, all zeros, a negative
    # constant, then a block of zeros with one constant sub-block.
    c = np.concatenate([np.full(256, 0.75), np.zeros(256), np.full(256, -2.5),
                        np.zeros(256)])
    c[768 + 64:768 + 96] = 1.25
    out.append(("const-zero", c.astype(f32)))
    # Scales near the ends of half precision and an all-positive block (the
    # K-quants' min clamps to 0) plus a small offset normal block.
    s = np.concatenate([rng.standard_normal(256) * 1e-3,
                        rng.uniform(0.5, 2.0, 256),
                        rng.standard_normal(256) * 1e-6,
                        rng.standard_normal(256) * 0.1 + 0.3])
    out.append(("scaled", s.astype(f32)))
    return out


def find_lib():
    pat = os.path.expanduser("~/.cache/libtensr/llama-venv/lib/python3*/site-packages/"
                             "llama_cpp/lib/libggml-base.so")
    hits = sorted(glob.glob(pat))
    if not hits:
        sys.exit("gen-kquant-ref: no libggml-base.so (pass its path)")
    return hits[0]


def bind(lib):
    lib.ggml_version.restype = ctypes.c_char_p
    lib.ggml_commit.restype = ctypes.c_char_p
    for _, name, _, _ in TYPES:
        q = getattr(lib, "quantize_row_%s_ref" % name)
        q.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        q.restype = None
        d = getattr(lib, "dequantize_row_%s" % name)
        d.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        d.restype = None


def ggml_roundtrip(lib, name, bs, nbytes, x):
    n = x.size
    assert n % bs == 0
    q = np.zeros(n // bs * nbytes, np.uint8)
    y = np.zeros(n, np.float32)
    xc = np.ascontiguousarray(x, np.float32)
    getattr(lib, "quantize_row_%s_ref" % name)(xc.ctypes.data, q.ctypes.data, n)
    getattr(lib, "dequantize_row_%s" % name)(q.ctypes.data, y.ctypes.data, n)
    return q, y


def main(libpath, path):
    lib = ctypes.CDLL(libpath)
    bind(lib)
    version = "ggml %s (%s)" % (lib.ggml_version().decode(), lib.ggml_commit().decode())
    arrs = arrays()
    out = bytearray()
    n_records = len(TYPES) * len(arrs)
    out += b"TSRKQREF" + struct.pack("<I", 1)
    out += version.encode().ljust(64, b"\0")[:64]
    out += struct.pack("<II", len(arrs), n_records)
    for name, x in arrs:
        out += name.encode().ljust(16, b"\0") + struct.pack("<I", x.size)
        out += x.astype("<f4").tobytes()
    print(version)
    for t, name, bs, nbytes in TYPES:
        for ai, (aname, x) in enumerate(arrs):
            q, y = ggml_roundtrip(lib, name, bs, nbytes, x)
            rmse = float(np.sqrt(np.mean((y.astype(np.float64) - x.astype(np.float64)) ** 2)))
            out += struct.pack("<IIId", t, ai, q.size, rmse)
            out += q.tobytes() + y.astype("<f4").tobytes()
            print("%-5s %-10s rmse %.6g" % (name, aname, rmse))
    with open(path, "wb") as f:
        f.write(out)
    print("wrote %s (%d bytes)" % (path, len(out)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else find_lib(),
         sys.argv[2] if len(sys.argv) > 2 else "tests/data/kquant-ref.bin")
