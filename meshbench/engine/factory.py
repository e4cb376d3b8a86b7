"""Choose the engine an EngineSpec names and prepare it once; the setup then makes one engine per level."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from meshbench.engine import kinds
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
    made = SETUPS.get(spec.kind)
    if made is None:
        raise MeshbenchError(
            f"engine.kind {spec.kind}: no setup of meshbench's own"
            + ("" if kinds.of(spec.kind).own else " (a server's: meshbench measures it over HTTP, --target)")
        )
    return made(spec, sizing, verbose, endpoints)


def _gguf(spec: EngineSpec, sizing: EngineSizing, verbose: bool, endpoints: Sequence[Endpoint]) -> EngineSetup:
    return setup_gguf(
        spec, sizing.max_total_tokens, sizing.max_sessions, sizing.max_prompt, verbose, endpoints, sizing.burst
    )


# Each kind of engine of meshbench's own (kinds.Kind.own), and how its setup is made.
SETUPS: dict[str, Callable[[EngineSpec, EngineSizing, bool, Sequence[Endpoint]], EngineSetup]] = {
    kinds.SYNTHETIC.name: lambda spec, *_: setup_synthetic(spec),
    kinds.GGUF.name: _gguf,
}
