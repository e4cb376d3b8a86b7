"""Which turn of its conversation each session record is.

A session's records, in epoch order, are its turns, except that a turn lost with its engine and resubmitted
after a restart takes the next epoch under the same turn. A next turn is submitted only after a turn
completed, and a resubmission follows only a lost (FAILED) one, so a record's turn is one more than the
COMPLETED records of its session in earlier epochs. A single-turn session is turn 1 in every epoch.
"""

from __future__ import annotations

from typing import Iterable

from meshbench.records.model import SessionRecord


def turn_numbers(sessions: Iterable[SessionRecord]) -> dict[tuple[str, int], int]:
    """Each record's turn, by (session, epoch)."""
    out: dict[tuple[str, int], int] = {}
    done: dict[str, int] = {}
    for s in sorted(sessions, key=lambda s: (s.session_id, s.epoch)):
        out[s.session_id, s.epoch] = done.get(s.session_id, 0) + 1
        done[s.session_id] = done.get(s.session_id, 0) + (s.done_reason == "COMPLETED")
    return out


def by_turn(sessions: Iterable[SessionRecord]) -> dict[tuple[str, int], SessionRecord]:
    """Each (session, turn)'s last record: the one that ran it to its end (a lost turn's resubmission)."""
    records = list(sessions)
    turn = turn_numbers(records)
    return {(s.session_id, turn[s.session_id, s.epoch]): s for s in sorted(records, key=lambda s: s.epoch)}
