"""Isolation proven by perturbation, the decode feed, and the verdicts that keep the two apart."""

from __future__ import annotations

import dataclasses
import json

import factories as f
import pytest

from meshbench.analysis import isolation, verdicts
from meshbench.engine.base import DecodeItem
from meshbench.records import serial
from meshbench.records.model import LevelRecord
from meshbench.scheduler.scheduler import ContinuousBatchScheduler
from meshbench.sweep.levels import SweepPlan, run_concurrency_sweep
from meshbench.verify import bundle as verify
from meshbench.workload.workload import Workload


def _sweep(levels=(1, 2, 4, 8), factory=None, workload=None, rounds=4):
    workload = workload or Workload.uniform(8, 4, 8)
    factory = factory or (lambda b: f.engine(b.kv_bytes))
    plan = SweepPlan(list(levels), workload, f.budget(kv_bytes=1 << 24), isolation_rounds=rounds)
    return run_concurrency_sweep(plan, factory)


@pytest.mark.parametrize(
    "sessions, passes",
    [(1, 0), (2, 2), (3, 3), (6, 4), (7, 5), (8, 5), (10, 5), (11, 6), (16, 6), (20, 6), (21, 7), (64, 8)],
)
def test_pass_count_is_the_smallest_separating_family(sessions, passes):
    assert isolation.pass_count(sessions) == passes


@pytest.mark.parametrize("n", [2, 3, 5, 8, 16, 17, 35, 64])
def test_the_perturbed_sets_separate_every_ordered_pair(n):
    ids = [f"s{i}" for i in range(n)]
    sets = isolation.perturbed_sets(ids)
    assert len(sets) == isolation.pass_count(n)
    assert isolation.separates(ids, sets)
    # and a family missing one pass does not: the check can fail
    assert not isolation.separates(ids, sets[1:])


def test_perturbed_prompts_keep_their_length_and_change_every_token():
    prompt = (5, 7, 7, 0, 255)
    other = isolation.perturb(prompt, 256, seed=0, index=3, pass_no=0)
    assert len(other) == len(prompt)
    assert all(a != b for a, b in zip(prompt, other))
    assert isolation.perturb(prompt, 256, seed=0, index=3, pass_no=0) == other  # seeded
    # fresh content in every pass and for every session: no feature of one alternative survives them all
    draws = {isolation.perturb(prompt, 256, seed=0, index=3, pass_no=p) for p in range(32)}
    assert len(draws) == 32
    assert {sum(d) % 2 for d in draws} == {0, 1}
    assert isolation.perturb(prompt, 256, seed=0, index=4, pass_no=0) != other


@pytest.mark.parametrize("n, rounds, bits", [(2, 1, 1), (2, 3, 3), (8, 1, 1), (8, 4, 4), (16, 2, 2), (1, 4, None)])
def test_escape_bits_count_the_weakest_pairs_passes(n, rounds, bits):
    ids = [f"s{i}" for i in range(n)]
    sets = isolation.family_sets(ids, rounds, None, isolation.REPEATED)
    assert len(sets) == isolation.pass_count(n) * rounds
    assert isolation.escape_bits(ids, sets) == bits


@pytest.mark.parametrize(
    "n, rounds, passes",
    # (16, 2): 10 not 12; (16, 4): 16 not 24; (8, 4): 14 not 20; where no shorter code exists, the rounds
    [(16, 2, 10), (16, 4, 16), (8, 4, 14), (8, 2, 8), (4, 3, 10), (32, 2, 11), (2, 4, 8), (3, 2, 6), (16, 1, 6)],
)
def test_the_constant_weight_code_tests_every_pair_rounds_times_in_fewer_passes(n, rounds, passes):
    ids = [f"s{i}" for i in range(n)]
    sets = isolation.family_sets(ids, rounds, None, isolation.CONSTANT_WEIGHT)
    assert len(sets) == passes <= isolation.pass_count(n) * rounds
    assert isolation.escape_bits(ids, sets) >= rounds  # the guarantee of `rounds` repetitions, kept
    assert isolation.separates(ids, sets)
    # a pass less and some pair is tested fewer times: the count is the code's, not assumed
    assert min(isolation.escape_bits(ids, sets[:k] + sets[k + 1 :]) for k in range(len(sets))) < rounds


def test_the_constant_weight_code_is_a_fixed_function_of_its_size_and_never_longer_than_the_rounds():
    from meshbench.analysis import spread_code

    for n in range(1, 40):
        for d in range(1, 6):
            code = spread_code.lexicode(n, d)
            if code is None:
                continue
            m, words = code
            assert m < d * isolation.pass_count(n) and len(set(words)) == n
            assert len({w.bit_count() for w in words}) == 1 and all(w < 1 << m for w in words)
            assert all((a & ~b).bit_count() >= d for a in words for b in words if a != b)
    spread_code.lexicode.cache_clear()
    assert spread_code.lexicode(16, 2) == spread_code.lexicode(16, 2)  # recomputed the same: a replay's passes
    # where it is shorter, as the docs say: up to 72 sessions at 3 rounds and 30 at 4; from 5 rounds, never
    assert spread_code.lexicode(72, 3) and not spread_code.lexicode(73, 3)
    assert spread_code.lexicode(30, 4) and not spread_code.lexicode(31, 4)
    assert not any(spread_code.lexicode(n, 5) for n in (4, 8, 16))


def test_shared_prefix_groups_are_separated_rounds_times_by_either_family():
    ids = [f"s{i}" for i in range(8)]
    groups = isolation.prefix_groups([ids[:4], ids[4:]])
    for family in isolation.FAMILIES:
        sets = isolation.family_sets(ids, 3, groups, family)
        assert isolation.escape_bits(ids, sets, groups) == 3
        assert all(not (set(s) & set(ids)) for s in sets if set(s) & set(groups))  # a unit kind per pass
    with pytest.raises(ValueError, match="isolation family 'other'"):
        isolation.family_sets(ids, 3, groups, "other")


def test_isolation_holds_for_the_seed_sweep_at_every_level():
    sw = _sweep()
    assert sw.corruption_free and sw.batch_invariant
    assert sw.isolation.every_level and sw.isolation.holds and sw.isolation.levels_run == 4
    for lv in serial.to_json(sw.levels):
        v = lv["isolation_verdict"]
        assert v == {
            "ran": True,
            "holds": True,
            "schedule_changed": [],
            "changed": [],
            "leaks": [],
            "separating": True,
            "family_passes": 14,  # the constant-weight code: every pair 4 times (the rounds repeated: 20)
            "escape_bits": 4,
            "confirmations": 0,
            "suspects": {},
            "reason": None,
        }


class Leaker(f.DecodeWrapper):
    """A planted cross-session leak: at the ``at``-th decode batch holding both, the victim is fed the
    culprit's token instead of its own."""

    def __init__(self, inner, victim="s1", culprit="s5", at=2):
        super().__init__(inner)
        self.victim, self.culprit, self.at = victim, culprit, at
        self.shared = 0

    def decode_batch(self, items):
        ids = [it.session_id for it in items]
        if self.victim in ids and self.culprit in ids:
            self.shared += 1
            if self.shared == self.at:
                theirs = items[ids.index(self.culprit)].token
                items = [dataclasses.replace(it, token=theirs) if it.session_id == self.victim else it for it in items]
        return self.inner.decode_batch(items)


def test_a_planted_leak_is_caught_by_isolation_naming_both_sessions():
    sw = _sweep(levels=(1, 8), factory=lambda b: Leaker(f.engine(b.kv_bytes)))
    alone, shared = (lv["isolation_verdict"] for lv in serial.to_json(sw.levels))
    assert alone["holds"]  # at concurrency 1 they never share a batch: nothing leaks
    assert not shared["holds"] and shared["schedule_changed"] == []
    assert shared["changed"] == ["s1"]
    assert shared["leaks"] == [["s1", "s5"]]  # confirmed by a pass perturbing s5 alone
    assert "s5" in shared["suspects"]["s1"]
    assert not sw.corruption_free and sw.isolation.holds is False
    # the verdict is recomputed from the records: verify agrees
    per_level = [isolation.verdict(lv.isolation, lv.sessions, lv.tick_records) for lv in sw.levels]
    assert verdicts.sweep_verdicts(sw.levels, None, per_level, isolation.CONSTANT_WEIGHT).corruption_free is False


class ParityLeaker(f.DecodeWrapper):
    """The probe's planted leak: while the victim shares a decode batch with a culprit whose prompt ids sum to an
    odd number, the victim's token changes. A fixed alternative prompt that keeps the parity never shows it."""

    def __init__(self, inner, victim="s1", culprits=("s2",)):
        super().__init__(inner)
        self.victim, self.culprits, self.odd = victim, culprits, {}

    def prefill(self, session, tokens):
        self.odd[session.session_id] = sum(tokens) % 2 == 1
        return self.inner.prefill(session, tokens)

    def decode_batch(self, items):
        out = self.inner.decode_batch(items)
        ids = [it.session_id for it in items]
        if self.victim in ids and any(c in ids and self.odd.get(c) for c in self.culprits):
            i = ids.index(self.victim)
            out[i] = dataclasses.replace(out[i], token=(out[i].token + 1) % 256)
        return out


def test_a_leak_on_one_bit_of_a_neighbours_content_is_caught_and_named():
    sw = _sweep(levels=(8,), factory=lambda b: ParityLeaker(f.engine(b.kv_bytes)), rounds=8)
    v = serial.to_json(sw.levels)[0]["isolation_verdict"]
    assert v["escape_bits"] == 8  # each pass perturbing s2 and not s1 flips the parity with probability 1/2
    assert not v["holds"] and v["changed"] == ["s1"]
    assert "s2" in v["suspects"]["s1"]  # with whoever shared every pass that changed s1
    assert v["leaks"] == [["s1", "s2"]]  # the single-suspect passes acquit the others
    assert not sw.corruption_free


def test_a_victim_of_several_neighbours_names_them_all_as_suspects():
    sw = _sweep(levels=(8,), factory=lambda b: ParityLeaker(f.engine(b.kv_bytes), culprits=("s2", "s5")), rounds=8)
    v = serial.to_json(sw.levels)[0]["isolation_verdict"]
    assert not v["holds"] and v["changed"] == ["s1"]
    assert {"s2", "s5"} <= set(v["suspects"]["s1"])
    # one is confirmed alone; the other can be masked (s1 already hit by the first's odd baseline parity)
    assert v["leaks"] and all(b in ("s2", "s5") for _, b in v["leaks"])


def test_a_leak_that_flips_no_token_is_still_caught_by_the_margins():
    class MarginLeaker(Leaker):
        def decode_batch(self, items):
            out = self.inner.decode_batch(items)
            ids = [it.session_id for it in items]
            if self.victim in ids and self.culprit in ids:
                theirs = items[ids.index(self.culprit)].token
                i = ids.index(self.victim)  # a tiny, content-dependent nudge to the victim's margin only
                out[i] = dataclasses.replace(out[i], margin=out[i].margin + theirs * 1e-9)
            return out

    sw = _sweep(levels=(8,), factory=lambda b: MarginLeaker(f.engine(b.kv_bytes)))
    v = serial.to_json(sw.levels)[0]["isolation_verdict"]
    assert sw.batch_invariant  # no token moved
    assert not v["holds"] and ["s1", "s5"] in v["leaks"]


def _results(sw) -> dict:
    return {"levels": serial.to_json(sw.levels)}


def test_batch_variance_under_isolation_is_not_corruption():
    """An engine whose output depends on the batch's size only (never on the neighbours' content)."""

    class ShapeVariant(f.DecodeWrapper):
        def decode_batch(self, items):
            out = self.inner.decode_batch(items)
            if len(items) >= 4:  # like a kernel switching at a batch size
                out = [dataclasses.replace(r, token=(r.token + 1) % 256) if r.token is not None else r for r in out]
            return out

    sw = _sweep(levels=(1, 4), factory=lambda b: ShapeVariant(f.engine(b.kv_bytes)))
    assert not sw.batch_invariant and sw.first_divergence.concurrency == 4
    assert sw.isolation.holds and sw.isolation.every_level
    assert sw.corruption_free


def test_the_decode_feed_is_recorded_and_checked(tmp_path):
    sw = _sweep(levels=(2,))
    lv = serial.to_json(sw.levels)[0]
    fed = [f for t in lv["tick_records"] for f in t["decode_feed"]]
    s0 = next(s for s in lv["sessions"] if s["session_id"] == "s0")
    mine = [x for x in fed if x[0] == "s0"]
    assert [x[1] for x in mine] == list(range(4, 4 + 7))  # positions after the 4-token prompt
    assert [x[2] for x in mine] == s0["tokens"][:7]  # each decode feeds the previous token


def test_a_planted_wrong_position_is_caught_by_the_feed_check(monkeypatch, tmp_path):
    """The scheduler tells the engine a wrong position once; an engine that keeps its own cursor (as
    llama.cpp appends at the next cell) runs on, so only the recorded feed shows it."""
    real = ContinuousBatchScheduler._decode_item
    state = {"n": 0}

    def wrong(s):
        item = real(s)
        state["n"] += 1
        return dataclasses.replace(item, position=item.position + 1) if state["n"] == 5 else item

    class OwnCursor(f.DecodeWrapper):
        def decode_batch(self, items):
            kv = self.inner.kv
            fixed = [
                DecodeItem(it.session_id, it.epoch, kv.lookup(it.session_id, it.epoch).length, it.token)
                if kv.contains(it.session_id, it.epoch)
                else it
                for it in items
            ]
            return self.inner.decode_batch(fixed)

    monkeypatch.setattr(ContinuousBatchScheduler, "_decode_item", staticmethod(wrong))
    data = _bundle_data(lambda b: OwnCursor(f.engine(b.kv_bytes)))
    c = verify.check_data(data)
    bad = [x for x in c.failures if "decode_feed" in x.field and "position" in x.field]
    assert len(bad) == 1, c.failures
    assert bad[0].expected + 1 == bad[0].found
    # the negative control: the same run without the planted position passes the feed check
    monkeypatch.setattr(ContinuousBatchScheduler, "_decode_item", staticmethod(real))
    clean = verify.check_data(_bundle_data(lambda b: OwnCursor(f.engine(b.kv_bytes))))
    assert not [x for x in clean.failures if "decode_feed" in x.field], clean.failures


def _bundle_data(factory) -> dict:
    from meshbench.results import document as results
    from meshbench.results import envinfo
    from meshbench.workload import config

    cfg = config.load(None, {"levels": [2], "isolation": False})
    sw = run_concurrency_sweep(SweepPlan([2], cfg.workload, cfg.budget), factory)
    info = serial.engine_info(f.engine_info(kv_bytes_per_token=1536, weight_bytes=1, scratch_bytes_per_session=1))
    data = serial.to_json(results.build(cfg, sw, info, envinfo.environment(), "meshbench sweep"))
    return json.loads(results.dumps(data))


def test_verify_catches_a_forged_isolation_verdict(tmp_path):
    from typer.testing import CliRunner

    from meshbench.cli import app

    out = tmp_path / "b"
    r = CliRunner().invoke(app, ["sweep", "--levels", "1,2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    data["levels"][1]["isolation"]["passes"][0]["sessions"][7]["margins_digest"] = "0" * 64
    (out / "results.json").write_text(json.dumps(data))
    r = CliRunner().invoke(app, ["verify", str(out)])
    assert r.exit_code == 1
    assert "levels[1].isolation_verdict" in r.output and "corruption_free" in r.output


def test_verify_holds_confirmation_passes_to_the_suspects_they_confirm():
    sw = _sweep(levels=(8,), factory=lambda b: ParityLeaker(f.engine(b.kv_bytes)), rounds=8)
    lv = serial.to_json(sw.levels)[0]
    assert [p["perturbed"] for p in lv["isolation"]["passes"] if p["confirm"]] == isolation.expected_confirmations(
        sw.levels[0]
    )
    forged = json.loads(json.dumps(lv))
    extra = dict(forged["isolation"]["passes"][0], perturbed=["s6"], confirm=True)  # s6 is nobody's suspect
    forged["isolation"]["passes"].append(extra)
    assert isolation.expected_confirmations(serial.from_json(forged, LevelRecord)) != [
        p["perturbed"] for p in forged["isolation"]["passes"] if p["confirm"]
    ]
