"""Property-based invariants of the scheduler (hypothesis).

CI runs a modest number of examples; a larger run is documented in README.md:
    HYPOTHESIS_PROFILE=thorough python -m pytest -q tests/test_properties.py
"""

import functools
import os

import factories as f
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshbench.scheduler.session import DoneReason, GenerationRequest

settings.register_profile("ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

BPT = 1536


@functools.lru_cache(maxsize=None)
def serial_reference(prompt: tuple, new: int) -> tuple:
    return tuple(f.reference_tokens(GenerationRequest("ref", prompt, new)))


sessions_st = st.lists(
    st.tuples(
        st.lists(st.integers(0, 255), min_size=1, max_size=6).map(tuple),  # prompt
        st.integers(1, 6),  # new tokens
        st.integers(0, 6),  # arrival tick
    ),
    min_size=1,
    max_size=8,
)


def check_prompt_pieces(rec, written: dict, prompts: dict, budget: int, policy: str) -> None:
    """Prompt positions are written in order, each piece where the last ended (or at 0: a new session);
    a session's first token comes exactly when its prompt is complete; chunked fills the budget
    before it splits a prompt and never exceeds it; whole never splits one."""
    for sid, start, n in rec.prefill_chunks:
        assert start in (0, written.get(sid, 0)) and n >= 1 and start + n <= prompts[sid], (sid, start, n)
        written[sid] = start + n
        assert policy == "chunked" or (start == 0 and n == prompts[sid])
    assert all(written[sid] == prompts[sid] for sid in rec.prefill_sessions)
    if policy == "chunked":
        assert rec.prefill_tokens <= budget
        if rec.prefill_chunks:
            sid, start, n = rec.prefill_chunks[-1]
            assert start + n == prompts[sid] or rec.prefill_tokens == budget  # split only at a full budget


@given(
    sessions=sessions_st,
    active=st.integers(1, 4),
    batch_frac=st.floats(0.01, 1.0),
    queue=st.integers(0, 4),
    prefill=st.integers(1, 8),
    kv_tokens=st.integers(12, 40),
    cancel_at=st.one_of(st.none(), st.tuples(st.integers(0, 7), st.integers(0, 8))),
    policy=st.sampled_from(["whole", "chunked"]),
)
def test_scheduler_invariants(sessions, active, batch_frac, queue, prefill, kv_tokens, cancel_at, policy):
    batch = max(1, round(active * batch_frac))
    kv_budget = kv_tokens * BPT
    e = f.engine(kv_bytes=kv_budget)
    s = f.scheduler(
        e,
        kv_bytes=kv_budget,
        max_active_sessions=active,
        max_batch_size=batch,
        max_queue_depth=queue,
        max_prefill_tokens_per_tick=prefill,
        prefill_policy=policy,
    )
    requests = [GenerationRequest(f"s{i}", p, n) for i, (p, n, _) in enumerate(sessions)]
    arrivals = {i: a for i, (_, _, a) in enumerate(sessions)}
    accepted = set()
    written: dict[str, int] = {}  # prompt positions written per session, piece after piece
    tick = 0
    while tick <= 6 or s.has_work():
        for i, r in enumerate(requests):
            if arrivals[i] == tick and s.submit(r).accepted:
                accepted.add(r.session_id)
        if cancel_at is not None and cancel_at[1] == tick:
            s.cancel(f"s{cancel_at[0]}")
        rec = s.run_tick()
        assert rec.kv_bytes <= kv_budget, (rec.tick, rec.kv_bytes, kv_budget)
        assert rec.queued <= queue
        assert rec.active <= active
        assert rec.decode_batch <= batch
        check_prompt_pieces(rec, written, {r.session_id: len(r.prompt_tokens) for r in requests}, prefill, policy)
        # Equal unless KV pressure evicted a session the scheduler has not yet seen miss.
        assert rec.kv_bytes <= rec.stored_tokens * BPT
        if e.kv.evictions == 0:
            assert rec.kv_bytes == rec.stored_tokens * BPT
        tick += 1
        assert tick < 500, "the scheduler did not finish"
    ended = s.sessions()
    assert {x.session_id for x in ended} == accepted
    assert all(x.done_reason is not None for x in ended)  # each ended exactly once (finish() asserts)
    for x in ended:
        if x.done_reason is DoneReason.COMPLETED:
            assert tuple(x.tokens) == serial_reference(x.request.prompt_tokens, x.request.max_new_tokens)
        else:  # a session cut short keeps a prefix of the serial reference: never another session's tokens
            ref = serial_reference(x.request.prompt_tokens, x.request.max_new_tokens)
            assert tuple(x.tokens) == ref[: len(x.tokens)]
    ticks = s.ticks()
    t = s.telemetry()
    decode_ticks = [r for r in ticks if r.decode_batch]
    assert sum(r.decode_tokens for r in ticks) == t.decode_tokens
    assert sum(r.prefill_tokens for r in ticks) == t.prefill_tokens
    assert sum(len(x.tokens) for x in ended) == t.decode_tokens + sum(len(r.prefill_sessions) for r in ticks)
    if t.cache_misses == 0:
        assert round(t.batch_occupancy_avg * len(decode_ticks)) == t.decode_tokens
    assert e.kv_bytes_in_use == 0 and t.kv_bytes == 0
    assert t.completed + t.cancelled + t.failed + t.cache_misses == len(accepted)
