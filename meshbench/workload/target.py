"""Where a serving endpoint listens: ``http://HOST:PORT``, parsed once (the sweep connects to it, verify checks
a bundle's record of it)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from meshbench.errors import MeshbenchError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True, slots=True)
class Target:
    """Where the endpoint listens: ``http://HOST:PORT``."""

    url: str
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        return self.host in LOOPBACK


def parse_target(url: str) -> Target:
    """``http://HOST:PORT`` (a path, a query, https or credentials are refused: one line, before any work)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise MeshbenchError(f"--target {url!r}: not a URL ({e})") from None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise MeshbenchError(f"--target {url!r}: give http://HOST:PORT (an http URL with a host and a port)")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise MeshbenchError(f"--target {url!r}: give the server's root, http://HOST:PORT, without a path")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # an IPv6 address keeps its brackets
    return Target(f"http://{host}:{port}", parts.hostname, port)
