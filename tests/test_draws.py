"""Sampled divergences placed by where the draw fell (meshbench.analysis.draws): one seeded draw per token walks
the candidates in the server's order, so two answers that first differ at a token either overlap in their two
tokens' intervals (the arithmetic moved a boundary past the draw: a near-tie, within the numerics) or lie apart
(another draw); and llama-server's post-sampling probabilities as the stream reads them."""

from __future__ import annotations

import pytest

from meshbench.analysis import draws, endpoint_margins
from meshbench.endpoint.native_probs import parse
from meshbench.endpoint.stream import Malformed
from meshbench.records.completion import Completion
from meshbench.records.margins import MarginPasses

IDS = [10, 11, 12, 13]


def _answer(sid: str, tokens: list[int], probs: list[list[float]] | None, ids: list[int] = IDS) -> Completion:
    return Completion(session_id=sid, submit_ns=0, tokens=tokens, text="", token_ns=[1] * len(tokens), stop="limit",
                      predicted=len(tokens), evaluated=3, error=None, margins=[0.1] * len(tokens),
                      runner_up=[None] * len(tokens),
                      candidates=None if probs is None else [ids] * len(tokens), candidate_probs=probs)  # fmt: skip


def test_a_token_s_interval_is_its_cumulative_probability_in_the_server_s_order():
    assert draws.interval(IDS, [0.4, 0.3, 0.2, 0.1], 12) == pytest.approx((0.7, 0.9))
    assert draws.interval(IDS, [0.4, 0.3, 0.2, 0.1], 99) is None


def test_the_cold_order_gives_the_least_move_between_two_tokens():
    cold = _answer("s0", [10, 11], [[0.5, 0.3, 0.1, 0.1], [0.4, 0.3, 0.15, 0.05]])  # (0.1 unlisted)
    assert draws.gap(cold, 1, 10) == 0.0  # (neighbours)
    assert draws.gap(cold, 1, 13) == pytest.approx(0.15)  # (12 lies between: 0.15 of probability)
    assert draws.gap(cold, 1, 77) is None  # (not listed, and the list is not whole: unknown)
    whole = _answer("s0", [10], [[0.6, 0.2, 0.1, 0.1]])
    assert draws.gap(whole, 0, 77) == pytest.approx(0.4)  # (whole: 77 had none, after every listed one)


def test_one_draw_gives_both_tokens_only_where_their_intervals_overlap():
    cold = _answer("s0", [10], [[0.500, 0.3, 0.1, 0.1]])
    moved = _answer("s0", [11], [[0.499, 0.301, 0.1, 0.1]])  # (the boundary moved by 0.001, past the draw)
    assert draws.overlap(cold, moved, 0) == pytest.approx(0.001) and draws.shift(cold, moved, 0) == 0.001
    assert draws.classify(cold, moved, 0, 0.002) == draws.Placed(pytest.approx(0.001), 0.001, "near-tie")
    assert draws.classify(cold, moved, 0, 0.0005).kind == "confident"  # (moved past the numerics)
    other = _answer("s0", [13], [[0.5, 0.3, 0.1, 0.1]])  # (the same probabilities, another token: another draw)
    assert draws.classify(cold, other, 0, 0.01) == draws.Placed(pytest.approx(-0.4), 0.0, "confident")
    neighbour = _answer("s0", [11], [[0.5, 0.3, 0.1, 0.1]])  # (touching only: no draw gives both, within rounding)
    assert draws.classify(cold, neighbour, 0, 0.01).kind == "unknown"
    swapped = _answer("s0", [11], [[0.41, 0.39, 0.1, 0.1]], ids=[11, 10, 12, 13])  # (two swap places: moved 0.11)
    assert draws.classify(cold, swapped, 0, 0.12) == draws.Placed(pytest.approx(0.41), 0.11, "near-tie")
    assert draws.classify(cold, swapped, 0, 0.05).kind == "confident"  # (0.11 is more than these numerics)


def test_a_single_candidate_before_the_divergence_leaves_it_unknown():
    """llama.cpp draws nothing for a token with one candidate: where one answer had one and the other more, every
    later draw is shifted, so no later difference is placed."""
    cold = Completion(session_id="s0", submit_ns=0, tokens=[10, 10], text="", token_ns=[1, 1], stop="limit",
                      predicted=2, evaluated=3, error=None, margins=[None, 0.1], runner_up=[None, 11],
                      candidates=[[10], IDS], candidate_probs=[[1.0], [0.5, 0.3, 0.1, 0.1]])  # fmt: skip
    two = _answer("s0", [10, 13], [[0.9, 0.1, 0.0, 0.0], [0.5, 0.3, 0.1, 0.1]])
    assert draws.classify(cold, two, 1, 0.01).kind == "unknown"
    timed = _answer("s0", [10, 13], None)  # (a timed pass: its counts unseen, and cold had one candidate)
    assert draws.classify(cold, timed, 1, 0.01).kind == "unknown"


def test_the_numerics_are_the_largest_move_of_a_drawn_token_s_interval_where_the_answers_agree():
    cold = _answer("s0", [10, 11], [[0.5, 0.3, 0.1, 0.1], [0.4, 0.3, 0.2, 0.1]])
    warm = _answer("s0", [10, 11], [[0.502, 0.298, 0.1, 0.1], [0.4, 0.3, 0.2, 0.1]])
    passes = MarginPasses(cold=[cold], warm=[warm], together=[warm])
    assert draws.moves(passes) == pytest.approx([0.002, 0.0, 0.002, 0.0])  # (warm, then together: 0.502 vs 0.5)
    assert draws.threshold(passes) == pytest.approx(0.002)
    assert draws.threshold(None) == 0.0


def test_a_sampled_sweep_s_divergences_are_classified_by_the_draw_only_where_cold_answers_list_candidates():
    cold = _answer("s0", [10, 11], [[0.5, 0.3, 0.1, 0.1], [0.4, 0.3, 0.2, 0.1]])
    passes = MarginPasses(cold=[cold], warm=[cold], together=[cold])
    assert endpoint_margins.compares("native", "tokens", 0.7, passes)
    bare = MarginPasses(cold=[_answer("s0", [10], None)], warm=[], together=[])
    assert not endpoint_margins.compares("native", "tokens", 0.7, bare)
    assert not endpoint_margins.compares("native", "tokens", 0.7, None)
    level = _answer("s0", [10, 13], None)  # (a timed pass lists none: the cold order places it, 0.2 between)
    d = endpoint_margins.divergence(4, 0, "s0", level, cold, ["s1"], 0.01, by_draw=True)
    assert d is not None and (d.kind, d.overlap, d.token_index) == ("confident", pytest.approx(-0.2), 1)
    near = endpoint_margins.divergence(4, 0, "s0", _answer("s0", [10, 12], None), cold, ["s1"], 0.01, by_draw=True)
    assert near is not None and (near.kind, near.overlap) == ("unknown", 0.0)  # (neighbours: not told apart)
    no_list = endpoint_margins.divergence(4, 0, "s0", level, _answer("s0", [10, 11], None), [], 0.01, by_draw=True)
    assert no_list is not None and no_list.kind == "unknown"  # (never the margin rule under sampling)


def _entry(token: int, top: list[tuple[int, float]]) -> dict:
    return {"id": token, "prob": dict(top).get(token, 0.0), "top_probs": [{"id": i, "prob": p} for i, p in top]}


def test_post_sampling_probabilities_are_recorded_as_the_server_lists_them():
    probs = parse([_entry(11, [(10, 0.6), (11, 0.3), (12, 0.1)]), _entry(7, [(7, 1.0)])], [11, 7])
    assert probs.candidates == [[10, 11, 12], [7]] and probs.candidate_probs == [[0.6, 0.3, 0.1], [1.0]]
    assert probs.runner_up == [10, None] and probs.margins[0] == pytest.approx(0.693147, abs=1e-6)


@pytest.mark.parametrize(
    ("top", "says"),
    [
        ([(10, 0.7), (11, 0.7)], "add up to 1.4, over 1"),
        ([(10, 0.5), (10, 0.1)], "listed twice"),
        ([(10, 1.5)], "not a probability"),
        ([(10, True)], "not a probability"),
        ([("10", 0.5)], "no integer 'id'"),
        ([(10, 0.1), (11, 0.5)], "not sorted best first"),
        ([], "is empty"),
    ],
)
def test_candidates_that_are_no_distribution_are_the_answer_s_fault(top, says):
    with pytest.raises(Malformed, match=says):
        parse([_entry(10, top)], [10])
