"""Engine faults, cancellation, Ctrl-C, and concurrent callers."""

import random
import threading
import time

import factories as f

from meshbench.engine.base import separate_step
from meshbench.records import serial
from meshbench.results import bundle
from meshbench.results import document as results
from meshbench.scheduler.budget import AdmissionReason
from meshbench.scheduler.session import DoneReason
from meshbench.sweep.levels import SweepPlan, run_concurrency_sweep
from meshbench.workload.config import Workload, load


class FaultyEngine:
    """Raises inside prefill or decode_batch on chosen calls (1-based), otherwise delegates."""

    def __init__(self, inner, prefill_faults=(), decode_faults=()):
        self.inner = inner
        self.prefill_faults, self.decode_faults = set(prefill_faults), set(decode_faults)
        self.prefills = self.decodes = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step(self, decode, prefill):  # the tick's call, through this wrapper's own methods
        return separate_step(self, decode, prefill)

    def prefill(self, session, prompt):
        self.prefills += 1
        if self.prefills in self.prefill_faults:
            self.inner.prefill(session, prompt)  # KV is written, then the engine fails
            raise RuntimeError(f"injected prefill fault #{self.prefills}")
        return self.inner.prefill(session, prompt)

    def decode_batch(self, items):
        self.decodes += 1
        if self.decodes in self.decode_faults:
            raise OSError(f"injected decode fault #{self.decodes}")
        return self.inner.decode_batch(items)


def test_faults_fail_only_the_sessions_in_the_call_and_never_leak_kv():
    inner = f.engine()
    e = FaultyEngine(inner, prefill_faults={2}, decode_faults={4})
    s = f.scheduler(e, max_active_sessions=3, max_batch_size=3, max_prefill_tokens_per_tick=4)
    for sid in "abcde":
        s.submit(f.request(sid, (1, 2, 3, sid.encode()[0] % 50), 5))
    recs = s.run_to_completion()
    by = {x.session_id: x for x in s.sessions()}
    assert by["b"].done_reason is DoneReason.FAILED and "injected prefill fault #2" in by["b"].error
    failed_in_decode = {sid for sid, x in by.items() if x.error and "decode fault" in x.error}
    fourth = [r for r in recs if r.decode_batch][3]
    assert failed_in_decode == set(fourth.decode_sessions)  # exactly the batch of the 4th decode call
    assert all(
        x.done_reason is DoneReason.COMPLETED for sid, x in by.items() if sid != "b" and sid not in failed_in_decode
    )
    for sid, x in by.items():
        if x.done_reason is DoneReason.COMPLETED:
            assert x.tokens == f.reference_tokens(x.request)
    t = s.telemetry()
    assert t.failed == 1 + len(failed_in_decode)
    assert t.failed_by_cause == {"prefill: RuntimeError": 1, "decode_batch: OSError": len(failed_in_decode)}
    assert inner.kv_bytes_in_use == 0 and len(inner.kv) == 0
    assert t.completed + t.failed == 5


def test_a_sweep_records_failures_and_verify_fails_the_bundle(tmp_path):
    from typer.testing import CliRunner

    from meshbench.cli import app
    from meshbench.results import envinfo

    factory = lambda b: FaultyEngine(f.engine(b.kv_bytes), decode_faults={3})  # noqa: E731
    sweep = run_concurrency_sweep(SweepPlan([1, 2], Workload.uniform(4, 4, 4), f.budget()), factory)
    assert [lv["failed"] for lv in serial.to_json(sweep.levels)] == [1, 2]
    cfg = load(overrides={"workload": {"sessions": 4, "new_tokens": 4}, "levels": [1, 2]})
    data = serial.to_json(
        results.build(cfg, sweep, serial.engine_info(f.engine_info()), envinfo.environment(), "meshbench sweep")
    )
    out = tmp_path / "b"
    bundle.write(out, data)
    r = CliRunner().invoke(app, ["verify", str(out)])
    assert r.exit_code == 1
    assert "levels[0].failed (no session may fail but by an injected fault) expected=0 found=1" in r.stdout
    assert (
        "done_reason (only an injected fault may end a session so) expected=COMPLETED found=FAILED "
        "(decode_batch: OSError: injected decode fault #3)"
    ) in r.stdout


def test_cancel_queued_and_active_sessions_and_no_ops():
    e = f.engine()
    s = f.scheduler(e, max_active_sessions=1, max_batch_size=1, max_queue_depth=2)
    for sid in "abc":
        s.submit(f.request(sid))
    s.run_tick()
    assert s.cancel("b").cancelled  # queued
    assert s.cancel("a").cancelled  # active: KV freed at once, slot handed to c
    assert e.kv_bytes_in_use == 0
    assert [x.status.value for x in s.sessions()] == ["FINISHED", "FINISHED", "ADMITTED"]
    assert s.cancel("zzz").detail == "unknown session"
    assert s.cancel("a").detail == "already finished: CANCELLED"
    s.run_to_completion()
    assert s.cancel("c").detail == "already finished: COMPLETED"
    t = s.telemetry()
    assert (t.cancelled, t.completed, t.kv_bytes) == (2, 1, 0)


def test_ctrl_c_leaves_no_partial_bundle_and_exits_130(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import meshbench.sweep.run as run
    from meshbench.cli import app

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "run_sweep", interrupted)
    out = tmp_path / "b"
    r = CliRunner().invoke(app, ["sweep", "--out", str(out)])
    assert r.exit_code == 130 and "interrupted" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_concurrent_submitters_and_cancellers_lose_nothing():
    """Four threads submit and cancel while one runs ticks: bounded in count and time."""
    kv_budget = 40 * 1536
    e = f.engine(kv_bytes=kv_budget)
    s = f.scheduler(e, kv_bytes=kv_budget, max_active_sessions=4, max_batch_size=4, max_queue_depth=6)
    accepted, rejected, cancelled = set(), [], set()
    lock = threading.Lock()
    stop = threading.Event()
    violations = []

    def submitter(k):
        rng = random.Random(k)
        for i in range(40):
            sid = f"t{k}-{i}"
            d = s.submit(f.request(sid, tuple(rng.randrange(256) for _ in range(rng.randint(1, 6))), rng.randint(1, 8)))
            with lock:
                (accepted.add(sid) if d.accepted else rejected.append(d.reason))
            if d.queue_depth > 6:
                violations.append(("queue", d.queue_depth))
            if rng.random() < 0.3:
                r = s.cancel(f"t{k}-{rng.randrange(i + 1)}")
                if r.cancelled:
                    with lock:
                        cancelled.add(r.session_id)
            time.sleep(rng.random() / 1000)

    def ticker():
        while not stop.is_set() or s.has_work():
            rec = s.run_tick()
            if rec.queued > 6:
                violations.append(("queue", rec.queued))
            if rec.kv_bytes > kv_budget:
                violations.append(("kv", rec.kv_bytes))

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(4)]
    tick_thread = threading.Thread(target=ticker)
    tick_thread.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a submitter deadlocked"
    stop.set()
    tick_thread.join(timeout=60)
    assert not tick_thread.is_alive(), "the ticker deadlocked"
    assert violations == []
    ended = [x for x in s.sessions()]
    ids = [x.session_id for x in ended]
    assert len(ids) == len(set(ids))  # no duplicates
    assert set(ids) == accepted  # none lost
    assert all(x.done_reason is not None for x in ended)
    assert {x.session_id for x in ended if x.done_reason is DoneReason.CANCELLED} == cancelled
    assert len(accepted) + len(rejected) == 160
    assert all(r is AdmissionReason.REJECTED_QUEUE_FULL for r in rejected)
    assert e.kv_bytes_in_use == 0 and s.telemetry().kv_bytes == 0
