"""Load that arrives over time: arrival processes, exact timelines, the bounded queue, and verify."""

import json
import shutil

import factories as f
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from meshbench.analysis import backpressure
from meshbench.cli import app
from meshbench.engine.base import separate_step
from meshbench.errors import MeshbenchError
from meshbench.records import serial
from meshbench.records.context import Slo
from meshbench.scheduler.budget import AdmissionReason as R
from meshbench.workload import arrivals

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


# --- arrival processes ------------------------------------------------------------------------
def test_specs_parse_and_bad_ones_are_named():
    assert arrivals.parse("all-at-once").all_at_once
    assert arrivals.parse("poisson:0.5").rate == 0.5
    g = arrivals.parse("gamma:2:0.5")
    assert (g.rate, g.cv) == (2.0, 0.5)
    assert arrivals.parse("trace:0,3,3,10").ticks(4, 0) == [0, 3, 3, 10]
    for spec, expect in (
        ("poisson", "rate"),
        ("poisson:x", "not a number"),
        ("poisson:0", "between"),
        ("gamma:1:0", "CV"),
        ("trace:1,-2", "trace tick -2 is not between 0"),
        ("trace:1,x", "no such file"),
        ("uniform:1", "not one of"),
        ("poisson:nan", "finite"),
    ):
        with pytest.raises(MeshbenchError, match=expect):
            arrivals.parse(spec)
    with pytest.raises(MeshbenchError, match="3 ticks for 4 sessions"):
        arrivals.parse("trace:0,1,2").ticks(4, 0)


def test_a_trace_file(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("0\n2\n2\n")
    assert arrivals.parse(f"trace:{p}").ticks(3, 0) == [0, 2, 2]


def test_poisson_and_gamma_ticks_are_seeded_and_have_the_stated_mean():
    p = arrivals.parse("poisson:0.25")
    ticks = p.ticks(4000, seed=3)
    assert ticks == p.ticks(4000, seed=3) and ticks != p.ticks(4000, seed=4)
    assert ticks[0] == 0 and ticks == sorted(ticks)
    mean_gap = ticks[-1] / 3999
    assert abs(mean_gap - 4.0) < 0.2, f"mean gap {mean_gap:.3f} ticks, expected 4 at rate 0.25"
    smooth = np.diff(arrivals.parse("gamma:0.25:0.2").ticks(4000, seed=3))
    bursty = np.diff(arrivals.parse("gamma:0.25:3").ticks(4000, seed=3))
    assert np.std(smooth) < np.std(np.diff(ticks)) < np.std(bursty)


# --- exact timelines ------------------------------------------------------------------------------
def _run(trace, **budget):
    s = f.scheduler(**budget)
    events = []
    reqs = [f.request(f"s{i}", new=8) for i in range(len(trace))]
    recs = s.run_to_completion(
        arrivals=list(zip(trace, reqs)), on_submit=lambda tick, d, *_: events.append((tick, d.session_id, d.reason))
    )
    return s, events, recs


def test_a_burst_larger_than_slots_and_queue():
    s, events, recs = _run([0, 0, 0, 1, 1, 5], max_active_sessions=2, max_batch_size=2, max_queue_depth=1)
    assert events == [
        (0, "s0", R.ADMITTED),
        (0, "s1", R.ADMITTED),
        (0, "s2", R.QUEUED),
        (1, "s3", R.REJECTED_QUEUE_FULL),
        (1, "s4", R.REJECTED_QUEUE_FULL),
        (5, "s5", R.REJECTED_QUEUE_FULL),
    ]
    # s0: prefill at tick 0, seven decodes (ticks 1-7), ends at tick 7; s2 takes its slot then.
    assert recs[0].prefill_sessions == ["s0"] and recs[1].prefill_sessions == ["s1"]
    assert recs[7].completed == ["s0"] and recs[7].admitted == ["s2"]
    assert recs[8].prefill_sessions == ["s2"]
    assert [r.queued for r in recs[:9]] == [1] * 7 + [0, 0]
    assert len(recs) == 16  # s2 prefilled at 8, last token at 15
    assert s.telemetry().rejected_by_reason == {"REJECTED_QUEUE_FULL": 3}


def test_an_idle_gap_between_arrivals_still_ticks():
    s, events, recs = _run([0, 20], max_active_sessions=1, max_batch_size=1)
    assert [(t, r) for t, _, r in events] == [(0, R.ADMITTED), (20, R.ADMITTED)]
    assert recs[7].completed == ["s0"]
    idle = recs[8:20]
    assert all(r.decode_batch == 0 and not r.prefill_sessions and r.active == 0 for r in idle)
    assert recs[20].prefill_sessions == ["s1"] and len(recs) == 28


def test_an_arrival_in_the_tick_a_slot_frees_is_refused_the_next_is_admitted():
    # No queue at all: s1 arrives before tick 7 runs, while s0 still holds the only slot (it frees
    # it at the END of tick 7); s2 arrives before tick 8 and finds the slot free.
    s, events, recs = _run([0, 7, 8], max_active_sessions=1, max_batch_size=1, max_queue_depth=0)
    assert [(t, sid, r) for t, sid, r in events] == [
        (0, "s0", R.ADMITTED),
        (7, "s1", R.REJECTED_QUEUE_FULL),
        (8, "s2", R.ADMITTED),
    ]
    assert recs[7].completed == ["s0"] and recs[8].prefill_sessions == ["s2"]


# --- properties -----------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    trace=st.lists(st.integers(0, 30), min_size=1, max_size=12),
    slots=st.integers(1, 4),
    queue=st.integers(0, 4),
    new=st.integers(1, 5),
    batch=st.integers(1, 4),
)
def test_every_offered_session_ends_one_way_and_bounds_hold(trace, slots, queue, new, batch):
    sched = f.scheduler(max_active_sessions=slots, max_batch_size=min(batch, slots), max_queue_depth=queue)
    decisions = []
    reqs = [f.request(f"s{i}", (1, 2, 3), new) for i in range(len(trace))]
    recs = sched.run_to_completion(arrivals=list(zip(trace, reqs)), on_submit=lambda t, d, *_: decisions.append(d))
    assert all(r.queued <= queue and r.active <= slots for r in recs)
    ended = {s.session_id: s.done_reason.value for s in sched.sessions()}
    rejected = {d.session_id for d in decisions if not d.accepted}
    assert len(decisions) == len(trace) and set(ended) | rejected == {r.session_id for r in reqs}
    assert not set(ended) & rejected
    assert set(ended.values()) <= {"COMPLETED"}
    assert recs[-1].kv_bytes == 0 and sched.engine.kv_bytes_in_use == 0


# --- a sweep of rates, verify, and tampering -----------------------------------------------------
@pytest.fixture(scope="module")
def rate_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bp") / "b"
    r = invoke(
        "sweep",
        "--arrivals",
        "poisson:0.1",
        "--rates",
        "0.1,0.5,2",
        "--levels",
        "2,4",
        "--sessions",
        "12",
        "--max-queue-depth",
        "2",
        "--slo-ttft",
        "6",
        "--out",
        out,
    )
    assert r.exit_code == 0, r.output
    return out


def test_a_rate_sweep_is_corruption_free_against_each_session_alone(rate_bundle):
    data = json.loads((rate_bundle / "results.json").read_text())
    assert data["corruption_free"] and data["reference"]["concurrency"] == 1
    assert len(data["reference"]["sessions"]) == 12
    assert [(lv["rate"], lv["concurrency"]) for lv in data["levels"]] == [
        (0.1, 2),
        (0.1, 4),
        (0.5, 2),
        (0.5, 4),
        (2.0, 2),
        (2.0, 4),
    ]
    assert data["saturation_concurrency"] is None
    full = [lv["backpressure"]["rejected_by_reason"].get("REJECTED_QUEUE_FULL", 0) for lv in data["levels"]]
    assert full[0] == 0 and full[-2] > 0  # no refusal at the lowest rate, refusals at the highest
    for lv in data["levels"]:
        assert lv["budget"]["max_queue_depth"] == 2  # the configured queue, not raised
        b = lv["backpressure"]
        assert b["offered"] == 12 == b["admitted_at_once"] + b["queued"] + sum(b["rejected_by_reason"].values())
        assert b["good_sessions"] <= b["completed"]
    assert invoke("verify", rate_bundle, "--rerun").exit_code == 0


def _tampered(src, tmp_path, edit):
    dst = tmp_path / "t"
    shutil.copytree(src, dst)
    data = json.loads((dst / "results.json").read_text())
    edit(data)
    (dst / "results.json").write_text(json.dumps(data))
    return invoke("verify", dst)


def test_verify_catches_a_tampered_admission_record_and_rejection_count(rate_bundle, tmp_path):
    def admit_a_rejected(d):
        lv = d["levels"][-1]
        e = next(e for e in lv["submit_events"] if e["decision"] == "REJECTED_QUEUE_FULL")
        e["decision"] = "QUEUED"

    r = _tampered(rate_bundle, tmp_path, admit_a_rejected)
    assert (
        r.exit_code == 1 and "levels[5].sessions (= the accepted arrivals, resubmissions and later turns)" in r.stdout
    ), r.stdout

    def fewer_rejections(d):
        d["levels"][-1]["rejected_admissions"] -= 1

    r = _tampered(rate_bundle, tmp_path / "2", fewer_rejections)
    assert r.exit_code == 1 and "levels[5].rejected_admissions (from the submit events)" in r.stdout, r.stdout

    def earlier_arrival(d):
        d["levels"][2]["arrival_times"][3] = 0

    r = _tampered(rate_bundle, tmp_path / "3", earlier_arrival)
    assert r.exit_code == 1 and "levels[2].arrival_times (recomputed" in r.stdout


def test_backpressure_figures_by_hand():
    events = [
        f.submit_event(tick=0, session_id="a", decision="ADMITTED", active=0, queued=0),
        f.submit_event(tick=0, session_id="b", decision="QUEUED", active=1, queued=0),
        f.submit_event(tick=1, session_id="c", decision="REJECTED_QUEUE_FULL", active=1, queued=1, epoch=None),
    ]
    ticks = [
        f.tick_record(tick=0, prefill_sessions=["a"], queued=1),
        f.tick_record(tick=1, decode_sessions=["a"], admitted=["b"]),
        f.tick_record(tick=2, prefill_sessions=["b"]),
        f.tick_record(tick=3, decode_sessions=["b"]),
    ]
    sessions = [f.session_record(session_id="a"), f.session_record(session_id="b")]
    b = backpressure.figures(events, ticks, sessions, Slo(ttft=2))
    assert (b.offered, b.admitted_at_once, b.queued, b.completed) == (3, 1, 1, 2)
    assert b.rejected_by_reason == {"REJECTED_QUEUE_FULL": 1}
    assert b.queue_wait_ticks == {"p50": 1.0, "p95": 1.9, "max": 2.0}  # a: 0, b: admitted for tick 2
    assert b.ttft_ticks["max"] == 3.0  # b arrived at 0, first token at tick 2: 3 ticks counted
    assert b.good_sessions == 1  # b misses the 2-tick TTFT SLO
    assert (b.queue_depth_max, b.queue_depth_mean) == (1, 0.25)
    assert b.goodput_per_100_ticks == 25.0 and b.completed_per_100_ticks == 50.0
    assert b.goodput_per_s is None  # (the wall clock's figures: none on the tick clock)


# --- the wall clock, driven by a clock the test controls -------------------------------------------
class FakeClock:
    """Nanoseconds that move only when the engine works (1 ms a call) or the node sleeps."""

    def __init__(self):
        self.now = 0
        self.slept = []

    def __call__(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += int(seconds * 1e9)


class SlowEngine:
    def __init__(self, inner, clock):
        self.inner, self.clock = inner, clock

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step(self, decode, prefill):  # the tick's call, through this wrapper's own methods
        return separate_step(self, decode, prefill)

    def prefill(self, session, prompt):
        self.clock.now += 1_000_000
        return self.inner.prefill(session, prompt)

    def decode_batch(self, items):
        self.clock.now += 1_000_000
        return self.inner.decode_batch(items)


def test_the_wall_clock_submits_on_arrival_and_sleeps_while_idle():
    from meshbench.sweep.levels import SweepPlan, run_concurrency_sweep
    from meshbench.workload.workload import Workload

    clock = FakeClock()
    wl = Workload((4, 4), (8, 8), 0, "trace:0,50")  # on the wall clock a trace is in ms
    sweep = run_concurrency_sweep(
        SweepPlan([1], wl, f.budget(max_queue_depth=0), wall=True),
        lambda b: SlowEngine(f.engine(), clock),
        clock=clock,
        sleep=clock.sleep,
    )
    lv = serial.to_json(sweep.levels)[0]
    assert lv["arrival_times"] == [0.0, 50.0]
    e0, e1 = lv["submit_events"]
    assert (e0["decision"], e1["decision"]) == ("ADMITTED", "ADMITTED")
    # s0: a prefill and 7 decodes of 1 ms each, done at 8 ms; the node sleeps 42 ms, then submits s1.
    assert clock.slept == [pytest.approx(0.042)]
    assert e1["arrival_ms"] == 50.0 and e1["submit_ms"] == pytest.approx(50.0)
    assert lv["backpressure"]["ttft_from_arrival_ms"]["max"] == pytest.approx(1.0)
    assert sweep.corruption_free and sweep.reference is not None


def test_a_wall_clock_bundle_verifies_and_reruns(tmp_path):
    out = tmp_path / "w"
    r = invoke(
        "sweep",
        "--clock",
        "wall",
        "--arrivals",
        "poisson:2000",
        "--rates",
        "500,8000",
        "--levels",
        "2",
        "--sessions",
        "10",
        "--max-queue-depth",
        "1",
        "--slo-ttft",
        "50",
        "--out",
        out,
    )
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["clock"] == "wall" and data["corruption_free"]
    assert {"goodput_per_s", "queue_wait_ms", "ttft_from_arrival_ms"} <= set(data["levels"][0]["backpressure"])
    assert invoke("verify", out, "--rerun").exit_code == 0
    assert "/s |" in (out / "README.md").read_text()
