"""serve-ray-client.py - examples/python/serve_ray.py: two Ray Serve replicas of
the binding's Model on this machine, concurrent requests over its
OpenAI-style route, answered by both replicas, equal at temperature 0 to
one answer alone. Skips (77) without ray (pip install "ray[serve]") or the
model; with CI=true those fail. Run by tests/test-serve-ray.sh."""
import concurrent.futures
import json
import os
import sys
import urllib.request

from server_helpers import check, done, free_port, skip

here = os.path.dirname(os.path.abspath(__file__))
pydir = os.path.join(os.environ.get("top_srcdir", os.path.join(here, "..")), "examples", "python")
model = os.environ.get("TSR_TEST_MODEL") or os.path.expanduser("~/.cache/libtensr/SmolLM2-135M-Instruct.Q4_1.gguf")

try:
    import ray
    from ray import serve
except ImportError:
    skip('ray is not installed (pip install "ray[serve]")')
if not os.path.exists(model):
    skip(f"model {model} is absent (make run fetches it)")
sys.path.insert(0, pydir)
import serve_ray  # noqa: E402

port = free_port()
env = {k: os.environ[k] for k in ("LIBTENSR_PATH",) if k in os.environ}
env["PYTHONPATH"] = pydir
ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env}, log_to_driver=False)


def post(body, path="/v1/chat/completions"):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


try:
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(serve_ray.app(model, 2, 1), route_prefix="/")
    msg = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8, "temperature": 0}
    alone = post(msg)
    want = alone["choices"][0]["message"]["content"]
    check(want and alone["object"] == "chat.completion", f"one answer {alone}")
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        rs = list(ex.map(lambda i: post(msg), range(8)))
    check(all(r["choices"][0]["message"]["content"] == want for r in rs),
          f"concurrent answers differ: {[r['choices'][0]['message']['content'] for r in rs]}")
    replicas = {r["system_fingerprint"] for r in rs}
    check(len(replicas) == 2, f"answered by {replicas}, not by two replicas")
    c = post({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}, "/v1/completions")
    check(c["choices"][0]["text"], f"completion {c}")
    print(f"8 concurrent requests answered by {sorted(replicas)}: {want!r}")
finally:
    serve.shutdown()
    ray.shutdown()
done("serve-ray-client.py")
