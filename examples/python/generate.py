#!/usr/bin/env python3
"""generate.py - text generation with a GGUF model (llama, mistral; made for
SmolLM2-135M-Instruct) through the binding's model layer: tsr.Model loads
it, Model.generate() tokenizes, decodes, samples and streams the text.

    python3 generate.py [-m model.gguf] [-p prompt] [-n tokens] [-t threads] [-c ctx]
                        [--chat] [--temp T] [--seed S] [-ngl N]

Greedy by default (--temp 0). --chat renders the prompt as one user message
with the model's chat template. -c caps prompt + generated tokens (the
generation stops there). --kv-type and --no-cache are accepted for the
scripts that pass them and ignored: Model.generate() keeps an f16 KV cache
(Model.session(type_k=...) chooses another).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import libtensr as tsr  # noqa: E402

DEFAULT_MODEL = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                             "libtensr", "SmolLM2-135M-Instruct.Q4_1.gguf")


def n_prompt_tokens(model, prompt, chat):
    """The prompt's token count, as Model.generate() tokenizes it."""
    if chat:
        return len(model.tokenize(model.chat_format([("user", prompt)]), True, True))
    return len(model.tokenize(prompt))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=DEFAULT_MODEL)
    ap.add_argument("-p", "--prompt", default="The capital of France is")
    ap.add_argument("-n", "--n-predict", type=int, default=16)
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("-c", "--ctx-size", type=int, default=512,
                    help="most tokens of prompt + generation (0: no limit)")
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--temp", type=float, default=0.0, help="temperature (0: greedy)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=0)
    ap.add_argument("--kv-type", default="f16", help="ignored (Model.generate uses f16)")
    ap.add_argument("--no-cache", action="store_true", help="ignored (there is always a cache)")
    args = ap.parse_args()
    try:
        with tsr.Model(args.model, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers) as model:
            n_prompt = n_prompt_tokens(model, args.prompt, args.chat)
            n = args.n_predict
            if args.ctx_size > 0:
                if n_prompt >= args.ctx_size:
                    sys.exit("generate.py: the prompt has %d tokens, -c is %d"
                             % (n_prompt, args.ctx_size))
                n = min(n, args.ctx_size - n_prompt)
            t0 = time.time()
            t_first, n_pieces = None, 0
            for piece in model.generate(args.prompt, n, temperature=args.temp, seed=args.seed,
                                        chat=args.chat):
                if t_first is None:
                    t_first = time.time()
                n_pieces += 1
                sys.stdout.write(piece)
                sys.stdout.flush()
            t1 = time.time()
            sys.stdout.write("\n[prompt %d tokens, %d pieces in %.2f s, first after %.2f s]\n"
                             % (n_prompt, n_pieces, t1 - t0, (t_first or t1) - t0))
    except tsr.Error as e:
        sys.exit("generate.py: %s" % e)


if __name__ == "__main__":
    main()
