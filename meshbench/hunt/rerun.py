"""``meshbench verify --rerun`` for a hunt of meshbench's own node: the hunt run again from its record (the node
config its command names, its seed and strategies), stopped after as many requests as it sent, and every record
compared with the bundle's but its clock (stamps and seconds). The node is deterministic (its scheduler in ticks,
its engine's arithmetic in one process), so a rerun gives every answer, cold answer, calibration pass, finding and
minimal history again, and an answer rewritten in the bundle (a difference made up, a finding hidden, a cold margin
raised) no longer passes. A hunt of llama-server needs that server, and is not rerun."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from meshbench.analysis.checks import Checks
from meshbench.errors import MeshbenchError
from meshbench.hunt import document
from meshbench.hunt import run as hunting
from meshbench.hunt.node import NodeServer
from meshbench.names import RESULTS
from meshbench.records import serial
from meshbench.records.hunt import HuntDocument
from meshbench.workload import hunt as strategies

FACTOR, SLACK_S = 4.0, 2.0  # how far a recorded time may be from the rerun's: a factor, and seconds on top
TIMED = frozenset({"submit_ns", "token_ns", "seconds_to_find", "histories_per_minute"})  # what a clock gave


def rerun(doc: HuntDocument, c: Checks, progress: Callable[[str], None] = lambda m: None) -> None:
    """The hunt in ``doc`` run again on the node, each part compared (the caller has checked ``doc`` first)."""
    s = doc.server
    if not s.node or len(s.args) != 2:
        raise MeshbenchError("a hunt of a server: a rerun needs that server (verify it without --rerun)")
    chosen = strategies.chosen(",".join(doc.strategies))
    sent = doc.summary.requests
    recorded = [f.shrink_tries for f in doc.findings]
    tries = None if None in recorded else [t or 0 for t in recorded]
    with NodeServer(s.args[1]) as server:
        again = hunting.hunt(server, chosen, doc.seed, lambda n, t: n >= sent, progress,
                             shrink_tries=tries)  # fmt: skip
        info = dataclasses.replace(s, build_info=server.build_info, model=server.model)
    redone = document.document(again, info, doc.command, doc.budget)
    c.equal(RESULTS, "server (rerun: the node its config makes)", s, redone.server)
    for part in ("facts", "near_tie", "calibration", "summary"):
        c.equal(RESULTS, f"{part} (rerun)", _timeless(getattr(doc, part)), _timeless(getattr(redone, part)))
    c.equal(RESULTS, "checked (rerun: as many histories)", len(doc.checked), len(redone.checked))
    for k, (was, now) in enumerate(zip(doc.checked, redone.checked)):
        c.equal(RESULTS, f"checked[{k}] (rerun: every answer and cold answer)", _timeless(was), _timeless(now))
    c.equal(RESULTS, "findings (rerun: as many)", len(doc.findings), len(redone.findings))
    for k, (was_f, now_f) in enumerate(zip(doc.findings, redone.findings)):
        c.equal(RESULTS, f"findings[{k}] (rerun: its confirmations, minimal history and its runs)", _timeless(was_f),
                _timeless(now_f))  # fmt: skip
    _clock(c, doc, redone)
    c.notes.append(f"rerun on the node: {len(redone.checked)} histories, {redone.summary.requests} requests, "
                   "every record compared but its clock")  # fmt: skip


def _clock(c: Checks, doc: HuntDocument, redone: HuntDocument) -> None:
    """What a clock gave, within a factor of the rerun's on this machine (a shared machine's noise is some tens of
    per cent; a hunt truncated to look long, or its stamps scaled to look fast, is many times off)."""
    pairs = [("seconds", doc.seconds, redone.seconds)]
    pairs += [(f"findings[{k}].seconds_to_find", a.seconds_to_find, b.seconds_to_find)
              for k, (a, b) in enumerate(zip(doc.findings, redone.findings))]  # fmt: skip
    took = sum(x.least_seconds() for _, x in doc.runs())
    pairs += [("the answers' stamps (the least the runs took)", took, sum(x.least_seconds() for _, x in redone.runs()))]
    for what, was, now in pairs:
        c.equal(RESULTS, f"{what} (rerun: within {FACTOR}x and {SLACK_S:g} s of the rerun's {now:.1f} s)", True,
                now / FACTOR - SLACK_S <= was <= now * FACTOR + SLACK_S)  # fmt: skip


def _timeless(record: object) -> Any:
    """A record as JSON values without what a clock gave it: stamps, the seconds to a finding, a rate per minute."""
    return _without_clock(serial.to_json(record))


def _without_clock(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_clock(v) for k, v in value.items() if k not in TIMED}
    if isinstance(value, list):
        return [_without_clock(v) for v in value]
    return value
