"""What engine to build: the config's ``engine`` section, typed, one field per setting.

Each field declares everything about its setting (``setting``): its default, the engine kinds it belongs to, its
JSON schema (with its description) and, where it has one, its command-line flag. From the fields come the
config schema's engine section (``properties``), the embedded defaults (meshbench.workload.config), the Engine
panel's flags (meshbench.cli.options_engine) and the rule that refuses a setting of another kind
(meshbench.engine.spec_rules, beside each kind's own rules). Adding an engine option is one field here, then
``python -m meshbench.engine.spec`` writes its schema into schemas/config.schema.json (a test holds the file
to the fields) and docs/reference/cli.md is generated again (its test names the command)."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from meshbench import limits
from meshbench.engine import apis, kinds, launchers, servers, spec_rules
from meshbench.engine.spec_rules import ALL, ENDPOINT, GGUF, NODE, OWN_SERVER_FLAGS  # noqa: F401
from meshbench.errors import MeshbenchError

PATH = {"type": ["string", "null"], "minLength": 1, "maxLength": 4096}
SEED = {"type": "integer", "minimum": 0, "maximum": 2**64 - 1}
AUTO = "auto"  # a recipe choice left to llama.cpp's own default where it runs (meshbench.engine.recipe)
RECIPE_CHOICE = {"type": ["boolean", "string"], "enum": [True, False, AUTO]}


def setting(
    default: Any,
    owners: frozenset[str],
    schema: dict[str, Any],
    flag: str | None = None,
    help: str | None = None,  # noqa: A002 - the flag's help (default: the schema's description)
    why: str = "",
    added: bool = False,
    inert: tuple[Any, ...] = (),
    sent: bool = False,
) -> Any:
    """One engine setting: its default, the engine kinds it belongs to, its schema, its flag (None: a config key
    only; ``--name/--no-name`` for a switch) and its help; ``why`` is said when another kind is given it.
    ``added``: a setting newer than results schema 3, which a bundle's config echo from before it lacks (meaning
    its default): a new setting is one. ``inert``: values besides the default that another kind may carry, meaning
    nothing there (``repack: false`` in a synthetic bundle's echo, from when false was the default). ``sent``: a
    sampler every request of an endpoint sweep carries under the setting's name where it is not at its default,
    which needs a temperature (meshbench.workload.request)."""
    meta = {"kinds": owners, "schema": schema, "flag": flag, "help": help, "why": why, "added": added, "inert": inert}
    meta["sent"] = sent
    return field(default=default, metadata=meta)


@dataclass(frozen=True, slots=True)
class EngineSpec:
    kind: str = setting(kinds.SYNTHETIC.name, ALL, {"enum": list(kinds.KINDS)})
    preset: str = setting(
        "dgr-012", NODE, {"type": "string", "minLength": 1}, "--preset", "Synthetic model preset: dgr-012 | bench."
    )
    model: str | None = setting(
        None, ALL, PATH, "--model", "A GGUF file (gguf engine, or synthetic engine reading its weights)."
    )
    seed: int = setting(0, ALL, {**SEED, "description": "The synthetic weights' seed."})
    device: str = setting("cpu", NODE, {"enum": ["cpu", "cuda", "auto"]}, "--device", "cpu | cuda | auto")
    threads: int | None = setting(
        None,
        NODE,
        {"type": ["integer", "null"], "minimum": 1, "maximum": limits.MAX_THREADS},
        "--threads",
        "Engine threads (gguf engine).",
    )
    flash_attn: bool | str = setting(
        AUTO,
        NODE,
        {
            **RECIPE_CHOICE,
            "description": "GGUF engine: flash attention: auto (the default) = llama.cpp's own choice for the model "
            "and device, as llama-server's default; true | false. What was used is the engine record's.",
        },
        "--flash-attn",
        "GGUF engine: flash attention auto (llama.cpp's own choice, the default; the bundle says which) | on | off.",
        inert=(False,),
    )
    kv_unified: bool = setting(
        False,
        NODE,
        {"type": "boolean"},
        "--kv-unified/--no-kv-unified",
        "GGUF engine: one KV stream for every sequence (llama.cpp's kv_unified); a prefix cache's hits then "
        "share cells instead of copying them.",
    )
    kv_type: str = setting("f16", NODE, {"enum": ["f16", "f32"]})
    make_model: dict[str, Any] | None = setting(
        None,
        NODE,
        {
            "description": "Generate the model file when it is missing: meshbench model make-tiny with these settings.",
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "preset": {"enum": ["dgr-012", "bench"]},
                        "type": {"enum": ["f32", "f16", "q8_0", "q4_0"]},
                        "seed": SEED,
                    },
                },
            ],
        },
    )
    rpc: str | None = setting(
        None,
        GGUF,
        {**PATH, "description": "llama.cpp RPC workers HOST:PORT[,HOST:PORT...] that hold the model layers."},
        "--rpc",
        "llama.cpp RPC workers HOST:PORT[,HOST:PORT...] (meshbench node serve) for the model's layers.",
        why=" (llama.cpp RPC)",
    )
    workers: int = setting(
        0,
        GGUF,
        {
            "type": "integer",
            "minimum": 0,
            "maximum": 16,
            "description": "Spawn this many local RPC workers (loopback, free ports) for the run.",
        },
        "--workers",
        "Start this many local RPC workers (loopback, free ports) for the run.",
        why=" (llama.cpp RPC)",
    )
    split: tuple[float, ...] | None = setting(
        None,
        GGUF,
        {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 16,
                    "items": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000},
                },
            ],
            "description": "Share of layers per RPC worker device, e.g. [1, 3]; null: llama.cpp proportional split.",
        },
        why=" (the layers' split over llama.cpp RPC workers)",
    )  # (its flag, --split, is parsed from a list: meshbench.cli.options_engine)
    isolate: bool | None = setting(
        None,
        NODE,
        {
            "type": ["boolean", "null"],
            "description": "Run the engine in its own process behind a proxy (null: yes exactly when RPC workers "
            "are used).",
        },
        "--isolate/--no-isolate",
        "Run the engine in its own process behind a proxy (default: exactly when RPC workers are used); the node "
        "then survives the engine dying.",
    )
    mixed_batch: bool = setting(
        False,
        GGUF,
        {
            "type": "boolean",
            "description": "GGUF engine: a tick's decode items and prompt chunks in one llama_decode (default: "
            "separate calls).",
        },
        "--mixed-batch/--no-mixed-batch",
        "GGUF engine: a tick's decode items and prompt chunks in ONE llama_decode (default: separate calls).",
        why=" (one llama_decode per tick); the synthetic engine always runs its batched decode and each prompt "
        "in one call",
    )
    repack: bool | str = setting(
        AUTO,
        GGUF,
        {
            **RECIPE_CHOICE,
            "description": "GGUF engine: llama.cpp's CPU weight repacking (llama_model_params.use_extra_bufts): "
            "auto (the default) = llama.cpp's default where its repacked kernels run on this CPU (probed once per "
            "model and machine in a throwaway process: AMX kernels die with SIGILL on CPUs that report AMX they "
            "cannot run), off where they do not; true (refused where they do not run) | false. With it on, "
            "Gemma's decode is batch-variant from 4 rows (docs/concepts/determinism.md).",
        },
        "--repack",
        "GGUF engine: llama.cpp's CPU weight repacking auto (the default: on where its kernels run on this CPU) | "
        "on | off.",
        inert=(False,),
    )
    tiled_mm: str = setting(
        "auto",
        GGUF,
        {
            "enum": ["auto", "off", "force"],
            "description": "GGUF engine: ggml's tiled K-quant matmul (GGML_CPU_TILED_MM): auto = llama.cpp's choice "
            "(tiled from a batch of 8 rows), off = never (the vec_dot kernel at every batch size), force = always. "
            "A process-wide switch: off and force run the engine in its own process.",
        },
        "--tiled-mm",
        "GGUF engine: ggml's tiled K-quant matmul: auto (llama.cpp's choice, from 8 rows) | off | force.",
    )
    n_ubatch: int | None = setting(
        None,
        GGUF,
        {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": limits.MAX_TOKENS,
            "description": "GGUF engine: llama.cpp's micro-batch (llama_context_params.n_ubatch, llama-server's -ub): "
            "a tick's rows are computed in pieces of at most this many (null: llama.cpp's own, 512). The pieces "
            "change the arithmetic, so whether outputs are batch-invariant depends on it.",
        },
        "--ubatch",
        "GGUF engine: llama.cpp's micro-batch, the rows of a tick computed per piece (default: llama.cpp's 512, "
        "as llama-server's -ub).",
        added=True,
    )
    package: str | None = setting(
        None,
        GGUF | ENDPOINT,
        {
            "type": ["string", "null"],
            "enum": [None, "gemma3-270m-q4-k-m"],
            "description": "A model that a pip package ships (the 'gemma' extra): assembled into meshbench's "
            "cache and used as engine.model.",
        },
    )
    url: str | None = setting(
        None, ENDPOINT, {"type": ["string", "null"], "minLength": 1, "maxLength": 4096}, added=True
    )
    api: str = setting(
        "auto",
        ENDPOINT,
        {"enum": list(apis.CHOICES)},
        "--api",
        "With --target: "
        + " | ".join(f"{a.name} ({a.says})" for a in apis.APIS.values())
        + " | auto (native where the server answers /props).",
        added=True,
    )
    flavour: str = setting(servers.AUTO, ENDPOINT, {"enum": list(servers.CHOICES)}, "--flavour", "What server the "
                           "endpoint is: " + " | ".join(servers.FLAVOURS) + " | auto (told from its answers: /props, "
                           "/v1/models, /version; the bundle records which and why).", added=True)  # fmt: skip
    serve: str | None = setting(None, ENDPOINT, {"enum": [*launchers.NAMES, None]}, added=True)
    server_args: str | None = setting(
        None,
        ENDPOINT,
        {"type": ["string", "null"], "maxLength": 4096},
        "--server-args",
        "With --serve: the server's own flags, e.g. '-np 16 --no-repack' (its defaults otherwise; meshbench adds "
        "only the model, a loopback host and port, and --metrics).",
        added=True,
    )
    server_settings: tuple[str, ...] | None = setting(
        None,
        ENDPOINT,
        {
            "oneOf": [
                {"type": "null"},
                {"type": "array", "maxItems": 16, "items": {"type": "string", "maxLength": 4096}},
            ],
            "description": "With engine.serve: a matrix of server settings, each a string of the server's own "
            "flags added to engine.server_args, e.g. ['', '-np 1', '--no-cache-prompt']: one sweep per setting, "
            "each a bundle of its own in a folder of the --out bundle (null or []: one sweep).",
        },
        added=True,
    )  # (its flag, --server-settings, is parsed from a JSON list: meshbench.cli.options_engine)
    cache_prompt: str | None = setting(
        None,
        ENDPOINT,
        {
            "enum": [None, "on", "off"],
            "description": "Endpoint: the cache_prompt field sent with every request: on | off; null (the "
            "default) sends none, so the server keeps its own default (llama-server's prompt cache is on).",
        },
        "--cache-prompt",
        "Endpoint: send cache_prompt on | off with every request (default: send none, the server's own default).",
        added=True,
    )
    deadline_s: float = setting(
        300.0,
        ENDPOINT,
        {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 86400,
            "description": "Endpoint: one request's deadline in seconds, from submission to its last byte; a "
            "request still open then is that session's failure (default 300).",
        },
        added=True,
    )
    allow_remote: bool = setting(False, ENDPOINT, {"type": "boolean", "description": "Endpoint: let --target name "
                                 "a host off this machine (not loopback); refused otherwise (default false)."},
                                 "--allow-remote", "Let --target name a host off this machine; without it only "
                                 "loopback is sent load and prompts.", added=True)  # fmt: skip
    gauges: bool = setting(True, ENDPOINT, {"type": "boolean", "description": "Endpoint: read the server's request "
                           "gauges (requests in a slot, requests waiting for one) from /metrics every 0.1 s while each "
                           "timed pass runs (default true; its cost is measured by meshbench bench gauges: "
                           "docs/guides/endpoint.md)."}, "--gauges/--no-gauges", "Endpoint: sample the server's queue "
                           "(/metrics) every 0.1 s during each timed pass (default on).", added=True)  # fmt: skip
    prefix_cache: bool = setting(False, NODE, {"type": "boolean", "description": "Reuse cached whole blocks of "
                                 "prompt positions across sessions, keyed by a chained SHA-256 of their token ids (off "
                                 "by default)."}, "--prefix-cache/--no-prefix-cache", "Reuse cached whole blocks of "
                                 "prompt positions across sessions (chained SHA-256 keys of the ids).",
                                 added=True)  # fmt: skip
    block_tokens: int = setting(16, NODE, {"type": "integer", "minimum": 1, "maximum": 4096, "description": "The "
                                "prefix cache's block: this many positions (default 16)."}, "--block-tokens", "The "
                                "prefix cache's block, in positions (default 16).", added=True)  # fmt: skip
    temperature: float = setting(0.0, ENDPOINT, {"type": "number", "minimum": 0, "maximum": 2}, "--temperature",
                                 "Endpoint: sample at this temperature (default 0: greedy). Divergences are then "
                                 "not classified by margins.", added=True)  # fmt: skip
    top_p: float = setting(1.0, ENDPOINT, {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "--top-p",
                           "Endpoint, with --temperature: nucleus sampling's p, sent only below 1.", added=True,
                           sent=True)  # fmt: skip
    min_p: float = setting(0.0, ENDPOINT, {"type": "number", "minimum": 0, "maximum": 1}, "--min-p", "Endpoint, with "
                           "--temperature: min-p sampling's p (llama-server, vLLM), sent only above 0.", added=True,
                           sent=True)  # fmt: skip
    seed_per_request: bool = setting(False, ENDPOINT, {"type": "boolean"}, "--seed-per-request/--one-seed",
                                     "Endpoint: session k's requests carry seed workload.seed + k (default: every "
                                     "request workload.seed).", added=True)  # fmt: skip
    # the workload's eos policy is ban: the engine masks end-of-generation tokens (derived, not a config key)
    ban_eog: bool = False

    def __post_init__(self) -> None:
        if self.split is not None:
            object.__setattr__(self, "split", tuple(self.split))
        if self.server_settings is not None:
            object.__setattr__(self, "server_settings", tuple(self.server_settings))
        spec_rules.check(self)

    @property
    def server_argv(self) -> list[str]:
        """The started server's own flags, split as a shell would (a MeshbenchError for an unterminated quote)."""
        try:
            return shlex.split(self.server_args or "")
        except ValueError as e:
            raise MeshbenchError(f"engine.server_args {self.server_args!r}: {e}") from None

    @property
    def isolated(self) -> bool:
        """In its own process: as configured, else exactly when RPC workers are used or a process-wide
        llama.cpp switch (tiled_mm) is set, which must never leak into the node's own process."""
        if self.isolate is not None:
            return self.isolate
        return bool(self.rpc or self.workers or self.tiled_mm != "auto")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["split"] = None if self.split is None else list(self.split)
        d["server_settings"] = None if self.server_settings is None else list(self.server_settings)
        del d["ban_eog"]  # derived from workload.eos, echoed there
        if self.package:
            d["model"] = None  # the package names it; its file is assembled into the cache at run time
        return d


def settings(spec: type = EngineSpec) -> list[Any]:
    """The engine section's settings (the fields a config names), in order."""
    return [f for f in fields(spec) if "schema" in f.metadata]


def properties(spec: type = EngineSpec) -> dict[str, Any]:
    """The config schema's engine section: each setting's schema, by name."""
    return {f.name: f.metadata["schema"] for f in settings(spec)}


def samplers(spec: EngineSpec) -> dict[str, Any]:
    """The samplers (``sent`` settings) not at their defaults, by name, as every request carries them."""
    return {
        f.name: getattr(spec, f.name) for f in settings() if f.metadata["sent"] and getattr(spec, f.name) != f.default
    }


def added(spec: type = EngineSpec) -> frozenset[str]:
    """The settings a config echo from before them may lack (their default)."""
    return frozenset(f.name for f in settings(spec) if f.metadata["added"])


def write_schema(path: Path) -> None:
    """The config schema file with its engine section written from the settings (``properties``)."""
    schema = json.loads(path.read_text())
    schema["properties"]["engine"]["properties"] = properties()
    path.write_text(json.dumps(schema, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    write_schema(Path(__file__).resolve().parents[2] / "schemas" / "config.schema.json")
