#!/usr/bin/env python3
"""serve_ray.py - the binding's Model as Ray Serve replicas behind an
OpenAI-style route: POST /v1/chat/completions and POST /v1/completions
(not streamed), GET /v1/models. Ray Serve spreads the requests over the
replicas; each replica loads the model once and answers one request at a
time (tsr.Model.generate).

    pip install "ray[serve]"
    python3 serve_ray.py [-m model.gguf] [--replicas 2] [-t threads] [--port 8000]
    curl localhost:8000/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Hi"}]}'

A chat's messages (system, user and assistant turns, as many as the
client sends) are rendered whole with the model's chat template, the
assistant's turn opened, as tensr-server renders them
(tsr.Model.generate(messages, chat=True)); the replica keeps no state
between requests: the client sends the conversation so far each time.
For the whole OpenAI API, continuous batching and
cancellation, run tensr-server replicas instead (tensr-server(1),
SCALING OUT). Each response names its replica in "system_fingerprint".
"""
import argparse
import asyncio
import os
import sys
import threading
import time

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import libtensr as tsr  # noqa: E402

DEFAULT_MODEL = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                             "libtensr", "SmolLM2-135M-Instruct.Q4_1.gguf")


def error(status, message, param=None):
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                   "code": None}}, status_code=status)


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 1}, max_ongoing_requests=4)
class TensrModel:
    def __init__(self, path, n_threads=1):
        self.model = tsr.Model(path, n_threads=n_threads)
        self.name = os.path.basename(path)
        self.lock = threading.Lock()  # one generation at a time per replica
        self.replica = f"tensr-{os.getpid()}"

    def _generate(self, prompt, max_tokens, temperature, seed, chat):
        with self.lock:
            pieces = list(self.model.generate(prompt, max_tokens, temperature=temperature, seed=seed, chat=chat))
        return "".join(pieces), len(pieces)

    async def __call__(self, request: Request):
        path = request.url.path.rstrip("/")
        if request.method == "GET" and path.endswith("/v1/models"):
            return JSONResponse({"object": "list", "data": [{"id": self.name, "object": "model", "created": 0,
                                                             "owned_by": "libtensr"}]})
        chat = path.endswith("/v1/chat/completions")
        if request.method != "POST" or not (chat or path.endswith("/v1/completions")):
            return error(404, f"{request.method} {path}: no such route")
        try:
            body = await request.json()
        except ValueError:
            return error(400, "the body is no JSON object")
        if not isinstance(body, dict):
            return error(400, "the body is no JSON object")
        if body.get("stream"):
            return error(400, "'stream' is not supported here (tensr-server streams)", "stream")
        if body.get("n", 1) != 1:
            return error(400, "'n' other than 1 is not supported", "n")
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
                return error(400, "'messages' must be a non-empty array", "messages")
            for i, m in enumerate(msgs):
                if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                    return error(400, f"messages[{i}] needs a string 'role' and a string 'content'", "messages")
            prompt = [{"role": m["role"], "content": m["content"]} for m in msgs]
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                return error(400, "'prompt' must be a string", "prompt")
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 128
        temperature = body.get("temperature", 1.0)
        try:
            text, n = await asyncio.get_running_loop().run_in_executor(
                None, self._generate, prompt, int(max_tokens), float(temperature), int(body.get("seed") or 0), chat)
        except (tsr.Error, TypeError, ValueError) as e:
            return error(400, str(e))
        finish = "length" if n >= int(max_tokens) else "stop"
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat else
                  {"index": 0, "text": text})
        choice.update({"logprobs": None, "finish_reason": finish})
        return JSONResponse({"id": f"{'chatcmpl' if chat else 'cmpl'}-{time.time_ns()}",
                             "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": self.name, "system_fingerprint": self.replica,
                             "choices": [choice],
                             "usage": {"completion_tokens": n}})


def app(path=DEFAULT_MODEL, replicas=2, n_threads=1):
    """The application: replicas copies of the model behind one route."""
    return TensrModel.options(num_replicas=replicas).bind(path, n_threads)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default=DEFAULT_MODEL)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    a = ap.parse_args()
    serve.start(http_options={"host": a.host, "port": a.port})
    serve.run(app(a.model, a.replicas, a.threads), route_prefix="/", blocking=True)


if __name__ == "__main__":
    main()
