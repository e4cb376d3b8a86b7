"""Build an engine factory from an EngineSpec: one fresh engine (fresh KV) per call."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from meshbench import files
from meshbench.config import EngineSpec
from meshbench.engine.base import BatchEngine
from meshbench.errors import MeshbenchError
from meshbench.model.config import preset
from meshbench.scheduler.budget import NodeBudget


@dataclass(slots=True)
class EngineSetup:
    make: Callable[[NodeBudget], BatchEngine]
    info: dict  # what results.json records about the engine
    vocab_size: int
    context_length: int
    resource: object = None  # what must stay alive while engines run (a loaded model)
    classify_divergence: Callable[[object, dict], str] | None = None


def ensure_model(spec: EngineSpec) -> None:
    """Generate the model a config names when it is missing and the config says how (make_model)."""
    if spec.model and spec.make_model and not Path(spec.model).exists():
        from meshbench import gguf_io  # noqa: PLC0415
        from meshbench.model.weights import init_weights  # noqa: PLC0415

        recipe = spec.make_model
        cfg = preset(recipe.get("preset", "dgr-012"))
        Path(spec.model).parent.mkdir(parents=True, exist_ok=True)
        gguf_io.write(Path(spec.model), cfg, init_weights(cfg, recipe.get("seed", 0)), recipe.get("type", "q8_0"))


def setup(spec: EngineSpec, max_total_tokens: int, max_sessions: int, max_prompt: int = 512,
          verbose: bool = False) -> EngineSetup:
    """Prepare the engine once (weights, model file); ``make`` then builds one per level."""
    ensure_model(spec)
    if spec.kind == "synthetic":
        return _synthetic(spec)
    if spec.kind == "gguf":
        from meshbench.engine.gguf_engine import setup_gguf  # noqa: PLC0415 - optional dependency

        return setup_gguf(spec, max_total_tokens, max_sessions, max_prompt, verbose)
    raise MeshbenchError(f"engine.kind must be synthetic or gguf, got {spec.kind!r}")


def _synthetic(spec: EngineSpec) -> EngineSetup:
    from meshbench.engine.synthetic import KvBatchEngine  # noqa: PLC0415
    from meshbench.model.weights import init_weights  # noqa: PLC0415

    if spec.device not in ("cpu", "auto"):
        raise MeshbenchError(f"engine synthetic runs on the CPU only (numpy); --device {spec.device} is not possible")
    model_sha = None
    if spec.model:
        from meshbench.gguf_io import read_weights  # noqa: PLC0415 - needs the gguf package

        path = files.regular_file(spec.model, "model")
        cfg, weights = read_weights(path)
        model_sha = files.sha256(path)
        source = f"gguf:{path}"
    else:
        cfg = preset(spec.preset)
        weights = init_weights(cfg, spec.seed)
        source = f"seed:{spec.seed}"

    def make(budget: NodeBudget) -> BatchEngine:
        return KvBatchEngine(cfg, weights, budget.kv_bytes, weights_source=source)

    probe = make(NodeBudget(1, 1, 1, 1, 0, 1, 1))
    info = {
        "kind": "synthetic",
        "preset": None if spec.model else spec.preset,
        "model": spec.model,
        "model_sha256": model_sha,
        "weights_seed": None if spec.model else spec.seed,
        "recipe_fingerprint": probe.recipe_fingerprint,
        "device": "cpu",
        "dtype": cfg.dtype,
        "threads": spec.threads,
        "model_config": cfg.to_dict(),
        "kv_bytes_per_token": probe.kv_bytes_per_token,
        "weight_bytes": probe.weight_bytes,
        "scratch_bytes_per_session": probe.scratch_bytes_per_session,
    }
    return EngineSetup(make, info, cfg.vocab_size, cfg.context_length)
