"""A hunt's results.json as records (hunt.schema.json): the server it ran against, its seed, strategies and budget,
the facts its histories were drawn for, the calibration passes, every run (a history, each answer, each judged
request's cold answer) and each finding's runs. The hunt builds one ``HuntDocument``; ``records.serial`` writes it
and reads it back, and verify, the README and a rerun read its fields, never the JSON's keys."""

from __future__ import annotations

from dataclasses import dataclass

from meshbench.records import history
from meshbench.records.completion import Completion
from meshbench.records.context import Environment
from meshbench.records.history import Facts, History, Request

NODE = "node"  # server.kind of meshbench's own node (else the llama-server it ran against)


@dataclass(frozen=True, slots=True, kw_only=True)
class HuntServer:
    """What the hunt ran against: meshbench's node or a llama-server, whether meshbench started it, and what it says
    it is."""

    kind: str  # "node" or "llama-server"
    launched: bool
    build_info: str | None
    model: str | None
    args: list[str]  # the node's ["--config", PATH]; a server's flags
    total_slots: int | None  # as the server says (None: it says none)

    @property
    def node(self) -> bool:
        return self.kind == NODE

    def said(self) -> tuple[str, str]:
        """Where its cold answers come from and where its findings run again, in the words its bundle records: the
        node's (always started by meshbench), or a server's, started by meshbench or not."""
        if self.node:
            return history.NODE_COLD, history.NODE_REPLAYS
        return history.SERVER_COLD, history.SERVER_FRESH if self.launched else history.SERVER_SAME


@dataclass(frozen=True, slots=True, kw_only=True)
class HuntBudget:
    """``--budget``: a time or a number of requests (the other None)."""

    seconds: float | None
    requests: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """The near-tie threshold's passes: the requests c0.. sent cold one by one, all at once, and warm."""

    cold: list[Completion]
    together: list[Completion]
    warm: list[Completion]


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """A history as it ran: its answers, one per request in order, and a cold answer for each judged request (one
    its client did not cancel), in order."""

    history: History
    answers: list[Completion]
    cold: list[Completion]

    def judged(self) -> list[Request]:
        """The requests whose answers are held to a cold one: those no client cancelled."""
        return [r for r in self.history.requests() if r.cancel_at is None]

    def least_seconds(self) -> float:
        """The least time the run can have taken: each step's requests are stamped from when the step was sent, so
        a step took at least its latest stamp, and the steps ran one after another."""
        by = {a.session_id: a.token_ns for a in self.answers}
        return sum(max((max(by.get(r.name) or [0]) for r in s.requests), default=0) for s in self.history.steps) / 1e9


@dataclass(frozen=True, slots=True, kw_only=True)
class FindingRecord:
    """A history judged confident (``checked``: its place among the runs checked), run again, shrunk, and its
    minimal history run again."""

    checked: int
    seconds_to_find: float
    confirmations: list[Run]
    minimal: Run
    minimal_confirmations: list[Run]
    shrink_tries: int | None = None  # candidates the shrink ran (None: a bundle from before it was recorded)

    def settling(self) -> list[Run]:
        """Every run after the finding's own: its confirmations, its minimal history and that one's."""
        return [*self.confirmations, self.minimal, *self.minimal_confirmations]


@dataclass(frozen=True, slots=True, kw_only=True)
class Coverage:
    """One strategy's share of the hunt."""

    histories: int
    requests: int
    cache_hits: int  # answers the server served partly from its prompt cache, beyond the first id
    ids_reused: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HuntSummary:
    histories: int
    requests: int
    histories_per_minute: float
    outcomes: dict[str, int]  # answers per outcome (analysis.hunt's)
    coverage: dict[str, Coverage]  # by strategy


@dataclass(frozen=True, slots=True, kw_only=True)
class HuntDocument:
    """A hunt bundle's results.json, whole."""

    kind: str
    schema_version: int
    meshbench_version: str
    created_at: str
    command: str
    environment: Environment
    server: HuntServer
    seed: int
    strategies: list[str]
    budget: HuntBudget
    facts: Facts
    calibration: Calibration
    near_tie: float
    cold_answers: str  # where its cold answers come from, in the server's words (HuntServer.said)
    replays_on: str  # where a finding runs again
    seconds: float
    checked: list[Run]
    findings: list[FindingRecord]
    summary: HuntSummary

    def runs(self) -> list[tuple[str, Run]]:
        """Every run in the bundle, named where it is: the histories checked, then each finding's."""
        out = [(f"checked[{k}]", x) for k, x in enumerate(self.checked)]
        for k, f in enumerate(self.findings):
            out += [(f"findings[{k}].confirmations[{j}]", x) for j, x in enumerate(f.confirmations)]
            out += [(f"findings[{k}].minimal", f.minimal)]
            out += [(f"findings[{k}].minimal_confirmations[{j}]", x) for j, x in enumerate(f.minimal_confirmations)]
        return out
