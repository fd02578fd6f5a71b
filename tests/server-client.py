"""server-client.py BASE_URL API_KEY - tensr-server through the real `openai`
client (and httpx for the routes outside OpenAI's API): completions and chat,
streamed and not, equal at temperature 0; concurrent streams on the slots
each equal to its sequential answer; usage with cached tokens; the errors
in OpenAI's shape (401, 400 naming the field, 404, 413, malformed JSON, a
prompt that does not fit its slot); tokenize/detokenize; /health without a
key. Run by tests/test-server.sh, which starts the server."""
import concurrent.futures
import sys
import time

import httpx
import openai
from server_helpers import check, done, wait_ok

base, key = sys.argv[1], sys.argv[2]
wait_ok(base + "/health")  # the model loads

client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
models = client.models.list()
model = models.data[0].id
check(model.endswith(".gguf"), f"model id {model}")

# completions: streamed == not streamed at temperature 0
prompt = "The capital of France is"
c = client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0)
text = c.choices[0].text
check(len(text) > 0 and c.choices[0].finish_reason in ("stop", "length"), f"completion {c}")
check(c.usage.prompt_tokens > 0 and c.usage.completion_tokens > 0, f"usage {c.usage}")
parts, finish = [], None
for ch in client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0, stream=True):
    parts.append(ch.choices[0].text)
    finish = ch.choices[0].finish_reason or finish
check("".join(parts) == text, f"streamed completion {''.join(parts)!r} != {text!r}")
check(finish == c.choices[0].finish_reason, f"finish {finish}")

# chat: streamed == not streamed; usage chunk only with include_usage; cached tokens on a repeat
msgs = [{"role": "user", "content": "Name three colours."}]
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=24, temperature=0)
answer = r.choices[0].message.content
check(r.choices[0].message.role == "assistant" and answer, f"chat {r}")
deltas, usage, roles = [], None, 0
stream = client.chat.completions.create(model=model, messages=msgs, max_tokens=24, temperature=0, stream=True,
                                        stream_options={"include_usage": True})
for ch in stream:
    if ch.usage:
        usage = ch.usage
    for choice in ch.choices:
        roles += choice.delta.role == "assistant"
        deltas.append(choice.delta.content or "")
check("".join(deltas) == answer, f"streamed chat {''.join(deltas)!r} != {answer!r}")
check(roles == 1, f"{roles} role chunks")
check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, f"usage chunk {usage}")
check(usage is not None and usage.prompt_tokens_details.cached_tokens > 0,
      f"the repeated prompt was not reused: {usage}")
no_usage = [ch for ch in client.chat.completions.create(model=model, messages=msgs, max_tokens=4, temperature=0,
                                                        stream=True) if ch.usage]
check(not no_usage, "a usage chunk without include_usage")

# 8 concurrent streams on 4 slots, each equal to its sequential answer
questions = [f"Write one sentence about the number {i}." for i in range(8)]  # 8 streams, 4 slots


def ask(q):
    out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": q}], max_tokens=12,
                                         temperature=0, stream=True)
    return "".join((ch.choices[0].delta.content or "") for ch in out if ch.choices)


sequential = [ask(q) for q in questions]
with concurrent.futures.ThreadPoolExecutor(8) as ex:
    concurrent_ = list(ex.map(ask, questions))
for i, (a, b) in enumerate(zip(sequential, concurrent_)):
    check(a == b, f"question {i}: concurrent {b!r} != sequential {a!r}")

# stop strings
full = client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0).choices[0].text
if len(full) > 6:
    stop = full[3:6]
    cut = client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0, stop=[stop])
    check(cut.choices[0].text == full[:full.index(stop)] and cut.choices[0].finish_reason == "stop",
          f"stop {stop!r}: {cut.choices[0].text!r} of {full!r}")

# errors
bad = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
try:
    bad.models.list()
    check(False, "a wrong key was accepted")
except openai.AuthenticationError as e:
    check(e.status_code == 401 and e.body["message"], f"401 body {e.body}")
try:
    client.chat.completions.create(model=model, messages=msgs, n=2)
    check(False, "n=2 was accepted")
except openai.BadRequestError as e:
    check(e.status_code == 400 and e.body.get("param") == "n", f"n=2: {e.body}")
try:
    client.chat.completions.create(model="no-such-model", messages=msgs)
    check(False, "an unknown model was accepted")
except openai.NotFoundError as e:
    check(e.status_code == 404, f"unknown model: {e.status_code}")
try:
    client.completions.create(model=model, prompt="word " * 400, max_tokens=4)
    check(False, "a prompt longer than a slot was accepted")
except openai.BadRequestError as e:
    check(e.body.get("type") == "exceed_context_size_error", f"long prompt: {e.body}")
try:
    client.chat.completions.create(model=model, messages=msgs, temperature=5)
    check(False, "temperature 5 was accepted")
except openai.BadRequestError as e:
    check(e.body.get("param") == "temperature", f"temperature: {e.body}")

h = {"Authorization": "Bearer " + key}
r = httpx.post(base + "/v1/chat/completions", content=b"{not json", headers=h)
check(r.status_code == 400 and "error" in r.json(), f"malformed JSON: {r.status_code} {r.text}")
r = httpx.post(base + "/v1/completions", content=b" " * (9 << 20), headers=h, timeout=30)
check(r.status_code == 413, f"9 MiB body: {r.status_code}")
r = httpx.get(base + "/v1/nothing", headers=h)
check(r.status_code == 404 and r.json()["error"]["message"], f"unknown route: {r.status_code}")
r = httpx.get(base + "/health")
check(r.status_code == 200, f"health without a key: {r.status_code}")
r = httpx.post(base + "/tokenize", json={"content": "Hello world"})
check(r.status_code == 401, f"tokenize without a key: {r.status_code}")
toks = httpx.post(base + "/tokenize", json={"content": "Hello world"}, headers=h).json()["tokens"]
check(len(toks) >= 2, f"tokens {toks}")
back = httpx.post(base + "/detokenize", json={"tokens": toks}, headers=h).json()["content"]
check(back == "Hello world", f"detokenize {back!r}")


# logprobs in OpenAI's shapes, read through the client's own types: chat
# (content entries with bytes and top_logprobs), streamed equal to not
# streamed, and the completions' legacy lists
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0, logprobs=True,
                                   top_logprobs=3)
content = r.choices[0].logprobs.content if r.choices[0].logprobs else None
check(content and len(content) == r.usage.completion_tokens, f"chat logprobs {r.choices[0].logprobs}")
if content:
    check(b"".join(bytes(e.bytes) for e in content).decode() == r.choices[0].message.content,
          "the logprobs' bytes are not the answer")
    check(all(len(e.top_logprobs) == 3 and e.top_logprobs[0].logprob >= e.top_logprobs[2].logprob and
              e.logprob <= 0 and e.token == e.top_logprobs[0].token for e in content),
          f"top_logprobs at temperature 0 {content[0]}")
    streamed = []
    for ch in client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0, logprobs=True,
                                             top_logprobs=3, stream=True):
        if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content:
            streamed += ch.choices[0].logprobs.content
    check([(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in content],
          "streamed logprobs differ from the whole answer's")
c = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0, logprobs=2)
lp = c.choices[0].logprobs
check(lp and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4 and
      "".join(lp.tokens) == c.choices[0].text and all(len(t) == 2 for t in lp.top_logprobs), f"completion logprobs {lp}")
for bad in ({"logprobs": True, "top_logprobs": 21}, {"top_logprobs": 2}, {"n": 2}, {"tools": []},
            {"response_format": {"type": "json_object"}}):
    e = httpx.post(base + "/v1/chat/completions", headers=h, json={"messages": msgs, **bad})
    param = e.json()["error"]["param"] if e.status_code == 400 else None
    check(param in bad, f"{bad}: {e.status_code} {e.text}")


def gauge(name):
    for line in httpx.get(base + "/metrics", headers=h).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def wait_idle():
    for _ in range(100):
        if gauge("tensr_requests_running") == 0 and gauge("tensr_requests_waiting") == 0:
            return True
        time.sleep(0.1)
    return False


check(wait_idle(), "requests still running before the disconnect tests")


def counter(name):
    return gauge(name) or 0


# a client that disconnects mid-stream, or while it waits for a whole answer,
# cancels its request. The end-of-generation tokens are banned, so only a
# cancel ends these requests before their 500 tokens: a request that ran on to
# its natural end cannot pass for a cancelled one
eog = httpx.post(base + "/tokenize", headers=h,
                 json={"content": "<|endoftext|><|im_end|>", "parse_special": True}).json()["tokens"]
no_end = {str(t): -100 for t in eog}
gen0 = counter("tensr_generation_tokens_total")
with httpx.stream("POST", base + "/v1/chat/completions", headers=h, timeout=30,
                  json={"messages": msgs, "max_tokens": 500, "temperature": 0, "stream": True,
                        "logit_bias": no_end}) as s:
    lines = s.iter_lines()
    next(lines)
    next(lines)
    check(gauge("tensr_requests_running") == 1, "the stream is not running")
check(wait_idle(), "a stream closed mid-way was not cancelled")
gen1 = counter("tensr_generation_tokens_total")
check(gen1 - gen0 < 500, f"a stream closed mid-way ran on to its {gen1 - gen0} tokens")
try:
    httpx.post(base + "/v1/completions", headers=h, timeout=0.5,
               json={"prompt": prompt, "max_tokens": 500, "temperature": 0, "logit_bias": no_end})
except httpx.TimeoutException:
    pass
check(wait_idle(), "a non-streamed request whose client left was not cancelled")
gen2 = counter("tensr_generation_tokens_total")
check(gen2 - gen1 < 500, f"a non-streamed request whose client left ran on to its {gen2 - gen1} tokens")

# overload: 4 slots and at most 8 waiting; the rest get 503 with Retry-After, the admitted finish
def post(i):
    return httpx.post(base + "/v1/completions", headers=h, timeout=120,
                      json={"prompt": f"Count to {i}:", "max_tokens": 8, "temperature": 0})


with concurrent.futures.ThreadPoolExecutor(20) as ex:
    rs = list(ex.map(post, range(20)))
codes = [r.status_code for r in rs]
busy = [r for r in rs if r.status_code == 503]
check(all(c in (200, 503) for c in codes) and busy and codes.count(200) >= 8, f"overload: {codes}")
check(all(r.headers.get("Retry-After") and r.json()["error"]["message"] for r in busy), "503 without Retry-After")

# /metrics: Prometheus text with the counters and histograms tensr-server(1) names
text = httpx.get(base + "/metrics", headers=h).text
for name in ("tensr_requests_running", "tensr_requests_waiting", "tensr_kv_cache_usage_ratio",
             'tensr_requests_total{code="200"}', 'tensr_requests_total{code="503"}',
             "tensr_time_to_first_token_seconds_count", "tensr_inter_token_latency_seconds_count",
             "tensr_request_queue_time_seconds_count", "tensr_e2e_request_latency_seconds_count",
             'tensr_e2e_request_latency_seconds_bucket{le="+Inf"}', "tensr_generation_tokens_total"):
    v = [float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + " ")]
    check(v and (v[0] > 0 or "running" in name or "waiting" in name or "ratio" in name), f"/metrics {name}: {v}")
check(0 < gauge("tensr_request_queue_time_seconds_count") <= gauge("tensr_e2e_request_latency_seconds_count"),
      "more queue times than finished requests")

done("server-client.py")
