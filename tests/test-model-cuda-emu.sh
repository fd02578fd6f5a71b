#!/bin/sh
# test-model-cuda-emu.sh - whole models on the emulated CUDA0 (the module of
# tests/test-ops-cuda-emu.sh: cuda/cuda.c and every kernel built for the
# host, see cuda/README.md) with -ngl 99 against the CPU: the tiny random
# models of tests/make_tiny_models.py (llama with a tied head, Mixtral-style
# Q8_0 experts, deepseek2 V2-Lite-shaped Q8_0 with its legacy kv_b and
# V3-shaped F32 with the latent cache, groups and YaRN), as one prompt batch
# (cuBLAS, the prompt paths) and token by token (-ub 1: the mat-vecs,
# split-K decode attention), flash attention off and on, and deepseek2 with
# -ot exps=CPU (the experts on the CPU, the rest on CUDA0). Per position the
# KL divergence of the softmaxes: the mean must stay below 2e-3 (the two
# paths quantize activations differently: Q8_1 on CUDA, Q8_0/Q8_K on the
# CPU) and the top token agree wherever the CPU's top two are 0.05 apart.
# Needs python3 with numpy and gguf (PYTHON3: tests/py-deps.sh provides one).
top=${top_builddir:-.}
src=${top_srcdir:-.}
mod=$top/tests/.libs/libtensr-cuda-emu.so
py=${PYTHON3:-python3}
[ -f "$mod" ] || { echo "FAIL: $mod is not built"; exit 1; }
if ! "$py" -c 'import numpy, gguf' 2> /dev/null; then
    [ "${CI:-}" = true ] && { echo "FAIL: python3 with numpy and gguf is needed"; exit 1; }
    echo "SKIP: python3 with numpy and gguf absent"; exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tsr-model-emu.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM
"$py" "$src/tests/make_tiny_models.py" "$tmp" > /dev/null || { echo "FAIL: make_tiny_models.py"; exit 1; }
ids=$("$py" -c 'import json, sys; print(" ".join(map(str, json.load(open(sys.argv[1]))["ids"])))' \
    "$src/tests/data/refs/model-tiny-ds3-bpe-f32.json")
fail=0
run() { # model flags...: CPU, then CUDA0, and the comparison
    m=$1
    shift
    echo "logits $ids" | "$top/tests/model-eval" -t 2 -c 64 "$@" "$tmp/$m.gguf" > "$tmp/cpu.txt" 2> "$tmp/err" &&
        echo "logits $ids" | TSR_BACKEND_PATH=$mod "$top/tests/model-eval" -t 2 -c 64 -ngl 99 "$@" "$tmp/$m.gguf" \
            > "$tmp/gpu.txt" 2>> "$tmp/err" || { echo "FAIL $m $*: model-eval: $(tail -n 2 "$tmp/err")"; fail=1; return; }
    "$py" - "$tmp/cpu.txt" "$tmp/gpu.txt" "$m $*" << 'PY' || fail=1
import sys
import numpy as np
def rows(path):
    out = []
    for ln in open(path):
        f = ln.split()
        if f and f[0] != "end":
            out.append(np.array([float(x) for x in f[1:]]))
    return out
a, b = rows(sys.argv[1]), rows(sys.argv[2])
kls, bad = [], []
for i, (p, q) in enumerate(zip(a, b)):
    lp = p - p.max() - np.log(np.exp(p - p.max()).sum())
    lq = q - q.max() - np.log(np.exp(q - q.max()).sum())
    kls.append(float((np.exp(lp) * (lp - lq)).sum()))
    top2 = np.sort(p)[-2:]
    if top2[1] - top2[0] > 0.05 and p.argmax() != q.argmax():
        bad.append(i)
ok = len(a) == len(b) > 0 and np.mean(kls) < 2e-3 and not bad
print(f"{'ok  ' if ok else 'FAIL'} {sys.argv[3]}: CUDA0 (emulated) vs CPU over {len(a)} positions: mean KL "
      f"{np.mean(kls) if kls else float('nan'):.2e}, max {max(kls) if kls else float('nan'):.2e}; top-1 differs at {bad}")
sys.exit(0 if ok else 1)
PY
}
for m in tiny-qwen2-bpe-f32 tiny-mixtral-bpe-q8 tiny-ds2lite-bpe-q8 tiny-ds3-bpe-f32; do
    for fa in 0 1; do
        run "$m" -fa "$fa"
        run "$m" -fa "$fa" -ub 1
    done
done
run tiny-ds3-bpe-f32 -fa 1 -ot exps=CPU
run tiny-ds2lite-bpe-q8 -fa 0 -ub 1 -ot exps=CPU
exit $fail
