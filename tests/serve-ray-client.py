"""serve-ray-client.py - examples/python/serve_ray.py: two Ray Serve replicas of
the binding's Model on this machine, concurrent requests over its
OpenAI-style route, answered by both replicas, equal at temperature 0 to
one answer alone; a two-turn conversation (system, user, assistant, user)
goes through the model's chat template whole, as tensr-server renders it:
the replicas' answers equal the binding's own generate() of the same
messages in this process; a message without a string role or content is a
400. Skips (77) without ray (pip install "ray[serve]") or the model;
with CI=true those fail. Run by tests/test-serve-ray.sh."""
import concurrent.futures
import json
import os
import sys
import urllib.error
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
import libtensr as tsr  # noqa: E402
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


def status(body):
    """The HTTP status of a chat request that may be refused."""
    try:
        post(body)
        return 200
    except urllib.error.HTTPError as e:
        return e.code


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
    # two turns: the whole conversation through the chat template, the
    # first answer as the assistant's turn; the same text as the binding's
    # generate() of those messages, and the two replicas agree
    turns = [{"role": "system", "content": "You are a helpful assistant."},
             {"role": "user", "content": "My name is Ada. Say hello to me."},
             {"role": "assistant", "content": "Hello Ada! How can I help you today?"},
             {"role": "user", "content": "What is my name?"}]
    body = {"messages": turns, "max_tokens": 12, "temperature": 0}
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        rs = list(ex.map(lambda i: post(body), range(8)))
    second = rs[0]["choices"][0]["message"]["content"]
    local = "".join(tsr.Model(model, n_threads=1).generate(turns, 12, temperature=0, chat=True))
    check(second and all(r["choices"][0]["message"]["content"] == second for r in rs),
          f"two-turn answers differ: {[r['choices'][0]['message']['content'] for r in rs]}")
    check(second == local, f"two-turn answer {second!r}, the binding's generate() of the same messages {local!r}")
    print(f"two turns, by {sorted({r['system_fingerprint'] for r in rs})}: {second!r}")
    # roles and contents are strings, as tensr-server asks
    check(status({"messages": [{"role": "user", "content": 3}]}) == 400, "a non-string content is accepted")
    check(status({"messages": [{"content": "Hi"}]}) == 400, "a message without a role is accepted")
finally:
    serve.shutdown()
    ray.shutdown()
done("serve-ray-client.py")
