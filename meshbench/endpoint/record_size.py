"""How much an endpoint sweep could record, bounded before anything is sent: every token a sweep's passes may
record (an id, a stamp and its text, some 30 bytes each), so that a results.json stays within what verify loads."""

from __future__ import annotations

from meshbench.endpoint import perturb
from meshbench.errors import MeshbenchError
from meshbench.workload import open_loop as open_loop_plan
from meshbench.workload.config import RunConfig

# Tokens an endpoint sweep may record (each an id, a stamp and its text, some 30 bytes): beyond this results.json
# would grow past what verify loads, so such a sweep is refused before it sends anything.
MAX_RECORDED_TOKENS = 4_000_000


def check_record_size(cfg: RunConfig) -> None:
    new = cfg.workload.new_tokens
    passes = len(cfg.levels) * cfg.repeat
    turns = cfg.workload.turns  # (a conversation's every turn each pass, and its later ones once more, cold)
    bound = sum(new) * (passes * turns + turns - 1) + new[0] * (passes + 1)  # every session, the needle's trials
    bound += 4 * sum(new)  # the margin passes (cold, warm, together, after a sibling)
    tests = 1 if cfg.engine.cache_prompt == "off" else 2  # (again through the prompt cache where the sweep uses it)
    bound += tests * sum(2 * perturb.RUNS * ((c + 1) // 2) * max(new) for c in cfg.levels if c > 1)  # perturbation
    bound += sum(cfg.levels) * max(new)  # the canary runs
    bound += sum(3 * c * max(new) for c in cfg.levels if c > 1)  # the cancel runs: reference, cut, answers
    bound += sum(new) * cfg.repeat * len(cfg.rates or ())  # the open-loop passes
    if cfg.rates is not None:  # (their arrivals drawn now: a rate too low for its sessions is refused at once)
        open_loop_plan.plan(cfg.workload.arrivals, cfg.rates, cfg.workload.sessions, cfg.workload.seed)
    if bound > MAX_RECORDED_TOKENS:
        raise MeshbenchError(
            f"this endpoint sweep could record up to {bound} tokens ({len(new)} sessions, {len(cfg.levels)} levels, "
            f"{cfg.repeat} repetition(s)), more than the {MAX_RECORDED_TOKENS} a results.json can hold: sweep fewer "
            "sessions, new tokens, levels or repetitions"
        )
