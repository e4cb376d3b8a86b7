"""One serving endpoint over HTTP: what it is (``probe``), its tokenizer, one streamed completion with the
client's clock stamps, and its Prometheus metrics.

Two APIs:
- ``native``: llama-server's ``/completion``: token-id prompts, ``return_tokens``, ``n_predict``, greedy
  (``temperature`` 0, ``top_k`` 1), ``cache_prompt`` false, ``ignore_eos`` under eos ban; its stream
  carries each token's id.
- ``openai``: ``/v1/completions``: a text prompt, ``max_tokens``, ``temperature`` 0, a seed, streamed
  with ``stream_options.include_usage``; ``min_tokens`` = ``max_tokens`` under eos ban (where the server
  knows it). Text comes back, not ids: the outputs compared are texts.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from meshbench.errors import MeshbenchError

APIS = ("auto", "native", "openai")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
PROBE_TIMEOUT_S = 10.0
METRIC_PREFIXES = ("llamacpp:", "vllm:", "sglang:")  # the serving engines' own gauges and counters


@dataclass(frozen=True, slots=True)
class Target:
    """Where the endpoint listens: ``http://HOST:PORT``."""

    url: str
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        return self.host in LOOPBACK


def parse_target(url: str) -> Target:
    """``http://HOST:PORT`` (a path, a query, https or credentials are refused: one line, before any work)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise MeshbenchError(f"--target {url!r}: not a URL ({e})") from None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise MeshbenchError(f"--target {url!r}: give http://HOST:PORT (an http URL with a host and a port)")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise MeshbenchError(f"--target {url!r}: give the server's root, http://HOST:PORT, without a path")
    return Target(f"http://{parts.hostname}:{port}", parts.hostname, port)


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


class Endpoint:
    def __init__(self, target: Target, api: str, timeout_s: float = 600.0) -> None:
        self.target, self.api, self.timeout_s = target, api, timeout_s

    # --- plain requests ---------------------------------------------------------------------
    def _request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None):
        """(status, body bytes); a server that does not answer is the input's error, in one line."""
        conn = http.client.HTTPConnection(self.target.host, self.target.port, timeout=timeout or PROBE_TIMEOUT_S)
        try:
            payload = None if body is None else json.dumps(body)
            conn.request(method, path, payload, {"Content-Type": "application/json"} if payload else {})
            resp = conn.getresponse()
            return resp.status, resp.read()
        except OSError as e:
            raise MeshbenchError(f"{self.target.url}{path}: the endpoint does not answer ({e})") from None
        finally:
            conn.close()

    def _json(self, method: str, path: str, body: dict | None = None) -> dict | list:
        status, raw = self._request(method, path, body)
        if status != 200:
            raise MeshbenchError(f"{self.target.url}{path}: HTTP {status}: {_excerpt(raw)}")
        try:
            return json.loads(raw)
        except ValueError:
            raise MeshbenchError(f"{self.target.url}{path}: the answer is not JSON: {_excerpt(raw, 80)!r}") from None

    def probe(self) -> dict:
        """What the endpoint is: llama-server answers ``/props`` (its build and model); an OpenAI-compatible
        server ``/v1/models``. Fixes ``api`` when it is ``auto``."""
        status, raw = self._request("GET", "/props")
        props = None
        if status == 200:
            try:
                props = json.loads(raw)
            except ValueError:
                props = None
        if self.api == "auto":
            self.api = "native" if isinstance(props, dict) else "openai"
        models = self._json("GET", "/v1/models")
        names = [m.get("id") for m in models.get("data", [])] if isinstance(models, dict) else []
        info = {"url": self.target.url, "loopback": self.target.loopback, "api": self.api, "models": names}
        if isinstance(props, dict):
            info["server"] = "llama-server"
            info["build_info"] = props.get("build_info")
            info["model_path"] = props.get("model_path")
            info["total_slots"] = props.get("total_slots")
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
            out.append([int(t) for t in d["tokens"]])
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
                    if s.name.startswith(METRIC_PREFIXES) and not s.labels:
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
        (an HTTP error, a stream closed before its end, a timeout) is the session's, not the run's."""
        c = Completion(session_id, time.monotonic_ns() - t0)
        path = "/completion" if self.api == "native" else "/v1/completions"
        conn = http.client.HTTPConnection(self.target.host, self.target.port, timeout=self.timeout_s)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                c.error = f"HTTP {resp.status}: {_excerpt(resp.read())}"
                return c
            if not body.get("stream", True):
                _native_chunk(c, json.loads(resp.read()), time.monotonic_ns() - t0, stamped=False)
            elif not self._read_stream(resp, c, t0):
                c.error = "the stream closed before its end"
        except (OSError, http.client.HTTPException, ValueError) as e:
            c.error = f"{type(e).__name__}: {e}"
        finally:
            conn.close()
        return c

    def _read_stream(self, resp, c: Completion, t0: int) -> bool:
        """Read server-sent events until the last one; True when the stream ended as the API says it must."""
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                return True
            chunk = json.loads(data)
            now = time.monotonic_ns() - t0
            if self.api == "native":
                if _native_chunk(c, chunk, now):
                    return True
            else:
                _openai_chunk(c, chunk, now)
        return False


def _native_chunk(c: Completion, chunk: dict, now: int, stamped: bool = True) -> bool:
    """A llama-server chunk (or a whole answer, not ``stamped``): its tokens' ids and text; True at the last."""
    for t in chunk.get("tokens", []):
        c.tokens.append(int(t))
        if stamped:
            c.token_ns.append(now)
    c.text += chunk.get("content", "")
    if chunk.get("stop"):
        c.stop = chunk.get("stop_type")
        c.predicted = chunk.get("tokens_predicted", (chunk.get("timings") or {}).get("predicted_n"))
        c.evaluated = chunk.get("tokens_evaluated")
        return True
    return False


def _openai_chunk(c: Completion, chunk: dict, now: int) -> None:
    """An OpenAI completion chunk: a piece of text (a token, as the server streams them), or the usage."""
    for choice in chunk.get("choices", []):
        piece = choice.get("text", "")
        if piece:
            c.text += piece
            c.token_ns.append(now)
        if choice.get("finish_reason"):
            c.stop = {"length": "limit", "stop": "eos"}.get(choice["finish_reason"], choice["finish_reason"])
    usage = chunk.get("usage")
    if usage:
        c.predicted = usage.get("completion_tokens")


def _excerpt(raw: bytes, limit: int = 200) -> str:
    """The start of a server's answer, on one line."""
    return " ".join(raw[:limit].decode(errors="replace").split())
