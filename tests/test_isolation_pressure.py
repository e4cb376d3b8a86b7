"""Isolation where the node evicts sessions under KV pressure: a perturbed session that did not complete in the
level is pinned to its whole length, so the node ends it where it did (a false leak otherwise), with and without
a prefix cache, single turns and conversations; and a bundle whose passes changed the schedule still verifies,
its verdict naming them."""

import json

import pytest
from typer.testing import CliRunner

from meshbench.analysis import isolation
from meshbench.cli import app
from meshbench.records.model import SessionRecord
from meshbench.scheduler.session import GenerationRequest

runner = CliRunner()

# 8 sessions of 80 + 40 positions at concurrency 4 under a KV budget of 240 positions (1536 bytes each on the
# dgr-012 preset): the node evicts running sessions, and their next step is a cache miss.
SINGLE = ["--sessions", "8", "--prompt-tokens", "80", "--new-tokens", "40", "--kv", "368640"]
# 8 conversations of 3 turns under 300 positions: some last turns are evicted while they decode.
TURNS = ["--sessions", "8", "--prompt-tokens", "24", "--new-tokens", "16", "--turns", "3", "--turn-tokens", "8"]
TURNS += ["--kv", "460800", "--prefix-cache", "--block-tokens", "16"]


def _sweep(tmp_path, args):
    """A sweep at concurrency 4 on the dgr-012 preset, its KV budget (``--kv`` here, the bytes) in a config."""
    i = args.index("--kv")
    config, out = tmp_path / "node.yaml", tmp_path / "b"
    config.write_text(
        "engine: {kind: synthetic, preset: dgr-012}\n"
        f"budget: {{kv_bytes: {args[i + 1]}, max_prefill_tokens_per_tick: 64}}\n"
    )
    flags = [*args[:i], *args[i + 2 :]]
    r = runner.invoke(app, ["sweep", "--config", str(config), "--levels", "4", *flags, "--out", str(out), "--json"])
    return r, out


@pytest.mark.parametrize(
    "args", [SINGLE, [*SINGLE, "--prefix-cache"], TURNS], ids=["single", "single-prefix-cache", "conversations"]
)
def test_sessions_evicted_under_kv_pressure_hold_isolation(tmp_path, args):
    r, out = _sweep(tmp_path, args)
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    (lv,) = d["levels"]
    missed = [s for s in lv["sessions"] if s["done_reason"] == "CACHE_MISS"]
    assert missed, "the budget must evict a running session, or this test proves nothing"
    v = lv["isolation_verdict"]
    assert v["ran"] and v["holds"] and v["schedule_changed"] == [] and v["leaks"] == [], v
    assert d["corruption_free"]
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 0, r.output


def test_pinned_length_is_the_level_length_only_where_the_session_completed():
    def rec(reason, n):
        return SessionRecord(
            session_id="s0",
            epoch=1,
            end_tick=3,
            prompt_tokens=4,
            max_new_tokens=9,
            tokens=list(range(n)),
            margins=[1.0] * n,
            digest="",
            done_reason=reason,
            error=None,
        )

    req = GenerationRequest("s0", (1, 2, 3, 4), 9, stop_tokens=frozenset({2}))
    assert isolation.pinned_length(rec("COMPLETED", 3), req) == 3  # stopped at eos: pinned there
    assert isolation.pinned_length(rec("COMPLETED", 0), req) == 1
    for reason in ("CACHE_MISS", "CANCELLED", "FAILED"):  # the node ended it: it runs until the node does again
        assert isolation.pinned_length(rec(reason, 5), req) == 9


def test_passes_that_changed_the_schedule_verify_and_the_verdict_names_them(tmp_path, monkeypatch):
    # A pin that ends every perturbed turn halfway changes the schedule of every pass, and conversations then
    # end their turns in another order (a turn cut short starts the next one early): the bundle must still
    # verify, its verdict saying the schedule changed, rather than fail on the order in which sessions ended.
    monkeypatch.setattr(isolation, "pinned_length", lambda first, request: max(len(first.tokens) // 2, 1))
    r, out = _sweep(tmp_path, TURNS)
    assert r.exit_code == 0, r.output
    (lv,) = json.loads(r.stdout)["levels"]
    v = lv["isolation_verdict"]
    assert v["ran"] and not v["holds"] and v["schedule_changed"], v
    monkeypatch.undo()
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 0, r.output
