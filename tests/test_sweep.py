"""The concurrency sweep: the DGR-012 table exactly, saturation, corruption detection."""

import factories as f

from meshbench.analysis.figures import saturation_level, summarize_ticks, token_digest
from meshbench.engine.base import StepResult, separate_step
from meshbench.records import serial
from meshbench.sweep.levels import SweepPlan, run_concurrency_sweep
from meshbench.workload.workload import Workload


def _sweep(levels=(1, 2, 4, 8), workload=None, engine_factory=None):
    workload = workload or Workload.uniform(8, 4, 8)
    factory = engine_factory or (lambda b: f.engine(b.kv_bytes))
    return run_concurrency_sweep(SweepPlan(list(levels), workload, f.budget(kv_bytes=1 << 24)), factory)


def test_concurrency_sweep_reproduces_dgr012_exactly():
    sw = _sweep()
    table = [
        (
            r["concurrency"],
            r["ticks"],
            round(r["avg_batch_occupancy"], 3),
            r["max_batch_occupancy"],
            round(r["tokens_per_tick"], 3),
            r["peak_kv_bytes"],
        )
        for r in serial.to_json(sw.levels)
    ]
    assert table == [
        (1, 64, 1.000, 1, 1.375, 15360),
        (2, 33, 1.750, 2, 2.667, 29184),
        (4, 19, 3.111, 4, 4.632, 52224),
        (8, 15, 4.000, 7, 5.867, 75264),
    ]
    assert sw.corruption_free and sw.first_divergence is None
    assert sw.saturation_concurrency == 8
    levels = serial.to_json(sw.levels)
    assert all(r["cache_misses"] == 0 and r["rejected_admissions"] == 0 and r["failed"] == 0 for r in levels)
    assert all((r["prefill_tokens"], r["decode_tokens"]) == (32, 56) for r in levels)
    digests = {tuple(s["digest"] for s in r["sessions"]) for r in levels}
    assert len(digests) == 1
    assert levels[0]["sessions"][0]["digest"] == token_digest(levels[0]["sessions"][0]["tokens"])


def _tick(batch: int, prefill: int, decode: int, kv: int):
    return f.tick_record(
        decode_batch=batch,
        decode_sessions=[f"s{i}" for i in range(batch)],
        prefill_tokens=prefill,
        decode_tokens=decode,
        kv_bytes=kv,
    )


def test_summaries_against_hand_computed_figures():
    # Four ticks: a prefill only, a batch of 2 with a prefill, a batch of 3, a batch of 1 (one miss).
    ticks = [_tick(0, 4, 0, 40), _tick(2, 5, 2, 110), _tick(3, 0, 3, 140), _tick(1, 0, 0, 0)]
    assert summarize_ticks(ticks) == {
        "ticks": 4,
        "avg_batch_occupancy": 2.0,  # (2 + 3 + 1) / 3 ticks that ran a batch
        "max_batch_occupancy": 3,
        "tokens_per_tick": 3.5,  # (4 + 5 prompt + 2 + 3 decoded) / 4
        "peak_kv_bytes": 140,
        "prefill_tokens": 9,
        "decode_tokens": 5,
    }
    assert summarize_ticks([]) == {
        "ticks": 0,
        "avg_batch_occupancy": 0.0,
        "max_batch_occupancy": 0,
        "tokens_per_tick": 0.0,
        "peak_kv_bytes": 0,
        "prefill_tokens": 0,
        "decode_tokens": 0,
    }


def test_concurrency_sweep_saturates_below_max_when_load_is_small():
    # Three new tokens each: with one 4-token prefill per tick, no more than a few
    # generations overlap, so occupancy stops rising after level 4.
    sw = _sweep(workload=Workload.uniform(8, 4, 3))
    assert [round(r["avg_batch_occupancy"], 3) for r in serial.to_json(sw.levels)] == [1.0, 1.333, 1.778, 1.778]
    assert [r["ticks"] for r in serial.to_json(sw.levels)] == [24, 13, 10, 10]
    assert sw.saturation_concurrency == 4
    assert sw.corruption_free


def test_saturation_rule_uses_the_stated_margin():
    assert saturation_level([1, 2, 4, 8], [1.0, 1.9, 1.99, 2.5]) == 2  # 1.99 <= 1.9 x 1.05
    assert saturation_level([1, 2, 4, 8], [1.0, 1.75, 3.111, 4.0]) == 8
    assert saturation_level([1], [1.0]) == 1


def test_a_swapping_engine_is_reported_as_corruption_with_the_first_divergence():
    class Swapper:
        """Hands session s0's token to s1 and back at the third decode of a batch holding both."""

        def __init__(self, inner):
            self.inner = inner
            self.batches = 0

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def step(self, decode, prefill):  # the tick's call, through this wrapper's own methods
            return separate_step(self, decode, prefill)

        def decode_batch(self, items):
            out = self.inner.decode_batch(items)
            ids = [it.session_id for it in items]
            if "s0" in ids and "s1" in ids:
                self.batches += 1
                if self.batches == 3:
                    i, j = ids.index("s0"), ids.index("s1")
                    out[i], out[j] = (
                        StepResult("s0", out[j].token, out[j].margin),
                        StepResult("s1", out[i].token, out[i].margin),
                    )
            return out

    ref = _sweep(levels=(1,))
    sw = _sweep(levels=(1, 2), engine_factory=lambda b: Swapper(f.engine(b.kv_bytes)))
    assert not sw.corruption_free
    d = sw.first_divergence
    s0 = serial.to_json(ref.levels)[0]["sessions"][0]["tokens"]
    s1 = serial.to_json(ref.levels)[0]["sessions"][1]["tokens"]
    # s0 was prefilled on tick 0; s1 on tick 1; the third shared batch is tick 4:
    # s0's token index 4 (1 prefill + 3 decodes before it).
    assert d.session_id == "s0" and d.concurrency == 2 and d.reference_concurrency == 1
    assert d.token_index == 4
    assert d.reference_token == s0[4] and d.token == s1[3]
    assert d.reference_margin > 0
