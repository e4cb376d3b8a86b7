"""evidence/OLDER.json: endpoint bundles of the older schema (3), each results.json pinned by its sha256, which
verify --older reads under their own rules. A pin is a digest: a bundle forged to look older has another one, and a
changed pin shows in its commit."""

from __future__ import annotations

import json
import re
from pathlib import Path

from meshbench import files
from meshbench.errors import MeshbenchError

KEY = "endpoint_schema_3"  # results.json paths (from the repository's root) -> their sha256
DIGEST = re.compile(r"[0-9a-f]{64}")


def read(path: Path) -> set[str]:
    """The pinned digests, or one line naming what is wrong with the file."""
    try:
        doc = json.loads(files.read_text(path, "--older", 1 << 20))
    except ValueError:
        raise MeshbenchError(f"--older {path}: not JSON") from None
    pinned = doc.get(KEY) if isinstance(doc, dict) else None
    if not isinstance(pinned, dict) or not all(isinstance(v, str) and DIGEST.fullmatch(v) for v in pinned.values()):
        raise MeshbenchError(f"--older {path}: expected {{{KEY!r}: {{results.json path: its sha256}}}}")
    return set(pinned.values())


def pin(paths: list[Path], root: Path) -> dict[str, dict[str, str]]:
    """The document pinning ``paths`` (results.json files) as they are now."""
    return {KEY: {str(p.relative_to(root)): files.sha256(p) for p in sorted(paths)}}
