"""Run configs: embedded defaults <- a YAML file <- command-line flags.

The merged mapping is validated against schemas/config.schema.json, then turned into
typed settings. Every problem is a MeshbenchError naming the file and the field.
"""

from __future__ import annotations

import copy
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable, Sequence

from meshbench import limits, validation
from meshbench.engine import apis, kinds
from meshbench.engine import spec as engine_spec
from meshbench.engine.spec import EngineSpec
from meshbench.errors import MeshbenchError
from meshbench.records.context import Budget, Slo
from meshbench.workload import arrivals, faults, matrix, request
from meshbench.workload.faults import Fault
from meshbench.workload.workload import Workload, WorkloadSection
from meshbench.workload.yaml_config import merge, read_yaml

# The DGR-012 run's budgets: sized so KV never evicts (the corruption check is then unambiguous).
DGR_012_BUDGET = Budget(
    weight_bytes=1 << 30,
    kv_bytes=1 << 24,
    scratch_bytes=1 << 26,
    max_active_sessions=8,
    max_queue_depth=8,
    max_batch_size=8,
    max_prefill_tokens_per_tick=4,
)
DGR_012_NAME = {"story": "DGR-012", "title": "Continuous batching and bounded admission"}


@dataclass(frozen=True, slots=True)
class RunConfig:
    """A whole run, typed. Every field's default is the embedded default (DEFAULTS is derived from them);
    the rules that tie sections together are ``__post_init__``'s."""

    story: str | None = None  # null: named by what ran (_story); the embedded DGR-012 run names itself (load)
    title: str | None = None
    levels: tuple[int, ...] = (1, 2, 4, 8)
    rates: tuple[float, ...] | None = None  # with a poisson or gamma process: each rate (sessions per tick) a level
    repeat: int = 1  # recorded passes per level
    warmup: int = 1  # unrecorded passes per level first: a process's first pass is measurably slower
    engine: EngineSpec = EngineSpec()
    workload: Workload = field(default_factory=lambda: WorkloadSection().build("defaults"))
    isolation: bool = True  # perturbation passes at every level (meshbench.analysis.isolation)
    isolation_rounds: int = 4  # every ordered pair of sessions tested this many times, fresh content in every pass
    isolation_family: str = "constant-weight"  # or repeated (meshbench.analysis.isolation.FAMILIES)
    clock: str = "tick"  # or "wall": arrivals at rates per second, reported rather than compared
    slo: Slo = Slo()  # ticks, or ms on the wall clock
    faults: tuple[tuple[Fault, ...], ...] = ()  # fault rows (meshbench.workload.faults), each run at every level
    restart_engine: bool = False  # after an engine loss: a fresh engine, the lost sessions resubmitted
    prefill: str = "whole"  # or chunked (the budget filled exactly, prompts split) or burst (meshbench.scheduler.plan)
    budget: Budget = DGR_012_BUDGET  # max_active_sessions/max_batch_size are set per level by a sweep
    source: str = "defaults"  # where the config came from, for messages and the results echo

    def __post_init__(self) -> None:
        if self.story is None:
            object.__setattr__(self, "story", _story(self.engine))
        if self.title is None:
            object.__setattr__(self, "title", "Concurrency sweep")
        gguf = kinds.of(self.engine.kind).tokenized  # a model with a tokenizer and end-of-generation tokens
        for rule in RUN_RULES.get(self.engine.kind, ()):
            rule(self)
        if self.workload.prompts is not None and not gguf:
            raise MeshbenchError(
                "workload.prompts (--prompts) are real text, tokenized by a real model: give a GGUF model "
                "(--engine gguf --model FILE) or a server (--target URL, or --serve llama-server)"
            )
        if self.workload.eos != "continue" and not gguf:
            raise MeshbenchError(
                f"workload.eos {self.workload.eos} needs a model with end-of-generation tokens (the synthetic engine "
                "has none): give a GGUF model (--engine gguf --model FILE) or a server (--target URL, --serve), "
                "or --eos continue"
            )
        faults.check_rows(
            self.faults, set(self.workload.session_ids()), self.engine.isolated, self.engine.workers, "faults"
        )
        if self.workload.turns > 1:
            _check_turns(self)
        matrix.check_folders(self.engine.server_settings or ())
        if kinds.of(self.engine.kind).own and self.workload.cancel != "auto":  # (off too: nothing to turn off)
            raise MeshbenchError(
                f"workload.cancel {self.workload.cancel}: cancel-and-retry runs against an endpoint (engine.kind "
                "endpoint); a node sweep has none to set (its cancels are faults: cancel:SESSION@T)"
            )
        if self.faults and (self.rates is not None or self.clock == "wall"):
            raise MeshbenchError(
                "faults run on the tick clock with every session at once or an arrival process, "
                "not with rates or the wall clock"
            )

    def _check_endpoint(self) -> None:
        """An endpoint sweep: real prompts, C closed-loop clients per level, nothing of the node's own."""
        if self.workload.prompts is None:
            raise MeshbenchError(
                "engine.kind endpoint needs workload.prompts (a file of real prompts the server tokenizes)"
            )
        if self.workload.sessions > limits.MAX_ENDPOINT_SESSIONS:
            raise MeshbenchError(
                f"workload.sessions {self.workload.sessions}: an endpoint sweep sends every session at once (its "
                f"margin and canary passes), one client thread each: at most {limits.MAX_ENDPOINT_SESSIONS}"
            )
        last = request.session_seed(self.workload.seed, self.workload.sessions - 1, self.engine.seed_per_request)
        if last > request.MAX_SEED:
            raise MeshbenchError(
                f"workload.seed {self.workload.seed}: requests carry seeds up to {last}, over {request.MAX_SEED} "
                "(servers read a 32-bit seed, and llama-server takes 4294967295 for a random one)"
            )
        open_loop = self.rates is not None and self.clock == "wall"  # (sessions per second, on the wall clock)
        node_only = {
            "faults": bool(self.faults),
            "rates without --clock wall (an endpoint's rates are sessions per second)": self.rates is not None
            and not open_loop,
            "clock wall without --rates": self.clock == "wall" and not open_loop,
            "workload.arrivals without --rates": self.workload.arrivals != "all-at-once" and not open_loop,
            "restart_engine": self.restart_engine,
            f"prefill {self.prefill}": self.prefill != "whole",
            "budget": self.budget != DGR_012_BUDGET,
            "workload.eos continue (a server stops at its end-of-generation token, eos stop, or bans it, eos ban)": (
                self.workload.eos == "continue"
            ),
        }
        talks = (apis.AUTO, *apis.names(conversations=True))  # (auto: checked once the probe resolves it)
        if self.workload.turns > 1 and (open_loop or self.engine.api not in talks):
            raise MeshbenchError(
                "workload.turns: conversations over HTTP run on closed-loop clients (no --rates so far), over the "
                "native or chat API (--api openai would send each answer back as text to tokenize again)"
            )
        cancel = self.workload.cancel
        if isinstance(cancel, int) and cancel >= min(self.workload.new_tokens):
            raise MeshbenchError(
                f"workload.cancel: token {cancel} is not before the end of every answer (the shortest asks for "
                f"{min(self.workload.new_tokens)} new tokens)"
            )
        if isinstance(cancel, int) and (
            self.engine.api not in (apis.AUTO, *apis.names(cancels=True)) or all(c < 2 for c in self.levels)
        ):
            raise MeshbenchError(
                "workload.cancel: cancel-and-retry runs at levels of two or more sessions over the native API "
                "(token ids and margins); give a level >= 2 and --api native or auto, or cancel off"
            )
        given = [k for k, v in node_only.items() if v]
        if given:
            raise MeshbenchError(
                f"{given[0]}: an endpoint sweep runs C closed-loop clients per level, and open-loop arrivals at "
                "--rates (sessions per second) with --clock wall and a poisson or gamma --arrivals; faults and "
                "the prefill policy are a meshbench node's"
            )

    def to_dict(self) -> dict:
        return {
            "story": self.story,
            "title": self.title,
            "levels": list(self.levels),
            "rates": None if self.rates is None else list(self.rates),
            "repeat": self.repeat,
            "warmup": self.warmup,
            "slo": {"ttft": self.slo.ttft, "tpot": self.slo.tpot},
            "clock": self.clock,
            "faults": [",".join(f.label for f in row) for row in self.faults],
            "restart_engine": self.restart_engine,
            "prefill": self.prefill,
            "isolation": self.isolation,
            "isolation_rounds": self.isolation_rounds,
            "isolation_family": self.isolation_family,
            "engine": self.engine.to_dict(),
            "workload": self.workload.to_dict(),
            "budget": asdict(self.budget),
        }


# The rules of a run that are its engine kind's (an endpoint sweep's), beside the engine spec's own.
def _check_turns(cfg: RunConfig) -> None:
    """What conversations run with so far: answers of fixed lengths."""
    if cfg.workload.eos == "stop":
        raise MeshbenchError(
            "workload.turns: conversations need eos continue or ban so far (turns that end at an end-of-generation "
            "token, each of another length, are not tested yet)"
        )


RUN_RULES: dict[str, tuple[Callable[[RunConfig], None], ...]] = {kinds.ENDPOINT.name: (RunConfig._check_endpoint,)}
SECTIONS = ("engine", "workload", "budget")


def _plain(value):
    """A default as YAML would write it: tuples as lists, a record (the SLO) as its mapping."""
    if isinstance(value, Slo):
        return asdict(value)
    return list(value) if isinstance(value, tuple) else value


def _defaults() -> dict:
    """The embedded defaults (the DGR-012 run) as a config mapping, from the dataclasses' own defaults."""
    top = {
        f.name: _plain(f.default_factory() if f.default_factory is not MISSING else f.default)
        for f in fields(RunConfig)
        if f.name not in (*SECTIONS, "source")
    }
    return {
        **top,
        "engine": EngineSpec().to_dict(),
        "workload": {k: _plain(v) for k, v in asdict(WorkloadSection()).items()},
        "budget": asdict(DGR_012_BUDGET),
    }


DEFAULTS: dict = _defaults()
# Keys added after results schema 3 (the endpoint's; a shared prefix, written only where there is one): a config
# echo without them means their defaults.
# Top-level keys added since: an echo without one ran the value here, which is not the default of a new run.
LEGACY_TOP: dict[str, object] = {"isolation_family": "repeated"}
ADDED_KEYS: dict[str, frozenset[str]] = {
    "engine": engine_spec.added(),
    "workload": frozenset({"prefix", "turns", "turn_tokens", "cancel"}),
}


def validate_levels(levels: Sequence[int], sessions: int) -> list[int]:
    """The levels in ascending order, or a MeshbenchError naming the bad one."""
    if not levels:
        raise MeshbenchError("levels: at least one concurrency level is needed")
    bad = [lv for lv in levels if lv < 1]
    if bad:
        raise MeshbenchError(f"levels: every level must be >= 1, got {bad[0]}")
    if len(set(levels)) != len(levels):
        raise MeshbenchError(f"levels: duplicate level in {','.join(map(str, levels))}")
    over = [lv for lv in levels if lv > sessions]
    if over:
        raise MeshbenchError(
            f"levels: level {over[0]} exceeds the {sessions} sessions of the workload (refused, not clamped: "
            "a level above the session count measures nothing new)"
        )
    return sorted(levels)


def load(path: str | Path | None = None, overrides: dict | None = None) -> RunConfig:
    """Defaults, then the file at ``path``, then ``overrides`` (a nested mapping of flags)."""
    source = str(path) if path else "defaults"
    data = merge(DEFAULTS, read_yaml(path)) if path else copy.deepcopy(DEFAULTS)
    if path:
        file_errors = validation.errors(data, "config.schema.json")
        if file_errors:
            raise MeshbenchError(f"config {source}: {file_errors[0]}")
    # Every key of the schema is optional and none depends on another, so the flags are
    # checked on their own: the file's (possibly long) lists are validated once.
    flag_errors = validation.errors(overrides or {}, "config.schema.json")
    if flag_errors:
        raise MeshbenchError(f"flags: {flag_errors[0]}")
    data = merge(data, overrides or {})
    if (
        not path
        and data["story"] is None
        and not any(k in (overrides or {}) for k in ("engine", "workload", "budget", "prefill"))
    ):
        data = {**data, "story": DGR_012_NAME["story"], "title": data["title"] or DGR_012_NAME["title"]}
    if source == "defaults" and overrides:
        source = "defaults+flags"
    elif overrides:
        source = f"{source}+flags"
    return from_mapping(data, source)


def from_mapping(data: dict, source: str) -> RunConfig:
    """Typed settings from a whole, schema-valid config mapping (a merged config, or a bundle's echo). The rules
    are the dataclasses' own; an error names the config's source."""
    workload = WorkloadSection(**data["workload"]).build(source)
    process = arrivals.parse(workload.arrivals, f"{source}: workload.arrivals")
    process.ticks(workload.sessions, workload.seed)  # a trace of the wrong length, or arrivals too late: refused now
    rows = tuple(faults.parse_row(row, f"{source}: faults[{i}]") for i, row in enumerate(data["faults"]))
    try:
        for r in data["rates"] or ():
            process.with_rate(r)
        if data["engine"]["package"] and data["engine"]["model"]:  # (a run resolves a package to its file)
            raise MeshbenchError("give engine.model or engine.package, not both")
        spec = EngineSpec(**data["engine"], ban_eog=workload.eos == "ban")
        return RunConfig(
            story=data["story"],
            title=data["title"],
            levels=tuple(data["levels"]),
            rates=None if data["rates"] is None else tuple(data["rates"]),
            repeat=data["repeat"],
            warmup=data["warmup"],
            engine=spec,
            workload=workload,
            isolation=data["isolation"],
            isolation_rounds=data["isolation_rounds"],
            isolation_family=data.get("isolation_family", LEGACY_TOP["isolation_family"]),
            clock=data["clock"],
            slo=Slo(**data["slo"]),
            faults=rows,
            restart_engine=data["restart_engine"],
            prefill=data["prefill"],
            budget=Budget(**data["budget"]),
            source=source,
        )
    except MeshbenchError as e:
        raise MeshbenchError(f"{source}: {e}") from None


def _story(spec: EngineSpec) -> str:
    """A sweep without a story is named by what it ran: the packaged model, else its kind's name for it."""
    return spec.package or STORIES[spec.kind](spec)


def _served(spec: EngineSpec) -> str:
    """A served model: the server started on a model file, or the endpoint's address."""
    if spec.serve:
        return f"{spec.serve}-{Path(spec.model or '').stem[:200]}"
    return f"endpoint-{(spec.url or '').split('://', 1)[-1].replace(':', '-').rstrip('/')}"


# Each engine kind's name for a sweep without a story (the model file, the preset, the endpoint).
STORIES: dict[str, Callable[[EngineSpec], str]] = {
    kinds.SYNTHETIC.name: lambda spec: f"synthetic-{spec.preset}",
    kinds.GGUF.name: lambda spec: Path(spec.model or "").stem[:200] or "gguf",
    kinds.ENDPOINT.name: _served,
}
