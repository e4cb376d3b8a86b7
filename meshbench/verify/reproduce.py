"""verify --rerun: a fresh run of a bundle's recorded configuration held to its records, in two classes (each
failure reads expected = the recorded value, found = the rerun's).

**Machine-independent** records (tokens, the schedule, admission decisions and reasons, KV bytes,
ticks, the decode feed, the verdicts) must be identical on any machine. **Floating-point** records
(each token's logit margin, the isolation passes' margin digests, a divergence's logit deviation)
come from kernels the compute fingerprint selects: on the recording fingerprint they must agree bit
for bit; on another one the numbers must agree within ``tolerance`` (the largest deviation is
reported), and digests of floats, which no tolerance can compare, are left to the rerun's own
isolation verdict, which compares its passes bit for bit on this machine.

**Kernel-bound** records: a GGUF engine's tokens and what follows from their values, where the rerun's
llama.cpp kernels are not the recording ones (``meshbench.verify.kernels``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from meshbench.analysis import figures
from meshbench.analysis.checks import Checks, Failure
from meshbench.engine import kinds
from meshbench.names import RESULTS
from meshbench.records import serial
from meshbench.records.context import EngineInfo
from meshbench.records.model import IsolationRecords, PassSession
from meshbench.results import fingerprint, typed
from meshbench.results.fields import DETERMINISTIC_LEVEL_FIELDS
from meshbench.results.typed import NodeBundle
from meshbench.verify import kernels

Rerun = Callable[[dict[str, Any]], dict[str, Any]]  # a bundle's results -> the same configuration's results, run again

FILE = f"{RESULTS} (rerun)"
# Float records: a margins list, a digest of margins, a logit deviation or a margin inside a divergence.
_NUMBERS = re.compile(r"\.(margins|logit_deviation|reference_margin)$")
_DIGESTS = re.compile(r"\.margins_digest$")
TOKENS, SESSION_ID = "tokens", "session_id"  # a session's entry in the flattened view (its JSON keys)


def tolerance(engine: EngineInfo) -> float:
    """The relative tolerance on another fingerprint: float64 arithmetic (the synthetic engine's dgr-012
    preset) rounds at 2.2e-16 per operation, float32 and quantized llama.cpp kernels at 1.2e-7 over dot
    products thousands long; both bounds leave three orders of magnitude above what reorderings give."""
    return 1e-9 if figures.float64(engine) else 1e-3


def deterministic_view(data: dict[str, Any]) -> dict[str, Any]:
    """Every field a rerun must reproduce, flattened to one key each (``view``, of the records typed once)."""
    return view(typed.node(data))


_ENGINE_APART = ("rpc", "model", "vocab_size", "recipe_auto")
_RECIPE = ("repack", "flash_attn", "recipe_fingerprint")  # a GGUF engine's: the kernels they pick


def view(b: NodeBundle, split_tokens: bool = False, threads: bool = True) -> dict[str, Any]:
    """Every field a rerun must reproduce, flattened to one key each; wall-clock and environment excluded.

    On the wall clock admission depends on speed: only the engine, the verdict and the sessions run
    alone (the reference every completed session was checked against) must be reproduced. ``split_tokens``
    gives each session's tokens and digest, and each isolation pass's token digests, keys of their own.
    ``threads`` False: the engine's thread count is left out (a rerun on the thread count the verifier chose)."""
    r = b.results
    # The engine record whole, but for where things were: RPC endpoints (free ports, new every run) and the model's
    # path (a rerun builds or assembles it in its own cache); the model's sha256 is compared, and with it what the
    # file alone gives: its vocabulary size (recorded since round 4, so a bundle from before has none to compare).
    # A GGUF engine's recipe (repacking, flash attention, and so its fingerprint) is a key of its own, compared
    # exactly unless the rerun ran another recipe (allowed only where the repacked kernels die here: meshbench.sweep.
    # run); what decided an auto setting is this machine's word (plain verify holds it to the record and the echo).
    left_out = _ENGINE_APART if threads else (*_ENGINE_APART, "threads")
    engine = {k: v for k, v in serial.to_json(r.engine).items() if k not in left_out}
    made_with = kernels.recipe(r.engine)
    out = {
        "engine": {k: v for k, v in engine.items() if made_with is None or k not in _RECIPE},
        "corruption_free": r.corruption_free,
        "saturation_concurrency": r.saturation_concurrency,
        "isolation": serial.to_json(r.isolation),
        "inputs": r.inputs,
    }
    if made_with is not None:
        out[kernels.RECIPE] = {k: engine.get(k) for k in _RECIPE}
    for j, s in enumerate(r.reference.sessions if r.reference else ()):
        out[f"reference.sessions[{j}].digest"] = s.digest
    if b.wall:
        return out
    # (on the wall clock which sessions share a batch depends on speed: so may the tokens of a batch-variant engine)
    out["batch_invariant"] = r.batch_invariant
    out.update(_split("first_divergence", r.first_divergence, ("logit_deviation", "reference_margin")))
    for i, lv in enumerate(b.levels):
        at = f"levels[{i}]"
        for k in DETERMINISTIC_LEVEL_FIELDS:
            if k != "isolation":
                out[f"{at}.{k}"] = serial.to_json(getattr(lv, k))
        out.update(_isolation(f"{at}.isolation", lv.isolation, split_tokens))
        apart = ("margins", TOKENS, "digest") if split_tokens else ("margins",)
        for j, s in enumerate(lv.sessions):
            out.update(_split(f"{at}.sessions[{j}]", s, apart))  # ids, epochs, ends, tokens; margins apart
        if lv.cache_verdict is not None:  # the own-KV replay's finding (verify recomputes the rest of the verdict)
            own = lv.cache_verdict.own_kv
            out[f"{at}.cache_verdict.own_kv"] = None if own is None else serial.to_json(own)
        for j, s in enumerate(lv.cache_off or ()):  # the level with its prefix cache off
            out.update(_split(f"{at}.cache_off[{j}]", s, apart))
        for t in lv.tick_records:  # deterministic fields only
            for k, v in serial.to_json(t).items():
                out[f"{at}.tick_records[{t.tick}].{k}"] = v
    return out


def _split(at: str, record: object | None, floats: tuple[str, ...]) -> dict[str, Any]:
    """A record as one entry without its float fields, and each float field as its own entry."""
    if record is None:
        return {at: None}
    whole = serial.to_json(record)
    out = {at: {k: v for k, v in whole.items() if k not in floats}}
    out.update({f"{at}.{k}": whole[k] for k in floats if k in whole})
    return out


def _isolation(at: str, iso: IsolationRecords, split_tokens: bool = False) -> dict[str, Any]:
    """A level's isolation records, the margin digests (floats, hashed) each its own entry, and with
    ``split_tokens`` the token digests too."""
    passes = iso.passes or []
    blank = ("margins_digest", "digest") if split_tokens else ("margins_digest",)

    def blanked(s: PassSession) -> PassSession:
        s = dataclasses.replace(s, margins_digest="")
        return dataclasses.replace(s, digest="") if split_tokens else s

    plain = dataclasses.replace(
        iso,
        passes=None
        if iso.passes is None
        else [dataclasses.replace(p, sessions=[blanked(s) for s in p.sessions]) for p in passes],
    )
    out = {at: serial.to_json(plain)}
    for k, p in enumerate(passes):
        for j, s in enumerate(p.sessions):
            for name in blank:
                out[f"{at}.passes[{k}].sessions[{j}].{name}"] = getattr(s, name)
    return out


@dataclass
class Outcome:
    """How the floats compared: on which fingerprints, the largest deviation, the digests left to the rerun;
    where the rerun's llama.cpp kernels are not the recording ones, what differed that is bound to them."""

    same_fingerprint: bool
    recorded_on: str
    rerun_on: str
    tolerance: float
    deviation: float = 0.0
    unequal_bits: int = 0
    digests_skipped: int = 0
    failed: int = 0  # records the rerun did not reproduce
    kernels: kernels.KernelReport | None = None
    threads: tuple[int | None, int] | None = None  # (recorded, rerun) where the verifier chose the rerun's threads

    def __str__(self) -> str:
        where = f"recorded on {self.recorded_on}, rerun on {self.rerun_on}"
        if self.failed:
            text = f"does not reproduce here: {self.failed} record{'s' * (self.failed != 1)} differ"
            text += f" ({where}; expected = recorded, found = rerun)"
        elif self.unequal_bits == 0 and self.digests_skipped == 0 and not (self.kernels and self.kernels.bound):
            text = f"reproduced here bit for bit ({where})"
        else:
            text = "reproduced here" + (" what does not depend on llama.cpp's kernels" if self.kernels else "")
            if self.unequal_bits:
                text += (
                    f", floats within {self.deviation:.2g} of the recorded ones (relative tolerance {self.tolerance:g}"
                    ", another compute fingerprint)"
                )
            text += f" ({where})"
        if self.digests_skipped:
            text += (
                f"; {self.digests_skipped} margin digests of isolation passes cannot be compared across kernels: "
                "the rerun's own isolation verdict compared its passes bit for bit"
            )
        if self.threads is not None:
            text += f"; rerun on {self.threads[1]} CPU thread(s), the bundle's {self.threads[0] or 'default'}"
        return text + ("" if self.kernels is None else str(self.kernels))


Own = Callable[[dict[str, Any]], Checks]  # a results document -> verify's checks of it
RERUN_COMMAND = "meshbench verify --rerun"


def check_rerun(
    c: Checks, data: dict[str, Any], rerun: Rerun, check_own: Own | None = None, threads: int | None = None
) -> Outcome:
    """The rerun's records held to the recorded ones; where llama.cpp's kernels differ, ``check_own`` (verify's
    checks of a results document) holds the rerun's own records, whose verdicts then stand for this machine.
    ``threads``: the verifier ran the rerun on that many CPU threads, not the recorded count; every record must
    reproduce all the same (llama.cpp's CPU kernels give each output to one thread: the count changes no result),
    and the engine record's thread count is held to that choice instead."""
    fresh_data = rerun(data)
    b, fresh = typed.node(data), typed.node(fresh_data)
    recorded, here = b.results.environment.compute, fresh.results.environment.compute
    report = kernels.differ(recorded, here, b.results.engine, fresh.results.engine)
    outcome = Outcome(
        same_fingerprint=recorded.digest == here.digest,
        recorded_on=fingerprint.describe(recorded),
        rerun_on=fingerprint.describe(here),
        tolerance=tolerance(b.results.engine),
        kernels=report,
    )
    split = outcome.kernels is not None
    # (the synthetic engine has no thread setting; a GGUF engine rerun on the verifier's count is held to it instead)
    chosen = threads is not None and kinds.recorded(b.results.engine.kind).llama
    if threads is not None and chosen:
        outcome.threads = (b.results.engine.threads, threads)
        c.equal(FILE, "engine.threads (as --threads asked)", threads, fresh.results.engine.threads)
    old, new = view(b, split, threads=not chosen), view(fresh, split, threads=not chosen)
    if outcome.kernels is not None:
        old[kernels.CORRUPTION_HELD] = kernels.held_corruption(b)
        new[kernels.CORRUPTION_HELD] = kernels.held_corruption(fresh)
        outcome.kernels.schedule_bound = b.tokens_drive_schedule and kernels.tokens_moved(old, new)
    before = len(c.failures)
    for k in sorted(set(old) | set(new)):
        was, now = old.get(k, "(absent)"), new.get(k, "(absent)")
        if k == kernels.RECIPE and kernels.recipe_differs(outcome.kernels):
            continue  # (the cause, said in the report; the rerun let it differ only where the repacked kernels die)
        if outcome.kernels is not None and (
            kernels.TOKEN_BOUND.search(k) or (outcome.kernels.schedule_bound and k not in kernels.SCHEDULE_FREE)
        ):
            _bound(c, outcome, outcome.kernels, k, was, now)
        elif _DIGESTS.search(k):
            _digest(c, outcome, k, was, now)
        elif _NUMBERS.search(k):
            _numbers(c, outcome, k, was, now)
        elif isinstance(was, dict) and isinstance(now, dict) and TOKENS in was and was != now:
            _session(c, outcome, b, k, was, now)
        else:
            c.equal(FILE, k, was, now)
    if outcome.kernels is not None and check_own is not None:
        # (the rerun ran one repetition, no warm-up, its prompts located here, under the recorded command: its own
        # records are checked as those of the command that made them, which names no flag to hold them to)
        own = check_own({**fresh_data, "command": RERUN_COMMAND})
        outcome.kernels.own = (own.count, len(own.failures))
        outcome.kernels.own_unchecked = list(own.until_rerun)
        c.count += own.count
        c.failures.extend(dataclasses.replace(f, file=f"{FILE}: its own records") for f in own.failures)
    if outcome.kernels is not None:
        c.kernel_bound += len(outcome.kernels.bound)
    outcome.failed = len(c.failures) - before
    return outcome


def _bound(c: Checks, o: Outcome, report: kernels.KernelReport, k: str, was: Any, now: Any) -> None:
    """A record bound to the recording kernels: compared, and a difference reported, not failed; numbers within
    the tolerance are as elsewhere on another fingerprint."""
    c.count += 1
    report.compared += 1
    if _bits(was) == _bits(now):
        return
    worst = _deviation(was, now, o.tolerance) if _NUMBERS.search(k) else None
    if worst is not None and not worst[1]:
        o.unequal_bits += 1
        o.deviation = max(o.deviation, worst[0])
        return
    report.bound.append(k)


def _digest(c: Checks, o: Outcome, k: str, was: Any, now: Any) -> None:
    if was == now or o.same_fingerprint:
        c.equal(FILE, k, was, now)
    else:
        o.digests_skipped += 1


def _numbers(c: Checks, o: Outcome, k: str, was: Any, now: Any) -> None:
    c.count += 1
    if _bits(was) == _bits(now):
        return
    o.unequal_bits += 1
    worst = _deviation(was, now, o.tolerance)
    if o.same_fingerprint:
        c.failures.append(Failure(FILE, f"{k} (bit for bit on the recording fingerprint)", was, now))
    elif worst is None:
        c.failures.append(Failure(FILE, k, was, now))
    elif worst[1]:
        c.failures.append(
            Failure(
                FILE,
                k,
                f"within relative {o.tolerance:g} of the record",
                f"off by {worst[0]:.3g} (recorded on {o.recorded_on}, rerun on {o.rerun_on})",
            )
        )
    else:
        o.deviation = max(o.deviation, worst[0])


def _bits(v: Any) -> Any:
    """Exact comparison, floats by their representation (so 0.1 and 0.1+1ulp differ, and NaN equals NaN)."""
    if isinstance(v, float):
        return ("f", v.hex())
    if isinstance(v, dict):
        return {k: _bits(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_bits(x) for x in v]
    return v


def _deviation(was: Any, now: Any, tol: float) -> tuple[float, bool] | None:
    """(largest absolute deviation, whether any number is outside tol relative to max(1, |recorded|)), or None
    where the two are not the same shape of numbers."""
    if isinstance(was, bool) or isinstance(now, bool):
        return (0.0, False) if was == now else None
    if isinstance(was, (int, float)) and isinstance(now, (int, float)):
        if not (math.isfinite(was) and math.isfinite(now)):
            return (0.0, False) if _bits(float(was)) == _bits(float(now)) else None
        d = abs(float(now) - float(was))
        return d, d > tol * max(1.0, abs(float(was)))
    if isinstance(was, list) and isinstance(now, list) and len(was) == len(now):
        parts = [_deviation(a, b, tol) for a, b in zip(was, now)]
    elif isinstance(was, dict) and isinstance(now, dict) and was.keys() == now.keys():
        parts = [_deviation(was[k], now[k], tol) for k in was]
    else:
        return (0.0, False) if was == now else None
    if any(p is None for p in parts):
        return None
    return max((p[0] for p in parts), default=0.0), any(p[1] for p in parts)  # type: ignore[index]


def _session(c: Checks, o: Outcome, b: NodeBundle, k: str, was: dict[str, Any], now: dict[str, Any]) -> None:
    """A session's exact record differs: name the first token that differs and the margin it had."""
    c.count += 1
    a, z = was.get(TOKENS) or [], now.get(TOKENS) or []
    t = next((i for i, (x, y) in enumerate(zip(a, z)) if x != y), min(len(a), len(z)))
    if a == z:
        c.failures.append(Failure(FILE, k, was, now))
        return
    margins = _margins_of(b, k)
    m = margins[t] if t < len(margins) else None
    where = "on this hardware" if not o.same_fingerprint else "on the recording fingerprint"
    c.failures.append(
        Failure(
            FILE,
            f"{k} ({was.get(SESSION_ID)})",
            f"token {t} = {a[t] if t < len(a) else '(end)'}, recorded margin {m}",
            f"{z[t] if t < len(z) else '(end)'}: does not reproduce {where} "
            f"(recorded on {o.recorded_on}, rerun on {o.rerun_on})",
        )
    )


def _margins_of(b: NodeBundle, k: str) -> list[Any]:
    m = re.fullmatch(r"levels\[(\d+)\]\.sessions\[(\d+)\]", k)
    if not m:
        return []
    return b.levels[int(m.group(1))].sessions[int(m.group(2))].margins
