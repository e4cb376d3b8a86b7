"""The fault matrix of a bundle's README: one row per injected fault per level, rendered from
results.json alone, with the verdict of each of verify's fault checks for that level."""

from __future__ import annotations

from meshbench.analysis import fault_matrix as fault_checks
from meshbench.records.model import FaultEvent, LevelRecord
from meshbench.results.typed import NodeBundle

HEADING = "## Fault matrix (deterministic; verify checks every column)"
TABLE_HEADER = (
    "| level | fault | fired at tick | where it hit | what happened | " + " | ".join(fault_checks.CHECKS) + " |"
)


def table_rows(b: NodeBundle) -> list[list[str]]:
    rows = []
    levels = b.levels
    reference = b.results.reference or levels[0]
    per_token = b.results.engine.kv_bytes_per_token
    for lv in levels:
        if not lv.faults:
            continue
        verdicts = fault_checks.verdicts(lv, reference, per_token)
        checks = [{True: "yes", False: "NO", None: "n/a"}[ok] for ok in verdicts.values()]
        for e in lv.fault_events:
            rows.append([str(lv.concurrency), f"`{e.fault}`", str(e.tick), e.hit, outcome(e, lv), *checks])
    return rows


def outcome(event: FaultEvent, lv: LevelRecord) -> str:
    """What the fault did, in words: the sessions it ended, the cause, and how resubmissions ended."""
    if not event.sessions:
        return "no effect"
    by_end: dict[str, list[str]] = {}
    for s in event.sessions:
        later = event.cause and s.error != event.cause  # failed afterwards, with no engine to run on
        end = (
            f"{s.done_reason} ({event.cause}{', later: not restarted' if later else ''})"
            if event.cause
            else s.done_reason
        )
        by_end.setdefault(end, []).append(_name(s.session_id, s.epoch))
    parts = [f"{', '.join(ids)} {end}" for end, ids in by_end.items()]
    if event.resubmitted:
        ends: dict[tuple[str, int | None], str] = {(s.session_id, s.epoch): s.done_reason for s in lv.sessions}
        again = [
            f"{_name(r.session_id, r.epoch)} {ends.get((r.session_id, r.epoch), r.decision)}" for r in event.resubmitted
        ]
        parts.append("resubmitted: " + ", ".join(again))
    return "; ".join(parts)


def _name(session_id: str, epoch: int | None) -> str:
    return session_id if epoch in (1, None) else f"{session_id}#{epoch}"


def section(b: NodeBundle) -> list[str]:
    rows = table_rows(b)
    if not rows:
        return []
    policy = (
        "a lost engine is replaced (a fresh process, and fresh workers when the run spawned them) and its "
        "sessions resubmitted under a new epoch"
        if b.cfg.restart_engine
        else "no restart: a lost engine stays lost for the rest of the pass, and every session that needs it "
        "fails; the next pass gets a fresh one"
    )
    isolated = "in its own process behind a proxy" if b.results.engine.isolated else "in the node's process"
    kv = (
        "with the prefix cache a shared block is counted once, in the cache, whose unreferenced blocks outlive the "
        "sessions: the engine's KV bytes lie at every tick between the cache's and the running sessions' positions "
        "plus the cache's, and at the end are the cache's exactly (every session's own KV released)."
        if b.cfg.engine.prefix_cache
        else "the engine's KV bytes equal the running sessions' positions at every tick (at most, after an "
        "eviction) and are zero at the end."
    )
    epoch = "second epoch. The reference is each session run alone without faults"
    if b.cfg.workload.turns > 1:
        how = (
            "second epoch: a conversation's turns take one epoch each, and a turn lost with its engine and "
            "resubmitted takes the next one, under the same turn (a turn a fault ended ends its conversation)"
            if b.cfg.restart_engine
            else "second turn (a conversation's turns are its epochs; a turn a fault ended ends its conversation)"
        )
        epoch = f"{how}. The reference is every conversation at one client without faults, turn by turn"
    later = " + later turns" if b.cfg.workload.turns > 1 else ""
    return [
        HEADING,
        "",
        f"The engine runs {isolated}; policy: {policy}. Every fault row runs at every level; a session named "
        f"`s3#2` is session s3's {epoch}.",
        "",
        TABLE_HEADER,
        "|" + "---|" * (5 + len(fault_checks.CHECKS)),
        *["| " + " | ".join(r) + " |" for r in rows],
        "",
        "ends once: each session ends exactly once per epoch, with a cause when it failed, as its fault event "
        f"says. KV to zero: {kv} untouched / resubmitted identical: every session no fault ended, and every "
        "resubmitted one, completed with the reference's tokens, byte for byte (one the node itself evicted "
        "under KV pressure, with the tokens it had made a start of the reference's). accounting: arrivals + "
        f"resubmissions{later} = completed + cancelled + failed + cache misses + rejected, and the "
        "scheduler's counters equal the records.",
        "",
    ]
