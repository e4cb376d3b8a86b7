"""Conversations over HTTP (workload.turns > 1): each later turn sent once the turn before it is answered, its
prompt the conversation so far (native: the growing ids; chat: the messages), every turn judged by its name, and
every later turn of the reference pass sent again cold. Real servers: llama-server (skips in one line without
it) for the native API, llama-cpp-python's server for chat."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import factories as f
import pytest
from test_bad_input import run_refused
from test_endpoint import _start
from typer.testing import CliRunner

from meshbench.analysis import conversation as talk
from meshbench.cli import app
from meshbench.endpoint.llama_server import stop
from meshbench.records.completion import Completion

runner = CliRunner()
TURNS = [
    {"prompt": "The cat sat on the mat", "turns": [" and then it slept", " until the morning came"]},
    {"prompt": "A quick brown fox", "turns": [" jumps over the dog", " and runs away"]},
    {"prompt": "Numbers go up", "turns": [" and then down", " and up again"]},
    {"prompt": "Hello there", "turns": [" how are you", " and your family"]},
]
WORKLOAD = ["--sessions", "4", "--new-tokens", "4", "--levels", "1,2", "--repeat", "1", "--warmup", "0"]
SERVER = "-c 1024 -t 1 --no-repack"


@pytest.fixture(scope="module")
def talks(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("t") / "talks.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in TURNS))
    return path


def _verify(path: Path):
    return runner.invoke(app, ["verify", str(path)])


def _forged(bundle: Path, tmp_path: Path, name: str, edit) -> Path:
    out = tmp_path / name
    shutil.copytree(bundle, out)
    data = json.loads((out / "results.json").read_text())
    edit(data)
    (out / "results.json").write_text(json.dumps(data))
    return out


@f.needs_llama_server
@pytest.mark.cell("llama-server", "native", "conversations")
def test_native_conversations_on_llama_server_grow_their_prompt_and_verify(model, talks, tmp_path):
    if f.narrower_than_avx512():
        pytest.skip(f.AVX2_TOKENS)
    out = tmp_path / "NATIVE"
    args = ["sweep", "--serve", "llama-server", "--model", str(model), "--server-args", SERVER, "--eos", "ban"]
    r = runner.invoke(app, [*args, "--prompts", str(talks), "--turns", "3", *WORKLOAD, "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    wl = data["workload"]
    assert wl["turns"] == 3 and [len(x) for x in wl["turn_ids"]] == [2] * 4
    for lv in data["levels"]:
        rep = lv["repetitions"][0]
        assert [talk.label(Completion(**x)) for x in rep["turns"]] == [f"s{k}#t{t}" for k in range(4) for t in (2, 3)]
        first = {x["session_id"]: x for x in rep["sessions"]}
        for x in rep["turns"]:  # turn t's prompt: turn t-1's, its answer, the user's new turn (no BOS)
            before = first[x["session_id"]]
            k = int(x["session_id"][1:])
            assert x["evaluated"] == before["evaluated"] + len(before["tokens"]) + len(wl["turn_ids"][k][x["turn"] - 2])
            assert x["submit_ns"] >= before["token_ns"][-1]
            first[x["session_id"]] = x
    cold = data["conversations"]
    assert cold["concurrency"] == 1 and len(cold["cold"]) == 8
    assert all(len(x["margins"]) == len(x["tokens"]) > 0 for x in cold["cold"])  # (top-2 log-probabilities asked)
    assert "## Conversations" in (out / "README.md").read_text()
    assert _verify(out).exit_code == 0

    def drop_turn(d):
        del d["levels"][1]["repetitions"][0]["turns"][1]

    def early(d):
        t = d["levels"][0]["repetitions"][0]["turns"][0]
        t["submit_ns"] = d["levels"][0]["repetitions"][0]["sessions"][0]["token_ns"][0]

    def other_answer(d):
        t = d["levels"][1]["repetitions"][0]["turns"][3]
        t["tokens"] = [(t["tokens"][0] + 1) % 1000, *t["tokens"][1:]]
        t["text"] = "~" + t["text"]  # (outputs compare as ids or as text: both forged)

    def hide_cold(d):
        d["conversations"]["differing"] = ["s0#t2"]

    def lost_cold(d):
        del d["conversations"]["cold"][2]

    def first_as_later(d):  # (a first turn named as its second hides its answer from the verdicts)
        x = d["levels"][1]["repetitions"][0]["sessions"][0]
        x.update(turn=2, evaluated=None, computed=None)

    def cut_short(d):  # (a timed pass never cancels: a forger's way to drop the turns after one)
        rep = d["levels"][1]["repetitions"][0]
        rep["turns"][0]["stop"] = "cancelled"
        del rep["turns"][1]

    def held_back(d):  # (the server generated an id it never streamed, and the next turn went on without it)
        d["levels"][0]["repetitions"][0]["turns"][0]["predicted"] += 1

    def cold_junk(d):
        x = d["conversations"]["cold"][0]
        x["token_ns"] = x["token_ns"][::-1]
        x["computed"] = 1

    def cold_failed(d):
        d["conversations"]["cold"][1]["error"] = "HTTP 500"

    def other_turn_ids(d):
        ids = d["workload"]["turn_ids"][1][0]
        d["workload"]["turn_ids"][1][0] = [(ids[0] + 1) % 500, *ids[1:]]

    for name, edit, says in (
        ("DROP", drop_turn, "later turns in order"),
        ("EARLY", early, "sent after the turn before it was answered"),
        ("OTHER", other_answer, "verdicts (recomputed"),
        ("HIDE", hide_cold, "conversations.differing"),
        ("LOST", lost_cold, "conversations.cold (every later turn"),
        ("FIRST", first_as_later, "first turns: no turn number"),
        ("CUT", cut_short, "a timed pass cancels nothing"),
        ("HELD", held_back, "sent after a turn it could send back whole"),
        ("JUNK", cold_junk, "every prompt token computed"),
        ("JUNK2", cold_junk, "token_ns (in order"),
        ("FAILED", cold_failed, "answered"),
        ("TURNIDS", other_turn_ids, "s1#t2"),
    ):
        r = _verify(_forged(out, tmp_path, name, edit))
        assert r.exit_code == 1 and says in r.output, (name, r.output)


@pytest.mark.cell("llama-cpp-python", "chat", "conversations")
def test_chat_conversations_on_llama_cpp_python_s_server_send_the_messages_so_far(model, talks, tmp_path):
    proc, url = _start(model)
    try:
        out = tmp_path / "CHAT"
        args = ["sweep", "--target", url, "--api", "chat", "--eos", "ban", "--prompts", str(talks), "--turns", "2"]
        r = runner.invoke(app, [*args, *WORKLOAD, "--out", str(out)])
    finally:
        stop(proc)
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    assert all(len(rep["turns"]) == 4 for lv in data["levels"] for rep in lv["repetitions"])
    cold = data["conversations"]
    assert len(cold["cold"]) == 4 and isinstance(cold["divergences"], list)  # (text, placed by each token's bytes)
    assert all(len(x["margins"]) == len(x["token_bytes"]) > 0 for x in cold["cold"])
    assert _verify(out).exit_code == 0


@f.needs_llama_server
@pytest.mark.cell("llama-server", "chat", "conversations")
def test_chat_conversations_on_llama_server_send_the_messages_so_far_and_verify(model, talks, tmp_path):
    out = tmp_path / "CHAT"
    args = ["sweep", "--serve", "llama-server", "--model", str(model), "--server-args", SERVER, "--eos", "ban"]
    # (3 tokens, not 4: the 4th of s1's second turn is the tiny model's BOS, a control token with no text, for which
    # llama-server's chat stream sends no chunk, so neither its log-probability; usage counts it, and verify then
    # fails that answer as malformed, as docs/guides/endpoint.md says)
    args += ["--api", "chat", "--prompts", str(talks), "--turns", "2", *WORKLOAD, "--new-tokens", "3"]
    r = runner.invoke(app, [*args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    assert all(len(rep["turns"]) == 4 for lv in data["levels"] for rep in lv["repetitions"])
    assert len(data["conversations"]["cold"]) == 4 and all(x["margins"] for x in data["conversations"]["cold"])
    assert _verify(out).exit_code == 0


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--api", "openai"], "over the native or chat API"),
        (["--rates", "1", "--clock", "wall", "--arrivals", "poisson:1"], "closed-loop clients"),
        (["--eos", "stop"], "eos continue or ban"),
    ],
)
def test_conversations_over_http_refuse_what_they_cannot_run(extra, says, talks):
    args = ["--target", "http://127.0.0.1:1", "--prompts", str(talks), "--sessions", "2", "--turns", "3"]
    run_refused("sweep", *args, "--levels", "1", *extra, expect=says)


def test_a_later_turn_s_prompt_is_the_turn_before_it_its_answer_and_the_new_turn():
    def answer(sid, turn, tokens):
        return Completion(session_id=sid, submit_ns=0, tokens=tokens, text="", token_ns=[0] * len(tokens),
                          stop="limit", predicted=len(tokens), evaluated=None, error=None, turn=turn)  # fmt: skip

    answers = [answer("s0", None, [1, 2]), answer("s1", None, [3]), answer("s0", 2, [4, 5, 6]), answer("s0", 3, [7])]
    lengths = talk.prompt_lengths({"s0": 10, "s1": 5}, {"s0": [[9], [8, 8]], "s1": [[1], [2]]}, answers)
    assert lengths == {"s0": 10, "s1": 5, "s0#t2": 10 + 2 + 1, "s0#t3": 13 + 3 + 2}
    # a native answer whose stream held back an id cannot be sent back whole: its conversation ends there
    held = answer("s0", None, [1, 2])
    held = Completion(**{**{f: getattr(held, f) for f in Completion.__slots__}, "predicted": 3})
    assert talk.unsendable("native", held) is not None and talk.unsendable("native", answers[0]) is None
    assert talk.unsendable("chat", held) is None  # (chat sends the answer's text back)
