"""The rules of an engine spec (meshbench.engine.spec.EngineSpec), by kind.

One rule for every setting: a setting of another kind, given, is refused in one line naming whose it is (each
field declares its kinds). Then each kind's own rules (what it needs, what excludes what), and the rules of
the engine's process (what must run in its own process, the RPC workers' layout)."""

from __future__ import annotations

import shlex
from dataclasses import fields
from typing import TYPE_CHECKING, Callable

from meshbench.engine import kinds, launchers, rpc, servers
from meshbench.errors import MeshbenchError

if TYPE_CHECKING:
    from meshbench.engine.spec import EngineSpec

# The kinds a setting belongs to (each field of EngineSpec declares one of these), from the registry.
ALL = frozenset(kinds.KINDS)
NODE = kinds.names(own=True)  # an engine of meshbench's own
GGUF = kinds.names(llama=True)  # llama.cpp in meshbench's process
ENDPOINT = kinds.names(own=False)  # a server over HTTP
TOKENIZED = kinds.names(tokenized=True)  # a model with its own tokenizer and end-of-generation tokens

# The flags meshbench gives a server it starts (endpoint.llama_server.serving): not the user's to override.
# (where the model comes from, too: a hub flag would make the server fetch and serve another model)
OWN_SERVER_FLAGS = frozenset(
    {"-m", "--model", "--host", "--port", "-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file",
     "-dr", "--docker-repo", "-hft", "--hf-token", "--path", "--api-prefix"}
)  # fmt: skip


def check(spec: EngineSpec) -> None:
    """Every rule, in order: whose each setting is, then the kind's own rules, then the process's."""
    kinds.of(spec.kind)
    _owned(spec)
    for rule in KIND_RULES[spec.kind]:
        rule(spec)
    _process(spec)


def _owned(spec: EngineSpec) -> None:
    """A setting given (not its default) that belongs to another kind of engine."""
    for f in fields(spec):
        owners = f.metadata.get("kinds")
        value = getattr(spec, f.name)
        inert = value == f.default or value in f.metadata.get("inert", ()) or (f.default is None and value == ())
        if owners is None or spec.kind in owners or inert:
            continue
        if owners == ENDPOINT:
            raise MeshbenchError(f"engine.{f.name} is an endpoint's (engine.kind endpoint: --target, --serve)")
        if not kinds.of(spec.kind).own:
            raise MeshbenchError(
                f"engine.{f.name} builds an engine of meshbench's own; an endpoint (--target) is the server's"
            )
        raise MeshbenchError(f"engine.{f.name} needs the gguf engine{f.metadata.get('why', '')}")


def _gguf(spec: EngineSpec) -> None:
    if not spec.model and not spec.package:
        raise MeshbenchError("engine.kind gguf needs engine.model (a GGUF file path) or engine.package")


def _endpoint(spec: EngineSpec) -> None:
    """A served model: its URL, or llama-server started on our model file; nothing that builds an engine of
    meshbench's own (``_owned``)."""
    if bool(spec.url) == bool(spec.serve):
        raise MeshbenchError(
            "engine.kind endpoint needs engine.url (--target http://HOST:PORT) or engine.serve "
            "(--serve llama-server), one of them"
        )
    if spec.serve and not (spec.model or spec.package):
        raise MeshbenchError("engine.serve needs the model to serve: engine.model or engine.package")
    if not spec.serve and (spec.model or spec.package):
        given = "model" if spec.model else "package"
        raise MeshbenchError(
            f"engine.{given} builds an engine of meshbench's own; an endpoint (--target) is the server's"
        )
    started = launchers.LAUNCHERS.get(spec.serve) if spec.serve else None
    if started is not None and spec.flavour not in (servers.AUTO, started.flavour.name):
        raise MeshbenchError(
            f"engine.flavour {spec.flavour}: engine.serve starts {started.name}, a {started.flavour.name} server"
        )
    if spec.server_args is not None and not spec.serve:
        raise MeshbenchError("engine.server_args are for a server meshbench starts (engine.serve)")
    _own_flags("engine.server_args", spec.server_argv)
    _settings(spec)
    if not (isinstance(spec.deadline_s, (int, float)) and 0 < spec.deadline_s <= 86400):
        raise MeshbenchError(f"engine.deadline_s {spec.deadline_s!r}: give seconds, above 0 and at most 86400")
    for f in fields(spec):
        if f.metadata.get("sent") and getattr(spec, f.name) != f.default and not spec.temperature:
            value = getattr(spec, f.name)
            raise MeshbenchError(f"engine.{f.name} {value!r:.20}: a sampler needs engine.temperature above 0")


def _own_flags(where: str, argv: list[str]) -> None:
    # llama.cpp reads --a_b as --a-b, and --flag=value as --flag value
    flags = {a.split("=", 1)[0].replace("_", "-") if a.startswith("--") else a for a in argv}
    taken = sorted(flags & OWN_SERVER_FLAGS)
    if taken:
        raise MeshbenchError(f"{where} {taken[0]}: meshbench sets the server's model, host (loopback) and port itself")


def _settings(spec: EngineSpec) -> None:
    """A matrix of server settings: for a server meshbench starts, each setting flags of its own (each its own
    folder too: meshbench.workload.config)."""
    if not spec.server_settings:
        return
    if not spec.serve:
        raise MeshbenchError("engine.server_settings are for a server meshbench starts (engine.serve)")
    for flags in spec.server_settings:
        try:
            argv = shlex.split(flags)
        except ValueError as e:
            raise MeshbenchError(f"engine.server_settings {flags!r}: {e}") from None
        _own_flags(f"engine.server_settings {flags!r}:", argv)


KIND_RULES: dict[str, tuple[Callable[[EngineSpec], None], ...]] = {
    kinds.SYNTHETIC.name: (),
    kinds.GGUF.name: (_gguf,),
    kinds.ENDPOINT.name: (_endpoint,),
}


def _process(spec: EngineSpec) -> None:
    """What must run the engine in its own process, and the RPC workers' layout."""
    if spec.tiled_mm != "auto" and spec.isolate is False:
        raise MeshbenchError(
            f"engine.tiled_mm {spec.tiled_mm} is a process-wide llama.cpp switch: it needs the "
            "engine in its own process (drop isolate: false)"
        )
    if (spec.rpc or spec.workers) and spec.isolate is False:
        raise MeshbenchError(
            "engine.rpc and engine.workers run the engine in its own process (a worker that "
            "misbehaves can abort or hang llama.cpp): drop isolate false / --no-isolate"
        )
    if spec.block_tokens != 16 and not spec.prefix_cache:
        raise MeshbenchError("engine.block_tokens is the prefix cache's block: give it with engine.prefix_cache")
    if spec.prefix_cache and spec.isolated:
        raise MeshbenchError(
            "engine.prefix_cache runs with the engine in the node's own process so far (drop isolate: true)"
        )
    if spec.rpc and spec.workers:
        raise MeshbenchError("give engine.rpc (workers you run) or engine.workers (spawned), not both")
    devices = len(rpc.parse_endpoints(spec.rpc, "engine.rpc")) if spec.rpc else spec.workers
    if spec.split is not None and len(spec.split) != devices:
        raise MeshbenchError(f"engine.split has {len(spec.split)} shares for {devices} RPC workers")
