"""What a hunt reads of the server before it draws histories: its slots and context from ``/props``
(meshbench.records.history.Facts)."""

from __future__ import annotations

from meshbench.records.history import Facts


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
