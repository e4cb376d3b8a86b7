"""The server's request gauges sampled while a pass runs: how many requests hold a slot and how many wait for
one (llama-server's ``requests_processing`` and ``requests_deferred``). A scrape after a pass only sees an idle
server, so a thread reads ``/metrics`` every ``SAMPLE_INTERVAL_S`` from the pass's start to its end.

Each scrape is one small request to the server: llama-server answers it between two decode steps, from
counters it already keeps. A scrape that fails or lacks the gauges is skipped; a server that never gives them
gives no samples (None)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

from meshbench.analysis.server_accounting import SAMPLE_INTERVAL_S
from meshbench.endpoint.client import Endpoint
from meshbench.records.model import GaugeSample

PROCESSING, DEFERRED = "llamacpp:requests_processing", "llamacpp:requests_deferred"


class Samples:
    """What a sampler read; ``within(wall_s)`` once it has stopped: the samples sent within the pass (its wall
    time from ``t0``), or None."""

    def __init__(self) -> None:
        self._found: list[GaugeSample] = []

    def add(self, sample: GaugeSample) -> None:
        self._found.append(sample)

    def within(self, wall_s: float) -> list[GaugeSample] | None:
        kept = [s for s in self._found if s.t_ms <= wall_s * 1e3]
        return kept or None


def _sample(metrics: dict | None, t_ms: float) -> GaugeSample | None:
    """The gauges of one scrape (None: missing, or not a count)."""
    found = [] if metrics is None else [metrics.get(k) for k in (PROCESSING, DEFERRED)]
    counts = [int(v) for v in found if isinstance(v, float | int) and v >= 0 and float(v).is_integer()]
    if len(counts) != 2:
        return None
    return GaugeSample(t_ms=round(t_ms, 3), processing=counts[0], deferred=counts[1])


@contextmanager
def sampled(endpoint: Endpoint, t0: int) -> Iterator[Samples]:
    """Sample the gauges every SAMPLE_INTERVAL_S, times in ms from ``t0`` (the pass's start, monotonic ns), until the
    block ends."""
    out, stop = Samples(), threading.Event()

    def run() -> None:
        while not stop.wait(SAMPLE_INTERVAL_S):
            t_ms = (time.monotonic_ns() - t0) / 1e6
            found = _sample(endpoint.metrics(), t_ms)
            if found is not None:
                out.add(found)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()  # (a scrape is bounded by the client's probe timeout)
