"""The scheduler, by the intent of each DGR-012 test, plus cancellation and eviction."""

import itertools

import factories as f
import pytest

from meshbench.engine.base import separate_step
from meshbench.errors import MeshbenchError
from meshbench.records.model import Resubmission
from meshbench.scheduler.budget import AdmissionReason as R
from meshbench.scheduler.session import DoneReason

BPT = 1536


class RecordingEngine:
    """Wraps an engine and logs every call, to assert the order of work in a tick, and every
    session's decode positions."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = []
        self.chunks = []
        self.positions = {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def prefill(self, session, prompt):
        self.calls.append(("prefill", session.session_id))
        self.chunks.append((session.session_id, 0, len(prompt), True))
        return self.inner.prefill(session, prompt)

    def prefill_chunk(self, chunk):
        self.calls.append(("prefill", chunk.session.session_id))
        self.chunks.append((chunk.session.session_id, chunk.start, len(chunk.tokens), chunk.last))
        return self.inner.prefill_chunk(chunk)

    def step(self, decode, prefill):
        self.calls.append(("step", len(decode), len(prefill)))
        return separate_step(self, decode, prefill)  # the calls inside it go through this wrapper

    def decode_batch(self, items):
        self.calls.append(("decode", tuple(it.session_id for it in items)))
        for it in items:
            self.positions.setdefault(it.session_id, []).append(it.position)
        return self.inner.decode_batch(items)

    def release(self, sid):
        self.calls.append(("release", sid))
        return self.inner.release(sid)


# --- admission ------------------------------------------------------------------------
def test_admission_respects_active_slots_then_queue_then_refuses_a_full_queue():
    s = f.scheduler(max_active_sessions=2, max_batch_size=2, max_queue_depth=1)
    reasons = [s.submit(f.request(sid)).reason for sid in "abcd"]
    assert reasons == [R.ADMITTED, R.ADMITTED, R.QUEUED, R.REJECTED_QUEUE_FULL]
    t = s.telemetry()
    assert (t.active_sessions, t.queue_depth, t.rejected_admissions) == (2, 1, 1)
    assert t.rejected_by_reason == {"REJECTED_QUEUE_FULL": 1}
    assert [x.session_id for x in s.sessions()] == ["a", "b", "c"]  # the refusal left no trace


def test_admission_rejects_a_session_that_cannot_fit_the_kv_budget():
    s = f.scheduler(kv_bytes=11 * BPT)  # 4 + 8 = 12 tokens needed
    d = s.submit(f.request("a"))
    assert d.reason is R.REJECTED_KV_BUDGET
    assert (d.kv_needed_bytes, d.kv_budget_bytes) == (12 * BPT, 11 * BPT)
    assert s.submit(f.request("b", new=7)).reason is R.ADMITTED  # 11 tokens fit exactly


def test_admission_rejects_when_per_session_scratch_exceeds_budget():
    e = f.engine()
    s = f.scheduler(e, scratch_bytes=e.scratch_bytes_per_session - 1)
    d = s.submit(f.request("a"))
    assert d.reason is R.REJECTED_SCRATCH_BUDGET
    assert d.scratch_needed_bytes == e.scratch_bytes_per_session
    assert s.telemetry().active_sessions == 0


def test_scratch_envelope_caps_active_sessions():
    e = f.engine()
    s = f.scheduler(e, scratch_bytes=3 * e.scratch_bytes_per_session, max_active_sessions=8, max_batch_size=2)
    assert s.sched.active_cap == 3
    assert [s.submit(f.request(x)).reason for x in "abcd"] == [R.ADMITTED] * 3 + [R.QUEUED]


def test_duplicate_submission_is_rejected_while_live_and_allowed_after():
    s = f.scheduler()
    assert s.submit(f.request("a", new=1)).reason is R.ADMITTED
    assert s.submit(f.request("a")).reason is R.REJECTED_DUPLICATE
    s.run_to_completion()
    assert s.submit(f.request("a", new=1)).reason is R.ADMITTED  # finished: a new epoch
    s.run_to_completion()
    assert [(x.epoch, x.done_reason) for x in s.sessions()] == [(1, DoneReason.COMPLETED), (2, DoneReason.COMPLETED)]
    assert s.telemetry().completed == 2  # the first epoch is still counted


def test_weight_budget_is_reported_in_telemetry():
    e = f.engine()
    s = f.scheduler(e, weight_bytes=12345678)
    t = s.telemetry()
    assert t.weight_bytes == e.weight_bytes == f.weights()[1].nbytes
    assert t.weight_budget_bytes == 12345678


@pytest.mark.parametrize(
    "field,value",
    [
        ("kv_bytes", 0),
        ("scratch_bytes", -1),
        ("max_active_sessions", 0),
        ("max_batch_size", 0),
        ("max_prefill_tokens_per_tick", 0),
        ("max_queue_depth", -1),
        ("max_batch_size", 9),
    ],
)
def test_invalid_budget_is_refused_naming_the_field(field, value):
    with pytest.raises(MeshbenchError, match=field):
        f.budget(**{field: value})


# --- batching ---------------------------------------------------------------------------
def test_batched_decode_preserves_per_session_positions_and_outputs():
    prompts = {"a": (1, 2, 3, 4), "b": (9, 8, 7, 6), "c": (100, 50, 25, 12), "d": (5, 5, 5, 5)}
    refs = {sid: f.reference_tokens(f.request(sid, p)) for sid, p in prompts.items()}
    assert len({tuple(v) for v in refs.values()}) == 4
    s = f.scheduler(max_active_sessions=4, max_batch_size=4, max_prefill_tokens_per_tick=16)
    for sid, p in prompts.items():
        s.submit(f.request(sid, p))
    s.run_to_completion()
    assert {x.session_id: x.tokens for x in s.sessions()} == refs
    assert s.telemetry().batch_occupancy_max == 4


def test_positions_are_isolated_across_different_prompt_lengths():
    reqs = [f.request(f"p{n}", tuple(range(1, n + 1)), 6) for n in (1, 3, 7)]
    refs = {r.session_id: f.reference_tokens(r) for r in reqs}
    e = RecordingEngine(f.engine())
    s = f.scheduler(e, max_prefill_tokens_per_tick=64)
    for r in reqs:
        s.submit(r)
    s.run_to_completion()
    assert {x.session_id: x.tokens for x in s.sessions()} == refs
    # One prefill each in the first tick, then five decodes each, every one at its own next position.
    assert e.calls[:4] == [("step", 0, 3), ("prefill", "p1"), ("prefill", "p3"), ("prefill", "p7")]
    assert e.positions == {"p1": [1, 2, 3, 4, 5], "p3": [3, 4, 5, 6, 7], "p7": [7, 8, 9, 10, 11]}


def test_prefill_does_not_starve_in_flight_decode():
    s = f.scheduler(max_prefill_tokens_per_tick=4)
    s.submit(f.request("inflight", new=8))
    s.run_tick()  # prefilled
    for sid in "wxyz":
        s.submit(f.request(sid, new=2))
    for _ in range(4):
        rec = s.run_tick()
        assert "inflight" in rec.decode_sessions
        assert len(rec.prefill_sessions) == 1 and rec.prefill_tokens == 4


def test_decode_first_policy_is_explicit_in_a_single_tick():
    e = RecordingEngine(f.engine())
    s = f.scheduler(e)
    s.submit(f.request("a"))
    s.run_tick()
    s.submit(f.request("b"))
    e.calls.clear()
    s.run_tick()
    assert e.calls == [("step", 1, 1), ("decode", ("a",)), ("prefill", "b")]  # one call, decode first


def test_prefill_budget_is_fifo_and_stops_at_the_first_that_does_not_fit():
    s = f.scheduler(max_prefill_tokens_per_tick=6)
    s.submit(f.request("big", tuple(range(10)), 2))  # first of a tick always runs
    s.submit(f.request("small1", (1, 2), 2))
    s.submit(f.request("small2", (1, 2), 2))
    assert s.run_tick().prefill_sessions == ["big"]  # 10 > 6 but first; then 12 > 6 stops
    assert s.run_tick().prefill_sessions == ["small1", "small2"]  # 2 + 2 <= 6


def test_more_decoders_than_batch_slots_rotate_least_recently_decoded_first():
    s = f.scheduler(max_active_sessions=3, max_batch_size=2, max_prefill_tokens_per_tick=12)
    for sid in "abc":
        s.submit(f.request(sid, new=5))
    assert s.run_tick().prefill_sessions == ["a", "b", "c"]
    batches = [tuple(s.run_tick().decode_sessions) for _ in range(4)]
    assert batches == [("a", "b"), ("a", "c"), ("b", "c"), ("a", "b")]  # each decodes 3 of 4 ticks


def test_exact_schedule_of_a_small_workload():
    s = f.scheduler(max_active_sessions=2, max_batch_size=2, max_prefill_tokens_per_tick=4)
    s.submit(f.request("a", new=3))
    s.submit(f.request("b", new=2))
    s.submit(f.request("c", new=1))
    recs = s.run_to_completion()
    got = [(tuple(r.decode_sessions), tuple(r.prefill_sessions), tuple(r.completed)) for r in recs]
    assert got == [
        ((), ("a",), ()),
        (("a",), ("b",), ()),
        (("a", "b"), (), ("a", "b")),
        ((), ("c",), ("c",)),
    ]
    assert [r.kv_bytes for r in recs] == [4 * BPT, 9 * BPT, 0, 0]


# --- backpressure and bounded memory -----------------------------------------------------
def test_backpressure_signals_when_queue_full_then_recovers():
    s = f.scheduler(max_active_sessions=1, max_batch_size=1, max_queue_depth=1)
    assert s.submit(f.request("a", new=2)).reason is R.ADMITTED
    assert s.submit(f.request("b", new=2)).reason is R.QUEUED
    assert s.submit(f.request("c", new=2)).reason is R.REJECTED_QUEUE_FULL
    s.run_tick()
    s.run_tick()  # a completes; b takes the slot from the next tick
    assert s.submit(f.request("c", new=2)).reason is R.QUEUED
    s.run_to_completion()
    t = s.telemetry()
    assert (t.completed, t.rejected_admissions, t.queue_depth) == (3, 1, 0)


def test_completed_sessions_release_kv_so_growth_is_bounded():
    e = f.engine()
    s = f.scheduler(e)
    for sid in "abcd":
        s.submit(f.request(sid))
    recs = s.run_to_completion()
    assert max(r.kv_bytes for r in recs) > 0
    assert e.kv_bytes_in_use == 0 and s.telemetry().kv_bytes == 0
    assert all(r.kv_bytes == r.stored_tokens * BPT for r in recs)


def test_cancel_frees_kv_and_slot_at_once():
    e = f.engine()
    s = f.scheduler(e, max_active_sessions=1, max_batch_size=1)
    s.submit(f.request("a"))
    s.submit(f.request("b"))
    s.run_tick()
    s.run_tick()
    assert e.kv.contains("a", 1) and e.kv_bytes_in_use == 5 * BPT
    r = s.cancel("a")
    assert r.cancelled and not e.kv.contains("a", 1) and e.kv_bytes_in_use == 0
    assert s.telemetry().active_sessions == 1  # b took the slot
    assert s.cancel("a").detail == "already finished: CANCELLED"
    assert not s.cancel("nobody").cancelled
    s.run_to_completion()
    t = s.telemetry()
    assert (t.cancelled, t.completed, t.kv_bytes) == (1, 1, 0)


def test_a_session_evicted_by_kv_pressure_ends_as_cache_miss_without_touching_others():
    # Each session alone fits (12 tokens); two together cannot (the KV budget holds 16).
    e = f.engine(kv_bytes=16 * BPT)
    s = f.scheduler(e, kv_bytes=16 * BPT, max_active_sessions=2, max_batch_size=2)
    s.submit(f.request("a", (1, 2, 3, 4), 8))
    s.submit(f.request("b", (9, 8, 7, 6), 8))
    recs = s.run_to_completion()
    by_id = {x.session_id: x for x in s.sessions()}
    reasons = {sid: x.done_reason for sid, x in by_id.items()}
    assert sorted(reasons.values()) == [DoneReason.CACHE_MISS, DoneReason.COMPLETED]
    survivor = next(sid for sid, r in reasons.items() if r is DoneReason.COMPLETED)
    assert by_id[survivor].tokens == f.reference_tokens(by_id[survivor].request)
    assert all(r.kv_bytes <= 16 * BPT for r in recs)
    assert s.telemetry().cache_misses == 1 and e.kv_bytes_in_use == 0


# --- telemetry -----------------------------------------------------------------------------
def test_telemetry_reports_every_required_signal_with_deterministic_rates():
    clock = itertools.count(0, 1_000_000).__next__  # each clock read advances 1 ms
    s = f.scheduler(clock=clock)
    for sid in "ab":
        s.submit(f.request(sid, new=3))
    s.run_to_completion()
    d = s.telemetry().to_dict()
    required = {
        "active_sessions",
        "queue_depth",
        "batch_occupancy_last",
        "batch_occupancy_avg",
        "batch_occupancy_max",
        "kv_bytes",
        "kv_budget_bytes",
        "kv_pressure",
        "scratch_bytes",
        "scratch_pressure",
        "weight_bytes",
        "prefill_tokens",
        "decode_tokens",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "ticks",
        "rejected_admissions",
        "rejected_by_reason",
        "cache_misses",
        "completed",
        "cancelled",
        "failed",
    }
    assert required <= set(d)
    assert (d["prefill_tokens"], d["decode_tokens"], d["ticks"], d["completed"]) == (8, 4, 4, 2)
    again = f.scheduler(clock=itertools.count(0, 1_000_000).__next__)
    for sid in "ab":
        again.submit(f.request(sid, new=3))
    again.run_to_completion()
    assert again.telemetry().to_dict() == d  # rates come from the injected clock alone
    assert d["prefill_tokens_per_s"] > 0 and d["decode_tokens_per_s"] > 0
    import json

    json.dumps(d)


# --- guards ------------------------------------------------------------------------------------
def test_the_synthetic_engine_requires_a_full_shard():
    from meshbench.engine.synthetic import SyntheticEngine

    cfg, w = f.weights()
    with pytest.raises(MeshbenchError, match="partial shard"):
        SyntheticEngine(cfg, w, 1 << 20, layer_range=(0, 2))
    SyntheticEngine(cfg, w, 1 << 20, layer_range=(0, 3))


def test_run_to_completion_is_bounded_when_work_never_ends():
    s = f.scheduler()
    s.submit(f.request("a", new=4))  # pending work: 4 prompt positions and 4 tokens, so at most 9 ticks
    arrivals = itertools.count()

    def client_that_never_stops(rec):
        s.submit(f.request(f"x{next(arrivals)}", new=4))

    with pytest.raises(MeshbenchError, match="did not finish within 9 ticks"):
        s.run_to_completion(on_tick=client_that_never_stops)
    assert len(s.ticks()) == 9


def test_run_to_completion_stops_at_max_ticks():
    s = f.scheduler()
    s.submit(f.request("a", new=4))
    with pytest.raises(MeshbenchError, match="did not finish within 2 ticks"):
        s.run_to_completion(max_ticks=2)
    assert len(s.ticks()) == 2 and s.has_work()


# --- the scheduler alone: it decides, it never calls an engine ---------------------------------
def _bare(**overrides):
    from meshbench.engine.base import EngineFigures
    from meshbench.scheduler.scheduler import ContinuousBatchScheduler

    return ContinuousBatchScheduler(
        EngineFigures(kv_bytes_per_token=BPT, weight_bytes=1, scratch_bytes_per_session=1), f.budget(**overrides)
    )


def _answer(plan, token=7):
    """What an engine would answer to ``plan``: a token per decode item and per prompt's last chunk."""
    from meshbench.engine.base import StepResult, TickResult

    return TickResult(
        [StepResult(it.session_id, token, 1.0) for it in plan.feed],
        [StepResult(c.session.session_id, token if c.last else None, 1.0) for c in plan.chunks],
    )


def test_the_scheduler_plans_a_tick_and_applies_an_answer_without_any_engine():
    s = _bare(max_active_sessions=2, max_batch_size=2, max_prefill_tokens_per_tick=4)
    for sid in "abc":
        s.submit(f.request(sid, new=2))
    plan = s.schedule()  # tick 0: a's whole 4-token prompt fits the prefill budget, b's waits
    assert (plan.tick, plan.decode, [c.session.session_id for c in plan.chunks]) == (0, [], ["a"])
    assert s.apply(plan, _answer(plan)) == []  # nothing ended: nothing to release
    rec = s.record(plan, kv_bytes=4 * BPT)
    assert rec.prefill_sessions == ["a"] and rec.kv_bytes == 4 * BPT and rec.stored_tokens == 4
    plan = s.schedule()  # tick 1: a decodes its last token, b prefills
    assert [it.session_id for it in plan.feed] == ["a"] and plan.feed[0].position == 4
    assert [c.session.session_id for c in plan.chunks] == ["b"]
    assert s.apply(plan, _answer(plan)) == ["a"]  # a completed: the driver must release its KV
    rec = s.record(plan, kv_bytes=4 * BPT)
    assert rec.completed == ["a"] and rec.admitted == ["c"]
    assert s.session("a").tokens == [7, 7]


def test_a_lost_engine_fails_its_sessions_and_the_resubmission_starts_a_new_epoch():
    s = _bare()
    s.submit(f.request("a", new=3))
    plan = s.schedule()
    s.apply(plan, _answer(plan))
    s.record(plan, 0)
    plan = s.schedule()
    lost = s.engine_lost(plan, "engine lost: SIGKILL")
    assert [x.session_id for x in lost] == ["a"] and s.take_releases() == ["a"]
    s.resubmit(lost)
    assert s.apply(plan, None) == []
    rec = s.record(plan, 0)
    assert rec.ended == ["a"] and rec.resubmitted == ["a"] and s.session("a").epoch == 2
    assert s.losses()[0].resubmitted == [Resubmission(session_id="a", epoch=2, decision="ADMITTED")]
    assert s.telemetry(kv_bytes=0).failed_by_cause == {"engine lost: SIGKILL": 1}
