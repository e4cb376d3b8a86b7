"""Files meshbench reads and writes: regular files only, created with the user's umask.

Anything meshbench opens by a name a user or a bundle gave (a config, a model, a
results.json) must be a regular file: a FIFO would block forever, a device would be
read without end. Every check raises MeshbenchError naming the file and the problem.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path

from meshbench.errors import MeshbenchError


def regular_file(path: str | Path, what: str) -> Path:
    """``path`` if it names an existing regular file (a symlink to one is fine)."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise MeshbenchError(f"{what} {p}: no such file") from None
    except OSError as e:
        raise MeshbenchError(f"{what} {p}: cannot be read ({e.strerror})") from None
    except ValueError:  # a NUL in the path
        raise MeshbenchError(f"{what} {str(p)!r}: not a usable path (it holds a NUL character)") from None
    if stat.S_ISDIR(mode):
        raise MeshbenchError(f"{what} {p}: is a directory, expected a file")
    if not stat.S_ISREG(mode):
        raise MeshbenchError(f"{what} {p}: is not a regular file ({_kind(mode)}); refusing to read it")
    return p


def read_text(path: str | Path, what: str, max_bytes: int) -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes``."""
    p = regular_file(path, what)
    size = p.stat().st_size
    if size > max_bytes:
        raise MeshbenchError(f"{what} {p}: {size} bytes is more than the {max_bytes} this file may hold")
    try:
        return p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise MeshbenchError(f"{what} {p}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise MeshbenchError(f"{what} {p}: cannot be read ({e.strerror})") from None


def strict_json(text: str, where: str, what: str) -> object:
    """Standard JSON only, each object's keys said once, or a MeshbenchError naming ``where`` and what is not (NaN
    and Infinity are Python's, not JSON's; a key said twice would let a line-based reader and json see two
    documents); ``what`` the file should be, for one nested too deeply to be one."""
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise MeshbenchError(f"{where}: not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
    except ValueError as e:
        raise MeshbenchError(f"{where}: not valid JSON: {e}") from None
    except RecursionError:
        raise MeshbenchError(f"{where}: nested too deeply to be {what}") from None


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON (meshbench never writes it)")


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"the key {k!r} appears twice in one object")
        out[k] = v
    return out


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def replaceable_file(path: Path, flag: str = "--force") -> None:
    """Refuse to replace anything but a regular file (never a device, FIFO, symlink or folder)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        raise MeshbenchError(f"{path}: is a directory, expected a file path")
    if not stat.S_ISREG(mode):
        raise MeshbenchError(
            f"{path}: exists and is not a regular file ({_kind(mode)}); {flag} replaces only regular files"
        )


def write_atomically(path: Path, text: str, prefix: str) -> None:
    """``text`` at ``path``, whole or not at all: a temporary file beside it (``prefix``, created anew, never
    followed) renamed over it, made as readable as any new file; on any failure (a full disk) the temporary file
    is removed and the OSError raised."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=path.absolute().parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, umask_mode(0o666))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def umask_mode(base: int) -> int:
    """``base`` (0o666 for files, 0o777 for folders) less the process umask."""
    mask = os.umask(0)
    os.umask(mask)
    return base & ~mask


def cache_dir() -> Path:
    """meshbench's own folder for generated files: $MESHBENCH_CACHE, else $XDG_CACHE_HOME/meshbench."""
    if os.environ.get("MESHBENCH_CACHE"):
        return Path(os.environ["MESHBENCH_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "meshbench"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return name
    return "not a regular file"
