"""A reference client for ``bench client``: C closed-loop clients as asyncio tasks on one thread, reading the
reference clock's native stream (``data:`` lines of llama-server's chunks) and stamping each chunk's tokens on
the monotonic clock as its line is read, as meshbench's client does. It is not meshbench's client: it exists to
tell what a thread per client costs, by receiving the same streams beside it. No parsing beyond what stamping
needs; a stream that ends early or answers another status is an error.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Sequence

from meshbench.errors import MeshbenchError

PASS_TIMEOUT_S = 600.0


def closed_loop(host: str, port: int, bodies: Sequence[dict[str, Any]], clients: int, t0: int) -> list[list[int]]:
    """Each body's token stamps (ns from ``t0``), the bodies taken in order by ``clients`` tasks."""
    try:
        return asyncio.run(asyncio.wait_for(_run(host, port, bodies, clients, t0), PASS_TIMEOUT_S))
    except (TimeoutError, asyncio.TimeoutError):
        raise MeshbenchError(f"async client: a pass took over {PASS_TIMEOUT_S:.0f} s") from None
    except OSError as e:
        raise MeshbenchError(f"async client: {type(e).__name__}: {e}") from None


async def _run(host: str, port: int, bodies: Sequence[dict[str, Any]], clients: int, t0: int) -> list[list[int]]:
    stamps: list[list[int]] = [[] for _ in bodies]
    todo = list(range(len(bodies)))[::-1]

    async def client() -> None:
        while todo:
            i = todo.pop()
            await _one(host, port, bodies[i], stamps[i], t0)

    await asyncio.gather(*(client() for _ in range(clients)))
    return stamps


async def _one(host: str, port: int, body: dict[str, Any], stamps: list[int], t0: int) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        raw = json.dumps(body).encode()
        writer.write(
            b"POST /completion HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (host.encode(), len(raw))
            + raw
        )
        await writer.drain()
        status = await reader.readline()
        if b" 200 " not in status:
            raise MeshbenchError(f"async client: the server answered {status.decode(errors='replace').strip()!r}")
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        while True:
            line = await reader.readline()
            if not line:
                raise MeshbenchError("async client: the stream closed before its last chunk")
            if not line.startswith(b"data: "):
                continue
            chunk = json.loads(line[6:])
            now = time.monotonic_ns() - t0
            stamps.extend(now for _ in chunk.get("tokens", []))
            if chunk.get("stop"):
                return
    finally:
        writer.close()
