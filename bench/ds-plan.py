#!/usr/bin/env python3
"""bench/ds-plan.py - the memory a deepseek2 model with DeepSeek-V3's real
attention shapes needs at its full 163,840-token context, in libtensr and in
llama.cpp, side by side.

Writes a deepseek2 GGUF (7168 wide, 128 heads, q LoRA 1536, KV LoRA 512,
rope 64, nope 128, v 128, YaRN as V3; a tiny FFN and 4 experts; N_LAYER
layers, the first dense; F16 weights of zeros: the sizes are what counts)
with tests/make_tiny_models.py's vocabulary and keys, then for each setting
(plain attention, -amb 2048, -amb 256, flash attention) runs

  - tensr-run -v -c 163840 -ub 512 (the memory plan it logs: KV cache and
    compute buffer per device), and
  - llama.cpp (llama-cpp-python from the venv of tests/make-llama-refs.sh,
    or LLAMA_PYTHON) with the same context and u-batch, whose log gives its
    KV buffer and compute buffer sizes (llama.cpp has no -amb: its rows are
    plain and flash),

and prints a markdown table. The KV cache grows with the layers (the table
gives it per layer and for V3's 61 layers); the compute buffer does not.

Usage: bench/ds-plan.py [BUILD_DIR] (default: the source tree)
Environment: N_LAYER (default 4), LLAMA_PYTHON, KEEP=1 keeps the file.
"""
import os
import re
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
top = os.path.dirname(here)
sys.path.insert(0, os.path.join(top, "tests"))
import numpy as np  # noqa: E402
import gguf  # noqa: E402
import make_tiny_models as mtm  # noqa: E402

N_CTX = 163840
N_LAYER = int(os.environ.get("N_LAYER", "4"))
V3 = dict(mtm._DS, n_embd=7168, n_head=128, n_layer=N_LAYER, n_ff=64, n_ctx=N_CTX, q_lora=1536, kv_lora=512,
          rope=64, nope=128, v_mla=128, legacy_kv_b=False, n_expert=4, n_expert_used=2, n_ff_exp=64, n_shared=1,
          n_dense_lead=1, gating=2, w_norm=True, w_scale=2.5, probs_b=True, yarn=40.0, yarn_orig=4096,
          yarn_log_mul=0.1, ftype="f16", seed=1)


def write(path):
    cfg = dict(V3)
    toks, types, merges = mtm.bpe_vocab()
    cfg["n_vocab"] = len(toks)
    w = gguf.GGUFWriter(path, "deepseek2")
    w.add_name("deepseek-v3-attention-shapes")
    w.add_context_length(N_CTX)
    mtm.write_ds_keys(w, cfg)
    w.add_embedding_length(cfg["n_embd"])
    w.add_block_count(cfg["n_layer"])
    w.add_feed_forward_length(cfg["n_ff"])
    w.add_head_count(cfg["n_head"])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(cfg["n_expert"])
    w.add_expert_used_count(cfg["n_expert_used"])
    w.add_expert_feed_forward_length(cfg["n_ff_exp"])
    w.add_vocab_size(cfg["n_vocab"])
    w.add_file_type(1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(len(toks) - 3)
    w.add_eos_token_id(len(toks) - 2)
    for name, shape, kind in mtm.ds_tensors(cfg):
        big = kind in ("w", "exps", "embd") and len(shape) > 1
        a = np.zeros(shape, np.float16 if big else np.float32)
        if kind == "norm":
            a += 1
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tensr(build, path, fa, amb):
    cmd = [os.path.join(build, "examples", "tensr-run"), "-m", path, "-c", str(N_CTX), "-ub", "512", "-b", "512",
           "-t", "2", "-n", "1", "-p", "Hello", "-v", "-fa", "on" if fa else "off", "-amb", str(amb)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    kv = comp = None
    for ln in r.stderr.splitlines():
        m = re.search(r'msg="memory plan" device=CPU .*kv_cache_mib=([\d.]+)', ln)
        if m and float(m.group(1)) > 0:
            kv = float(m.group(1))
        m = re.search(r'msg="compute buffer" device=CPU mib=([\d.]+)', ln)
        if m:
            comp = max(comp or 0.0, float(m.group(1)))
    err = "" if r.returncode == 0 else r.stderr.strip().splitlines()[-1][-160:]
    return kv, comp, err


LLAMA_CODE = r"""
import sys
from llama_cpp import Llama
Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), n_batch=512, n_ubatch=512, n_threads=2,
      flash_attn=sys.argv[3] == "1", verbose=True)
"""


def llama(path, fa):
    py = os.environ.get("LLAMA_PYTHON") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "libtensr", "llama-venv", "bin", "python3")
    if not os.path.exists(py):
        return None, None, "no llama-cpp-python (tests/make-llama-refs.sh makes its venv)"
    r = subprocess.run([py, "-c", LLAMA_CODE, path, str(N_CTX), "1" if fa else "0"], capture_output=True, text=True)
    log = r.stderr + r.stdout
    kv = re.findall(r"KV buffer size\s*=\s*([\d.]+) MiB", log)
    comp = re.findall(r"CPU compute buffer size\s*=\s*([\d.]+) MiB", log)
    fail = re.findall(r"failed to allocate \S+ buffer of size (\d+)", log)
    err = ""
    if not comp and fail:
        comp, err = [int(fail[-1]) / 1048576.0], "allocation failed"
    elif r.returncode:
        err = log.strip().splitlines()[-1][-160:]
    return (sum(map(float, kv)) if kv else None), (float(comp[-1]) if comp else None), err


def fmt(x):
    return "-" if x is None else f"{x:,.1f}"


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else top
    d = tempfile.mkdtemp(dir=os.environ.get("TMPDIR"))
    path = os.path.join(d, "ds-v3-attn.gguf")
    write(path)
    print(f"deepseek2, V3 attention shapes, {N_LAYER} layers, context {N_CTX}, u-batch 512, file "
          f"{os.path.getsize(path) / 2**20:,.0f} MiB\n")
    print("| setting | libtensr KV MiB | per layer | x 61 layers | libtensr compute MiB | "
          "llama.cpp KV MiB | llama.cpp compute MiB | notes |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for label, fa, amb in (("plain", 0, 0), ("-amb 2048", 0, 2048), ("-amb 256", 0, 256), ("flash", 1, 0)):
        lkv, lcomp, lerr = llama(path, fa) if amb == 0 else (None, None, "")
        rows.append((label, amb) + tensr(build, path, fa, amb) + (lkv, lcomp, lerr))
    # a run whose compute buffer could not be had logs no plan: its cache is the others' (the same settings)
    kv_any = next((r[2] for r in rows if r[2] is not None), None)
    for label, amb, kv, comp, err, lkv, lcomp, lerr in rows:
        if kv is None and kv_any is not None:
            kv, err = kv_any, err + " (KV: the other rows')"
        per = kv / N_LAYER if kv is not None else None
        notes = "; ".join(x for x in (f"libtensr: {err}" if err else "", f"llama.cpp: {lerr}" if lerr else "") if x)
        print(f"| {label} | {fmt(kv)} | {fmt(per)} | {fmt(per * 61 if per else None)} | {fmt(comp)} | "
              f"{fmt(lkv) if amb == 0 else 'n/a'} | {fmt(lcomp) if amb == 0 else 'n/a'} | {notes} |", flush=True)
    if os.environ.get("KEEP") != "1":
        os.remove(path)
        os.rmdir(d)


if __name__ == "__main__":
    main()
