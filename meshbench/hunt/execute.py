"""A history run against a server: its steps one after another, the requests of a step sent at once (one client
each), every request greedy with eos banned and the top-2 log-probabilities per token (each token's margin and
second choice), through the server's prompt cache as it ships (``cache_prompt`` not sent). A request with
``cancel_at`` disconnects once that many tokens are in; its answer is recorded, never judged."""

from __future__ import annotations

import threading
import time
from typing import Protocol

from meshbench.endpoint.client import Endpoint
from meshbench.endpoint.stream import Completion as Answer
from meshbench.records import serial
from meshbench.records.completion import Completion
from meshbench.records.history import History, Request
from meshbench.workload import request

PROBS = 2  # top log-probabilities per token: the margin and the second choice
SEED = 0  # the seed every request carries (greedy: it decides nothing, but a server may read it)


def body(r: Request, cache_prompt: bool | None = None) -> dict[str, object]:
    """The native /completion request for ``r`` (``cache_prompt`` sent only where given: False for a cold
    answer)."""
    fields = request.shared_fields("native", True, SEED, cache_prompt)
    return {**fields, "prompt": list(r.prompt), "n_predict": r.new_tokens, **request.logprobs("native", PROBS)}


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

    target: Target | None  # the one running

    def fresh(self) -> Target: ...  # the same server with nothing cached, where meshbench started it

    def replays_on(self) -> str: ...


def run(target: Target, history: History) -> dict[str, Completion]:
    """Every request's answer, by name."""
    answers: dict[str, Completion] = {}
    for step in history.steps:
        answers.update(target.at_once(list(step.requests)))
    return answers


class Http:
    """llama-server's native API as a hunt's target."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.props = endpoint.props
        self.how_cold = "cache_prompt false on the idle server"

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self.endpoint.tokenize(texts)

    def at_once(self, requests: list[Request], cache_prompt: bool | None = None) -> dict[str, Completion]:
        """The requests sent together, one client thread each; whatever goes wrong is that request's answer."""
        t0 = time.monotonic_ns()
        done: dict[str, Completion] = {}

        def client(r: Request) -> None:
            try:
                x = self.endpoint.complete(r.name, body(r, cache_prompt), t0, r.cancel_at)
            except Exception as e:  # noqa: BLE001 - whatever went wrong is this request's, never its neighbours'
                x = Answer(r.name, time.monotonic_ns() - t0, error=f"{type(e).__name__}: {e}")
            done[r.name] = serial.completion(x.to_dict())

        threads = [threading.Thread(target=client, args=(r,), daemon=True) for r in requests]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {r.name: done[r.name] for r in requests}
