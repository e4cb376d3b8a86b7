"""`meshbench bench invariance`: are llama.cpp's logits the same at batch 8 as at batch 1?

Eight sessions with prompts of 1 to 600 tokens are each prefilled alone, then decoded
either all together (one llama_decode per step) or one at a time; every step's logits
are compared. Run per context configuration: the default (flash attention off,
kv_unified off), flash attention on, and a unified KV cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from meshbench.engine.base import DecodeItem, SessionHandle
from meshbench.engine.gguf_engine import GgufEngine
from meshbench.engine.llama_model import LoadedModel

PROMPT_LENGTHS = (1, 5, 17, 40, 90, 200, 400, 600)
CONFIGS = {"default": {}, "flash_attn": {"flash_attn": True}, "kv_unified": {"kv_unified": True}}


class _LogitTap:
    """Wraps an engine's logits read so every step's row is kept, per session."""

    def __init__(self, engine: GgufEngine) -> None:
        self.rows: dict[str, list[np.ndarray]] = {}
        self._inner = engine._logits
        engine._logits = self._read
        self._current: list[str] = []

    def _read(self, i: int) -> np.ndarray:
        row = self._inner(i)
        sid = self._current[i if i >= 0 else len(self._current) - 1]
        self.rows.setdefault(sid, []).append(row)
        return row


def _run(model: LoadedModel, prompts: dict, steps: int, batched: bool, threads: int | None, **kw):
    e = GgufEngine(model, len(prompts), max(map(len, prompts.values())) + steps + 4, threads,
                   max_prompt=max(map(len, prompts.values())), **kw)
    tap = _LogitTap(e)
    toks = {}
    for sid, p in prompts.items():
        tap._current = [sid]
        toks[sid] = [e.prefill(SessionHandle(sid, 0, len(p) + steps + 1), p).token]
    for step in range(steps):
        items = [DecodeItem(sid, 0, len(p) + step, toks[sid][-1]) for sid, p in prompts.items()]
        groups = [items] if batched else [[it] for it in items]
        for group in groups:
            tap._current = sorted((it.session_id for it in group), key=lambda s: e._seq_ids[s])
            for it, r in zip(group, e.decode_batch(group)):
                toks[it.session_id].append(r.token)
    e.close()
    return toks, tap.rows


def run(model_path: Path, steps: int, threads: int | None, seed: int,
        progress: Callable[[str], None] = lambda msg: None) -> dict:
    model = LoadedModel(model_path, "cpu", verbose=False)
    rng = np.random.default_rng(seed)
    prompts = {f"s{i}": [int(t) for t in rng.integers(0, model.vocab_size, n)] for i, n in enumerate(PROMPT_LENGTHS)}
    rows = []
    for name, kw in CONFIGS.items():
        progress(f"{name}")
        tb, lb = _run(model, prompts, steps, True, threads, **kw)
        ts, ls = _run(model, prompts, steps, False, threads, **kw)
        dev = max(float(np.max(np.abs(a - b))) for sid in lb for a, b in zip(lb[sid], ls[sid]))
        rows.append({"config": name, "tokens_identical": tb == ts, "bitwise_identical": dev == 0.0,
                     "max_abs_logit_diff": dev})
    out = {"model": str(model_path), "model_sha256": model.sha256, "prompt_lengths": list(PROMPT_LENGTHS),
           "steps": steps, "threads": threads, "configs": rows}
    model.close()
    return out
