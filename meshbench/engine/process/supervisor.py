"""The engine in its own process, and the RPC workers the run spawned: started, replaced after a
loss, and always stopped by this code (never by name).

``make`` hands the sweep a proxy engine for a pass (starting a fresh process, and fresh workers,
when the last one was lost); ``restart`` is the ``--restart-engine`` policy's way to a new engine
in the middle of a pass; ``kill_engine`` and ``kill_worker`` are the fault plan's.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from meshbench.engine.base import EngineLimits
from meshbench.engine.process.proxy import EngineProcess, ProxyEngine
from meshbench.engine.process.workers import Pool
from meshbench.engine.rpc import Endpoint
from meshbench.engine.setup import EngineSetup, EngineSizing
from meshbench.engine.spec import EngineSpec
from meshbench.errors import MeshbenchError


class Supervisor:
    def __init__(
        self,
        spec: EngineSpec,
        sizing: EngineSizing,
        verbose: bool = False,
        pool: Pool | None = None,
        endpoints: Sequence[Endpoint] = (),
    ) -> None:
        self.spec, self.sizing, self.verbose = spec, sizing, verbose
        self.pool, self._endpoints = pool, list(endpoints)
        self.starts = 0
        self.process = self._start()
        self.info = dataclasses.replace(self.process.info, isolated=True)

    def _start(self) -> EngineProcess:
        endpoints = self.pool.endpoints if self.pool is not None else self._endpoints
        process = EngineProcess(self.spec, self.sizing, self.verbose, endpoints)
        self.starts += 1
        if self.starts > 1 and process.info.recipe_fingerprint != self.info.recipe_fingerprint:
            process.stop()
            raise MeshbenchError(
                "the restarted engine is not the one the run started with (recipe fingerprint "
                "changed: was the model file replaced?)"
            )
        return process

    def _healthy(self) -> bool:
        return self.process.alive and (self.pool is None or self.pool.alive)

    def make(self, limits: EngineLimits) -> ProxyEngine:
        """A fresh engine for a pass, on a live process (a new one, with new workers, after a loss)."""
        if not self._healthy():
            self._replace()
        return ProxyEngine(self.process, limits)

    def restart(self, limits: EngineLimits) -> ProxyEngine:
        """After a loss mid-pass: a new process (and new workers when the run spawned them)."""
        self._replace()
        return ProxyEngine(self.process, limits)

    def _replace(self) -> None:
        self.process.stop()
        if self.pool is not None:
            self.pool.respawn()
        self.process = self._start()

    def kill_engine(self) -> None:
        self.process.kill()

    def kill_worker(self, index: int) -> None:
        if self.pool is None:
            raise MeshbenchError(f"kill-worker:{index}: the run spawned no RPC workers")
        self.pool.kill(index)

    def close(self) -> None:
        self.process.stop()

    def setup(self) -> EngineSetup:
        return EngineSetup(
            self.make,
            self.info,
            self.process.vocab_size,
            self.process.context_length,
            resource=self,
            restart=self.restart,
            kill_engine=self.kill_engine,
            kill_worker=self.kill_worker,
            eog=self.process.eog,
        )
