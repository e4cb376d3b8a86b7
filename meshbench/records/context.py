"""What ran, and where: the records around a sweep's levels (the engine, the workload, the budget, the machine,
a served endpoint), typed. Only ``meshbench.records.serial`` turns them into JSON and back."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any

from meshbench.errors import MeshbenchError
from meshbench.limits import MAX_BYTES, MAX_SESSIONS, MAX_TOKENS

JsonObject = dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineInfo:
    """What every engine reports (``meshbench.engine.setup.describe``); each kind adds its own facts."""

    kind: str
    preset: str | None
    model: str | None
    model_sha256: str | None
    device: str
    dtype: str
    threads: int | None
    recipe_fingerprint: str
    kv_bytes_per_token: int
    weight_bytes: int
    scratch_bytes_per_session: int
    isolated: bool | None = None  # the engine ran in its own process behind a proxy


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticEngineInfo(EngineInfo):
    """The numpy dense Llama: its weights' seed and its model config."""

    weights_seed: int | None  # (None: the weights came from a GGUF file)
    model_config: JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class KvGeometry:
    """The model's KV cache geometry, per layer, as its GGUF file states it (``meshbench.engine.kv_geometry``)."""

    architecture: str
    layers: int
    k_values: list[int]
    v_values: list[int]
    window: list[int | None]  # a sliding-window layer's window (None: full attention)
    bytes_per_token: int


@dataclass(frozen=True, slots=True, kw_only=True)
class KvAllocation:
    """What llama.cpp allocated for the probe context's KV, as its log said: each cache, its cells, per cell."""

    caches: list[JsonObject]  # llama.cpp's log, one entry per cache (cache, cells, layers, k_mib, v_mib)
    cells: int
    bytes_per_cell: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GgufEngineInfo(EngineInfo):
    """llama.cpp: the file's architecture, the recipe it ran with, the KV geometry and what was allocated."""

    architecture: str
    flash_attn: bool
    kv_unified: bool
    mixed_batch: bool
    repack: bool
    tiled_mm: str
    model_name: str
    eog_tokens: list[int]
    kv_geometry: KvGeometry | None
    kv_allocated: KvAllocation | None
    rpc: JsonObject | None  # RPC workers: endpoints, devices, layers and buffers per device
    vocab_size: int | None = None  # the model's vocabulary (synthetic prompts are drawn over it); since round 4
    # each recipe setting that was auto (engine.repack, engine.flash_attn): what it resolved to here, and why
    recipe_auto: dict[str, str] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """A node sweep's workload, one length per session."""

    sessions: int
    prompt_tokens: list[int]
    new_tokens: list[int]
    seed: int
    arrivals: str
    prompts: str | None
    eos: str
    prefix: SharedPrefix | None = None  # shared prefixes: prompt_tokens are then each session's own, after it
    turns: int | None = None  # conversations: turns per session (written when more than one)
    # the user's ids each later turn adds: one count (synthetic turns), or real turns' lengths, a list per session
    turn_tokens: int | list[list[int]] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedPrefix:
    """Consecutive sessions in groups of these sizes, each group's prompts starting with the same ``tokens``."""

    groups: list[int]
    tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointWorkload:
    """An endpoint sweep's workload: a file of real prompts, tokenized by the server."""

    sessions: int
    prompts: str
    prompts_sha256: str
    prompt_tokens: list[int]
    new_tokens: list[int]
    eos: str
    seed: int
    # the fields every request carried beside its prompt and token counts (what the client asked of the server:
    # cache_prompt only where the user chose it); None in a bundle made before it was recorded
    request: dict[str, Any] | None = None
    prompt_ids: list[list[int]] | None = None  # each session's prompt ids as the server tokenized them (None: a
    # server that tokenizes nothing, servers.Flavour.counted, or a bundle made before they were recorded)
    turns: int | None = None  # conversations: the turns each session runs (None: one)
    turn_ids: list[list[list[int]]] | None = None  # each session's later user turns as the server tokenized them,
    # nothing special added (a turn continues the conversation)


PROMPTS_FILE = "workload.prompts"  # the prompts file's config key: the input file a results.json records


@dataclass(frozen=True, slots=True, kw_only=True)
class InputFile:
    """An input file a sweep read (a prompts file), as it was then."""

    sha256: str


def _bounded(least: int, most: int) -> Any:
    """A budget field: an integer, required, in [least, most] (its schema, in both schema files: ``schema``)."""
    return field(metadata={"schema": {"type": "integer", "minimum": least, "maximum": most}})


@dataclass(frozen=True, slots=True, kw_only=True)
class Slo:
    """A service-level objective: a session's TTFT and TPOT bounds (ticks, or ms on the wall clock; None: no
    bound), as a config's ``slo`` section gives them."""

    ttft: float | None = None
    tpot: float | None = None

    def meets(self, ttft: float, tpot: float | None) -> bool:
        """A session's TTFT and TPOT (None: one token) within the bounds (a bound of None holds)."""
        return (self.ttft is None or ttft <= self.ttft) and (self.tpot is None or tpot is None or tpot <= self.tpot)


@dataclass(frozen=True, slots=True)
class Budget:
    """What one node may hold: the scheduler's budget, the config's and the record's, one class, checked when built
    (a level's own is in its level record). Byte budgets are totals for the node.

    weight_bytes is reported beside the engine's resident weights, not enforced: a node that loaded the model has
    already paid it."""

    weight_bytes: int = _bounded(1, MAX_BYTES)
    kv_bytes: int = _bounded(1, MAX_BYTES)
    scratch_bytes: int = _bounded(1, MAX_BYTES)
    max_active_sessions: int = _bounded(1, MAX_SESSIONS)
    max_queue_depth: int = _bounded(0, MAX_SESSIONS)
    max_batch_size: int = _bounded(1, MAX_SESSIONS)
    max_prefill_tokens_per_tick: int = _bounded(1, MAX_TOKENS)

    def __post_init__(self) -> None:
        for f in fields(self):  # (the bounds below the schema's: a budget built in code is checked as a config)
            value, least = getattr(self, f.name), f.metadata["schema"]["minimum"]
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                what = "a positive integer" if least == 1 else f"an integer >= {least}"
                raise MeshbenchError(f"budget: {f.name} must be {what}, got {value!r}")
        if self.max_batch_size > self.max_active_sessions:
            raise MeshbenchError(
                f"budget: max_batch_size {self.max_batch_size} exceeds max_active_sessions "
                f"{self.max_active_sessions}: no tick could ever fill such a batch"
            )

    def effective_active_cap(self, scratch_bytes_per_session: int) -> int:
        """Active slots: the tighter of max_active_sessions and the scratch envelope."""
        assert scratch_bytes_per_session > 0, scratch_bytes_per_session
        return min(self.max_active_sessions, self.scratch_bytes // scratch_bytes_per_session)


def budget_schema(required: bool) -> JsonObject:
    """The budget's JSON schema, from its fields: a record's (every field ``required``), or a config's section
    (each optional, the defaults' for the rest). ``python -m meshbench.records.schemas`` writes both files'."""
    props = {f.name: f.metadata["schema"] for f in fields(Budget)}
    head: JsonObject = {"type": "object"}
    if required:
        head["required"] = list(props)
    return copy.deepcopy({**head, "additionalProperties": False, "properties": props})  # (the fields' own kept)


@dataclass(frozen=True, slots=True, kw_only=True)
class Blas:
    library: str
    version: str | None
    kernel: str | None
    threads: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LlamaCppBuild:
    version: str
    system_info: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Compute:
    """The compute fingerprint (``meshbench.results.fingerprint``): what selects the kernels the floats came
    from."""

    cpu: str
    simd: list[str]
    blas: Blas | None
    openblas_coretype: str | None
    llama_cpp: LlamaCppBuild | None
    digest: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Environment:
    """The machine and the software a bundle was made with (``meshbench.results.envinfo``)."""

    python: str
    numpy: str
    llama_cpp: str | None
    platform: str
    machine: str
    cpu: str
    cpu_count: int | None
    git_commit: str | None
    git_dirty: bool | None
    argv0: str | None
    compute: Compute


@dataclass(frozen=True, slots=True, kw_only=True)
class Launched:
    """A server meshbench started: which, its version, its flags, its model file."""

    server: str
    version: str
    args: list[str]
    model: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointInfo:
    """A served endpoint as its client found it (its own props where it has them)."""

    url: str
    loopback: bool
    api: str
    models: list[str | None]
    server: str
    detected: str | None = None  # why it is that flavour (None: a bundle from before flavours said why)
    build_info: str | None = None
    model_path: str | None = None
    total_slots: int | None = None
    launched: Launched | None = None

    @property
    def name(self) -> str:
        """The server's name: the one meshbench started, else what it says it is."""
        return self.launched.server if self.launched else self.server

    @property
    def version(self) -> str | None:
        return self.launched.version if self.launched else self.build_info
