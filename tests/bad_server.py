"""A serving endpoint that misbehaves on purpose: a test fixture on a free loopback port.

It speaks llama-server's native routes (``/props``, ``/tokenize``, ``/completion``, ``/metrics``) or the
OpenAI ones (``/v1/models``, ``/extras/tokenize``, ``/v1/completions``), and answers well unless a
``mode`` says which way to answer wrong. Well: each prompt is tokenized one id per word, and a completion
streams ``n`` tokens (ids 10, 11, ...; text " t10", " t11", ...), ending as its API says it must.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from contextlib import contextmanager

MODES_NATIVE = (
    "ok",
    "http-500",
    "redirect",
    "close-early",
    "non-utf8",
    "shed",  # HTTP 500 whenever another request is in flight
    "content-null",
    "content-int",
    "tokens-missing-scalar",
    "chunk-list",
    "chunk-string",
    "predicted-lie",  # says it predicted 10^6 tokens, sends n
    "predicted-negative",
    "predicted-float",
    "stop-type-long",
    "too-many-tokens",  # 10^5 tokens for n asked
    "never-ends",
    "stall",  # sends headers, then nothing
    "huge-line",
    "ignores-eos-ban",  # stops after 1 token whatever was asked
    "no-token-ids",  # ignores return_tokens: text only
    "drip",  # a byte every 0.2 s, never a whole line
    "metrics-1e400",
    "props-bad",  # total_slots a string, a 5000-character model path
    "props-drip",  # /props: a byte every 0.2 s for a minute
    "sum-leak",  # a completion's first token reads the sum of the other in-flight prompts' ids (probe 5, finding 4)
    "stale-slot",  # unless cache_prompt is false, the first token reads the last id of the request that finished
    # last before it arrived: a stale slot (probe 5, finding 5)
)
SUM_LEAK_AT = 4  # sum-leak: a completion waits until this many are in flight, then reads the others' prompts
OVERLAP_S = 0.02  # shed: each completion held this long, so that closed-loop clients sent together overlap
MODES_OPENAI = (
    "ok",
    "no-done",
    "cut",  # [DONE] after one piece and no finish_reason (llama_cpp.server's interrupt_requests)
    "choices-dict",
    "choices-string",
    "finish-int",
    "usage-list",
    "empty-pieces",
)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, *args):  # noqa: ARG002
        pass

    def _json(self, obj, status: int = 200) -> None:
        raw = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _text(self, text: str) -> None:
        raw = text.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:  # noqa: N802
        mode, native = self.server.mode, self.server.api == "native"
        if self.path == "/props" and native:
            if mode == "props-drip":
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                for _ in range(300):
                    try:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    except OSError:
                        return None
                    time.sleep(0.2)
                return None
            if mode == "props-bad":
                return self._json({"build_info": "b1", "model_path": "m" * 5000, "total_slots": "many"})
            return self._json({"build_info": "bad-server 1", "model_path": "/models/tiny.gguf", "total_slots": 4})
        if self.path == "/v1/models":
            return self._json({"object": "list", "data": [{"id": "tiny", "owned_by": "me"}]})  # (as llama_cpp.server)
        if self.path == "/metrics":
            value = "1e400" if mode == "metrics-1e400" else "3"
            return self._text(f"# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing {value}\n")
        self._json({"error": "not found"}, 404)

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path in ("/tokenize", "/extras/tokenize"):
            text = body.get("content", body.get("input", ""))
            return self._json({"tokens": [1, *(100 + len(w) for w in text.split())]})
        if self.path in ("/completion", "/v1/completions"):
            me = object()
            with self.server.lock:
                self.server.in_flight += 1
                crowded = self.server.in_flight > 1
                self.server.prompts[me] = list(body.get("prompt", [])) if isinstance(body.get("prompt"), list) else []
                if self.server.mode == "stale-slot" and body.get("cache_prompt") is not False:
                    body["_others"] = self.server.finished[-1] if self.server.finished else 0
            try:
                time.sleep(OVERLAP_S if self.server.mode == "shed" else 0.002)  # shed: closed-loop clients overlap
                if self.server.mode == "sum-leak":  # until SUM_LEAK_AT are in flight together (at most 10 s)
                    start = time.monotonic()
                    while time.monotonic() - start < 10.0:
                        with self.server.lock:
                            if len(self.server.prompts) >= SUM_LEAK_AT:  # (the first to see them keeps them for all)
                                self.server.together.update({k: dict(self.server.prompts) for k in self.server.prompts})
                            seen = self.server.together.pop(me, None)
                        if seen is not None:
                            break
                        time.sleep(0.01)
                    body["_others"] = sum(sum(p) for k, p in (seen or {}).items() if k is not me)
                self._complete(body, crowded)
            finally:
                with self.server.lock:
                    self.server.in_flight -= 1
                    self.server.finished = self.server.prompts.pop(me, None) or self.server.finished
            return None
        self._json({"error": "not found"}, 404)

    # --- a completion, well or wrong -------------------------------------------------------
    def _complete(self, body: dict, crowded: bool) -> None:
        mode = self.server.mode
        n = int(body.get("n_predict", body.get("max_tokens", 1)))
        if mode == "http-500" or (mode == "shed" and crowded):
            return self._json({"error": "overloaded"}, 500)
        if mode == "redirect":
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.1:9/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        if mode == "stall":
            time.sleep(30)
            return None
        try:
            if self.server.api == "native":
                self._native(n, mode, len(body.get("prompt", [])), body.get("_others", 0))
            else:
                self._openai(n, mode)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return None

    def _send(self, obj) -> None:
        self.wfile.write(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")
        self.wfile.flush()

    def _native(self, n: int, mode: str, evaluated: int, others: int = 0) -> None:
        wrong = {
            "content-null": {"content": None, "tokens": [10], "stop": False},
            "content-int": {"content": 7, "tokens": [10], "stop": False},
            "tokens-missing-scalar": {"content": " t", "tokens": 10, "stop": False},
            "chunk-list": [1, 2, 3],
            "chunk-string": "tokens",
        }
        if mode in wrong:
            return self._send(wrong[mode])
        if mode == "non-utf8":
            return self._send(b'{"content": "\xff\xfe", "tokens": [10]}')
        if mode == "no-token-ids":
            for i in range(n):
                self._send({"content": f" t{i}", "stop": False})
            return self._send({"content": "", "stop": True, "stop_type": "limit", "tokens_evaluated": evaluated})
        if mode == "drip":
            self.wfile.write(b"data: ")
            for _ in range(300):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)
            return None
        if mode == "huge-line":
            return self._send({"content": "x" * (2 << 20), "tokens": [10], "stop": False})
        count = {"too-many-tokens": 100_000, "ignores-eos-ban": 1}.get(mode, n)
        if mode == "never-ends":
            count = 10**9
        for i in range(count):
            t = 10 + (others % 47 if mode in ("sum-leak", "stale-slot") and i == 0 else i % 50)
            self._send({"content": f" t{t}", "tokens": [t], "stop": False})
            if mode == "close-early" and i == 0:
                return None
        predicted = {
            "predicted-lie": 10**6,
            "predicted-negative": -1,
            "predicted-float": 2.5,
        }.get(mode, count)
        stop_type = "x" * 100 if mode == "stop-type-long" else ("limit" if count >= n else "eos")
        self._send(
            {
                "content": "",
                "stop": True,
                "stop_type": stop_type,
                "tokens_predicted": predicted,
                "tokens_evaluated": evaluated,
            }
        )
        return None

    def _openai(self, n: int, mode: str) -> None:
        if mode in ("choices-dict", "choices-string"):
            return self._send({"choices": {"text": "x"} if mode == "choices-dict" else "x"})
        if mode == "usage-list":
            self._send({"choices": [{"text": " t", "finish_reason": "length"}], "usage": [1]})
            return self._send(b"[DONE]")
        for i in range(1 if mode == "cut" else n):
            piece = "" if mode == "empty-pieces" else f" t{10 + i}"
            self._send({"choices": [{"text": piece, "finish_reason": None}]})
        if mode == "cut":
            return self._send(b"[DONE]")
        reason = 3 if mode == "finish-int" else "length"
        self._send({"choices": [{"text": "", "finish_reason": reason}], "usage": {"completion_tokens": n}})
        if mode != "no-done":
            self._send(b"[DONE]")
        return None


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, api: str, mode: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.api, self.mode = api, mode
        self.lock, self.in_flight = threading.Lock(), 0
        self.prompts: dict[object, list[int]] = {}  # each in-flight completion's prompt ids
        self.together: dict[object, dict[object, list[int]]] = {}  # sum-leak: what each saw in flight with it
        self.finished: list[int] = []  # stale-slot: the prompt of the request that finished last


@contextmanager
def serving(mode: str = "ok", api: str = "native"):
    """A misbehaving server on a free loopback port, for the ``with`` block: yields its URL; stopped after."""
    server = _Server(api, mode)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
