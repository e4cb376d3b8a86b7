"""Canaries (meshbench.analysis.canary): codes drawn from the seed, distinct across a sweep; every answer searched
for every code but its own, in text and ids; a hit names both sessions; no echo means not judged."""

from __future__ import annotations

from meshbench.analysis import canary
from meshbench.records.model import Completion, EndpointLevel


def _answer(sid: str, text: str = "", tokens: list[int] | None = None) -> Completion:
    return Completion(session_id=sid, submit_ns=0, tokens=tokens or [], text=text, token_ns=[], stop="limit",
                      predicted=None, evaluated=None, error=None)  # fmt: skip


def _level(c: int, codes: list[str], answers: list[Completion], ids: list[list[int]] | None = None) -> EndpointLevel:
    sessions = [f"s{i}" for i in range(c)]
    ids = ids or [[] for _ in sessions]
    return EndpointLevel(
        concurrency=c,
        repetitions=[],
        needle=[],
        figures={},
        canary=canary.run_record(sessions, codes, ids, [[] for _ in sessions], answers, canary.ids_usable(ids)),
    )


def test_codes_are_drawn_from_the_seed_and_distinct_across_the_sweep():
    a, b = canary.canaries(3, [1, 4, 8]), canary.canaries(3, [8, 1, 4])
    assert a == b and [len(a[c]) for c in (1, 4, 8)] == [1, 4, 8]
    every = [x for codes in a.values() for x in codes]
    assert len(set(every)) == 13 and all(len(x) == canary.LENGTH and set(x) <= set(canary.ALPHABET) for x in every)
    assert canary.canaries(4, [1, 4, 8]) != a
    assert canary.prompt_text("AB") == " ".join(["AB"] * canary.REPEATS)


def test_a_code_in_another_answer_is_a_hit_naming_both_sessions_and_its_own_is_not():
    codes = canary.canaries(0, [1, 2])
    lv1 = _level(1, codes[1], [_answer("s0", f" {codes[1][0]} {codes[1][0]}")], ids=[[3, 4]])
    # at C=2: s0's answer holds the C=1 code (text) and s1's (ids); s1 repeats its own (ids)
    at2 = [_answer("s0", f"x {codes[1][0]}", [1, 8, 9, 2]), _answer("s1", "", [4, 8, 9])]
    lv2 = _level(2, codes[2], at2, ids=[[5, 6], [8, 9]])
    assert lv2.canary is not None and lv2.canary.echoed == ["s1"]
    # (the ids count only where every code of the sweep has ids of its own: the C=1 code's are [3, 4])
    # the needle alone was answered before any code was sent: whatever it holds is no hit
    found = canary.search([lv1, lv2], None, _answer("s0", codes[2][1], [8, 9]))
    assert found is not None and found.leak is True and found.planted == 3 and found.echoed == 2
    assert found.searched == 2  # the C=2 canary answers (s0 at C=1 carried the only code sent by then)
    hits = {(h.carrier, h.carrier_level, h.receiver, h.where, tuple(h.by)) for h in found.hits}
    assert hits == {("s0", 1, "s0", "C=2 canary run", ("text",)), ("s1", 2, "s0", "C=2 canary run", ("ids",))}


def test_the_ids_search_is_a_run_of_ids_and_linear():
    assert canary.contains([1, 12, 3], [12, 3]) and not canary.contains([1, 12, 3], [2, 3])
    assert not canary.contains([1, 2], [])
    assert canary.ids_usable([[1], [2, 3]]) and not canary.ids_usable([[1], [1]]) and not canary.ids_usable([[1], []])
    assert canary.contains(list(range(200_000)), [199_998, 199_999])  # (a forged answer of any length: quick)


def test_no_code_back_even_to_its_own_session_is_not_judged_and_echo_without_a_hit_is_no_leak():
    codes = canary.canaries(1, [2])[2]
    silent = canary.search([_level(2, codes, [_answer("s0", "a"), _answer("s1", "b")])], None, _answer("s0"))
    assert silent is not None and silent.leak is None and silent.hits == []
    echo = canary.search([_level(2, codes, [_answer("s0", codes[0]), _answer("s1")])], None, _answer("s0"))
    assert echo is not None and echo.leak is False and echo.echoed == 1
    # one echo at one client says nothing of two: every level of two or more needs one of its own
    c1, c2 = canary.canaries(1, [1, 2]).values()
    deaf = canary.search([_level(1, c1, [_answer("s0", c1[0])]), _level(2, c2, [_answer("s0"), _answer("s1")])],
                         None, _answer("s0"))  # fmt: skip
    assert deaf is not None and deaf.leak is None and deaf.echoed == 1
    failed = _answer("s1")
    failed = Completion(**{**{f: getattr(failed, f) for f in failed.__slots__}, "error": "HTTP 503"})
    broken = canary.search([_level(2, codes, [_answer("s0", codes[0]), failed])], None, _answer("s0"))
    assert broken is not None and broken.leak is None and broken.failed == 1
    assert canary.search([], None, _answer("s0")) is None
