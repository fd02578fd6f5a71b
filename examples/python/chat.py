#!/usr/bin/env python3
"""chat.py - an interactive chat in the terminal with a GGUF chat model
(SmolLM2-135M-Instruct by default) on the binding's model layer.

    python3 chat.py [-m model.gguf] [-t threads] [-n max reply tokens] [--temp T] [--seed S]
                    [-c ctx] [-s system prompt] [-ngl N]

Type a message and Enter: the reply streams as it is generated. /quit or
end of input (Ctrl-D) ends, /reset forgets the conversation, Ctrl-C stops
a reply. The conversation is kept: each turn renders all of it with the
model's chat template, and only the tokens past what the KV cache already
holds are decoded. When the context fills up, the oldest turns are dropped.
"""
import argparse
import codecs
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import libtensr as tsr  # noqa: E402

# where examples/get-model.sh puts the default model
DEFAULT_MODEL = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                             "libtensr", "SmolLM2-135M-Instruct.Q4_1.gguf")


class Chat:
    """The conversation, one session holding its tokens, one sampler."""

    def __init__(self, model, n_ctx, max_tokens, temperature, seed, system=None):
        self.model, self.max_tokens = model, max_tokens
        self.session = model.session(n_ctx)
        self.sampler = model.sampler(temperature, seed=seed)
        self.system = [{"role": "system", "content": system}] if system else []
        self.reset()

    def reset(self):
        self.messages = list(self.system)
        self.cached = []  # the tokens in the session's KV cache, from position 0
        self.session.remove(-1)
        self.sampler.reset()

    def _prompt(self):
        """The conversation's tokens, dropping the oldest turns until a reply fits."""
        while True:
            text = self.model.chat_format(self.messages, add_assistant=True)
            ids = self.model.tokenize(text, add_special=True, parse_special=True)
            if len(ids) + self.max_tokens <= self.session.n_ctx:
                return ids
            first = len(self.system)
            if len(self.messages) - first <= 1:  # only this message left
                if len(ids) < self.session.n_ctx:
                    return ids  # a shorter reply
                raise tsr.Error(tsr.TSR_E_FULL, "the message has %d tokens, the context %d"
                                % (len(ids), self.session.n_ctx), "chat")
            del self.messages[first:first + 2]  # the oldest user message and its reply

    def reply(self, text, out=sys.stdout):
        """Adds a user message, streams the reply to out, returns it."""
        self.messages.append({"role": "user", "content": text})
        try:
            ids = self._prompt()
        except tsr.Error:
            self.messages.pop()
            raise
        # keep the cached tokens the conversation starts with, decode the rest
        k = 0
        while k < min(len(ids), len(self.cached)) and ids[k] == self.cached[k]:
            k += 1
        k = min(k, len(ids) - 1)  # decode at least one token, for its logits
        self.session.remove(0, k)
        self.cached = self.cached[:k]
        batch = ids[k:]
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        parts = []
        try:
            for _ in range(self.max_tokens):
                if self.session.n_past() + len(batch) > self.session.n_ctx:
                    break
                logits = self.session.decode(batch)
                self.cached += batch
                tok = self.sampler.sample(logits)
                if self.model.is_eog(tok):
                    break
                piece = dec.decode(self.model.token_piece(tok))
                parts.append(piece)
                out.write(piece)
                out.flush()
                batch = [tok]
            parts.append(dec.decode(b"", final=True))
        except KeyboardInterrupt:
            parts.append(" [stopped]")
        out.write(parts[-1] + "\n")
        answer = "".join(parts)
        self.messages.append({"role": "assistant", "content": answer})
        return answer


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=DEFAULT_MODEL,
                    help="GGUF chat model (default: %(default)s, fetched by examples/get-model.sh)")
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("-n", "--n-predict", type=int, default=512, help="most tokens of one reply")
    ap.add_argument("--temp", type=float, default=0.8, help="temperature (0: greedy)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096,
                    help="KV cells of the conversation (capped at the training context)")
    ap.add_argument("-s", "--system", default=None, help="a system prompt")
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=0)
    args = ap.parse_args()
    if not os.path.exists(args.model):
        sys.exit("chat.py: no model at %s (examples/get-model.sh fetches the default one)"
                 % args.model)
    tty = sys.stdin.isatty()
    if tty:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
    try:
        with tsr.Model(args.model, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers) as model:
            n_ctx = args.ctx_size
            if model.n_ctx_train > 0:
                n_ctx = min(n_ctx, model.n_ctx_train)
            chat = Chat(model, n_ctx, min(args.n_predict, n_ctx - 1), args.temp, args.seed,
                        args.system)
            if tty:
                print("chat.py: %s (%s); /quit or Ctrl-D ends, /reset forgets"
                      % (os.path.basename(args.model), model.arch))
            while True:
                try:
                    line = input("> " if tty else "")
                except EOFError:
                    break
                except KeyboardInterrupt:
                    print()
                    break
                line = line.strip()
                if not line:
                    continue
                if line in ("/quit", "/exit"):
                    break
                if line == "/reset":
                    chat.reset()
                    continue
                try:
                    chat.reply(line)
                except tsr.Error as e:
                    if e.status != tsr.TSR_E_FULL:
                        raise
                    print("chat.py: %s" % e.message, file=sys.stderr)
    except tsr.Error as e:
        sys.exit("chat.py: %s" % e)


if __name__ == "__main__":
    main()
