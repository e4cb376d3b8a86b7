"""The model of correct behaviour: a request's answer is its cold answer, the same request alone on the idle
server with nothing taken from its prompt cache (``cache_prompt`` false), asked once per distinct request and
kept for the hunt. The server's own numerics (how far a margin moves between two runs of one request whose
answers agree) come from calibration: a few requests cold twice and once warm, right after themselves
(meshbench.analysis.endpoint_margins.near_tie: measured, at least the floor, at most the cap)."""

from __future__ import annotations

import dataclasses

from meshbench.analysis import endpoint_margins as margins
from meshbench.hunt.execute import Target
from meshbench.records.completion import Completion
from meshbench.records.history import Facts, Request
from meshbench.records.margins import MarginPasses
from meshbench.workload.hunt import calibration


class Oracle:
    def __init__(self, target: Target) -> None:
        self.target = target
        self.memo: dict[tuple[object, ...], Completion] = {}
        self.asked = 0  # cold requests sent (not taken from the memo)

    def cold(self, r: Request) -> Completion:
        key = r.key()
        if key not in self.memo:
            alone = dataclasses.replace(r, cancel_at=None)
            self.memo[key] = self.target.at_once([alone], cache_prompt=False)[r.name]
            self.asked += 1
        return self.memo[key]

    def with_target(self, target: Target) -> Oracle:
        """The same memo on another process of the same server (cold answers do not depend on its state)."""
        o = Oracle(target)
        o.memo, o.asked = self.memo, self.asked
        return o


def calibrate(target: Target, facts: Facts, seed: int) -> MarginPasses:
    """The calibration requests (workload.hunt.calibration), each cold (alone), all at once cold (one batch: what
    batching does to the arithmetic) and warm (right after itself, through the prompt cache): the passes the
    server's numerics are measured from (cold against together and against warm)."""
    requests = calibration(facts, seed)
    cold = [target.at_once([r], cache_prompt=False)[r.name] for r in requests]
    together = target.at_once(requests, cache_prompt=False)
    warm = [target.at_once([r])[r.name] for r in requests]
    return MarginPasses(cold=cold, warm=warm, together=[together[r.name] for r in requests])


def threshold(passes: MarginPasses) -> float:
    return margins.near_tie(passes)
