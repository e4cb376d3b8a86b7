"""One answer from a serving endpoint, read and checked: the ``Completion`` a client records, and the stream
reader that fills it chunk by chunk (llama-server's native chunks, OpenAI's), each chunk checked for its shape
and the whole answer for its counts. A wrong answer is a ``Malformed`` exception: that session's failure."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from meshbench.analysis.endpoint_margins import text_tokens_whole
from meshbench.endpoint import native_probs
from meshbench.endpoint.answer_shape import Malformed, is_count, is_token  # noqa: F401 - the answer's shape
from meshbench.engine import apis
from meshbench.records.completion import CANCELLED

MAX_LINE_BYTES = 1 << 20  # one server-sent event line
HOLD_BACK = 3  # token ids a stream may hold back at its end (an incomplete UTF-8 character spans up to 4 bytes)
MAX_TEXT_PER_TOKEN = 64  # characters of text per asked token (a token's piece is a few bytes)
MAX_TOKEN_BYTES = 1024  # one token's text


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
    evaluated: int | None = None  # the prompt tokens the server says it evaluated (native; completions: usage)
    computed: int | None = None  # of them, the ones it computed, not taken from its prompt cache (timings.prompt_n)
    margins: list[float | None] | None = None  # per token, top-1 minus top-2 log-probability (asked: n_probs,
    # or an OpenAI API's logprobs)
    token_bytes: list[int] | None = None  # OpenAI APIs, where margins were asked: each token's length in bytes (its
    # text has no ids: where an answer first differs is found by byte, then the token there)
    runner_up: list[int | None] | None = None  # native, where margins were asked: each token's second choice's id
    candidates: list[list[int]] | None = None  # native, sampled, post-sampling probabilities asked: each token's
    candidate_probs: list[list[float]] | None = None  # candidates after the samplers, and their probabilities
    error: str | None = None  # the request failed: HTTP status, a closed stream, a timeout
    turn: int = 1  # a conversation's turn (meshbench.endpoint.conversation)

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
            "computed": self.computed,
            "margins": self.margins,
            "turn": self.turn if self.turn > 1 else None,
            "token_bytes": self.token_bytes,
            "runner_up": self.runner_up,
            **({"candidates": self.candidates, "candidate_probs": self.candidate_probs} if self.candidates else {}),
        }


class _Cancelled(Exception):
    """The client stops reading (``cancel_after`` tokens are in): its answer ends here, said as ``stop``."""


class Stream:
    """One streamed answer read into a Completion, every chunk checked, within the deadline and the caps."""

    def __init__(
        self,
        api: str,
        body: dict,
        c: Completion,
        t0: int,
        deadline: float,
        cancel_after: int | None = None,
        done: bool = True,
    ) -> None:
        self.api, self.c, self.t0, self.deadline = api, c, t0, deadline
        self.done = done  # the server ends a stream with [DONE] (else: a finish reason, its usage, the body's end)
        self.cancel_after = cancel_after  # the client disconnects once this many tokens are in (None: never)
        self.asked = int(body.get("n_predict", body.get("max_tokens", 0)))
        self.ban = bool(body.get("ignore_eos") or body.get("min_tokens"))
        self.streamed = body.get("stream", True)
        self.finished = False  # native: a chunk with stop; openai: a finish_reason

    def read(self, resp) -> None:
        try:
            self._read(resp)
        except _Cancelled:
            self.c.stop = CANCELLED

    def _read(self, resp) -> None:
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
                return not self.done and self.finished and self.c.predicted is not None and _whole(resp)
            if len(line) > MAX_LINE_BYTES:
                raise Malformed(f"a line over {MAX_LINE_BYTES} bytes")
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                return True
            chunk = json.loads(data)
            now = time.monotonic_ns() - self.t0
            if apis.of(self.api).ids:
                if _native_chunk(self.c, chunk, now):
                    self.finished = True
                    return True
            elif _openai_chunk(self.c, chunk, now, chat=apis.of(self.api).messages):
                self.finished = True
            if len(self.c.token_ns) > self.asked + HOLD_BACK or len(self.c.text) > MAX_TEXT_PER_TOKEN * (
                self.asked + HOLD_BACK
            ):
                raise Malformed(f"more than the {self.asked} tokens asked for")
            if self.cancel_after is not None and len(self.c.token_ns) >= self.cancel_after and not self.finished:
                raise _Cancelled

    def _check_counts(self) -> None:
        """What the server says it generated against what it sent, and an eos ban honoured."""
        c = self.c
        native = apis.of(self.api).ids
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
        if c.token_bytes is not None:
            why = text_tokens_whole(c.text, c.token_bytes, c.predicted)
            if why is not None:
                raise Malformed(why)


def _whole(resp) -> bool:
    """Did the body end where it says it does: a chunked one at its last (empty) chunk, one with a length at that
    length? (http.client's readline gives b"" for a body cut short too; a body that just ends at close cannot say.)
    For a server that sends no ``[DONE]``, this, its finish reason and its usage are the stream's end."""
    if getattr(resp, "chunked", False):
        return resp.chunk_left is None and resp.isclosed()
    return resp.length == 0


def _native_chunk(c: Completion, chunk, now: int, stamped: bool = True) -> bool:
    """A llama-server chunk (or a whole answer, not ``stamped``): its tokens' ids and text; True at the last."""
    if not isinstance(chunk, dict):
        raise Malformed(f"a chunk is {type(chunk).__name__}, not an object")
    tokens = chunk.get("tokens", [])
    if not isinstance(tokens, list) or not all(is_token(t) for t in tokens):
        raise Malformed("'tokens' is not a list of token ids")
    content = chunk.get("content", "")
    if not isinstance(content, str):
        raise Malformed(f"'content' is {type(content).__name__}, not text")
    for t in tokens:
        c.tokens.append(t)
        if stamped:
            c.token_ns.append(now)
    c.text += content
    if "completion_probabilities" in chunk:
        probs = native_probs.parse(chunk["completion_probabilities"], tokens)
        if c.margins and (c.candidates is None) != (probs.candidates is None):
            raise Malformed("some chunks list their tokens' candidates after the samplers ('top_probs'), some not")
        c.margins = (c.margins or []) + probs.margins
        c.runner_up = (c.runner_up or []) + probs.runner_up
        if probs.candidates is not None:  # (post_sampling_probs: the candidates the draw walked)
            c.candidates = (c.candidates or []) + probs.candidates
            c.candidate_probs = (c.candidate_probs or []) + (probs.candidate_probs or [])
    if chunk.get("stop"):
        timings = chunk.get("timings")
        c.stop = _reason(chunk.get("stop_type"), "stop_type")
        c.predicted = _counted(
            chunk.get("tokens_predicted", (timings or {}).get("predicted_n") if isinstance(timings, dict) else None),
            "tokens_predicted",
        )
        c.evaluated = _counted(chunk.get("tokens_evaluated"), "tokens_evaluated")
        c.computed = _counted(timings.get("prompt_n") if isinstance(timings, dict) else None, "timings.prompt_n")
        return True
    return False


def _openai_chunk(c: Completion, chunk, now: int, chat: bool = False) -> bool:
    """An OpenAI completion chunk (``chat``: a chat completion chunk, its text in ``delta.content``): a piece of
    text (a token, as the server streams them), or the usage. True when it gave a finish reason."""
    if not isinstance(chunk, dict):
        raise Malformed(f"a chunk is {type(chunk).__name__}, not an object")
    choices = chunk.get("choices", [])
    if not isinstance(choices, list) or not all(isinstance(x, dict) for x in choices):
        raise Malformed("'choices' is not a list of objects")
    finished = False
    for choice in choices:
        piece = _delta(choice) if chat else choice.get("text", "")
        if piece is None:
            piece = ""
        if not isinstance(piece, str):
            raise Malformed(f"a choice's 'text' is {type(piece).__name__}, not text")
        if piece and c.stop is not None:
            raise Malformed("text after the finish reason")
        if piece:
            c.text += piece
            c.token_ns.append(now)
        if choice.get("logprobs") is not None:
            margins, sizes = _openai_logprobs(choice["logprobs"])
            c.margins, c.token_bytes = (c.margins or []) + margins, (c.token_bytes or []) + sizes
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
        if not chat:  # (a chat prompt is the template's tokens too: only the completions API's count is the prompt's)
            c.evaluated = _counted(usage.get("prompt_tokens"), "usage.prompt_tokens")
    return finished


def _openai_logprobs(lp) -> tuple[list[float | None], list[int]]:
    """A chunk's tokens' margins and lengths in bytes from an OpenAI ``logprobs``: the chat form (``content``, a
    list of tokens each with its ``top_logprobs``; llama-server answers so on both APIs) or the completions API's
    older form (``tokens`` and ``top_logprobs``, one mapping of text to log-probability per token)."""
    if not isinstance(lp, dict):
        raise Malformed(f"'logprobs' is {type(lp).__name__}, not an object")
    if "content" in lp:
        entries = lp["content"]
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise Malformed("'logprobs.content' is not a list of objects")
        listed = [e.get("top_logprobs") for e in entries]
        if not all(isinstance(t, list) and all(isinstance(x, dict) for x in t) for t in listed):
            raise Malformed("a token's 'top_logprobs' is not a list of objects")
        margins = native_probs.margins([{"top_logprobs": t} for t in listed])
        return margins, [_size(e.get("token"), e.get("bytes")) for e in entries]
    tokens, tops = lp.get("tokens"), lp.get("top_logprobs")
    if not isinstance(tokens, list) or not isinstance(tops, list) or len(tokens) != len(tops):
        raise Malformed("'logprobs' has neither 'content' nor one 'top_logprobs' per token in 'tokens'")
    if not all(isinstance(t, dict) for t in tops):
        raise Malformed("a token's 'top_logprobs' is not an object")
    margins = native_probs.margins([{"top_logprobs": [{"logprob": v} for v in t.values()]} for t in tops])
    return margins, [_size(t, None) for t in tokens]


def _size(token, raw) -> int:
    """A token's length in bytes: its ``bytes`` where given, else its text's in UTF-8."""
    if raw is not None:
        if not isinstance(raw, list) or not all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b < 256
                                                for b in raw):  # fmt: skip
            raise Malformed("a token's 'bytes' is not a list of bytes")
        size = len(raw)
    elif isinstance(token, str):
        size = len(token.encode("utf-8", "surrogatepass"))
    else:
        raise Malformed("a token in 'logprobs' has no text")
    if size > MAX_TOKEN_BYTES:
        raise Malformed(f"a token of {size} bytes (over {MAX_TOKEN_BYTES})")
    return size


def _delta(choice: dict):
    """A chat chunk's text: ``delta.content`` (absent or null in a chunk that only names the role)."""
    delta = choice.get("delta", {})
    if not isinstance(delta, dict):
        raise Malformed(f"a choice's 'delta' is {type(delta).__name__}, not an object")
    return delta.get("content", "")


def _counted(n, name: str) -> int | None:
    if n is None:
        return None
    if not is_count(n) or n > 1 << 31:
        raise Malformed(f"'{name}' is {excerpt(json.dumps(n).encode(), 40)}, not a count")
    return n


def _reason(r, name: str) -> str:
    if not isinstance(r, str) or not 0 < len(r) <= 32:
        raise Malformed(f"'{name}' is {excerpt(json.dumps(r).encode(), 40)}, not a reason")
    return r


def text_value(v, limit: int) -> str | None:
    """A server's string field, kept only when it is one, and cut to ``limit`` characters."""
    return v[:limit] if isinstance(v, str) else None


def excerpt(raw: bytes, limit: int = 200) -> str:
    """The start of a server's answer, on one line, printable (no lone surrogates, no control characters)."""
    text = raw[:limit].decode(errors="replace").encode("utf-8", "replace").decode()
    return " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
