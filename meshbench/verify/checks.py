"""Every check plain verify runs on a results.json, family by family: the figures and verdicts recomputed
(``figures``), the schedule replayed from the tick records (``schedule``), the wall-clock data's plausibility
(``timing``), and the fault matrix (meshbench.analysis.fault_matrix)."""

from __future__ import annotations

from meshbench.analysis import fault_matrix as fault_checks
from meshbench.analysis.checks import Checks
from meshbench.results.typed import NodeBundle
from meshbench.verify.bursts import check_bursts
from meshbench.verify.figures import (
    check_config_copies,
    check_level_accounting,
    check_level_budget,
    check_level_figures,
    check_sweep,
)
from meshbench.verify.prefix import check_prefix
from meshbench.verify.schedule import (
    check_arrivals,
    check_feed,
    check_isolation,
    check_sessions,
    check_tick_ends,
    check_tick_replay,
)
from meshbench.verify.timing import check_repetitions, check_timing, check_wall
from meshbench.verify.turns import check_turns


def check_node(c: Checks, b: NodeBundle) -> None:
    """Every check of a node results.json that passed the schema: the raw records, and (typed once, after
    the schema) the figures and verdicts the analysis recomputes from them."""
    check_config_copies(c, b)
    typed, reference = b.levels, b.results.reference
    per_token = b.results.engine.kv_bytes_per_token
    for i, rec in enumerate(typed):
        at = f"levels[{i}]"
        check_level_figures(c, b, rec, at)
        check_level_accounting(c, b, rec, at)
        check_level_budget(c, b, rec, at)
        check_tick_replay(c, b, rec, at)
        check_arrivals(c, b, rec, at)
        check_repetitions(c, b, rec, at, i)
        check_wall(c, rec, at)
        check_feed(c, rec, at)
        check_isolation(c, b, rec, at)
        check_prefix(c, b, rec, at)
        check_turns(c, b, rec, at)
        check_timing(c, b, rec, at)
        check_tick_ends(c, b, rec, at)
        check_bursts(c, b, rec, at)
        fault_checks.check_level(c, rec, at, reference or typed[0], per_token)
    check_sessions(c, b, typed)
    check_sweep(c, b, typed, reference)
