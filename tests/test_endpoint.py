"""A serving endpoint as the node under test (sweep --target), against a real server: llama-cpp-python's
OpenAI-compatible server (the ``server`` extra) on a tiny model, on a free loopback port, stopped by its
process id. Skips cleanly without the extra."""

from __future__ import annotations

import dataclasses
import http.server
import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import factories as f
import pytest
from test_bad_input import run_refused
from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.endpoint import retokenize
from meshbench.endpoint.llama_server import stop
from meshbench.engine import servers
from meshbench.engine.process.workers import free_port
from meshbench.results import kinds
from meshbench.results.typed import EndpointBundle

pytest.importorskip("llama_cpp.server", reason="the server extra (llama-cpp-python[server]) is not installed")

runner = CliRunner()
# 4 sessions of 5 new tokens at 1 and 2 clients, 2 repetitions, no warm-up: every sweep here
WORKLOAD = ["--sessions", "4", "--new-tokens", "5", "--levels", "1,2", "--repeat", "2", "--warmup", "0"]
PROMPTS = ["The cat sat on the mat", "A quick brown fox", "Numbers go up", "Hello there", "One two three four"]


def _wait_ready(proc: subprocess.Popen, url: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the server did not answer within the timeout")


def _start(model: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "meshbench.endpoint.llama_cpp_server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "512",
        "--n_threads",
        "1",
        "--interrupt_requests",
        "False",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url)
    except RuntimeError:
        stop(proc)
        raise
    return proc, url


@pytest.fixture(scope="module")
def server(model):
    proc, url = _start(model)
    try:
        yield url
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    return f.prompts_file(tmp_path_factory.mktemp("p") / "prompts.txt", PROMPTS)


def _sweep(url: str, prompts: Path, out: Path, *extra: str):
    args = [
        "sweep",
        "--target",
        url,
        "--prompts",
        str(prompts),
        *WORKLOAD,
        "--out",
        str(out),
        *extra,
    ]
    return runner.invoke(app, args)


@pytest.fixture(scope="module")
def bundle(server, prompts, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("b") / "EP"
    r = _sweep(server, prompts, out)
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.cell("llama-cpp-python", "openai", "verdicts")
@pytest.mark.cell("llama-cpp-python", "openai", "margins")
def test_an_endpoint_sweep_writes_a_bundle_that_verifies(bundle):
    data = json.loads((bundle / "results.json").read_text())
    assert data["kind"] == "endpoint" and data["endpoint"]["api"] == "openai"
    assert data["endpoint"]["server"] == "llama-cpp-python" and data["endpoint"]["loopback"] is True
    assert data["endpoint"]["detected"] == servers.LLAMA_CPP_PYTHON.why
    v = data["verdicts"]
    assert v["compared"] == "text" and v["reference_concurrency"] == 1
    assert set(v["distinct_outputs"]) == {"1", "2"} and set(v["needle"]) == {"1", "2"}
    for lv in data["levels"]:
        assert len(lv["repetitions"]) == 2 and len(lv["needle"]) == 2
        for rep in lv["repetitions"]:
            assert [c["session_id"] for c in rep["sessions"]] == ["s0", "s1", "s2", "s3"]
            assert all(c["error"] is None and c["token_ns"] for c in rep["sessions"])
            assert rep["figures"]["completed"] == 4 and rep["figures"]["tokens_per_s"] > 0
    # a server that runs one request at a time gives each session one output, whatever the load
    assert v["run_to_run_deterministic"] is True
    # the margins: every session cold, warm and all at once, one margin per token (its logprobs, top 2)
    m = data["margins"]
    assert all(len(x["margins"]) == len(x["tokens"] or x["token_bytes"]) > 0 for x in [*m["cold"], *m["together"]])
    r = runner.invoke(app, ["verify", str(bundle)])
    assert r.exit_code == 0 and "0 failed" in r.output, r.output
    # a --target server chose its own model: its prompt ids cannot be held to a tokenizer here, and verify says so
    assert "prompt_ids: not held to the model's tokenizer here (the config names no model" in r.output, r.output


@pytest.mark.cell("llama-cpp-python", "chat", "verdicts")
@pytest.mark.cell("llama-cpp-python", "chat", "margins")
def test_the_chat_api_works_against_llama_cpp_python_s_server(server, prompts, tmp_path):
    out = tmp_path / "CHAT"
    r = _sweep(server, prompts, out, "--api", "chat", "--eos", "ban")
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    assert data["endpoint"]["api"] == "chat" and data["verdicts"]["compared"] == "text"
    every = [c for lv in data["levels"] for rep in lv["repetitions"] for c in rep["sessions"]]
    # (llama-cpp-python's chat stream sends no usage: one chunk per token, five of them)
    assert all(c["error"] is None and c["text"] and len(c["token_ns"]) == 5 for c in every)
    assert all(len(x["margins"]) == len(x["token_bytes"]) == 5 for x in data["margins"]["cold"])  # (top_logprobs)
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0


@pytest.mark.cell("llama-cpp-python", "openai", "sampling")
@pytest.mark.cell("llama-cpp-python", "chat", "sampling")
@pytest.mark.parametrize("api", ["openai", "chat"])
def test_llama_cpp_python_s_server_samples_each_session_alike_at_every_level_with_its_seed(
    server, prompts, tmp_path, api
):
    out = tmp_path / "SAMPLED"
    # (at temperature 1 the tiny model draws its BOS, a control token with no text, for which llama-cpp-python's
    # stream sends no chunk and no usage: a stream one chunk short, which the client cannot tell from a cut one)
    sampled = ["--temperature", "0.6", "--top-p", "0.8", "--seed-per-request", "--eos", "ban"]
    r = _sweep(server, prompts, out, "--api", api, *sampled)
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    v = data["verdicts"]
    assert (v["batch_invariant"], v["run_to_run_deterministic"], v["needle_stable"]) == (True, True, True), v
    first = data["levels"][0]["repetitions"][0]["sessions"]
    assert len({c["text"] for c in first}) == len(first)  # (each its own prompt and seed)
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0


def test_a_forged_output_or_stamp_fails_verify(bundle, tmp_path):
    for forge, expect in [
        (lambda d: d["levels"][1]["repetitions"][0]["sessions"][0].update(text="forged"), "verdicts"),
        (lambda d: d["levels"][0]["repetitions"][1]["sessions"][2]["token_ns"].reverse(), "token_ns"),
        (
            lambda d: d["levels"][0]["repetitions"][0].update(wall_s=d["levels"][0]["repetitions"][0]["wall_s"] * 2),
            "figures",
        ),
        (lambda d: d["canaries"].update(leak=True), "canaries (every answer searched"),
        (lambda d: d["levels"][1]["canary"]["canaries"].__setitem__(0, "AAAAAAAA"), "drawn from the workload's seed"),
        (lambda d: d["levels"][0].pop("canary"), "every level has its canary run"),
        (  # a code sent at C=1 in an answer at C=2: a leak the bundle's search must have found
            lambda d: d["levels"][1]["canary"]["answers"][1].update(text=d["levels"][0]["canary"]["canaries"][0]),
            "canaries (every answer searched",
        ),
    ]:
        copy = tmp_path / f"forged{len(list(tmp_path.iterdir()))}"
        copy.mkdir()
        data = json.loads((bundle / "results.json").read_text())
        forge(data)
        (copy / "results.json").write_text(json.dumps(data))
        (copy / "README.md").write_text((bundle / "README.md").read_text())
        r = runner.invoke(app, ["verify", str(copy)])
        assert r.exit_code == 1 and expect in r.output, r.output


def test_an_endpoint_bundle_is_not_rerun_without_its_server(bundle):
    r = runner.invoke(app, ["verify", str(bundle), "--rerun"])
    assert r.exit_code == 2 and "a rerun needs its server" in r.output


def test_a_url_that_does_not_answer_is_one_line_and_nothing_is_written(prompts, tmp_path):
    port = free_port()
    run_refused(
        "sweep",
        "--target",
        f"http://127.0.0.1:{port}",
        "--prompts",
        prompts,
        "--sessions",
        "2",
        "--levels",
        "1",
        "--out",
        tmp_path / "x",
        expect="does not answer",
    )
    assert not (tmp_path / "x").exists()


class _Static(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # noqa: ARG002
        pass


@pytest.mark.parametrize("files,expect", [({}, "HTTP 404"), ({"v1/models": "<html>not json</html>"}, "not JSON")])
def test_a_server_that_is_not_an_llm_endpoint_is_one_line(tmp_path, prompts, files, expect):
    """A real HTTP server (Python's own, serving a folder) that is no LLM endpoint."""
    root = tmp_path / "www"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    root.mkdir(exist_ok=True)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _Static(*a, directory=str(root)))
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        run_refused(
            "sweep",
            "--target",
            f"http://127.0.0.1:{httpd.server_address[1]}",
            "--prompts",
            prompts,
            "--sessions",
            "2",
            "--levels",
            "1",
            expect=expect,
        )
    finally:
        httpd.shutdown()


@pytest.mark.parametrize(
    "args,expect",
    [
        (["--target", "ftp://127.0.0.1:1"], "give http://HOST:PORT"),
        (["--target", "http://127.0.0.1:1/v1"], "without a path"),
        (["--target", "http://127.0.0.1:1", "--sessions", "2"], "needs workload.prompts"),
        (["--target", "http://127.0.0.1:1", "--inject", "cancel:s0@1"], "a meshbench node's"),
        (["--target", "http://127.0.0.1:1", "--engine", "gguf", "--model", "m.gguf"], "an engine of meshbench's own"),
        (["--target", "http://127.0.0.1:1", "--cancel", "soon"], "none of auto, off or a token index"),
        (["--target", "http://127.0.0.1:1", "--cancel", "0"], "must be between 1"),
        (["--target", "http://127.0.0.1:1", "--cancel", "9", "--new-tokens", "9"], "not before the end of every"),
    ],
)
def test_an_endpoint_sweep_refuses_what_it_cannot_run(args, expect, prompts):
    full = [*args] if "--sessions" in args else [*args, "--prompts", str(prompts), "--sessions", "2"]
    run_refused("sweep", *full, "--levels", "1", expect=expect)


def test_a_server_that_dies_mid_sweep_fails_its_sessions_and_the_sweep_goes_on(model, prompts, tmp_path):
    proc, url = _start(model)
    out = tmp_path / "EP"
    try:
        cmd = [
            sys.executable,
            "-m",
            "meshbench.cli",
            "sweep",
            "--target",
            url,
            "--prompts",
            str(prompts),
            "--sessions",
            "4",
            "--new-tokens",
            "40",
            "--levels",
            "1,2",
            "--repeat",
            "2",
            "--warmup",
            "0",
            "--out",
            str(out),
        ]
        sweep = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        sweep.stderr.readline()  # "sweep: repetition 1/2, concurrency 1": the first pass has begun
        time.sleep(0.5)
    finally:
        stop(proc)
    _, err = sweep.communicate(timeout=120)
    assert sweep.returncode == 1, err  # failed sessions: the bundle is kept, the sweep says so
    assert "answered expected=answered" in err and "Traceback" not in err
    data = json.loads((out / "results.json").read_text())
    failed = [c for lv in data["levels"] for rep in lv["repetitions"] for c in rep["sessions"] if c["error"]]
    assert failed and all(c["error"] for c in failed)
    assert not any(data["verdicts"][v] for v in ("batch_invariant", "run_to_run_deterministic", "needle_stable"))
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 1


@pytest.mark.cell("llama-server", "native", "verdicts")
@f.needs_llama_server
def test_llama_server_started_by_meshbench_gives_a_bundle_of_token_ids(model, prompts, tmp_path):
    out = tmp_path / "LS"
    args = [
        "sweep",
        "--serve",
        "llama-server",
        "--model",
        str(model),
        "--server-args",
        "-np 2 -c 512 -t 1 -fa off --no-repack",
        "--prompts",
        str(prompts),
        *WORKLOAD,
        "--out",
        str(out),
    ]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    e = data["endpoint"]
    assert e["server"] == "llama-server" and e["api"] == "native"
    assert e["launched"]["args"][:3] == ["--metrics", "-np", "2"]  # (meshbench's own flag, then the user's)
    every = [c for lv in data["levels"] for rep in lv["repetitions"] for c in rep["sessions"]]
    assert all(c["evaluated"] == data["workload"]["prompt_tokens"][int(c["session_id"][1:])] for c in every)
    assert all(0 <= c["computed"] <= c["evaluated"] for c in every)  # (the server's prompt cache, on by default)
    assert "cache_prompt" not in data["workload"]["request"]
    assert all(len(c["tokens"]) == len(c["token_ns"]) > 0 for c in every)
    # ids where every answer's ids are whole (a streamed answer may hold back an incomplete UTF-8 token's id):
    # verify recomputes which from the records
    assert data["verdicts"]["compared"] in ("tokens", "text")
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 0 and "prompt_ids: not held" not in r.output, r.output  # (the model is here: held)
    # the server's prompt ids, which every sibling, margin and canary check rests on, are the model's own
    # tokenization of the prompts file: one id changed (its length kept) fails verify, naming the session
    data["workload"]["prompt_ids"][2][-1] += 1
    forged = tmp_path / "FORGED"
    forged.mkdir()
    (forged / "results.json").write_text(json.dumps(data))
    (forged / "README.md").write_text((out / "README.md").read_text())
    r = runner.invoke(app, ["verify", str(forged)])
    assert r.exit_code == 1 and "tokenizes them: the sessions and turns that differ) expected=[] found=['s2']" in (
        r.output
    ), r.output
    # where the prompts file is not the one the bundle recorded, or the model is not here, the ids go unchecked,
    # and why is said (a file that changed since is not blamed on the bundle)
    typed = kinds.typed_results(json.loads((out / "results.json").read_text()))
    assert isinstance(typed, EndpointBundle)
    wl = dataclasses.replace(typed.results.workload, prompts_sha256="0" * 64)
    other = dataclasses.replace(typed, results=dataclasses.replace(typed.results, workload=wl))
    assert "not the file the bundle recorded" in str(retokenize.here(other))
    # a model file that is not what the server loaded, or that llama.cpp cannot read (read in a throwaway process)
    (tmp_path / "other.gguf").symlink_to(model)
    assert f"loaded '{model.name}', not the config's model 'other.gguf'" in str(
        _here_with_model(typed, tmp_path / "other.gguf")
    )
    junk = tmp_path / model.name
    junk.write_bytes(b"GGUF" + b"\xff" * 60)
    assert str(junk) in str(_here_with_model(typed, junk)) and "not held" not in str(_here_with_model(typed, junk))
    engine = dataclasses.replace(typed.cfg.engine, model=str(tmp_path / "gone.gguf"))
    assert "gone.gguf" in str(
        retokenize.here(dataclasses.replace(typed, cfg=dataclasses.replace(typed.cfg, engine=engine)))
    )


def _here_with_model(typed: EndpointBundle, path: Path) -> list[list[int]] | str:
    engine = dataclasses.replace(typed.cfg.engine, model=str(path))
    return retokenize.here(dataclasses.replace(typed, cfg=dataclasses.replace(typed.cfg, engine=engine)))


def test_compare_an_endpoint_bundle_with_itself_and_with_meshbench_s_node(bundle, model, prompts, tmp_path):
    r = runner.invoke(app, ["compare", str(bundle), str(bundle), "--perf", "ignore"])
    assert r.exit_code == 0, r.output
    assert "ttft_ms.p50" in r.output and "outputs_changed=[]" in r.output
    same = json.loads(runner.invoke(app, ["compare", str(bundle), str(bundle), "--json"]).stdout)
    assert {lv["outputs"]["verdict"] for lv in same["levels"]} == {"same"}
    assert all(lv["scheduler"]["verdict"].startswith("not compared") for lv in same["levels"])
    node = tmp_path / "NODE"
    args = [
        "sweep",
        "--engine",
        "gguf",
        "--model",
        str(model),
        "--prompts",
        str(prompts),
        *WORKLOAD,
        "--out",
        str(node),
    ]
    assert runner.invoke(app, args).exit_code == 0
    r = runner.invoke(app, ["compare", str(node), str(bundle), "--perf", "ignore", "--json"])
    report = json.loads(r.stdout)
    assert report["compared_by"] is None  # token ids on the node's side, text on the OpenAI endpoint's
    assert all(lv["outputs"]["verdict"].startswith("not compared") for lv in report["levels"])
    # (TTFT and E2E count time queued: a node submits every session at once, the endpoint's clients are closed-loop)
    compared = {"total_tokens_per_s", "itl_ms.p50", "itl_ms.p99", "tpot_ms.p50"}
    assert all(set(lv["performance"]) == compared for lv in report["levels"])
    assert any("closed-loop" in n for n in report["notes"])


def test_hunt_refuses_a_server_without_the_native_api_in_one_line(server, tmp_path):
    """llama-cpp-python's server answers the OpenAI APIs only: a hunt needs token ids and their probabilities."""
    r = runner.invoke(app, ["hunt", "--target", server, "--budget", "4", "--out", str(tmp_path / "H")])
    assert r.exit_code == 2 and "hunt needs llama-server's native /completion API" in r.output, r.output
    assert not (tmp_path / "H").exists()
