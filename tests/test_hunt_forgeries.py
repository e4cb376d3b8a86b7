"""Forged hunt bundles, each edited where the README is rendered again from the edit (so only verify's checks of
results.json itself stand between the forgery and a pass): a minimal history no shrink could give, answers paired
with other requests, a hunt that stopped short of its budget, times and rates that do not add up, a strategy
named twice, words about the server that are not its; and the folder's own files: a FIFO is refused, not waited
on, a renamed copy verifies, and a failure is one short line. Run against meshbench's own node (the synthetic
engine), honest and with a planted leak, so they need nothing installed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.records import serial
from meshbench.results import hunt_report
from tests.forged_hunts import forged
from tests.test_hunt_node import CONFIG, _leaking_setup

runner = CliRunner()


@pytest.fixture(scope="module")
def found(tmp_path_factory) -> Path:
    """A node hunt with a finding (a planted leak), its bundle as written."""
    out = tmp_path_factory.mktemp("found") / "H"
    with pytest.MonkeyPatch.context() as mp:
        _leaking_setup(mp)
        args = ["hunt", "--config", CONFIG, "--budget", "200", "--strategies", "same-at-once,crowd", "--out", str(out)]
        assert runner.invoke(app, args).exit_code == 1
    return out


@pytest.fixture(scope="module")
def honest(tmp_path_factory) -> Path:
    """A node hunt that found nothing and spent its budget of 20 requests."""
    out = tmp_path_factory.mktemp("honest") / "H"
    assert runner.invoke(app, ["hunt", "--config", CONFIG, "--budget", "20", "--out", str(out)]).exit_code == 0
    return out


def _forged(bundle: Path, tmp_path: Path, edit) -> tuple[int, str]:
    return forged(bundle, tmp_path, edit)


def _minimal(d) -> list[dict]:
    return [r for s in d["findings"][0]["minimal"]["history"]["steps"] for r in s["requests"]]


def _all_minimal_runs(d, change) -> None:
    """The same change to the minimal history and to each of its confirmations' (they must stay alike)."""
    f = d["findings"][0]
    for run in (f["minimal"], *f["minimal_confirmations"]):
        change(run["history"])


def _renamed(h) -> None:
    h["steps"][0]["requests"][0]["name"] = "zz"


def _prompt_grown(h) -> None:
    r = h["steps"][0]["requests"][0]
    r["prompt"] = [*r["prompt"], r["prompt"][-1]]


def _other_seed(h) -> None:
    h["seed"] = [7, 7]


def _one_token(h) -> None:
    for r in (r for s in h["steps"] for r in s["requests"]):
        r["new_tokens"] = 1


def _swap_answers(d) -> None:
    run = next(x for x in d["checked"] if len(x["answers"]) >= 2)
    run["answers"][0], run["answers"][1] = run["answers"][1], run["answers"][0]


def _copied_confirmations(d) -> None:
    f = d["findings"][0]
    f["confirmations"] = [json.loads(json.dumps(d["checked"][f["checked"]])) for _ in f["confirmations"]]


def _one_cold_margin(d) -> None:
    x = next(c for run in d["checked"][1:] for c in run["cold"] if c["margins"])
    x["margins"][0] += 1.0


def _faster(d) -> None:
    d["findings"][0]["seconds_to_find"] = 0.0


def _inflated(d) -> None:
    a = next(a for run in d["checked"] for a in run["answers"] if a["evaluated"] is not None)
    a["evaluated"] += 1000


def _answer_more(d) -> None:
    d["checked"][0]["answers"].append(d["checked"][0]["answers"][0])


@pytest.mark.parametrize(
    "edit,said",
    [
        (lambda d: _all_minimal_runs(d, _renamed), "minimal.history (one a shrink of its history could give)"),
        (lambda d: _all_minimal_runs(d, _prompt_grown), "minimal.history (one a shrink of its history could give)"),
        (lambda d: _all_minimal_runs(d, _other_seed), "minimal.history (one a shrink of its history could give)"),
        (_swap_answers, "answers (each request's, by session id, in order)"),
        (_answer_more, "checked[0].answers (each request's, by session id, in order)"),
        (lambda d: d["findings"][0].update(seconds_to_find=d["seconds"] + 5), "seconds_to_find"),
        (lambda d: d["summary"].update(histories_per_minute=d["summary"]["histories_per_minute"] * 2), "per_minute"),
        (lambda d: d.update(strategies=d["strategies"] * 2), "strategies (each named once"),
        (lambda d: d.update(cold_answers="the same request on a fresh server"), "cold_answers"),
        (lambda d: d.update(replays_on="a fresh server process"), "replays_on"),
        (lambda d: d["findings"][0].update(checked=99), "findings[0].checked: no history 99"),
        (_copied_confirmations, "(stamps of its own: a run, not a copy of another)"),
        (_one_cold_margin, "(the one cold record of every alike request)"),
        (_faster, "findings[0].seconds_to_find (at least the"),
        (_inflated, "(whole: evaluated"),
        (lambda d: d["calibration"].update(warm=[]), "calibration.warm (the requests c0..c7, in order)"),
        (lambda d: d["calibration"]["cold"][0].update(evaluated=3), "calibration.cold.c0 (whole, its prompt as drawn"),
        (lambda d: _all_minimal_runs(d, _one_token), "minimal.history (one a shrink of its history could give)"),
        (lambda d: d.update(command=d["command"] + " --seed 7"), "command (its --seed, the seed recorded)"),
        (lambda d: d["budget"].update(seconds=60.0), "budget (a time or a number of requests, as --budget gives it)"),
        (lambda d: d["server"].update(args=["--config", "x`](http://e.example) **y**"]), "server.args"),
        (lambda d: d["server"].update(launched=False), "server.launched (the node is always started by meshbench)"),
        (lambda d: d["server"].update(total_slots=1), "facts.slots (the server's total_slots"),
        (lambda d: d["facts"].update(n_batch=100000), "facts.n_batch, n_ubatch"),
    ],
)
def test_a_forged_finding_fails_verify(found, tmp_path, edit, said):
    assert runner.invoke(app, ["verify", str(found)]).exit_code == 0
    code, output = _forged(found, tmp_path, edit)
    assert code in (1, 2) and said in output, output


@pytest.mark.parametrize(
    "edit,said",
    [
        (lambda d: d["budget"].update(requests=10_000), "the hunt's end (at a finding shown again"),
        (lambda d: d["budget"].update(requests=1), "each drawn with fewer than budget.requests = 1 requests sent"),
        (lambda d: d["budget"].update(requests=None, seconds=3600.0), "the hunt's end"),
    ],
)
def test_a_hunt_that_stopped_short_of_its_budget_or_ran_past_it_fails_verify(honest, tmp_path, edit, said):
    code, output = _forged(honest, tmp_path, edit)
    assert code == 1 and said in output, output


def test_a_fifo_in_a_hunt_bundle_is_refused_not_waited_on(found, tmp_path):
    b = tmp_path / "H"
    shutil.copytree(found, b)
    (b / "finding-1.json").unlink()
    os.mkfifo(b / "finding-1.json")
    r = runner.invoke(app, ["verify", str(b)])
    assert r.exit_code == 1 and "finding-1.json" in r.output and "not a regular file" in r.output, r.output


def test_a_hunt_bundle_copied_under_another_name_still_verifies(found, tmp_path):
    copy = tmp_path / "copied-elsewhere"
    shutil.copytree(found, copy)
    r = runner.invoke(app, ["verify", str(copy)])
    assert r.exit_code == 0, r.output


def test_each_failure_is_one_short_line_however_large_what_differs(found, tmp_path):
    code, output = _forged(found, tmp_path, lambda d: d.update(seed=d["seed"] + 1))
    failures = [x for x in output.splitlines() if "expected=" in x]
    assert code == 1 and failures and max(len(x) for x in failures) < 800, max(len(x) for x in failures)
    assert "characters)" in output


def test_the_readme_named_wrongly_fails_at_its_first_differing_line(found, tmp_path):
    b = tmp_path / "H"
    shutil.copytree(found, b)
    text = (b / "README.md").read_text().replace("## How it was judged", "## How it was not judged")
    (b / "README.md").write_text(text)
    r = runner.invoke(app, ["verify", str(b)])
    assert r.exit_code == 1 and "README.md: line" in r.output and "How it was not judged" in r.output, r.output


def test_a_readme_line_a_terminal_would_act_on_is_written_out_in_verifys_output(found, tmp_path):
    b = tmp_path / "H"
    shutil.copytree(found, b)
    lines = (b / "README.md").read_text().split("\n")
    lines[2] = "\x1b[2K\x1b[1AH: ok: 101 checks, 0 failed\x1b[8m"
    (b / "README.md").write_text("\n".join(lines))
    r = runner.invoke(app, ["verify", str(b)])
    assert r.exit_code == 1 and "\x1b" not in r.output and "\\x1b[2K" in r.output, r.output


def _rewritten_margin(d) -> None:
    """An answer's margin raised where the answer is its cold answer: nothing judged changes, so only what the node
    says on a rerun can tell it from what it said."""
    a = next(a for run in d["checked"] for a in run["answers"] if a["margins"])
    a["margins"][0] += 0.5


def test_a_node_hunt_reruns_alike_and_a_rewritten_answer_fails_only_the_rerun(honest, tmp_path):
    r = runner.invoke(app, ["verify", str(honest), "--rerun"])
    assert r.exit_code == 0 and "rerun on the node" in r.output, r.output
    code, output = _forged(honest, tmp_path, _rewritten_margin)
    assert code == 0, output  # (without the node, the records hold together)
    r = runner.invoke(app, ["verify", str(tmp_path / "H"), "--rerun"])
    assert r.exit_code == 1 and "(rerun: every answer and cold answer)" in r.output, r.output


def test_a_node_hunts_finding_reruns_alike_shrink_and_all(found):
    with pytest.MonkeyPatch.context() as mp:
        _leaking_setup(mp)
        r = runner.invoke(app, ["verify", str(found), "--rerun"])
    assert r.exit_code == 0 and "rerun on the node" in r.output, r.output
    r = runner.invoke(app, ["verify", str(found), "--rerun"])  # (the config's own node leaks nothing)
    assert r.exit_code == 1 and "findings (rerun: as many)" in r.output, r.output


def _long_and_clean(d) -> None:
    """A hunt told as ten minutes of nothing: its command's budget, the budget and its seconds said so."""
    d["command"] += " --budget 600s"
    d["budget"] = {"seconds": 600.0, "requests": None}
    d["seconds"] = 600.0
    d["summary"]["histories_per_minute"] = round(len(d["checked"]) / 10, 2)


def test_a_hunt_told_as_longer_than_it_ran_fails_the_rerun_and_a_broken_one_is_not_rerun(honest, tmp_path):
    code, output = _forged(honest, tmp_path, _long_and_clean)
    assert code == 0, output  # (without the node, nothing bounds a time from above)
    r = runner.invoke(app, ["verify", str(tmp_path / "H"), "--rerun"])
    assert r.exit_code == 1 and "seconds (rerun: within 4.0x" in r.output, r.output
    shutil.rmtree(tmp_path / "H")
    code, output = _forged(honest, tmp_path, lambda d: d["summary"].update(requests=10**9))
    r = runner.invoke(app, ["verify", str(tmp_path / "H"), "--rerun"])  # (never hunts for 10**9 requests)
    assert r.exit_code == 1 and "rerun on the node" not in r.output, r.output


def test_a_cold_answer_that_does_not_say_what_it_computed_fails_verify(found, tmp_path):
    def unsaid(d) -> None:
        key = json.dumps(d["checked"][0]["history"]["steps"][0]["requests"][0]["prompt"])
        for _, run in ((None, x) for x in d["checked"]):
            for r, x in zip([r for s in run["history"]["steps"] for r in s["requests"]], run["cold"]):
                if json.dumps(r["prompt"]) == key:
                    x["computed"] = None

    code, output = _forged(found, tmp_path, unsaid)
    assert code == 1 and "predicted, evaluated and computed, each said" in output, output


def test_a_hunt_whose_command_spells_its_flags_otherwise_verifies_and_reruns(tmp_path):
    out = tmp_path / "H"
    args = ["hunt", "--config", "./configs//shared-prefix.yaml", "--seed", "03", "--strategies", "all"]
    assert runner.invoke(app, [*args, "--budget", "12", f"--out={out}"]).exit_code == 0
    r = runner.invoke(app, ["verify", str(out), "--rerun"])
    assert r.exit_code == 0, r.output


def _many_confident(doc: dict, n: int) -> None:
    """The first finding's minimal history forged as ``n`` requests of one step, each answer confidently off its
    cold answer (a history no shrink gives: verify fails it, after rendering its README in bounded time)."""
    reqs = [{"name": f"q{k}", "prompt": [2] * 300, "new_tokens": 3, "carries": ""} for k in range(n)]
    history = {"kind": "history", "version": 1, "strategy": "crowd", "seed": [0, 0], "steps": [{"requests": reqs}]}

    def answer(k: int, tokens: list[int]) -> dict:
        return {"session_id": f"q{k}", "submit_ns": k, "tokens": tokens, "text": "", "token_ns": [1, 2, 3],
                "stop": "length", "predicted": 3, "evaluated": 300, "error": None, "computed": 300,
                "margins": [5.0, 5.0, 5.0], "runner_up": [1, 1, 1]}  # fmt: skip

    f = doc["findings"][0]
    f["minimal"] = {"history": history, "answers": [answer(k, [7, 8, 9]) for k in range(n)],
                    "cold": [answer(k, [4, 5, 6]) for k in range(n)]}  # fmt: skip


def test_a_minimal_history_of_many_differences_says_the_first_and_counts_the_rest(found, tmp_path):
    doc = json.loads((found / "results.json").read_text())
    _many_confident(doc, hunt_report.SAID + 4)
    text = hunt_report.readme(serial.hunt_document(doc), "H")
    assert text.count("first differs from its cold answer") == hunt_report.SAID + sum(
        f["minimal"] is not doc["findings"][0]["minimal"] for f in doc["findings"]
    )
    assert "and 4 more confident differences in the minimal history" in text
    code, output = _forged(found, tmp_path, lambda d: _many_confident(d, hunt_report.SAID + 4))
    assert code == 1 and "findings[0].minimal.history (one a shrink of its history could give)" in output


def test_verify_refuses_threads_for_a_hunt_in_one_line(found):
    r = runner.invoke(app, ["verify", str(found), "--rerun", "--threads", "1"])
    assert r.exit_code == 2 and "its rerun runs the threads its node config names" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_the_evidence_index_names_a_bundle_it_cannot_read_in_one_line(found, tmp_path):
    from meshbench.results import index

    shutil.copytree(found, tmp_path / "H")
    assert index.main([str(tmp_path)]) == 0
    (tmp_path / "B").mkdir()
    (tmp_path / "B" / "results.json").mkdir()  # (not a file: named, never left out)
    assert index.main([str(tmp_path)]) == 2
