"""Hugging Face transformers' own OpenAI-compatible server, ``transformers serve`` (the ``transformers`` extra), on
a model file of this machine, with continuous batching, offline: what it is, and one running on a free loopback
port for as long as the caller needs it (stopped by the process id it started, always).

A GGUF file is served as ``FOLDER:FILE.gguf``: transformers reads its config and tokenizer from the file and
dequantizes its weights (to float32 on the CPU), so the numbers it computes are not llama.cpp's. A folder (a
``save_pretrained`` one) is served as it is. Nothing is fetched: HF_HUB_OFFLINE is set for the server."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from meshbench.endpoint import started
from meshbench.engine import launchers
from meshbench.engine.process.workers import free_port
from meshbench.errors import MeshbenchError

READY_TIMEOUT_S = 600.0  # loading (and dequantizing) the model before /health answers
MODULE = "transformers.cli.transformers"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


def program(path: str | None = None, source: str = "") -> list[str]:
    """How ``transformers serve`` is run: this Python's transformers, with what its server needs."""
    del path, source  # (transformers serve is the installed package's, never a path)
    missing = [m for m in ("transformers", "torch", "fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise MeshbenchError(
            f"no transformers serve here ({', '.join(missing)} not installed): pip install 'meshbench[transformers]'"
        )
    return [sys.executable, "-m", MODULE, "serve"]


def version(prog: Sequence[str]) -> str:
    """transformers' and torch's versions, as pip installed them."""
    del prog
    return "; ".join(f"{p} {importlib.metadata.version(p)}" for p in ("transformers", "torch"))


def model_id(model: str) -> str:
    """The name transformers serve loads ``model`` by: ``FOLDER:FILE.gguf`` for a GGUF file, a folder as it is."""
    path = Path(model).absolute()
    return f"{path.parent}:{path.name}" if path.suffix == ".gguf" else str(path)


@contextmanager
def serving(prog: Sequence[str], model: str, args: Sequence[str] = ()) -> Iterator[str]:
    """``transformers serve`` on ``model`` at a free loopback port, offline: its URL while the block runs."""
    port = free_port()
    address = [*prog, model_id(model), "--host", "127.0.0.1", "--port", str(port)]
    cmd = [*address, *launchers.TRANSFORMERS.own_flags(args), *args]
    with started.serving(cmd, port, "transformers serve", READY_TIMEOUT_S, {**os.environ, **OFFLINE}) as url:
        yield url
