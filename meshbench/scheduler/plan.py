"""What one tick of the scheduler decides (``TickPlan``), and what a cancellation answers."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshbench.engine.base import DecodeItem, PrefillChunk
from meshbench.scheduler.session import Session

# whole: whole prompts within the budget; chunked: the budget filled exactly; burst and chunked-burst: whole or
# chunked, but every admitted prompt in a tick where no session decodes (no one's inter-token latency is at stake
# then: the budget bounds how long a tick stalls the decoding sessions)
PREFILL_POLICIES = ("whole", "chunked", "burst", "chunked-burst")


def chunks(policy: str) -> bool:
    """The policy splits prompts to fill the budget exactly."""
    return policy.startswith("chunked")


def bursts(policy: str) -> bool:
    """The policy prefills every waiting prompt in a tick where no session decodes."""
    return policy.endswith("burst")


@dataclass(frozen=True, slots=True)
class CancelResult:
    session_id: str
    cancelled: bool
    detail: str  # "cancelled", "unknown session", "already finished: COMPLETED", ...


@dataclass(slots=True)
class TickPlan:
    """One tick's decisions, then (filled by ``apply``) what came of them."""

    tick: int
    started_ns: int
    decode: list[Session]  # the decode batch, in arrival order
    prefill: list[tuple[Session, int, int]]  # (session, first position, tokens) to prefill, first in first out
    down: str | None  # no engine any more (the loss's cause): the prefill work fails with it
    feed: list[DecodeItem]  # what each decoding session feeds the engine: its last token, at the next position
    chunks: list[PrefillChunk]  # the prefill work as the engine takes it
    decoded: int = 0
    prefilled: list[Session] = field(default_factory=list)  # sessions whose prompt's last piece ran
    pieces: list[tuple[str, int, int]] = field(default_factory=list)  # (session, start, tokens) written
    finished: list[Session] = field(default_factory=list)
    promoted: list[Session] = field(default_factory=list)
    decode_ns: int = 0
    prefill_ns: int = 0
    cached: int = 0  # prompt positions the engine took from its prefix cache

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill
