"""Evidence bundles: a folder with results.json, README.md, commands.txt and a chart.

Writing one is two steps around the run. ``prepare`` checks the destination before any
work is done (a destination that cannot be written is refused at once, by really creating
something there and removing it). ``commit`` creates a staging folder beside it only when
there is something to write, fills it and renames it into place, so an interruption or a
crash never leaves a partial bundle (and a killed run leaves no staging folder behind but
for the instant of writing). ``--force`` replaces only a folder that is itself a meshbench
bundle of regular files: a folder holding anything else is never touched.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shlex
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from meshbench import files
from meshbench.errors import MeshbenchError
from meshbench.names import CHART, README, RESULTS
from meshbench.results import chart, kinds
from meshbench.results import document as results

COMMANDS = "commands.txt"

BUNDLE_FILES = (RESULTS, README, COMMANDS, CHART)
MAX_RESULTS_BYTES = 256 << 20


def is_bundle(folder: Path) -> bool:
    """Does ``folder`` hold a results.json that meshbench wrote (a schema_version and a meshbench_version)?"""
    rj = folder / RESULTS
    try:
        st = rj.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RESULTS_BYTES:
            return False
        data = json.loads(rj.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return (
        isinstance(data, dict)
        and isinstance(data.get("schema_version"), int)
        and isinstance(data.get("meshbench_version"), str)
    )


def check_destination(out: Path, force: bool) -> None:
    """Refuse a destination we must not write, before any work is done."""
    if out.name in ("", ".", ".."):
        raise MeshbenchError(
            f"--out {str(out)!r}: name the bundle folder to create or replace (not '.', '..' or an empty path)"
        )
    try:
        out.lstat()
    except FileNotFoundError:
        pass
    except OSError as e:  # a name too long, a path through a file, a loop ...
        raise MeshbenchError(f"--out {out}: cannot create a folder there ({e.strerror})") from None
    if out.is_symlink():
        raise MeshbenchError(f"--out {out}: is a symbolic link (to {os.readlink(out)}); give the folder itself")
    if out.exists() and not out.is_dir():
        raise MeshbenchError(f"--out {out}: exists and is not a directory")
    if out.is_dir():
        _check_replaceable(out, force)
    parent = out.absolute().parent
    if not parent.is_dir():
        raise MeshbenchError(f"--out {out}: parent directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise MeshbenchError(f"--out {out}: directory {parent} is not writable")


def _check_replaceable(out: Path, force: bool) -> None:
    """An existing folder at --out: replaced only if it is empty, or a bundle meshbench wrote and --force."""
    if os.path.ismount(out):
        raise MeshbenchError(f"--out {out}: is a mount point; write the bundle into a folder below it")
    entries = sorted(os.listdir(out))
    if entries:
        if not is_bundle(out):
            raise MeshbenchError(
                f"--out {out}: holds files that are not a meshbench bundle ({entries[0]}"
                f"{', ...' if len(entries) > 1 else ''}); meshbench replaces only its own "
                "bundles, so choose another folder"
            )
        foreign = [e for e in entries if not _own_entry(out, e)]
        if foreign:
            raise MeshbenchError(
                f"--out {out}: the bundle there also holds {foreign[0]}, which meshbench did "
                "not write; move it away first"
            )
        if not force:
            raise MeshbenchError(f"--out {out}: a meshbench bundle already exists there; pass --force to replace it")


def _matrix_folders(folder: Path) -> set[str]:
    """The setting folders a settings matrix's results.json names (none for any other bundle)."""
    try:
        data = json.loads((folder / RESULTS).read_bytes())
        if kinds.of(data) == kinds.MATRIX:
            return {s["folder"] for s in data["settings"] if isinstance(s["folder"], str)}
    except (OSError, ValueError, RecursionError, TypeError, KeyError):
        pass
    return set()


def _own_entry(out: Path, entry: str) -> bool:
    """A file meshbench writes in a bundle, or (in a settings matrix) a folder its results.json names that is
    itself such a bundle."""
    mode = (out / entry).lstat().st_mode
    if entry in BUNDLE_FILES and stat.S_ISREG(mode):
        return True
    return (
        stat.S_ISDIR(mode)
        and entry in _matrix_folders(out)
        and is_bundle(out / entry)
        and all(e in BUNDLE_FILES and stat.S_ISREG((out / entry / e).lstat().st_mode) for e in os.listdir(out / entry))
    )


def display_name(out: Path) -> str:
    """The name a bundle's README and commands.txt give it: as given, a bare name without its ./"""
    return out.name if str(out) == out.name else str(out)


def prepare(out: Path, force: bool) -> None:
    """Check ``out`` before any work: the name can be created, and a staging folder beside it (both are
    created and removed at once)."""
    check_destination(out, force)
    try:
        if not out.exists():  # really try the name itself (too long, a read-only file system, /proc ...)
            os.mkdir(out)
            os.rmdir(out)
        os.rmdir(_staging(out))
    except OSError as e:
        raise MeshbenchError(f"--out {out}: cannot create a folder there ({e.strerror})") from None


def _staging(out: Path) -> Path:
    staging = Path(tempfile.mkdtemp(prefix=".meshbench-tmp-", dir=out.absolute().parent))
    os.chmod(staging, files.umask_mode(0o777))
    return staging


def discard(staging: Path | None) -> None:
    if staging is not None:
        shutil.rmtree(staging, ignore_errors=True)


def commit(out: Path, data: dict[str, Any], force: bool = False, typed: Any = None) -> list[str]:
    """Validate ``data``, write the bundle into a staging folder beside ``out`` and rename it to ``out``.

    Returns the file names written. The staging folder is gone afterwards, whatever happens.
    """
    staging = None
    try:
        errors = kinds.schema_errors(data)
        if errors:
            raise MeshbenchError(f"results.json would not validate: {errors[0]}")
        check_destination(out, force)  # again: the folder may have changed during the run
        staging = _staging(out)
        written = fill(staging, data, display_name(out), typed)
        with _signals_held():
            _swap_in(staging, out, force)
        return written
    except OSError as e:
        raise MeshbenchError(f"--out {out}: cannot write the bundle ({e.strerror or e}); nothing was written") from None
    finally:
        discard(staging)


def fill(folder: Path, data: dict[str, Any], name: str, typed: Any = None) -> list[str]:
    """A bundle's files written into ``folder`` (which exists), its README naming it ``name``: their names."""
    mode = files.umask_mode(0o666)
    written = [RESULTS, README, COMMANDS]
    kind, quoted = kinds.kind(data), shlex.quote(name)
    typed = typed if typed is not None else kinds.typed_results(data)  # (the caller's, typed once already)
    for fname, text in (
        (RESULTS, results.dumps(data)),
        (README, kind.readme(typed, quoted)),
        (COMMANDS, kind.commands(typed, quoted)),
    ):
        (folder / fname).write_text(text)
    if kind.chart and chart.write(typed, folder / CHART):
        written.append(CHART)
    for fname in written:
        os.chmod(folder / fname, mode)
    return written


def commit_matrix(
    out: Path, top: dict[str, str], settings: list[tuple[str, dict[str, Any]]], force: bool = False
) -> None:
    """A settings matrix: each setting's bundle (folder, results) in a folder of a staging folder beside ``out``,
    the matrix's own files (``top``: name, text) beside them, then renamed to ``out`` as one bundle is."""
    staging = None
    name = display_name(out)
    try:
        for folder, data in settings:
            errors = kinds.schema_errors(data)
            if errors:
                raise MeshbenchError(f"{folder}/results.json would not validate: {errors[0]}")
        check_destination(out, force)
        staging = _staging(out)
        for folder, data in settings:
            os.mkdir(staging / folder, files.umask_mode(0o777))
            fill(staging / folder, data, str(Path(name) / folder))
        for fname, text in top.items():
            (staging / fname).write_text(text)
            os.chmod(staging / fname, files.umask_mode(0o666))
        with _signals_held():
            _swap_in(staging, out, force)
    except OSError as e:
        raise MeshbenchError(f"--out {out}: cannot write the bundle ({e.strerror or e}); nothing was written") from None
    finally:
        discard(staging)


def write(out: Path, data: dict[str, Any], force: bool = False) -> list[str]:
    """prepare + commit, for callers that already have the results."""
    prepare(out, force)
    return commit(out, data, force)


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def _rename_noreplace(src: Path, dst: Path) -> bool:
    """Rename ``src`` to ``dst`` unless ``dst`` exists (False then): renameat2(RENAME_NOREPLACE) where the C
    library has it, else rename(2), which refuses a non-empty folder (a bundle never is empty)."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is not None:
        if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return True
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            return False
        if err not in (errno.ENOSYS, errno.EINVAL):  # (those two: a C library or file system without it)
            raise OSError(err, os.strerror(err))
    try:
        if dst.exists():
            return False
        os.rename(src, dst)
        return True
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while the old bundle is swapped for the new one."""
    held = {signal.SIGINT, signal.SIGTERM}
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (AttributeError, OSError):  # no sigmask on this platform
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _swap_in(staging: Path, out: Path, force: bool = False) -> None:
    if not force and out.is_dir() and not any(out.iterdir()):
        out.rmdir()  # an empty folder holds nothing to lose: the bundle takes its place
    if not out.exists() or not force:
        # Without --force the last step is exclusive: of two runs racing to one --out, one wins and the
        # other is refused, its bundle discarded (nothing is replaced, nothing lost).
        if not _rename_noreplace(staging, out):
            raise MeshbenchError(
                f"--out {out}: another run wrote a bundle there while this one ran; nothing was "
                "replaced (pass --force to replace it)"
            )
        return
    # The old bundle moves into a fresh folder of a fixed-length name: no name can get too long.
    old = Path(tempfile.mkdtemp(prefix=".meshbench-old-", dir=out.absolute().parent))
    os.replace(out, old / "bundle")
    try:
        os.replace(staging, out)
    except BaseException:
        os.replace(old / "bundle", out)  # put the previous bundle back: never lose data
        shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
