"""``meshbench bench hunt``: how long a hunt takes to find what a server has, seed after seed. Each seed's hunt
starts on a fresh server (or node) and runs as ``meshbench hunt`` does, to its first finding (a confident difference
shown again; the differences seen once that it checked and went past count in its time): the figure is the time to
find, the histories and requests it took, and which strategy found it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from meshbench.hunt import run as hunting
from meshbench.hunt.execute import Host
from meshbench.records.endpoint_figures import Spread
from meshbench.workload.hunt import Strategy


@dataclass(frozen=True, slots=True, kw_only=True)
class SeedHunt:
    """One seed's hunt, up to its first finding (shown again) or to its budget."""

    seed: int
    found: bool
    seconds: float
    histories: int
    requests: int
    strategy: str | None  # the strategy whose history found it
    seen_once: int  # differences seen once and gone past
    near_tie: float


@dataclass(frozen=True, slots=True)
class HuntBench:
    """``meshbench bench hunt``'s figures (``--json``: this record's fields)."""

    seeds: list[SeedHunt]
    found: int
    time_to_find_s: Spread | None


def run(
    make: Callable[[], Any],
    chosen: list[Strategy],
    seeds: list[int],
    until: Callable[[int, float], bool],
    progress: Callable[[str], None] = lambda m: None,
) -> HuntBench:
    """One hunt per seed, each on a server ``make()`` starts (a context manager yielding the Host)."""
    rows = []
    for seed in seeds:
        with make() as server:
            host: Host = server
            progress(f"seed {seed}")
            h = hunting.hunt(host, chosen, seed, until, progress)
        f = next((x for x in h.findings if x.reproduced), None)
        ran = h.checked if f is None else h.checked[: h.checked.index(f.found) + 1]  # up to the finding
        rows.append(
            SeedHunt(
                seed=seed,
                found=f is not None,
                seconds=round(f.seconds_to_find if f else h.seconds, 1),
                histories=len(ran),
                requests=sum(len(c.history.requests()) for c in ran),
                strategy=f.found.history.strategy if f else None,
                seen_once=sum(not x.reproduced for x in h.findings),
                near_tie=h.threshold,
            )
        )
    found = [r.seconds for r in rows if r.found]
    return HuntBench(seeds=rows, found=len(found), time_to_find_s=Spread.of(found) if found else None)
