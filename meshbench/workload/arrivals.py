"""When sessions arrive: all at once, a Poisson or gamma process at a rate, or an explicit trace.

On the tick clock a rate is in sessions per tick and an arrival is the tick before which
the session is submitted (floor of its arrival time); the first session arrives at time
0 and the gaps that follow are drawn from ``seed`` (exponential for Poisson; gamma with
shape 1/CV^2 and mean 1/rate, as vLLM's ``--burstiness``). A trace names each session's
arrival tick. Sampled ticks are recorded in results.json so that anyone can recompute a run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshbench import files, limits
from meshbench.errors import MeshbenchError

MAX_TICK = 10_000_000  # an arrival beyond this is a typo, not a workload


@dataclass(frozen=True, slots=True)
class Arrivals:
    kind: str
    rate: float | None = None  # sessions per tick (poisson, gamma)
    cv: float | None = None  # gamma: coefficient of variation of the gaps
    trace: tuple[int, ...] | None = None  # trace: one arrival tick per session

    @property
    def all_at_once(self) -> bool:
        return self.kind == "all-at-once"

    def with_rate(self, rate: float) -> "Arrivals":
        if self.kind not in ("poisson", "gamma"):
            raise MeshbenchError(f"--rates needs a poisson or gamma arrival process, not {self.kind}")
        return Arrivals(self.kind, _rate(rate, "--rates"), self.cv)

    def label(self) -> str:
        """The process exactly, as ``parse`` reads it back: rates in full precision (repr round-trips a
        float), a trace as its ticks (a trace file's content, not its name)."""
        if self.kind == "poisson":
            return f"poisson:{self.rate!r}"
        if self.kind == "gamma":
            return f"gamma:{self.rate!r}:{self.cv!r}"
        if self.kind == "trace":
            return "trace:" + ",".join(map(str, self.trace or ()))
        return self.kind

    def ticks(self, sessions: int, seed: int) -> list[int]:
        """Each session's arrival tick (tick clock), in session order."""
        return [int(t) for t in np.floor(self.times(sessions, seed))]

    def seconds(self, sessions: int, seed: int) -> list[float]:
        """Arrival times on the wall clock: a rate in sessions per second; a trace in milliseconds."""
        scale = 1e-3 if self.kind == "trace" else 1.0
        return [t * scale for t in self.times(sessions, seed)]

    def times(self, sessions: int, seed: int) -> list[float]:
        """Each session's arrival time in the clock's unit (ticks; on the wall clock seconds, a trace in ms)."""
        if self.kind == "all-at-once":
            return [0.0] * sessions
        if self.kind == "trace":
            trace = self.trace or ()
            if len(trace) != sessions:
                raise MeshbenchError(f"arrivals: the trace has {len(trace)} ticks for {sessions} sessions")
            return [float(t) for t in trace]
        assert self.rate is not None  # (parse: poisson and gamma have a rate, gamma a cv)
        rng = np.random.default_rng([seed, 0xA7])  # a stream of its own: the prompts keep theirs
        if self.kind == "poisson":
            gaps = rng.exponential(1.0 / self.rate, sessions - 1)  # (sessions - 1,)
        else:
            assert self.cv is not None
            shape = 1.0 / (self.cv * self.cv)
            gaps = rng.gamma(shape, 1.0 / (self.rate * shape), sessions - 1)  # (sessions - 1,)
        times = np.concatenate([[0.0], np.cumsum(gaps)])  # (sessions,)
        if times[-1] > MAX_TICK:
            raise MeshbenchError(f"arrivals {self.label()}: the last session would arrive after {MAX_TICK} ticks")
        return [float(t) for t in times]


def parse(spec: str, where: str = "arrivals") -> Arrivals:
    """``all-at-once``, ``poisson:RATE``, ``gamma:RATE:CV``, ``trace:T0,T1,...`` or ``trace:FILE``."""
    kind, _, rest = spec.strip().partition(":")
    if kind == "all-at-once" and not rest:
        return Arrivals("all-at-once")
    if kind == "poisson":
        return Arrivals("poisson", _rate(rest, where))
    if kind == "gamma":
        rate, _, cv = rest.partition(":")
        c = _number(cv, f"{where}: gamma CV")
        if not 0.05 <= c <= 20:
            raise MeshbenchError(f"{where}: gamma CV {cv!r} must be between 0.05 and 20")
        return Arrivals("gamma", _rate(rate, where), c)
    if kind == "trace" and rest:
        return Arrivals("trace", trace=_trace(rest, where))
    raise MeshbenchError(
        f"{where}: {spec!r} is not one of all-at-once, poisson:RATE, gamma:RATE:CV, trace:T0,T1,... or trace:FILE"
    )


def _number(text: str, what: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise MeshbenchError(f"{what}: {text!r} is not a number") from None
    if not np.isfinite(x):
        raise MeshbenchError(f"{what}: {text!r} is not a finite number")
    return x


def _rate(text, where: str) -> float:
    r = _number(str(text), f"{where}: rate")
    if not 1e-4 <= r <= 1e4:
        raise MeshbenchError(f"{where}: rate {text!r} must be between 0.0001 and 10000 sessions per tick")
    return r


def _trace(text: str, where: str) -> tuple[int, ...]:
    # A list of numbers (even a wrong one: 1.5 is refused as not whole, not looked up as a file), else a file:
    # one tick per line or comma separated.
    if not (set(text) <= set("0123456789,-+.eE \t") and any(ch.isdigit() for ch in text)):
        text = files.read_text(text, "arrival trace", 1 << 20).replace("\n", ",")
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items or len(items) > limits.MAX_SESSIONS:
        raise MeshbenchError(f"{where}: a trace needs 1 to {limits.MAX_SESSIONS} arrival ticks")
    try:
        ticks = tuple(int(t) for t in items)
    except ValueError:
        raise MeshbenchError(f"{where}: trace entries must be whole tick numbers") from None
    bad = [t for t in ticks if not 0 <= t <= MAX_TICK]
    if bad:
        raise MeshbenchError(f"{where}: trace tick {bad[0]} is not between 0 and {MAX_TICK}")
    return ticks
