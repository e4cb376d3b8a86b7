"""Cancel and retry judged (meshbench.analysis.cancel): which sessions are cut and where, and every divergence
classified by its margin: the others against their reference answers, the retried against their cold ones."""

from __future__ import annotations

import pytest
from test_bad_input import run_refused

from meshbench.analysis import cancel


def _answer(sid: str, tokens: list[int], margins: list[float] | None = None, error: str | None = None):
    from meshbench.records.model import Completion

    return Completion(session_id=sid, submit_ns=0, tokens=tokens, text="", token_ns=list(range(len(tokens))),
                      stop="limit", predicted=len(tokens), evaluated=3, error=error, margins=margins)  # fmt: skip


@pytest.mark.parametrize(
    "setting,new,expect",
    [("auto", [8, 5], 2), ("auto", [1], None), (3, [8, 5], 3), (5, [8, 5], None), ("off", [8], None)],
)
def test_the_token_the_clients_cut_at(setting, new, expect):
    assert cancel.at_token(setting, new) == expect


def test_a_node_sweep_refuses_a_cancel_token_in_one_line():
    run_refused("sweep", "--cancel", "3", "--levels", "1", expect="cancel-and-retry runs against an endpoint")


def test_every_second_session_is_cancelled():
    assert cancel.cancelled(["s0", "s1", "s2", "s3", "s4"]) == ["s1", "s3"]


def _cut(sid: str, n: int = 1):
    from meshbench.records.completion import CANCELLED
    from meshbench.records.model import Completion

    return Completion(session_id=sid, submit_ns=0, tokens=list(range(n)), text="", token_ns=list(range(n)),
                      stop=CANCELLED, predicted=None, evaluated=None, error=None)  # fmt: skip


def test_the_others_are_held_to_their_outputs_without_cancels_and_the_retried_to_their_cold_answer():
    ref = [_answer("s0", [1, 2, 3], [2.0, 0.01, 2.0]), _answer("s1", [4, 5, 6], [2.0, 2.0, 2.0])]
    cold = {"s1": _answer("s1", [4, 5, 6], [3.0, 3.0, 0.02])}
    cut = [_cut("s1")]
    same = cancel.verdict(2, cut, ref, [_answer("s0", [1, 2, 3]), _answer("s1", [4, 5, 6])], cold, {}, 0.05)
    assert same.affected is False and same.cut == 1 and same.others_differing == [] and same.retries_differing == []
    # s0 flips a near-tie (the reference's margin 0.01 at token 1): numerics; s1's retry flips its cold near-tie
    ties = cancel.verdict(2, cut, ref, [_answer("s0", [1, 9, 9]), _answer("s1", [4, 5, 7])], cold, {}, 0.05)
    assert ties.affected is False
    assert [(d.session_id, d.token_index, d.kind) for d in ties.others_differing] == [("s0", 1, "near-tie")]
    assert [(d.session_id, d.token_index, d.kind) for d in ties.retries_differing] == [("s1", 2, "near-tie")]
    # a retry that leaves its cold answer where the cold answer was sure: what numerics do not explain
    sure = cancel.verdict(2, cut, ref, [_answer("s0", [1, 2, 3]), _answer("s1", [8, 5, 6])], cold, {}, 0.05)
    assert sure.affected is True and sure.retries_differing[0].kind == "confident"
    assert sure.retries_differing[0].beside == ["s0"]  # (in flight beside it, by the stamps)
    # ... unless the server gave that output without any cancellation: run-to-run variation, not the cancel
    seen = cancel.seen_outputs([[_answer("s1", [8, 5, 6])]])
    assert (
        cancel.verdict(2, cut, ref, [_answer("s0", [1, 2, 3]), _answer("s1", [8, 5, 6])], cold, seen, 0.05).affected
        is False
    )


def test_under_sampling_a_changed_answer_is_not_judged_by_its_margin_and_an_unchanged_run_is_unaffected():
    ref = [_answer("s0", [1, 2, 3], [2.0, 0.01, 2.0]), _answer("s1", [4, 5, 6], [2.0, 2.0, 2.0])]
    cold, cut = {"s1": _answer("s1", [4, 5, 6], [3.0, 3.0, 0.02])}, [_cut("s1")]
    changed = [_answer("s0", [1, 2, 3]), _answer("s1", [8, 5, 6])]  # (confident: affected, under greedy)
    assert cancel.verdict(2, cut, ref, changed, cold, {}, 0.05).affected is True
    assert cancel.verdict(2, cut, ref, changed, cold, {}, 0.05, sampled=True).affected is None
    same = [_answer("s0", [1, 2, 3]), _answer("s1", [4, 5, 6])]
    assert cancel.verdict(2, cut, ref, same, cold, {}, 0.05, sampled=True).affected is False


def test_nothing_cut_or_a_failed_answer_is_not_judged():
    ref = [_answer("s0", [1]), _answer("s1", [2])]
    v = cancel.verdict(2, [_cut("s1")], ref, [_answer("s0", [1]), _answer("s1", [], error="HTTP 503")], {}, {}, 0.05)
    assert v.affected is None and v.failed == 1
    ended = _answer("s1", [2])  # (it ended before the token: nothing was cancelled)
    v = cancel.verdict(2, [ended], ref, [_answer("s0", [1]), _answer("s1", [2])], {}, {}, 0.05)
    assert v.affected is None and v.cut == 0


def test_yaml_off_unquoted_is_off_and_odd_digits_are_refused(tmp_path):
    from meshbench.workload import config

    p = tmp_path / "c.yaml"
    prompts = tmp_path / "p.txt"
    prompts.write_text("a\nb\n")
    p.write_text(  # (YAML 1.1 reads an unquoted off as false; cancel-and-retry is an endpoint's)
        f"engine: {{kind: endpoint, url: 'http://127.0.0.1:1'}}\nworkload: {{cancel: off, prompts: {prompts}}}\n"
    )
    assert config.load(p).workload.cancel == "off"
    run_refused("sweep", "--cancel", "\u0663", "--levels", "1", expect="none of auto, off or a token index")


def test_a_cancel_token_with_nothing_to_cut_is_refused(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("a\nb\n")
    common = ["--target", "http://127.0.0.1:1", "--prompts", str(prompts), "--sessions", "2", "--cancel", "2"]
    run_refused("sweep", *common, "--levels", "1", expect="levels of two or more sessions over the native API")
    run_refused("sweep", *common, "--levels", "2", "--api", "openai", expect="over the native API")
