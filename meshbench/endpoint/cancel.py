"""One level's cancel-and-retry run (meshbench.analysis.cancel): the first C sessions at once (the reference),
then again with every second session's client disconnecting at a token and sending its request again at once.
Every request asks for the top-2 log-probabilities (the margins the verdict classifies by) and is otherwise as
the sweep sends it: the server's prompt cache as its users run it. Native API only (token ids)."""

from __future__ import annotations

import threading
import time

from meshbench.analysis import cancel as judge
from meshbench.endpoint.client import Completion as Answer
from meshbench.endpoint.client import Endpoint
from meshbench.endpoint.load import Job, at_once
from meshbench.records import serial
from meshbench.records.cancel import CancelRun
from meshbench.records.completion import Completion

PROBS = 2  # top log-probabilities asked for per token


def cancel_run(
    endpoint: Endpoint,
    jobs: list[Job],
    c: int,
    at: int,
    cold: dict[str, Completion],
    seen: dict[str, set[tuple[int, ...]]],
    threshold: float,
    sampled: bool = False,
) -> CancelRun:
    """The level's run: the first C sessions, every second one cut at token ``at`` (meshbench.analysis.cancel.
    runs_at says where there is one)."""
    batch = [Job(j.session_id, {**j.body, "n_probs": PROBS}) for j in jobs[:c]]
    cut_ids = judge.cancelled([j.session_id for j in batch])
    reference = [_record(x) for x in at_once(endpoint, batch)]
    cut, answers = _with_cancels(endpoint, batch, set(cut_ids), at)
    return CancelRun(
        sessions=[j.session_id for j in batch],
        cancelled=cut_ids,
        at_token=at,
        reference=reference,
        cut=cut,
        answers=answers,
        verdict=judge.verdict(c, cut, reference, answers, cold, seen, threshold, sampled),
    )


def _with_cancels(
    endpoint: Endpoint, batch: list[Job], cut_ids: set[str], at: int
) -> tuple[list[Completion], list[Completion]]:
    """Every job at once, one client each; a cancelled one disconnects at ``at`` tokens and sends its request
    again. The cut attempts (in session order) and every session's final answer (in session order)."""
    t0 = time.monotonic_ns()
    cut: dict[int, Answer] = {}
    done: dict[int, Answer] = {}

    def client(i: int, job: Job) -> None:
        if job.session_id in cut_ids:
            cut[i] = _safely(endpoint, job, t0, at)
        done[i] = _safely(endpoint, job, t0, None)

    threads = [threading.Thread(target=client, args=(i, j), daemon=True) for i, j in enumerate(batch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [_record(cut[i]) for i in sorted(cut)], [_record(done[i]) for i in range(len(batch))]


def _safely(endpoint: Endpoint, job: Job, t0: int, cancel_after: int | None) -> Answer:
    try:
        return endpoint.complete(job.session_id, job.body, t0, cancel_after)
    except Exception as e:  # noqa: BLE001 - whatever went wrong is this session's, never its neighbours'
        return Answer(job.session_id, time.monotonic_ns() - t0, error=f"{type(e).__name__}: {e}")


def _record(x: Answer) -> Completion:
    return serial.completion(x.to_dict())
