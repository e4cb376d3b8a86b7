"""Load on an endpoint: C closed-loop clients, each taking the next session as soon as its last answer is in (a
conversation's turns one after another, each as soon as the one before it is answered).

Every request goes through ``Endpoint.complete`` with one shared start (``t0``), so each completion's
stamps are on one clock; a failed session is recorded as such and the level goes on.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Sequence

from meshbench.analysis import conversation as talk
from meshbench.endpoint import conversation
from meshbench.endpoint.client import Completion, Endpoint
from meshbench.errors import MeshbenchError
from meshbench.records import serial
from meshbench.records.completion import CANCELLED


@dataclass(frozen=True, slots=True)
class Job:
    """One session's request: its id and the API body the endpoint is sent (a conversation's first turn, and its
    later ``turns``)."""

    session_id: str
    body: dict
    turns: conversation.Turns | None = None


def closed_loop(
    endpoint: Endpoint, jobs: Sequence[Job], clients: int, t0: int | None = None
) -> tuple[list[Completion], float]:
    """Run ``jobs`` in order on ``clients`` closed-loop clients. Returns the completions (in job order, each
    conversation's turns in order) and the wall time from the first submission to the last answer. Every stamp
    is in ns from ``t0`` (default: now, on the monotonic clock), so a caller that gives it can hold the stamps to
    another clock's."""
    todo: queue.Queue = queue.Queue()
    for i, job in enumerate(jobs):
        todo.put((i, job))
    done: list[list[Completion] | None] = [None] * len(jobs)
    t0 = time.monotonic_ns() if t0 is None else t0

    def client() -> None:
        while True:
            try:
                i, job = todo.get_nowait()
            except queue.Empty:
                return
            done[i] = _attempt(endpoint, job, t0)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    return _joined(threads, done, t0)


def open_loop(
    endpoint: Endpoint, jobs: Sequence[Job], arrival_s: Sequence[float], t0: int | None = None
) -> tuple[list[Completion], float]:
    """Each job submitted at its arrival time (s from the pass's start, ``t0``: default now) by a client started
    then, whatever is still in flight: the server's queue decides when each is served (one client per session
    in flight, none waiting on another). Returns the completions (in job order) and the wall time to the last
    answer."""
    done: list[list[Completion] | None] = [None] * len(jobs)
    t0 = time.monotonic_ns() if t0 is None else t0
    threads: list[threading.Thread] = []
    for i in sorted(range(len(jobs)), key=lambda k: arrival_s[k]):
        due = t0 + int(arrival_s[i] * 1e9)
        while (wait_ns := due - time.monotonic_ns()) > 0:  # (never before its arrival: verify holds it to that)
            time.sleep(wait_ns / 1e9)
        t = threading.Thread(target=_into, args=(done, i, endpoint, jobs[i], t0), daemon=True)
        try:
            t.start()
        except RuntimeError as e:
            raise MeshbenchError(
                f"open loop: cannot start a client for {jobs[i].session_id} with {len(threads)} in flight ({e}): "
                "a lower rate or fewer sessions"
            ) from None
        threads.append(t)
    return _joined(threads, done, t0)


def _into(done: list[list[Completion] | None], i: int, endpoint: Endpoint, job: Job, t0: int) -> None:
    done[i] = _attempt(endpoint, job, t0)


def _attempt(endpoint: Endpoint, job: Job, t0: int) -> list[Completion]:
    """A session's request, and a conversation's later turns, each sent once the one before it is answered (none
    after a failed or cut turn; a turn that cannot be sent as generated is recorded failed, and ends it)."""
    answers = [_one(endpoint, job.session_id, job.body, t0)]
    if job.turns is None:
        return answers
    body = job.body
    for turn, (ids, text) in enumerate(zip(job.turns.ids, job.turns.texts), start=2):
        last = answers[-1]
        if last.error is not None or last.stop == CANCELLED:
            break
        why = talk.unsendable(endpoint.api, serial.completion(last.to_dict()))
        if why is not None:
            answers.append(Completion(job.session_id, time.monotonic_ns() - t0, error=why, turn=turn))
            break
        body = conversation.follow(endpoint.api, body, last, ids, text)
        answers.append(_one(endpoint, job.session_id, body, t0))
        answers[-1].turn = turn
    return answers


def _one(endpoint: Endpoint, session_id: str, body: dict, t0: int) -> Completion:
    """One request; whatever goes wrong is this session's failure, never its neighbours'."""
    try:
        return endpoint.complete(session_id, body, t0)
    except Exception as e:  # noqa: BLE001 - whatever went wrong is this session's, never its neighbours'
        return Completion(session_id, time.monotonic_ns() - t0, error=f"{type(e).__name__}: {e}")


def _joined(
    threads: list[threading.Thread], done: list[list[Completion] | None], t0: int
) -> tuple[list[Completion], float]:
    for t in threads:
        t.join()
    wall_s = (time.monotonic_ns() - t0) / 1e9
    assert all(c is not None for c in done), "a client thread ended with sessions unanswered"
    return [c for answers in done if answers is not None for c in answers], wall_s


def at_once(endpoint: Endpoint, jobs: Sequence[Job]) -> list[Completion]:
    """Every job submitted together, one client each (the needle's batch)."""
    return closed_loop(endpoint, jobs, len(jobs))[0]
