"""``meshbench admit``: will these sessions fit on this node?"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from meshbench import limits
from meshbench.cli import options
from meshbench.cli.common import (
    ArrivalsOpt,
    ConfigOpt,
    EngineOpt,
    JsonOpt,
    ModelOpt,
    NewOpt,
    PrefillOpt,
    PresetOpt,
    PromptOpt,
    PromptsOpt,
    RpcOpt,
    SeedOpt,
    SessionsOpt,
    WorkersOpt,
    drop_none,
    out,
    print_json,
    table,
)
from meshbench.cli.options import flag
from meshbench.sweep import admit as admission
from meshbench.workload import config as config_mod
from meshbench.workload.yaml_config import merge


def admit(
    config: ConfigOpt = None,
    engine: EngineOpt = None,
    preset: PresetOpt = None,
    model: ModelOpt = None,
    sessions: SessionsOpt = None,
    prompt_tokens: PromptOpt = None,
    prompts: PromptsOpt = None,
    new_tokens: NewOpt = None,
    burst: Annotated[
        Optional[int],
        typer.Option(
            "--burst", min=1, max=limits.MAX_SESSIONS, help="Submit N sessions shaped like the first of the workload."
        ),
    ] = None,
    arrivals: ArrivalsOpt = None,
    rpc: RpcOpt = None,
    workers: WorkersOpt = None,
    kv_bytes: Annotated[
        Optional[int], typer.Option("--kv-bytes", min=1, max=limits.MAX_BYTES, help="Node KV budget in bytes.")
    ] = None,
    scratch_bytes: Annotated[Optional[int], typer.Option("--scratch-bytes", min=1, max=limits.MAX_BYTES)] = None,
    weight_bytes: Annotated[Optional[int], typer.Option("--weight-bytes", min=1, max=limits.MAX_BYTES)] = None,
    max_active: Annotated[Optional[int], typer.Option("--max-active-sessions", min=1, max=limits.MAX_SESSIONS)] = None,
    max_queue_depth: Annotated[Optional[int], flag("--max-queue-depth", min=0, max=limits.MAX_SESSIONS)] = None,
    max_batch_size: Annotated[Optional[int], typer.Option("--max-batch-size", min=1, max=limits.MAX_SESSIONS)] = None,
    seed: SeedOpt = None,
    prefill: PrefillOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Will these sessions fit on this node? Print every admission decision and the numbers behind it."""
    budget = {  # admit's own flags: the node's whole budget
        "kv_bytes": kv_bytes,
        "scratch_bytes": scratch_bytes,
        "weight_bytes": weight_bytes,
        "max_active_sessions": max_active,
        "max_batch_size": max_batch_size,
    }
    overrides = merge(options.overrides(locals()), drop_none({"budget": budget}))
    cfg = config_mod.load(config, overrides)
    result = admission.run(cfg, burst)
    if as_json:
        print_json(result.to_json())
        return
    t = table(
        f"admission on a node with {result.effective_active_cap} active slots, "
        f"queue depth {cfg.budget.max_queue_depth}, arrivals {result.arrivals}",
        (
            "tick",
            "session",
            "decision",
            "KV needed",
            "KV budget",
            "scratch needed",
            "scratch budget",
            "active",
            "queued",
        ),
    )
    for x in result.decisions:
        d, reason = x.decision, x.decision.reason.value
        color = "green" if reason == "ADMITTED" else "yellow" if reason == "QUEUED" else "red"
        t.add_row(
            str(x.tick),
            d.session_id,
            f"[{color}]{reason}[/]",
            str(d.kv_needed_bytes),
            str(d.kv_budget_bytes),
            str(d.scratch_needed_bytes),
            str(d.scratch_budget_bytes),
            f"{d.active_sessions}/{d.active_cap}",
            f"{d.queue_depth}/{d.max_queue_depth}",
        )
    out.print(t)
    out.print(" ".join(f"{k}={v}" for k, v in result.telemetry.to_dict().items()))
