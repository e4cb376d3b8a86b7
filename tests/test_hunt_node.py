"""meshbench hunt against meshbench's own node (``--config FILE``, the synthetic engine with its prefix cache):
the honest node shows nothing confident, with its prefix cache exercised; a node whose engine leaks on purpose
(two prompts prefilled in one tick: the end of one written over the end of the other) is found, confirmed,
shrunk, written and verified, and its finding replays."""

from __future__ import annotations

import dataclasses
import json

from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.engine import factory

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
    assert res["time_to_find_s"]["min"] <= res["time_to_find_s"]["median"] <= res["time_to_find_s"]["max"]
