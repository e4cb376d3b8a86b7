"""meshbench's own node as a hunt's target (``meshbench hunt --config FILE``): the config's engine (synthetic or
GGUF, its prefix cache as the config says) under the node's scheduler, in this process. A step's requests are
submitted at once to one node and run to completion; the engine, and so its prefix cache, lives from step to
step and history to history, as a server's does. A cold answer is the request alone on an engine made for it,
with nothing cached; a fresh node is a new engine (the loaded weights kept). Greedy with the end of generation
banned, as every hunt request is; each token's margin and second choice are the engine's own (top-1 minus top-2
logit, which is the log-probabilities' difference)."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Callable, Sequence

from meshbench.engine import kinds, packaged
from meshbench.engine.base import BatchEngine
from meshbench.engine.setup import EngineSetup, close_engine
from meshbench.engine.spec import EngineSpec
from meshbench.errors import MeshbenchError
from meshbench.hunt.execute import joined
from meshbench.model import gguf_io
from meshbench.records.completion import CANCELLED, Completion
from meshbench.records.context import Budget
from meshbench.records.history import NODE_COLD as COLD
from meshbench.records.history import NODE_REPLAYS as REPLAYS
from meshbench.records.history import Request
from meshbench.scheduler.budget import engine_limits
from meshbench.scheduler.session import DoneReason, GenerationRequest, Session, SessionStatus
from meshbench.sweep.driver import NodeDriver

Tokenizer = Callable[[list[str]], Sequence[Sequence[int]]]
QUEUE = 64  # a step's requests, at most, queued at once (every one is submitted before the first tick)


class NodeTarget:
    """The node: ``setup``'s engines under ``budget`` (``slots`` sessions at once), prompts drawn within
    ``n_ctx`` positions; ``tokenizer`` turns texts into ids (the model's own, or the synthetic engine's bytes)."""

    def __init__(
        self, setup: EngineSetup, budget: Budget, block_tokens: int, prefill: str, n_ctx: int, tokenizer: Tokenizer
    ) -> None:
        self.setup, self.prefill, self.tokenizer = setup, prefill, tokenizer
        self.budget = dataclasses.replace(budget, max_queue_depth=max(budget.max_queue_depth, QUEUE))
        self.limits = dataclasses.replace(engine_limits(self.budget), prefix_block_tokens=block_tokens)
        self.props: dict[str, object] | None = {
            "total_slots": self.budget.max_active_sessions,
            "default_generation_settings": {"n_ctx": n_ctx},
        }
        self.engine: BatchEngine | None = setup.make(self.limits)
        self.how_cold = COLD

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return [list(x) for x in self.tokenizer(texts)]

    def at_once(self, requests: list[Request], cache_prompt: bool | None = None) -> dict[str, Completion]:
        """The requests submitted together to the node; with ``cache_prompt`` false, together on an engine made for
        them with its prefix cache off (nothing taken from a cache: one request so is a cold answer)."""
        if cache_prompt is False:
            engine = self.setup.make(dataclasses.replace(self.limits, prefix_block_tokens=0))
            try:
                return _run(engine, self.budget, self.prefill, requests)
            finally:
                close_engine(engine)
        assert self.engine is not None
        return _run(self.engine, self.budget, self.prefill, requests)

    def fresh(self) -> NodeTarget:
        """The same node with nothing cached: a new engine."""
        self.close()
        self.engine = self.setup.make(self.limits)
        return self

    def close(self) -> None:
        if self.engine is not None:
            close_engine(self.engine)
            self.engine = None


def _run(engine: BatchEngine, budget: Budget, prefill: str, requests: list[Request]) -> dict[str, Completion]:
    """One node driver over ``engine``: every request submitted before the first tick, a client's disconnect
    (``cancel_at``) a cancel once that many tokens are in, run until every session has ended."""
    node = NodeDriver(engine, budget, prefill_policy=prefill)
    cut = {r.name: r.cancel_at for r in requests if r.cancel_at is not None}

    def disconnect(_tick: int) -> None:
        for name, at in cut.items():
            s = node.session(name)
            if s is not None and s.status is SessionStatus.RUNNING and len(s.tokens) >= at:
                node.cancel(name)

    t0 = time.monotonic_ns()
    arrivals = [(0, GenerationRequest(r.name, tuple(r.prompt), r.new_tokens, turns=r.turns)) for r in requests]
    node.run_to_completion(arrivals=arrivals, before_tick=disconnect)
    turns: dict[str, list[Session]] = {}
    for s in node.sessions():  # (a conversation's turns are sessions of one id, by epoch)
        turns.setdefault(s.session_id, []).append(s)
    return {
        r.name: joined(r, [_completion(r, s, t0) for s in sorted(turns.get(r.name, []), key=lambda s: s.epoch)])
        for r in requests
    }


def _completion(r: Request, s: Session, t0: int) -> Completion:
    """One session's answer (a conversation's turn); a request with none was refused at admission (``joined``)."""
    reason = s.done_reason
    error = s.error or (None if reason in (DoneReason.COMPLETED, DoneReason.CANCELLED) else str(reason))
    return Completion(
        session_id=r.name,
        submit_ns=s.submit_ns - t0,
        tokens=list(s.tokens),
        text="",
        token_ns=[t - t0 for t in s.token_ns],
        stop=CANCELLED if reason is DoneReason.CANCELLED else "limit",
        predicted=len(s.tokens),
        evaluated=s.prompt_len,
        error=error,
        computed=s.prompt_len - s.cached,
        margins=[m if math.isfinite(m) else None for m in s.margins],
        runner_up=list(s.runner_ups),
    )


N_CTX = 1024  # positions a hunt's prompt and answer may take on the node (at most the model's context)
MAX_SLOTS = 64  # sessions at once on a hunted node


class NodeServer:
    """The node a hunt runs against, from a node config (its engine, prefix cache and budget; ``slots``: its
    largest level), made on ``__enter__`` and freed on ``__exit__``; the hunt's Server for the node."""

    launched = True  # meshbench made it: a replay runs on a fresh node

    def __init__(self, config: str) -> None:
        self.config = config
        self.args = ["--config", config]
        self.target: NodeTarget | None = None
        self.props: dict[str, object] | None = None
        self.model: str | None = None
        self.build_info: str | None = None
        self._setup: EngineSetup | None = None

    def __enter__(self) -> NodeServer:
        from meshbench.engine import factory  # noqa: PLC0415 - the engines load their libraries on first use
        from meshbench.engine.process.supervisor import Supervisor
        from meshbench.engine.setup import EngineSizing
        from meshbench.scheduler.plan import bursts
        from meshbench.workload import config

        cfg = config.load(self.config)  # (its workload is not read: the hunt draws its own requests)
        spec = dataclasses.replace(
            cfg.engine,
            ban_eog=kinds.of(cfg.engine.kind).llama,  # (its model has end-of-generation tokens)
            model=str(packaged.path(cfg.engine.package)) if cfg.engine.package else cfg.engine.model,
        )
        slots = max(cfg.levels)
        if slots > MAX_SLOTS:
            raise MeshbenchError(f"--config {self.config}: its largest level {slots} is the node's slots; at most "
                                 f"{MAX_SLOTS} for a hunt")  # fmt: skip
        factory.ensure_model(spec)  # (a config that says how to make its model: made before it is read)
        want = min(N_CTX, _model_context(spec) or N_CTX)
        sizing = EngineSizing(want, slots, want, burst=bursts(cfg.prefill))
        self._setup = setup = Supervisor(spec, sizing).setup() if spec.isolated else factory.setup(spec, sizing)
        n_ctx = min(want, setup.context_length)
        per_token = setup.info.kv_bytes_per_token
        budget = dataclasses.replace(
            cfg.budget,
            max_active_sessions=slots,
            max_batch_size=slots,
            kv_bytes=max(cfg.budget.kv_bytes, slots * n_ctx * per_token),
        )
        block = spec.block_tokens if spec.prefix_cache else 0
        self.model = spec.model or f"preset {spec.preset}"
        self.build_info = (
            f"{spec.kind} engine, prefix cache {f'on (blocks of {block})' if block else 'off'}, prefill {cfg.prefill}"
        )
        self.target = NodeTarget(setup, budget, block, cfg.prefill, n_ctx, _tokenizer(spec, setup))
        self.props = self.target.props
        return self

    def __exit__(self, *exc: object) -> None:
        if self.target is not None:
            self.target.close()
        if self._setup is not None:
            self._setup.close()
            self._setup = None

    def fresh(self) -> NodeTarget:
        assert self.target is not None
        return self.target.fresh()

    def replays_on(self) -> str:
        return REPLAYS


def _model_context(spec: EngineSpec) -> int | None:
    """A GGUF model's trained context, read from its metadata before any context is sized (None: not a GGUF file
    or not said; the synthetic engine's preset context is read after its setup)."""
    if not kinds.of(spec.kind).llama or not spec.model:
        return None
    m = gguf_io.checked_model(Path(spec.model))
    n = m.meta.get(f"{m.arch}.context_length")
    return int(n) if isinstance(n, int) and n > 0 else None


def _tokenizer(spec: EngineSpec, setup: EngineSetup) -> Tokenizer:
    """The model's own tokenizer (BOS as it adds it); the synthetic engine and a GGUF model without a vocabulary
    have none: a text's bytes as ids."""
    if kinds.of(spec.kind).llama:
        from meshbench.engine.llama_model import tokenize  # noqa: PLC0415

        model = str(spec.model)
        try:
            tokenize(model, [""], check_file=False)
        except MeshbenchError as e:
            if "no tokenizer" not in str(e):
                raise
        else:
            return lambda texts: tokenize(model, texts, check_file=False)
    vocab = setup.vocab_size  # (the synthetic engine, or a GGUF model without a vocabulary: no BOS, bytes as ids)
    return lambda texts: [tuple(b % vocab for b in t.encode()) for t in texts]
