#!/usr/bin/env python3
"""Records llama.cpp's answers (through llama-cpp-python) that libtensr's
tokenizer and model tests are judged against. Run by tests/make-llama-refs.sh;
the output in tests/data/refs/ is committed.

Usage: make_llama_refs.py MODEL.gguf TINY_DIR OUT_DIR [--skip-ppl] [--name=NAME] [PART...]

PART is one of tokenizer, tiny, arch, deepseek2, greedy, ppl, kl (default: all of them), so
that one reference can be recorded again without touching the others. kl
reads the greedy continuations of the greedy part from OUT_DIR. NAME
(default smollm2) is the suffix of MODEL's files (tokenizer, greedy,
logits, perplexity and kl, each "PART-NAME" with the extension json);
gemma3 is the Gemma 3 270M of examples/get-model.sh gemma3.

Every JSON file has a header (llama-cpp-python version, the model's SHA-256)
and its records one per line, so that a C test can read them line by line.
"""
import ctypes
import hashlib
import importlib.util
import json
import math
import os
import sys

import numpy as np
import llama_cpp

N_THREADS = 2
GPL3 = "/usr/share/common-licenses/GPL-3"
PPL_CTX = 512
PPL_CHUNKS = 4
# per model (n_ctx, chunks) when not the above: Gemma 3's chunks pass its
# 512-position sliding window, so the windowed layers are judged too
PPL_SHAPE = {"gemma3": (1024, 2)}
N_GREEDY = 64
KL_TOP = 20  # tokens kept per step in kl-smollm2.json (the rest is one bucket)

TOKENIZER_STRINGS = [
    "",
    " ",
    "  ",
    "\n",
    "\t",
    "Hello world",
    " Hello world",
    "Hello, world! How are you today?",
    "It's a dog's life; we'll see, they'd've known. I'M 'S 'T",
    "'s 't 're 've 'm 'll 'd",
    "1234567890 3.14159 -42 1e10 2024-05-01 $1,000.50",
    "héllo wörld café naïve façade",
    "Привет, мир! Как дела?",
    "你好，世界。今天天气很好。",
    "こんにちは世界、カタカナ",
    "한국어 텍스트",
    "العربية نص",
    "🦙🔥👍🏽 👨‍👩‍👧 ❤️",
    "def f(x):\n    return x**2  # square\n",
    "int main(void) {\n\treturn 0;\n}\n",
    "a  b   c\t\td\n\n\ne \n \n",
    "end   ",
    "   start",
    "\n\n\n\n",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|im_end|>more text",
    "<|im_start|><|im_start|>",
    "<|im_start|",
    "a\u00a0b\u3000c\u2028d\u2003e",
    "e\u0301 n\u0303",
    "\u01c4 \u01c5 \u01c6",
    "\u00bd \u00b2 \u216b \u0663\u0664 \uff11\uff12",
    "https://example.com/path?q=1&r=2#frag",
    '{"a": [1, 2, 3], "b": null}',
    "supercalifragilisticexpialidocious",
    "The quick brown fox jumps over the lazy dog.",
    "    indented\n        more",
    "Hello world, the quick brown fox café wörld  123 é<|eot_id|>x",
    "<s> </s> <unk> [INST] hi [/INST]",
]
# more strings for one model's special tokens
EXTRA_STRINGS = {
    "gemma3": [
        "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
        "<bos><eos><pad><unk><mask>",
        "text<end_of_turn>more<start_of_turn",
        "<start_of_image><end_of_image>\u00a0<image_soft_token>",
        "\t\t\t    \n\n  tabs and spaces  \u2581 \u2581\u2581",
    ],
}
# the built-in llama.cpp chat template of a model whose GGUF has no
# tokenizer.chat_template (llama_chat_apply_template by name)
BUILTIN_CHAT = {"gemma3": "gemma"}
# byte strings that are not valid UTF-8
TOKENIZER_BYTES = [b"a\xffb", b"\xc3", b"x\xe2\x82", b"\xed\xa0\x80z"]

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "1, 2, 3, 4, 5,",
    "Translate to French: Good morning, my friend.",
    "The quick brown fox",
    "In machine learning, a neural network is",
    "List of planets in the solar system:\n1.",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Write a haiku about the sea."}],
]
TOP5_PROMPTS = ["The capital of France is", "def fibonacci(n):\n    if n < 2:"]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def header(model_path, **extra):
    return {
        "generator": "tests/make_llama_refs.py",
        "llama_cpp_python": llama_cpp.__version__,
        "model": os.path.basename(model_path),
        "model_sha256": sha256(model_path),
        "n_threads": N_THREADS,
        **extra,
    }


def write_records(path, head, key, records, compact=False):
    """JSON object with the header fields, then key: [one record per line]
    (compact: without blanks after , and :)."""
    sep = (",", ":") if compact else (", ", ": ")
    with open(path, "w", encoding="utf-8") as f:
        h = json.dumps(head, ensure_ascii=False, separators=sep)
        f.write(h[:-1] + sep[0] + json.dumps(key) + sep[1] + "[\n")
        for i, r in enumerate(records):
            f.write(json.dumps(r, ensure_ascii=False, separators=sep))
            f.write(",\n" if i + 1 < len(records) else "\n")
        f.write("]}\n")
    print("wrote", path, file=sys.stderr)


def load(path, n_ctx, vocab_only=False, flash_attn=False):
    return llama_cpp.Llama(path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                           n_threads=N_THREADS, n_threads_batch=N_THREADS, vocab_only=vocab_only,
                           flash_attn=flash_attn, seed=1234, verbose=False)


def tokenizer_refs(model_path, out, name):
    m = load(model_path, 64, vocab_only=True)
    recs = []
    strings = TOKENIZER_STRINGS + EXTRA_STRINGS.get(name, [])
    inputs = [(s.encode("utf-8"), s) for s in strings] + [(b, None) for b in TOKENIZER_BYTES]
    for raw, text in inputs:
        for add_special in (0, 1):
            for parse_special in (0, 1):
                ids = m.tokenize(raw, add_bos=bool(add_special), special=bool(parse_special))
                detok = detokenize(m, ids)
                r = {"hex": raw.hex(), "add_special": add_special, "parse_special": parse_special,
                     "ids": ids, "detok_hex": detok.hex()}
                if text is not None:
                    r = {"text": text, **r}
                recs.append(r)
    n_vocab = m.n_vocab()
    for i in sorted(set(range(min(n_vocab, 300))) | set(range(0, n_vocab, 61)) | {n_vocab - 1}):
        recs.append({"piece_id": i, "piece_hex": piece(m, i).hex()})
    head = header(model_path, what="cases: token ids of llama_tokenize(bytes, add_special, "
                  "parse_special) and llama_detokenize(ids, remove_special=false, unparse_special=true); "
                  "pieces: llama_token_to_piece(id, lstrip=0, special=true) for a sample of ids",
                  n_vocab=n_vocab)
    write_records(os.path.join(out, f"tokenizer-{name}.json"), head, "cases", recs)


def detokenize(m, ids):
    vocab = m._model.vocab
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, True)
    assert 0 <= n <= size
    return buf.raw[:n]


def piece(m, i):
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(m._model.vocab, i, buf, 256, 0, True)
    assert 0 <= n <= 256
    return buf.raw[:n]


def argmax_top2(logits):
    order = np.argsort(-logits, kind="stable")[:2]
    return [int(order[0]), float(logits[order[0]]), int(order[1]), float(logits[order[1]])]


def greedy(m, prompt_ids, n):
    m.reset()
    m.eval(prompt_ids)
    out, top2 = [], []
    for _ in range(n):
        logits = np.array(m.scores[m.n_tokens - 1], dtype=np.float32)
        t2 = argmax_top2(logits)
        tok = t2[0]
        out.append(tok)
        top2.append(t2)
        if tok == m.token_eos():
            break
        m.eval([tok])
    return out, top2


def render_chat(m, messages, name):
    if "tokenizer.chat_template" not in m.metadata:
        return builtin_chat(BUILTIN_CHAT[name], messages)
    import jinja2
    tmpl = m.metadata["tokenizer.chat_template"]
    env = jinja2.Environment(loader=jinja2.BaseLoader())
    return env.from_string(tmpl).render(messages=messages, add_generation_prompt=True)


def builtin_chat(tmpl, messages):
    """llama.cpp's own rendering with its built-in template tmpl."""
    arr = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(x["role"].encode(), x["content"].encode()) for x in messages])
    size = 4096
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(tmpl.encode(), arr, len(messages), True, buf, size)
    assert 0 < n <= size
    return buf.raw[:n].decode("utf-8")


def greedy_refs(model_path, out, name):
    m = load(model_path, 512)
    recs = []
    for p in PROMPTS:
        ids = m.tokenize(p.encode(), add_bos=True, special=False)
        gen, top2 = greedy(m, ids, N_GREEDY)
        recs.append({"prompt": p, "chat": 0, "prompt_ids": ids, "ids": gen,
                     "text": m.detokenize(gen).decode("utf-8", "replace"), "top2": top2})
    for msgs in CHATS:
        p = render_chat(m, msgs, name)
        ids = m.tokenize(p.encode(), add_bos=True, special=True)
        gen, top2 = greedy(m, ids, N_GREEDY)
        recs.append({"prompt": p, "chat": 1, "messages": msgs, "prompt_ids": ids, "ids": gen,
                     "text": m.detokenize(gen).decode("utf-8", "replace"), "top2": top2})
    head = header(model_path, what="greedy continuations (argmax of llama.cpp's logits, temperature 0), "
                  f"up to {N_GREEDY} tokens, stopping after EOS; raw prompts tokenized with add_special, "
                  "no special parsing; chat prompts rendered from tokenizer.chat_template with jinja2 "
                  "(add_generation_prompt; without one, llama_chat_apply_template with llama.cpp's built-in "
                  "template for the model) and tokenized with special parsing; top2 = [id1, logit1, id2, "
                  "logit2] per step, for judging near-ties",
                  system_info=llama_cpp.llama_print_system_info().decode())
    write_records(os.path.join(out, f"greedy-{name}.json"), head, "cases", recs)

    recs = []
    for p in TOP5_PROMPTS:
        ids = m.tokenize(p.encode(), add_bos=True, special=False)
        m.reset()
        m.eval(ids)
        for pos in sorted({0, len(ids) // 2, len(ids) - 1}):
            logits = np.array(m.scores[pos], dtype=np.float32)
            top = np.argsort(-logits, kind="stable")[:5]
            recs.append({"prompt": p, "prompt_ids": ids, "pos": pos, "top_ids": [int(i) for i in top],
                         "top_logits": [float(logits[i]) for i in top]})
    head = header(model_path, what="top-5 logits (ids, values) after evaluating prompt_ids in one batch, "
                  "at position pos (the logits predicting token pos+1)")
    write_records(os.path.join(out, f"logits-{name}.json"), head, "cases", recs)


def ppl_refs(model_path, out, name):
    text = open(GPL3, "rb").read().decode("utf-8")
    PPL_CTX, PPL_CHUNKS = PPL_SHAPE.get(name, (globals()["PPL_CTX"], globals()["PPL_CHUNKS"]))
    m = load(model_path, PPL_CTX)
    tokens = m.tokenize(text.encode(), add_bos=True, special=False)
    add_bos = m.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true"
    first = PPL_CTX // 2
    recs, nll, count = [], 0.0, 0
    n_chunks = min(PPL_CHUNKS, len(tokens) // PPL_CTX)
    for c in range(n_chunks):
        chunk = list(tokens[c * PPL_CTX:(c + 1) * PPL_CTX])
        if add_bos:
            chunk[0] = m.token_bos()
        m.reset()
        m.eval(chunk)
        logits = np.array(m.scores[:PPL_CTX], dtype=np.float64)
        c_nll = 0.0
        for j in range(first, PPL_CTX - 1):
            row = logits[j]
            mx = row.max()
            lse = mx + math.log(np.exp(row - mx).sum())
            c_nll += lse - row[chunk[j + 1]]
        nll += c_nll
        count += PPL_CTX - 1 - first
        recs.append({"chunk": c, "nll_sum": c_nll, "n_scored": PPL_CTX - 1 - first,
                     "ppl_so_far": math.exp(nll / count)})
    head = header(model_path, what="perplexity the llama-perplexity way: the text tokenized whole "
                  "(add_special), cut in chunks of n_ctx tokens, each chunk evaluated from an empty "
                  "cache (first token replaced by BOS when the model adds BOS), the second half scored: "
                  "logits at positions first..n_ctx-2 predict tokens first+1..n_ctx-1, first = n_ctx/2",
                  text=GPL3, text_sha256=sha256(GPL3), n_text_tokens=len(tokens), n_ctx=PPL_CTX,
                  n_chunks=n_chunks, ppl=math.exp(nll / count))
    write_records(os.path.join(out, f"perplexity-{name}.json"), head, "chunks", recs)


TINY_IDS = {
    # BOS, then a fixed mix of ids covering the vocabulary
    "spm": [1, 325, 260, 304, 263, 309, 310, 270, 269, 287, 297, 259, 100, 45, 340, 3],
    "bpe": [318, 39, 72, 256, 300, 12, 87, 4, 299, 310, 250, 100, 101, 32, 315, 77],
}


def tiny_refs(tiny_dir, out):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_tiny_models as mtm
    for name in mtm.MODELS:
        path = os.path.join(tiny_dir, f"{name}.gguf")
        cfg = mtm.write_model(name, path)
        ids = TINY_IDS[cfg["vocab"]]
        m = load(path, 64)
        m.reset()
        m.eval(ids)
        recs = []
        for pos in range(len(ids)):
            logits = np.array(m.scores[pos], dtype=np.float32)
            recs.append({"pos": pos, "logits": [float(f"{x:.7g}") for x in logits]})
        gen, top2 = greedy(m, ids, 16)
        tokenizer_refs(path, out, name)
        head = header(path, what="a tiny random-weight model written by tests/make_tiny_models.py "
                      "(regenerate it, it is deterministic); logits of every position after "
                      "evaluating ids in one batch; greedy: 16 argmax tokens continuing ids",
                      gguf_py=getattr(__import__("gguf"), "__version__", "?"), config=cfg, ids=ids,
                      greedy_ids=gen, greedy_top2=top2)
        write_records(os.path.join(out, f"model-{name}.json"), head, "positions", recs)


def arch_refs(tiny_dir, out, part="arch"):
    """The other architectures' tiny models (make_tiny_models.ARCH_MODELS,
    or with part "deepseek2" its DS_MODELS): logits of every position with
    flash attention off and on, 16 greedy tokens (flash off), and the
    float64 reference's router margins (ARCH_MODELS only: deepseek2 has no
    numpy reference)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_tiny_models as mtm
    for name in (mtm.DS_MODELS if part == "deepseek2" else mtm.ARCH_MODELS):
        path = os.path.join(tiny_dir, f"{name}.gguf")
        cfg = mtm.write_model(name, path)
        ids = TINY_IDS[cfg["vocab"]]
        rows = {}
        for fa in (False, True):
            m = load(path, 64, flash_attn=fa)
            m.reset()
            m.eval(ids)
            rows[fa] = [np.array(m.scores[pos], dtype=np.float32) for pos in range(len(ids))]
            if not fa:
                gen, top2 = greedy(m, ids, 16)
            del m
        recs = [{"pos": pos, "logits": [float(f"{x:.7g}") for x in rows[False][pos]],
                 "logits_fa": [float(f"{x:.7g}") for x in rows[True][pos]]} for pos in range(len(ids))]
        own = max(float(np.abs(a - b).max()) for a, b in zip(rows[False], rows[True]))
        if part == "deepseek2":
            ref_diff, margins = float("nan"), None
        else:
            ref, margins = mtm.reference(name, ids)
            ref_diff = float(np.abs(ref - np.array(rows[False])).max())
        head = header(path, what="a tiny random-weight model written by tests/make_tiny_models.py "
                      "(regenerate it, it is deterministic); logits (flash attention off) and logits_fa (on) of "
                      "every position after evaluating ids in one batch; greedy: 16 argmax tokens continuing ids "
                      "(flash off); fa_max_diff: llama.cpp's own largest |logit| difference between the two; "
                      "numpy_max_diff: the same against make_tiny_models.reference() (float64); router_margin_min: "
                      "the smallest margin of that reference between the last expert chosen and the first left "
                      "out (router logits), over every token and layer",
                      gguf_py=getattr(__import__("gguf"), "__version__", "?"), config=cfg, ids=ids,
                      greedy_ids=gen, greedy_top2=top2, fa_max_diff=float(f"{own:.3e}"),
                      numpy_max_diff=None if ref_diff != ref_diff else float(f"{ref_diff:.3e}"),
                      router_margin_min=None if margins is None else float(f"{margins.min():.3e}"))
        print(f"{name}: llama.cpp flash off/on max |diff| {own:.2e}, vs numpy {ref_diff:.2e}, router margin "
              f"{'-' if margins is None else f'{margins.min():.2e}'}", file=sys.stderr)
        write_records(os.path.join(out, f"model-{name}.json"), head, "positions", recs)


def test_model_module():
    """tests/test-model.py, for its grouped_kl (one definition for the
    recording and the test)."""
    spec = importlib.util.spec_from_file_location(
        "test_model", os.path.join(os.path.dirname(os.path.abspath(__file__)), "test-model.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def log_softmax(logits):
    x = np.asarray(logits, dtype=np.float64)
    mx = x.max(axis=-1, keepdims=True)
    return x - (mx + np.log(np.exp(x - mx).sum(axis=-1, keepdims=True)))


def g5(x):
    """5 significant digits: enough for the grouped KL (checked below)."""
    return float(f"{x:.5g}")


def kl_refs(model_path, out, name):
    greedy = json.load(open(os.path.join(out, f"greedy-{name}.json"), encoding="utf-8"))
    assert greedy["model_sha256"] == sha256(model_path), f"greedy-{name}.json is from another model file"
    tm = test_model_module()
    paths = {"off": load(model_path, 512, flash_attn=False), "on": load(model_path, 512, flash_attn=True)}
    cases, recs = [], []
    exact = {"off_on": [], "on_off": [], "g_off_on": [], "g_on_off": []}
    rounding = []
    for ci, c in enumerate(greedy["cases"]):
        tokens = c["prompt_ids"] + c["ids"][:-1]
        first = len(c["prompt_ids"]) - 1
        cases.append({"case": ci, "prompt": c["prompt"], "chat": c["chat"], "tokens": tokens, "first": first})
        lp = {}
        for fa, m in paths.items():
            m.reset()
            m.eval(tokens)  # one batch (n_batch = n_ubatch = n_ctx = 512)
            lp[fa] = log_softmax(np.array(m.scores[:len(tokens)], dtype=np.float32))
        for pos in range(first, len(tokens)):
            off, on = lp["off"][pos], lp["on"][pos]
            top = np.argsort(-off, kind="stable")[:KL_TOP]
            rest = np.ones(off.shape, dtype=bool)
            rest[top] = False
            tail = [float(np.exp(off[rest]).sum()), float(np.exp(on[rest]).sum())]
            top_on = np.argsort(-on, kind="stable")[:2]
            p_off, p_on = np.exp(off), np.exp(on)
            kl_off_on = float((p_off * (off - on)).sum())
            kl_on_off = float((p_on * (on - off)).sum())
            r = {"case": ci, "pos": pos, "ids": [int(i) for i in top],
                 "off": [g5(-off[i]) for i in top], "on": [g5(-on[i]) for i in top],
                 "tail": [float(f"{t:.4e}") for t in tail],
                 "top1": [int(top[0]), int(top_on[0])],
                 "gap": [g5(off[top[0]] - off[top[1]]), g5(on[top_on[0]] - on[top_on[1]])],
                 "kl": [float(f"{kl_off_on:.4e}"), float(f"{kl_on_off:.4e}")]}
            recs.append(r)
            # the grouped KL from the exact values and from the rounded ones
            ex_off = (off[top], tail[0])
            ex_on = (on[top], tail[1])
            g_exact = tm.grouped_kl(ex_off, ex_on)
            g_round = tm.grouped_kl(tm.stored_dist(r, "off"), tm.stored_dist(r, "on"))
            rounding.append(abs(g_round - g_exact))
            exact["off_on"].append(kl_off_on)
            exact["on_off"].append(kl_on_off)
            exact["g_off_on"].append(g_round)
            exact["g_on_off"].append(tm.grouped_kl(tm.stored_dist(r, "on"), tm.stored_dist(r, "off")))
    mean = {k: float(f"{np.mean(v):.6e}") for k, v in exact.items()}
    head = header(model_path, what=(
        f"llama.cpp's distributions teacher-forced along its greedy continuations (greedy-{name}.json): "
        "for every case, tokens = prompt_ids + ids[:-1] evaluated in one batch (n_ctx = n_batch = n_ubatch "
        "= 512), once with flash attention off and once on; one step per position pos from first = "
        "len(prompt_ids) - 1 to the end (the logits predicting ids[pos - first]). Per step: ids = the "
        f"{KL_TOP} most probable tokens of the flash-off run (ties: lower id first); off, on = their "
        "log-probabilities negated, -log p (log-softmax of the full logits, 5 significant digits), in the "
        "flash-off and flash-on runs; tail = [off, on] = the probability of all other tokens; top1 = [off, on] = the "
        "argmax of each run over the full vocabulary and gap = its top1 - top2 logit gap; kl = [KL(off || "
        "on), KL(on || off)], exact over the full vocabulary. The grouped KL (tests/test-model.py "
        f"grouped_kl) is the KL between the two distributions reduced to the {KL_TOP} ids plus one 'rest' "
        "bucket holding the tail (each renormalised to sum to 1 after rounding); by the log-sum inequality it "
        "is a lower bound of the full KL. The test reduces libtensr's distribution to the same buckets and "
        "compares KL(llama.cpp || libtensr) with llama.cpp's own grouped KL between its flash-off and "
        "flash-on runs, so like is compared with like: libtensr without flash attention KL(off || "
        "libtensr) against KL(off || on), with it KL(on || libtensr) against KL(on || off). Header: mean_kl = means over all steps of the "
        "exact full KL (off_on, on_off) and of the grouped KL from the stored values (g_off_on, g_on_off); "
        "rounding_max = the largest difference per step between the grouped KL from the stored (rounded) "
        "values and from the exact ones"),
        system_info=llama_cpp.llama_print_system_info().decode(), top_k=KL_TOP, n_steps=len(recs),
        mean_kl=mean, rounding_max=float(f"{max(rounding):.3e}"), cases=cases)
    write_records(os.path.join(out, f"kl-{name}.json"), head, "steps", recs, compact=True)
    print(f"kl: {len(recs)} steps; mean KL(off||on) full {mean['off_on']:.4e}, grouped {mean['g_off_on']:.4e}; "
          f"KL(on||off) full {mean['on_off']:.4e}, grouped {mean['g_on_off']:.4e}; rounding max "
          f"{max(rounding):.2e}", file=sys.stderr)


PARTS = ("tokenizer", "tiny", "arch", "deepseek2", "greedy", "ppl", "kl")


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    if len(args) < 3 or any(a not in PARTS for a in args[3:]):
        print(__doc__, file=sys.stderr)
        return 2
    model, tiny_dir, out = args[:3]
    parts = set(args[3:]) or set(PARTS)
    name = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("--name=")), "smollm2")
    if "--skip-ppl" in argv:
        parts.discard("ppl")
    if name != "smollm2":
        parts.discard("tiny")  # the tiny models' refs do not depend on MODEL
    os.makedirs(out, exist_ok=True)
    os.makedirs(tiny_dir, exist_ok=True)
    if "tokenizer" in parts:
        tokenizer_refs(model, out, name)
    if "tiny" in parts:
        tiny_refs(tiny_dir, out)
    if "arch" in parts:
        arch_refs(tiny_dir, out)
    if "deepseek2" in parts:
        arch_refs(tiny_dir, out, "deepseek2")
    if "greedy" in parts:
        greedy_refs(model, out, name)
    if "ppl" in parts:
        ppl_refs(model, out, name)
    if "kl" in parts:
        kl_refs(model, out, name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
