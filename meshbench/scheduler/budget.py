"""Node budgets and admission decisions."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass

from meshbench.engine.base import EngineLimits
from meshbench.errors import MeshbenchError
from meshbench.records.context import Budget


@dataclass(frozen=True, slots=True)
class NodeBudget(Budget):
    """What one node may hold (the fields are the budget record's, meshbench.records.context.Budget), checked,
    with what the scheduler derives from it. Byte budgets are totals for the node.

    weight_bytes is reported beside the engine's resident weights, not enforced: a node
    that loaded the model has already paid it.
    """

    def __post_init__(self) -> None:
        for name in (
            "weight_bytes",
            "kv_bytes",
            "scratch_bytes",
            "max_active_sessions",
            "max_batch_size",
            "max_prefill_tokens_per_tick",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise MeshbenchError(f"budget: {name} must be a positive integer, got {value!r}")
        if not isinstance(self.max_queue_depth, int) or self.max_queue_depth < 0:
            raise MeshbenchError(f"budget: max_queue_depth must be an integer >= 0, got {self.max_queue_depth!r}")
        if self.max_batch_size > self.max_active_sessions:
            raise MeshbenchError(
                f"budget: max_batch_size {self.max_batch_size} exceeds max_active_sessions "
                f"{self.max_active_sessions}: no tick could ever fill such a batch"
            )

    def effective_active_cap(self, scratch_bytes_per_session: int) -> int:
        """Active slots: the tighter of max_active_sessions and the scratch envelope."""
        assert scratch_bytes_per_session > 0, scratch_bytes_per_session
        return min(self.max_active_sessions, self.scratch_bytes // scratch_bytes_per_session)

    def engine_limits(self) -> EngineLimits:
        """What an engine for this node is built for (the engine never sees the budget itself)."""
        return EngineLimits(
            max_active_sessions=self.max_active_sessions,
            kv_bytes=self.kv_bytes,
            max_prefill_tokens_per_tick=self.max_prefill_tokens_per_tick,
        )

    def to_dict(self) -> dict:
        return asdict(self)


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
