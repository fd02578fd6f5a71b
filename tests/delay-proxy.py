#!/usr/bin/env python3
"""delay-proxy.py - an ssh ProxyCommand that adds a fixed one-way delay.

Used by tests/bench-load.sh where tc/netem is not available: ssh talks to
this process on stdin/stdout, and it forwards both directions to HOST:PORT,
each chunk released DELAY_MS after it arrived (order kept, bandwidth not
limited), so the round-trip time grows by 2 * DELAY_MS.

    ProxyCommand=python3 delay-proxy.py HOST PORT DELAY_MS
"""
import os
import queue
import socket
import sys
import threading
import time


def pump(read, write, delay):
    q = queue.Queue()

    def reader():
        while True:
            try:
                data = read()
            except OSError:
                data = b""
            q.put((time.monotonic() + delay, data))
            if not data:
                return

    threading.Thread(target=reader, daemon=True).start()
    while True:
        due, data = q.get()
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        if not data:
            return
        write(data)


def main():
    host, port, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) / 1000.0
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    fin, fout = sys.stdin.fileno(), sys.stdout.fileno()

    def write_out(data):
        view = memoryview(data)
        while view:
            view = view[os.write(fout, view):]

    def up():
        pump(lambda: os.read(fin, 1 << 18), sock.sendall, delay)
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    threading.Thread(target=up, daemon=True).start()
    pump(lambda: sock.recv(1 << 18), write_out, delay)


if __name__ == "__main__":
    main()
