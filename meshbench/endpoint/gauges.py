"""The server's request gauges sampled while a pass runs: how many requests hold a slot and how many wait for
one (llama-server's ``requests_processing`` and ``requests_deferred``). A scrape after a pass only sees an idle
server, so a thread reads ``/metrics`` every ``SAMPLE_INTERVAL_S`` (after the pass's start, then after each
answer) until the pass ends.

Each scrape is one small request that llama-server answers on its main loop between two decode steps, from
state it already keeps. It also restarts the server's throughput buckets (``prompt_tokens_seconds``,
``predicted_tokens_seconds``): in a pass's ``metrics_after`` they cover the last scrape's interval, not the pass
(meshbench reports its counters, never those). A scrape that fails or lacks the gauges is a sample missed (a
gap in the times); a server that never gives them gives no samples (None)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

from meshbench.analysis.server_accounting import GAUGE_KEYS, SAMPLE_INTERVAL_S
from meshbench.endpoint.client import Endpoint
from meshbench.records.model import GaugeSample


class Samples:
    """What a sampler read; ``within(wall_s)`` once it has stopped: the samples sent within the pass (its wall
    time from ``t0``), or None."""

    def __init__(self) -> None:
        self._found: list[GaugeSample] = []

    def add(self, sample: GaugeSample) -> None:
        self._found.append(sample)

    def within(self, wall_s: float) -> list[GaugeSample] | None:
        kept = [s for s in self._found if s.answer_ms <= wall_s * 1e3]
        return kept or None


def _sample(metrics: dict | None, t_ms: float, answer_ms: float) -> GaugeSample | None:
    """The gauges of one scrape (None: missing, or not a count)."""
    found = [] if metrics is None else [metrics.get(k) for k in GAUGE_KEYS]
    counts = [int(v) for v in found if isinstance(v, float | int) and v >= 0 and float(v).is_integer()]
    if len(counts) != 2:
        return None
    return GaugeSample(t_ms=round(t_ms, 3), answer_ms=round(answer_ms, 3), processing=counts[0], deferred=counts[1])


def _ms(t0: int) -> float:
    return (time.monotonic_ns() - t0) / 1e6


@contextmanager
def sampled(endpoint: Endpoint, t0: int, on: bool = True) -> Iterator[Samples]:
    """Sample the gauges SAMPLE_INTERVAL_S after ``t0`` (the pass's start, monotonic ns) and after each answer,
    times in ms from ``t0``, until the block ends (``on`` false: nothing is read, no samples: engine.gauges).
    The waits run to a deadline on the monotonic clock, so no wall-clock step can shorten one."""
    out, stop = Samples(), threading.Event()
    if not on:
        yield out
        return

    def run() -> None:
        due = t0 / 1e6 + SAMPLE_INTERVAL_S * 1e3
        while not stop.is_set():
            left_ms = due - time.monotonic_ns() / 1e6
            if left_ms > 0:
                stop.wait(left_ms / 1e3)
                continue
            t_ms = _ms(t0)
            try:
                found = _sample(endpoint.metrics(), t_ms, _ms(t0))
            except Exception:  # noqa: BLE001 - a scrape that fails in any way is a sample missed, never the pass's
                found = None
            if found is not None:
                out.add(found)
            due = time.monotonic_ns() / 1e6 + SAMPLE_INTERVAL_S * 1e3

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()  # (a scrape is bounded by the client's probe timeouts: 10 s to connect, then 10 s to answer)
