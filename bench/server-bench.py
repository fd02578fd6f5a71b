#!/usr/bin/env python3
"""server-bench.py - tensr-server against llama-server over their OpenAI
API (streamed chat completions), Python's standard library only.

For each concurrency level (default 1, 2, 4, 8) it sends --requests
requests, --concurrency at a time, to each server in turn (the order
alternates from round to round, --rounds rounds, so that neither server
always runs on a warmer machine), and reports per server and level:
  TTFT  time to first token (the first content chunk)
  TPOT  time per output token after the first: (e2e - TTFT) / (tokens - 1)
  ITL   inter-token latency: the gaps between content chunks
  e2e   end-to-end latency of a request
as mean / p50 / p99 in milliseconds, and the aggregate output tokens/s
(all tokens of the level over its wall time), then the ratios
tensr / llama (tok/s: higher is better; latencies: lower is better).

Both servers get the same model, threads, slots and per-slot context
(-c is the total, split over -np slots, in both). Without --llama only
tensr-server is measured. make bench-server runs it on SmolLM2 with the
llama-server that bench/build-llama.sh builds.

  bench/server-bench.py --tensr examples/server/tensr-server \\
      --llama ~/.cache/libtensr/llama.cpp-0.3.36/build-native/bin/llama-server \\
      -m model.gguf -t 4 -np 8 -c 16384
"""
import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a refrigerator works.",
    "List ten uses for a paperclip.",
    "Describe the water cycle to a child.",
    "What makes a good cup of tea?",
    "Summarise the history of the bicycle.",
    "Give advice to a new gardener.",
    "Why is the sky blue?",
]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    def __init__(self, name, argv, port, env=None):
        self.name, self.port = name, port
        self.log = open(f"server-bench-{name}.log", "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, **(env or {})))
        for _ in range(1200):
            if self.proc.poll() is not None:
                sys.exit(f"{name} exited {self.proc.returncode} at start; see server-bench-{name}.log")
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        sys.exit(f"{name} did not become healthy in 120 s")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def one_request(port, prompt, max_tokens):
    """(ttft, [itl...], e2e, tokens) of one streamed chat completion."""
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    times, tokens = [], None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
        ch = ev.get("choices") or []
        if ch and (ch[0].get("delta") or {}).get("content"):
            times.append(time.perf_counter())
    e2e = time.perf_counter() - t0
    c.close()
    if not times:
        return None
    return times[0] - t0, [b - a for a, b in zip(times, times[1:])], e2e, tokens or len(times)


def run_level(port, conc, n_req, max_tokens):
    results, lock, next_i = [], threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= n_req:
                return
            r = one_request(port, PROMPTS[i % len(PROMPTS)], max_tokens)
            if r:
                with lock:
                    results.append(r)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(conc)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return results, time.perf_counter() - t0


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def summary(results, wall):
    ttft = [r[0] for r in results]
    itl = [x for r in results for x in r[1]]
    e2e = [r[2] for r in results]
    tpot = [(r[2] - r[0]) / (r[3] - 1) for r in results if r[3] > 1]
    toks = sum(r[3] for r in results)
    st = {}
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        st[name] = (statistics.fmean(xs) * 1e3 if xs else float("nan"), pct(xs, 50) * 1e3, pct(xs, 99) * 1e3)
    st["tok_s"] = toks / wall if wall > 0 else 0.0
    return st


def merge(a, b):
    """Results of two rounds of one level: lists joined, walls added."""
    return (a[0] + b[0], a[1] + b[1]) if a else b


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tensr", required=True, help="tensr-server binary")
    ap.add_argument("--llama", help="llama-server binary (optional)")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=4)
    ap.add_argument("-np", "--parallel", type=int, default=8)
    ap.add_argument("-c", "--ctx-size", type=int, default=8192, help="total cells, split over the slots")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=16, help="requests per level and round")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tensr-args", default="", help="more tensr-server flags (e.g. '--batch-invariant off')")
    a = ap.parse_args()
    levels = [int(x) for x in a.concurrency.split(",")]
    common = ["-m", a.model, "-t", str(a.threads), "-np", str(a.parallel), "-c", str(a.ctx_size), "--host",
              "127.0.0.1"]
    servers = []
    try:
        p = free_port()
        servers.append(Server("tensr", [a.tensr] + common + ["--port", str(p), "--max-queued", "1024"] +
                              a.tensr_args.split(), p))
        if a.llama:
            p = free_port()
            servers.append(Server("llama", [a.llama] + common + ["--port", str(p)], p))
        for s in servers:  # warm-up: pages in the weights, first-call costs
            run_level(s.port, 1, 1, 8)
        acc = {(s.name, c): None for s in servers for c in levels}
        for rnd in range(a.rounds):
            order = servers if rnd % 2 == 0 else servers[::-1]
            for c in levels:
                for s in order:
                    acc[(s.name, c)] = merge(acc[(s.name, c)], run_level(s.port, c, a.requests, a.max_tokens))
    finally:
        for s in servers:
            s.stop()
    print(f"model {os.path.basename(a.model)}, -t {a.threads} -np {a.parallel} -c {a.ctx_size}, "
          f"{a.requests} requests x {a.rounds} rounds per level, max_tokens {a.max_tokens}")
    print("ms: mean/p50/p99")
    head = f"{'server':6} {'conc':>4} {'tok/s':>8}  {'TTFT':>20}  {'TPOT':>20}  {'ITL':>20}  {'e2e':>22}"
    print(head)
    stats = {}
    for c in levels:
        for s in servers:
            st = stats[(s.name, c)] = summary(*acc[(s.name, c)])
            f = lambda k: "/".join(f"{v:.0f}" if v >= 10 else f"{v:.1f}" for v in st[k])  # noqa: E731
            print(f"{s.name:6} {c:>4} {st['tok_s']:8.1f}  {f('ttft'):>20}  {f('tpot'):>20}  {f('itl'):>20}  "
                  f"{f('e2e'):>22}")
    if len(servers) == 2:
        print("\nratios tensr / llama (tok/s: > 1 is better; latencies p50: < 1 is better)")
        print(f"{'conc':>4} {'tok/s':>7} {'TTFT':>7} {'TPOT':>7} {'ITL':>7} {'e2e':>7}")
        for c in levels:
            t, l = stats[("tensr", c)], stats[("llama", c)]
            r = lambda k: t[k][1] / l[k][1] if l[k][1] else float("nan")  # noqa: E731
            print(f"{c:>4} {t['tok_s'] / l['tok_s'] if l['tok_s'] else float('nan'):7.2f} {r('ttft'):7.2f} "
                  f"{r('tpot'):7.2f} {r('itl'):7.2f} {r('e2e'):7.2f}")


if __name__ == "__main__":
    main()
