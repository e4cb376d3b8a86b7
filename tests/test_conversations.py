"""Conversations (`--turns`): synthetic user turns and real ones (a prompts file's JSON `turns`), each later turn's
prompt the whole conversation so far, verified from the records; and what conversations do not run with yet,
refused in one line."""

import copy
import json
from pathlib import Path

import factories as f
import pytest
from test_bad_input import run_refused
from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.engine.llama_model import tokenize
from meshbench.workload.config import DEFAULTS, from_mapping

runner = CliRunner()
CONFIGS = Path(__file__).resolve().parents[1] / "configs"

QUESTIONS = ["what time is it", "where is the fox", "hello world", "the quick brown fox"]


def _conversations(tmp_path, turns=2, lines=None):
    lines = lines or [
        {"prompt": f"user: {q}\nassistant:", "turns": [f"\nuser: and then {k}?\nassistant:" for k in range(turns)]}
        for q in QUESTIONS
    ]
    p = tmp_path / "talk.jsonl"
    p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return p


def _gguf(model, p, *extra):
    return ["sweep", "--engine", "gguf", "--model", model, "--threads", "1", "--warmup", "0", "--prompts", p, *extra]


@pytest.fixture(scope="module")
def vocab_model(tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not importable")
    path = tmp_path_factory.mktemp("m") / "vocab.gguf"
    f.tiny_gguf(path, "q4_0", "bench")
    return path


def test_real_turns_grow_the_conversation_and_the_bundle_verifies(vocab_model, tmp_path):
    p, out = _conversations(tmp_path), tmp_path / "b"
    args = _gguf(vocab_model, p, "--sessions", 4, "--new-tokens", 4, "--turns", 3, "--eos", "ban", "--levels", "1,4")
    args += ["--isolation-rounds", 1]  # (what is tested is the turns, not the proof's strength)
    r = runner.invoke(app, [*map(str, args), "--prefix-cache", "--block-tokens", "8", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    text = json.loads(p.read_text().splitlines()[1])["turns"]
    want = [len(x) for x in tokenize(str(vocab_model), text[:2], bos=False)]
    assert d["config"]["workload"]["turn_tokens"][1] == want  # each session's real turns' lengths, echoed
    for lv in d["levels"]:
        by = {(s["session_id"], s["epoch"]): s for s in lv["sessions"]}
        assert sorted(by) == [(f"s{k}", e) for k in range(4) for e in (1, 2, 3)]
        for (sid, e), s in by.items():
            if e > 1:  # the last turn's prompt, its answer and the user's next message
                prev = by[(sid, e - 1)]
                user = d["config"]["workload"]["turn_tokens"][int(sid[1:])][e - 2]
                assert s["prompt_tokens"] == prev["prompt_tokens"] + len(prev["tokens"]) + user
        assert lv["cache_verdict"]["holds"] and lv["cache_verdict"]["later_turns"] == 8
        assert lv["prefix"]["saved_tokens"] > 0  # later turns start from their own earlier blocks
    assert d["corruption_free"] and all(lv["isolation_verdict"]["holds"] for lv in d["levels"])
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 0, r.output
    # a forged own-KV replay where no turn differs (and on a level that holds, nothing to launder)
    good = (out / "results.json").read_text()
    forged = json.loads(good)
    forged["levels"][0]["cache_verdict"]["own_kv"] = {"reproduced": True, "tokens": 48, "session_id": "s1"}
    (out / "results.json").write_text(json.dumps(forged))
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 1 and "own_kv (only where turns differ, replayable)" in r.stdout, r.stdout
    assert "a mismatch names a turn and token of the level, a match none" in r.stdout
    (out / "results.json").write_text(good)
    # a forged echo: a turn one token shorter than the prompts recorded
    forged = json.loads((out / "results.json").read_text())
    forged["config"]["workload"]["turn_tokens"][2][0] -= 1
    (out / "results.json").write_text(json.dumps(forged))
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 1 and "sessions[s2#2].prompt_tokens (the last turn's, its answer, the user's)" in r.stdout


@pytest.mark.parametrize(
    "lines, extra, expect",
    [
        ([{"prompt": "a", "turns": ["b"]}, {"prompt": "c"}], [], "give a 'turns' on every line or on none"),
        ([{"prompt": "a", "turns": "b"}, {"prompt": "c", "turns": "d"}], [], "line 1's 'turns' is not a list"),
        ([{"prompt": "a", "turns": ["b", ""]}, {"prompt": "c", "turns": ["d"]}], [], "is not a list of non-empty"),
        ([{"prompt": "a", "turns": []}, {"prompt": "c", "turns": []}], [], "is not a list of non-empty strings"),
        ([{"prompt": "a", "turns": ["b"]}, {"prompt": "c", "turns": ["d"]}], None, "give workload.turns"),
        ([{"prompt": "a", "turns": ["b", "c"]}, {"prompt": "d", "turns": ["e"]}], ["--turns", 3], "line 2 has 1"),
        (["plain a", "plain b"], ["--turns", 2], "needs 1 later 'turns' on each line; line 1 has 0"),
        (
            [{"prompt": "a", "turns": ["b"]}, {"prompt": "c", "turns": ["d"]}],
            ["--turns", 2, "--turn-tokens", 4],
            "real prompts take each later turn from the prompts file's 'turns'",
        ),
        (
            [{"prompt": "a", "turns": ["b"]}, {"prompt": "c", "turns": ["d"]}],
            ["--turns", 2, "--eos", "stop"],
            "conversations need eos continue or ban",
        ),
        (['{"prompt": "a", "turns": ["\\ud800x"]}', {"prompt": "c", "turns": ["d"]}], [], "is not UTF-8"),
    ],
)
def test_real_turns_that_cannot_be_a_conversation_are_refused(vocab_model, tmp_path, lines, extra, expect):
    p = _conversations(tmp_path, lines=lines)
    args = _gguf(vocab_model, p, "--sessions", 2, "--levels", 1, "--out", tmp_path / "o")
    run_refused(*args, *(extra if extra is not None else []), expect=expect, cwd_files=tmp_path)


@pytest.mark.parametrize(
    "extra, expect",
    [
        (["--turns", 3], "a later turn needs user tokens of its own"),
        (["--turn-tokens", 4], "user tokens of later turns need workload.turns > 1"),
    ],
)
def test_synthetic_turns_that_cannot_run_are_refused(tmp_path, extra, expect):
    run_refused("sweep", "--levels", "1,2", "--out", tmp_path / "o", *extra, expect=expect, cwd_files=tmp_path)


def test_an_endpoint_refuses_conversations_it_does_not_run(tmp_path):
    # (an endpoint's conversations: tests/test_endpoint_conversations.py)
    p = _conversations(tmp_path)
    args = ["sweep", "--target", "http://127.0.0.1:9", "--prompts", p, "--sessions", 2, "--levels", 1]
    run_refused(*args, "--turns", 2, "--eos", "ban", "--api", "openai", expect="over the native or chat API")
    run_refused(*args, expect="its lines have 'turns': give workload.turns")


def test_turn_lengths_in_a_config_are_refused_with_real_prompts(vocab_model, tmp_path):
    cfg = tmp_path / "c.yaml"
    data = {"engine": {"kind": "gguf", "model": str(vocab_model), "threads": 1}, "levels": [1]}
    data["workload"] = {"sessions": 2, "prompts": str(_conversations(tmp_path)), "turns": 2, "turn_tokens": [[1], [1]]}
    cfg.write_text(json.dumps(data))
    run_refused("sweep", "--config", cfg, "--out", tmp_path / "o", expect="with real prompts leave it out")


def test_an_echo_of_real_turns_reads_back_as_the_same_workload():
    data = {
        **DEFAULTS,
        "engine": {**DEFAULTS["engine"], "kind": "gguf", "model": "m.gguf"},
        "workload": {
            **DEFAULTS["workload"],
            **{"sessions": 2, "prompts": "p.jsonl", "eos": "ban", "turns": 3, "turn_tokens": [[3, 4], [5, 6]]},
        },
    }
    wl = from_mapping(data, "results.json").workload
    assert wl.turn_lengths == ((3, 4), (5, 6)) and wl.turn_tokens == 0 and wl.turn_sizes(1) == (5, 6)
    assert wl.to_dict()["turn_tokens"] == [[3, 4], [5, 6]]
    assert wl.longest == max(wl.prompt_tokens) + 11 + 3 * max(wl.new_tokens)  # session 1: 5 + 6 user ids
    for bad in ([[3, 4]], [[3], [4]], [[3, 0], [4, 5]]):
        with pytest.raises(Exception, match="give each of the 2 sessions 2 later turns' lengths"):
            from_mapping({**data, "workload": {**data["workload"], "turn_tokens": bad}}, "results.json")


def test_the_own_kv_finding_is_noted_as_taken_as_recorded_only_without_a_rerun():
    """Plain verify takes the own-KV replay's finding as recorded and says so; a rerun compares it with its own
    replay, so the note is not printed there (here the rerun is the records themselves: nothing is loaded)."""
    from meshbench.verify.bundle import check_bundle

    path = Path(__file__).resolve().parent.parent / "evidence" / "GEMMA3-270M-CONVERSATIONS"
    plain = check_bundle(path)
    assert not plain.failures
    noted = [n for n in plain.notes if "own_kv.reproduced: taken as recorded" in n]
    assert len(noted) == 2  # (levels 1 and 8: their turns differ, and each was replayed)
    rerun = check_bundle(path, rerun=lambda data: copy.deepcopy(data))
    assert not [n for n in rerun.notes if "taken as recorded" in n]


def test_faults_in_conversations_end_the_turn_they_hit_and_every_other_turn_equals_its_own_reference(tmp_path):
    """Cancel, evict and raise faults in 3-turn conversations on the prefix cache: a fault ends the turn it hits
    (and its conversation); every other turn, later turns included, must equal that turn of the conversation run
    alone, which verify checks turn by turn (each turn is its own reference, not the session's first)."""
    out = tmp_path / "CF"
    args = ["sweep", "--config", str(CONFIGS / "conversations.yaml"), "--levels", "2,4", "--out", str(out)]
    args += ["--inject", "cancel:s1@6,evict:s2@12", "--inject", "raise:decode@9", "--inject", "evict:s3@40"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    hit = {(e["fault"], s["session_id"], s["epoch"], s["done_reason"]) for lv in data["levels"]
           for e in lv["fault_events"] for s in e["sessions"]}  # fmt: skip
    assert ("evict:s3@40", "s3", 2, "CACHE_MISS") in hit  # (at 4 clients: s3's second turn, decoding)
    later = [s for lv in data["levels"] for s in lv["sessions"] if s["epoch"] == 3 and s["done_reason"] == "COMPLETED"]
    assert later  # untouched conversations ran all their turns, held to the reference's third turns
    assert "`s3#2` is session s3's second turn" in (out / "README.md").read_text()
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    # a later turn's tokens changed: verify holds it to that turn's reference
    lv = data["levels"][0]
    s = next(s for s in lv["sessions"] if s["epoch"] == 3 and s["done_reason"] == "COMPLETED")
    s["tokens"][0] = (s["tokens"][0] + 1) % 100
    forged = tmp_path / "FORGED"
    forged.mkdir()
    (forged / "results.json").write_text(json.dumps(data))
    (forged / "README.md").write_text((out / "README.md").read_text())
    r = runner.invoke(app, ["verify", str(forged)])
    assert r.exit_code == 1 and f"untouched identical] {s['session_id']}#3 tokens = the reference's" in r.output


def test_an_engine_lost_in_conversations_ends_their_turns_failed_and_the_bundle_verifies(tmp_path):
    """kill-engine and abort-engine in 3-turn conversations (no restart): the turns lost or waiting fail, no later
    turn follows them, every turn that ended before the loss equals its reference turn; a dropped lost turn is
    caught."""
    out = tmp_path / "KE"
    args = ["sweep", "--config", str(CONFIGS / "conversations.yaml"), "--no-prefix-cache", "--isolate"]
    args += ["--levels", "2,4", "--inject", "kill-engine@20", "--inject", "abort-engine@45", "--out", str(out)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    lost = {(s["session_id"], s["epoch"]) for lv in data["levels"] for e in lv["fault_events"] for s in e["sessions"]}
    assert ("s0", 2) in lost and ("s4", 1) in lost  # a later turn and a first turn, each failed with the engine
    assert all(s["epoch"] < 3 for lv in data["levels"] for s in lv["sessions"])  # no turn follows a failed one
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    lv = data["levels"][0]
    lv["sessions"] = [s for s in lv["sessions"] if (s["session_id"], s["epoch"]) != ("s0", 2)]
    forged = tmp_path / "FORGED"
    forged.mkdir()
    (forged / "results.json").write_text(json.dumps(data))
    r = runner.invoke(app, ["verify", str(forged)])
    assert r.exit_code != 0 and "s0" in r.output, r.output


def _forged(tmp_path, data, name):
    out = tmp_path / name
    out.mkdir()
    (out / "results.json").write_text(json.dumps(data))
    return runner.invoke(app, ["verify", str(out)])


def test_a_turn_lost_with_its_engine_is_resubmitted_under_the_next_epoch_as_the_same_turn(tmp_path):
    """--restart-engine in 3-turn conversations: a turn lost with the engine runs again under the next epoch,
    as the same turn (its request, and that turn of the reference), and the conversation goes on from it; a
    resubmitted turn's tokens or prompt forged are caught, named by session and epoch."""
    out = tmp_path / "KR"
    args = ["sweep", "--config", str(CONFIGS / "conversations.yaml"), "--no-prefix-cache", "--isolate"]
    args += ["--restart-engine", "--levels", "4", "--inject", "abort-engine@45", "--out", str(out)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    lv = data["levels"][0]
    by = {(s["session_id"], s["epoch"]): s for s in lv["sessions"]}
    again = [(x["session_id"], x["epoch"]) for loss in lv["engine_losses"] for x in loss["resubmitted"]]
    assert again and all(by[k]["done_reason"] == "COMPLETED" for k in again)
    sid, epoch = again[0]
    lost, rerun = by[sid, epoch - 1], by[sid, epoch]
    assert lost["done_reason"] == "FAILED" and epoch - 1 > 1  # a later turn was lost, not a first one
    assert rerun["prompt_tokens"] == lost["prompt_tokens"] and rerun["tokens"][: len(lost["tokens"])] == lost["tokens"]
    assert (sid, epoch + 1) in by  # its conversation went on: the next turn under the epoch after
    assert by[sid, epoch + 1]["prompt_tokens"] == rerun["prompt_tokens"] + len(rerun["tokens"]) + 8
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    rerun["tokens"][-1] = (rerun["tokens"][-1] + 1) % 100
    r = _forged(tmp_path, data, "TOKENS")
    assert r.exit_code != 0 and f"[resubmitted identical] {sid}#{epoch} tokens = the reference's" in r.output
    rerun["tokens"][-1] = (rerun["tokens"][-1] - 1) % 100
    rerun["prompt_tokens"] += 1
    r = _forged(tmp_path, data, "PROMPT")
    assert r.exit_code != 0 and f"sessions[{sid}#{epoch}] (prompt, new tokens) = its lost turn's" in r.output
    rerun["prompt_tokens"] -= 1
    loss = lv["engine_losses"][0]
    lost, loss["lost"] = loss["lost"], []  # the loss no longer says whom it lost: the resubmissions are unfounded
    r = _forged(tmp_path, data, "LOST")
    assert r.exit_code != 0 and f"engine loss at tick {loss['tick']}: resubmitted (each lost session once" in r.output
    loss["lost"] = lost
    last = max(lv["sessions"], key=lambda s: s["end_tick"])
    last["end_tick"] -= 2  # a turn's end moved: the tick that completed it no longer agrees
    r = _forged(tmp_path, data, "END")
    assert r.exit_code != 0 and f"completed {last['session_id']} (ended COMPLETED in this tick)" in r.output


def test_a_record_s_turn_counts_the_completed_turns_before_it():
    """A next turn follows a completed one, a resubmission a lost one: turn = 1 + completed earlier epochs."""
    from meshbench.records.model import SessionRecord
    from meshbench.records.turns import by_turn, turn_numbers

    def rec(sid, epoch, end):
        return SessionRecord(session_id=sid, epoch=epoch, end_tick=1, prompt_tokens=1, max_new_tokens=1, tokens=[],
                             margins=[], digest="", done_reason=end, error=None)  # fmt: skip

    recs = [rec("a", 3, "FAILED"), rec("a", 1, "COMPLETED"), rec("a", 2, "FAILED"), rec("a", 4, "COMPLETED")]
    recs += [rec("b", 1, "FAILED"), rec("b", 2, "COMPLETED"), rec("b", 3, "COMPLETED")]
    turn = turn_numbers(recs)
    assert [turn["a", e] for e in (1, 2, 3, 4)] == [1, 2, 2, 2] and [turn["b", e] for e in (1, 2, 3)] == [1, 1, 2]
    assert {k: s.epoch for k, s in by_turn(recs).items()} == {("a", 1): 1, ("a", 2): 4, ("b", 1): 2, ("b", 2): 3}


def test_conversations_with_chunked_prefill_verify(tmp_path):
    """Chunked prefill in conversations on the prefix cache: a later turn's prompt (up to 88 ids) split at the
    64-token budget, its first piece reading the cache; isolation, cache and conversation equivalence hold."""
    out = tmp_path / "CH"
    args = ["sweep", "--config", str(CONFIGS / "conversations.yaml"), "--prefill", "chunked", "--levels", "1,4"]
    r = runner.invoke(app, [*args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    for lv in data["levels"]:
        assert lv["isolation_verdict"]["holds"] and lv["cache_verdict"]["holds"]
        assert any(start > 0 for t in lv["tick_records"] for _, start, _ in t["prefill_chunks"])  # a prompt split
        assert any(s["epoch"] > 1 and s["cached_tokens"] for s in lv["sessions"])  # a later turn read the cache
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0


def test_a_perturbed_conversation_is_pinned_turn_by_turn():
    """An isolation pass pins each turn of a perturbed conversation to that turn's length in the level (one the
    level did not complete, or never ran, to its whole max_new_tokens), and next_turn hands each turn its pin."""
    from meshbench.analysis import isolation
    from meshbench.records.model import SessionRecord
    from meshbench.scheduler.session import GenerationRequest

    def rec(epoch, n, end="COMPLETED"):
        return SessionRecord(session_id="s0", epoch=epoch, end_tick=1, prompt_tokens=4, max_new_tokens=9,
                             tokens=[5] * n, margins=[], digest="", done_reason=end, error=None)  # fmt: skip

    req = GenerationRequest("s0", (1, 2, 3, 4), 9, turns=((7, 7), (8, 8), (9, 9)))
    base = {("s0", 1): rec(1, 3), ("s0", 2): rec(2, 6), ("s0", 3): rec(3, 2, "CACHE_MISS")}
    (out,) = isolation.requests_for([req], ["s0"], base, 256, 0, 0)
    assert (out.end_at, out.turn_end_at) == (3, (6, 9, 9))
    second = out.next_turn([5, 5, 5])
    assert second is not None and (second.end_at, second.turn_end_at) == (6, (9, 9))
    assert len(second.prompt_tokens) == 4 + 3 + 2


def test_conversations_on_the_wall_clock_at_rates_verify(tmp_path):
    """Conversations arriving at rates on the wall clock: every later turn is submitted once its last completed
    (recorded as turn events), each with the whole conversation so far; a conversation's wait and TTFT are its
    first turn's, as on the tick clock."""
    out = tmp_path / "WR"
    args = ["sweep", "--config", str(CONFIGS / "conversations.yaml"), "--arrivals", "poisson:1", "--rates", "200"]
    r = runner.invoke(app, [*args, "--levels", "4", "--clock", "wall", "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    lv = next(lv for lv in data["levels"] if lv.get("rate"))
    assert len(lv["turn_events"]) == 16 and sum(s["done_reason"] == "COMPLETED" for s in lv["sessions"]) == 24
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    s = next(s for s in lv["sessions"] if s["epoch"] == 3)
    s["prompt_tokens"] += 1
    r = _forged(tmp_path, data, "FORGED")
    assert r.exit_code != 0 and f"sessions[{s['session_id']}#3].prompt_tokens (the last turn's" in r.output


def test_wall_clock_conversations_with_prefill_only_ticks_finish(tmp_path):
    """On the wall clock the tick bound counts prompt positions too: chunked prefill of 8 positions a tick
    spends ticks that write no token (the bound counted tokens only, and such a run stopped unfinished)."""
    out = tmp_path / "WCH"
    args = ["sweep", "--config", str(CONFIGS / "conversations.yaml"), "--clock", "wall", "--rates", "4"]
    args += ["--arrivals", "poisson:1", "--prefill", "chunked", "--max-prefill-tokens-per-tick", "8"]
    r = runner.invoke(app, [*args, "--levels", "4", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
