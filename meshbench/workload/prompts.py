"""Real prompts for a workload: a file of text lines, or of JSON lines with a ``prompt`` field (and a shared
``prefix``, a system prompt; a conversation's later user ``turns``), one per session in order, tokenized by the GGUF
model's own tokenizer (its BOS added as it says)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from meshbench import files
from meshbench.engine import packaged
from meshbench.engine.llama_model import tokenize
from meshbench.errors import MeshbenchError
from meshbench.workload.config import RunConfig

MAX_PROMPTS_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class Entry:
    """One session's prompt: its text, the system prompt its group shares (or None), and a conversation's later
    user turns, in order (none for one turn)."""

    prefix: str | None
    prompt: str
    turns: tuple[str, ...] = ()


def read(path: str, turns: int = 1) -> list[str]:
    """The prompts' whole texts, in order (a JSON line's ``prefix`` and ``prompt`` together), for a server to
    tokenize; a conversation's later ``turns`` are read by ``later_turns``."""
    entries = read_entries(path)
    later_turns(entries, turns, path)  # (lines with turns need workload.turns, and enough of them)
    return [(e.prefix or "") + e.prompt for e in entries]


def later_turns(entries: list[Entry], turns: int, path: str) -> list[tuple[str, ...]] | None:
    """Each line's later user turns for a conversation of ``turns`` turns (the first turns - 1 of its ``turns``);
    None for one turn."""
    if turns == 1:
        if entries[0].turns:
            raise MeshbenchError(
                f"workload.prompts {path}: its lines have 'turns': give workload.turns (the turns each session runs)"
            )
        return None
    short = [i for i, e in enumerate(entries, 1) if len(e.turns) < turns - 1]
    if short:
        raise MeshbenchError(
            f"workload.prompts {path}: workload.turns {turns} needs {turns - 1} later 'turns' on each line; "
            f"line {short[0]} has {len(entries[short[0] - 1].turns)}"
        )
    return [e.turns[: turns - 1] for e in entries]


def read_entries(path: str) -> list[Entry]:
    """The prompts, in order: JSONL when every non-empty line is a JSON object with a string ``prompt`` (and, on
    every line or none, a string ``prefix`` and a list of strings ``turns``), else one prompt per non-empty line."""
    text = files.read_text(files.regular_file(path, "workload.prompts"), "workload.prompts", MAX_PROMPTS_BYTES)
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise MeshbenchError(f"workload.prompts {path}: no prompts in it")
    if not lines[0].lstrip().startswith("{"):
        return [Entry(None, line) for line in lines]
    entries = [_entry(path, i, line) for i, line in enumerate(lines, 1)]
    for name, given in (
        ("prefix", {e.prefix is not None for e in entries}),
        ("turns", {bool(e.turns) for e in entries}),
    ):
        if len(given) > 1:
            raise MeshbenchError(f"workload.prompts {path}: give a '{name}' on every line or on none")
    return entries


def _entry(path: str, i: int, line: str) -> Entry:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        obj = None
    prompt = obj.get("prompt") if isinstance(obj, dict) else None
    if not isinstance(prompt, str) or not prompt:
        raise MeshbenchError(f"workload.prompts {path}: line {i} is not a JSON object with a non-empty string 'prompt'")
    assert isinstance(obj, dict)
    prefix = obj.get("prefix")
    if prefix is not None and (not isinstance(prefix, str) or not prefix):
        raise MeshbenchError(f"workload.prompts {path}: line {i}'s 'prefix' is not a non-empty string")
    turns = obj.get("turns", [])
    if not isinstance(turns, list) or not turns and "turns" in obj or not all(isinstance(t, str) and t for t in turns):
        raise MeshbenchError(
            f"workload.prompts {path}: line {i}'s 'turns' is not a list of non-empty strings (the user's later turns)"
        )
    for text in (prompt, prefix or "", *turns):  # (a lone surrogate from a \ud800 escape is no UTF-8)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise MeshbenchError(f"workload.prompts {path}: line {i} has text that is not UTF-8 (a lone surrogate)")
    return Entry(prefix, prompt, tuple(turns))


def apply(cfg: RunConfig) -> RunConfig:
    """The config's real inputs made concrete: a packaged model's file (engine.package) as engine.model, and
    its sessions' prompts tokenized (prompt_tokens = their lengths); unchanged without either. A config
    echo whose lengths the file no longer gives is refused."""
    if cfg.engine.package:
        model = str(packaged.path(cfg.engine.package))
        cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, model=model))
    wl = cfg.workload
    if wl.prompts is None:
        return cfg
    entries = read_entries(wl.prompts)
    if len(entries) < wl.sessions:
        raise MeshbenchError(f"workload.prompts {wl.prompts}: {len(entries)} prompts for {wl.sessions} sessions")
    entries = entries[: wl.sessions]
    if wl.prefix_groups and entries[0].prefix is None:
        raise MeshbenchError(
            f"workload.prompts {wl.prompts}: workload.prefix with real prompts needs JSONL lines with a 'prefix' "
            "(the text each group shares)"
        )
    texts = [e.prompt for e in entries]
    ids = _ids(cfg, entries) if entries[0].prefix is not None else tokenize(_model(cfg), texts)
    lengths = tuple(len(x) for x in ids)
    if wl.turn_lengths is not None and not cfg.source.startswith("results.json"):
        raise MeshbenchError(
            f"workload.turn_tokens: with real prompts leave it out (a bundle's echo writes the turns' lengths there; "
            f"the turns come from {wl.prompts})"
        )
    turn_ids = _turn_ids(cfg, entries)
    turn_lengths = None if turn_ids is None else tuple(tuple(len(t) for t in x) for x in turn_ids)
    recorded = wl.turn_lengths if wl.turn_lengths is not None else turn_lengths
    if cfg.source.startswith("results.json") and (lengths != wl.prompt_tokens or turn_lengths != recorded):
        raise MeshbenchError(
            f"workload.prompts {wl.prompts}: its prompts now tokenize to other lengths than "
            "the bundle recorded (the file or the model changed)"
        )
    wl = dataclasses.replace(
        wl, prompt_tokens=lengths, prompt_ids=tuple(ids), turn_lengths=turn_lengths, turn_ids=turn_ids
    )
    return dataclasses.replace(cfg, workload=wl)


def _turn_ids(cfg: RunConfig, entries: list[Entry]) -> tuple[tuple[tuple[int, ...], ...], ...] | None:
    """A conversation's later user turns (workload.turns > 1), each tokenized without BOS (it continues the
    conversation): the first turns - 1 of each line's ``turns``; None for one turn."""
    wl, path = cfg.workload, cfg.workload.prompts
    later = later_turns(entries, wl.turns, str(path))
    if later is None:
        return None
    texts = [t for x in later for t in x]
    flat = iter(tokenize(_model(cfg), texts, bos=False))
    out = tuple(tuple(next(flat) for _ in range(wl.turns - 1)) for _ in entries)
    empty = [(k, j) for k, x in enumerate(out) for j, t in enumerate(x) if not t]
    if empty:
        raise MeshbenchError(
            f"workload.prompts {path}: line {empty[0][0] + 1}'s turn {empty[0][1] + 2} tokenizes to no ids"
        )
    return out


def _ids(cfg: RunConfig, entries: list[Entry]) -> list[tuple[int, ...]]:
    """Prompts with shared prefixes (system prompts): each group's prefix (workload.prefix.groups, consecutive
    lines) is one text, whose first workload.prefix.tokens ids (BOS first) start each of its prompts; the
    prompt's own ids follow, tokenized without BOS."""
    wl, path = cfg.workload, cfg.workload.prompts
    if not wl.prefix_groups:
        raise MeshbenchError(
            f"workload.prompts {path}: its lines have a 'prefix': give workload.prefix.groups (the sessions that "
            "share each) and workload.prefix.tokens"
        )
    texts, start = [], 0
    for g, size in enumerate(wl.prefix_groups):
        group = {e.prefix for e in entries[start : start + size]}
        if len(group) != 1:
            raise MeshbenchError(
                f"workload.prompts {path}: lines {start + 1} to {start + size} are prefix group {g} but their "
                "'prefix' texts differ"
            )
        texts.append(group.pop() or "")
        start += size
    heads = tokenize(_model(cfg), texts)
    short = [(g, len(h)) for g, h in enumerate(heads) if len(h) < wl.prefix_tokens]
    if short:
        raise MeshbenchError(
            f"workload.prompts {path}: prefix group {short[0][0]}'s text is {short[0][1]} tokens, fewer than "
            f"workload.prefix.tokens {wl.prefix_tokens}"
        )
    cut = [h[: wl.prefix_tokens] for h in heads]
    same = [(cut.index(h), g) for g, h in enumerate(cut) if cut.index(h) != g]
    if same:
        raise MeshbenchError(
            f"workload.prompts {path}: prefix groups {same[0][0]} and {same[0][1]} start with the same "
            f"{wl.prefix_tokens} ids: make them one group (the isolation proof perturbs each group's prefix alone)"
        )
    own = tokenize(_model(cfg), [e.prompt for e in entries], bos=False)
    sizes = [h for h, size in zip(cut, wl.prefix_groups) for _ in range(size)]
    return [head + mine for head, mine in zip(sizes, own)]


def _model(cfg: RunConfig) -> str:
    """The GGUF model whose tokenizer real prompts go through (a config with prompts names one)."""
    if cfg.engine.model is None:
        raise MeshbenchError("workload.prompts: real prompts need engine.model, a GGUF model with a tokenizer")
    return cfg.engine.model
