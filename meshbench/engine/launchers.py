"""Every server meshbench can start itself (``engine.serve``, ``--serve``), in one registry: the flavour of server it
is (meshbench.engine.servers), the flags meshbench adds to the user's, and the module that finds its program, says
what version it is and runs one on a free loopback port (``program``, ``version``, ``serving``), imported only
where a server is started: verify reads a launcher's flags and flavour and starts nothing.

Code asks a launcher, never compares ``engine.serve`` with a name: a new server meshbench starts is one entry here
and the module that runs it; tests/test_launchers.py holds the registry to the config's choices."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Sequence

from meshbench.engine import servers
from meshbench.errors import MeshbenchError

BATCHING = ("--continuous-batching", "--no-continuous-batching")  # (transformers serve's switch)


@dataclass(frozen=True, slots=True)
class Launcher:
    name: str  # as engine.serve names it
    flavour: servers.Flavour  # the server it starts
    own_flags: Callable[[Sequence[str]], list[str]]  # what meshbench adds to the user's flags
    runs: str  # the module that finds, names and runs it: program(path, source), version(program), serving(...)
    path_env: str | None  # the environment variable that names its program, where one does

    def program(self, path: str | None = None, source: str | None = None) -> Any:
        """Its program: ``path`` (``source`` gave it), else where its environment variable points, else its
        default."""
        if path is None and self.path_env is not None and os.environ.get(self.path_env):
            path, source = os.environ[self.path_env], f"${self.path_env}"
        return importlib.import_module(self.runs).program(path, source or f"${self.path_env}")

    def version(self, program: Any) -> str:
        return str(importlib.import_module(self.runs).version(program))

    def serving(self, program: Any, model: str, args: Sequence[str] = ()) -> ContextManager[str]:
        """One running on ``model`` at a free loopback port, with ``args`` and meshbench's own flags: its URL."""
        found: ContextManager[str] = importlib.import_module(self.runs).serving(program, model, args)
        return found


LLAMA_SERVER = Launcher(
    "llama-server",
    servers.LLAMA_SERVER,
    own_flags=lambda args: [] if "--metrics" in args else ["--metrics"],  # (its counters, scraped around passes)
    runs="meshbench.endpoint.llama_server",
    path_env="MESHBENCH_LLAMA_SERVER",
)
TRANSFORMERS = Launcher(
    "transformers",
    servers.TRANSFORMERS,
    own_flags=lambda args: [] if any(a in BATCHING for a in args) else ["--continuous-batching"],
    runs="meshbench.endpoint.transformers_server",
    path_env=None,
)
LAUNCHERS: dict[str, Launcher] = {x.name: x for x in (LLAMA_SERVER, TRANSFORMERS)}
NAMES = tuple(LAUNCHERS)


def of(name: str) -> Launcher:
    """The launcher ``name`` names; any other name is the input's error, in one line."""
    found = LAUNCHERS.get(name)
    if found is None:
        raise MeshbenchError(f"--serve {name!r:.40}: meshbench starts {' or '.join(NAMES)}")
    return found
