#!/usr/bin/env python3
"""server-soak.py - tensr-server's resident memory over many requests.

Starts tensr-server as server-bench.py does (its log:
server-bench-tensr-soak.log), sends N requests from W threads (chat and
completions, streamed and not, some cancelled by closing the connection
mid-stream, some refused: too long, bad JSON), and prints the server's RSS (VmRSS) after a
warm-up and at the end, with its peak. Memory is decided at start (KV and
compute for every slot), so RSS should stay flat. Python's standard library
only. Not a test: it measures.

usage: bench/server-soak.py --tensr examples/server/tensr-server -m MODEL
       [-n 400] [-w 4] [server flags after --]
"""
import argparse
import http.client
import importlib.util
import json
import os
import random
import socket
import threading
import time

# the server start (health wait, log, SIGTERM) is server-bench.py's
_spec = importlib.util.spec_from_file_location("server_bench", os.path.join(os.path.dirname(__file__),
                                                                            "server-bench.py"))
server_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(server_bench)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def one(port, i, rnd):
    kind = rnd.randrange(6)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        if kind == 5:  # refused: malformed JSON or a prompt past the slot
            body = b"{" if rnd.random() < 0.5 else json.dumps({"prompt": "word " * 9000, "max_tokens": 4})
            c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            return c.getresponse().status
        stream = kind in (1, 3, 4)
        if kind in (0, 1):
            path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": f"Tell me about {i}."}]}
        else:
            path, body = "/v1/completions", {"prompt": f"Item {i}: the number {i * 7} is"}
        body.update(max_tokens=rnd.randrange(4, 48), temperature=rnd.choice([0, 0.8]), seed=i, stream=stream)
        if kind == 2:
            body["logprobs"] = 2
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if kind == 4:  # a client that leaves mid-stream
            r.read(200)
            c.sock.shutdown(socket.SHUT_RDWR)
            return r.status
        r.read()
        return r.status
    finally:
        c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensr", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-n", "--requests", type=int, default=400)
    ap.add_argument("-w", "--workers", type=int, default=4)
    ap.add_argument("server_args", nargs="*")
    a = ap.parse_args()
    port = server_bench.free_port()
    srv = server_bench.Server("tensr-soak", [a.tensr, "-m", a.model, "--port", str(port), "-np", "4", "-c", "4096",
                                             "-t", "2"] + a.server_args, port)
    pid = srv.proc.pid
    try:
        start_rss, peak, codes, lock = rss_kib(pid), 0, {}, threading.Lock()
        nxt = [0]
        warm = [None]

        def worker(w):
            nonlocal peak
            rnd = random.Random(w)
            while True:
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                if i >= a.requests:
                    return
                try:
                    st = one(port, i, rnd)
                except OSError as e:
                    st = type(e).__name__
                with lock:
                    codes[st] = codes.get(st, 0) + 1
                    r = rss_kib(pid)
                    peak = max(peak, r)
                    if i == a.workers * 5 and warm[0] is None:
                        warm[0] = r

        t0 = time.time()
        ts = [threading.Thread(target=worker, args=(w,)) for w in range(a.workers)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        time.sleep(1)
        end_rss = rss_kib(pid)
        print(f"{a.requests} requests in {time.time() - t0:.0f} s, answers {dict(sorted(codes.items(), key=str))}")
        print(f"RSS (MiB): ready {start_rss / 1024:.1f}, after warm-up {(warm[0] or 0) / 1024:.1f}, "
              f"end {end_rss / 1024:.1f}, peak {peak / 1024:.1f}")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
