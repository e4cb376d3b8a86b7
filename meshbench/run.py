"""One sweep from a RunConfig to a results dict: what `sweep` and `verify --rerun` share."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from meshbench import envinfo, files, results
from meshbench.config import EngineSpec, RunConfig
from meshbench.engine import factory
from meshbench.engine.base import check_context
from meshbench.errors import MeshbenchError
from meshbench.scheduler.budget import NodeBudget
from meshbench.scheduler.telemetry import TickRecord
from meshbench.sweep import Workload, run_concurrency_sweep, validate_levels


def prepare(cfg: RunConfig, verbose: bool = False) -> factory.EngineSetup:
    """Check the config against the model before any work, then load the engine."""
    validate_levels(cfg.levels, cfg.workload.sessions)
    NodeBudget(**cfg.budget)  # field-named errors now, not mid-sweep
    longest = longest_session(cfg.workload)
    setup = factory.setup(cfg.engine, longest, max(cfg.levels), max(cfg.workload.prompt_tokens), verbose)
    check_fits_context(longest, setup)
    check_budget_fits_one_session(cfg, setup, longest)
    return setup


def longest_session(workload: Workload) -> int:
    return max(p + n for p, n in zip(workload.prompt_tokens, workload.new_tokens))


def check_fits_context(longest: int, setup: factory.EngineSetup) -> None:
    """One rule for sweep and admit (engines apply it again before sizing a context)."""
    check_context(longest, setup.context_length)


def check_budget_fits_one_session(cfg: RunConfig, setup: factory.EngineSetup, longest: int) -> None:
    """A budget that cannot hold even one session would refuse everything: say which one."""
    bpt = setup.info["kv_bytes_per_token"]
    need = longest * bpt
    if cfg.budget["kv_bytes"] < need:
        raise MeshbenchError(
            f"budget.kv_bytes {cfg.budget['kv_bytes']} cannot hold a single session: the longest needs {need} "
            f"bytes ({longest} tokens x {bpt} bytes per token)"
        )
    scratch = setup.info["scratch_bytes_per_session"]
    if cfg.budget["scratch_bytes"] < scratch:
        raise MeshbenchError(
            f"budget.scratch_bytes {cfg.budget['scratch_bytes']} cannot hold a single session's scratch of "
            f"{scratch} bytes"
        )


def run_sweep(cfg: RunConfig, command: str, on_tick: Callable[[int, TickRecord], None] | None = None,
              setup: factory.EngineSetup | None = None) -> dict:
    setup = setup or prepare(cfg)
    sweep = run_concurrency_sweep(list(cfg.levels), cfg.workload, NodeBudget(**cfg.budget), setup.make,
                                  on_tick=on_tick)
    data = results.build(cfg, sweep, setup.info, envinfo.environment(), command)
    if data["first_divergence"] is not None and setup.classify_divergence is not None:
        data["first_divergence"]["classification"] = setup.classify_divergence(cfg, data)
    return data


def config_from_results(data: dict) -> RunConfig:
    """The RunConfig a bundle recorded (its config echo).

    A bundle can come from anyone: a model it says how to generate (make_model) goes into
    meshbench's own cache, never to the path the bundle names.
    """
    c = data["config"]
    w = c["workload"]
    engine = EngineSpec(**c["engine"])
    if engine.make_model:
        engine = dataclasses.replace(engine, model=str(cached_model_path(engine.make_model)))
    return RunConfig(
        story=c["story"], title=c.get("title", ""), levels=tuple(c["levels"]), engine=engine,
        workload=Workload(tuple(w["prompt_tokens"]), tuple(w["new_tokens"]), w["seed"]), budget=dict(c["budget"]),
        source="results.json",
    )


def cached_model_path(recipe: dict) -> Path:
    r = {"preset": "dgr-012", "type": "q8_0", "seed": 0, **recipe}
    return files.cache_dir() / "models" / f"{r['preset']}-{r['type']}-seed{r['seed']}.gguf"


def rerun_results(data: dict) -> dict:
    cfg = config_from_results(data)
    return run_sweep(cfg, data["command"])
