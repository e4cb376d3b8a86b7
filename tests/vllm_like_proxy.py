"""A proxy that makes a real llama-server look like another OpenAI-compatible server, a test fixture on a free
loopback port: vLLM as its documentation describes it (``/v1/models`` owned_by ``vllm``, ``/version``, a
``/tokenize`` that takes ``{"prompt", "add_special_tokens"}`` and answers ``{"count", "max_model_len", "tokens"}``,
no ``/props``), or, with ``generic``, a server that offers no tokenizer and says nothing of what it is.

The completions and metrics routes are passed through unchanged: the answers are llama-server's own."""

from __future__ import annotations

import http.client
import http.server
import json
import threading
from contextlib import contextmanager
from urllib.parse import urlsplit

VERSION = "0.11.0"  # what /version says (any string: meshbench records no version from it)


class _Proxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str, generic: bool) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.generic = generic
        self.asked: list[tuple[str, dict]] = []  # every tokenize request, as it came (its path and body)
        self.posted: list[str] = []  # every other POST's path (completions: load and counts)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server: _Proxy

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/props" or (self.path == "/version" and self.server.generic):
            return self._json({"error": "not found"}, 404)
        if self.path == "/version":
            return self._json({"version": VERSION})
        if self.path == "/v1/models":
            status, raw = self._upstream("GET", "/v1/models", None)
            models = json.loads(raw)
            for m in models.get("data", []):
                m["owned_by"] = "acme" if self.server.generic else "vllm"
            return self._json(models, status)
        self._forward(None)

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path in ("/tokenize", "/extras/tokenize"):
            asked = json.loads(body)
            self.server.asked.append((self.path, asked))
            if self.server.generic or self.path != "/tokenize" or set(asked) != {"prompt", "add_special_tokens"}:
                return self._json({"error": "not found"}, 404)
            native = {"content": asked["prompt"], "add_special": asked["add_special_tokens"]}
            status, raw = self._upstream("POST", "/tokenize", json.dumps(native).encode())
            tokens = json.loads(raw)["tokens"]
            return self._json({"count": len(tokens), "max_model_len": 1024, "tokens": tokens}, status)
        self.server.posted.append(self.path)
        self._forward(body)

    def _json(self, value: dict, status: int = 200) -> None:
        raw = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _upstream(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        host, port = self.server.upstream
        conn = http.client.HTTPConnection(host, port, timeout=60)
        try:
            conn.request(method, path, body, {"Content-Type": "application/json"} if body else {})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

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
def serving(upstream: str, generic: bool = False):
    """The proxy in front of ``upstream`` for the ``with`` block: yields (its URL, the proxy); stopped after."""
    proxy = _Proxy(upstream, generic)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}", proxy
    finally:
        proxy.shutdown()
        proxy.server_close()
