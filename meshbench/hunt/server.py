"""The server a hunt runs against: a ``--target`` URL (one process: a replay runs on it as it is, with whatever
it holds), or llama-server started by meshbench (``--serve llama-server``), where a replay runs on a fresh
process of it with nothing cached. Either is stopped, where meshbench started it, by the code that started it."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Sequence

from meshbench.endpoint import llama_server
from meshbench.endpoint.client import Endpoint
from meshbench.engine import apis
from meshbench.errors import MeshbenchError
from meshbench.hunt.execute import Http, Target
from meshbench.records.history import SERVER_FRESH, SERVER_SAME
from meshbench.workload.target import parse_target

DEADLINE_S = 120.0  # one request's answer, at most


class Server:
    """One server process at a time: ``endpoint`` is the one running; ``fresh`` replaces it with a new process
    where meshbench started it (else it is the same)."""

    def __init__(self, url: str | None, binary: Path | None, model: str | None, args: Sequence[str] = ()) -> None:
        self.url, self.binary, self.model, self.args = url, binary, model, list(args)
        self.launched = binary is not None
        self._stack: contextlib.ExitStack | None = None
        self.target: Target | None = None
        self.props: dict[str, object] | None = None
        self.restarts = 0

    def __enter__(self) -> Server:
        self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def fresh(self) -> Target:
        """A server with nothing cached: a new process where meshbench started it, else the same one."""
        if self.launched:
            self.__exit__()
            self._start()
            self.restarts += 1
        assert self.target is not None
        return self.target

    def replays_on(self) -> str:
        return SERVER_FRESH if self.launched else SERVER_SAME

    def _start(self) -> None:
        url = self.url
        if self.launched:
            assert self.binary is not None and self.model is not None
            self._stack = contextlib.ExitStack()
            url = self._stack.enter_context(llama_server.serving(self.binary, self.model, self.args))
        assert url is not None
        ep = Endpoint(parse_target(url), apis.AUTO, DEADLINE_S)
        info = ep.probe()
        if not apis.of(ep.api).ids:
            raise MeshbenchError(
                f"{url}: hunt needs llama-server's native /completion API (token ids and per-token probabilities); "
                f"this server answers {info.server}'s"
            )
        self.props = ep.props
        self.target = Http(ep)
