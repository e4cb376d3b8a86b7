"""Conversations in verify: a conversation's turns are one session id's epochs, one after another (the next is
submitted once the last completed; a turn lost with its engine and resubmitted takes the next epoch under the
same turn), so a replay of the ticks follows each id from epoch to epoch; and the later turns' submissions
are checked against the turns they follow, a resubmission against the turn it runs again."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Sequence

from meshbench.analysis.checks import Checks
from meshbench.names import RESULTS
from meshbench.records.model import LevelRecord, SessionRecord
from meshbench.records.turns import turn_numbers
from meshbench.results.typed import NodeBundle
from meshbench.scheduler.budget import ACCEPTED


class Current:
    """The record each session id stands for as the ticks are replayed: its first epoch, then (``end``) the
    next one, and so on."""

    def __init__(self, sessions: Sequence[SessionRecord]) -> None:
        self._epochs: dict[str, list[SessionRecord]] = defaultdict(list)
        for s in sorted(sessions, key=lambda s: s.epoch):
            self._epochs[s.session_id].append(s)
        self._at: Counter[str] = Counter()

    def get(self, sid: str) -> SessionRecord | None:
        epochs, k = self._epochs.get(sid, []), self._at[sid]
        return epochs[k] if k < len(epochs) else None

    def end(self, sid: str) -> None:
        self._at[sid] += 1


def check_turns(c: Checks, b: NodeBundle, lv: LevelRecord, at: str) -> None:
    """A conversation's later turns: one submission for each turn that completed with a turn still to come,
    before the tick after it completed, under the next epoch when accepted; each later turn's prompt is the
    last turn's prompt, its answer and the user's ids; a resubmitted turn's request is its lost one's."""
    wl = b.cfg.workload
    c.equal(RESULTS, f"{at}.turn_events (recorded exactly for conversations)", wl.turns > 1, lv.turn_events is not None)
    if lv.turn_events is None:
        return
    by_key = {(s.session_id, s.epoch): s for s in lv.sessions}
    turn = turn_numbers(lv.sessions)
    index = {sid: k for k, sid in enumerate(wl.session_ids())}
    expected = sorted(
        [s.end_tick + 1, s.session_id]
        for s in lv.sessions
        if s.done_reason == "COMPLETED" and turn[s.session_id, s.epoch] < wl.turns and s.end_tick is not None
    )
    c.equal(RESULTS, f"{at}.turn_events (tick, session): one after each turn but the last", expected,
            sorted([e.tick, e.session_id] for e in lv.turn_events))  # fmt: skip
    # the turn each event follows: its session's record that completed in the tick before it
    completed = [s for s in lv.sessions if s.done_reason == "COMPLETED" and s.end_tick is not None]
    done = {(s.session_id, (s.end_tick or 0) + 1): s for s in completed}
    for k, e in enumerate(lv.turn_events):
        accepted = e.decision in ACCEPTED
        before = done.get((e.session_id, e.tick))
        c.equal(
            RESULTS,
            f"{at}.turn_events[{k}].epoch (the next after the turn it follows when accepted, none when refused)",
            (before.epoch + 1 if before is not None else None) if accepted else None,
            e.epoch,
        )
        if accepted:
            prev = by_key.get((e.session_id, (e.epoch or 1) - 1))
            now = by_key.get((e.session_id, e.epoch or 0))
            c.equal(RESULTS, f"{at}.turn_events[{k}]: its turn and the one before are recorded", True,
                    prev is not None and now is not None)  # fmt: skip
            sizes = wl.turn_sizes(index[e.session_id]) if e.session_id in index else ()
            j = turn.get((e.session_id, e.epoch or 0), 0) - 2  # (the user's turn that starts it: turn 2 the first)
            user = sizes[j] if 0 <= j < len(sizes) else None
            want = None if prev is None or user is None else prev.prompt_tokens + len(prev.tokens) + user
            c.equal(
                RESULTS,
                f"{at}.sessions[{e.session_id}#{e.epoch}].prompt_tokens (the last turn's, its answer, the user's)",
                want,
                None if now is None else now.prompt_tokens,
            )
    for s in lv.sessions:  # a turn lost with its engine and resubmitted runs that turn's request again
        lost = by_key.get((s.session_id, s.epoch - 1))
        if lost is not None and turn[lost.session_id, lost.epoch] == turn[s.session_id, s.epoch]:
            c.equal(RESULTS, f"{at}.sessions[{s.session_id}#{s.epoch}] (prompt, new tokens) = its lost turn's",
                    (lost.prompt_tokens, lost.max_new_tokens), (s.prompt_tokens, s.max_new_tokens))  # fmt: skip


def accepted_turns(lv: LevelRecord) -> list[str]:
    """The sessions of the later turns the node accepted."""
    return [e.session_id for e in lv.turn_events or () if e.decision in ACCEPTED]


def refused_turns(lv: LevelRecord) -> int:
    return sum(e.decision not in ACCEPTED for e in lv.turn_events or ())
