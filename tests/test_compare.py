"""Repetitions and `meshbench compare`: statistics on constructed data, and bundles made with a
controllable clock, so that no assertion depends on this machine's timing."""

import dataclasses
import json
import random
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meshbench.analysis import stats
from meshbench.cli import app
from meshbench.compare import diff, sides, verdicts
from meshbench.compare.model import Change, SchedulerVerdict
from meshbench.engine.base import StepResult, TickResult, separate_step
from meshbench.engine.synthetic import setup_synthetic
from meshbench.records import serial
from meshbench.results import bundle, envinfo, typed
from meshbench.results import document as results
from meshbench.sweep.levels import SweepPlan, run_concurrency_sweep
from meshbench.workload import config

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


# --- statistics on constructed data -----------------------------------------------------------
def test_summary_of_known_values():
    s = stats.summary([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.n, s.median, s.min, s.max) == (5, 3.0, 1.0, 5.0)
    assert (s.ci_low, s.ci_high, s.ci_level) == (1.0, 5.0, 0.9375)  # min-max is all 5 can give
    assert stats.summary([2.0, 1.0]).ci_low is None  # too few for an interval
    s = stats.summary([float(x) for x in range(1, 21)])
    assert (s.ci_low, s.ci_high) == (6.0, 15.0)  # ranks 6 and 15 of 20
    assert s.ci_level == pytest.approx(0.9586, abs=1e-4)


def test_median_interval_ranks_are_the_largest_with_95_percent_coverage():
    assert stats.median_ci_rank(5) == (1, 0.9375)
    assert stats.median_ci_rank(6) == (1, 0.96875)
    assert stats.median_ci_rank(10)[0] == 2
    assert stats.median_ci_rank(20)[0] == 6


def test_a_known_shift_is_detected_and_noise_is_not():
    base = [100.0, 101.0, 99.0, 100.5, 99.5]
    slower = [x * 0.7 for x in base]  # throughput 30% lower
    v = stats.judge(base, slower, higher_is_better=True, tolerance=0.05)
    assert (v.verdict, v.strong) == ("regressed", True)
    assert v.p_value == pytest.approx(2 / 252)  # a complete separation of 5 and 5
    assert v.change == pytest.approx(-0.3)
    faster = stats.judge(base, [x * 1.3 for x in base], True, 0.05)
    assert faster.verdict == "improved"
    latency = stats.judge(base, [x * 1.3 for x in base], higher_is_better=False, tolerance=0.05)
    assert latency.verdict == "regressed"


def test_noise_and_small_changes_are_unchanged():
    rng = random.Random(7)
    a = [100 + rng.gauss(0, 3) for _ in range(7)]
    b = [100 + rng.gauss(0, 3) for _ in range(7)]
    assert stats.judge(a, b, True, 0.05).verdict == "unchanged"
    # Beyond the tolerance but overlapping: the spread cannot tell them apart.
    wide_a = [80.0, 120.0, 90.0, 110.0, 100.0]
    wide_b = [x * 1.08 for x in [120.0, 80.0, 100.0, 90.0, 110.0]]
    v = stats.judge(wide_a, wide_b, True, 0.05)
    assert v.verdict == "unchanged" and v.p_value > 0.01 and "cannot tell" in v.reason


def test_fewer_than_five_repetitions_give_a_weak_verdict():
    v = stats.judge([100.0], [60.0], True, 0.05)
    assert (v.verdict, v.strong, v.p_value) == ("regressed", False, None)
    assert "weak" in v.reason


# --- bundles made with a controllable clock -----------------------------------------------------
class Clock:
    """Monotonic nanoseconds that move when read (1 us: the scheduler's own work) and when an engine works."""

    def __init__(self):
        self.now = 0

    def __call__(self) -> int:
        self.now += 1_000
        return self.now


class TimedEngine:
    """The synthetic engine, with each call costing clock time: scale x a base cost x seeded jitter."""

    def __init__(self, inner, clock, scale, rng, edit=None):
        self.inner, self.clock, self.scale, self.rng, self.edit = inner, clock, scale, rng, edit

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step(self, decode, prefill):  # the tick's call, through this wrapper's own methods, timed on the clock
        start = self.clock.now  # (separate_step's own split reads the real perf_counter: noise on a busy machine)
        dec = separate_step(self, decode, [])
        mid = self.clock.now
        pre = separate_step(self, [], prefill)
        return TickResult(dec.decode, pre.prefill, mid - start, self.clock.now - mid)

    def _spend(self, ns: float) -> None:
        self.clock.now += int(ns * self.scale * self.rng.uniform(0.98, 1.02))

    def prefill(self, session, prompt):
        self._spend(200_000 * len(prompt))
        return self.inner.prefill(session, prompt)

    def decode_batch(self, items):
        self._spend(1_000_000 + 100_000 * len(items))
        out = self.inner.decode_batch(items)
        if self.edit:
            out = [self.edit(it, r) for it, r in zip(items, out)]
        return out


def make_bundle(path: Path, scale=1.0, seed=0, edit=None, sessions=4, repeat=5) -> Path:
    cfg = config.load(
        overrides={
            "levels": [1, 2, 4],
            "repeat": repeat,
            "warmup": 0,
            "workload": {"sessions": sessions, "prompt_tokens": 4, "new_tokens": 6},
        }
    )
    setup = setup_synthetic(cfg.engine)
    clock, rng = Clock(), random.Random(seed)
    plan = SweepPlan(list(cfg.levels), cfg.workload, cfg.budget, repeat=cfg.repeat, warmup=cfg.warmup)
    sweep = run_concurrency_sweep(plan, lambda b: TimedEngine(setup.make(b), clock, scale, rng, edit), clock=clock)
    bundle.write(path, serial.to_json(results.build(cfg, sweep, setup.info, envinfo.environment(), "meshbench sweep")))
    return path


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("base") / "b", seed=1)


def test_a_timed_bundle_verifies_and_keeps_every_repetition(baseline):
    r = invoke("verify", baseline)
    assert r.exit_code == 0, r.stdout
    data = json.loads((baseline / "results.json").read_text())
    lv = data["levels"][1]
    assert [rep["repetition"] for rep in lv["repetitions"]] == [0, 1, 2, 3, 4]
    assert [rep["position"] for rep in lv["repetitions"]] == [1, 0, 2, 1, 0]  # levels 1,2,4 rotated by r
    assert lv["wall"]["decode_tokens_per_s"]["n"] == 5


def test_the_same_engine_twice_is_unchanged(baseline, tmp_path):
    cand = make_bundle(tmp_path / "c", seed=2)
    r = invoke("compare", baseline, cand, "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["summary"] == {
        "outputs_changed": [],
        "scheduler_changed": [],
        "regressed": [],
        "improved": [],
        "weak": [],
    }
    verdicts = {v["verdict"] for lv in report["levels"] for v in lv["performance"].values()}
    assert verdicts == {"unchanged"}


def test_an_engine_30_percent_slower_is_regressed_at_every_level(baseline, tmp_path):
    cand = make_bundle(tmp_path / "c", scale=1.3, seed=2)
    r = invoke("compare", baseline, cand, "--json")
    assert r.exit_code == 1, r.output
    report = json.loads(r.stdout)
    for lv in report["levels"]:
        v = lv["performance"]["decode_tokens_per_s"]
        assert (v["verdict"], v["strong"]) == ("regressed", True), (lv["concurrency"], v)
        assert v["p_value"] == pytest.approx(2 / 252)
        assert lv["outputs"]["verdict"] == "same" and lv["scheduler"]["verdict"] == "same"
    assert invoke("compare", baseline, cand, "--perf", "warn").exit_code == 0
    assert invoke("compare", baseline, cand, "--perf", "ignore").exit_code == 0


def test_one_changed_token_is_an_outputs_change_with_the_exact_divergence(baseline, tmp_path):
    def edit(item, result):  # s1's token at position 6 (its 3rd decode) becomes another id
        if item.session_id == "s1" and item.position == 6:
            return StepResult(result.session_id, (result.token + 1) % 256, result.margin)
        return result

    cand = make_bundle(tmp_path / "c", seed=1, edit=edit)
    md = tmp_path / "report.md"
    r = invoke("compare", baseline, cand, "--json", "--markdown", md)
    assert r.exit_code == 1, r.output
    report = json.loads(r.stdout)
    base = {lv["concurrency"]: lv for lv in json.loads((baseline / "results.json").read_text())["levels"]}
    for lv in report["levels"]:
        ref = next(s for s in base[lv["concurrency"]]["sessions"] if s["session_id"] == "s1")
        out = lv["outputs"]
        assert out["verdict"] == "changed" and out["sessions_changed"] == ["s1"]
        d = out["first_divergence"]
        assert (d["session_id"], d["token_index"]) == ("s1", 3)  # prefill token + decodes at 4, 5, then 6
        assert d["reference_token"] == ref["tokens"][3] and d["token"] == (ref["tokens"][3] + 1) % 256
        assert d["reference_margin"] == ref["margins"][3]
    assert "## Outputs and scheduler" in md.read_text() and "changed" in md.read_text()


def test_a_scheduler_change_is_reported_field_by_field(baseline):
    data = json.loads((baseline / "results.json").read_text())
    lv = serial.node_results(data).levels[0]
    shorter = dataclasses.replace(lv, tick_records=lv.tick_records[1:])  # as if the first tick had not been needed
    n = data["workload"]["sessions"]
    v = verdicts.scheduler_verdict(n, lv, n, shorter)
    assert v.verdict == "changed"
    assert v.changes["ticks"] == Change(baseline=lv.ticks, candidate=lv.ticks - 1)
    assert verdicts.scheduler_verdict(n, lv, n, lv) == SchedulerVerdict(verdict="same", changes={})


def test_the_prefill_policy_and_the_llama_cpp_recipe_are_listed_among_the_differences(baseline):
    """The 63M model's default bundle and its serving bundle differ in what decides their schedules and kernels
    (the prefill policy, repacking, one llama_decode a tick): compare says so; against a synthetic bundle, only
    what both records have is compared."""
    evidence = Path(__file__).resolve().parents[1] / "evidence"
    plain, served, synthetic = (
        sides.side("node", typed.node(json.loads(p.read_text())))
        for p in (
            evidence / "MB-BENCH-GGUF" / "results.json",
            evidence / "MB-BENCH-GGUF-SERVING" / "results.json",
            baseline / "results.json",
        )
    )
    found = {(d.kind, d.field): (d.baseline, d.candidate) for d in diff.differences(plain, served)}
    assert found[("run", "prefill")] == ("whole", "chunked-burst")
    assert found[("engine", "repack")] == (False, True) and found[("engine", "mixed_batch")] == (False, True)
    assert ("engine", "tiled_mm") not in found  # (auto on both)
    against = {(d.kind, d.field) for d in diff.differences(synthetic, served)}
    assert ("engine", "kind") in against and not {("engine", k) for k in ("repack", "flash_attn")} & against


# --- refusals -------------------------------------------------------------------------------------
def test_refusals_are_one_line_exit_2_and_write_nothing(baseline, tmp_path):
    other = make_bundle(tmp_path / "other", sessions=5, repeat=1)
    broken = tmp_path / "broken"
    shutil.copytree(baseline, broken)
    data = json.loads((broken / "results.json").read_text())
    data["levels"][0]["ticks"] += 1
    (broken / "results.json").write_text(json.dumps(data))
    md = tmp_path / "out.md"
    cases = [
        ((baseline, other), "ran different workloads"),
        ((broken, baseline), "baseline " + str(broken) + " does not pass verify"),
        ((baseline, tmp_path / "missing"), "candidate: " + str(tmp_path / "missing") + ": no such directory"),
    ]
    for (a, b), expect in cases:
        r = invoke("compare", a, b, "--markdown", md)
        assert r.exit_code == 2, r.output
        assert len(r.stderr.strip().splitlines()) == 1 and expect in r.stderr, r.stderr
        assert r.stdout == "" and not md.exists()
    for flag, value, expect in (
        ("--perf", "maybe", "--perf must be fail, warn or ignore"),
        ("--tolerance", "five", "--tolerance: 'five' is not a percentage"),
    ):
        r = invoke("compare", baseline, baseline, flag, value)
        assert r.exit_code == 2 and expect in r.stderr


# --- repetitions must agree -------------------------------------------------------------------------
def test_a_repetition_that_differs_fails_the_sweep_and_verify(tmp_path, monkeypatch):
    passes = {"n": 0}

    class Drifting:
        """Changes one token in the 2nd pass of level 1 only: a non-deterministic engine."""

        def __init__(self, inner):
            self.inner = inner
            passes["n"] += 1
            self.pass_no = passes["n"]

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def step(self, decode, prefill):  # the tick's call, through this wrapper's own methods
            return separate_step(self, decode, prefill)

        def decode_batch(self, items):
            out = self.inner.decode_batch(items)
            if self.pass_no == 5:  # repetition 1's first pass (levels 1, 2, 4, 8 each once before it)
                out[0] = StepResult(out[0].session_id, (out[0].token + 1) % 256, out[0].margin)
            return out

    from meshbench.engine import synthetic

    real = synthetic.SyntheticEngine
    monkeypatch.setattr(synthetic, "setup_synthetic", _wrapping(synthetic.setup_synthetic, Drifting))
    from meshbench.engine import factory

    monkeypatch.setattr(factory, "setup_synthetic", synthetic.setup_synthetic)
    out = tmp_path / "b"
    r = invoke("sweep", "--repeat", "2", "--warmup", "0", "--out", out)
    assert r.exit_code == 1, r.output
    assert "repetitions[1].sessions (ids, epochs, digests, ends = repetition 0's)" in r.stderr
    assert invoke("verify", out).exit_code == 1
    assert real is synthetic.SyntheticEngine


def _wrapping(setup_fn, wrapper):
    def setup(spec):
        s = setup_fn(spec)
        make = s.make
        s.make = lambda b: wrapper(make(b))
        return s

    return setup
