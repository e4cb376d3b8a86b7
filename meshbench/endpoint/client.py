"""One serving endpoint over HTTP: what it is (``probe``), its tokenizer, one streamed completion with the
client's clock stamps, and its Prometheus metrics.

Two APIs:
- ``native``: llama-server's ``/completion``: token-id prompts, ``return_tokens``, ``n_predict``, greedy
  (``temperature`` 0, ``top_k`` 1), ``cache_prompt`` false, ``ignore_eos`` under eos ban; its stream
  carries each token's id.
- ``openai``: ``/v1/completions``: a text prompt, ``max_tokens``, ``temperature`` 0, a seed, streamed
  with ``stream_options.include_usage``; ``min_tokens`` = ``max_tokens`` under eos ban (where the server
  knows it). Text comes back, not ids: the outputs compared are texts.

A server's answer is input: every chunk is checked for its shape, and an answer of the wrong shape, one
that never ends, says it generated more than it sent, sends more tokens than asked, stops early under an
eos ban, or ends without saying why is that session's failure (``Completion.error``), never the run's.
Each request has a deadline (``deadline_s``) and each streamed line a size cap.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from meshbench.errors import MeshbenchError
from meshbench.workload.target import Target, parse_target  # noqa: F401 - where an endpoint listens

APIS = ("auto", "native", "openai")
PROBE_TIMEOUT_S = 10.0
MAX_ANSWER_BYTES = 16 << 20  # a plain (not streamed) answer: /props, /tokenize, /v1/models, /metrics
DEADLINE_S = 300.0  # one request, from its submission to its last byte (engine.deadline_s)
MAX_LINE_BYTES = 1 << 20  # one server-sent event line
HOLD_BACK = 3  # token ids a stream may hold back at its end (an incomplete UTF-8 character spans up to 4 bytes)
MAX_TEXT_PER_TOKEN = 64  # characters of text per asked token (a token's piece is a few bytes)
METRIC_PREFIXES = ("llamacpp:", "vllm:", "sglang:")  # the serving engines' own gauges and counters


@dataclass(slots=True)
class Completion:
    """One session's answer as the client saw it: its tokens (ids, ``native`` only) and text, the clock
    stamps (ns from the level's start) of the request and of every token, and how it ended."""

    session_id: str
    submit_ns: int
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    token_ns: list[int] = field(default_factory=list)  # one stamp per token, as its chunk arrived
    stop: str | None = None  # the server's reason: "limit" (all tokens), "eos", "word", ... (None: unsaid)
    predicted: int | None = None  # the tokens the server says it generated
    evaluated: int | None = None  # the prompt tokens the server says it evaluated (native)
    error: str | None = None  # the request failed: HTTP status, a closed stream, a timeout

    def to_dict(self) -> dict:
        return {
            "session_id": self.session_id,
            "submit_ns": self.submit_ns,
            "tokens": self.tokens,
            "text": self.text,
            "token_ns": self.token_ns,
            "stop": self.stop,
            "predicted": self.predicted,
            "evaluated": self.evaluated,
            "error": self.error,
        }


class Malformed(Exception):
    """A server's answer of the wrong shape or content: the session's failure, with what was wrong."""


class Endpoint:
    def __init__(self, target: Target, api: str, deadline_s: float = DEADLINE_S) -> None:
        self.target, self.api, self.deadline_s = target, api, deadline_s

    # --- plain requests ---------------------------------------------------------------------
    def _request(self, method: str, path: str, body: dict | None = None):
        """(status, body bytes), within PROBE_TIMEOUT_S from the request to the answer's last byte and at most
        MAX_ANSWER_BYTES; a server that does not answer so is the input's error, in one line."""
        conn = http.client.HTTPConnection(self.target.host, self.target.port, timeout=PROBE_TIMEOUT_S)
        cut = None
        try:
            cut = _Deadline(conn, PROBE_TIMEOUT_S)
            payload = None if body is None else json.dumps(body)
            conn.request(method, path, payload, {"Content-Type": "application/json"} if payload else {})
            resp = conn.getresponse()
            raw = resp.read(MAX_ANSWER_BYTES + 1)
            if cut.late():
                raise OSError("cut at the deadline")
        except (OSError, http.client.HTTPException) as e:
            late = cut is not None and cut.late()
            why = f"no whole answer within {PROBE_TIMEOUT_S:g} s" if late else f"{type(e).__name__}: {e}"
            raise MeshbenchError(
                f"{self.target.url}{path}: the endpoint does not answer ({_excerpt(why.encode())})"
            ) from None
        finally:
            if cut is not None:
                cut.cancel()
            conn.close()
        if len(raw) > MAX_ANSWER_BYTES:
            raise MeshbenchError(f"{self.target.url}{path}: an answer over {MAX_ANSWER_BYTES} bytes")
        return resp.status, raw

    def _json(self, method: str, path: str, body: dict | None = None) -> dict | list:
        status, raw = self._request(method, path, body)
        if status != 200:
            raise MeshbenchError(f"{self.target.url}{path}: HTTP {status}: {_excerpt(raw)}")
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            raise MeshbenchError(f"{self.target.url}{path}: the answer is not JSON: {_excerpt(raw, 80)!r}") from None

    def probe(self) -> dict:
        """What the endpoint is: llama-server answers ``/props`` (its build and model); an OpenAI-compatible
        server ``/v1/models``. Fixes ``api`` when it is ``auto``."""
        status, raw = self._request("GET", "/props")
        props = None
        if status == 200:
            try:
                props = json.loads(raw)
            except (ValueError, RecursionError):
                props = None
        if self.api == "auto":
            self.api = "native" if isinstance(props, dict) else "openai"
        models = self._json("GET", "/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        names = [_text(m.get("id"), 200) for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        info = {"url": self.target.url, "loopback": self.target.loopback, "api": self.api, "models": names[:16]}
        if isinstance(props, dict):
            slots = props.get("total_slots")
            info["server"] = "llama-server"
            info["build_info"] = _text(props.get("build_info"), 200)
            info["model_path"] = _text(props.get("model_path"), 1000)
            info["total_slots"] = slots if _count(slots) and slots <= 1 << 16 else None
        else:
            info["server"] = "openai-compatible"
        return info

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each prompt's ids by the server's own tokenizer (llama-server ``/tokenize``, special tokens added as
        the model says; llama-cpp-python's server ``/extras/tokenize``)."""
        out = []
        for text in texts:
            if self.api == "native":
                d = self._json("POST", "/tokenize", {"content": text, "add_special": True})
            else:
                d = self._json("POST", "/extras/tokenize", {"input": text})
            tokens = d.get("tokens") if isinstance(d, dict) else None
            if not isinstance(tokens, list) or not all(_token(t) for t in tokens):
                path = "/tokenize" if self.api == "native" else "/extras/tokenize"
                raise MeshbenchError(f"{self.target.url}{path}: the answer holds no list of token ids")
            out.append(list(tokens))
        return out

    def metrics(self) -> dict | None:
        """The server's own gauges and counters from ``/metrics`` (None: not exposed, or no answer)."""
        try:
            status, raw = self._request("GET", "/metrics")
        except MeshbenchError:
            return None
        if status != 200:
            return None
        found = {}
        try:
            for family in text_string_to_metric_families(raw.decode(errors="replace")):
                for s in family.samples:
                    if s.name.startswith(METRIC_PREFIXES) and not s.labels and math.isfinite(s.value):
                        found[s.name] = s.value
        except ValueError:
            return None
        return found

    # --- one streamed completion ------------------------------------------------------------
    def body(self, prompt_ids: list[int], prompt_text: str, new_tokens: int, ban_eos: bool, seed: int) -> dict:
        if self.api == "native":
            return {
                "prompt": prompt_ids,
                "n_predict": new_tokens,
                "temperature": 0.0,
                "top_k": 1,
                "cache_prompt": False,
                "ignore_eos": ban_eos,
                "return_tokens": True,
                "stream": True,
                "seed": seed,
            }
        body = {
            "prompt": prompt_text,
            "max_tokens": new_tokens,
            "temperature": 0.0,
            "seed": seed,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if ban_eos:
            body["min_tokens"] = new_tokens
        return body

    def complete(self, session_id: str, body: dict, t0: int) -> Completion:
        """Send one request and read its stream, stamping each chunk as it arrives (ns from ``t0``). A failure
        (an HTTP error, a malformed answer, a stream closed before its end, the deadline) is the session's,
        not the run's."""
        c = Completion(session_id, time.monotonic_ns() - t0)
        path = "/completion" if self.api == "native" else "/v1/completions"
        deadline = time.monotonic() + self.deadline_s
        conn = http.client.HTTPConnection(self.target.host, self.target.port, timeout=self.deadline_s)
        cut = None
        try:
            cut = _Deadline(conn, self.deadline_s)
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                c.error = f"HTTP {resp.status}: {_excerpt(resp.read(4096))}"
                return c
            _Stream(self.api, body, c, t0, deadline).read(resp)
        except Malformed as e:
            c.error = f"malformed answer: {e}"
        except (OSError, http.client.HTTPException, ValueError, RecursionError) as e:
            timed_out = (cut is not None and cut.late()) or isinstance(e, TimeoutError)
            c.error = (
                f"no answer within the deadline ({self.deadline_s:g} s)"
                if timed_out
                else f"{type(e).__name__}: {_excerpt(str(e).encode())}"
            )
        finally:
            if cut is not None:
                cut.cancel()
            conn.close()
        if cut is not None and cut.late():  # (whatever the cut stream looked like)
            c.error = f"no answer within the deadline ({self.deadline_s:g} s)"
        return c


class _Deadline:
    """A wall-clock deadline on a connection: a timer shuts its socket down when it passes (a server that drips
    a byte at a time never trips a per-read timeout). ``late()`` says whether it cut the connection."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float) -> None:
        self.fired = threading.Event()
        conn.connect()  # (within the socket timeout); the response keeps this socket when the connection lets go
        self.sock = conn.sock
        self.timer = threading.Timer(seconds, self._cut)
        self.timer.daemon = True
        self.timer.start()

    def _cut(self) -> None:
        self.fired.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def late(self) -> bool:
        return self.fired.is_set()

    def cancel(self) -> None:
        self.timer.cancel()


class _Stream:
    """One streamed answer read into a Completion, every chunk checked, within the deadline and the caps."""

    def __init__(self, api: str, body: dict, c: Completion, t0: int, deadline: float) -> None:
        self.api, self.c, self.t0, self.deadline = api, c, t0, deadline
        self.asked = int(body.get("n_predict", body.get("max_tokens", 0)))
        self.ban = bool(body.get("ignore_eos") or body.get("min_tokens"))
        self.streamed = body.get("stream", True)
        self.finished = False  # native: a chunk with stop; openai: a finish_reason

    def read(self, resp) -> None:
        if not self.streamed:  # a whole native answer (bench server's token comparison)
            raw = resp.read(MAX_LINE_BYTES + 1)
            if len(raw) > MAX_LINE_BYTES:
                raise Malformed(f"an answer over {MAX_LINE_BYTES} bytes")
            self.finished = _native_chunk(self.c, json.loads(raw), 0, stamped=False)
        elif not self._events(resp):
            raise Malformed("the stream closed before its end")
        if not self.finished:
            raise Malformed("the stream ended without a finish reason (cut by the server)")
        self._check_counts()

    def _events(self, resp) -> bool:
        """Server-sent events until the last one; True when the stream ended as the API says it must."""
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            line = resp.readline(MAX_LINE_BYTES + 1)
            if not line:
                return False
            if len(line) > MAX_LINE_BYTES:
                raise Malformed(f"a line over {MAX_LINE_BYTES} bytes")
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                return True
            chunk = json.loads(data)
            now = time.monotonic_ns() - self.t0
            if self.api == "native":
                if _native_chunk(self.c, chunk, now):
                    self.finished = True
                    return True
            elif _openai_chunk(self.c, chunk, now):
                self.finished = True
            if len(self.c.token_ns) > self.asked + HOLD_BACK or len(self.c.text) > MAX_TEXT_PER_TOKEN * (
                self.asked + HOLD_BACK
            ):
                raise Malformed(f"more than the {self.asked} tokens asked for")

    def _check_counts(self) -> None:
        """What the server says it generated against what it sent, and an eos ban honoured."""
        c = self.c
        native = self.api == "native"
        received = len(c.tokens) if native else len(c.token_ns)  # (an OpenAI chunk carries at least one token)
        if received > self.asked:
            raise Malformed(f"{received} tokens for the {self.asked} asked for")
        if c.predicted is not None:
            if received == 0 and c.predicted > 0:
                raise Malformed(f"the server says it generated {c.predicted} tokens; it sent none")
            high = min(self.asked, received + HOLD_BACK) if native else self.asked
            if not received <= c.predicted <= high:
                raise Malformed(f"the server says it generated {c.predicted} tokens; it sent {received}")
        if native and c.text and not c.tokens:
            raise Malformed("text but no token ids (return_tokens was not honoured)")
        generated = c.predicted if c.predicted is not None else received
        if c.stop == "limit" and generated < self.asked:
            raise Malformed(f"stopped at the limit after {generated} of the {self.asked} tokens asked for")
        if self.ban and generated < self.asked:
            raise Malformed(f"stopped at {generated} of {self.asked} tokens under eos ban (the ban was not honoured)")


def _native_chunk(c: Completion, chunk, now: int, stamped: bool = True) -> bool:
    """A llama-server chunk (or a whole answer, not ``stamped``): its tokens' ids and text; True at the last."""
    if not isinstance(chunk, dict):
        raise Malformed(f"a chunk is {type(chunk).__name__}, not an object")
    tokens = chunk.get("tokens", [])
    if not isinstance(tokens, list) or not all(_token(t) for t in tokens):
        raise Malformed("'tokens' is not a list of token ids")
    content = chunk.get("content", "")
    if not isinstance(content, str):
        raise Malformed(f"'content' is {type(content).__name__}, not text")
    for t in tokens:
        c.tokens.append(t)
        if stamped:
            c.token_ns.append(now)
    c.text += content
    if chunk.get("stop"):
        timings = chunk.get("timings")
        c.stop = _reason(chunk.get("stop_type"), "stop_type")
        c.predicted = _counted(
            chunk.get("tokens_predicted", (timings or {}).get("predicted_n") if isinstance(timings, dict) else None),
            "tokens_predicted",
        )
        c.evaluated = _counted(chunk.get("tokens_evaluated"), "tokens_evaluated")
        return True
    return False


def _openai_chunk(c: Completion, chunk, now: int) -> bool:
    """An OpenAI completion chunk: a piece of text (a token, as the server streams them), or the usage. True
    when it gave a finish reason."""
    if not isinstance(chunk, dict):
        raise Malformed(f"a chunk is {type(chunk).__name__}, not an object")
    choices = chunk.get("choices", [])
    if not isinstance(choices, list) or not all(isinstance(x, dict) for x in choices):
        raise Malformed("'choices' is not a list of objects")
    finished = False
    for choice in choices:
        piece = choice.get("text", "")
        if piece is None:
            piece = ""
        if not isinstance(piece, str):
            raise Malformed(f"a choice's 'text' is {type(piece).__name__}, not text")
        if piece:
            c.text += piece
            c.token_ns.append(now)
        reason = choice.get("finish_reason")
        if reason is not None:
            reason = _reason(reason, "finish_reason")
            c.stop = {"length": "limit", "stop": "eos"}.get(reason, reason)
            finished = True
    usage = chunk.get("usage")
    if usage is not None:
        if not isinstance(usage, dict):
            raise Malformed(f"'usage' is {type(usage).__name__}, not an object")
        c.predicted = _counted(usage.get("completion_tokens"), "usage.completion_tokens")
    return finished


def _token(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 31


def _count(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def _counted(n, name: str) -> int | None:
    if n is None:
        return None
    if not _count(n) or n > 1 << 31:
        raise Malformed(f"'{name}' is {_excerpt(json.dumps(n).encode(), 40)}, not a count")
    return n


def _reason(r, name: str) -> str:
    if not isinstance(r, str) or not 0 < len(r) <= 32:
        raise Malformed(f"'{name}' is {_excerpt(json.dumps(r).encode(), 40)}, not a reason")
    return r


def _text(v, limit: int) -> str | None:
    """A server's string field, kept only when it is one, and cut to ``limit`` characters."""
    return v[:limit] if isinstance(v, str) else None


def _excerpt(raw: bytes, limit: int = 200) -> str:
    """The start of a server's answer, on one line, printable (no lone surrogates, no control characters)."""
    text = raw[:limit].decode(errors="replace").encode("utf-8", "replace").decode()
    return " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
