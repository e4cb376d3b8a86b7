"""The contract between the scheduler and an engine."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from meshbench.errors import MeshbenchError

SAMPLING_CONTRACT = "greedy:argmax:lowest-id-wins-ties"


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """What an engine is built for: this many sessions at once, this much KV, prompt pieces of this many tokens
    in one call. The node derives them from its budget (``meshbench.scheduler.budget.engine_limits``); engines
    never see it."""

    max_active_sessions: int
    kv_bytes: int
    max_prefill_tokens_per_tick: int
    prefix_block_tokens: int = 0  # a prefix cache of blocks of this many positions (0: none)


# Limits that admit one session: enough to build a probe engine and read its figures.
PROBE_LIMITS = EngineLimits(max_active_sessions=1, kv_bytes=1, max_prefill_tokens_per_tick=1)


@dataclass(frozen=True, slots=True)
class SessionHandle:
    """Who to prefill: the id, its epoch, and how many positions to preallocate."""

    session_id: str
    epoch: int
    capacity: int


@dataclass(frozen=True, slots=True)
class DecodeItem:
    """One session's share of a decode batch: feed ``token`` at ``position``."""

    session_id: str
    epoch: int
    position: int
    token: int


@dataclass(frozen=True, slots=True)
class StepResult:
    """The engine's answer for one session: the next token, or a cache miss.

    ``margin`` is the top-1 minus top-2 logit of the step, so a divergence between two
    runs can be told apart as a near-tie (kernel variance) or a real difference.
    """

    session_id: str
    token: int | None
    margin: float = float("nan")
    cache_miss: bool = False
    error: str | None = None  # the call failed for this session: "decode_batch: Type: message"
    cause: str | None = None  # what failed, counted by the node: "decode_batch: Type", or a lost engine's cause
    cached: int = 0  # a prompt chunk's positions taken from the prefix cache instead of computed
    runner_up: int | None = None  # the second choice, whose logit the margin is measured to (lowest id on a tie)


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """A piece of a prompt: ``tokens`` at positions ``start``...; ``last``: the prompt's final piece,
    whose last position gives the session's first token."""

    session: SessionHandle
    tokens: tuple[int, ...]
    start: int
    last: bool


@dataclass(slots=True)
class TickResult:
    """One tick's engine work: a result per decode item and per prefill chunk (token None for a chunk
    that is not its prompt's last), and the engine time of each part."""

    decode: list[StepResult] = field(default_factory=list)
    prefill: list[StepResult] = field(default_factory=list)
    decode_ns: int = 0
    prefill_ns: int = 0


def failure(session_id: str, error: str, cause: str) -> StepResult:
    """A session's failed answer: the whole ``error`` it ends with, and the ``cause`` it is counted by."""
    return StepResult(session_id, None, error=error, cause=cause)


def raised(session_id: str, where: str, exc: BaseException) -> StepResult:
    """A session's answer when the ``where`` part of a call (decode_batch, prefill, step) raised ``exc``."""
    kind = type(exc).__name__
    return failure(session_id, f"{where}: {kind}: {exc}", f"{where}: {kind}")


@dataclass(frozen=True, slots=True)
class EngineFigures:
    """What the scheduler budgets against: an engine's KV cost per token, resident weights, and scratch."""

    kv_bytes_per_token: int
    weight_bytes: int
    scratch_bytes_per_session: int

    @classmethod
    def of(cls, engine: "BatchEngine") -> "EngineFigures":
        return cls(engine.kv_bytes_per_token, engine.weight_bytes, engine.scratch_bytes_per_session)


@runtime_checkable
class BatchEngine(Protocol):
    """The one contract between the node and an engine: its figures, one call per tick, a release per ended
    session, and close. Engines see sessions and tokens, never queues or budgets."""

    @property
    def recipe_fingerprint(self) -> str: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def kv_bytes_per_token(self) -> int: ...

    @property
    def weight_bytes(self) -> int: ...

    @property
    def scratch_bytes_per_session(self) -> int: ...

    @property
    def kv_bytes_in_use(self) -> int: ...

    @property
    def kv_bytes_shared(self) -> int | None:
        """The prefix cache's blocks, referenced or not: part of ``kv_bytes_in_use`` (None: no prefix cache)."""
        ...

    def step(self, decode: Sequence[DecodeItem], prefill: Sequence[PrefillChunk]) -> TickResult:
        """The tick's one call: a result per decode item and per prompt chunk, in order. An exception in a
        part fails that part's sessions (``raised``); only a lost engine (EngineLost) is raised."""
        ...

    def release(self, session_id: str) -> None:
        """Forget a session's KV (it ended, or a fault evicts it)."""
        ...

    def close(self) -> None:
        """Free native state now, not at garbage collection."""
        ...


def fingerprint(recipe: dict) -> str:
    """sha256 of a recipe's canonical JSON: equal fingerprints promise equal tokens."""
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def batch_results(
    items: Sequence[DecodeItem], live: Sequence[DecodeItem], rows, banned: np.ndarray | None = None
) -> list[StepResult]:
    """A decode batch's answer in ``items`` order: greedy steps for ``live`` (whose logits
    ``rows`` holds, row by row), a cache miss for every other item."""
    results = {it.session_id: StepResult(it.session_id, None, cache_miss=True) for it in items}
    for it, row in zip(live, rows):
        results[it.session_id] = greedy_step(it.session_id, row, banned)
    return [results[it.session_id] for it in items]


def separate_step(engine, decode: Sequence[DecodeItem], prefill: Sequence[PrefillChunk]) -> TickResult:
    """``step`` for an engine built of parts: its ``decode_batch``, then each chunk alone (``prefill`` for a
    whole prompt, ``prefill_chunk`` for a piece). An exception fails the part it came from (the decode batch,
    or one chunk), not the tick; a lost engine is raised."""
    t0 = time.perf_counter_ns()
    out = TickResult()
    if decode:
        try:
            out.decode = engine.decode_batch(decode)
        except EngineLost:
            raise
        except Exception as e:
            out.decode = [raised(it.session_id, "decode_batch", e) for it in decode]
    t1 = time.perf_counter_ns()
    for c in prefill:
        try:
            out.prefill.append(_prefill_chunk(engine, c))
        except EngineLost:
            raise
        except Exception as e:
            out.prefill.append(raised(c.session.session_id, "prefill", e))
    out.decode_ns, out.prefill_ns = t1 - t0, time.perf_counter_ns() - t1
    return out


def _prefill_chunk(engine, chunk: PrefillChunk) -> StepResult:
    """A whole prompt is ``engine.prefill``; a piece of one, ``engine.prefill_chunk``."""
    if chunk.start == 0 and chunk.last:
        return engine.prefill(chunk.session, chunk.tokens)
    return engine.prefill_chunk(chunk)


def step_with_faults(
    engine, decode: Sequence[DecodeItem], prefill: Sequence[PrefillChunk], raise_decode: bool, raise_prefill: bool
) -> TickResult:
    """``engine.step`` with an injected exception in its decode part (every decode item fails) or in its
    first chunk (that session fails), as if the engine had raised there."""
    if not raise_decode and not raise_prefill:
        return engine.step(decode, prefill)
    skip_decode, skip_chunk = raise_decode and bool(decode), raise_prefill and bool(prefill)
    out = engine.step([] if skip_decode else decode, prefill[1:] if skip_chunk else prefill)
    if skip_decode:
        out.decode = [
            raised(it.session_id, "decode_batch", InjectedFault("injected into the decode call")) for it in decode
        ]
    if skip_chunk:
        out.prefill.insert(
            0, raised(prefill[0].session.session_id, "prefill", InjectedFault("injected into the prefill call"))
        )
    return out


def check_token_ids(tokens: Sequence[int], vocab_size: int) -> None:
    """Refuse a token id outside the vocabulary before any engine reads it."""
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise MeshbenchError(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})")


class EngineFault(RuntimeError):
    """The engine produced something no model may produce (non-finite logits): the session fails."""


class InjectedFault(RuntimeError):
    """An exception a fault plan (``sweep --inject raise:...``) raised inside an engine call on purpose."""


class EngineLost(RuntimeError):
    """The engine's process is gone (killed, aborted, exited): every session resident in it is lost.

    The message is the cause as results.json records it: ``engine lost: SIGKILL``, ``engine lost: exit 1``.
    """


def check_context(positions: int, context_length: int) -> None:
    """A session longer than the model's context is a config error, on every engine and command."""
    if positions > context_length:
        raise MeshbenchError(
            f"workload: a session needs {positions} positions (prompt + new tokens) but the model's context "
            f"length is {context_length}"
        )


def greedy_step(session_id: str, logits: np.ndarray, banned: np.ndarray | None = None) -> StepResult:
    """Greedy sampling: argmax, lowest id on a tie (np.argmax returns the first maximum); ``banned`` ids
    (eos: ban) are masked first, so the margin is over the tokens that could be chosen.

    Non-finite logits (NaN or Inf weights, an overflow) would make argmax return 0 for
    every step and look like a valid stream: they are an engine fault instead. Three passes over the row and
    no copy (the row may be a view of the engine's own buffer): the argmax (NaN and +Inf win it), the minimum
    (-Inf and NaN reach it), and the largest of the rest for the margin; banned ids are masked in place and put
    back (a fourth pass only where a banned id won the argmax).
    """
    tok = int(np.argmax(logits))
    if not (np.isfinite(logits[tok]) and np.isfinite(logits.min())):
        bad = int(np.size(logits) - np.count_nonzero(np.isfinite(logits)))
        raise EngineFault(f"non-finite logits: {bad} of {np.size(logits)} values are NaN or Inf")
    banned = None if banned is None else np.asarray(banned, dtype=np.intp).ravel()
    if banned is None or not banned.size:
        margin, second = _margin(logits, tok)
        return StepResult(session_id, tok, margin, runner_up=second)
    if not logits.flags.writeable or 0 in logits.strides:  # (a row whose elements share memory: masked on a copy)
        logits = logits.copy()
    # The banned ids masked in place and put back (no copy of the row: a 1 MB row for a 262144-token vocabulary);
    # an argmax that is not banned stands (a banned id tied with it would have come first and won it).
    kept = logits[banned]  # (a copy: fancy indexing)
    try:
        logits[banned] = -np.inf
        if tok in set(banned.tolist()):
            tok = int(np.argmax(logits))
        margin, second = _margin(logits, tok)
        return StepResult(session_id, tok, margin, runner_up=second)
    finally:
        logits[banned] = kept


def _margin(logits: np.ndarray, tok: int) -> tuple[float, int | None]:
    """The chosen logit less the largest of the rest (inf for a single logit), and that one's id (the lowest
    on a tie, as argmax breaks them)."""
    if logits.shape[-1] <= 1:
        return float("inf"), None
    before = int(np.argmax(logits[:tok])) if tok else None
    after = tok + 1 + int(np.argmax(logits[tok + 1 :])) if tok + 1 < logits.shape[-1] else None
    second = after if before is None or (after is not None and logits[after] > logits[before]) else before
    if second is None or logits[second] == -np.inf:  # every other id banned: no second choice
        return float("inf"), None
    return float(logits[tok] - logits[second]), second
