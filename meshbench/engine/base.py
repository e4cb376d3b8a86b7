"""The contract between the scheduler and an engine."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from meshbench.errors import MeshbenchError

SAMPLING_CONTRACT = "greedy:argmax:lowest-id-wins-ties"


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


@runtime_checkable
class BatchEngine(Protocol):
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

    def prefill(self, session: SessionHandle, prompt_tokens: Sequence[int]) -> StepResult: ...

    def decode_batch(self, items: Sequence[DecodeItem]) -> list[StepResult]: ...

    def release(self, session_id: str) -> None: ...


def fingerprint(recipe: dict) -> str:
    """sha256 of a recipe's canonical JSON: equal fingerprints promise equal tokens."""
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def batch_results(items: Sequence[DecodeItem], live: Sequence[DecodeItem], rows) -> list[StepResult]:
    """A decode batch's answer in ``items`` order: greedy steps for ``live`` (whose logits
    ``rows`` holds, row by row), a cache miss for every other item."""
    results = {it.session_id: StepResult(it.session_id, None, cache_miss=True) for it in items}
    for it, row in zip(live, rows):
        results[it.session_id] = greedy_step(it.session_id, row)
    return [results[it.session_id] for it in items]


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


def greedy_step(session_id: str, logits: np.ndarray) -> StepResult:
    """Greedy sampling: argmax, lowest id on a tie (np.argmax returns the first maximum).

    Non-finite logits (NaN or Inf weights, an overflow) would make argmax return 0 for
    every step and look like a valid stream: they are an engine fault instead.
    """
    if not np.isfinite(logits).all():
        bad = int(np.size(logits) - np.count_nonzero(np.isfinite(logits)))
        raise EngineFault(f"non-finite logits: {bad} of {np.size(logits)} values are NaN or Inf")
    tok = int(np.argmax(logits))
    if logits.shape[-1] > 1:
        rest = logits.copy()  # (vocab,): ten times cheaper than np.partition at vocab 8192
        rest[tok] = -np.inf
        margin = float(logits[tok] - rest.max())
    else:
        margin = float("inf")
    return StepResult(session_id, tok, margin)
