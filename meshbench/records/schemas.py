"""The schema sections written from the records' own fields: the config schema's budget section and the results
schema's budget record (``meshbench.records.context.budget_schema``), and its two tick records
(``meshbench.records.tick.tick_schema``). ``python -m meshbench.records.schemas``
writes them into schemas/; ``tests/test_records.py`` fails where a file is not what this would write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from meshbench.records.context import budget_schema
from meshbench.records.tick import tick_schema

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"

# (file, the path to the section inside it, what the section is)
SECTIONS: list[tuple[str, tuple[str, ...], Callable[[], dict[str, Any]]]] = [
    ("config.schema.json", ("properties", "budget"), lambda: budget_schema(required=False)),
    ("results.schema.json", ("$defs", "budget"), lambda: budget_schema(required=True)),
    ("results.schema.json", ("$defs", "tick_record"), lambda: tick_schema(timed=False)),
    ("results.schema.json", ("$defs", "timed_tick_record"), lambda: tick_schema(timed=True)),
]


def stale(root: Path = SCHEMAS) -> list[str]:
    """The sections a schema file holds otherwise than the records would write them, as ``file: a/b``."""
    out = []
    for name, at, section in SECTIONS:
        node: Any = json.loads((root / name).read_text())
        for key in at:
            node = node.get(key) if isinstance(node, dict) else None
        if node != section():
            out.append(f"{name}: {'/'.join(at)}")
    return out


def write(root: Path = SCHEMAS) -> None:
    for name, at, section in SECTIONS:
        path = root / name
        text = path.read_text()
        schema = node = json.loads(text)
        for key in at[:-1]:
            node = node[key]
        node[at[-1]] = section()
        second = text.split("\n", 2)[1]
        indent = len(second) - len(second.lstrip(" "))  # (the file's own)
        path.write_text(json.dumps(schema, indent=indent, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    write()
