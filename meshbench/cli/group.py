"""The command group: every user error is one line on stderr and a non-zero exit code; SIGTERM cleans up
like Ctrl-C.

Exit codes: meshbench.cli.exits.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import typer
from typer.core import TyperGroup

from meshbench.cli import exits
from meshbench.errors import MeshbenchError
from meshbench.files import cache_dir


class Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so that every ``finally`` cleans up."""


def _on_sigterm(signum, frame):  # noqa: ARG001
    raise Terminated()


class _ClosedStream(io.TextIOBase):
    """Stands in for a closed standard output: writing to it is an error, not an AttributeError."""

    def write(self, s):  # noqa: ARG002
        raise OSError(errno.EBADF, "standard output is closed")

    def fileno(self) -> int:
        raise OSError(errno.EBADF, "standard output is closed")

    def isatty(self) -> bool:
        return False


OUTPUT_ERRORS = (errno.ENOSPC, errno.EFBIG, errno.EPIPE, errno.EBADF, errno.EIO, errno.EDQUOT)


class MeshbenchGroup(TyperGroup):
    """Turns every user error into one line on stderr and exit code 2.

    Exit codes: 2 bad input or output that could not be written, 130 SIGINT, 143 SIGTERM.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if sys.stdout is None:
            sys.stdout = _ClosedStream()
        previous = _install_sigterm()
        try:
            rv = self._run(args, prog_name, complete_var, **extra)
            try:
                sys.stdout.flush()  # a main output that could not be written is a failure, not exit 0
            except OSError as e:
                rv = _output_error(e)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)

    def _run(self, args, prog_name, complete_var, **extra) -> int:
        try:
            rv = super().main(
                args=args, prog_name=prog_name or "meshbench", complete_var=complete_var, standalone_mode=False, **extra
            )
            if rv == 130:  # typer turns Ctrl-C into exit code 130 itself
                typer.echo("interrupted: no partial bundle or file was left", err=True)
            return rv
        except typer.TyperException as e:  # typer's (vendored click's) usage errors
            ctx = getattr(e, "ctx", None)
            if type(e).__name__ == "NoArgsIsHelpError":
                return 0  # typer has already printed the help
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            typer.echo(f"error: {e.format_message()}{hint}", err=True)
            return getattr(e, "exit_code", 2)
        except MeshbenchError as e:
            typer.echo(f"error: {e}", err=True)
            return exits.BAD_INPUT
        except (KeyboardInterrupt, typer.Abort):
            typer.echo("interrupted: no partial bundle or file was left", err=True)
            return exits.INTERRUPTED
        except Terminated:
            typer.echo("terminated (SIGTERM): no partial bundle or file was left", err=True)
            return exits.TERMINATED
        except OSError as e:
            if e.errno in OUTPUT_ERRORS:
                return _output_error(e)
            if e.errno in PATH_ERRORS:  # a path the file system cannot hold: the user's input, one line
                name = e.filename if e.filename is not None else ""
                shown = str(name)[:80] + ("..." if len(str(name)) > 80 else "")
                typer.echo(f"error: {shown}: {e.strerror}", err=True)
                return exits.BAD_INPUT
            return _crashed(e)
        except Exception as e:  # a bug of meshbench's, not the user's input: exit 3, never 1 ("a check failed")
            return _crashed(e)


def _crashed(e: BaseException) -> int:
    """One line on stderr naming the log file that holds the traceback, and exit code 3 (whatever else fails)."""
    try:
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        log = _crash_log(f"meshbench {' '.join(sys.argv[1:])}\n{text}")
        where = f"the traceback is in {log}" if log is not None else "the traceback could not be written to a file"
        summary = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        line = f"crash: meshbench failed unexpectedly ({summary}); {where}; please report it (exit 3)"
        sys.stderr.write(line.encode("utf-8", "backslashreplace").decode("utf-8") + "\n")
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001, S110 - the exit code must still say "crashed"
        pass
    return exits.CRASHED


def _crash_log(text: str) -> Path | None:
    """The traceback in a new file of its own (never one that was there, nor through a link): meshbench's cache
    (crashes/), else the system's temporary folder; None if neither takes it."""
    prefix = f"crash-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}-"
    for folder in (lambda: cache_dir() / "crashes", lambda: Path(tempfile.gettempdir())):
        try:
            where = folder()
            where.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=prefix, suffix=".log", dir=where)  # O_EXCL, mode 0600
            with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
                f.write(text)
            return Path(name)
        except (OSError, ValueError):
            continue
    return None


# A name too long, a file where a folder should be, a loop of links: the path given was impossible.
PATH_ERRORS = {errno.ENAMETOOLONG, errno.ENOTDIR, errno.ELOOP, errno.EISDIR}


def _output_error(e: OSError) -> int:
    try:
        typer.echo(f"error: cannot write the output: {e.strerror or e}", err=True)
    except (OSError, ValueError, AttributeError):
        pass
    return exits.BAD_INPUT


def _install_sigterm():
    """SIGTERM cleans up like Ctrl-C; only the main thread may set a handler."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _on_sigterm)
