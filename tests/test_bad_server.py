"""An endpoint that answers the wrong way on purpose (tests/bad_server.py): every wrong answer is that session's
failure, recorded as such; the level goes on, the verdicts fail, the sweep exits 1 with its bundle kept, and
verify names every failed answer. Never a traceback, never a verdict passed on outputs that do not exist."""

from __future__ import annotations

import json
from pathlib import Path

import bad_server
import pytest
from typer.testing import CliRunner

from meshbench.cli import app

runner = CliRunner()
VERDICTS = ("batch_invariant", "run_to_run_deterministic", "needle_stable")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("p") / "prompts.txt"
    p.write_text("the cat sat\na quick brown fox\nnumbers go up\nhello there\n")
    return p


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("c") / "deadline.yaml"
    p.write_text("engine:\n  deadline_s: 2\n")
    return p


@pytest.fixture(scope="module")
def short(tmp_path_factory) -> Path:
    """For a server that never answers: every request fails at its deadline whatever its length, so a short one."""
    p = tmp_path_factory.mktemp("c") / "short-deadline.yaml"
    p.write_text(f"engine:\n  deadline_s: {SHORT_DEADLINE_S}\n")
    return p


SHORT_DEADLINE_S = 0.05
SILENT = ("stall", "drip")  # modes that never send a whole answer


def _sweep(url: str, prompts: Path, config: Path, out: Path, *extra: str):
    args = ["sweep", "--config", str(config), "--target", url, "--prompts", str(prompts), "--sessions", "4"]
    args += ["--new-tokens", "3", "--levels", "1,2", "--repeat", "1", "--warmup", "0", "--out", str(out), *extra]
    return runner.invoke(app, args)


def _answers(data: dict) -> list[dict]:
    every = [c for lv in data["levels"] for rep in lv["repetitions"] for c in rep["sessions"]]
    return every + [t["completion"] for lv in data["levels"] for t in lv["needle"]] + [data["needle"]["alone"]]


@pytest.mark.parametrize("api", ["native", "openai"])
def test_a_server_that_answers_well_passes(api, prompts, config, tmp_path):
    with bad_server.serving("ok", api) as url:
        r = _sweep(url, prompts, config, tmp_path / "B")
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "B" / "results.json").read_text())
    assert all(data["verdicts"][v] is True for v in VERDICTS)
    assert data["verdicts"]["compared"] == ("tokens" if api == "native" else "text")
    assert runner.invoke(app, ["verify", str(tmp_path / "B")]).exit_code == 0


WRONG = [
    ("native", m)
    for m in bad_server.MODES_NATIVE
    if m not in ("ok", "metrics-1e400", "props-bad", "props-drip", "sum-leak", "stale-slot")
] + [("openai", m) for m in bad_server.MODES_OPENAI if m != "ok"]


@pytest.mark.parametrize("api, mode", WRONG)
def test_a_wrong_answer_fails_its_session_and_every_verdict(api, mode, prompts, config, short, tmp_path):
    out = tmp_path / "B"
    extra = ["--eos", "ban"] if mode == "ignores-eos-ban" else []
    with bad_server.serving(mode, api) as url:
        r = _sweep(url, prompts, short if mode in SILENT else config, out, *extra)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    assert r.exit_code == 1, r.output
    data = json.loads((out / "results.json").read_text())  # the bundle is kept: the failures are evidence
    failed = [c for c in _answers(data) if c["error"]]
    assert failed, f"{mode}: no session failed"
    assert all(data["verdicts"][v] is False for v in VERDICTS), data["verdicts"]
    assert sum(data["verdicts"]["failed"].values()) > 0
    v = runner.invoke(app, ["verify", str(out)])
    assert v.exit_code == 1 and ": answered expected=answered found=" in v.output, v.output


def test_a_server_that_sheds_load_fails_only_where_it_shed(prompts, config, tmp_path):
    with bad_server.serving("shed") as url:
        r = _sweep(url, prompts, config, tmp_path / "B")
    assert r.exit_code == 1
    data = json.loads((tmp_path / "B" / "results.json").read_text())
    assert data["verdicts"]["failed"]["1"] == 0 and data["verdicts"]["failed"]["2"] > 0
    assert all(c["error"] is None for c in data["levels"][0]["repetitions"][0]["sessions"])
    assert all(data["verdicts"][v] is False for v in VERDICTS)


@pytest.mark.parametrize(
    "mode, expect",
    [
        ("http-500", "HTTP 500"),
        ("non-utf8", "UnicodeDecodeError"),
        ("content-int", "'content' is int, not text"),
        ("chunk-list", "a chunk is list, not an object"),
        ("predicted-lie", "the server says it generated 1000000 tokens; it sent 3"),
        ("predicted-negative", "'tokens_predicted' is -1, not a count"),
        ("too-many-tokens", "more than the 3 tokens asked for"),
        ("never-ends", "more than the 3 tokens asked for"),
        ("stall", f"no answer within the deadline ({SHORT_DEADLINE_S:g} s)"),
        ("huge-line", "a line over 1048576 bytes"),
        ("ignores-eos-ban", "stopped at 1 of 3 tokens under eos ban"),
        ("close-early", "the stream closed before its end"),
        ("no-token-ids", "text but no token ids"),
        ("drip", f"no answer within the deadline ({SHORT_DEADLINE_S:g} s)"),
    ],
)
def test_each_failure_says_what_was_wrong(mode, expect, prompts, config, short, tmp_path):
    extra = ["--eos", "ban"] if mode == "ignores-eos-ban" else []
    with bad_server.serving(mode) as url:
        _sweep(url, prompts, short if mode in SILENT else config, tmp_path / "B", *extra)
    data = json.loads((tmp_path / "B" / "results.json").read_text())
    errors = {c["error"] for c in _answers(data) if c["error"]}
    assert any(expect in e for e in errors), errors


def test_tok_s_counts_what_was_received_not_what_the_server_claims(prompts, config, tmp_path):
    with bad_server.serving("predicted-lie") as url:
        _sweep(url, prompts, config, tmp_path / "B")
    data = json.loads((tmp_path / "B" / "results.json").read_text())
    for lv in data["levels"]:
        f = lv["repetitions"][0]["figures"]
        assert f["completed"] == 0 and f["tokens_per_s"] == 0.0  # every answer failed: nothing was generated


def test_an_openai_stream_cut_by_the_server_is_a_failure_not_an_early_stop(prompts, config, tmp_path):
    with bad_server.serving("cut", "openai") as url:
        _sweep(url, prompts, config, tmp_path / "B")
    data = json.loads((tmp_path / "B" / "results.json").read_text())
    assert {c["error"] for c in _answers(data)} == {
        "malformed answer: the stream ended without a finish reason (cut by the server)"
    }
    assert all(lv["repetitions"][0]["figures"]["early_stops"] == 0 for lv in data["levels"])


@pytest.mark.parametrize("mode", ["metrics-1e400", "props-bad"])
def test_a_bad_side_answer_is_dropped_and_the_run_is_kept(mode, prompts, config, tmp_path):
    with bad_server.serving(mode) as url:
        r = _sweep(url, prompts, config, tmp_path / "B")
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "B" / "results.json").read_text())
    if mode == "props-bad":
        assert data["endpoint"].get("total_slots") is None and len(data["endpoint"]["model_path"]) == 1000
    else:
        assert all(rep["metrics_before"] == {} for lv in data["levels"] for rep in lv["repetitions"])


def test_compare_refuses_a_bundle_whose_sessions_failed(prompts, config, tmp_path):
    with bad_server.serving("ok") as url:
        assert _sweep(url, prompts, config, tmp_path / "good").exit_code == 0
    with bad_server.serving("http-500") as url:
        assert _sweep(url, prompts, config, tmp_path / "bad").exit_code == 1
    r = runner.invoke(app, ["compare", str(tmp_path / "good"), str(tmp_path / "bad"), "--perf", "ignore"])
    assert r.exit_code == 2, r.output
    assert "does not pass verify" in r.output and "answered expected=answered found=HTTP 500" in r.output


def test_an_endpoint_sweep_too_large_to_record_is_refused_before_sending(prompts, tmp_path):
    from test_bad_input import run_refused

    many = tmp_path / "many.txt"
    many.write_text("a prompt\n" * 500)  # (at most 512 sessions: meshbench.limits.MAX_ENDPOINT_SESSIONS)
    with bad_server.serving("never-ends") as url:  # nothing is sent: a request here would never end
        run_refused(
            "sweep", "--target", url, "--prompts", many, "--sessions", "500", "--new-tokens", "100000",
            "--levels", "1", "--out", tmp_path / "B", expect="more than the 4000000 a results.json can hold",
        )  # fmt: skip
    assert not (tmp_path / "B").exists()


@pytest.mark.parametrize(
    "args, expect",
    [
        (["--serve", "llama-server", "--model", "m.gguf", "--server-args", '-np "1'], "No closing quotation"),
        (["--serve", "llama-server", "--model", "m.gguf", "--server-args", "--host 0.0.0.0"], "--host: meshbench sets"),
        (["--target", "http://127.0.0.1:9", "--eos", "continue"], "workload.eos continue"),
        (["--target", "http://127.0.0.1:9", "--max-queue-depth", "3"], "budget: an endpoint sweep"),
        (["--target", "http://127.0.0.1:9", "--threads", "2"], "engine.threads builds an engine of meshbench's own"),
        (["--target", "http://127.0.0.1:9", "--isolate"], "engine.isolate builds an engine"),
        (["--target", "http://127.0.0.1:9", "--serve", "llama-server"], "--target (a server you run) or --serve"),
        (["--allow-remote"], "engine.allow_remote is an endpoint's"),
    ],
)
def test_an_endpoint_sweep_refuses_what_a_user_cannot_mean(args, expect, prompts, tmp_path):
    from test_bad_input import run_refused

    run_refused("sweep", *args, "--prompts", prompts, "--sessions", "2", "--levels", "1", expect=expect)


def test_a_target_off_this_machine_needs_allow_remote(prompts, tmp_path):
    from test_bad_input import run_refused

    # 192.0.2.1 is TEST-NET-1 (documentation only): refused before any connection is tried
    run_refused(
        "sweep", "--target", "http://192.0.2.1:9", "--prompts", prompts, "--sessions", "2", "--levels", "1",
        expect="not on this machine (loopback)",
    )  # fmt: skip


def test_an_ipv6_target_keeps_its_brackets():
    from meshbench.endpoint.client import parse_target

    t = parse_target("http://[::1]:9")
    assert t.url == "http://[::1]:9" and t.host == "::1" and t.loopback


@pytest.mark.parametrize("script", ["sleep 60", "printf 'version: \\377\\376 b1\\n'"])
def test_a_server_binary_with_a_bad_version_line_is_one_line_or_a_clean_version(script, tmp_path, monkeypatch):
    from meshbench.endpoint import llama_server
    from meshbench.errors import MeshbenchError

    monkeypatch.setattr(llama_server, "VERSION_TIMEOUT_S", 2.0)  # (the limit's value is not what is tested)
    fake = tmp_path / "llama-server"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    if script.startswith("sleep"):
        import time

        t0 = time.monotonic()
        with pytest.raises(MeshbenchError, match="did not answer within 2 s"):
            llama_server.version(fake)
        assert time.monotonic() - t0 < 30
    else:
        assert llama_server.version(fake) == "\ufffd\ufffd b1"  # (replaced, printable)


def test_verify_holds_the_endpoint_record_to_the_config_and_its_own_stamps(prompts, config, tmp_path):
    with bad_server.serving("ok") as url:
        assert _sweep(url, prompts, config, tmp_path / "B", "--repeat", "2").exit_code == 0
    good = json.loads((tmp_path / "B" / "results.json").read_text())
    forgeries = {
        "endpoint.url (= config.engine.url)": lambda d: d["endpoint"].update(url="http://127.0.0.1:1"),
        "endpoint.loopback": lambda d: d["endpoint"].update(loopback=False),
        "endpoint.api: 'vllm' serves": lambda d: d["endpoint"].update(server="vllm"),
        "position (level order rotated by r)": lambda d: d["levels"][0]["repetitions"][1].update(position=0),
        "needle[0].completion.token_ns": lambda d: d["levels"][1]["needle"][0]["completion"]["token_ns"].reverse(),
    }
    from meshbench.verify import bundle as verify

    for name, forge in forgeries.items():
        d = json.loads(json.dumps(good))
        forge(d)
        assert any(name in str(f) for f in verify.check_data(d).failures), name


@pytest.mark.parametrize("flag", ["--hf_repo x/y", "-hfr x/y", "--host=0.0.0.0", "--port=1", "--model_url http://e"])
def test_server_args_cannot_move_the_model_or_the_address_in_any_spelling(flag, prompts):
    from test_bad_input import run_refused

    run_refused(
        "sweep", "--serve", "llama-server", "--model", "m.gguf", "--server-args", flag, "--prompts", prompts,
        "--sessions", "2", "--levels", "1", expect="meshbench sets the server's model, host (loopback) and port",
    )  # fmt: skip


def test_a_server_that_drips_its_props_is_one_line_within_the_probe_timeout(prompts, tmp_path, monkeypatch):
    import time

    from test_bad_input import run_refused

    from meshbench.endpoint import client

    monkeypatch.setattr(client, "PROBE_TIMEOUT_S", 2.0)  # (the limit's value is not what is tested)
    t0 = time.monotonic()
    with bad_server.serving("props-drip") as url:
        run_refused(
            "sweep", "--target", url, "--prompts", prompts, "--sessions", "2", "--levels", "1",
            expect="no whole answer within 2 s",
        )  # fmt: skip
    assert time.monotonic() - t0 < 20
