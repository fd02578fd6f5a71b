#!/usr/bin/env python3
"""llama-cpp-bench.py - llama-bench's pp/tg measurement done through
llama-cpp-python, a stand-in for llama-bench where only the Python
package is installed (tensr-bench and bench/compare.sh use llama-bench).

Usage: llama-cpp-bench.py MODEL THREADS N_PROMPT N_GEN REPS FLASH_ATTN(0|1)

Like llama-bench: n_batch 2048, n_ubatch 512, random tokens, each test
from an empty cache, one warm-up run, the mean of REPS runs. Prints
"pp<N> <tokens/s> <stddev>" and "tg<N> <tokens/s> <stddev>" lines.
"""
import random
import statistics
import sys
import time

import llama_cpp as L


def main(argv):
    if len(argv) != 7:
        print(__doc__, file=sys.stderr)
        return 2
    path, threads, n_p, n_g, reps, fa = argv[1], *map(int, argv[2:])
    L.llama_backend_init()
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    if not model:
        print(f"llama-cpp-bench: cannot load {path}", file=sys.stderr)
        return 1
    cp = L.llama_context_default_params()
    cp.n_ctx = n_p + n_g
    cp.n_batch = 2048
    cp.n_ubatch = 512
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = fa
    ctx = L.llama_init_from_model(model, cp)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    mem = L.llama_get_memory(ctx)
    rng = random.Random(1)

    def decode(ids):
        arr = (L.llama_token * len(ids))(*ids)
        if L.llama_decode(ctx, L.llama_batch_get_one(arr, len(ids))) != 0:
            raise RuntimeError("llama_decode failed")

    def pp():
        L.llama_memory_clear(mem, True)
        ids = [rng.randrange(n_vocab) for _ in range(n_p)]
        t0 = time.perf_counter()
        for i in range(0, n_p, 2048):
            decode(ids[i:i + 2048])
        L.llama_synchronize(ctx)
        return n_p / (time.perf_counter() - t0)

    def tg():
        L.llama_memory_clear(mem, True)
        t0 = time.perf_counter()
        for _ in range(n_g):
            decode([rng.randrange(n_vocab)])
        L.llama_synchronize(ctx)
        return n_g / (time.perf_counter() - t0)

    for name, n, fn in (("pp", n_p, pp), ("tg", n_g, tg)):
        if n <= 0:
            continue
        fn()  # warm-up
        ts = [fn() for _ in range(reps)]
        sd = statistics.stdev(ts) if len(ts) > 1 else 0.0
        print(f"{name}{n} {statistics.mean(ts):.2f} {sd:.2f}", flush=True)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
