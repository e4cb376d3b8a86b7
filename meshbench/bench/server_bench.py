"""meshbench against llama.cpp's own server, on the same model, prompts and token budget.

For each level C and repetition: meshbench runs its sweep pass at concurrency C; llama-server runs
with ``-np C`` on a free loopback port, and C closed-loop clients send the same sessions (prompt
token ids, ``n_predict`` new tokens, greedy, no prompt cache, end-of-generation tokens banned on both
sides: the server's ignore_eos, meshbench's eos ban) and stream the tokens
back, stamped as they arrive. Then the server is stopped by the process id that started it. Per
level: whether every session's tokens are identical, total tokens/s (prompt + generated over the
wall time of the level), TTFT and ITL percentiles, and meshbench's figures over the server's.
Repetitions rotate the level order, and within a level the two sides alternate which goes first.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from meshbench.analysis import figures, stats
from meshbench.engine.process.children import die_with_parent
from meshbench.engine.process.workers import free_port
from meshbench.engine.setup import EngineSetup, close_engine
from meshbench.errors import MeshbenchError
from meshbench.sweep.levels import level_budget, level_orders, run_pass
from meshbench.sweep.run import prepare
from meshbench.workload.config import RunConfig

READY_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 600.0


def run(
    cfg: RunConfig, server: Path, levels: list[int], repeat: int, progress: Callable[[str], None] = lambda m: None
) -> dict:
    # llama-server's ignore_eos bans end-of-generation tokens: meshbench bans them too (eos: ban), so both
    # sides generate exactly max_new_tokens and pick the same argmax.
    cfg = dataclasses.replace(
        cfg, workload=dataclasses.replace(cfg.workload, eos="ban"), engine=dataclasses.replace(cfg.engine, ban_eog=True)
    )
    setup = prepare(cfg)  # checks every level against the workload and the model first
    try:
        requests = cfg.workload.requests(setup.vocab_size)
        _one_meshbench(cfg, setup, requests, levels[0])  # warm-up: the first pass of a process is slower
        runs: dict[int, dict[str, list[dict]]] = {c: {"meshbench": [], "llama-server": []} for c in levels}
        # The server's tokens, from whole (not streamed) answers: a streamed answer that holds back an
        # incomplete UTF-8 byte token drops that token's id from its "tokens" (measured).
        served = {}
        for c in levels:
            progress(f"llama-server tokens, concurrency {c}")
            served[c] = _one_server(cfg, server, requests, c, stream=False)["tokens"]
        for r, order in enumerate(level_orders(len(levels), repeat)):
            for i in order:
                c = levels[i]
                for side in ("meshbench", "llama-server") if r % 2 == 0 else ("llama-server", "meshbench"):
                    progress(f"repetition {r + 1}/{repeat}: {side}, concurrency {c}")
                    if side == "meshbench":
                        runs[c][side].append(_one_meshbench(cfg, setup, requests, c))
                    else:
                        runs[c][side].append(_one_server(cfg, server, requests, c))
    finally:
        setup.close()
    return {
        "config": cfg.source,
        "server": str(server),
        "repeat": repeat,
        "levels": [_level(c, runs[c], served[c]) for c in levels],
    }


def _one_meshbench(cfg: RunConfig, setup: EngineSetup, requests, c: int) -> dict:
    budget = level_budget(cfg.budget, c, len(requests))
    engine = setup.make(budget.engine_limits())
    try:
        p = run_pass(requests, [0] * len(requests), budget, engine, prefill=cfg.prefill)
    finally:
        close_engine(engine)
    return _figures({s["session_id"]: s["tokens"] for s in p.sessions}, p.timing, p.wall_s, requests)


def _one_server(cfg: RunConfig, server: Path, requests, c: int, stream: bool = True) -> dict:
    port = free_port()
    longest = max(r.total_tokens for r in requests)
    batch = max(cfg.budget.max_prefill_tokens_per_tick, c)
    cmd = [
        str(server),
        "-m",
        cfg.engine.model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-np",
        str(c),
        "-c",
        str(c * (longest + 16)),
        "-b",
        str(batch),
        "-ub",
        str(batch),
        "--no-webui",
        # meshbench's recipe: flash attention as the config says (off by default: batch-invariant),
        # the KV cache type, no speculative decoding, and every slot its own cells.
        "-fa",
        "on" if cfg.engine.flash_attn else "off",
        "-ctk",
        cfg.engine.kv_type,
        "-ctv",
        cfg.engine.kv_type,
        "--kv-unified" if cfg.engine.kv_unified else "--no-kv-unified",
        "-t",
        str(cfg.engine.threads or os.cpu_count() or 1),
        "-tb",
        str(cfg.engine.threads or os.cpu_count() or 1),
    ]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )
    try:
        _wait_healthy(proc, port)
        return _drive(port, requests, c, stream)
    finally:
        _stop(proc)


def _wait_healthy(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise MeshbenchError(f"llama-server exited with {proc.returncode} before it was ready")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise MeshbenchError(f"llama-server did not become healthy within {READY_TIMEOUT_S:.0f} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)  # by the id we started
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _drive(port: int, requests, c: int, stream: bool) -> dict:
    """C closed-loop clients over the sessions in order; each session's tokens and stamps."""
    todo: queue.Queue = queue.Queue()
    for r in requests:
        todo.put(r)
    done: dict[str, dict] = {}
    errors: list[str] = []
    t0 = time.monotonic_ns()

    def client() -> None:
        while True:
            try:
                r = todo.get_nowait()
            except queue.Empty:
                return
            try:
                done[r.session_id] = _complete(port, r, t0, stream)
            except Exception as e:  # noqa: BLE001 - reported below, with the session
                errors.append(f"{r.session_id}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, daemon=True) for _ in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(REQUEST_TIMEOUT_S)
    wall_s = (time.monotonic_ns() - t0) / 1e9
    if errors or len(done) != len(requests):
        raise MeshbenchError(f"llama-server: {errors[0] if errors else 'a client did not finish'}")
    timing = [{"session_id": sid, **{k: v for k, v in d.items() if k != "tokens"}} for sid, d in done.items()]
    return _figures({sid: d["tokens"] for sid, d in done.items()}, timing, wall_s, requests)


def _complete(port: int, r, t0: int, stream: bool) -> dict:
    body = json.dumps(
        {
            "prompt": list(r.prompt_tokens),
            "n_predict": r.max_new_tokens,
            "temperature": 0.0,
            "top_k": 1,
            "cache_prompt": False,
            "ignore_eos": True,
            "return_tokens": True,
            "stream": stream,
        }
    )
    submit = time.monotonic_ns() - t0
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise MeshbenchError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    if not stream:
        d = json.loads(resp.read())
        conn.close()
        _check_evaluated(d.get("tokens_evaluated"), r)
        return {"tokens": [int(t) for t in d["tokens"]], "submit_ns": submit, "admit_ns": submit, "token_ns": []}
    tokens, stamps, evaluated = [], [], None
    for line in resp:
        if not line.startswith(b"data: "):
            continue
        chunk = json.loads(line[6:])
        now = time.monotonic_ns() - t0
        for t in chunk.get("tokens", []):
            tokens.append(int(t))
            stamps.append(now)
        evaluated = chunk.get("tokens_evaluated", evaluated)
        if chunk.get("stop"):
            break
    conn.close()
    _check_evaluated(evaluated, r)
    return {"tokens": tokens, "submit_ns": submit, "admit_ns": submit, "token_ns": stamps}


def _check_evaluated(evaluated, r) -> None:
    """The server ran exactly our prompt ids (it adds no BOS to a prompt given as ids)."""
    if evaluated is not None and evaluated != len(r.prompt_tokens):
        raise MeshbenchError(f"the server evaluated {evaluated} prompt tokens, not {len(r.prompt_tokens)}")


def _figures(tokens: dict, timing: list[dict], wall_s: float, requests) -> dict:
    # Both sides generate exactly max_new_tokens per session (the server ignores EOS).
    total = sum(r.total_tokens for r in requests)
    return {"tokens": tokens, "tokens_per_s": total / wall_s if wall_s > 0 else 0.0, **_latency(timing)}


def _latency(timing: list[dict]) -> dict:
    timed = [s for s in timing if s["token_ns"]]
    # From the moment a session got a slot: meshbench queues every session at once, the server's closed-loop
    # clients send the next only when one finishes, so time spent queued is not comparable; a slot is.
    ttft = figures.percentiles([(s["token_ns"][0] - s["admit_ns"]) / 1e6 for s in timed])
    itl = figures.percentiles([(b - a) / 1e6 for s in timed for a, b in zip(s["token_ns"], s["token_ns"][1:])])
    return {
        "ttft_ms.p50": ttft["p50"],
        "ttft_ms.p99": ttft["p99"],
        "itl_ms.p50": itl["p50"],
        "itl_ms.p95": itl["p95"],
        "itl_ms.p99": itl["p99"],
    }


def _level(c: int, runs: dict[str, list[dict]], served: dict) -> dict:
    mesh, srv = runs["meshbench"], runs["llama-server"]
    identical = all(m["tokens"] == served for m in mesh)
    out = {"concurrency": c, "tokens_identical": identical}
    for k in ("tokens_per_s", "ttft_ms.p50", "ttft_ms.p99", "itl_ms.p50", "itl_ms.p95", "itl_ms.p99"):
        a, b = [x[k] for x in mesh], [x[k] for x in srv]
        out[k] = {
            "meshbench": stats.summary(a),
            "llama-server": stats.summary(b),
            "ratio": stats.summary([x / y for x, y in zip(a, b)]),
        }  # paired by repetition
    return out
