"""verify --rerun where a GGUF engine's llama.cpp kernels are not the recording ones.

llama.cpp's build picks its CPU kernels by feature (``fingerprint.llama_kernels``), and a quantized model's
greedy tokens differ between, say, its AVX2 and AVX-512 kernels. There the tokens, and what follows from
their values, are bound to the recording kernels: they are still compared, and each that differs is counted
and named rather than failed. The rest must reproduce: the schedule, admission, KV bytes, ticks, the
isolation verdicts and the part of ``corruption_free`` that no token value decides (isolation holds where it
ran, no session failed), unless tokens drive the schedule (eos stop, or conversations through a prefix cache)
and some token did differ: then only the engine, the inputs and that part of ``corruption_free`` must.
The rerun's own records are then checked in full, as ``verify`` checks a bundle, so its own verdicts stand
for the machine that ran it. The recipe picks kernels too: a rerun that could not run the bundle's weight
repacking (its repacked kernels die on this CPU, meshbench.sweep.run) is judged the same way, the recipe named
on each side as the cause, its fingerprint (which follows from it) not compared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from meshbench.analysis import figures
from meshbench.engine import kinds
from meshbench.records.context import Compute, EngineInfo
from meshbench.results import fingerprint
from meshbench.results.typed import NodeBundle

# What follows from a GGUF engine's token values: each a key of ``reproduce.view`` with its tokens split off.
TOKEN_BOUND = re.compile(
    r"^(batch_invariant|corruption_free|first_divergence(\..+)?|reference\.sessions\[\d+\]\.digest"
    r"|levels\[\d+\]\.(sessions|cache_off)\[\d+\]\.(tokens|digest|margins)"
    r"|levels\[\d+\]\.tick_records\[\d+\]\.decode_feed"
    r"|levels\[\d+\]\.isolation\.passes\[\d+\]\.sessions\[\d+\]\.(digest|margins_digest))$"
)
# corruption_free but for what token values decide (batch invariance where isolation did not run, the prefix
# cache's classification of a cache-on/off difference): held wherever the kernels are.
CORRUPTION_HELD = "corruption_free: isolation holds where it ran and no session failed"
# A GGUF engine's recipe as it ran (repacking, flash attention, its fingerprint): a key of ``reproduce.view``.
RECIPE = "engine.recipe"
# Where tokens drive the schedule and some token differs, all but these follow from them.
SCHEDULE_FREE = frozenset({"engine", RECIPE, "inputs", CORRUPTION_HELD})


def recipe(engine: EngineInfo) -> str | None:
    """The kernels a GGUF engine's recipe picks beside the build's: weight repacking and flash attention."""
    if not kinds.recorded(engine.kind).llama:
        return None
    on = {True: "on", False: "off"}
    repack, flash = getattr(engine, "repack", False), getattr(engine, "flash_attn", False)
    return f"repack {on[bool(repack)]}, flash attention {on[bool(flash)]}"


def differ(
    recorded: Compute | None, here: Compute | None, engine: EngineInfo, rerun: EngineInfo
) -> KernelReport | None:
    """Where a GGUF engine's llama.cpp kernels differ between the two fingerprints, or the recipe that picks
    among them does (a bundle made with repacking, rerun where its repacked kernels die), else None."""
    if not kinds.recorded(engine.kind).llama:
        return None
    was, now = fingerprint.llama_kernels(recorded), fingerprint.llama_kernels(here)
    recipes = (recipe(engine) or "", recipe(rerun) or "")
    if was == now and recipes[0] == recipes[1]:
        return None
    why = getattr(rerun, "recipe_auto", None) or {}
    decided = [
        str(why[k]).removeprefix("off: ").removeprefix("on: ")
        for k in ("repack", "flash_attn")
        if k in why and bool(getattr(engine, k, False)) != bool(getattr(rerun, k, False))
    ]
    return KernelReport(was or "no llama.cpp", now or "no llama.cpp", recipes=recipes, decided=decided)


def recipe_differs(report: KernelReport | None) -> bool:
    """The rerun ran another recipe than the bundle's (``engine.recipe`` is then the cause, said in the report,
    neither compared nor counted): its fingerprint cannot be the recorded one."""
    return report is not None and report.recipes[0] != report.recipes[1]


def held_corruption(b: NodeBundle) -> bool:
    return b.results.isolation.holds is not False and figures.unfinished_sessions(b.levels) == 0


def tokens_moved(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Some session's tokens differ between the two views."""
    return any(old.get(k) != new.get(k) for k in set(old) | set(new) if k.endswith(".tokens"))


@dataclass
class KernelReport:
    """What differed that is bound to the recording kernels, and what the rerun held of its own."""

    recorded: str
    here: str
    recipes: tuple[str, str] = ("", "")  # the recipe's kernels (repacking, flash attention): recorded, here
    decided: list[str] = field(default_factory=list)  # why a setting ran otherwise here (the rerun's recipe_auto)
    schedule_bound: bool = False  # tokens differ and drive this schedule
    bound: list[str] = field(default_factory=list)  # kernel-bound records that differ, by key
    compared: int = 0
    own: tuple[int, int] | None = None  # the rerun's own records checked: (checks, failed)
    own_unchecked: list[str] = field(default_factory=list)  # what the rerun's own check could not check

    def __str__(self) -> str:
        sessions = sorted({s for k in self.bound if (s := _session(k))}, key=_natural)
        if self.recorded == self.here:  # the same build's kernels, picked otherwise by the recipe
            which = (
                f"llama.cpp's kernels, which the recipe picks otherwise here ({_recipes(self.recipes, self.decided)}; "
                f"the build's kernels the same: {ascii(self.recorded)})"
            )
        else:
            which = (
                f"llama.cpp's kernels, which differ (recorded: {ascii(self.recorded)}; here: {ascii(self.here)}; "
                f"{_difference(self.recorded, self.here, self.recipes, self.decided)})"
            )
        if self.bound:
            text = f"; NOT reproduced here: {len(self.bound)} of {self.compared} records bound to {which}"
        else:
            text = f"; all {self.compared} records bound to {which} reproduced nonetheless"
        if sessions:
            text += f", the tokens of {len(sessions)} session record{'s' * (len(sessions) != 1)} among them, "
            text += f"first {sessions[0]}"
        schedule = [k for k in self.bound if not TOKEN_BOUND.search(k)]
        if schedule:
            text += f"; with them {len(schedule)} schedule records ({', '.join(sorted(schedule, key=_natural)[:5])}"
            text += ", ...)" if len(schedule) > 5 else ")"
        if "batch_invariant" in self.bound:
            text += "; the batch-invariance verdict is the recording kernels' and differs here"
        text += "; held here: " + (
            "the engine, the inputs and that isolation holds and no session failed (tokens differ and drive this "
            "schedule: eos stop, or conversations through a prefix cache)"
            if self.schedule_bound
            else "the schedule, admission, KV bytes, ticks, the isolation verdicts, and that no session failed"
        )
        if self.own is not None:
            text += f"; the rerun's own records: {self.own[0]} checks, {self.own[1]} failed"
            if self.own_unchecked:
                text += f" (unchecked there: {'; '.join(self.own_unchecked)})"
        return text


def _difference(recorded: str, here: str, recipes: tuple[str, str], decided: list[str]) -> str:
    """Which of the two families' words differ: the version, the features each alone reports, and the recipe."""
    (v1, _, f1), (v2, _, f2) = recorded.partition(": "), here.partition(": ")
    only = (sorted(set(f1.split()) - set(f2.split())), sorted(set(f2.split()) - set(f1.split())))
    parts = [f"version {ascii(v1)} against {ascii(v2)}"] if v1 != v2 else []
    parts += [f"only recorded: {' '.join(only[0])}"] if only[0] else []
    parts += [f"only here: {' '.join(only[1])}"] if only[1] else []
    if recipes[0] != recipes[1]:
        parts.append(f"the recipe: {_recipes(recipes, decided)}")
    return "; ".join(parts) or "the same words"


def _recipes(recipes: tuple[str, str], decided: list[str]) -> str:
    why = f", as {' and '.join(decided)}" if decided else ""
    return f"[{recipes[0]}] recorded, [{recipes[1]}] here{why}"


def _session(k: str) -> str | None:
    m = re.match(r"(levels\[\d+\]\.(sessions|cache_off)\[\d+\])\.tokens$", k)
    return m.group(1) if m else None


def _natural(k: str) -> list[Any]:
    """levels[2] before levels[10]; sessions before cache_off at one level."""
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", k.replace("cache_off", "~cache_off"))]
