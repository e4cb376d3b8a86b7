"""`meshbench node serve`: this machine's CPU as a llama.cpp RPC device for a node's layers."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from meshbench import machine
from meshbench.cli.common import err
from meshbench.cli.options import flag
from meshbench.engine import rpc
from meshbench.errors import MeshbenchError

node_app = typer.Typer(
    help="A llama.cpp RPC worker (ggml-rpc) for a node spread over processes or hosts.", no_args_is_help=True
)


@node_app.command("serve")
def serve(
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (loopback unless --allow-remote).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port.")] = 50052,
    threads: Annotated[Optional[int], flag("--threads", min=1, max=512, help="CPU threads.")] = None,
    cache: Annotated[Optional[str], typer.Option("--cache", help="Folder for llama.cpp's tensor cache.")] = None,
    allow_remote: Annotated[
        bool,
        flag(
            "--allow-remote",
            help="Listen on a non-loopback address. ggml-rpc is unauthenticated: only on a network you trust.",
        ),
    ] = False,
    as_json: Annotated[
        bool,
        flag(
            "--json",
            help="One JSON line on stdout as it starts listening (endpoint, pid, threads) and one as it stops, for "
            "a script that starts workers; the messages on stderr are the same.",
        ),
    ] = False,
) -> None:
    """Serve this machine's CPU to llama.cpp RPC clients until SIGTERM (exit 0) or SIGINT (exit 130)."""
    endpoint = rpc.Endpoint(_numeric(host), port)  # llama.cpp binds an address, not a name
    if not endpoint.loopback and not allow_remote:
        raise MeshbenchError(
            f"--host {host}: not a loopback address; ggml-rpc has no authentication, so "
            "pass --allow-remote to expose it, and only on a network you trust"
        )
    if not endpoint.loopback:
        err.print(
            f"warning: serving llama.cpp RPC on {endpoint} without authentication: anyone who reaches this "
            "port can run tensors on this machine",
            markup=False,
        )
    if cache is not None and Path(cache).exists() and not Path(cache).is_dir():
        raise MeshbenchError(f"--cache {cache}: exists and is not a directory (llama.cpp keeps its tensor cache there)")
    rpc.libraries()  # an RPC-capable build, or the one line that says how to get it
    _check_port_free(endpoint)
    n_threads = threads or machine.usable_cpus()
    events = _json_stdout() if as_json else None
    server = threading.Thread(target=rpc.serve, args=(endpoint, n_threads, cache), daemon=True)
    try:  # from before the server can accept anything: a SIGTERM from then on is a clean stop
        server.start()
        if not _accepting(endpoint, server):  # "listening" only once it is: llama.cpp may fail to bind
            raise MeshbenchError(
                f"llama.cpp's RPC server did not start listening on {endpoint} within {BIND_TIMEOUT_S:.0f} s"
            )
        err.print(f"listening on {endpoint}", markup=False)
        if events is not None:
            _event(events, {"event": "listening", "endpoint": str(endpoint), "pid": os.getpid(), "threads": n_threads})
        while server.is_alive():
            server.join(0.25)
    except BaseException as e:
        if type(e).__name__ == "Terminated":  # SIGTERM: a clean stop
            err.print("stopped (SIGTERM)", markup=False)
            if events is not None:
                _event(events, {"event": "stopped", "why": "SIGTERM"})
            return
        if events is not None and isinstance(e, KeyboardInterrupt):
            _event(events, {"event": "stopped", "why": "SIGINT"})
        raise
    raise MeshbenchError(f"llama.cpp's RPC server on {endpoint} stopped (could it bind the port?)")


BIND_TIMEOUT_S = 30.0


def _json_stdout() -> int:
    """--json: standard output kept for the events alone. llama.cpp's RPC server prints its banner to the process's
    standard output, so that goes to stderr from here on; the events go to a copy of the original."""
    sys.stdout.flush()
    events = os.dup(1)
    os.dup2(2, 1)
    return events


def _event(fd: int, doc: dict) -> None:
    """One line, written whole at once (a script reads it while the worker runs)."""
    view = memoryview((json.dumps(doc) + "\n").encode())
    while view:
        view = view[os.write(fd, view) :]


def _accepting(endpoint: rpc.Endpoint, server: threading.Thread) -> bool:
    """Wait until the port takes a connection (True), or the server thread ends (False)."""
    deadline = time.monotonic() + BIND_TIMEOUT_S
    while server.is_alive() and time.monotonic() < deadline:
        try:
            with socket.create_connection((endpoint.host, endpoint.port), timeout=0.5):
                return True
        except OSError:
            server.join(0.05)
    return False


def _numeric(host: str) -> str:
    """An address for a host name (``localhost`` -> 127.0.0.1; brackets around an IPv6 address dropped)."""
    host = host.strip("[]")
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        return host
    except OSError:
        pass
    try:
        return str(socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    except OSError:
        raise MeshbenchError(f"--host {host}: not an address this machine can resolve") from None


def _check_port_free(endpoint: rpc.Endpoint) -> None:
    family = socket.AF_INET6 if ":" in endpoint.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((endpoint.host, endpoint.port))
        except OSError as e:
            raise MeshbenchError(f"--port {endpoint.port}: cannot listen on {endpoint} ({e.strerror})") from None
