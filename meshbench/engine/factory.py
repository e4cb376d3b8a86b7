"""Choose the engine an EngineSpec names and prepare it once; the setup then makes one engine per level."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from meshbench.engine.gguf_setup import setup_gguf
from meshbench.engine.rpc import Endpoint  # llama_cpp itself is imported on first use
from meshbench.engine.setup import EngineSetup, EngineSizing
from meshbench.engine.spec import EngineSpec
from meshbench.engine.synthetic import setup_synthetic
from meshbench.errors import MeshbenchError
from meshbench.model import gguf_io
from meshbench.model.config import preset
from meshbench.model.weights import init_weights


def ensure_model(spec: EngineSpec) -> None:
    """Generate the model a config names when it is missing and the config says how (make_model)."""
    if spec.model and spec.make_model and not Path(spec.model).exists():
        recipe = spec.make_model
        cfg = preset(recipe.get("preset", "dgr-012"))
        try:
            Path(spec.model).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MeshbenchError(f"model {spec.model}: cannot create its folder ({e.strerror})") from None
        gguf_io.write(Path(spec.model), cfg, init_weights(cfg, recipe.get("seed", 0)), recipe.get("type", "q8_0"))


def setup(
    spec: EngineSpec, sizing: EngineSizing, verbose: bool = False, endpoints: Sequence[Endpoint] = ()
) -> EngineSetup:
    """Prepare the engine once (weights, model file); ``make`` then builds one per level."""
    ensure_model(spec)
    if spec.kind == "synthetic":
        return setup_synthetic(spec)
    if spec.kind == "gguf":
        return setup_gguf(
            spec, sizing.max_total_tokens, sizing.max_sessions, sizing.max_prompt, verbose, endpoints, sizing.burst
        )
    raise MeshbenchError(f"engine.kind must be synthetic or gguf, got {spec.kind!r}")
