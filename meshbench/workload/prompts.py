"""Real prompts for a workload: a file of text lines, or of JSON lines with a ``prompt`` field, one
per session in order, tokenized by the GGUF model's own tokenizer (its BOS added as it says)."""

from __future__ import annotations

import dataclasses
import json

from meshbench import files
from meshbench.engine import packaged
from meshbench.engine.llama_model import tokenize
from meshbench.errors import MeshbenchError
from meshbench.workload.config import RunConfig

MAX_PROMPTS_BYTES = 64 << 20


def read(path: str) -> list[str]:
    """The prompts, in order: JSONL when every non-empty line is a JSON object with a string ``prompt``,
    else one prompt per non-empty line."""
    text = files.read_text(files.regular_file(path, "workload.prompts"), "workload.prompts", MAX_PROMPTS_BYTES)
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise MeshbenchError(f"workload.prompts {path}: no prompts in it")
    if not lines[0].lstrip().startswith("{"):
        return lines
    prompts = []
    for i, line in enumerate(lines, 1):
        try:
            prompt = json.loads(line).get("prompt")
        except (ValueError, AttributeError):
            prompt = None
        if not isinstance(prompt, str) or not prompt:
            raise MeshbenchError(
                f"workload.prompts {path}: line {i} is not a JSON object with a non-empty string 'prompt'"
            )
        prompts.append(prompt)
    return prompts


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
    texts = read(wl.prompts)
    if len(texts) < wl.sessions:
        raise MeshbenchError(f"workload.prompts {wl.prompts}: {len(texts)} prompts for {wl.sessions} sessions")
    ids = tokenize(cfg.engine.model, texts[: wl.sessions])
    lengths = tuple(len(x) for x in ids)
    if cfg.source.startswith("results.json") and lengths != wl.prompt_tokens:
        raise MeshbenchError(
            f"workload.prompts {wl.prompts}: its prompts now tokenize to other lengths than "
            "the bundle recorded (the file or the model changed)"
        )
    return dataclasses.replace(cfg, workload=dataclasses.replace(wl, prompt_tokens=lengths, prompt_ids=tuple(ids)))
