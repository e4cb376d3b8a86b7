"""A matrix of server settings (``engine.server_settings``): one endpoint sweep per setting, each a bundle of its
own in a folder of the matrix's bundle. Here, what names them: a setting's folder, the flags its server ran with,
and the command that makes its bundle alone. Pure text, so verify checks a matrix with the code that made it."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from meshbench.errors import MeshbenchError

DEFAULTS = "defaults"  # the folder of the setting that adds no flag: the server as the matrix's flags leave it
# The flags a setting's own command sets again, each with its value (--out, the flags and the matrix's list),
# and the switches it drops (a setting's bundle is written fresh, its summary printed).
SET_AGAIN = ("--out", "--server-args", "--server-settings")
DROPPED = ("--force", "--json")


def folder(flags: str) -> str:
    """A setting's folder: its flags as one lower-case word (``-np 1`` is ``np-1``, ``--cache-ram 0`` is
    ``cache-ram-0``), ``defaults`` for none."""
    words = [w.lstrip("-") for w in split(flags)]
    name = re.sub(r"[^a-z0-9]+", "-", "-".join(words).lower()).strip("-")  # (no dot: never a bundle's file)
    return name[:80] or DEFAULTS


def check_folders(settings: tuple[str, ...]) -> None:
    """Each setting its own folder: two that name one (``-np 1`` and `` -np  1``) are one setting given twice."""
    folders: dict[str, str] = {}
    for flags in settings:
        name = folder(flags)
        if name in folders:
            raise MeshbenchError(
                f"engine.server_settings {folders[name]!r} and {flags!r}: the same setting (folder {name}); "
                "give each once"
            )
        folders[name] = flags


def split(flags: str) -> list[str]:
    """A setting's flags as a shell splits them (an unterminated quote is one line)."""
    try:
        return shlex.split(flags)
    except ValueError as e:
        raise MeshbenchError(f"server settings {flags!r}: {e}") from None


def server_args(base: str | None, flags: str) -> str:
    """The flags a setting's server runs with: the matrix's own (``engine.server_args``), then the setting's."""
    return shlex.join([*split(base or ""), *split(flags)])


def sub_command(command: str, base: str | None, flags: str) -> str:
    """The command that makes one setting's bundle alone: the matrix's command, its --out the setting's folder in
    the matrix's, its --server-args the setting's whole flags, and no matrix (``--server-settings '[]'``)."""
    try:
        words = shlex.split(command)
    except ValueError as e:
        raise MeshbenchError(f"the matrix's command: {e}") from None
    kept, out, k = [], None, 0
    while k < len(words):
        w = words[k]
        flag, eq, value = w.partition("=")
        if flag in SET_AGAIN:
            if flag == "--out":
                out = value if eq else (words[k + 1] if k + 1 < len(words) else None)
            k += 1 if eq else 2
            continue
        if w not in DROPPED:
            kept.append(w)
        k += 1
    if not out:
        raise MeshbenchError("a matrix of server settings writes one bundle per setting into --out: give --out")
    kept += ["--server-args", server_args(base, flags), "--server-settings", "[]"]
    kept += ["--out", str(Path(out) / folder(flags))]
    return " ".join(shlex.quote(w) for w in kept)


def parse(value: str, flag: str) -> list[str]:
    """``--server-settings``: a JSON list of flag strings, e.g. ``'["", "-np 1"]'`` (``[]``: no matrix)."""
    try:
        items = json.loads(value)
    except (ValueError, RecursionError):
        items = None
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise MeshbenchError(f'{flag}: {value!r} is not a JSON list of strings, such as \'["", "-np 1"]\'')
    return items
