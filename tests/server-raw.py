"""server-raw.py HOST PORT PID - tensr-server over raw sockets (Python's
standard library only): the exact SSE bytes of a stream, UTF-8 characters
never split between chunks, keep-alive comments while a request waits,
CORS, garbage / truncated / oversized / deeply nested requests and slow
clients (after each the server still answers), and last SIGTERM: running
streams finish, the port stops accepting, the process exits 0 (the shell
checks the status). Run by tests/test-server-raw.sh, which starts the
server with -np 2 --max-queued 2 --cors-origin http://ok.example
--sse-keepalive 1."""
import json
import os
import signal
import socket
import sys
import threading
import time

from server_helpers import check, done, wait_ok

host, port, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# under valgrind (TSR_VALGRIND, from make check VALGRIND=valgrind) every token
# costs ~50 times more, under ASan (TSR_SANITIZER, .ci/run's sanitizer job)
# a few times: fewer tokens, longer waits; the same checks
slow_run = bool(os.environ.get("TSR_VALGRIND") or os.environ.get("TSR_SANITIZER"))
# valgrind: only the checks of the server's own code paths (parsing, SSE,
# CORS, bad and slow clients, the drain) with a token or two each; the
# model-heavy ones (UTF-8 over many tokens, keep-alive behind two long
# requests) run in the plain and ASan builds
valgrind = bool(os.environ.get("TSR_VALGRIND"))
T = 20 if slow_run else 1  # time scale


def toks(n):
    return max(2, n // 8) if slow_run else n


def connect(timeout=60 * T):
    s = socket.create_connection((host, port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_response(s):
    """(status, headers dict (lower-case names), body bytes) of one HTTP/1.1
    response, de-chunked; the raw chunk payloads in order as a 4th item."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            raise ConnectionError(f"closed before the headers: {buf!r}")
        buf += d
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdr = {}
    for l in lines[1:]:
        k, v = l.split(":", 1)
        hdr[k.strip().lower()] = v.strip()

    def more():
        d = s.recv(65536)
        if not d:
            raise ConnectionError("closed mid-body")
        return d

    chunks = []
    if hdr.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            while b"\r\n" not in rest:
                rest += more()
            size_line, rest = rest.split(b"\r\n", 1)
            n = int(size_line.split(b";")[0], 16)
            while len(rest) < n + 2:
                rest += more()
            if n == 0:
                break
            chunks.append(rest[:n])
            body += rest[:n]
            rest = rest[n + 2:]
        return status, hdr, body, chunks
    n = int(hdr.get("content-length", "0"))
    while len(rest) < n:
        rest += more()
    return status, hdr, rest[:n], [rest[:n]]


def request(method, path, body=None, headers=None, timeout=60 * T):
    s = connect(timeout)
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body.encode() if isinstance(
        body, str) else (body or b"")
    h = {"Host": f"{host}:{port}", "Connection": "close", "Content-Type": "application/json"}
    h.update(headers or {})
    if method == "POST":
        h["Content-Length"] = str(len(data))
    raw = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    s.sendall(raw.encode() + data)
    try:
        return read_response(s)
    finally:
        s.close()


def sse_events(raw):
    """The data events of a stream (keep-alive comments left out)."""
    return [e for e in raw.split(b"\n\n")[:-2] if not e.startswith(b":")]


def alive(what):
    try:
        st, _, body, _ = request("GET", "/health", timeout=10 * T)
        check(st == 200, f"after {what}: /health {st} {body!r}")
    except OSError as e:
        check(False, f"after {what}: the server does not answer: {e}")


def metric(name):
    _, _, body, _ = request("GET", "/metrics")
    for l in body.decode().splitlines():
        if l.startswith(name + " "):
            return float(l.split()[1])
    return None


wait_ok(f"http://{host}:{port}/health", 30 * T)  # the model loads

# ---- the exact SSE bytes ------------------------------------------------------
body = {"prompt": "The capital of France is", "max_tokens": 2 if valgrind else 6, "temperature": 0, "stream": True}
st, hdr, raw, chunks = request("POST", "/v1/completions", body)
check(st == 200 and hdr.get("content-type") == "text/event-stream" and hdr.get("cache-control") == "no-cache",
      f"stream status/headers {st} {hdr}")
events = raw.split(b"\n\n")
check(events[-1] == b"" and events[-2] == b"data: [DONE]", f"the stream does not end in data: [DONE]: {raw[-80:]!r}")
rebuilt, texts, finishes = b"", [], []
for ev in events[:-2]:
    if ev == b": keep-alive":  # the prompt took a second (--sse-keepalive 1)
        rebuilt += ev + b"\n\n"
        continue
    check(ev.startswith(b"data: "), f"event without data: {ev!r}")
    obj = json.loads(ev[6:])
    # jansson's compact form, keys in the server's order: re-dumping gives the same bytes
    rebuilt += b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"
    check(obj["object"] == "text_completion" and obj["id"].startswith("cmpl-") and len(obj["choices"]) == 1,
          f"chunk {obj}")
    texts.append(obj["choices"][0]["text"])
    finishes.append(obj["choices"][0]["finish_reason"])
check(rebuilt + b"data: [DONE]\n\n" == raw, f"the SSE bytes are not compact JSON events: {raw!r}")
check(finishes[-1] == "length" and all(f is None for f in finishes[:-1]), f"finish reasons {finishes}")
st, _, whole, _ = request("POST", "/v1/completions", dict(body, stream=False))
check(st == 200 and "".join(texts) == json.loads(whole)["choices"][0]["text"], "streamed text != whole text")

# chat: role chunk first, then content, the finish chunk, usage only when asked
body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2 if valgrind else 4, "temperature": 0,
        "stream": True}
for usage in (False, True):
    b = dict(body, stream_options={"include_usage": True}) if usage else body
    st, _, raw, _ = request("POST", "/v1/chat/completions", b)
    objs = [json.loads(e[6:]) for e in sse_events(raw)]
    check(objs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}, f"role chunk {objs[0]}")
    tail = objs[-2] if usage else objs[-1]
    check(tail["choices"][0]["finish_reason"] == "length" and tail["choices"][0]["delta"] == {},
          f"finish chunk {tail}")
    check(("usage" in objs[-1] and objs[-1]["choices"] == [] and
           objs[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0) == usage,
          f"usage chunk (include_usage {usage}): {objs[-1]}")

long_body = {"prompt": "Count from one to one hundred:", "max_tokens": toks(120), "temperature": 0}
if not valgrind:
    # ---- UTF-8: characters of several tokens never split between chunks -------------
    cjk = "天地玄黄，宇宙洪荒。日月盈昃，辰宿列张。" * 3
    body = {"prompt": cjk, "max_tokens": 24 if not slow_run else 12, "temperature": 0, "stream": True, "logprobs": 0}
    st, _, raw, chunks = request("POST", "/v1/completions", body)
    pieces, split = [], False
    for ev in sse_events(raw):
        obj = json.loads(ev[6:])  # json.loads would reject a lone surrogate; jansson refuses bad UTF-8 itself
        pieces.append(obj["choices"][0]["text"])
        for tok in (obj["choices"][0]["logprobs"] or {}).get("tokens", []):
            split |= "\\x" in tok  # a token that holds part of a character
    st2, _, whole, _ = request("POST", "/v1/completions", dict(body, stream=False))
    want = json.loads(whole)["choices"][0]["text"]
    check(split, "the test prompt gave no token that holds part of a character (it proves nothing)")
    check("".join(pieces) == want and any(ord(ch) > 0x2000 for ch in want),
          f"streamed UTF-8 text {''.join(pieces)!r} != {want!r}")
    check(all(p.encode("utf-8").decode("utf-8") == p for p in pieces), "a chunk with a broken character")

    # ---- keep-alive comments while a request waits (-np 2: two busy slots) --------------
    blockers = [threading.Thread(target=request, args=("POST", "/v1/completions", long_body)) for _ in range(2)]
    for t in blockers:
        t.start()
    time.sleep(0.3 * T)
    st, _, raw, _ = request("POST", "/v1/completions",
                            {"prompt": "Hello", "max_tokens": 2, "temperature": 0, "stream": True})
    check(raw.startswith(b": keep-alive\n\n") and raw.endswith(b"data: [DONE]\n\n"),
          f"no keep-alive comment while queued: {raw[:60]!r}")
    for t in blockers:
        t.join()


# ---- CORS -------------------------------------------------------------------------
st, hdr, _, _ = request("OPTIONS", "/v1/chat/completions", headers={
    "Origin": "http://ok.example", "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type"})
check(st == 204 and hdr.get("access-control-allow-origin") == "http://ok.example" and
      "POST" in hdr.get("access-control-allow-methods", "") and
      "authorization" in hdr.get("access-control-allow-headers", "").lower(), f"preflight {st} {hdr}")
st, hdr, _, _ = request("OPTIONS", "/v1/chat/completions", headers={"Origin": "http://evil.example"})
check(st == 403 and "access-control-allow-origin" not in hdr, f"preflight of another origin {st} {hdr}")
st, hdr, _, _ = request("GET", "/v1/models", headers={"Origin": "http://ok.example"})
check(hdr.get("access-control-allow-origin") == "http://ok.example", f"no CORS header on GET {hdr}")
st, hdr, _, _ = request("GET", "/v1/models", headers={"Origin": "http://evil.example"})
check("access-control-allow-origin" not in hdr, f"CORS header for another origin {hdr}")

# ---- garbage, truncated, oversized, deep: each answered or dropped, the server stays up
def raw_send(data, read=True, timeout=10 * T):
    s = connect(timeout)
    try:
        s.sendall(data)
        if not read:
            return b""
        s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            d = s.recv(65536)
            if not d:
                return out
            out += d
    except OSError:
        return b""
    finally:
        s.close()


out = raw_send(os.urandom(4096))
check(not out or out.startswith(b"HTTP/1.1 400"), f"garbage answered {out[:40]!r}")
alive("random bytes")
raw_send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\": \"Hi", read=False)
alive("a truncated body")
raw_send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Len", read=False)
alive("truncated headers")
out = raw_send(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200000 + b"\r\n\r\n")
check(not out or out.split(b" ")[1] in (b"400", b"413", b"431"), f"a huge header answered {out[:40]!r}")
alive("a huge header")
st, _, body, _ = request("POST", "/v1/completions", b"{" * 100000)
check(st == 400 and "deeper" in json.loads(body)["error"]["message"], f"deep JSON {st} {body[:100]!r}")
st, _, body, _ = request("POST", "/v1/chat/completions", "[" * 65 + "]" * 65)
check(st == 400, f"JSON 65 deep {st}")
st, _, body, _ = request("POST", "/v1/completions", b'{"prompt": "Hi", "max_tokens": 1, "x": ' +
                         b"[" * 60 + b"]" * 60 + b"}")
check(st == 200, f"JSON 61 deep refused {st} {body[:100]!r}")
st, _, body, _ = request("POST", "/v1/completions", b"x" * (9 << 20))
check(st == 413 and json.loads(body)["error"]["message"], f"9 MiB body {st}")
st, _, body, _ = request("POST", "/v1/completions", b'{"prompt": "\xff\xfe", "max_tokens": 1}')
check(st == 400, f"invalid UTF-8 in the JSON {st}")
st, _, body, _ = request("POST", "/v1/completions", b'[1, 2]')
check(st == 400 and json.loads(body)["error"]["type"] == "invalid_request_error", f"a JSON array {st}")
st, _, body, _ = request("POST", "/v1/completions", {"prompt": "Hi " * 5000, "max_tokens": 1})
err = json.loads(body)["error"] if st == 400 else {}
check(err.get("type") == "exceed_context_size_error" and err.get("param") == "prompt", f"too long {st} {err}")
alive("bad bodies")

# slow clients: a request sent a few bytes at a time still gets its answer, and a
# client that stalls mid-headers holds nobody else up
stall = connect()
stall.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
slow = connect()
req = json.dumps({"prompt": "Hi", "max_tokens": 2, "temperature": 0}).encode()
data = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(req)).encode() + b"\r\n\r\n" + req)
for i in range(0, len(data), 7):
    slow.sendall(data[i:i + 7])
    time.sleep(0.01)
    if i == 70:
        alive("a stalled client")
st, _, body, _ = read_response(slow)
slow.close()
check(st == 200 and json.loads(body)["choices"][0]["finish_reason"] == "length", f"slow client {st} {body!r}")
# a client that reads nothing of a long stream: the others are served
lazy = connect()
lazy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
lazy.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
             + str(len(json.dumps(dict(long_body, stream=True)))).encode() + b"\r\n\r\n"
             + json.dumps(dict(long_body, stream=True)).encode())
alive("a client that reads nothing")
lazy.close()
stall.close()
def idle():
    return metric("tensr_requests_running") == 0 and metric("tensr_requests_waiting") == 0


for _ in range(300 * T):  # a client's close shows at the server's next write or poll
    if idle():
        break
    time.sleep(0.1)
check(idle(), "requests still running or queued after their clients left: "
      f"{metric('tensr_requests_running')} running, {metric('tensr_requests_waiting')} waiting")

# ---- SIGTERM: running streams finish, the port closes, exit 0 (the shell checks) ----
results = {}


def stream(i):
    try:
        results[i] = request("POST", "/v1/completions",
                             {"prompt": f"List {i + 3} fruits:", "max_tokens": toks(40), "temperature": 0, "stream": True})
    except OSError as e:
        results[i] = e


ts = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
for t in ts:
    t.start()
for _ in range(100 * T):
    if metric("tensr_requests_running") == 2:
        break
    time.sleep(0.05)
os.kill(pid, signal.SIGTERM)
# the listening socket closes once the server's main thread takes the signal:
# at once, but under valgrind or a loaded machine that may take seconds
t_term, refused = time.monotonic(), False
while not refused and time.monotonic() - t_term < 30 * T:
    try:
        socket.create_connection((host, port), timeout=2).close()
        time.sleep(0.05)
    except OSError:
        refused, running = True, 2 - len(results)
print(f"SIGTERM: port {'closed' if refused else 'open'} after {time.monotonic() - t_term:.2f} s")
check(refused, f"the port still accepts {time.monotonic() - t_term:.1f} s after SIGTERM")
# and it closed while the streams drained, not at the exit after them (slow
# runs: the signal may come late, the few tokens of those runs early)
check(slow_run or (refused and running > 0), "the port closed only after the streams finished")
for t in ts:
    t.join()
for i in range(2):
    r = results.get(i)
    ok = isinstance(r, tuple) and r[0] == 200 and r[2].endswith(b"data: [DONE]\n\n")
    fin = [json.loads(e[6:])["choices"][0]["finish_reason"] for e in sse_events(r[2])] if ok else []
    check(ok and fin[-1] == "length", f"stream {i} cut by SIGTERM: {r if not ok else fin}")

done("server-raw.py")
