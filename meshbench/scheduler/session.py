"""A generation request and the lifecycle of the session that serves it."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Sequence

from meshbench.errors import MeshbenchError


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    session_id: str
    prompt_tokens: tuple[int, ...]
    max_new_tokens: int
    stop_tokens: frozenset[int] = frozenset()  # eos: stop: the session ends after generating one of these
    end_at: int | None = None  # ends after exactly this many tokens, stop tokens or not (isolation passes)
    turns: tuple[tuple[int, ...], ...] = ()  # a conversation: the user's ids of each later turn
    turn_end_at: tuple[int, ...] = ()  # a pinned conversation: each later turn's end_at (isolation passes)

    def __post_init__(self) -> None:
        if not self.session_id:
            raise MeshbenchError("request: session_id must be a non-empty string")
        if len(self.prompt_tokens) == 0:
            raise MeshbenchError(f"request {self.session_id}: prompt_tokens must not be empty")
        if self.max_new_tokens < 1:
            raise MeshbenchError(f"request {self.session_id}: max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def total_tokens(self) -> int:
        """Prompt plus every new token: what the session must be able to hold."""
        return len(self.prompt_tokens) + self.max_new_tokens

    def next_turn(self, answer: Sequence[int]) -> "GenerationRequest | None":
        """A conversation's next request: the whole conversation so far (this prompt, its answer) and the user's
        next ids; None after the last turn."""
        if not self.turns:
            return None
        prompt = self.prompt_tokens + tuple(answer) + self.turns[0]
        end_at = self.turn_end_at[0] if self.turn_end_at else self.end_at
        return dataclasses.replace(
            self, prompt_tokens=prompt, turns=self.turns[1:], end_at=end_at, turn_end_at=self.turn_end_at[1:]
        )

    @property
    def later_tokens(self) -> int:
        """At most the positions the later turns prefill and generate: each turn's prompt is the one before,
        its answer and the user's ids."""
        out, prompt = 0, len(self.prompt_tokens)
        for ids in self.turns:
            prompt += self.max_new_tokens + len(ids)
            out += prompt + self.max_new_tokens
        return out


class SessionStatus(str, enum.Enum):
    QUEUED = "QUEUED"  # accepted, waiting for a slot
    ADMITTED = "ADMITTED"  # holds a slot, waiting for its prefill
    RUNNING = "RUNNING"  # prefilled, decoding
    FINISHED = "FINISHED"


class DoneReason(str, enum.Enum):
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    CACHE_MISS = "CACHE_MISS"


@dataclass(slots=True)
class Session:
    request: GenerationRequest
    arrival: int  # arrival order: the FIFO key and the batch order
    epoch: int
    submit_ns: int
    admit_ns: int | None = None  # when it got a slot (at submit, or when promoted from the queue)
    admit_tick: int | None = None  # the first tick in which it could be prefilled
    status: SessionStatus = SessionStatus.QUEUED
    tokens: list[int] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)
    runner_ups: list[int | None] = field(default_factory=list)  # each token's second choice
    token_ns: list[int] = field(default_factory=list)
    prefilled: int = 0  # prompt positions already written (chunked prefill: 0 < prefilled < prompt_len)
    cached: int = 0  # of them, taken from the engine's prefix cache instead of computed
    last_decode_tick: int = -1
    done_reason: DoneReason | None = None
    error: str | None = None
    end_tick: int | None = None  # the tick in which it ended (a cancel between ticks: the next one)

    @property
    def session_id(self) -> str:
        return self.request.session_id

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_tokens)

    @property
    def position(self) -> int:
        """Position of the next input token (the last generated one)."""
        return self.prompt_len + len(self.tokens) - 1

    @property
    def has_all_tokens(self) -> bool:
        """Its generation is over: every new token, its pinned length, or a stop token."""
        r = self.request
        if r.end_at is not None:
            return len(self.tokens) >= r.end_at
        return len(self.tokens) >= r.max_new_tokens or bool(self.tokens and self.tokens[-1] in r.stop_tokens)

    def add_token(self, token: int, margin: float, now_ns: int, runner_up: int | None = None) -> None:
        assert self.status is SessionStatus.RUNNING and not self.has_all_tokens, (self.session_id, self.status)
        self.tokens.append(token)
        self.margins.append(margin)
        self.runner_ups.append(runner_up)
        self.token_ns.append(now_ns)

    def finish(self, reason: DoneReason, error: str | None = None) -> None:
        assert self.status is not SessionStatus.FINISHED, f"session {self.session_id} ended twice"
        self.status = SessionStatus.FINISHED
        self.done_reason = reason
        self.error = error
