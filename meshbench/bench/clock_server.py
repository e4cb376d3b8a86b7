"""A reference clock: a server whose token times are known, for checking a load generator's latencies.

It speaks llama-server's native streaming ``/completion`` (and ``/props``), and sends each request's tokens on
a schedule the request names (``reference``: its wait before the first token and the gaps after it, in ms),
stamping every send on the machine's monotonic clock (``CLOCK_MONOTONIC``, the clock meshbench's client stamps
with) after the chunk is flushed. ``GET /clock/TAG`` returns the stamps of the requests whose id is TAG-k
(each one's receipt and each token's send), once, when they are whole. It computes nothing: the schedule
is the truth a client's stamps are held to.

Run as ``python -m meshbench.bench.clock_server PORT``: on loopback only, until it is stopped, by the code that
started it (meshbench.bench.reference_clock).
"""

from __future__ import annotations

import http.server
import json
import sys
import threading
import time
from typing import Any


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the listen backlog: every client of a level connects at once (the default, 5, resets)

    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.lock = threading.Lock()
        self.log: dict[str, dict[str, Any]] = {}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: object) -> None:  # noqa: ARG002
        pass

    def _json(self, obj: object, status: int = 200) -> None:
        raw = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/props":
            return self._json({"build_info": "reference clock", "model_path": "clock", "total_slots": 64})
        if self.path == "/cpu":  # the server's own CPU time, every thread's (for the client's cost beside it)
            return self._json({"cpu_s": time.process_time()})
        if self.path.startswith("/clock/"):  # a pass's stamps (ids TAG-k), handed over once each is whole
            prefix = self.path.removeprefix("/clock/") + "-"
            with self.server.lock:
                found = {k: v for k, v in self.server.log.items() if k.startswith(prefix)}
                if all(len(v["sent_ns"]) == v["tokens"] for v in found.values()):
                    for k in found:
                        del self.server.log[k]
                return self._json(found)
        return self._json({"error": "not found"}, 404)

    def do_POST(self) -> None:  # noqa: N802
        received = time.monotonic_ns()
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path != "/completion" or not isinstance(body.get("reference"), dict):
            return self._json({"error": "POST /completion with a reference schedule"}, 404)
        ref = body["reference"]
        sent: list[int] = []
        with self.server.lock:  # (the send stamps fill in as the tokens go: a reader waits for all of them)
            self.server.log[str(ref["id"])] = {
                "received_ns": received,
                "sent_ns": sent,
                "tokens": len(ref["gaps_ms"]) + 1,
            }
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        waits = [float(ref["first_ms"]), *map(float, ref["gaps_ms"])]
        due = received
        for i, wait in enumerate(waits):
            due += int(wait * 1e6)
            _sleep_until(due)
            last = i == len(waits) - 1
            chunk = {"content": f" t{i}", "tokens": [10 + i], "stop": False}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if last:
                end = {"content": "", "stop": True, "stop_type": "limit", "tokens_predicted": len(waits)}
                self.wfile.write(b"data: " + json.dumps(end).encode() + b"\n\n")
            self.wfile.flush()
            now = time.monotonic_ns()
            with self.server.lock:
                sent.append(now)
        self.close_connection = True
        return None


def _sleep_until(due_ns: int) -> None:
    """Sleep to ``due_ns`` on the monotonic clock. A sleep wakes late, by some tens of microseconds: no matter,
    the truth is the send stamp taken after the flush, not the schedule (and a spin would load the CPU the
    client measures on)."""
    left = due_ns - time.monotonic_ns()
    if left > 0:
        time.sleep(left / 1e9)


def main() -> None:
    server = _Server(int(sys.argv[1]))
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
