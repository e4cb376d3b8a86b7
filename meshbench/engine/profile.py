"""Where an engine's time goes, by part (meshbench bench breakdown)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Profile:
    """Nanoseconds an engine spent, by part: llama_decode for the decode batch and for prompts, and reading
    logits and sampling (``rows`` sampled)."""

    decode_llama_ns: int = 0
    prefill_llama_ns: int = 0
    sample_ns: int = 0
    rows: int = 0

    def add(self, part: str, ns: int, rows: int = 0) -> None:
        setattr(self, part, getattr(self, part) + ns)
        self.rows += rows
