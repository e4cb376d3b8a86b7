"""A proxy that breaks a server's seeds on purpose, in front of a real llama-server: a test fixture on a free
loopback port. Every route is passed through unchanged but the completion routes, whose ``seed`` it rewrites:

- ``shared``: every request gets the next value of one counter the proxy keeps, whatever seed it carried: the
  slots sharing one random generator (a bug llama.cpp once had), seen from outside.
- ``overlap``: the same, but only for a request that arrives while another is in flight: a generator shared only
  between concurrent requests (a request alone keeps its seed).
- ``swap``: requests that arrive together (a cohort: each waits until no other has arrived for QUIET_S) get each
  other's seeds, rotated; a request alone keeps its own.

Under sampling with a seed per session, ``shared`` must break run-to-run determinism, ``overlap`` and ``swap``
batch invariance and the needle, on a server that is itself invariant (one slot)."""

from __future__ import annotations

import http.client
import http.server
import json
import threading
import time
from contextlib import contextmanager
from urllib.parse import urlsplit

ROUTES = ("/completion", "/v1/completions", "/v1/chat/completions")
QUIET_S = 0.3  # a cohort: the requests that arrived until none has for this long
GATHER_S = 3.0  # (at most)


class _Proxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str, mode: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.mode = mode
        self.lock = threading.Lock()
        self.counter = 1000
        self.pending: dict[int, int] = {}  # request -> the seed it carried, until its cohort is released
        self.given: dict[int, int] = {}  # request -> the seed the proxy gives it
        self.next_id = 0
        self.last_arrival = 0.0
        self.changed = 0  # requests whose seed the proxy changed
        self.in_flight = 0


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server: _Proxy

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802
        self._forward(None)

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path not in ROUTES:
            return self._forward(body)
        request = json.loads(body)
        seed = request.get("seed")
        with self.server.lock:
            crowded = self.server.in_flight > 0
            self.server.in_flight += 1
        try:
            mode = self.server.mode
            shared = mode == "shared" or (mode == "overlap" and crowded)
            request["seed"] = self._shared() if shared else self._swapped(seed) if mode == "swap" else seed
            with self.server.lock:
                self.server.changed += request["seed"] != seed
            self._forward(json.dumps(request).encode())
        finally:
            with self.server.lock:
                self.server.in_flight -= 1

    def _shared(self) -> int:
        with self.server.lock:
            self.server.counter += 1
            return self.server.counter

    def _swapped(self, seed: int) -> int:
        s = self.server
        with s.lock:
            me, s.next_id = s.next_id, s.next_id + 1
            s.pending[me] = seed
            s.last_arrival = time.monotonic()
        start = time.monotonic()
        while time.monotonic() - start < GATHER_S and time.monotonic() - s.last_arrival < QUIET_S:
            time.sleep(0.02)
        with s.lock:
            if me not in s.given:  # (the first of its cohort to wake releases the whole cohort)
                cohort = sorted(s.pending)
                seeds = [s.pending[k] for k in cohort]
                for k, given in zip(cohort, seeds[1:] + seeds[:1]):
                    s.given[k] = given
                s.pending.clear()
            return s.given.pop(me)

    def _forward(self, body: bytes | None) -> None:
        host, port = self.server.upstream
        conn = http.client.HTTPConnection(host, port, timeout=120)
        try:
            conn.request(self.command, self.path, body, {"Content-Type": "application/json"} if body else {})
            resp = conn.getresponse()
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.getheader("Content-Type", "application/json"))
            self.end_headers()
            while line := resp.readline():
                self.wfile.write(line)
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the client left mid-stream
            pass
        finally:
            conn.close()


@contextmanager
def serving(upstream: str, mode: str):
    """The proxy in front of ``upstream`` for the ``with`` block: yields (its URL, the proxy); stopped after."""
    proxy = _Proxy(upstream, mode)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}", proxy
    finally:
        proxy.shutdown()
        proxy.server_close()
