"""A history run against a server: its steps one after another, the requests of a step sent at once (one client
each), every request greedy with eos banned and the top-2 log-probabilities per token (each token's margin and
second choice), through the server's prompt cache as it ships (``cache_prompt`` not sent). A request with
``cancel_at`` disconnects once that many tokens are in; its answer is recorded, never judged. A conversation's
client sends each later turn after the answer before it: the conversation so far, ids as the server gave them."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Protocol, TypeVar

from meshbench.endpoint.client import Endpoint
from meshbench.endpoint.stream import Completion as Answer
from meshbench.engine import apis
from meshbench.records import serial
from meshbench.records.completion import Completion
from meshbench.records.history import SERVER_COLD, History, Request
from meshbench.workload import request

PROBS = 2  # top log-probabilities per token: the margin and the second choice
SEED = 0  # the seed every request carries (greedy: it decides nothing, but a server may read it)


def body(r: Request, cache_prompt: bool | None = None) -> dict[str, object]:
    """The native /completion request for ``r`` (``cache_prompt`` sent only where given: False for a cold
    answer)."""
    fields = request.shared_fields(apis.NATIVE.name, True, SEED, cache_prompt)
    return {**fields, "prompt": list(r.prompt), "n_predict": r.new_tokens, **apis.NATIVE.probs(PROBS)}


class Target(Protocol):
    """What a hunt runs against: llama-server over HTTP (``Http``), or meshbench's own node
    (meshbench.hunt.node)."""

    props: dict[str, object] | None  # what the server says of itself: its slots, its context
    how_cold: str  # where its cold answers come from, in words

    def tokenize(self, texts: list[str]) -> list[list[int]]: ...

    def at_once(self, requests: list[Request], cache_prompt: bool | None = None) -> dict[str, Completion]: ...


class Host(Protocol):
    """What runs a target: llama-server (meshbench.hunt.server.Server) or the node
    (meshbench.hunt.node.NodeServer)."""

    @property
    def target(self) -> Target | None: ...  # the one running

    def fresh(self) -> Target: ...  # the same server with nothing cached, where meshbench started it

    def replays_on(self) -> str: ...


def run(target: Target, history: History) -> dict[str, Completion]:
    """Every request's answer, by name."""
    answers: dict[str, Completion] = {}
    for step in history.steps:
        answers.update(target.at_once(list(step.requests)))
    return answers


def joined(r: Request, turns: list[Completion]) -> Completion:
    """A conversation's answer: its turns' answers one after another (their ids, margins, second choices and stamps;
    the prompt ids evaluated and computed, summed); the first failure, or a turn cut short, is the whole answer's
    error (a later turn's prompt holds the earlier answers, so none is sent after it)."""
    if not turns:
        return _failed(r.name, "refused at admission")
    first = turns[0]
    if len(turns) == 1 and not r.turns:
        return first
    error = next((x.error for x in turns if x.error is not None), None)
    asked, last = 1 + len(r.turns), len(turns[-1].tokens)
    if error is None and len(turns) > asked:
        error = f"{len(turns)} turns answered, {asked} asked"
    elif error is None and len(turns) < asked:
        error = (
            f"turn {len(turns)} of {asked} answered {last} of {r.new_tokens} ids"
            if last != r.new_tokens
            else f"turn {len(turns) + 1} of {asked} never ran (refused at admission)"
        )

    evaluated = _summed([x.evaluated for x in turns])
    return dataclasses.replace(
        first,
        tokens=[t for x in turns for t in x.tokens],
        text="".join(x.text for x in turns),
        token_ns=[t for x in turns for t in x.token_ns],
        stop=turns[-1].stop,
        predicted=_summed([x.predicted for x in turns]),
        evaluated=evaluated,
        computed=None if evaluated is None else _summed([x.computed for x in turns]),
        error=error,
        margins=_chained([x.margins for x in turns]),
        runner_up=_chained([x.runner_up for x in turns]),
    )


def _summed(parts: list[int | None]) -> int | None:
    """The turns' counts added up; None where any turn did not say."""
    return None if any(p is None for p in parts) else sum(p or 0 for p in parts)


T = TypeVar("T")


def _chained(parts: list[list[T] | None]) -> list[T] | None:
    """The turns' per-token lists one after another; None where any turn has none."""
    return None if any(p is None for p in parts) else [v for p in parts for v in p or ()]


def _failed(name: str, error: str) -> Completion:
    return Completion(session_id=name, submit_ns=0, tokens=[], text="", token_ns=[], stop=None, predicted=0,
                      evaluated=None, error=error)  # fmt: skip


class Http:
    """llama-server's native API as a hunt's target."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.props = endpoint.props
        self.how_cold = SERVER_COLD

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self.endpoint.tokenize(texts)

    def at_once(self, requests: list[Request], cache_prompt: bool | None = None) -> dict[str, Completion]:
        """The requests sent together, one client thread each; whatever goes wrong is that request's answer."""
        t0 = time.monotonic_ns()
        done: dict[str, Completion] = {}

        def client(r: Request) -> None:
            turns: list[Completion] = []
            ask = r
            for message in (*r.turns, None):
                try:
                    x = self.endpoint.complete(r.name, body(ask, cache_prompt), t0, r.cancel_at)
                except Exception as e:  # noqa: BLE001 - whatever went wrong is this request's, never its neighbours'
                    x = Answer(r.name, time.monotonic_ns() - t0, error=f"{type(e).__name__}: {e}")
                turns.append(serial.completion(x.to_dict()))
                if message is None or x.error is not None or len(x.tokens) != r.new_tokens:
                    break
                ask = dataclasses.replace(r, prompt=(*ask.prompt, *x.tokens, *message), turns=())
            done[r.name] = joined(r, turns)

        threads = [threading.Thread(target=client, args=(r,), daemon=True) for r in requests]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {r.name: done[r.name] for r in requests}
