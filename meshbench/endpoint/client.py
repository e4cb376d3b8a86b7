"""One serving endpoint over HTTP: what it is (``probe``), its tokenizer, one streamed completion with the
client's clock stamps, and its Prometheus metrics.

Two APIs:
- ``native``: llama-server's ``/completion``: token-id prompts, ``return_tokens``, ``n_predict``, greedy
  (``temperature`` 0, ``top_k`` 1), ``ignore_eos`` under eos ban; its stream carries each token's id.
- ``openai``: ``/v1/completions``: a text prompt, ``max_tokens``, ``temperature`` 0, a seed, streamed
  with ``stream_options.include_usage``; under eos ban ``min_tokens`` = ``max_tokens`` (llama-cpp-python's
  server) and ``ignore_eos`` (llama-server). Text comes back, not ids: the outputs compared are texts.

Nothing else that changes what the server does is sent: ``cache_prompt`` only where the user chose it
(``--cache-prompt on|off``), so by default the server runs its own prompt cache as its users run it.

A server's answer is input: every chunk is checked for its shape, and an answer of the wrong shape, one
that never ends, says it generated more than it sent, sends more tokens than asked, stops early under an
eos ban, or ends without saying why is that session's failure (``Completion.error``), never the run's.
Each request has a deadline (``deadline_s``) and each streamed line a size cap.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import math
import socket
import threading
import time

from prometheus_client.parser import text_string_to_metric_families

from meshbench import limits
from meshbench.endpoint import local_tokenizer
from meshbench.endpoint.stream import (  # noqa: F401 - the answer, as the client reads it
    Completion,
    Malformed,
    Stream,
    excerpt,
    is_count,
    is_token,
    text_value,
)
from meshbench.engine import apis, servers
from meshbench.engine.spec import EngineSpec
from meshbench.errors import MeshbenchError
from meshbench.records.context import EndpointInfo
from meshbench.workload import request
from meshbench.workload.target import Target, parse_target  # noqa: F401 - where an endpoint listens

APIS = apis.CHOICES  # (--api)
PROBE_TIMEOUT_S = 10.0
MAX_ANSWER_BYTES = 16 << 20  # a plain (not streamed) answer: /props, /tokenize, /v1/models, /metrics
DEADLINE_S = 300.0  # one request, from its submission to its last byte (engine.deadline_s)
METRIC_PREFIXES = ("llamacpp:", "vllm:", "sglang:")  # the serving engines' own gauges and counters


class Endpoint:
    def __init__(
        self, target: Target, api: str, deadline_s: float = DEADLINE_S, cache_prompt: bool | None = None
    ) -> None:
        self.target, self.api, self.deadline_s, self.cache_prompt = target, api, deadline_s, cache_prompt
        self.flavour: servers.Flavour | None = None  # what server it is, found by probe()
        self.props: dict | None = None  # llama-server's /props as probe() read it (None: another server)
        self.models: list[str] = []  # the models /v1/models lists as on this machine (owned_by local), by path
        self.spec: EngineSpec | None = None  # the settings of the sweep it serves (Endpoint.of); None: a bench's

    @classmethod
    def of(cls, target: Target, spec: EngineSpec) -> Endpoint:
        """The endpoint an endpoint sweep's settings (its ``engine`` section) describe, each read from them here."""
        endpoint = cls(target, spec.api, spec.deadline_s, request.chosen_cache_prompt(spec.cache_prompt))
        endpoint.spec = spec
        return endpoint

    # --- plain requests ---------------------------------------------------------------------
    def _request(self, method: str, path: str, body: dict | None = None, timeout_s: float = 0.0):
        """(status, body bytes), within PROBE_TIMEOUT_S (or ``timeout_s``: a request that computes) from the request
        to the answer's last byte and at most MAX_ANSWER_BYTES; a server that does not answer so is the input's
        error, in one line."""
        limit = timeout_s or PROBE_TIMEOUT_S
        conn = http.client.HTTPConnection(self.target.host, self.target.port, timeout=limit)
        cut = None
        try:
            cut = _Deadline(conn, limit)
            payload = None if body is None else json.dumps(body)
            conn.request(method, path, payload, {"Content-Type": "application/json"} if payload else {})
            resp = conn.getresponse()
            raw = resp.read(MAX_ANSWER_BYTES + 1)
            if cut.late():
                raise OSError("cut at the deadline")
        except (OSError, http.client.HTTPException) as e:
            late = cut is not None and cut.late()
            why = f"no whole answer within {limit:g} s" if late else f"{type(e).__name__}: {e}"
            raise MeshbenchError(
                f"{self.target.url}{path}: the endpoint does not answer ({excerpt(why.encode())})"
            ) from None
        finally:
            if cut is not None:
                cut.cancel()
            conn.close()
        if len(raw) > MAX_ANSWER_BYTES:
            raise MeshbenchError(f"{self.target.url}{path}: an answer over {MAX_ANSWER_BYTES} bytes")
        return resp.status, raw

    def _json(self, method: str, path: str, body: dict | None = None, timeout_s: float = 0.0) -> dict | list:
        status, raw = self._request(method, path, body, timeout_s)
        if status != 200:
            raise MeshbenchError(f"{self.target.url}{path}: HTTP {status}: {excerpt(raw)}")
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            raise MeshbenchError(f"{self.target.url}{path}: the answer is not JSON: {excerpt(raw, 80)!r}") from None

    def probe(self) -> EndpointInfo:
        """What the endpoint is: its flavour (meshbench.engine.servers), from what it answers to ``/props``,
        ``/v1/models`` and ``/version``, or as ``engine.flavour`` names it; llama-server's build, model and slots
        from ``/props``. Fixes ``api`` when it is ``auto``."""
        self.props = self._object("/props")
        models = self._json("GET", "/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        listed = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        names = [text_value(m.get("id"), 200) for m in listed]
        self.models = [m["id"][:4096] for m in listed if isinstance(m.get("id"), str) and m.get("owned_by") == "local"]
        owners = tuple(str(m.get("owned_by", ""))[:200] for m in listed)
        version = self._object("/version", lenient=True) if self.props is None else None
        chosen = self.spec.flavour if self.spec is not None else servers.AUTO
        self.flavour, why = servers.detect(servers.Answers(self.props, owners, version), chosen)
        flavour = self.flavour
        if self.api == apis.AUTO:
            self.api = flavour.apis[0]
        info = EndpointInfo(
            url=self.target.url,
            loopback=self.target.loopback,
            api=self.api,
            models=names[:16],
            server=flavour.name,
            detected=why,
        )
        if flavour.props and isinstance(self.props, dict):
            props = self.props
            slots = props.get("total_slots")
            info = dataclasses.replace(
                info,
                build_info=text_value(props.get("build_info"), 200),
                model_path=text_value(props.get("model_path"), 1000),
                total_slots=slots if is_count(slots) and slots <= 1 << 16 else None,
            )
        return info

    def _object(self, path: str, lenient: bool = False) -> dict | None:
        """What the server answers to a GET of ``path`` where that is a JSON object, else None (a 404 included;
        ``lenient``: no answer at all too, where the question is optional, else that is the input's error)."""
        try:
            status, raw = self._request("GET", path)
        except MeshbenchError:
            if not lenient:
                raise
            return None
        if status != 200:
            return None
        try:
            found = json.loads(raw)
        except (ValueError, RecursionError):
            return None
        return found if isinstance(found, dict) else None

    def tokenize(self, texts: list[str], add_special: bool = True) -> list[list[int]]:
        """Each prompt's ids by the server's own tokenizer, whichever API the sweep uses: llama-server's
        ``/tokenize`` (special tokens added as the model says), llama-cpp-python's server's ``/extras/tokenize``
        (the one the probe found). Not ``add_special``: nothing added (a conversation's later turn); where the
        server has no such switch (``/extras/tokenize``), what it adds to an empty text is cut from each text's
        start."""
        flavour = self.flavour or (servers.LLAMA_SERVER if apis.of(self.api).ids else servers.LLAMA_CPP_PYTHON)
        way = flavour.tokenizer
        if way is None and flavour.local and self.models:
            if not self.target.loopback:  # (a path a server names is read only where that server runs here)
                raise MeshbenchError(
                    f"{self.target.url}: a {flavour.name} server off this machine: meshbench reads a tokenizer from "
                    "the path a server names only for a server on loopback"
                )
            return local_tokenizer.tokenize(self.models[0], texts, add_special)
        if way is None:
            raise MeshbenchError(f"{self.target.url}: the {flavour.name} server has no tokenizer meshbench can ask")
        added = [] if add_special or way.switch else self._tokens(way, "", True)
        out = []
        for text in texts:
            tokens = self._tokens(way, text, add_special)
            out.append(tokens[len(added) :] if tokens[: len(added)] == added else tokens)
        return out

    @property
    def counts_by_usage(self) -> bool:
        """Whether this server tokenizes nothing meshbench can ask or load (servers.Flavour.counted): each prompt's
        length is then the server's own count (``count``), and no prompt's ids are known."""
        return self.flavour is not None and self.flavour.counted

    def count(self, texts: list[str]) -> list[int]:
        """Each prompt's length as the server counts it: ``usage.prompt_tokens`` of one unstreamed completions
        request per prompt (one token asked, greedy), sent one at a time before any timed pass; as the completions
        API counts a prompt, special tokens included, which is what a tokenizer with them added gives."""
        out = []
        for text in texts:
            try:
                d = self._json("POST", apis.OPENAI.path, {"prompt": text, "max_tokens": 1, "temperature": 0.0},
                               timeout_s=self.deadline_s)  # fmt: skip
            except MeshbenchError as e:
                why = "a server with no tokenizer is counted through its completions API"
                raise MeshbenchError(f"{e} ({why})") from None
            usage = d.get("usage") if isinstance(d, dict) else None
            n = usage.get("prompt_tokens") if isinstance(usage, dict) else None
            if not is_count(n) or n < 1 or n > limits.MAX_TOKENS:
                raise MeshbenchError(
                    f"{self.target.url}{apis.OPENAI.path}: the answer gives no count of the prompt's tokens "
                    "(usage.prompt_tokens), the only way meshbench measures a prompt on a server with no tokenizer"
                )
            out.append(n)
        return out

    def _tokens(self, way: servers.Tokenizer, text: str, add_special: bool) -> list[int]:
        path = way.path
        d = self._json("POST", path, way.body(text, add_special))
        tokens = d.get("tokens") if isinstance(d, dict) else None
        if not isinstance(tokens, list) or not all(is_token(t) for t in tokens) or (text and not tokens):
            raise MeshbenchError(f"{self.target.url}{path}: the answer holds no list of token ids")
        return list(tokens)

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
        """One request's body: the prompt and its token count, then the fields every request carries
        (meshbench.workload.request: greedy, the eos policy, ``cache_prompt`` only where the user chose it)."""
        shared = request.shared_fields(self.api, ban_eos, seed, self.cache_prompt, self.spec)
        if apis.of(self.api).ids:
            return {"prompt": prompt_ids, "n_predict": new_tokens, **shared}
        text: dict = (
            {"messages": [{"role": "user", "content": prompt_text}]}
            if apis.of(self.api).messages
            else {"prompt": prompt_text}
        )
        body = {**text, "max_tokens": new_tokens, **shared}
        if ban_eos:
            body["min_tokens"] = new_tokens  # llama-cpp-python's server
        return body

    def complete(self, session_id: str, body: dict, t0: int, cancel_after: int | None = None) -> Completion:
        """Send one request and read its stream, stamping each chunk as it arrives (ns from ``t0``). A failure
        (an HTTP error, a malformed answer, a stream closed before its end, the deadline) is the session's,
        not the run's. With ``cancel_after``, the client disconnects once that many tokens are in (its answer's
        stop says ``cancelled``), as a user who closes the page does."""
        c = Completion(session_id, time.monotonic_ns() - t0)
        path = apis.of(self.api).path
        deadline = time.monotonic() + self.deadline_s
        conn = http.client.HTTPConnection(self.target.host, self.target.port, timeout=self.deadline_s)
        cut = resp = None
        try:
            cut = _Deadline(conn, self.deadline_s)
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                c.error = f"HTTP {resp.status}: {excerpt(resp.read(4096))}"
                return c
            done = self.flavour.done if self.flavour is not None else True
            Stream(self.api, body, c, t0, deadline, cancel_after, done).read(resp)
        except Malformed as e:
            c.error = f"malformed answer: {e}"
        except (OSError, http.client.HTTPException, ValueError, RecursionError, OverflowError) as e:
            timed_out = (cut is not None and cut.late()) or isinstance(e, TimeoutError)
            c.error = (
                f"no answer within the deadline ({self.deadline_s:g} s)"
                if timed_out
                else f"{type(e).__name__}: {excerpt(str(e).encode())}"
            )
        finally:
            if cut is not None:
                cut.cancel()
            if resp is not None:
                resp.close()  # (its socket too: a cancelled client leaves the server's stream here)
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
