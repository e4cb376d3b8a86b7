"""Evidence integrity, probe 5 (issue 57): what a lying server's margins or a withheld answer can no longer turn.
Each test fails without its fix."""

from __future__ import annotations

import random

import pytest

from meshbench.analysis import cancel
from meshbench.analysis import endpoint_margins as m
from meshbench.records.margins import MarginPasses
from meshbench.records.model import Completion, EndpointLevel, EndpointRepetition


def _answer(sid, tokens, margins=None, at=0, error=None):
    return Completion(session_id=sid, submit_ns=at, tokens=tokens, text="", token_ns=[at + 10] * len(tokens),
                      stop="limit", predicted=len(tokens), evaluated=3, error=error, margins=margins)  # fmt: skip


def _honest(n_sessions=16, n_tokens=24, seed=0):
    """Cold answers and warm ones that agree token for token, their margins moved by at most 0.3 (numerics)."""
    rng = random.Random(seed)
    cold, warm = [], []
    for k in range(n_sessions):
        tokens = [rng.randrange(1000) for _ in range(n_tokens)]
        margins = [rng.uniform(0.5, 6.0) for _ in range(n_tokens)]
        cold.append(_answer(f"s{k}", tokens, margins))
        warm.append(_answer(f"s{k}", tokens, [x + rng.uniform(-0.3, 0.3) for x in margins]))
    return cold, warm


def test_one_misreported_margin_does_not_set_the_threshold_of_the_whole_run():
    cold, warm = _honest()
    honest = m.numerics(MarginPasses(cold=cold, warm=warm, together=warm))
    assert honest is not None and honest <= 0.3
    lying = list(warm)
    w = lying[3]
    lying[3] = _answer(w.session_id, w.tokens, [w.margins[0] + 900.0, *w.margins[1:]])  # one warm token at +900
    passes = MarginPasses(cold=cold, warm=lying, together=warm)
    assert m.numerics(passes) <= m.TAIL * 0.3 and m.near_tie(passes) <= m.TAIL * 0.3
    assert "moved by up to 900" in (m.inconsistent(passes) or "")  # (set aside, and said)


def test_margins_inflated_on_the_cache_path_are_bounded_and_called_inconsistent():
    """A server that reports its margins 40 times larger when cache_prompt is not false set 'this run's measured
    numerics' to 156, and every confident divergence through its leaking cache path was 'classified as numerics'."""
    cold, warm = _honest()
    inflated = [_answer(w.session_id, w.tokens, [40 * x for x in w.margins]) for w in warm]
    passes = MarginPasses(cold=cold, warm=inflated, together=inflated)
    assert m.numerics(passes) > 100  # (what the server claims, recorded as measured)
    assert m.near_tie(passes) == m.CAP
    assert "more than any difference in arithmetic moves a margin" in (m.inconsistent(passes) or "")
    # an answer that leaves its cold one at a cold margin of 2.3 is confident, not a near-tie
    c = cold[0]
    at = 1
    cold[0] = _answer(c.session_id, c.tokens, [c.margins[0], 2.3, *c.margins[2:]])
    changed = _answer("s0", [c.tokens[0], c.tokens[1] + 1, *c.tokens[2:]], at=0)
    rep = EndpointRepetition(repetition=0, position=0, wall_s=1.0, metrics_before=None, metrics_after=None,
                             figures={}, sessions=[changed])  # fmt: skip
    d = m.divergences([EndpointLevel(concurrency=1, repetitions=[rep], needle=[], figures={})], passes, "s0")
    assert [(x.session_id, x.token_index, x.kind) for x in d.confident] == [("s0", at, "confident")]
    assert d.threshold == m.CAP


def test_honest_numerics_are_the_largest_change_as_before():
    """The committed llama-server bundles' numerics (the largest change) are within TAIL x their 99th percentile:
    held by recomputing them in verify; here, a run whose largest change is twice its 99th percentile."""
    cold, warm = _honest(n_sessions=20, n_tokens=10)
    w = warm[0]
    warm[0] = _answer(w.session_id, w.tokens, [cold[0].margins[0] + 0.55, *w.margins[1:]])
    assert m.numerics(MarginPasses(cold=cold, warm=warm, together=warm)) == pytest.approx(0.55)


def _cut(sid):
    from meshbench.records.completion import CANCELLED

    return Completion(session_id=sid, submit_ns=0, tokens=[1], text="", token_ns=[1], stop=CANCELLED,
                      predicted=None, evaluated=None, error=None)  # fmt: skip


def test_a_retry_with_nothing_to_judge_it_by_is_not_judged_never_unaffected():
    """A retried answer whose cold answer is missing (withheld, failed) was skipped, and the verdict said
    'affected: False'. It is counted, and the verdict is None."""
    ref = [_answer("s0", [1, 2, 3], [2.0, 2.0, 2.0]), _answer("s1", [4, 5, 6], [2.0, 2.0, 2.0])]
    answers = [_answer("s0", [1, 2, 3]), _answer("s1", [4, 5, 7])]
    v = cancel.verdict(2, [_cut("s1")], ref, answers, {}, {}, 0.05)
    assert v.affected is None and v.unjudged == 1
    # the same answer as its reference run: nothing to judge, and nothing withheld
    same = cancel.verdict(2, [_cut("s1")], ref, [_answer("s0", [1, 2, 3]), _answer("s1", [4, 5, 6])], {}, {}, 0.05)
    assert same.affected is False and same.unjudged is None


def test_an_answer_whose_cold_answer_is_missing_is_counted_unjudged_at_its_level():
    cold, warm = _honest(n_sessions=2, n_tokens=4)
    passes = MarginPasses(cold=cold[:1], warm=warm, together=warm)  # s1's cold answer withheld
    sessions = [_answer("s0", cold[0].tokens, at=0), _answer("s1", [7, 7, 7, 7], at=5)]
    rep = EndpointRepetition(repetition=0, position=0, wall_s=1.0, metrics_before=None, metrics_after=None,
                             figures={}, sessions=sessions)  # fmt: skip
    d = m.divergences([EndpointLevel(concurrency=2, repetitions=[rep], needle=[], figures={})], passes, "s0")
    assert (d.levels[2].answers, d.levels[2].differing, d.levels[2].unjudged) == (1, 0, 1)


def test_a_server_reading_the_sum_of_its_neighbours_ids_is_found_dependent():
    """Finding 4: perturbed neighbours were their own ids rearranged, so a server whose first token reads the sum of
    the other in-flight prompts' ids passed at p = 1. Fresh ids of the workload's change the sum."""
    import numpy as np
    from bad_server import serving

    from meshbench.analysis import perturbation
    from meshbench.endpoint import perturb
    from meshbench.endpoint.client import Endpoint
    from meshbench.endpoint.load import Job
    from meshbench.workload.target import parse_target

    prompts = [[1, 101, 102, 103, 104], [1, 105, 106, 107, 108], [1, 109, 110, 111, 112], [1, 113, 114, 115, 116]]
    jobs = [Job(f"s{k}", {"prompt": p, "n_predict": 2}) for k, p in enumerate(prompts)]
    with serving("sum-leak") as url:
        endpoint = Endpoint(parse_target(url), "native", deadline_s=30.0)
        tested = perturb.perturbation(endpoint, jobs, 4, np.random.default_rng(0))
    assert tested is not None
    pool = perturbation.id_pool(prompts)
    for run in tested.runs:
        for null, sent in zip(prompts[2:], run.neighbour_prompts):
            assert (sent == null) != run.perturbed and (
                not run.perturbed or perturbation.is_perturbation(null, sent, pool)
            )
    assert tested.verdict.depends is True and tested.verdict.p_value < perturbation.ALPHA, tested.verdict


def test_a_node_sweep_refuses_cancel_off_before_any_work(tmp_path):
    """Finding 9: --cancel off on a node sweep ran every level, then lost the run on the workload record."""
    from typer.testing import CliRunner

    from meshbench.cli import app

    r = CliRunner().invoke(app, ["sweep", "--cancel", "off", "--levels", "1", "--out", str(tmp_path / "B")])
    assert r.exit_code == 2 and "workload.cancel off: cancel-and-retry runs against an endpoint" in r.output
    assert not (tmp_path / "B").exists()


def test_a_relative_llama_server_path_runs_that_file_not_one_on_path(tmp_path, monkeypatch):
    """Finding 10: ./llama-server was looked up on PATH, and the llama-server there ran and was recorded."""
    from meshbench.endpoint import llama_server

    here, elsewhere = tmp_path / "here", tmp_path / "on-path"
    here.mkdir()
    elsewhere.mkdir()
    for folder, said in ((here, "the one asked for"), (elsewhere, "another on PATH")):
        exe = folder / "llama-server"
        exe.write_text(f"#!/bin/sh\necho 'version: {said}'\n")
        exe.chmod(0o755)
    monkeypatch.chdir(here)
    monkeypatch.setenv("PATH", f"{elsewhere}:/usr/bin:/bin")
    found = llama_server.binary("./llama-server")
    assert found == here / "llama-server"
    assert llama_server.version(found).startswith("the one asked for")


def test_a_markdown_summary_onto_a_full_disk_leaves_no_temporary_file(tmp_path, monkeypatch):
    """Finding 13: compare --markdown onto a full disk said "cannot write it" and left .meshbench-md-* behind."""
    import errno
    import os

    from meshbench.cli import compare
    from meshbench.errors import MeshbenchError

    real_replace = os.replace

    def full(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(MeshbenchError, match="cannot write it"):
        compare._write_markdown(tmp_path / "summary.md", "# summary\n")
    monkeypatch.setattr(os, "replace", real_replace)
    assert list(tmp_path.iterdir()) == []


def test_verify_of_a_perturbation_with_forty_runs_fails_without_recomputing_its_relabellings(tmp_path):
    """Finding 7: 40 runs made verify recompute the exact test over C(40, 20) = 1.4e11 relabellings before any
    check on the run's shape could fail it."""
    import json
    import shutil
    from pathlib import Path

    from typer.testing import CliRunner

    from meshbench.cli import app

    src = Path(__file__).parent.parent / "evidence" / "LLAMA-SERVER-GEMMA3-DEFAULTS"
    b = tmp_path / "B"
    shutil.copytree(src, b)
    data = json.loads((b / "results.json").read_text())
    lv = next(x for x in data["levels"] if x.get("perturbation"))
    runs = lv["perturbation"]["runs"]
    lv["perturbation"]["runs"] = [{**runs[k % len(runs)], "run": k} for k in range(40)]
    (b / "results.json").write_text(json.dumps(data))
    r = CliRunner().invoke(app, ["verify", str(b), "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 1, r.output
    fields = [f["field"] for f in doc["bundles"][0]["failures"]]
    assert any("not recomputed: the runs are not the method's" in f for f in fields), fields


def test_an_endpoint_sweep_of_more_sessions_than_threads_it_may_start_is_refused_up_front(tmp_path):
    """Finding 11: a margin pass sending all at once started a thread per session: at 100,000 sessions "can't start
    new thread" after the cold and warm passes, and the run was lost."""
    from typer.testing import CliRunner

    from meshbench import limits
    from meshbench.cli import app

    prompts = tmp_path / "p.txt"
    prompts.write_text("a b\nc d\n")
    n = limits.MAX_ENDPOINT_SESSIONS + 1
    args = ["sweep", "--target", "http://127.0.0.1:9", "--prompts", str(prompts), "--sessions", str(n)]
    r = CliRunner().invoke(app, [*args, "--levels", "1", "--out", str(tmp_path / "B")])
    assert r.exit_code == 2 and f"workload.sessions {n}: an endpoint sweep sends every session at once" in r.output


@pytest.mark.parametrize("word,setting", [("on", "on"), ("off", "off")])
def test_yaml_cache_prompt_unquoted_is_the_setting_as_the_docs_write_it(tmp_path, word, setting):
    from meshbench.workload import yaml_config

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"engine:\n  cache_prompt: {word}\n")
    assert yaml_config.read_yaml(cfg)["engine"]["cache_prompt"] == setting


def test_server_text_reaches_the_readme_escaped_never_as_markup(tmp_path):
    """Finding 8: a server's model name or version could inject a heading, a table row, <script> or an unclosed
    <!-- that hid the real report, and verify passed (it renders the same text). Every such string is escaped."""
    import json
    import shutil
    from pathlib import Path

    from typer.testing import CliRunner

    from meshbench.cli import app
    from meshbench.results import kinds
    from meshbench.verify import bundle as verify

    src = Path(__file__).parent.parent / "evidence" / "LLAMA-SERVER-GEMMA3-DEFAULTS"
    b = tmp_path / "B"
    shutil.copytree(src, b)
    data = json.loads((b / "results.json").read_text())
    hostile = "x <!-- hidden\n# Verdicts\n| a | b |\n<script>alert(1)</script> `code` [link](http://e)"
    e = data["endpoint"]
    e["build_info"], e["models"] = hostile, [hostile]
    e["launched"] = {**e["launched"], "version": hostile, "model": hostile, "args": ["--metrics", hostile]}
    (b / "results.json").write_text(json.dumps(data))
    text = kinds.readme(data, verify.bundle_name((src / "README.md").read_text(), src))
    head = text.split("## Verdicts")[0]
    assert "<!--" not in head.replace("\\<!--", "") and "<script>" not in head.replace("\\<script\\>", "")
    assert not any(line.startswith(("# Verdicts", "| a |")) for line in head.splitlines())
    assert text.count("## Verdicts") == 1
    (b / "README.md").write_text(text)
    r = CliRunner().invoke(app, ["verify", str(b)])
    raw = text.split("\n", 3)
    (b / "README.md").write_text("\n".join([*raw[:2], raw[2].replace("\\<!--", "<!--"), raw[3]]))
    assert CliRunner().invoke(app, ["verify", str(b)]).exit_code == 1, r.output  # (a README not rendered so fails)


def test_a_closed_loop_pass_with_more_in_flight_than_its_clients_fails_verify(tmp_path):
    """Finding 6: at C = 1, one session shifted to overlap another (two in flight on one client) passed verify."""
    import json
    import shutil
    from pathlib import Path

    from typer.testing import CliRunner

    from meshbench.cli import app

    src = Path(__file__).parent.parent / "evidence" / "LLAMA-SERVER-GEMMA3-DEFAULTS"
    b = tmp_path / "B"
    shutil.copytree(src, b)
    data = json.loads((b / "results.json").read_text())
    lv = next(x for x in data["levels"] if x["concurrency"] == 1)
    first, second = lv["repetitions"][0]["sessions"][:2]
    shift = second["submit_ns"] - first["submit_ns"] - 1000  # second now starts 1 us after first
    second["submit_ns"] -= shift
    second["token_ns"] = [t - shift for t in second["token_ns"]]
    (b / "results.json").write_text(json.dumps(data))
    r = CliRunner().invoke(app, ["verify", str(b), "--json"])
    fields = [f["field"] for f in json.loads(r.stdout)["bundles"][0]["failures"]]
    assert r.exit_code == 1
    assert "levels[0].repetitions[0]: at most C = 1 requests in flight (closed loop, by the stamps)" in fields, fields


@pytest.mark.parametrize("bundle", ["MB-CONVERSATIONS", "LLAMA-SERVER-GEMMA3-CONVERSATIONS/defaults"])
def test_compare_holds_every_turn_of_a_conversation_not_the_first_or_last_alone(bundle):
    """Finding 12: compare of two conversation bundles compared first turns only (an endpoint's) or each session's
    last record (a node's): a server whose later turns changed was 'outputs same'. Every turn is an output."""
    import json
    from pathlib import Path

    from meshbench.compare import sides
    from meshbench.results import kinds

    data = json.loads((Path(__file__).parent.parent / "evidence" / bundle / "results.json").read_text())
    kind = data.get("kind", kinds.NODE)
    side = sides.side(kind, kinds.typed_results(data))
    turns = data["config"]["workload"].get("turns") or data["workload"].get("turns")
    for level in side.levels.values():
        keys = set(level.outputs)
        later = {k for k in keys if " turn " in k}
        assert later and {int(k.split(" turn ")[1]) for k in later} == set(range(2, turns + 1)), sorted(keys)


def test_workloads_of_other_session_counts_are_named_so_not_as_equal_lists():
    """Minor: two bundles of 8 and 4 sessions were refused with 'new_tokens: [8] against [8]'."""
    from meshbench.compare import diff

    assert diff._short([8] * 8, [8] * 4) == "8 sessions, [8]" and diff._short([8] * 4, [8] * 8) == "4 sessions, [8]"
    assert diff._short([8, 9], [9, 8]) == "[8, 9]"


def test_gauges_beyond_the_load_of_a_target_server_carry_a_caveat():
    """Minor: a --target server's gauges were bounded only by the slots it claims: 10,000 processing at C=1 with
    no caveat. verify cannot hold a server meshbench did not start to the pass; the README says so."""
    import json
    from pathlib import Path

    from meshbench.results import accounting_report, typed

    src = Path(__file__).parent.parent / "evidence" / "LLAMA-SERVER-GEMMA3-DEFAULTS" / "results.json"
    data = json.loads(src.read_text())
    data["endpoint"]["launched"] = None
    data["endpoint"]["total_slots"] = 65536
    lv = next(x for x in data["levels"] if x["concurrency"] == 1)
    gauges = next(rep["gauges"] for rep in lv["repetitions"] if rep.get("gauges"))
    gauges[0]["processing"] = 10_000
    text = "\n".join(accounting_report.section(typed.endpoint(data)))
    assert "count more requests than meshbench sent** (10000 processing or deferred at C=1" in text


def test_a_stale_slot_leak_on_the_cache_path_is_found_by_the_test_through_the_cache():
    """Finding 5: a server that leaks only when cache_prompt is not false (a request reads the end of the previous
    other request's prompt) passed every proof: the perturbation test sends cache_prompt false. The test through
    the cache, each run primed with its neighbours' prompts, finds it; the test without the cache does not."""
    import numpy as np
    from bad_server import serving

    from meshbench.endpoint import perturb
    from meshbench.endpoint.client import Endpoint
    from meshbench.endpoint.load import Job
    from meshbench.workload.target import parse_target

    prompts = [[1, 101, 102, 103, 104], [1, 105, 106, 107, 108]]
    jobs = [Job(f"s{k}", {"prompt": p, "n_predict": 2}) for k, p in enumerate(prompts)]
    with serving("stale-slot") as url:
        endpoint = Endpoint(parse_target(url), "native", deadline_s=30.0)
        cold = perturb.perturbation(endpoint, jobs, 2, np.random.default_rng(0))
        cached = perturb.perturbation(endpoint, jobs, 2, np.random.default_rng(0), cache_path=True)
    assert cold is not None and cold.verdict.depends is False, cold.verdict
    assert cached is not None and cached.verdict.depends is True, cached.verdict


def test_a_bundle_with_the_test_through_the_cache_verifies_and_one_stripped_of_it_fails(tmp_path):
    """Finding 5, and its downgrade: a sweep whose requests use the prompt cache runs the perturbation test through
    it too. A bundle stripped of every such test (to look like one made before it) is not read as older: it fails."""
    import json

    src, b, data = _copy_defaults(tmp_path)
    assert data["config"]["engine"]["cache_prompt"] is None  # (the server's default: the cache on)
    assert any(lv.get("perturbation_cache") for lv in data["levels"])
    text = (src / "README.md").read_text()
    assert "the second table below runs it again through the cache" in text and "Through the prompt cache:" in text
    assert _verify(src, b, data)[0] == 0
    lv = next(x for x in data["levels"] if x.get("perturbation_cache"))
    at = f"levels[{data['levels'].index(lv)}].perturbation_cache"
    short = json.loads(json.dumps(data))
    cut = next(x for x in short["levels"] if x.get("perturbation_cache"))
    cut["perturbation_cache"] = {**cut["perturbation_cache"], "runs": cut["perturbation_cache"]["runs"][:-1]}
    code, fields, _ = _verify(src, b, short)
    assert code == 1 and any(f.startswith(at + ".") for f in fields), fields
    for x in data["levels"]:
        x.pop("perturbation_cache", None)
    code, fields, _ = _verify(src, b, data)
    assert code == 1 and f"{at} (exactly where the sweep's requests use the prompt cache)" in fields, fields


def test_a_near_tie_flips_to_the_cold_answer_s_second_choice_or_it_is_not_judged():
    """A review of probe 5: a server reporting every margin as 0.01 made every divergence a near-tie. Where the
    server names each token's second choice by id, a change to any other token within the threshold is unknown (a
    third choice, whose margin the top two do not give: llama-server's own 3-way near-ties on Gemma do this), and a
    change beyond the threshold is confident."""
    cold = _answer("s0", [1, 2, 3], [2.0, 0.01, 2.0])
    cold = Completion(**{**{f: getattr(cold, f) for f in Completion.__slots__}, "runner_up": [7, 8, 9]})
    to_second = _answer("s0", [1, 8, 5])
    to_another = _answer("s0", [1, 99, 5])
    assert m.divergence(1, 0, "s0", to_second, cold, [], 0.05).kind == "near-tie"
    assert m.divergence(1, 0, "s0", to_another, cold, [], 0.05).kind == "unknown"
    assert m.divergence(1, 0, "s0", _answer("s0", [99, 2, 3]), cold, [], 0.05).kind == "confident"  # (margin 2.0)
    text = _answer("s0", [1, 2, 3], [2.0, 0.01, 2.0])  # (an OpenAI API's answer names no ids: margins alone)
    assert m.divergence(1, 0, "s0", to_another, text, [], 0.05).kind == "near-tie"


def test_the_runner_up_is_read_from_llama_servers_top_logprobs():
    from meshbench.endpoint.native_probs import runner_ups

    probs = [
        {"top_logprobs": [{"id": 5, "logprob": -2.0}, {"id": 4, "logprob": -0.1}]},
        {"top_logprobs": [{"logprob": -0.1}]},
    ]
    assert runner_ups(probs, [4, 9]) == [5, None]
    tied = [{"top_logprobs": [{"id": 11, "logprob": -0.69}, {"id": 10, "logprob": -0.69}]}]
    assert runner_ups(tied, [10]) == [11]  # (a tie: the other one, never the token emitted)


@pytest.mark.parametrize("bad", [{"logprob": -0.7}, {"id": "10", "logprob": -0.7}, {"id": 10.0, "logprob": -0.7}])
def test_a_top_logprob_without_an_integer_id_is_the_answer_s_fault(bad):
    """A second review of probe 5: omitting the ids (or sending them as text) made every runner-up unknown, and the
    runner-up rule never applied."""
    from meshbench.endpoint.native_probs import Malformed, runner_ups

    with pytest.raises(Malformed, match="no integer 'id'"):
        runner_ups([{"top_logprobs": [{"id": 9, "logprob": -0.1}, bad]}], [9])


def test_what_the_measured_numerics_rest_on_is_said_and_a_clipped_impossible_change_is_inconsistent():
    cold, warm = _honest()
    w = warm[3]
    warm[3] = _answer(w.session_id, w.tokens, [w.margins[0] + 900.0, *w.margins[1:]])
    passes = MarginPasses(cold=cold, warm=warm, together=warm)
    assert "2 larger changes, up to 900" in m.caveats(passes)  # (the warm answer is also the together one here)
    assert "moved by up to 900" in (m.inconsistent(passes) or "")  # (set aside, and still said)
    few_cold, few_warm = _honest(n_sessions=2, n_tokens=10)
    assert "measured on 40 tokens only" in m.caveats(MarginPasses(cold=few_cold, warm=few_warm, together=few_warm))
    honest_cold, honest_warm = _honest()
    assert m.caveats(MarginPasses(cold=honest_cold, warm=honest_warm, together=honest_warm)) == ""


def test_a_threshold_at_the_floor_is_named_the_floor():
    from meshbench.results.endpoint_proofs_report import threshold_source

    cold, _ = _honest(n_sessions=2, n_tokens=4)
    assert threshold_source(MarginPasses(cold=cold, warm=cold, together=cold)).startswith("the floor")


def test_a_model_file_replaced_while_it_was_checked_is_not_remembered_as_checked(tmp_path, monkeypatch):
    import factories as f

    from meshbench.model import gguf_io

    model = f.tiny_gguf(tmp_path / "m.gguf", "q8_0")
    digests = iter(["a" * 64, "b" * 64])  # (the bytes hashed before the check are not those after it)
    monkeypatch.setattr(gguf_io, "sha256", lambda _path: next(digests))
    gguf_io.checked_model(model)
    assert "a" * 64 not in gguf_io._CHECKED


def test_an_unusable_llama_server_from_the_environment_names_the_environment_variable(tmp_path):
    from meshbench.endpoint import llama_server
    from meshbench.errors import MeshbenchError

    with pytest.raises(MeshbenchError, match=r"^\$MESHBENCH_LLAMA_SERVER .*: no such file"):
        llama_server.binary(str(tmp_path / "nope"))


def test_a_server_that_adds_no_bos_has_every_id_of_its_prompts_perturbed():
    """A review of probe 5: the first id was kept as a BOS, so one-token prompts from a server that adds none were
    sent unchanged in the perturbed runs (null against null) and the run was lost at verify."""
    from meshbench.analysis import perturbation

    with_bos, without = [[1, 5, 6], [1, 7]], [[105], [105], [106], [105]]
    assert perturbation.kept(with_bos) == 1 and perturbation.kept(without) == 0
    assert perturbation.id_pool(without) == [105, 106]
    assert perturbation.is_perturbation([105], [106], [105, 106], head=0)
    assert not perturbation.is_perturbation([1, 5, 6], [2, 5, 7], [5, 6, 7], head=1)  # (the BOS kept)


def test_perturbed_prompts_that_are_not_the_ones_drawn_from_the_seed_fail_verify(tmp_path):
    """A review of probe 5: verify held perturbed prompts to 'ids of the workload's' only, so a forger could send a
    neighbour's own prompt with one id changed and the README still said fresh ids. They are drawn again."""
    src, b, data = _copy_defaults(tmp_path)
    assert _verify(src, b, data)[0] == 0
    lv = next(x for x in data["levels"] if x.get("perturbation"))
    run = next(r for r in lv["perturbation"]["runs"] if r["perturbed"])
    own = data["workload"]["prompt_ids"][int(lv["perturbation"]["neighbours"][0][1:])]
    pool = sorted({t for q in data["workload"]["prompt_ids"] for t in q[1:]})
    run["neighbour_prompts"][0] = [*own[:-1], next(t for t in pool if t != own[-1])]  # one id changed
    code, fields, _ = _verify(src, b, data)
    assert code == 1 and any("drawn again from the seed" in f for f in fields), fields


def test_a_hit_erased_while_the_store_still_holds_its_blocks_is_no_eviction():
    """Minor: a prefix-cache bundle with its hits erased (the cached tokens and the stats made consistent) passed
    verify: the replay read each missing hit as 'the store evicted', although the store's bytes equalled the
    replayed store's at every tick. A hit short of the replay's while those bytes still agree fails."""
    from meshbench.analysis.checks import Checks
    from meshbench.verify.prefix import _Replay

    shared = tuple(range(1, 9))  # two blocks of 4 shared, then each session's own
    prompts = {("s0", 1): (*shared, 20, 21), ("s1", 1): (*shared, 30, 31)}

    def run(cached_s1: int, evicted: bool) -> Checks:
        c, r = Checks(), _Replay(prompts, 4, {("s0", 1): 0, ("s1", 1): cached_s1})
        r.floor = not evicted  # (a level with misses: no lower bound from the live sessions' blocks)
        r.take("s0", ("s0", 1), 10)
        r.written("s0", ("s0", 1), 0, 10)
        r.check_bytes(c, "tick 0", len(r.store) * 4 * 2, 2)
        r.take("s1", ("s1", 1), 10)
        r.written("s1", ("s1", 1), 0, 10)
        most = len(r.store) * 4 * 2
        r.check_bytes(c, "tick 1", most - (8 if evicted else 0), 2)
        return c

    assert run(8, evicted=False).failures == []  # (the hit the replay gives)
    erased = run(0, evicted=False)
    assert [f.field for f in erased.failures] == [
        "tick 1: s1#1's hit of 0 positions (the store held 8 of its prompt, and its bytes are still the replay's 16: "
        "nothing evicted)"
    ]
    assert run(0, evicted=True).failures == []  # (the store did evict: a miss it explains)


def test_a_results_json_with_a_key_twice_is_refused(tmp_path):
    """A second review: a duplicate "kind" line made CI's grep see an endpoint bundle (no rerun) while json read a
    node bundle and verify passed it. A key said twice is refused; CI classifies through the same loader."""
    from meshbench.errors import MeshbenchError
    from meshbench.results import document

    p = tmp_path / "results.json"
    p.write_text('{"kind": "endpoint", "schema_version": 3, "kind": "node"}')
    with pytest.raises(MeshbenchError, match="the key 'kind' appears twice"):
        document.load(p)


def _copy_defaults(tmp_path):
    import json
    import shutil
    from pathlib import Path

    src = Path(__file__).parent.parent / "evidence" / "LLAMA-SERVER-GEMMA3-DEFAULTS"
    b = tmp_path / "B"
    shutil.copytree(src, b)
    return src, b, json.loads((b / "results.json").read_text())


def _verify(src, b, data) -> tuple[int, list[str], list[str]]:
    import json

    from typer.testing import CliRunner

    from meshbench.cli import app
    from meshbench.results import kinds
    from meshbench.verify import bundle as verify

    (b / "results.json").write_text(json.dumps(data))
    (b / "README.md").write_text(kinds.readme(data, verify.bundle_name((src / "README.md").read_text(), src)))
    r = CliRunner().invoke(app, ["verify", str(b), "--json"])
    doc = json.loads(r.stdout)["bundles"][0]
    return r.exit_code, [f["field"] for f in doc.get("failures", [])], doc.get("notes", [])


def test_runner_ups_stripped_from_one_answer_or_from_every_answer_fail(tmp_path):
    """Stripped of every runner-up, a bundle once read as one made before they were recorded, its near-ties judged
    by the server's margins alone: a downgrade. Every native answer with margins must name them."""
    import json

    src, b, data = _copy_defaults(tmp_path)
    assert _verify(src, b, data)[0] == 0
    field = "runner_up (every native answer with margins names each token's second choice)"
    one = json.loads(json.dumps(data))
    one["margins"]["cold"][0]["runner_up"] = None
    code, fields, _ = _verify(src, b, one)
    assert code == 1 and field in fields, fields
    every = [x for side in ("cold", "warm", "together", "sibling") for x in data["margins"].get(side) or []]
    every += [x for lv in data["levels"] if lv.get("cancel") for k in ("reference", "answers") for x in lv["cancel"][k]]
    for x in every:
        x["runner_up"] = None
    code, fields, _ = _verify(src, b, data)
    assert code == 1 and field in fields, fields


def test_every_test_rearranged_is_not_let_through_as_an_older_bundle(tmp_path):
    """A bundle whose perturbed prompts were each neighbour's own ids rearranged (as before fresh ids were drawn)
    was judged under that older rule: one test rearranged, or all of them, now fails."""
    src, b, data = _copy_defaults(tmp_path)
    own = data["workload"]["prompt_ids"]
    for lv in data["levels"]:
        for name in ("perturbation", "perturbation_cache"):
            t = lv.get(name)
            for run in (t or {}).get("runs", []):
                if run["perturbed"]:  # (the neighbours' own ids, two swapped)
                    mine = [own[int(n[1:])] for n in t["neighbours"]]
                    run["neighbour_prompts"] = [[q[0], q[2], q[1], *q[3:]] for q in mine]
    code, fields, notes = _verify(src, b, data)
    assert code == 1 and any("drawn again from the seed" in f for f in fields), fields
    assert not any("rearranged" in n for n in notes)


def test_a_needle_named_otherwise_fails_in_one_check_not_a_crash(tmp_path):
    src, b, data = _copy_defaults(tmp_path)
    data["needle"]["prompt_of"] = "s0 <!-- "
    code, fields, _ = _verify(src, b, data)
    assert code == 1 and fields == ["needle.prompt_of (the first session's prompt)"]
    assert "the needle is s0 \\<!--'s prompt" in (b / "README.md").read_text()


def test_the_cap_is_named_only_where_the_threshold_is_the_cap():
    from meshbench.results.endpoint_proofs_report import threshold_source

    cold, warm = _honest()
    w = warm[3]
    warm[3] = _answer(w.session_id, w.tokens, [w.margins[0] + 900.0, *w.margins[1:]])
    assert threshold_source(MarginPasses(cold=cold, warm=warm, together=warm)) == "this run's measured numerics"
    inflated = [_answer(x.session_id, x.tokens, [40 * y for y in x.margins]) for x in warm]
    assert threshold_source(MarginPasses(cold=cold, warm=inflated, together=inflated)).startswith("the cap")


def test_margin_passes_dropped_from_a_server_that_gives_log_probabilities_fail(tmp_path):
    """A review of schema 4: margins set to null skipped the runner-up and sibling checks, and the README's margins
    section vanished; the cancel runs, asked alike, still carried margins, which contradicts 'no log-probabilities'."""
    src, b, data = _copy_defaults(tmp_path)
    data["margins"], data["divergences"] = None, None
    code, fields, _ = _verify(src, b, data)
    assert code == 1
    assert "margins (absent only where the server gives no log-probabilities: no answer has them)" in fields


def test_margins_stripped_from_the_cancel_runs_alone_fail(tmp_path):
    src, b, data = _copy_defaults(tmp_path)
    run = next(lv["cancel"] for lv in data["levels"] if lv.get("cancel"))
    for x in run["answers"]:
        x["margins"], x["runner_up"] = None, None
    code, fields, _ = _verify(src, b, data)
    assert code == 1 and "margins (every answer that asked for them, with tokens, has them)" in fields, fields


def test_a_runner_up_that_is_the_token_itself_fails(tmp_path):
    src, b, data = _copy_defaults(tmp_path)
    x = data["margins"]["cold"][0]
    x["runner_up"] = list(x["tokens"])
    code, fields, _ = _verify(src, b, data)
    assert (
        code == 1 and f"{x['session_id']}.runner_up (an id exactly where a margin is, never the token itself)" in fields
    )


def test_an_echo_saying_cache_prompt_off_beside_answers_served_from_the_cache_fails(tmp_path):
    """A review of schema 4: the echo set to off (and the cache-path tests dropped with it) passed, though the
    server said it computed fewer prompt tokens than it evaluated: it took them from its cache."""
    src, b, data = _copy_defaults(tmp_path)
    data["config"]["engine"]["cache_prompt"] = "off"
    code, fields, _ = _verify(src, b, data)
    assert code == 1 and any(f.endswith(": every prompt token computed (cache_prompt false)") for f in fields), fields
