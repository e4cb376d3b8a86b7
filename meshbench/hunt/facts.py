"""What a hunt knows of the server before it generates histories: its slots and context (from ``/props``), the
boundaries its caches and batches have, and the ids prompts are made of (a text tokenized by the server itself).

Content that a model answers confidently: a random run of ids repeated (``content``). A model continues a
repetition it has read with large margins (its induction heads), whatever the ids, so a request that reads
another's content writes that content's continuation: a confident difference, never a near-tie. Each request
draws its own run, so two requests share content only where a strategy puts it there."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCKS = (16, 32, 64, 256)  # cache and attention block sizes servers use (llama.cpp's KV cells are per token)
N_UBATCH, N_BATCH = 512, 2048  # llama-server's defaults for its micro-batch and logical batch
PERIOD = (5, 12)  # a repeated run is this many ids long (drawn)


@dataclass(frozen=True, slots=True)
class Facts:
    slots: int  # parallel sequences the server runs (its total_slots; 1 where it does not say)
    n_ctx: int  # context of one slot, in tokens (where the server does not say: 4096)
    head: tuple[int, ...]  # what every prompt starts with: the BOS the server adds to a tokenized text
    pool: tuple[int, ...]  # ids prompts are drawn from (after the head)
    n_batch: int = N_BATCH
    n_ubatch: int = N_UBATCH

    def boundaries(self, room: int) -> list[int]:
        """Every boundary the server has, each and its neighbours, that a prompt of at most ``room`` ids can
        cross: the blocks, the micro-batch and the batch."""
        sizes = {*BLOCKS, self.n_ubatch, self.n_batch}
        return sorted({b + d for b in sizes for d in (-1, 0, 1) if len(self.head) + 2 <= b + d <= room})


def content(rng: np.random.Generator, facts: Facts, n: int) -> list[int]:
    """``n`` ids of content: a run of PERIOD ids drawn from the pool, repeated (and cut) to the length."""
    if n <= 0:
        return []
    period = int(rng.integers(PERIOD[0], PERIOD[1] + 1))
    run = [int(facts.pool[k]) for k in rng.integers(0, len(facts.pool), size=period)]
    return [run[k % period] for k in range(n)]


def prompt(rng: np.random.Generator, facts: Facts, n: int) -> list[int]:
    """A whole prompt of ``n`` ids (the head included): the head, then content."""
    return [*facts.head, *content(rng, facts, n - len(facts.head))]


def from_props(props: dict[str, object] | None, head: list[int], pool: list[int]) -> Facts:
    """The facts from llama-server's ``/props`` (its total_slots, and its default generation settings' n_ctx: one
    slot's context), else the defaults."""
    props = props if isinstance(props, dict) else {}
    slots = props.get("total_slots")
    settings = props.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    return Facts(
        slots=slots if isinstance(slots, int) and 1 <= slots <= 256 else 1,
        n_ctx=n_ctx if isinstance(n_ctx, int) and 64 <= n_ctx <= 1 << 20 else 4096,
        head=tuple(head),
        pool=tuple(pool),
    )
