"""The options of the other panels (config, workload, load, repetitions, faults, output), one row each."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from meshbench import limits
from meshbench.cli.flags import Option, _cancel, _levels, _rates, _rows, _slo, _text, int_list, per_session

RUN = (
    Option("config", Optional[Path], typer.Option("--config", help="YAML run config (see configs/).")),
    Option(
        "sessions",
        Optional[int],
        typer.Option(
            "--sessions", rich_help_panel="Workload", min=1, max=limits.MAX_SESSIONS, help="Number of sessions."
        ),
        paths=("workload.sessions",),
    ),
    Option(
        "prompt_tokens",
        Optional[str],
        typer.Option(
            "--prompt-tokens",
            rich_help_panel="Workload",
            help="Prompt length: one number, or one per session (4,8,...).",
        ),
        paths=("workload.prompt_tokens",),
        parse=per_session,
    ),
    Option(
        "prefix_groups",
        Optional[str],
        typer.Option(
            "--prefix-groups",
            rich_help_panel="Workload",
            help="Shared prefixes: consecutive sessions in groups of these sizes (5,2,1), each group's prompts "
            "starting with the same --prefix-tokens ids; --prompt-tokens are then each session's own.",
        ),
        paths=("workload.prefix.groups",),
        parse=lambda v, flag: int_list(v, flag, maximum=limits.MAX_SESSIONS, max_items=limits.MAX_SESSIONS),
    ),
    Option(
        "prefix_tokens",
        Optional[int],
        typer.Option(
            "--prefix-tokens",
            rich_help_panel="Workload",
            min=1,
            max=limits.MAX_TOKENS,
            help="The length of each group's shared prefix (with --prefix-groups).",
        ),
        paths=("workload.prefix.tokens",),
    ),
    Option(
        "turns",
        Optional[int],
        typer.Option(
            "--turns",
            rich_help_panel="Workload",
            min=1,
            max=64,
            help="Conversations: turns per session; each later turn's prompt is the whole conversation so far "
            "and --turn-tokens new user ids (with --prompts: the user's next message, each JSON line's 'turns'; "
            "an endpoint's over --api native, the growing ids, or chat, the messages so far).",
        ),
        paths=("workload.turns",),
    ),
    Option(
        "turn_tokens",
        Optional[int],
        typer.Option(
            "--turn-tokens", rich_help_panel="Workload", min=1, max=65536, help="New user ids in each later turn."
        ),
        paths=("workload.turn_tokens",),
    ),
    Option(
        "cancel",
        Optional[str],
        typer.Option(
            "--cancel",
            rich_help_panel="Workload",
            help="An endpoint sweep's cancel-and-retry run: every second session disconnects after this many "
            "tokens and retries; auto (half the shortest answer, the default) or off.",
        ),
        paths=("workload.cancel",),
        parse=_cancel,
    ),
    Option(
        "new_tokens",
        Optional[str],
        typer.Option("--new-tokens", rich_help_panel="Workload", help="New tokens: one number, or one per session."),
        paths=("workload.new_tokens",),
        parse=per_session,
    ),
    Option(
        "seed",
        Optional[int],
        typer.Option("--seed", rich_help_panel="Workload", min=0, help="Seed of the prompts and of synthetic weights."),
        paths=(
            "engine.seed",
            "workload.seed",
        ),
    ),
    Option(
        "as_json",
        bool,
        default=False,
        option=typer.Option("--json", rich_help_panel="Output", help="Print JSON on stdout and nothing else."),
    ),
    Option(
        "prompts",
        Optional[Path],
        typer.Option(
            "--prompts",
            rich_help_panel="Workload",
            help="Real prompts: a file of text lines, or JSONL with a 'prompt' field (and a shared 'prefix', a "
            "system prompt, with --prefix-groups), one per session, tokenized by the GGUF model's own tokenizer.",
        ),
        paths=("workload.prompts",),
        parse=_text,
    ),
    Option(
        "rates",
        Optional[str],
        typer.Option(
            "--rates",
            rich_help_panel="Load",
            help="Arrival rates (sessions per tick; per second on --clock wall) of the poisson or gamma process, "
            "each a level (crossed with --levels), e.g. 0.25,0.5,1,2; for an endpoint (with --clock wall), each an "
            "open-loop pass after the closed-loop levels.",
        ),
        paths=("rates",),
        parse=_rates,
    ),
    Option(
        "max_queue_depth",
        Optional[int],
        typer.Option(
            "--max-queue-depth",
            rich_help_panel="Load",
            min=0,
            max=limits.MAX_SESSIONS,
            help="The node's queue (arrivals over time; all at once, the queue holds every session).",
        ),
        paths=("budget.max_queue_depth",),
    ),
    Option(
        "slo_ttft",
        Optional[float],
        typer.Option(
            "--slo-ttft",
            rich_help_panel="Load",
            callback=_slo,
            help="Goodput SLO: arrival to first token, in ticks (ms on --clock wall).",
        ),
        paths=("slo.ttft",),
    ),
    Option(
        "slo_tpot",
        Optional[float],
        typer.Option(
            "--slo-tpot",
            rich_help_panel="Load",
            callback=_slo,
            help="Goodput SLO: mean gap between tokens after the first, in ticks (ms on --clock wall).",
        ),
        paths=("slo.tpot",),
    ),
    Option(
        "clock",
        Optional[str],
        typer.Option(
            "--clock",
            rich_help_panel="Load",
            help="tick (default: arrivals in ticks, exact and re-checkable) | wall (rates per second, "
            "admission depends on speed: reported).",
        ),
        paths=("clock",),
    ),
    Option(
        "repeat",
        Optional[int],
        typer.Option(
            "--repeat",
            rich_help_panel="Repetitions",
            min=1,
            max=100,
            help="Recorded passes per level, interleaved (5 or more for a strong compare verdict).",
        ),
        paths=("repeat",),
    ),
    Option(
        "warmup",
        Optional[int],
        typer.Option(
            "--warmup",
            rich_help_panel="Repetitions",
            min=0,
            max=10,
            help="Unrecorded passes per level first (default 1).",
        ),
        paths=("warmup",),
    ),
    Option(
        "prefill",
        Optional[str],
        typer.Option(
            "--prefill",
            rich_help_panel="Workload",
            help="whole (default: whole prompts within the prefill budget, the first always runs) | chunked "
            "(the budget filled exactly, the last prompt split and continued next tick) | burst | chunked-burst "
            "(whole or chunked, and every waiting prompt in a tick where no session decodes).",
        ),
        paths=("prefill",),
    ),
    Option(
        "eos",
        Optional[str],
        typer.Option(
            "--eos",
            rich_help_panel="Workload",
            help="End of sequence: stop (the default with --prompts; ban with --prompts and --turns) | ban "
            "(llama-server's ignore_eos) | continue.",
        ),
        paths=("workload.eos",),
    ),
    Option(
        "isolation",
        Optional[bool],
        typer.Option(
            "--isolation/--no-isolation",
            rich_help_panel="Output",
            help="Prove isolation at every level by perturbation passes (default on).",
        ),
        paths=("isolation",),
    ),
    Option(
        "isolation_rounds",
        Optional[int],
        typer.Option(
            "--isolation-rounds",
            min=1,
            max=64,
            rich_help_panel="Output",
            help="Test every ordered pair of sessions in at least this many perturbation passes, fresh content "
            "every pass: a dependence on one bit of a neighbour's content escapes n passes with probability 2^-n "
            "(default 4).",
        ),
        paths=("isolation_rounds",),
    ),
    Option(
        "isolation_family",
        Optional[str],
        typer.Option(
            "--isolation-family",
            rich_help_panel="Output",
            help="constant-weight (default: one code testing every ordered pair of sessions --isolation-rounds "
            "times, in fewer passes where one is found: up to 30 sessions at 4 rounds, 72 at 3, 255 at 2; else the "
            "repeated family) | repeated (the smallest separating family, run --isolation-rounds times).",
        ),
        paths=("isolation_family",),
    ),
    Option(
        "inject",
        Optional[list[str]],
        typer.Option(
            "--inject",
            rich_help_panel="Faults",
            help="A fault row, KIND[:TARGET]@TICK[,...], run at every level; repeat the flag for more rows. "
            "Kinds: cancel:SESSION, evict:SESSION, raise:prefill, raise:decode, kill-engine, abort-engine, "
            "kill-worker:I.",
        ),
        paths=("faults",),
        parse=_rows,
    ),
    Option(
        "restart_engine",
        Optional[bool],
        typer.Option(
            "--restart-engine/--no-restart-engine",
            rich_help_panel="Faults",
            help="After an engine loss: start a fresh engine (and fresh spawned "
            "workers) and resubmit the lost sessions under a new epoch.",
        ),
        paths=("restart_engine",),
    ),
    Option(
        "arrivals",
        Optional[str],
        typer.Option(
            "--arrivals",
            rich_help_panel="Load",
            help="all-at-once (default) | poisson:RATE | gamma:RATE:CV | trace:T0,T1,... | trace:FILE "
            "(rates in sessions per tick; per second on --clock wall).",
        ),
        paths=("workload.arrivals",),
    ),
    Option(
        "levels",
        Optional[str],
        typer.Option(
            "--levels",
            help="Concurrency levels, e.g. 1,2,4,8. Each must be >= 1 and at most the session count: "
            "a higher level is refused, not clamped.",
        ),
        paths=("levels",),
        parse=_levels,
    ),
    Option(
        "max_prefill_tokens_per_tick",
        Optional[int],
        typer.Option(
            "--max-prefill-tokens-per-tick",
            rich_help_panel="Workload",
            min=1,
            max=limits.MAX_TOKENS,
            help="Prompt tokens prefilled per tick (first always runs).",
        ),
        paths=("budget.max_prefill_tokens_per_tick",),
    ),
    Option(
        "out_dir",
        Optional[Path],
        typer.Option("--out", rich_help_panel="Output", help="Write an evidence bundle to this folder."),
    ),
    Option(
        "force",
        bool,
        typer.Option("--force", rich_help_panel="Output", help="Replace an existing bundle at --out."),
        default=False,
    ),
    Option(
        "verbose",
        bool,
        typer.Option("--verbose", rich_help_panel="Output", help="Let llama.cpp print its own log."),
        default=False,
    ),
)
