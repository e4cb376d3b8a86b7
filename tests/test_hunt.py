"""meshbench hunt, without a server: the strategies' histories (valid, drawn again alike from their seed, within the
server's context), the history file (round trip, and one line for a bad one), the shrink, and the CLI's refusals."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.errors import MeshbenchError
from meshbench.hunt import shrink
from meshbench.records import history as hist
from meshbench.records.history import Facts
from meshbench.workload import hunt as strategies
from meshbench.workload.hunt import content

FACTS = Facts(slots=4, n_ctx=4096, head=(2,), pool=tuple(range(100, 160)))
runner = CliRunner()


@pytest.mark.parametrize("name", list(strategies.STRATEGIES))
def test_each_strategy_draws_a_valid_history_again_alike_from_its_seed(name):
    s = strategies.STRATEGIES[name]
    for k in range(20):
        h = s.draw(np.random.default_rng([7, k]), FACTS, [7, k])
        assert h == s.draw(np.random.default_rng([7, k]), FACTS, [7, k])
        assert hist.from_json(json.loads(json.dumps(hist.to_json(h))), "x") == h
        for r in h.requests():
            assert r.prompt[:1] == (2,) and len(r.sent()) + r.answer_tokens <= FACTS.n_ctx
            assert set(r.sent()[1:]) <= set(FACTS.pool) and r.carries
            assert r.cancel_at is None or 1 <= r.cancel_at < r.new_tokens
            assert not (r.turns and r.cancel_at is not None)


def test_strategies_fit_a_small_context():
    small = Facts(slots=1, n_ctx=128, head=(2,), pool=(5, 6, 7))
    for s in strategies.STRATEGIES.values():
        for k in range(10):
            for r in s.draw(np.random.default_rng(k), small, [k]).requests():
                assert len(r.sent()) + r.answer_tokens <= small.n_ctx, (s.name, len(r.prompt))


def test_content_repeats_a_run_so_a_model_continues_it_confidently():
    ids = content(np.random.default_rng(0), FACTS, 40)
    period = next(p for p in range(5, 13) if ids[p:] == ids[:-p])
    assert len(set(ids[:period])) >= 2 or period == 1


def test_the_boundaries_are_every_block_batch_and_micro_batch_and_their_neighbours():
    b = FACTS.boundaries(3000)
    assert {15, 16, 17, 255, 256, 257, 511, 512, 513, 2047, 2048, 2049} <= set(b)
    assert max(FACTS.boundaries(300)) == 257


def test_shrink_keeps_what_the_finding_needs_and_drops_the_rest():
    """A predicate standing for a server bug: two requests at once whose prompts share their first 9 ids."""
    h = strategies.STRATEGIES["crowd"].draw(np.random.default_rng(3), FACTS, [3])
    doc = list(range(100, 140))
    a = hist.Request(name="a", prompt=(2, *doc[:30]), new_tokens=8, carries="a")
    b = hist.Request(name="b", prompt=(2, *doc[:20], 150), new_tokens=8, carries="b")
    big = hist.History(strategy="t", seed=[0], steps=(*h.steps, hist.Step(requests=(a, b)), *h.steps))

    def still(c: hist.History) -> bool:
        return any(len(s.requests) >= 2 and len({r.prompt[:10] for r in s.requests}) == 1 for s in c.steps)

    assert still(big)
    small = shrink.shrink(big, still, head=1, tries=400)
    assert still(small) and small.size() < big.size()
    assert len(small.steps) == 1 and len(small.steps[0].requests) == 2
    assert all(len(r.prompt) <= 16 and r.new_tokens == 2 for r in small.requests())


def test_the_shrink_never_runs_a_history_it_already_saw_fail():
    """After each kept candidate the passes start over; the candidates tried before and not kept are skipped, so the
    tries go to new cuts."""
    h = strategies.STRATEGIES["crowd"].draw(np.random.default_rng(3), FACTS, [3])
    seen: list[tuple] = []

    def still(c: hist.History) -> bool:
        seen.append(c.steps)
        return len(c.requests()) > 2 and c.size()[0] >= len(h.steps) - 1  # drops at most one step, keeps 3 requests

    small = shrink.shrink(h, still, head=1, tries=400)
    assert len(seen) == len(set(seen)) and small.size() < h.size()


def test_a_smaller_history_must_show_the_findings_own_difference_not_just_any():
    """shrink.Marks: a request of the finding, at the token where it differed (in the finding's run or a
    confirmation); anywhere only where the smaller history changed that request's prompt or answer length."""
    from meshbench.analysis.hunt import Judged

    a = hist.Request(name="a", prompt=(2, *range(100, 130)), new_tokens=8, carries="a")
    b = hist.Request(name="b", prompt=(2, *range(130, 150)), new_tokens=8, carries="b")
    found = hist.History(strategy="t", seed=[0], steps=(hist.Step(requests=(a, b)),))
    marks = shrink.Marks.of(found, [[Judged(name="a", outcome="confident", token_index=0)],
                                    [Judged(name="a", outcome="confident", token_index=2)]])  # fmt: skip
    alone = hist.History(strategy="t", seed=[0], steps=(hist.Step(requests=(a,)),))
    shorter = dataclasses.replace(a, new_tokens=4)

    def differs(name: str, at: int) -> list[Judged]:
        return [Judged(name=name, outcome="confident", token_index=at)]

    assert marks.shown(alone, differs("a", 0)) and marks.shown(alone, differs("a", 2))  # its token, either run's
    assert not marks.shown(alone, differs("a", 5))  # the same request, unchanged, parting elsewhere: not the finding
    assert not marks.shown(found, differs("b", 0))  # a request that never differed
    smaller = hist.History(strategy="t", seed=[0], steps=(hist.Step(requests=(shorter,)),))
    assert marks.shown(smaller, differs("a", 3))  # its answer shortened: where it parts may move
    assert not marks.shown(alone, [])


def test_the_shrink_keeps_a_history_only_where_two_runs_running_show_the_difference(monkeypatch):
    """One run showing the finding's difference is not enough: a second, fresh, must too."""
    from meshbench.analysis.hunt import Checked, Judged
    from meshbench.hunt import run

    a = hist.Request(name="a", prompt=(2, *range(100, 130)), new_tokens=8, carries="a")
    b = hist.Request(name="b", prompt=(2, *range(130, 150)), new_tokens=8, carries="b")
    found = hist.History(strategy="t", seed=[0], steps=(hist.Step(requests=(a, b)),))
    hit = [Judged(name="a", outcome="confident", token_index=0), Judged(name="b", outcome="same")]
    runs = iter([hit] * 3 + [hit, []] * 200)  # 3 confirmations; then every candidate shows once, not twice

    class _Host:
        target = None

        def replays_on(self) -> str:
            return "here"

    def replay(server, cold, h, limit):
        judged = next(runs)
        return Checked(h, {}, {}, [j for j in judged if j.name in {r.name for r in h.requests()}])

    monkeypatch.setattr(run, "replay", replay)
    monkeypatch.setattr(run, "facts_head", lambda server: [2])
    got = Checked(found, {}, {}, hit)
    settled = run._settle(_Host(), None, got, 0.05, 1.0, lambda m: None)  # type: ignore[arg-type]
    assert settled.minimal.history == found  # nothing smaller was shown twice running


@pytest.mark.parametrize(
    "doc,said",
    [
        ({"kind": "history"}, "not a meshbench history"),
        ({**hist.to_json(hist.History(strategy="crowd", seed=[0], steps=())), "steps": []}, "not a meshbench history"),
        (
            hist.to_json(
                hist.History(
                    strategy="crowd",
                    seed=[0],
                    steps=(hist.Step(requests=(hist.Request(name="a", prompt=(1,), new_tokens=2),) * 2),),
                )
            ),
            "request names must be unique (a is said twice)",
        ),
        (
            hist.to_json(
                hist.History(
                    strategy="crowd",
                    seed=[0],
                    steps=(
                        hist.Step(
                            requests=(hist.Request(name="a", prompt=(1,), new_tokens=2, cancel_at=1, turns=((5,),)),)
                        ),
                    ),  # fmt: skip
                )
            ),
            "request a is a conversation with cancel_at",
        ),
    ],
)
def test_a_bad_history_file_is_one_line(tmp_path, doc, said):
    p = tmp_path / "h.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(MeshbenchError, match=said.replace("(", r"\(").replace(")", r"\)")):
        hist.read(p)
    r = runner.invoke(app, ["hunt", "--target", "http://127.0.0.1:9", "--replay", str(p)])
    assert r.exit_code == 2 and said in r.output and "Traceback" not in r.output


@pytest.mark.parametrize(
    "args,said",
    [
        (["--budget", "ten"], "--budget 'ten': a time such as 90s"),
        (["--budget", "0"], "--budget '0'"),
        (["--budget", "2.5"], "a number of requests is a whole number"),
        (["--strategies", "prefix-boundary,nope"], "unknown nope"),
        (["--serve", "llama-server"], "hunt needs one server"),
        (["--model", "m.gguf"], "apply to --serve only"),
        (["--replay", "/nonexistent/h.json"], "/nonexistent/h.json"),
        (["--against", "http://10.1.2.3:8080"], "--against http://10.1.2.3:8080: not on this machine"),
    ],
)
def test_hunt_refuses_bad_flags_in_one_line_before_any_work(args, said):
    """(Port 9 answers nothing: every refusal comes before the server is asked anything.)"""
    r = runner.invoke(app, ["hunt", "--target", "http://127.0.0.1:9", *args])
    assert r.exit_code == 2 and said in r.output and "Traceback" not in r.output, r.output


@pytest.mark.parametrize(
    "args,said",
    [
        ([], "hunt needs one server"),
        (["--serve", "llama-server"], "needs one model"),
        (["--serve", "vllm"], "--serve 'vllm': meshbench starts llama-server or transformers"),
        (["--serve", "transformers"], "--serve transformers: hunt needs a server with llama-server's native API"),
    ],
)
def test_hunt_needs_one_server_it_can_start(args, said):
    r = runner.invoke(app, ["hunt", *args])
    assert r.exit_code == 2 and said in r.output and "Traceback" not in r.output, r.output


def test_a_differing_answer_is_traced_to_the_request_whose_content_it_continues():
    from meshbench.analysis.hunt import donor
    from meshbench.records.completion import Completion

    def answer(tokens):
        return Completion(session_id="r1", submit_ns=0, tokens=tokens, text="", token_ns=[], stop=None,
                          predicted=None, evaluated=None, error=None)  # fmt: skip

    own = (2, 5, 6, 7, 5, 6, 7)
    others = [("r0", (2, 9, 8, 11, 9, 8, 11)), ("r2", (2, 40, 41, 42))]
    assert donor(answer([5, 6, 9, 8, 11, 9]), 2, own, others) == "r0"
    assert donor(answer([5, 6, 7, 5, 6, 7]), 2, own, others) is None  # (its own content)
    assert donor(answer([5, 6, 99, 98, 97]), 2, own, others) is None  # (nobody's)
    assert donor(answer([5, 6, 9]), 2, own, others) is None  # (too short to tell)


def test_two_servers_part_confidently_only_where_their_cold_answers_agree():
    from meshbench.hunt.differential import parted
    from meshbench.hunt.run import Checked
    from meshbench.records.completion import Completion

    def answer(name, tokens, margins):
        return Completion(session_id=name, submit_ns=0, tokens=tokens, text="", token_ns=[], stop=None,
                          predicted=None, evaluated=None, error=None, margins=margins)  # fmt: skip

    r = hist.Request(name="r0", prompt=(2, 5, 6), new_tokens=3)
    q = hist.Request(name="r1", prompt=(2, 7, 8), new_tokens=3)
    h = hist.History(strategy="t", seed=[0], steps=(hist.Step(requests=(r, q)),))
    cold = {"r0": answer("r0", [1, 2, 3], [3.0, 3.0, 3.0]), "r1": answer("r1", [4, 5, 6], [3.0, 3.0, 3.0])}
    cold_b = {**cold, "r1": answer("r1", [4, 9, 6], [3.0, 0.01, 3.0])}  # (b's own numerics part r1 cold)
    a = Checked(h, {"r0": answer("r0", [1, 2, 3], [3.0] * 3), "r1": answer("r1", [4, 5, 6], [3.0] * 3)}, cold, [])
    b = Checked(h, {"r0": answer("r0", [1, 8, 3], [3.0] * 3), "r1": answer("r1", [4, 9, 6], [3.0] * 3)}, cold_b, [])
    got = {p.name: p for p in parted(a, b, 0.5)}
    assert got["r0"].confident and got["r0"].token_index == 1 and got["r0"].colds_agree
    assert not got["r1"].confident and not got["r1"].colds_agree
    near = Checked(h, {**b.answers, "r0": answer("r0", [1, 8, 3], [3.0, 0.1, 3.0])}, cold_b, [])
    assert not {p.name: p for p in parted(a, near, 0.5)}["r0"].confident  # (b's margin there is a near-tie)


def test_a_differential_hunt_refuses_what_it_cannot_run_in_one_line():
    r = runner.invoke(app, ["hunt", "--target", "http://127.0.0.1:9", "--against-args", "-np 2"])
    assert r.exit_code == 2 and "they need --serve" in r.output
    r = runner.invoke(app, ["hunt", "--config", "configs/shared-prefix.yaml", "--against-llama-server", "/bin/true"])
    assert r.exit_code == 2 and "they need --serve" in r.output
    r = runner.invoke(app, ["hunt", "--config", "configs/shared-prefix.yaml", "--target", "http://127.0.0.1:9"])
    assert r.exit_code == 2 and "hunt needs one server" in r.output


def test_hunt_sends_to_loopback_only():
    r = runner.invoke(app, ["hunt", "--target", "http://10.1.2.3:8080"])
    assert r.exit_code == 2 and "not on this machine (loopback)" in r.output


def test_a_replay_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    import os

    fifo = tmp_path / "h.json"
    os.mkfifo(fifo)
    r = runner.invoke(app, ["hunt", "--target", "http://127.0.0.1:9", "--replay", str(fifo)])
    assert r.exit_code == 2 and "h.json" in r.output and "Traceback" not in r.output


def test_a_conversation_sends_each_turn_after_the_answer_before_it_and_its_answer_is_every_turns():
    """Against a server (tests/bad_server.py, answering ids 10, 11, ... and saying how many prompt ids it read): the
    second turn's prompt is the first's, its answer and the message; one answer of both turns' ids; a turn that
    fails is the whole answer's failure and no later turn is sent."""
    from bad_server import serving

    from meshbench.endpoint.client import Endpoint
    from meshbench.hunt.execute import Http
    from meshbench.workload.target import parse_target

    talk = hist.Request(name="a", prompt=(1, 7, 8, 9), new_tokens=3, turns=((4, 4), (5,)))
    with serving("ok") as url:
        ep = Endpoint(parse_target(url), "auto", 5.0)
        ep.probe()
        (x,) = Http(ep).at_once([talk]).values()
    assert x.error is None and x.tokens == [10, 11, 12] * 3 and len(x.token_ns) == 9
    assert x.evaluated == 4 + (4 + 3 + 2) + (4 + 3 + 2 + 3 + 1)
    assert hist.Request(name="b", prompt=(1,), new_tokens=3).key() != talk.key() and talk.answer_tokens == 9
    with serving("close-early") as url:
        ep = Endpoint(parse_target(url), "auto", 5.0)
        ep.probe()
        (x,) = Http(ep).at_once([talk]).values()
    assert x.error is not None and len(x.tokens) < 3


def test_the_shrink_drops_a_conversations_later_turns_where_the_finding_needs_none():
    talk = hist.Request(name="a", prompt=(2, *range(100, 140)), new_tokens=8, turns=((5, 6), (7,), (8, 9)))
    big = hist.History(strategy="turns", seed=[0], steps=(hist.Step(requests=(talk,)),))

    def still(c: hist.History) -> bool:  # a bug in a conversation's second turn
        return any(len(r.turns) >= 1 for r in c.requests())

    (small,) = shrink.shrink(big, still, head=1, tries=100).requests()
    assert small.turns == ((5, 6),) and len(small.prompt) == 2 and small.new_tokens == 2


def test_the_shrink_tries_nothing_past_its_deadline():
    import time

    h = strategies.STRATEGIES["crowd"].draw(np.random.default_rng(3), FACTS, [3])
    tried = []
    said = []
    kept = shrink.shrink(
        h, lambda c: tried.append(c) or True, head=1, deadline=time.monotonic() - 1, progress=said.append
    )
    assert kept == h and tried == [] and said == ["shrink stopped after 0 tries: its time is spent"]


def test_a_history_file_with_a_key_said_twice_or_an_unknown_strategy_is_refused_in_one_line(tmp_path):
    text = json.dumps(hist.to_json(strategies.STRATEGIES["crowd"].draw(np.random.default_rng(1), FACTS, [1])))
    twice = tmp_path / "twice.json"
    twice.write_text(text.replace('"strategy": "crowd"', '"strategy": "crowd", "strategy": "turns"', 1))
    unknown = tmp_path / "unknown.json"
    unknown.write_text(text.replace('"strategy": "crowd"', '"strategy": "hand-picked"', 1))
    for p, said in ((twice, "the key 'strategy' appears twice"), (unknown, "not a meshbench history")):
        r = runner.invoke(app, ["hunt", "--target", "http://127.0.0.1:9", "--replay", str(p)])
        assert r.exit_code == 2 and said in r.output and "Traceback" not in r.output, r.output


def test_the_history_schema_names_exactly_the_strategies_meshbench_has():
    from meshbench import validation

    assert validation.load(hist.SCHEMA)["properties"]["strategy"]["enum"] == list(strategies.STRATEGIES)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", list(strategies.STRATEGIES))
def test_every_history_a_shrink_tries_is_one_verify_accepts_as_shrunk_and_no_other(name, seed):
    h = strategies.STRATEGIES[name].draw(np.random.default_rng([seed, 9]), FACTS, [seed, 9])
    head = len(FACTS.head)
    tried = list(shrink._candidates(h, head))
    assert tried and all(hist.unshrinkable(c, h, head) is None for c in tried)
    assert all(hist.unshrinkable(c2, h, head) is None for c in tried[:5] for c2 in shrink._candidates(c, head))
    r = h.requests()[0]
    grown = dataclasses.replace(h, steps=(hist.Step(requests=(dataclasses.replace(r, prompt=(*r.prompt, 5)),)),))
    assert "prompt" in (hist.unshrinkable(grown, h, len(FACTS.head)) or "")
    if len(h.requests()) >= 2:
        a, b = h.requests()[:2]
        backwards = dataclasses.replace(h, steps=(hist.Step(requests=(b,)), hist.Step(requests=(a,))))
        assert "order" in (hist.unshrinkable(backwards, h, len(FACTS.head)) or "")
