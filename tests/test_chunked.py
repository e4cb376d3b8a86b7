"""Chunked prefill and one engine call per tick: the budget filled exactly, prompts continued at the right
position, the first token only after the last piece, KV accounting that closes, and llama.cpp's mixed
batch giving the tokens of separate calls."""

import json

import factories as f
import pytest
from test_faults import ended, reference_tokens
from test_scheduler import RecordingEngine
from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.scheduler.session import SessionStatus

runner = CliRunner()
BPT = 1536


def test_chunked_fills_the_budget_exactly_and_continues_at_the_next_position():
    e = RecordingEngine(f.engine())
    s = f.scheduler(e, max_prefill_tokens_per_tick=5, prefill_policy="chunked")
    for sid, n in (("a", 7), ("b", 4), ("c", 2)):
        s.submit(f.request(sid, tuple(range(1, n + 1)), 3))
    recs = s.run_to_completion()
    assert [[tuple(c) for c in r.prefill_chunks] for r in recs[:3]] == [
        [("a", 0, 5)],  # a's first 5 positions: the budget, exactly
        [("a", 5, 2), ("b", 0, 3)],  # a continues at 5; b takes the rest of the budget
        [("b", 3, 1), ("c", 0, 2)],  # b continues at 3; c fits whole (2 of the 5 left unused: no more work)
    ]
    assert [r.prefill_sessions for r in recs[:3]] == [[], ["a"], ["b", "c"]]  # first token after the last piece
    assert e.chunks[:5] == [
        ("a", 0, 5, False),
        ("a", 5, 2, True),
        ("b", 0, 3, False),
        ("b", 3, 1, True),
        ("c", 0, 2, True),
    ]
    assert recs[0].stored_tokens == 5 and recs[0].kv_bytes == 5 * BPT  # a partial prompt holds its KV
    assert {x.session_id: x.tokens for x in s.sessions()} == {
        x.session_id: f.reference_tokens(x.request) for x in s.sessions()
    }
    assert s.telemetry().prefill_tokens == 13 and s.engine.kv_bytes_in_use == 0


def test_whole_never_splits_and_the_first_prompt_always_runs():
    s = f.scheduler(max_prefill_tokens_per_tick=5)
    for sid, n in (("a", 7), ("b", 4)):
        s.submit(f.request(sid, tuple(range(1, n + 1)), 3))
    recs = s.run_to_completion()
    assert recs[0].prefill_chunks == [["a", 0, 7]] and recs[1].prefill_chunks == [["b", 0, 4]]


def test_a_session_cancelled_mid_prompt_releases_its_partial_kv():
    s = f.scheduler(max_prefill_tokens_per_tick=3, prefill_policy="chunked")
    s.submit(f.request("a", tuple(range(1, 9)), 3))
    s.run_tick()
    a = s.session("a")
    assert a.status is SessionStatus.ADMITTED and a.prefilled == 3 and s.engine.kv_bytes_in_use == 3 * BPT
    assert s.cancel("a").cancelled
    assert s.engine.kv_bytes_in_use == 0 and s.telemetry().cancelled == 1


def test_a_prompt_evicted_between_its_pieces_ends_as_a_cache_miss():
    s = f.scheduler(max_prefill_tokens_per_tick=3, prefill_policy="chunked")
    s.submit(f.request("a", tuple(range(1, 9)), 3))
    s.run_tick()
    s.engine.release("a")  # KV pressure took it
    rec = s.run_tick()
    assert rec.ended == ["a"] and s.session("a").done_reason.value == "CACHE_MISS" and rec.prefill_chunks == []


def test_chunked_sweep_is_byte_identical_across_levels_and_verifies(tmp_path):
    out = tmp_path / "b"
    r = runner.invoke(
        app,
        [
            "sweep",
            "--prefill",
            "chunked",
            "--max-prefill-tokens-per-tick",
            "6",
            "--prompt-tokens",
            "4,8,16,3,9,2,7,5",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    assert data["corruption_free"] and data["config"]["prefill"] == "chunked"
    assert any(start > 0 for lv in data["levels"] for t in lv["tick_records"] for _, start, _ in t["prefill_chunks"])
    assert runner.invoke(app, ["verify", str(out), "--rerun"]).exit_code == 0


def test_verify_catches_a_prompt_piece_at_the_wrong_position(tmp_path):
    out = tmp_path / "b"
    assert (
        runner.invoke(
            app,
            ["sweep", "--prefill", "chunked", "--max-prefill-tokens-per-tick", "3", "--levels", "1", "--out", str(out)],
        ).exit_code
        == 0
    )
    data = json.loads((out / "results.json").read_text())
    t = data["levels"][0]["tick_records"][1]
    assert t["prefill_chunks"][0][:2] == ["s0", 3]
    t["prefill_chunks"][0][1] = 2  # the second piece of s0 claims to start at 2
    (out / "results.json").write_text(json.dumps(data))
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 1 and "tick_records[1].prefill_chunks s0@2+1 (after 3, prompt 4) expected=True" in r.stdout


def test_an_engine_lost_mid_prompt_takes_the_partial_prompt_with_it():
    r = runner.invoke(
        app,
        [
            "sweep",
            "--json",
            "--levels",
            "2",
            "--prefill",
            "chunked",
            "--max-prefill-tokens-per-tick",
            "3",
            "--isolate",
            "--restart-engine",
            "--inject",
            "kill-engine@2",
        ],
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    lv = data["levels"][0]
    # Before tick 2: s0 is decoding, s1 has 2 of its 4 prompt positions written (budget 3 a tick).
    assert [list(c) for t in lv["tick_records"][:2] for c in t["prefill_chunks"]] == [
        ["s0", 0, 3],
        ["s0", 3, 1],
        ["s1", 0, 2],
    ]
    assert lv["engine_losses"][0]["lost"] == [["s0", 1], ["s1", 1]]  # the partial prompt was resident too
    assert ended(lv)[("s1", 1)] == ("FAILED", "engine lost: SIGKILL")
    ref = reference_tokens(data)
    last = {s["session_id"]: s for s in lv["sessions"]}
    assert all(s["done_reason"] == "COMPLETED" and s["tokens"] == ref[sid] for sid, s in last.items())


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not importable")
    return f.tiny_gguf(tmp_path_factory.mktemp("m") / "q4.gguf", "q4_0")


@pytest.mark.parametrize("isolate", ["--no-isolate", "--isolate"])
def test_a_mixed_llama_decode_gives_the_tokens_of_separate_calls(gguf_model, isolate):
    base = [
        "sweep",
        "--json",
        "--engine",
        "gguf",
        "--model",
        str(gguf_model),
        "--threads",
        "1",
        "--warmup",
        "0",
        "--sessions",
        "8",
        "--prompt-tokens",
        "4,9,16,3,7,12,5,8",
        "--new-tokens",
        "10",
        isolate,
    ]
    runs = {}
    chunked = ["--mixed-batch", "--prefill", "chunked", "--max-prefill-tokens-per-tick", "3"]
    for name, extra in (("separate", []), ("mixed", ["--mixed-batch"]), ("mixed chunked", chunked)):
        r = runner.invoke(app, [*base, *extra])
        assert r.exit_code == 0, r.output
        runs[name] = json.loads(r.stdout)
        assert runs[name]["corruption_free"], name
    tokens = {name: {s["session_id"]: s["tokens"] for s in d["levels"][0]["sessions"]} for name, d in runs.items()}
    assert tokens["mixed"] == tokens["separate"] == tokens["mixed chunked"]
    assert runs["mixed"]["engine"]["mixed_batch"] is True
    assert runs["mixed"]["engine"]["recipe_fingerprint"] != runs["separate"]["engine"]["recipe_fingerprint"]
