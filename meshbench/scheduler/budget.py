"""Node budgets and admission decisions."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass

from meshbench.engine.base import EngineLimits
from meshbench.records.context import Budget


def engine_limits(budget: Budget) -> EngineLimits:
    """What an engine for this node's budget is built for (the engine never sees the budget itself)."""
    return EngineLimits(
        max_active_sessions=budget.max_active_sessions,
        kv_bytes=budget.kv_bytes,
        max_prefill_tokens_per_tick=budget.max_prefill_tokens_per_tick,
    )


class AdmissionReason(str, enum.Enum):
    ADMITTED = "ADMITTED"
    QUEUED = "QUEUED"
    REJECTED_KV_BUDGET = "REJECTED_KV_BUDGET"
    REJECTED_SCRATCH_BUDGET = "REJECTED_SCRATCH_BUDGET"
    REJECTED_QUEUE_FULL = "REJECTED_QUEUE_FULL"
    REJECTED_DUPLICATE = "REJECTED_DUPLICATE"

    @property
    def accepted(self) -> bool:
        return self in (AdmissionReason.ADMITTED, AdmissionReason.QUEUED)


# The decisions that accept a session, as results.json spells them (a record's "decision" field).
ACCEPTED = tuple(r.value for r in AdmissionReason if r.accepted)


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """The decision and the numbers that made it."""

    session_id: str
    reason: AdmissionReason
    kv_needed_bytes: int
    kv_budget_bytes: int
    scratch_needed_bytes: int
    scratch_budget_bytes: int
    active_sessions: int
    active_cap: int
    queue_depth: int
    max_queue_depth: int
    epoch: int | None = None  # the epoch an accepted session runs under (None: refused)

    @property
    def accepted(self) -> bool:
        return self.reason.accepted

    def to_dict(self) -> dict:
        d = asdict(self)
        d["reason"] = self.reason.value
        return d
