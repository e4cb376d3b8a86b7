"""meshbench hunt against meshbench's own node (``--config FILE``, the synthetic engine with its prefix cache):
the honest node shows nothing confident, with its prefix cache exercised; a node whose engine leaks on purpose
(two prompts prefilled in one tick: the end of one written over the end of the other) is found, confirmed,
shrunk, written and verified, and its finding replays."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.engine import factory
from meshbench.records import serial

runner = CliRunner()
CONFIG = "configs/shared-prefix.yaml"  # the synthetic engine, prefix cache on, 16 positions a block


class _Leaking:
    """An engine that leaks: where a tick prefills two or more prompts' last chunks, each one's last ids are the
    next one's (a planted cross-request bug, the node's own counterpart of tests/leaky_proxy.py)."""

    def __init__(self, engine) -> None:
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def step(self, decode, prefill):
        last = [c for c in prefill if c.last and len(c.tokens) >= 4]
        if len(last) >= 2:
            swapped = {id(c): last[(k + 1) % len(last)].tokens[-3:] for k, c in enumerate(last)}
            prefill = [
                dataclasses.replace(c, tokens=c.tokens[:-3] + swapped[id(c)]) if id(c) in swapped else c
                for c in prefill
            ]
        return self._engine.step(decode, prefill)


def _leaking_setup(monkeypatch) -> None:
    real = factory.setup

    def setup(*args, **kwargs):
        s = real(*args, **kwargs)
        make = s.make
        s.make = lambda limits: _Leaking(make(limits))
        return s

    monkeypatch.setattr(factory, "setup", setup)


def test_the_honest_node_shows_nothing_confident_and_its_prefix_cache_is_exercised(tmp_path):
    out = tmp_path / "H"
    r = runner.invoke(app, ["hunt", "--config", CONFIG, "--budget", "40", "--seed", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "results.json").read_text())
    assert doc["server"]["kind"] == "node" and doc["findings"] == []
    assert doc["summary"]["outcomes"]["confident"] == 0 and doc["summary"]["outcomes"]["same"] > 0
    # the command names what it ran, so a meshbench with more strategies draws the same histories from it
    assert doc["command"].endswith(f"--strategies {','.join(doc['strategies'])}") and "turns" in doc["command"]
    assert sum(s["cache_hits"] for s in doc["summary"]["coverage"].values()) > 0
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0


def test_a_leaking_node_is_found_confirmed_shrunk_and_replayed(tmp_path, monkeypatch):
    _leaking_setup(monkeypatch)
    out = tmp_path / "H"
    r = runner.invoke(
        app, ["hunt", "--config", CONFIG, "--budget", "200", "--strategies", "same-at-once,crowd", "--out", str(out)]
    )
    assert r.exit_code == 1, r.output
    doc = json.loads((out / "results.json").read_text())
    (f,) = doc["findings"]
    assert len(f["confirmations"]) == 3 and len(f["minimal_confirmations"]) == 3
    steps = f["minimal"]["history"]["steps"]
    assert max(len(s["requests"]) for s in steps) >= 2  # the leak needs two prompts in one tick: never shrunk away
    found = doc["checked"][f["checked"]]["history"]
    assert sum(len(s["requests"]) for s in steps) <= sum(len(s["requests"]) for s in found["steps"])
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    replayed = runner.invoke(app, ["hunt", "--config", CONFIG, "--replay", str(out / "finding-1.json")])
    assert replayed.exit_code == 1 and "shown in" in replayed.output, replayed.output


def test_the_time_to_find_benchmark_finds_the_leak_seed_after_seed_and_nothing_on_the_honest_node(monkeypatch):
    args = ["bench", "hunt", "--config", CONFIG, "--seeds", "0,1", "--budget", "120", "--strategies", "crowd", "--json"]
    honest = runner.invoke(app, args)
    assert honest.exit_code == 0, honest.output
    assert json.loads(honest.stdout)["found"] == 0
    _leaking_setup(monkeypatch)
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["found"] == 2 and all(s["strategy"] == "crowd" and s["requests"] <= 120 for s in res["seeds"])
    secs, ttf = sorted(s["seconds"] for s in res["seeds"]), res["time_to_find_s"]
    assert (ttf["min"], ttf["median"], ttf["max"]) == (secs[0], (secs[0] + secs[1]) / 2, secs[1])  # (of two: the mean)


def test_a_replay_the_node_cannot_answer_is_not_judged_never_a_pass(tmp_path):
    from meshbench.records.history import History, Request, Step, to_json

    h = History(
        strategy="crowd", seed=[0, 0], steps=(Step(requests=(Request(name="r0", prompt=(1, 10**6), new_tokens=4),)),)
    )
    path = tmp_path / "h.json"
    path.write_text(json.dumps(to_json(h)))
    r = runner.invoke(app, ["hunt", "--config", CONFIG, "--replay", str(path)])
    assert r.exit_code == 5 and "no answer could be judged" in r.output and "vocabulary" in r.output, r.output


def test_verify_refuses_a_node_hunt_whose_server_or_second_choices_were_rewritten(tmp_path):
    from meshbench.results import hunt_report

    out = tmp_path / "H"
    assert runner.invoke(app, ["hunt", "--config", CONFIG, "--budget", "20", "--out", str(out)]).exit_code == 0
    original = json.loads((out / "results.json").read_text())

    def forged(change) -> int:
        doc = json.loads(json.dumps(original))
        change(doc)
        (out / "results.json").write_text(json.dumps(doc))
        (out / "README.md").write_text(hunt_report.readme(serial.hunt_document(doc), out.name))
        return runner.invoke(app, ["verify", str(out)]).exit_code

    assert forged(lambda d: None) == 0
    assert forged(lambda d: d["server"].update(kind="llama-server")) == 1

    def same_as_token(d):
        a = d["checked"][0]["answers"][0]
        a["runner_up"][0] = a["tokens"][0]

    assert forged(same_as_token) == 1
    assert forged(lambda d: d["checked"][0]["answers"][0]["runner_up"].append(3)) == 1


def test_an_out_folder_that_cannot_be_written_is_refused_before_the_hunt(tmp_path):
    r = runner.invoke(app, ["hunt", "--config", CONFIG, "--out", str(tmp_path / "missing" / "H")])
    assert r.exit_code == 2 and "checked before the hunt" in r.output


def _planted_setup(monkeypatch, plant) -> None:
    """The node's engines made with a planted fault of the prefix-cache tests (tests/test_prefix.py)."""
    real = factory.setup

    def setup(*args, **kwargs):
        s = real(*args, **kwargs)
        make = s.make

        def planted(limits):
            e = make(limits)
            if e.kv.prefix is not None:
                plant(e.kv)
            return e

        s.make = planted
        return s

    monkeypatch.setattr(factory, "setup", setup)


def _colliding_keys(kv) -> None:
    from test_prefix import _truncated_key

    kv.prefix.key = _truncated_key


def _past_the_boundary(kv) -> None:
    from test_prefix import _PastTheBoundary

    kv.__class__ = _PastTheBoundary


def _first_block_everywhere(kv) -> None:
    from test_prefix import _FirstBlockEverywhere

    kv.__class__ = _FirstBlockEverywhere


def _other_conversation(kv) -> None:
    from test_prefix import _OtherConversation

    kv.__class__ = _OtherConversation


@pytest.mark.parametrize("plant", [_colliding_keys, _past_the_boundary, _first_block_everywhere, _other_conversation])
def test_the_prefix_cache_tests_planted_faults_are_found_by_the_default_hunt_without_their_shapes(
    plant, tmp_path, monkeypatch
):
    """Every strategy, seed 0, as a user runs it: each planted fault of the prefix cache (keys that collide, a hit one
    position past its last whole block, a hit whose blocks are all its first, a later turn given the KV of the
    conversation released last) gives a finding shown again, which verify accepts."""
    _planted_setup(monkeypatch, plant)
    out = tmp_path / "H"
    r = runner.invoke(app, ["hunt", "--config", CONFIG, "--budget", "300", "--seed", "0", "--out", str(out)])
    assert r.exit_code == 1, r.output
    from meshbench.results import hunt_report

    doc = json.loads((out / "results.json").read_text())
    shown = [f for f in hunt_report.view(serial.hunt_document(doc)).findings if hunt_report.reproduced(f)]
    assert shown and all(f.minimal.history.size() <= f.found.history.size() for f in shown)
    assert all(hunt_report.shown(f.confirmations) + hunt_report.shown(f.minimal_confirmations) >= 2 for f in shown)
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    for f, raw in zip(
        hunt_report.view(serial.hunt_document(doc)).findings, doc["findings"]
    ):  # (the figures the hunt guide quotes: -s)

        def size(h) -> tuple[int, ...]:
            return (*h.size(), sum(r.answer_tokens for r in h.requests()))

        sent = sum(len(c["history"]["steps"][i]["requests"]) for c in doc["checked"][: raw["checked"] + 1]
                   for i in range(len(c["history"]["steps"])))  # fmt: skip
        print(f"{plant.__name__}: history {raw['checked'] + 1} ({f.found.history.strategy}, {sent} requests sent, "
              f"{f.seconds_to_find:.1f} s), shown {hunt_report.shown(f.confirmations)} of 3, size "
              f"{size(f.found.history)} -> {size(f.minimal.history)}, shown "
              f"{hunt_report.shown(f.minimal_confirmations)} of 3")  # fmt: skip


def test_a_conversations_turn_the_node_refuses_is_named_as_never_run(tmp_path):
    """A later turn too long for the node's context is refused at admission: the answer says which turn never ran
    (its first turn ran whole), and nothing is judged."""
    from meshbench.records import history as hist

    talk = hist.Request(name="a", prompt=(1, *range(40, 50)), new_tokens=4, turns=(tuple(range(40, 50)) * 2000,))
    path = tmp_path / "h.json"
    path.write_text(
        json.dumps(hist.to_json(hist.History(strategy="turns", seed=[0], steps=(hist.Step(requests=(talk,)),))))
    )
    r = runner.invoke(app, ["hunt", "--config", CONFIG, "--replay", str(path)])
    assert r.exit_code == 5 and "turn 2 of 2 never ran (refused at admission)" in r.output, r.output
