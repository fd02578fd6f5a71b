"""server-page.py CHROMIUM BASE_URL SCREENSHOT - the chat page (GET /) in
headless Chromium, driven over the DevTools protocol with Python's
standard library only (a minimal WebSocket client below): load the page,
type a message, press Send, see a streamed reply grow (more than one
state of the text, the Stop button enabled meanwhile), press Stop, see the
reply marked stopped with its speed, write a screenshot. Run by
tests/test-server-page.sh, which starts the server."""
import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

from server_helpers import check, done, wait_ok

chromium, base, shot = sys.argv[1], sys.argv[2], sys.argv[3]
wait_ok(base + "/health")  # the model loads


class WebSocket:
    """Just enough of RFC 6455 for the DevTools protocol: text frames."""

    def __init__(self, url):
        hostport, path = url[len("ws://"):].split("/", 1)
        host, port = hostport.split(":")
        self.s = socket.create_connection((host, int(port)), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.s.sendall((f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += self.s.recv(4096)
        if b" 101 " not in buf.split(b"\r\n")[0]:
            raise ConnectionError(buf)
        self.buf = buf.split(b"\r\n\r\n", 1)[1]

    def send(self, text):
        data = text.encode()
        n = len(data)
        head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else
                                bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536 else
                                bytes([0x80 | 127]) + struct.pack(">Q", n))
        mask = os.urandom(4)
        self.s.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _read(self, n):
        while len(self.buf) < n:
            d = self.s.recv(1 << 20)
            if not d:
                raise ConnectionError("the browser closed the socket")
            self.buf += d
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self):
        msg = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7f
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            msg += self._read(n)
            if b0 & 0x80:
                return msg.decode()


profile = tempfile.mkdtemp(prefix="tsr-chromium-")
browser = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                            "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1000,800",
                            "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    port_file = os.path.join(profile, "DevToolsActivePort")
    for _ in range(300):
        if os.path.exists(port_file) and open(port_file).read().count("\n") >= 1:
            break
        time.sleep(0.1)
    dport = open(port_file).read().split("\n")[0]
    targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{dport}/json/list"))
    page = [t for t in targets if t["type"] == "page"][0]
    ws = WebSocket(page["webSocketDebuggerUrl"])
    next_id = [0]

    def call(method, **params):
        next_id[0] += 1
        ws.send(json.dumps({"id": next_id[0], "method": method, "params": params}))
        while True:
            m = json.loads(ws.recv())
            if m.get("id") == next_id[0]:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m["result"]

    def js(expr):
        r = call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        return r["result"].get("value")

    def wait(expr, secs, what):
        t = time.time()
        while time.time() - t < secs:
            if js(expr):
                return True
            time.sleep(0.05)
        check(False, f"timed out waiting for {what}")
        return False

    call("Page.enable")
    call("Page.navigate", url=base + "/")
    wait("document.readyState === 'complete' && !!document.getElementById('send')", 30, "the page to load")
    check(js("document.title") == "tensr-server", "page title")
    wait("document.getElementById('model').textContent.endsWith('.gguf')", 10, "the model's name from /v1/models")
    js("document.getElementById('input').value = 'Write a long story about a dragon.'")
    js("document.getElementById('send').click()")
    check(wait("document.querySelector('.msg.user') !== null", 5, "the user's message"), "no user message")
    states = set()
    t = time.time()
    while time.time() - t < 60 and len(states) < 4:
        txt = js("(document.querySelector('.msg.assistant .text') || {}).textContent || ''")
        if txt:
            states.add(txt)
        time.sleep(0.02)
    check(len(states) >= 3, f"the reply did not stream (states seen: {len(states)})")
    check(js("document.getElementById('stop').disabled === false && document.getElementById('send').disabled"),
          "Stop not enabled (or Send not disabled) while the reply streams")
    js("document.getElementById('stop').click()")
    wait("document.querySelector('.msg.assistant.done') !== null", 10, "the reply to stop")
    meta = js("document.querySelector('.msg.assistant .meta').textContent")
    check(meta and meta.startswith("stopped") and "tokens/s" in meta, f"the reply's line after Stop: {meta!r}")
    check(js("document.getElementById('send').disabled === false"), "Send not enabled again after Stop")
    png = base64.b64decode(call("Page.captureScreenshot", format="png")["data"])
    with open(shot, "wb") as f:
        f.write(png)
    check(png.startswith(b"\x89PNG") and len(png) > 1000, "screenshot")
    print(f"screenshot: {shot} ({len(png)} bytes); the reply's line: {meta!r}")
finally:
    browser.terminate()
    try:
        browser.wait(10)
    except subprocess.TimeoutExpired:
        browser.kill()
    shutil.rmtree(profile, ignore_errors=True)

done("server-page.py")
