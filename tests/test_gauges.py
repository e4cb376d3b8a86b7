"""The server's request gauges as a pass's figures, and the sampler's window: pure functions, no server (the
sampling itself runs against a real llama-server in tests/test_llama_server_defaults.py)."""

from __future__ import annotations

from meshbench.analysis import server_accounting as accounting
from meshbench.endpoint.gauges import Samples, _sample
from meshbench.records.model import GaugeSample
from meshbench.verify.endpoint_gauges import _spacing


def _g(t: float, p: int, d: int) -> GaugeSample:
    return GaugeSample(t_ms=t, answer_ms=t + 1, processing=p, deferred=d)


def test_a_pass_s_gauges_are_its_largest_values_and_the_mean_deferred():
    figures = accounting.pass_gauges([_g(100, 1, 0), _g(200, 1, 3), _g(300, 1, 1)])
    assert figures == {"requests processing, max": 1, "requests deferred, max": 3, "requests deferred, mean": 4 / 3}
    assert accounting.pass_gauges(None) is None and accounting.pass_gauges([]) is None
    level = accounting.level_gauges([[_g(1, 2, 0)], None, [_g(1, 1, 2)]])
    assert level["requests deferred, max"] == [0, 2] and level["requests processing, max"] == [2, 1]


def test_only_samples_sent_within_the_pass_are_kept_and_a_scrape_without_the_gauges_is_none():
    s = Samples()
    for t in (100.0, 200.0, 1300.0):
        s.add(_g(t, 1, 0))
    assert [x.t_ms for x in s.within(1.25) or []] == [100.0, 200.0]
    assert Samples().within(5.0) is None
    good = {"llamacpp:requests_processing": 2.0, "llamacpp:requests_deferred": 1.0}
    assert _sample(good, 12.3456, 13.3456) == _g(12.346, 2, 1)
    for bad in (None, {}, {**good, "llamacpp:requests_deferred": -1.0}, {**good, "llamacpp:requests_processing": 1.5}):
        assert _sample(bad, 1.0, 2.0) is None


def test_verify_holds_each_sample_to_its_wait_after_the_last_answer_and_to_the_pass():
    g = GaugeSample
    honest = [g(t_ms=100.2, answer_ms=101.0, processing=1, deferred=0), g(t_ms=201.5, answer_ms=230.0, processing=1,
              deferred=1)]  # fmt: skip
    assert _spacing(honest, 0.5) == "ok"
    assert _spacing(honest, 0.2).startswith("gauges[1]")  # (answered after the pass ended)
    early = [honest[0], g(t_ms=150.0, answer_ms=160.0, processing=1, deferred=1)]  # (50 ms after the answer)
    assert _spacing(early, 1.0).startswith("gauges[1]")
    backwards = [g(t_ms=120.0, answer_ms=110.0, processing=0, deferred=0)]
    assert _spacing(backwards, 1.0).startswith("gauges[0]")
    assert _spacing([g(t_ms=50.0, answer_ms=51.0, processing=0, deferred=0)], 1.0).startswith("gauges[0]")
