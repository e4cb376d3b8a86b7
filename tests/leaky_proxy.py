"""A proxy that leaks on purpose, in front of a real llama-server: a test fixture on a free loopback port.

Every route is passed through unchanged, but ``/completion`` requests that arrive together, four or more: each of
those has the end of its prompt overwritten by the end of another prompt of its cohort (the longest one other than
its own; up to FRAGMENT ids, never its BOS; the same length is sent, so the server's counts stay right and only the
content leaks). A cohort is the requests that arrived since the last one was released, each waiting until no other
has arrived for QUIET_S (BURST_QUIET_S once two or more wait): which donor each gets depends neither on how late a
loaded machine runs a thread nor on a request of an earlier cohort whose handler has not yet noted that it is done
(its client already has its answer, and sent the next run; counting it as in flight let an earlier run's prompt be
the donor). CI saw null runs differ from their repeats at C=8 (p 0.5, then 0.09 with a shorter quiet spell on a
loaded core). A model continues what its prompt ends with, so the leaked ids reach the answer: the
content-dependence test and the canaries must catch it and name the sessions.

With ``on_cancel`` it leaks only on the cancel-and-retry path instead (the bug class of SGLang#23392): a request
whose prompt is still in flight (its client left the first one mid-stream and sent it again) gets the end of the
longest other prompt in flight, by the same splice. The cancel-and-retry run must find the retried answer
changed.
"""

from __future__ import annotations

import http.client
import http.server
import json
import threading
import time
from contextlib import contextmanager
from urllib.parse import urlsplit

LEAK_AT = 4  # requests in a cohort (arrived together) from which the proxy leaks
QUIET_S = 0.5  # a request waits until no other has arrived for this long (at most GATHER_S), so the requests
BURST_QUIET_S = 1.5  # submitted with it are in flight too, however late a slow machine starts their threads; once
GATHER_S = 5.0  # two or more wait, a burst is forming, and a straggler is given longer (CI split a burst of 8)
FRAGMENT = 16  # ids spliced in, at most (two repeats of a canary code)


class _Proxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str, on_cancel: bool = False) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.lock = threading.Lock()
        self.in_flight: dict[int, list[int]] = {}
        self.next_id = 0
        self.leaked = 0
        self.last_arrival = 0.0
        self.on_cancel = on_cancel
        self.pending: dict[int, list[int]] = {}  # the prompts arrived since the last cohort was released
        self.cohort_of: dict[int, dict[int, list[int]]] = {}  # a released request's cohort, until it reads it


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server: _Proxy

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._forward(None)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/completion":
            self._forward(body)
            return
        request = json.loads(body)
        prompt = list(request.get("prompt", []))
        if self.server.on_cancel:
            self._on_retry(request, prompt)
            return
        with self.server.lock:
            me = self.server.next_id
            self.server.next_id += 1
            self.server.pending[me] = prompt
            self.server.last_arrival = time.monotonic()
        start = time.monotonic()
        while time.monotonic() - start < GATHER_S and time.monotonic() - self.server.last_arrival < self._quiet():
            time.sleep(0.02)
        with self.server.lock:
            if me in self.server.pending:  # the first of its cohort to wake releases the whole cohort
                cohort = dict(self.server.pending)
                self.server.pending.clear()
                self.server.cohort_of.update({k: cohort for k in cohort})
            others = [p for k, p in self.server.cohort_of.pop(me).items() if k != me]
            if len(others) + 1 >= LEAK_AT:
                donor = max(others, key=lambda p: (len(p), p))
                if _spliced(prompt, donor) != prompt:
                    request["prompt"] = _spliced(prompt, donor)
                    self.server.leaked += 1
        self._forward(json.dumps(request).encode())

    def _quiet(self) -> float:
        """How long no arrival must come before a cohort is released: longer once a burst is forming."""
        return BURST_QUIET_S if len(self.server.pending) >= 2 else QUIET_S

    def _on_retry(self, request: dict, prompt: list[int]) -> None:
        """(on_cancel) A retry (its prompt still in flight) gets the end of the longest other prompt in flight."""
        with self.server.lock:
            me = self.server.next_id
            self.server.next_id += 1
            retry = prompt in self.server.in_flight.values()
            self.server.in_flight[me] = prompt
            others = [p for p in self.server.in_flight.values() if p != prompt]
            if retry and others:
                request["prompt"] = _spliced(prompt, max(others, key=lambda p: (len(p), p)))
                self.server.leaked += 1
        try:
            self._forward(json.dumps(request).encode())
        finally:
            with self.server.lock:
                del self.server.in_flight[me]

    def _forward(self, body: bytes | None) -> None:
        host, port = self.server.upstream
        conn = http.client.HTTPConnection(host, port, timeout=120)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(self.command, self.path, body, headers)
            resp = conn.getresponse()
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.getheader("Content-Type", "application/json"))
            self.end_headers()
            while True:
                line = resp.readline()
                if not line:
                    break
                self.wfile.write(line)
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the client left mid-stream
            pass
        finally:
            conn.close()


def _spliced(prompt: list[int], donor: list[int]) -> list[int]:
    """``prompt`` with its end (up to FRAGMENT ids, never its first) overwritten by the end of ``donor``."""
    n = min(FRAGMENT, len(prompt) - 1, len(donor) - 1)
    return prompt[: len(prompt) - n] + donor[len(donor) - n :] if n > 0 else prompt


@contextmanager
def serving(upstream: str, on_cancel: bool = False):
    """The leaking proxy in front of ``upstream`` for the ``with`` block: yields (its URL, the proxy, whose
    ``leaked`` counts the requests it changed); stopped after."""
    proxy = _Proxy(upstream, on_cancel)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}", proxy
    finally:
        proxy.shutdown()
        proxy.server_close()
