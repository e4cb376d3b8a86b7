"""Prefill burst: whole prompts within the budget while any session decodes, every waiting prompt in a tick where
none decodes (the budget bounds decode stalls; with no decoder it would only delay first tokens). verify holds a
burst bundle's ticks to that rule, and the default (whole) is untouched."""

import json

import factories as f
import pytest
from typer.testing import CliRunner

from meshbench.cli import app

runner = CliRunner()


def test_a_burst_prefills_every_waiting_prompt_only_where_no_session_decodes():
    s = f.scheduler(max_prefill_tokens_per_tick=6, prefill_policy="burst", max_active_sessions=4, max_batch_size=4)
    for sid, n, new in (("a", 5, 2), ("b", 5, 4), ("c", 5, 4)):
        s.submit(f.request(sid, tuple(range(1, n + 1)), new))
    first = s.run_tick()
    assert first.decode_batch == 0 and first.prefill_sessions == ["a", "b", "c"]  # 15 > 6: nobody decodes
    s.submit(f.request("d", (1, 2, 3, 4), 2))
    s.submit(f.request("e", (1, 2, 3, 4), 2))
    second = s.run_tick()
    assert second.decode_batch == 3 and second.prefill_sessions == ["d"]  # decoding: the budget (4 + 4 > 6)
    whole = f.scheduler(max_prefill_tokens_per_tick=6, max_active_sessions=4, max_batch_size=4)
    for sid in "abc":
        whole.submit(f.request(sid, tuple(range(1, 6)), 2))
    assert whole.run_tick().prefill_sessions == ["a"]  # whole: the budget even with no decoder


def test_chunked_burst_fills_the_budget_exactly_while_sessions_decode():
    s = f.scheduler(
        max_prefill_tokens_per_tick=6, prefill_policy="chunked-burst", max_active_sessions=4, max_batch_size=4
    )
    for sid in "ab":
        s.submit(f.request(sid, tuple(range(1, 6)), 4))
    first = s.run_tick()
    assert first.decode_batch == 0 and [n for _, _, n in first.prefill_chunks] == [5, 5]  # nobody decodes: all
    s.submit(f.request("c", tuple(range(1, 6)), 2))
    s.submit(f.request("d", tuple(range(1, 6)), 2))
    second = s.run_tick()
    assert second.decode_batch == 2 and second.prefill_chunks == [["c", 0, 5], ["d", 0, 1]]  # 6 exactly
    assert s.run_tick().prefill_chunks == [["d", 1, 4]]  # d continues at its next position


def bundle(tmp_path, *flags, policy="burst"):
    out = tmp_path / "b"
    r = runner.invoke(app, ["sweep", "--levels", "1,4,8", "--prefill", policy, "--out", str(out), *flags])
    assert r.exit_code == 0, r.output
    return out


def test_a_burst_bundle_verifies_and_a_burst_while_decoding_does_not(tmp_path):
    out = bundle(tmp_path)
    data = json.loads((out / "results.json").read_text())
    ticks = data["levels"][2]["tick_records"]
    assert ticks[0]["decode_batch"] == 0 and sum(n for _, _, n in ticks[0]["prefill_chunks"]) > 4  # DGR-012's budget
    r = runner.invoke(app, ["verify", str(out), "--rerun"])
    assert r.exit_code == 0, r.output
    # the same records said to be 'whole': the first tick's burst exceeds the budget
    data["config"]["prefill"] = "whole"
    (out / "results.json").write_text(json.dumps(data, indent=1))
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 1 and "tick_records[0].prefill_chunks (within the budget of 4)" in r.output


def test_a_chunked_burst_bundle_verifies(tmp_path):
    out = bundle(tmp_path, "--max-prefill-tokens-per-tick", "3", policy="chunked-burst")
    r = runner.invoke(app, ["verify", str(out), "--rerun"])
    assert r.exit_code == 0, r.output


def test_burst_with_a_mixed_batch_on_llama_cpp_sizes_the_batch_for_it(tmp_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not importable: the GGUF engine is untested")
    model = f.tiny_gguf(tmp_path / "m.gguf")
    flags = ["--engine", "gguf", "--model", str(model), "--mixed-batch", "--repack", "off", "--flash-attn", "off"]
    out = bundle(tmp_path, *flags)
    r = runner.invoke(app, ["verify", str(out), "--rerun"])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    assert data["batch_invariant"] is True and data["isolation"]["holds"] is True
    first = data["levels"][2]["tick_records"][0]  # (a llama_decode of every prompt: more than the budget of 4)
    assert first["decode_batch"] == 0 and sum(n for _, _, n in first["prefill_chunks"]) > 4


def test_a_tick_that_leaves_its_decoders_out_does_not_make_a_burst(tmp_path, monkeypatch):
    """A forger (here a scheduler patched to skip its decoders whenever prompts wait) records decode_batch 0
    consistently: the burst's exemption must still not apply while sessions are running."""
    from meshbench.scheduler.scheduler import ContinuousBatchScheduler

    honest = ContinuousBatchScheduler._pick_decode
    monkeypatch.setattr(
        ContinuousBatchScheduler,
        "_pick_decode",
        lambda self, n: [] if len(self._admitted) > 1 else honest(self, n),
    )
    out = tmp_path / "b"
    argv = ["sweep", "--levels", "4", "--prefill", "burst", "--sessions", "6", "--new-tokens", "3,3,9,9,5,5"]
    r = runner.invoke(app, [*argv, "--no-isolation", "--out", str(out)])  # (the sweep verifies what it wrote)
    assert r.exit_code == 1 and "tick_records[3].prefill_chunks (within the budget of 4)" in r.output, r.output


def test_a_mixed_burst_larger_than_llama_cpps_micro_batch_runs_in_one_tick(tmp_path):
    """64 prompts of 200 tokens in one llama_decode: llama.cpp computes it in pieces of its n_ubatch (512), so its
    compute buffer stays that of 512 tokens (it was refused over 8192 tokens when n_ubatch was the whole tick)."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not importable: the GGUF engine is untested")
    model = f.tiny_gguf(tmp_path / "m.gguf")
    argv = ["sweep", "--engine", "gguf", "--model", str(model), "--prefill", "burst", "--mixed-batch", "--no-isolation"]
    out = tmp_path / "b"
    r = runner.invoke(
        app,
        [*argv, "--levels", "64", "--sessions", "64", "--prompt-tokens", "200", "--new-tokens", "2", "--out", str(out)],
    )
    assert r.exit_code == 0, r.output
    first = json.loads((out / "results.json").read_text())["levels"][0]["tick_records"][0]
    assert first["decode_batch"] == 0 and sum(n for _, _, n in first["prefill_chunks"]) == 64 * 200


def test_a_mixed_tick_is_one_call_for_every_session_in_it():
    """The first-divergence replay names the batch that computed each token: with a mixed batch a prompt's last
    piece shares the tick's one llama_decode with every decode and every other piece (a burst of 4 prompts: 4)."""
    from types import SimpleNamespace

    from meshbench.sweep import replay

    def tick(decode, chunks, prefilled):
        return SimpleNamespace(decode_sessions=decode, prefill_chunks=chunks, prefill_sessions=prefilled)

    burst = tick((), tuple((s, 0, 8) for s in "abcd"), tuple("abcd"))
    beside = tick(tuple("abcd"), (("e", 0, 3),), ("e",))
    level = SimpleNamespace(tick_records=[burst, beside])
    assert replay.batch_sizes(level, "a", mixed=True) == [4, 5]
    assert replay.batch_sizes(level, "a") == [1, 4]  # separate calls: the prompt alone, then the decode batch
    assert replay.batch_sizes(level, "e", mixed=True) == [5] and replay.batch_sizes(level, "e") == [1]


def test_a_burst_tick_that_left_a_waiting_prompt_out_fails_verify(tmp_path):
    """A burst exceeds the budget only to prefill every waiting prompt: a burst tick said to have prefilled fewer is
    not the policy's schedule."""
    out = bundle(tmp_path)
    data = json.loads((out / "results.json").read_text())
    first = data["levels"][2]["tick_records"][0]
    assert first["decode_batch"] == 0 and len(first["prefill_sessions"]) > 1
    left = first["prefill_sessions"].pop()
    first["prefill_chunks"] = [p for p in first["prefill_chunks"] if p[0] != left]
    (out / "results.json").write_text(json.dumps(data, indent=1))
    r = runner.invoke(app, ["verify", str(out)])
    said = " ".join(r.output.split())
    assert r.exit_code == 1 and "tick_records[0].prefill_sessions (a burst: every waiting prompt to its end)" in said
    assert left in said
