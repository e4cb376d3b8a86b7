"""Fault specs: what ``sweep --inject`` (YAML ``faults``) asks a run to suffer, and when.

One spec per fault, ``KIND[:TARGET]@TICK``:

- ``cancel:SESSION@T``   cancel the session before tick T (queued, awaiting prefill, or decoding);
- ``evict:SESSION@T``    drop the session's KV behind the scheduler's back before tick T: its next
  decode is a cache miss (the CACHE_MISS path);
- ``raise:prefill@T``, ``raise:decode@T``   an exception inside the first such engine call at or
  after tick T;
- ``kill-engine@T``      SIGKILL the engine process before tick T (needs ``--isolate``);
- ``abort-engine@T``     the engine process aborts inside the first decode call at or after tick T;
- ``kill-worker:I@T``    SIGKILL spawned RPC worker I before tick T (needs ``engine.workers``).

A row is one or more specs joined by commas; every row is run at every level.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from meshbench.errors import MeshbenchError


class FaultKind(str, enum.Enum):
    """What a fault does (its value is how a spec and results.json spell it)."""

    CANCEL = "cancel"
    EVICT = "evict"
    RAISE = "raise"
    KILL_ENGINE = "kill-engine"
    ABORT_ENGINE = "abort-engine"
    KILL_WORKER = "kill-worker"

    @property
    def needs_process(self) -> bool:
        """It acts on the engine's own process (or its workers): the engine must be isolated."""
        return self in (FaultKind.KILL_ENGINE, FaultKind.ABORT_ENGINE, FaultKind.KILL_WORKER)

    @property
    def on_session(self) -> bool:
        """It ends one named session (cancel, evict)."""
        return self in (FaultKind.CANCEL, FaultKind.EVICT)


SPEC = re.compile(r"^(?P<kind>[a-z-]+)(?::(?P<target>[^@,\s]+))?@(?P<tick>\d{1,9})$")
TARGETS = {
    FaultKind.CANCEL: "session",
    FaultKind.EVICT: "session",
    FaultKind.RAISE: "call",
    FaultKind.KILL_ENGINE: None,
    FaultKind.ABORT_ENGINE: None,
    FaultKind.KILL_WORKER: "worker",
}
MAX_FAULTS_PER_ROW = 64


@dataclass(frozen=True, slots=True)
class Fault:
    kind: FaultKind
    target: str | int | None
    tick: int

    @property
    def label(self) -> str:
        return f"{self.kind.value}{'' if self.target is None else f':{self.target}'}@{self.tick}"

    @property
    def between_ticks(self) -> bool:
        """Applied before its tick runs; the others fire inside an engine call."""
        return self.kind not in (FaultKind.RAISE, FaultKind.ABORT_ENGINE)

    @property
    def call(self) -> str | None:
        """The engine call it fires in: "prefill" or "decode" (None: between ticks)."""
        if self.kind is FaultKind.RAISE:
            return self.target if isinstance(self.target, str) else None
        return "decode" if self.kind is FaultKind.ABORT_ENGINE else None


def parse(spec: str, where: str = "--inject") -> Fault:
    m = SPEC.match(spec.strip())
    if not m or m.group("kind") not in {k.value for k in FaultKind}:
        kinds = ", ".join(k.value for k in FaultKind)
        raise MeshbenchError(f"{where}: {spec!r} is not a fault (KIND[:TARGET]@TICK; kinds: {kinds})")
    kind, target, tick = FaultKind(m.group("kind")), m.group("target"), int(m.group("tick"))
    want, name = TARGETS[kind], kind.value
    if want is None and target is not None:
        raise MeshbenchError(f"{where}: {spec!r}: {name} takes no target ({name}@TICK)")
    if want is not None and target is None:
        raise MeshbenchError(f"{where}: {spec!r}: {name} needs a {want} ({name}:{want.upper()}@TICK)")
    if want == "call" and target not in ("prefill", "decode"):
        raise MeshbenchError(f"{where}: {spec!r}: raise takes prefill or decode")
    if want == "worker":
        if not target.isdigit():
            raise MeshbenchError(f"{where}: {spec!r}: kill-worker takes a worker index (0, 1, ...)")
        target = int(target)
    return Fault(kind, target, tick)


def parse_row(row: str, where: str = "--inject") -> tuple[Fault, ...]:
    """One row: specs joined by commas, in the order given."""
    specs = [x for x in row.split(",") if x.strip()]
    if not specs:
        raise MeshbenchError(f"{where}: an empty fault row")
    if len(specs) > MAX_FAULTS_PER_ROW:
        raise MeshbenchError(f"{where}: {len(specs)} faults in one row (at most {MAX_FAULTS_PER_ROW})")
    return tuple(parse(x, where) for x in specs)


def check_rows(
    rows: tuple[tuple[Fault, ...], ...], session_ids: set[str], isolate: bool, workers: int, where: str
) -> None:
    """Each fault names something the run has: a session of the workload, a process, a spawned worker."""
    for row in rows:
        for f in row:
            if f.kind.on_session and f.target not in session_ids:
                raise MeshbenchError(f"{where}: {f.label}: no session {f.target!r} in the workload")
            if f.kind.needs_process and not isolate:
                raise MeshbenchError(f"{where}: {f.label} needs the engine in its own process (--isolate)")
            if f.kind is FaultKind.KILL_WORKER and isinstance(f.target, int) and f.target >= workers:
                raise MeshbenchError(
                    f"{where}: {f.label}: the run spawns {workers} RPC worker(s) "
                    "(engine.workers); worker indexes count from 0"
                )
