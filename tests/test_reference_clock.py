"""The reference clock (meshbench bench clock): a loopback server that sends tokens on a known schedule and
stamps each send, and meshbench's client held to it. No figure is asserted (tests time nothing): what runs, what
is reported, and that both ITL definitions are computed from the same stamps."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from meshbench.bench import reference_clock
from meshbench.cli import app

runner = CliRunner()


def test_the_schedule_is_the_seed_s_and_has_stalls_among_short_gaps():
    a, b = reference_clock.schedule(8, 64, 3), reference_clock.schedule(8, 64, 3)
    assert a == b and a != reference_clock.schedule(8, 64, 4)
    gaps = [g for s in a for g in s["gaps_ms"]]
    assert len(gaps) == 8 * 63 and set(gaps) <= {*reference_clock.GAPS_MS, reference_clock.STALL_MS}
    assert reference_clock.STALL_MS in gaps  # the two ITL definitions differ only where some gaps stall


def test_bench_clock_reports_every_figure_from_both_sides_of_the_wire():
    r = runner.invoke(app, ["bench", "clock", "--levels", "1,2", "--sessions", "3", "--tokens", "4", "--rounds", "1",
                            "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout[r.stdout.index("{") :])
    assert [lv["concurrency"] for lv in res["levels"]] == [1, 2]
    for lv in res["levels"]:
        assert [v["name"] for v in lv["figures"]] == list(reference_clock.FIGURES)
        assert all(set(v) == {"name", "server", "meshbench"} and v["server"] > 0 for v in lv["figures"])
        assert set(lv["delay_ms"]) == {"p50", "p99", "max"} and lv["delay_ms"]["p50"] <= lv["delay_ms"]["max"]


def test_bench_clock_refuses_bad_levels_in_one_line():
    r = runner.invoke(app, ["bench", "clock", "--levels", "0"])
    assert r.exit_code == 2 and "Traceback" not in r.output and "--levels" in r.output


def test_bench_client_counts_every_token_it_received_and_what_each_cost():
    r = runner.invoke(app, ["bench", "client", "--levels", "1,3", "--requests", "6", "--tokens", "5", "--rounds",
                            "2", "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout[r.stdout.index("{") :])
    assert (res["requests"], res["tokens"], res["rounds"]) == (6, 5, 2)
    assert [lv["concurrency"] for lv in res["levels"]] == [1, 3]
    for lv in res["levels"]:
        assert [x["client"] for x in lv["clients"]] == ["threads", "asyncio"]  # meshbench's, and the reference
        for x in lv["clients"]:
            for name in ("tokens_per_s", "client_cpu_us_per_token"):
                s = x[name]
                assert 0 < s["min"] <= s["median"] <= s["max"], (name, s)
            assert x["client_ceiling_tokens_per_s"] == 1e6 / x["client_cpu_us_per_token"]["median"]
            assert x["server_cpu_us_per_token"]["min"] > 0  # (the server reports its CPU time to the ns)
            assert set(x["delay_ms"]) == {"p50", "p99", "max"}


def test_bench_client_refuses_a_pass_too_large_to_stamp_in_one_line():
    r = runner.invoke(app, ["bench", "client", "--levels", "4", "--requests", "4096", "--tokens", "4096"])
    assert r.exit_code != 0 and "Traceback" not in r.output and "tokens in a pass" in r.output
