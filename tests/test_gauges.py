"""The server's request gauges as a pass's figures, and the sampler's window: pure functions, no server (the
sampling itself runs against a real llama-server in tests/test_llama_server_defaults.py)."""

from __future__ import annotations

from meshbench.analysis import server_accounting as accounting
from meshbench.endpoint.gauges import Samples, _sample
from meshbench.records.model import GaugeSample


def _g(t: float, p: int, d: int) -> GaugeSample:
    return GaugeSample(t_ms=t, processing=p, deferred=d)


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
    assert _sample(good, 12.3456) == _g(12.346, 2, 1)
    for bad in (None, {}, {**good, "llamacpp:requests_deferred": -1.0}, {**good, "llamacpp:requests_processing": 1.5}):
        assert _sample(bad, 1.0) is None
