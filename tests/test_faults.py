"""The failure, cancel and restart matrix on the synthetic engine: every injection kind, the engine in
its own process killed and aborted for real, with and without the restart policy, and verify catching
a fault bundle that lies."""

import json
import os
import signal
import time
from pathlib import Path

import pytest
from test_bad_input import run_refused
from typer.testing import CliRunner

from meshbench.analysis import fault_matrix as fault_checks
from meshbench.cli import app
from meshbench.engine.base import DecodeItem, EngineLost, PrefillChunk, SessionHandle
from meshbench.engine.process import proxy as isolated
from meshbench.engine.process.proxy import EngineProcess, ProxyEngine
from meshbench.engine.setup import EngineSizing
from meshbench.engine.spec import EngineSpec
from meshbench.records.context import Budget
from meshbench.scheduler.budget import engine_limits
from meshbench.workload import faults

runner = CliRunner()
SPEC = EngineSpec("synthetic", "dgr-012", None, 0, "cpu", None)
BUDGET = Budget(1 << 30, 1 << 24, 1 << 26, 4, 8, 4, 4)
LIMITS = engine_limits(BUDGET)


def sweep(*args) -> dict:
    r = runner.invoke(app, ["sweep", "--json", *map(str, args)])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def level(data: dict, concurrency: int, fault: str) -> dict:
    return next(lv for lv in data["levels"] if lv["concurrency"] == concurrency and fault in ",".join(lv["faults"]))


def ended(lv: dict) -> dict:
    return {(s["session_id"], s["epoch"]): (s["done_reason"], s["error"]) for s in lv["sessions"]}


def reference_tokens(data: dict) -> dict:
    return {s["session_id"]: s["tokens"] for s in data["reference"]["sessions"]}


def children() -> set[int]:
    """This process's living children, read from /proc (a `ps` would count itself)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


@pytest.fixture
def no_leftover_processes():
    before = children()
    yield
    deadline = time.monotonic() + 10
    while children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children() - before == set(), "a process the test started is still running"


@pytest.fixture
def process():
    p = EngineProcess(SPEC, EngineSizing(12, 4, 4))
    try:
        yield p
    finally:
        p.stop()  # whatever the test did to it


# --- specs ---------------------------------------------------------------------------------
def test_fault_specs_parse_and_label_round_trip():
    row = faults.parse_row(
        "cancel:s1@2, evict:s0@3,raise:prefill@0,raise:decode@4,kill-engine@5,abort-engine@6,kill-worker:1@7"
    )
    assert [f.label for f in row] == [
        "cancel:s1@2",
        "evict:s0@3",
        "raise:prefill@0",
        "raise:decode@4",
        "kill-engine@5",
        "abort-engine@6",
        "kill-worker:1@7",
    ]
    assert [f.call for f in row] == [None, None, "prefill", "decode", None, "decode", None]
    assert row[-1].target == 1


@pytest.mark.parametrize(
    "spec,expect",
    [
        ("bogus@3", "is not a fault"),
        ("cancel@3", "cancel needs a session"),
        ("kill-engine:1@3", "kill-engine takes no target"),
        ("raise:release@3", "raise takes prefill or decode"),
        ("kill-worker:x@3", "kill-worker takes a worker index"),
        ("cancel:s1@-1", "is not a fault"),
        ("cancel:s1", "is not a fault"),
    ],
)
def test_a_malformed_fault_is_one_line_and_exit_2(spec, expect):
    run_refused("sweep", "--inject", spec, expect=expect)


@pytest.mark.parametrize(
    "args,expect",
    [
        (["--inject", "cancel:s9@1"], "no session 's9' in the workload"),
        (["--inject", "kill-engine@3"], "kill-engine@3 needs the engine in its own process (--isolate)"),
        (["--inject", "abort-engine@3"], "needs the engine in its own process"),
        (["--inject", "kill-worker:0@3", "--isolate"], "the run spawns 0 RPC worker(s)"),
        (["--inject", "cancel:s1@1", "--arrivals", "poisson:0.5", "--rates", "0.5"], "not with rates"),
        (["--inject", ""], "faults.0: '' should be non-empty"),
        (["--inject", ","], "an empty fault row"),
    ],
)
def test_a_fault_the_run_cannot_have_is_refused_before_it_runs(args, expect):
    run_refused("sweep", *args, expect=expect)


@pytest.mark.parametrize(
    "fault,expect",
    [
        (
            "cancel:s1@500",
            "fault cancel:s1@500: at concurrency 8 the pass ran 15 ticks: tick 500 is never reached "
            "(no session reaches it)",
        ),
        (
            "raise:prefill@9",
            "fault raise:prefill@9: at concurrency 8 the pass ran 15 ticks: no prefill call ran from "
            "tick 9 (no session reaches it)",
        ),
    ],
)
def test_a_fault_no_session_reaches_is_exit_2_and_writes_nothing(tmp_path, fault, expect):
    r = runner.invoke(app, ["sweep", "--levels", "8", "--inject", fault, "--out", str(tmp_path / "b")])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1] == f"error: {expect}"  # after the progress line of the level
    assert "Traceback" not in r.output and list(tmp_path.iterdir()) == []


# --- in the node's process -------------------------------------------------------------------
def test_cancel_hits_a_decoding_an_admitted_and_a_queued_session():
    data = sweep("--levels", "4", "--inject", "cancel:s1@2,cancel:s3@2,cancel:s6@2")
    lv = data["levels"][0]
    assert [e["hit"] for e in lv["fault_events"]] == ["decoding (1 token(s) so far)", "awaiting prefill", "queued"]
    ends = ended(lv)
    assert [ends[(s, 1)] for s in ("s1", "s3", "s6")] == [("CANCELLED", None)] * 3
    assert lv["counts"]["cancelled"] == 3 and lv["counts"]["completed"] == 5
    assert lv["tick_records"][2]["ended"] == ["s1", "s3", "s6"]  # cancelled before tick 2: recorded in it
    ref = reference_tokens(data)
    assert all(s["tokens"] == ref[s["session_id"]][: len(s["tokens"])] for s in lv["sessions"])
    assert data["corruption_free"] is True
    assert lv["tick_records"][-1]["kv_bytes"] == 0


def test_cancel_of_a_finished_session_is_recorded_as_no_effect():
    data = sweep("--levels", "8", "--inject", "cancel:s0@12")
    e = data["levels"][0]["fault_events"][0]
    assert e["hit"] == "already ended: COMPLETED" and e["sessions"] == []


def test_evict_takes_the_cache_miss_path_and_frees_the_kv():
    data = sweep("--levels", "2", "--inject", "evict:s0@3")
    lv = data["levels"][0]
    assert ended(lv)[("s0", 1)] == ("CACHE_MISS", None)
    s0 = next(s for s in lv["sessions"] if s["session_id"] == "s0")
    assert s0["end_tick"] == 3 and len(s0["tokens"]) == 3  # the miss is seen at its next decode
    t = lv["tick_records"][3]
    assert "s0" in t["decode_sessions"] and t["ended"] == ["s0"]
    assert lv["cache_misses"] == 1 and data["corruption_free"] is True


def test_an_eviction_of_a_queued_session_does_nothing():
    data = sweep("--levels", "2", "--inject", "evict:s5@3")
    assert data["levels"][0]["fault_events"][0]["sessions"] == []
    assert data["levels"][0]["counts"]["completed"] == 8


def test_raise_in_prefill_and_in_decode_fail_exactly_the_sessions_in_the_call():
    data = sweep("--levels", "4", "--inject", "raise:prefill@2", "--inject", "raise:decode@4")
    pre, dec = level(data, 4, "raise:prefill"), level(data, 4, "raise:decode")
    assert ended(pre)[("s2", 1)] == ("FAILED", "prefill: InjectedFault: injected into the prefill call")
    assert pre["counts"] == {
        "completed": 7,
        "cancelled": 0,
        "failed": 1,
        "cache_misses": 0,
        "rejected_admissions": 0,
        "engine_losses": 0,
        "resubmitted": 0,
    }
    failed = [k for k, (end, _) in ended(dec).items() if end == "FAILED"]
    assert failed == [("s0", 1), ("s1", 1), ("s2", 1), ("s3", 1)]  # the decode batch of tick 4
    assert data["corruption_free"] is True  # the failures are the faults'; every other session is identical


def test_a_raise_fires_at_the_first_such_call_at_or_after_its_tick():
    data = sweep("--levels", "2", "--inject", "raise:prefill@2")
    assert data["levels"][0]["fault_events"][0]["tick"] == 8  # at concurrency 2, the next prefill is at tick 8


# --- the engine in its own process ---------------------------------------------------------
def prefill(e, sid: str, tokens, capacity: int = 12):
    """A whole prompt through the engine's one call."""
    return e.step([], [PrefillChunk(SessionHandle(sid, 1, capacity), tuple(tokens), 0, True)]).prefill[0]


def decode(e, *items: DecodeItem):
    return e.step(list(items), []).decode


def test_the_proxy_keeps_the_contract_and_reports_the_kv(process):
    e = ProxyEngine(process, LIMITS)
    r = prefill(e, "a", [1, 2, 3, 4])
    assert e.kv_bytes_in_use == 4 * e.kv_bytes_per_token
    (d,) = decode(e, DecodeItem("a", 1, 4, r.token))
    assert d.session_id == "a" and not d.cache_miss and e.kv_bytes_in_use == 5 * e.kv_bytes_per_token
    (miss,) = decode(e, DecodeItem("b", 1, 4, 1))
    assert miss.cache_miss and miss.token is None
    e.release("a")
    assert e.kv_bytes_in_use == 0
    bad = prefill(e, "c", [1], capacity=10_000)  # an engine's exception fails the session, not the call
    assert bad.token is None and "exceed the model's context_length" in bad.error
    assert bad.cause == "prefill: MeshbenchError"
    e.arm("decode", "raise")
    (raised,) = decode(e, DecodeItem("a", 1, 4, 1))
    assert raised.error == "decode_batch: InjectedFault: injected into the decode call"
    assert raised.cause == "decode_batch: InjectedFault"
    assert process.alive and process.calls == 7  # make, prefill, 2 decodes, release, the refused prefill, the raise


@pytest.mark.parametrize("sig,cause", [(signal.SIGKILL, "SIGKILL"), (signal.SIGTERM, "SIGTERM")])
def test_a_dead_engine_process_is_engine_lost_with_its_cause(process, sig, cause):
    e = ProxyEngine(process, LIMITS)
    prefill(e, "a", [1, 2, 3, 4])
    os.kill(process.pid, sig)
    process.proc.wait()
    with pytest.raises(EngineLost, match=f"^engine lost: {cause}$"):
        decode(e, DecodeItem("a", 1, 4, 1))
    assert e.kv_bytes_in_use == 0  # its KV went with it
    e.release("a")  # a no-op on a lost engine
    with pytest.raises(EngineLost, match=f"engine lost: {cause}"):
        prefill(e, "b", [1])


def test_an_engine_that_exits_is_lost_with_its_exit_status(process):
    e = ProxyEngine(process, LIMITS)
    process._conn.send(("exit",))  # the child leaves its loop: a clean exit 0 behind the proxy's back
    process.proc.wait()
    with pytest.raises(EngineLost, match="^engine lost: exit 0$"):
        prefill(e, "a", [1, 2])


def test_an_engine_that_stops_answering_is_killed_after_the_call_timeout(process, monkeypatch):
    e = ProxyEngine(process, LIMITS)
    monkeypatch.setattr(isolated, "CALL_TIMEOUT_S", 0.5)
    os.kill(process.pid, signal.SIGSTOP)
    with pytest.raises(EngineLost, match="^engine lost: no answer within 0.5 s \\(killed\\)$"):
        prefill(e, "a", [1, 2])
    assert process.proc.poll() is not None  # killed, not left stopped


def test_an_engine_process_that_cannot_load_its_model_is_one_line(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    line = run_refused("sweep", "--model", bad, "--isolate", expect="model")
    assert "Traceback" not in line


def test_kill_engine_without_restart_fails_the_resident_then_everything_that_needs_it(no_leftover_processes):
    data = sweep("--levels", "4", "--inject", "kill-engine@5", "--isolate")
    lv = data["levels"][0]
    e = lv["fault_events"][0]
    assert e["hit"] == "between ticks, 4 session(s) resident in the engine" and e["cause"] == "engine lost: SIGKILL"
    ends = ended(lv)
    assert [ends[(f"s{i}", 1)] for i in range(4)] == [("FAILED", "engine lost: SIGKILL")] * 4
    assert [ends[(f"s{i}", 1)] for i in range(4, 8)] == [("FAILED", "engine lost: SIGKILL (not restarted)")] * 4
    assert lv["engine_losses"] == [
        {
            "tick": 5,
            "cause": "engine lost: SIGKILL",
            "lost": [["s0", 1], ["s1", 1], ["s2", 1], ["s3", 1]],
            "resubmitted": [],
        }
    ]
    assert lv["tick_records"][-1]["kv_bytes"] == 0 and data["engine"]["isolated"] is True


@pytest.mark.parametrize("fault,cause", [("kill-engine@5", "SIGKILL"), ("abort-engine@5", "SIGABRT")])
def test_with_restart_the_lost_sessions_resubmit_and_end_identical(fault, cause, no_leftover_processes):
    data = sweep("--levels", "2,4", "--inject", fault, "--isolate", "--restart-engine")
    ref = reference_tokens(data)
    for lv in data["levels"]:
        loss = lv["engine_losses"][0]
        assert loss["cause"] == f"engine lost: {cause}" and len(loss["resubmitted"]) == lv["concurrency"]
        final = {}
        for s in lv["sessions"]:
            final[s["session_id"]] = s
        assert all(s["done_reason"] == "COMPLETED" and s["tokens"] == ref[sid] for sid, s in final.items())
        assert {s["epoch"] for s in final.values()} == {1, 2}
        assert lv["counts"]["completed"] == 8 and lv["counts"]["failed"] == lv["concurrency"]
        t = lv["tick_records"][5]
        assert t["resubmitted"] == [f"s{i}" for i in range(lv["concurrency"])]
    assert data["corruption_free"] is True


def test_a_fault_bundle_verifies_and_reruns_exactly(tmp_path, no_leftover_processes):
    out = tmp_path / "b"
    r = runner.invoke(
        app,
        [
            "sweep",
            "--levels",
            "2,4",
            "--repeat",
            "2",
            "--warmup",
            "0",
            "--isolate",
            "--restart-engine",
            "--inject",
            "cancel:s1@2,evict:s0@3",
            "--inject",
            "kill-engine@4",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    readme = (out / "README.md").read_text()
    assert "## Fault matrix" in readme and "| 4 | `kill-engine@4` | 4 |" in readme
    r = runner.invoke(app, ["verify", str(out), "--rerun"])
    assert r.exit_code == 0, r.stdout


@pytest.fixture(scope="module")
def fault_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("fb") / "b"
    r = runner.invoke(
        app,
        [
            "sweep",
            "--levels",
            "4",
            "--warmup",
            "0",
            "--isolate",
            "--restart-engine",
            "--inject",
            "cancel:s5@2",
            "--inject",
            "kill-engine@5",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    return out


def _tampered(bundle, tmp_path, change) -> str:
    out = tmp_path / "t"
    out.mkdir()
    data = json.loads((bundle / "results.json").read_text())
    change(data)
    (out / "results.json").write_text(json.dumps(data))
    (out / "README.md").write_text((bundle / "README.md").read_text())
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 1, r.stdout
    return r.stdout


def _session(lv, sid, epoch):
    return next(s for s in lv["sessions"] if s["session_id"] == sid and s["epoch"] == epoch)


def test_verify_catches_a_resubmitted_session_that_ended_differently(fault_bundle, tmp_path):
    def change(d):
        s = _session(d["levels"][1], "s0", 2)
        s["tokens"][-1] ^= 1
        s["digest"] = fault_checks.figures.token_digest(s["tokens"])

    out = _tampered(fault_bundle, tmp_path, change)
    assert "levels[1].faults[resubmitted identical] s0#2 tokens = the reference's expected=True found=False" in out


def test_verify_catches_a_session_that_ends_twice_in_one_epoch(fault_bundle, tmp_path):
    def change(d):
        lv = d["levels"][1]
        _session(lv, "s1", 2)["epoch"] = 1

    out = _tampered(fault_bundle, tmp_path, change)
    assert "levels[1].faults[ends once] s1 epochs expected=[1, 2] found=[1, 1]" in out


def test_verify_catches_counters_that_do_not_match_the_records(fault_bundle, tmp_path):
    def change(d):
        d["levels"][0]["counts"]["cancelled"] = 0

    out = _tampered(fault_bundle, tmp_path, change)
    assert "levels[0].faults[accounting] counts.cancelled (the scheduler's) = the records' expected=1 found=0" in out


def test_verify_catches_an_untouched_session_that_failed(fault_bundle, tmp_path):
    def change(d):
        s = _session(d["levels"][0], "s7", 1)
        s["done_reason"], s["error"] = "FAILED", "made up"

    out = _tampered(fault_bundle, tmp_path, change)
    assert "levels[0].faults[untouched identical] s7#1 done_reason expected=COMPLETED found=FAILED" in out
    assert "corruption_free" in out


def test_verify_catches_kv_left_behind_after_a_restart(fault_bundle, tmp_path):
    def change(d):
        d["levels"][1]["tick_records"][-1]["kv_bytes"] = 4096

    out = _tampered(fault_bundle, tmp_path, change)
    assert "levels[1].faults[KV to zero] kv_bytes at the end expected=0 found=4096" in out


def test_verify_catches_a_fault_matrix_cell_that_lies(fault_bundle, tmp_path):
    out = tmp_path / "t"
    out.mkdir()
    (out / "results.json").write_text((fault_bundle / "results.json").read_text())
    readme = (fault_bundle / "README.md").read_text()
    assert "| yes | yes | yes | n/a | yes |" in readme and "| yes | yes | yes | yes | yes |" in readme
    (out / "README.md").write_text(
        readme.replace("s0, s1, s2, s3 FAILED (engine lost: SIGKILL)", "s0 FAILED (engine lost: SIGKILL)", 1)
    )
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 1 and "fault matrix rows[1].what happened" in r.stdout, r.stdout


def test_a_failed_restart_with_resubmissions_fails_the_accounting(tmp_path):
    # A restart that failed left no engine to resubmit to: an engine loss that says so and still lists
    # resubmissions was never measured (it verified clean before this check).
    import shutil

    bundle = tmp_path / "b"
    shutil.copytree(Path(__file__).parent.parent / "evidence" / "MB-FAULTS-GGUF", bundle)
    data = json.loads((bundle / "results.json").read_text())
    level = next(lv for lv in data["levels"] if any(loss["resubmitted"] for loss in lv["engine_losses"]))
    level["engine_losses"][0]["restart_error"] = "boom"
    (bundle / "results.json").write_text(json.dumps(data))
    r = CliRunner().invoke(app, ["verify", str(bundle)])
    assert r.exit_code == 1 and "a failed restart resubmitted nothing" in r.output, r.output


def test_faults_run_with_the_prefix_cache_and_kv_is_held_to_the_store_it_leaves(tmp_path):
    """Cancels, evictions and raised calls beside shared prefixes: every fault check and the prefix cache's hold;
    the KV left at the end is the cache's unreferenced blocks, exactly, and KV left beside them is caught."""
    out = tmp_path / "b"
    args = ["sweep", "--levels", "2,4", "--prefix-cache", "--block-tokens", "4", "--prefix-groups", "3,3,2",
            "--prefix-tokens", "8", "--inject", "cancel:s1@2,cancel:s6@2", "--inject", "evict:s0@3", "--inject",
            "raise:prefill@2", "--inject", "raise:decode@4", "--out", str(out)]  # fmt: skip
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    assert sum(s["cached_tokens"] or 0 for lv in data["levels"] for s in lv["sessions"]) > 0  # (hits beside faults)
    lv = level(data, 4, "evict:s0@3")
    assert ended(lv)["s0", 1][0] == "CACHE_MISS"
    last = data["levels"][1]["tick_records"][-1]
    assert last["kv_bytes"] == last["kv_bytes_shared"] > 0  # the cache's blocks outlive every session
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0

    def change(d):
        d["levels"][1]["tick_records"][-1]["kv_bytes"] += 4096

    found = _tampered(out, tmp_path, change)
    assert "levels[1].faults[KV to zero] kv_bytes at the end (only the prefix cache's blocks)" in found

    def late(d):  # a session's KV freed late, after its eviction, but before the end
        for t in level(d, 2, "evict:s0@3")["tick_records"][4:8]:
            t["kv_bytes"] += 8 * 1536

    (tmp_path / "late").mkdir()
    found = _tampered(out, tmp_path / "late", late)
    assert "kv_bytes (at most the live sessions' own positions x 1536, plus the store's) expected=True found=False" in (
        found
    )


def test_a_session_released_after_a_whole_block_of_its_answer_leaves_it_cached_however_it_ended():
    """Cancelled, evicted or failed after a whole block of its answer, a session's release caches what it wrote,
    as a completed one's does: the sweep's own verify replays that (it failed the store's bytes before)."""
    sweep("--levels", "2,4", "--prefix-cache", "--block-tokens", "4", "--prefix-groups", "3,3,2", "--prefix-tokens",
          "8", "--inject", "cancel:s0@6", "--inject", "evict:s0@6", "--inject", "raise:decode@6")  # fmt: skip
    # cancelled mid-prompt, between ticks, after a whole block: a sharer prefilled in the next tick hits it
    sweep("--levels", "2,4", "--prefix-cache", "--block-tokens", "4", "--prefix-groups", "3,3,2", "--prefix-tokens",
          "8", "--prefill", "chunked", "--max-prefill-tokens-per-tick", "5", "--inject", "cancel:s3@8")  # fmt: skip


@pytest.mark.parametrize(
    "workload, faults",
    [  # the node's own evictions under KV pressure (240 positions; 4 sessions of 120 at once), and a fault beside
        ("{sessions: 8, prompt_tokens: 80, new_tokens: 40}", "cancel:s1@5"),
        ("{sessions: 8, prompt_tokens: 24, new_tokens: 16, turns: 3, turn_tokens: 8}", "cancel:s7@5"),
        # an evict and a raised decode in one tick: the decode fails the session before its eviction is seen
        ("{sessions: 8, prompt_tokens: 4, new_tokens: 8}", "evict:s0@5,raise:decode@5"),
    ],
)
def test_a_fault_beside_the_node_s_own_evictions_or_another_fault_of_its_tick_verifies(tmp_path, workload, faults):
    """A session the node itself evicted under KV pressure is no fault's: it ends CACHE_MISS with the tokens it had
    made, a start of the reference's, and the KV held may drop before its miss is seen; an evicted session that a
    raised decode of the same tick failed ends FAILED. Each held as a genuine run, not a failure."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"story: P\nbudget: {{kv_bytes: 368640, max_prefill_tokens_per_tick: 64}}\nworkload: {workload}\n")
    out = tmp_path / "P"
    r = runner.invoke(app, ["sweep", "--config", str(cfg), "--levels", "4", "--inject", faults, "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    ends = [s["done_reason"] for s in data["levels"][0]["sessions"]]
    assert "CACHE_MISS" in ends or "FAILED" in ends
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
