"""What a bundle of either kind offers a comparison: its side (``meshbench.results.kinds`` names the kinds;
``SIDES`` holds each one's reduction).

A side is a name and a version, how its outputs compare (token ids, or text), the workload it ran as the
fields that must match, what it says about itself (engine or server, budget, run, machine, software), and
per level: each session's output, each figure's value in every repetition, and for a meshbench node the raw
level record (the exact divergence, the scheduler's figures)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from meshbench.analysis import endpoint as endpoint_figures
from meshbench.analysis import figures
from meshbench.engine import kinds as engine_kinds
from meshbench.records.context import PROMPTS_FILE
from meshbench.records.documents import EndpointResults, NodeResults
from meshbench.records.endpoint_figures import by_name
from meshbench.records.model import LevelRecord
from meshbench.records.turns import by_turn
from meshbench.results import kinds
from meshbench.results.typed import EndpointBundle, NodeBundle

LevelKey = tuple[int, float | None, tuple[str, ...]]  # concurrency, arrival rate, fault row

# Figures both kinds may report, by one name each, with whether higher is better and whether it counts time
# queued (TTFT and E2E count from submission: they compare only between sides that submit alike).
FIGURES = (
    ("decode_tokens_per_s", True, False),
    ("prefill_tokens_per_s", True, False),
    ("total_tokens_per_s", True, False),  # prompt + generated tokens over the pass's wall time
    ("ttft_ms.p50", False, True),
    ("ttft_ms.p99", False, True),
    ("itl_ms.p50", False, False),
    ("itl_ms.p99", False, False),
    ("tpot_ms.p50", False, False),
    ("tpot_ms.p99", False, False),
    ("e2e_ms.p50", False, True),
)
# A node's own name for a figure of FIGURES, where it differs (its tokens_per_s counts every token)
NODE_NAMES = {"total_tokens_per_s": "tokens_per_s"}

ENGINE_FIELDS = (
    "kind",
    "model_sha256",
    "recipe_fingerprint",
    "device",
    "dtype",
    "threads",
    "flash_attn",
    "repack",
    "kv_unified",
    "mixed_batch",
    "tiled_mm",
    "kv_bytes_per_token",
    "weight_bytes",
)
MACHINE_FIELDS = ("cpu", "cpu_count", "platform", "machine")
SOFTWARE_FIELDS = ("python", "numpy", "llama_cpp", "git_commit", "git_dirty")


@dataclass(frozen=True, slots=True)
class SideLevel:
    outputs: dict[str, list[int] | str | None]  # per session (None: it failed, and has no output)
    samples: dict[str, list[float]]  # per figure of FIGURES: its value in each repetition
    record: LevelRecord | None = None  # a node's level, for the exact divergence and the scheduler's figures


@dataclass(frozen=True, slots=True)
class Side:
    kind: str
    name: str
    version: str | None
    by: str  # tokens or text
    submission: str  # how sessions were sent: all at once, at arrival times, by closed-loop clients
    workload: dict[str, Any]  # the fields that must match the other side's (those both have)
    facts: dict[tuple[str, str], Any]  # (kind, field) -> value: what differs is reported
    levels: dict[LevelKey, SideLevel]
    sessions: int  # the workload's sessions (a node's refusals are those it did not serve)
    wall: bool = False  # a node on the wall clock: admission depends on speed


def side(kind: str, typed: Any) -> Side:
    """A verified bundle of either kind (typed: ``meshbench.results.typed``), reduced to its side (each kind's
    reduction, ``SIDES``)."""
    return SIDES[kind](typed)


def _node(b: NodeBundle) -> Side:
    r = b.results
    levels = {}
    for lv in b.levels:
        # every figure from the raw stamps of each repetition (verify holds the recorded ones to them too)
        reps = [
            figures.scalar_figures(figures.wall_figures(rep.sessions, rep.tick_records, rep.wall_s))
            for rep in lv.repetitions
        ]
        levels[(lv.concurrency, lv.rate, tuple(lv.faults))] = SideLevel(
            # (each turn's last record: a lost turn's resubmission after a restart is the same turn)
            outputs={
                turn_key(sid, turn): s.tokens if s.done_reason == "COMPLETED" else None
                for (sid, turn), s in by_turn(lv.sessions).items()
            },  # fmt: skip
            samples={f: [x[n] for x in reps if (n := NODE_NAMES.get(f, f)) in x] for f, _, _ in FIGURES},
            record=lv,
        )
    w = r.workload
    return Side(
        kind=kinds.NODE,
        name=f"meshbench node ({r.engine.kind})",
        version=f"llama-cpp-python {r.environment.llama_cpp}"
        if engine_kinds.recorded(r.engine.kind).llama
        else f"numpy {r.environment.numpy}",
        by="tokens",
        submission="at arrival times" if b.arrival_sweep else "all at once",
        workload={
            "sessions": w.sessions,
            "prompt_tokens": w.prompt_tokens,
            "new_tokens": w.new_tokens,
            "seed": w.seed,
            "arrivals": w.arrivals,
            "prompts": w.prompts,
            "eos": w.eos,
            "prompts_sha256": prompts.sha256 if (prompts := (r.inputs or {}).get(PROMPTS_FILE)) else None,
            "turns": w.turns or 1,
            "turn_tokens": w.turn_tokens,
        },
        facts={**_engine(r), **_budget(b), **_run(b), ("run", "prefill"): b.cfg.prefill, **_environment(r)},
        levels=levels,
        sessions=w.sessions,
        wall=b.wall,
    )


def _samples(reps: list[dict[str, float | None]]) -> dict[str, list[float]]:
    """Each figure both kinds may report, its value in each repetition that has one (an endpoint's, by name)."""
    return {f: [x for rep in reps if (x := rep[f]) is not None] for f, _, _ in FIGURES if f in reps[0]}


def _endpoint(b: EndpointBundle) -> Side:
    r = b.results
    compared = r.verdicts.compared
    levels: dict[LevelKey, SideLevel] = {
        (lv.concurrency, None, ()): SideLevel(
            outputs={
                turn_key(c.session_id, c.turn or 1): endpoint_figures.output(c, compared) if c.error is None else None
                for c in endpoint_figures.pass_answers(lv.repetitions[0])
            },
            samples=_samples([by_name(rep.figures) for rep in lv.repetitions]),
        )
        for lv in r.levels
    }
    w = r.workload
    return Side(
        kind=kinds.ENDPOINT,
        name=r.endpoint.name,
        version=r.endpoint.version,
        by=compared,
        submission="by closed-loop clients",
        workload={
            "prompt_tokens": w.prompt_tokens,
            "new_tokens": w.new_tokens,
            "prompts_sha256": w.prompts_sha256,
            "turns": w.turns or 1,
            "turn_ids": w.turn_ids,
        },
        facts={
            ("server", "name"): r.endpoint.name,
            ("server", "version"): r.endpoint.version,
            **_run(b),
            **_environment(r),
        },  # fmt: skip
        levels=levels,
        sessions=w.sessions,
    )


def turn_key(session_id: str, turn: int) -> str:
    """An output's key: its session, and (a conversation's later turn) which turn: every turn is compared."""
    return session_id if turn <= 1 else f"{session_id} turn {turn}"


def _engine(r: NodeResults) -> dict[tuple[str, str], Any]:
    # (only what the engine's record has: a synthetic engine has no flash_attn, no repack, no mixed batch)
    return {("engine", k): getattr(r.engine, k) for k in ENGINE_FIELDS if hasattr(r.engine, k)}


def _budget(b: NodeBundle) -> dict[tuple[str, str], Any]:
    return {("budget", k): v for k, v in dataclasses.asdict(b.cfg.budget).items()}


def _run(b: NodeBundle | EndpointBundle) -> dict[tuple[str, str], Any]:
    cfg = b.cfg
    return {
        ("run", "levels"): list(cfg.levels),
        ("run", "repeat"): cfg.repeat,
        ("run", "warmup"): cfg.warmup,
        ("run", "clock"): cfg.clock,
    }


def _environment(r: NodeResults | EndpointResults) -> dict[tuple[str, str], Any]:
    env = r.environment
    return {
        **{("machine", k): getattr(env, k) for k in MACHINE_FIELDS},
        **{("software", k): getattr(env, k) for k in SOFTWARE_FIELDS},
    }


SIDES: dict[str, Callable[[Any], Side]] = {kinds.NODE: _node, kinds.ENDPOINT: _endpoint}
