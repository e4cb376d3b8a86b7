"""One sweep from a RunConfig to a results dict: what `sweep` and `verify --rerun` share."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from meshbench import files
from meshbench.analysis import divergence, figures
from meshbench.analysis.verdicts import ConcurrencySweep
from meshbench.engine import factory, packaged, recipe, rpc
from meshbench.engine import kinds as engine_kinds
from meshbench.engine.base import check_context
from meshbench.engine.process import workers
from meshbench.engine.process.supervisor import Supervisor
from meshbench.engine.rpc import Endpoint
from meshbench.engine.setup import EngineSetup, EngineSizing
from meshbench.errors import MeshbenchError
from meshbench.model import gguf_io
from meshbench.records import serial
from meshbench.records.context import PROMPTS_FILE as PROMPTS
from meshbench.records.context import GgufEngineInfo, InputFile
from meshbench.records.documents import FirstDivergence, LogitDeviation, NodeResults
from meshbench.records.tick import Tick
from meshbench.results import document as results
from meshbench.results import envinfo, fingerprint, kinds, typed
from meshbench.results.typed import NodeBundle
from meshbench.scheduler.budget import engine_limits
from meshbench.scheduler.plan import bursts
from meshbench.sweep import prove, replay
from meshbench.sweep.levels import PassDone, SweepPlan, run_concurrency_sweep
from meshbench.workload import prompts
from meshbench.workload.config import RunConfig, validate_levels


@dataclass(slots=True)
class Node:
    """The RPC workers an engine uses: the user's (endpoints only) or spawned for the run (a pool)."""

    endpoints: list[Endpoint] = field(default_factory=list)
    pool: workers.Pool | None = None


def prepare(cfg: RunConfig, verbose: bool = False, on: Node | None = None) -> EngineSetup:
    """Check the config against the model before any work, then load the engine (in its own process
    when the config isolates it)."""
    validate_levels(cfg.levels, cfg.workload.sessions)
    on = on or Node()
    longest = cfg.workload.longest
    sizing = EngineSizing(longest, max(cfg.levels), cfg.workload.longest_prompt, burst=bursts(cfg.prefill))
    if cfg.engine.isolated:
        setup = Supervisor(cfg.engine, sizing, verbose, on.pool, on.endpoints).setup()
    else:
        setup = factory.setup(cfg.engine, sizing, verbose, on.endpoints)
        setup.info = dataclasses.replace(setup.info, isolated=False)
    try:
        check_context(longest, setup.context_length)  # one rule for sweep and admit
        check_budget_fits_one_session(cfg, setup, longest)
    except MeshbenchError:
        setup.close()
        raise
    return setup


def check_budget_fits_one_session(cfg: RunConfig, setup: EngineSetup, longest: int) -> None:
    """A budget that cannot hold even one session would refuse everything: say which one."""
    per_token = setup.info.kv_bytes_per_token
    need = longest * per_token
    if cfg.budget.kv_bytes < need:
        raise MeshbenchError(
            f"budget.kv_bytes {cfg.budget.kv_bytes} cannot hold a single session: the longest needs {need} "
            f"bytes ({longest} tokens x {per_token} bytes per token)"
        )
    scratch = setup.info.scratch_bytes_per_session
    if cfg.budget.scratch_bytes < scratch:
        raise MeshbenchError(
            f"budget.scratch_bytes {cfg.budget.scratch_bytes} cannot hold a single session's scratch of {scratch} bytes"
        )


@contextmanager
def node(cfg: RunConfig) -> Iterator[Node]:
    """The RPC workers the config names (engine.rpc), or spawns for the block (engine.workers); or none."""
    if cfg.engine.rpc or cfg.engine.workers:
        rpc.libraries()  # an RPC-capable build, or the one line that says how to get it, before any process starts
    if cfg.engine.rpc:
        yield Node(rpc.parse_endpoints(cfg.engine.rpc, "engine.rpc"))
        return
    with workers.spawned(cfg.engine.workers, cfg.engine.threads) as pool:
        yield Node(pool.endpoints, pool if cfg.engine.workers else None)


def sweep_on_node(
    cfg: RunConfig,
    command: str,
    on_tick: Callable[[int, Tick], None] | None = None,
    verbose: bool = False,
    on_pass: Callable[[PassDone], None] | None = None,
) -> NodeResults:
    """Start the node's workers, load the engine, sweep, and free the engine before the workers stop
    (llama.cpp aborts when it frees buffers on a worker that is gone)."""
    cfg = prompts.apply(cfg)  # real prompts: tokenized by the model before anything runs
    with node(cfg) as on:
        setup = prepare(cfg, verbose, on)
        try:
            return run_sweep(cfg, command, on_tick, setup, on_pass)
        finally:
            setup.close()


def run_sweep(
    cfg: RunConfig,
    command: str,
    on_tick: Callable[[int, Tick], None] | None = None,
    setup: EngineSetup | None = None,
    on_pass: Callable[[PassDone], None] | None = None,
) -> NodeResults:
    setup = setup or prepare(cfg)
    engine = setup.info
    plan = dataclasses.replace(SweepPlan.of(cfg), near_tie=figures.near_tie(engine))  # type: ignore[arg-type]
    sweep = run_concurrency_sweep(plan, setup.make, node=setup, on_tick=on_tick, on_pass=on_pass)
    # an input file: its content as it was, so a rerun can tell an edit of it from a forgery
    inputs = {PROMPTS: InputFile(sha256=files.sha256(Path(cfg.workload.prompts)))} if cfg.workload.prompts else None
    div = _explained(cfg, setup, sweep)
    return results.build(cfg, sweep, setup.info, envinfo.environment(), command, div, inputs)


def _explained(cfg: RunConfig, setup: EngineSetup, sweep: ConcurrencySweep) -> FirstDivergence | None:
    """The sweep's first divergence, with its class and the logits' deviation where llama.cpp computed it (only
    its kernels can vary with the batch shape; the synthetic engine cannot)."""
    div = sweep.first_divergence
    if div is None or not engine_kinds.of(cfg.engine.kind).llama:
        return div
    oracle = prove.oracle(cfg, div, setup.info, lambda other: run_sweep(other, "(classification)"))
    return dataclasses.replace(
        div,
        classification=divergence.classify(div, sweep.isolation, oracle),
        logit_deviation=_logit_deviation(cfg, setup, sweep, div),
    )


def _logit_deviation(
    cfg: RunConfig, setup: EngineSetup, sweep: ConcurrencySweep, div: FirstDivergence
) -> LogitDeviation | None:
    """The diverging session's logits at its first batched step, against the reference level's, from a replay
    of both levels' recorded schedules (in this process: an isolated engine's logits never leave its own)."""
    if cfg.engine.isolated or sweep.reference is not None:
        return None
    by_c = {lv.concurrency: lv for lv in sweep.levels}
    prompts = {r.session_id: r.prompt_tokens for r in cfg.workload.requests(setup.vocab_size, setup.eog)}
    make = lambda lv: setup.make(engine_limits(lv.budget))  # noqa: E731
    return replay.deviation(
        make,
        by_c[div.reference_concurrency],
        by_c[div.concurrency],
        prompts,
        div.session_id,
        div.token_index,
        cfg.engine.mixed_batch,
    )


def _check_inputs(inputs: dict[str, InputFile] | None, cfg: RunConfig) -> None:
    """An input file that changed since the bundle was made is refused before anything runs: the difference
    would otherwise be blamed on the bundle."""
    recorded = (inputs or {}).get(PROMPTS)
    if recorded is None or not cfg.workload.prompts:
        return
    path = files.regular_file(cfg.workload.prompts, PROMPTS)
    now = files.sha256(path)
    if now != recorded.sha256:
        raise MeshbenchError(
            f"workload.prompts {cfg.workload.prompts} changed since the bundle was made (sha256 "
            f"{recorded.sha256[:12]}... recorded, {now[:12]}... now): rerun with the file it "
            "was made from"
        )


def locate(name: str, bundle: Path) -> str:
    """A relative input path as given, if it exists from here; else the first bundle ancestor that has it."""
    try:
        return _located(name, bundle)
    except OSError:  # a name too long, a folder not ours to read: as given (its reader says what is wrong)
        return name


def _located(name: str, bundle: Path) -> str:
    given = Path(name)
    if given.is_absolute() or given.exists():
        return name
    for folder in bundle.absolute().parents:
        if (folder / given).exists():
            return str(folder / given)
    return name


def with_prompt_ids(b: NodeBundle, bundle: Path | None = None) -> RunConfig:
    """A bundle's config with its real prompts' ids, where verify's prefix-cache replay needs them (prompts and a
    prefix cache), the prompts file is the one the bundle recorded (a relative file also from the bundle's folder
    upwards) and the model is here; else unchanged, and the replay says it is unchecked. Only the workload
    changes; a model the bundle says how to make is never made for this."""
    cfg = b.cfg
    wl = cfg.workload
    if not (wl.prompts and cfg.engine.prefix_cache and wl.prompt_ids is None) or cfg.engine.make_model:
        return cfg
    located = dataclasses.replace(wl, prompts=locate(wl.prompts, bundle)) if bundle is not None else wl
    try:
        here = dataclasses.replace(cfg, workload=located)
        _check_inputs(b.results.inputs, here)
        applied = prompts.apply(here)
    except (MeshbenchError, OSError, RecursionError):
        return cfg
    return dataclasses.replace(cfg, workload=dataclasses.replace(applied.workload, prompts=wl.prompts))


def config_from_results(cfg: RunConfig) -> RunConfig:
    """The RunConfig a bundle recorded (its config echo), to run here.

    A bundle can come from anyone: a model it says how to generate (make_model) goes into
    meshbench's own cache, never to the path the bundle names.
    """
    if cfg.engine.make_model:
        model = str(cached_model_path(cfg.engine.make_model))
        cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, model=model))
    return cfg


def cached_model_path(recipe: dict) -> Path:
    r = {"preset": "dgr-012", "type": "q8_0", "seed": 0, **recipe}
    # The writer's format version is in the name: a model an older meshbench cached (no vocabulary) is
    # never taken for the one this version writes.
    return files.cache_dir() / "models" / f"{r['preset']}-{r['type']}-seed{r['seed']}-v{gguf_io.WRITER_VERSION}.gguf"


def rerun_results(
    data: dict,
    trust_endpoints: bool = False,
    bundle: Path | None = None,
    on_pass: Callable[[PassDone], None] | None = None,
    threads: int | None = None,
    on_tick: Callable[[int, Tick], None] | None = None,
) -> dict:
    """The deterministic part again: one pass per level is enough, every repetition being identical. A bundle
    can come from anyone: RPC endpoints it names are connected to only when the verifier says so. A relative
    prompts file is looked for from here, then from the bundle's folder upwards (``bundle``)."""
    if not kinds.kind(data).rerun:
        raise MeshbenchError("results.json: an endpoint's: a rerun needs its server")
    b = typed.node(data)
    if not kinds.KINDS[kinds.of_engine(b.cfg.engine.kind)].rerun:
        raise MeshbenchError("results.json: its config echo names an endpoint: a rerun needs its server")
    cfg = dataclasses.replace(config_from_results(b.cfg), repeat=1, warmup=0)
    if threads is not None and engine_kinds.of(cfg.engine.kind).llama:  # verify --threads: all records hold the same
        cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, threads=threads))
    if cfg.workload.prompts and bundle is not None:
        cfg = dataclasses.replace(
            cfg, workload=dataclasses.replace(cfg.workload, prompts=locate(cfg.workload.prompts, bundle))
        )
    _check_inputs(b.results.inputs, cfg)
    if cfg.engine.rpc and not trust_endpoints:
        raise MeshbenchError(
            f"results.json names RPC endpoints (engine.rpc {cfg.engine.rpc}): a rerun would send "
            "the model to them; pass --trust-endpoints if they are yours"
        )
    cfg = _recorded_recipe(cfg, b)
    model = _model_at_hand(cfg)
    if model is not None:  # an early refusal only, before anything runs: the check after the sweep judges
        _check_repack_here(b, model, fingerprint.fingerprint().digest)
    rerun = sweep_on_node(cfg, b.results.command, on_tick, on_pass=on_pass)
    e = rerun.engine
    if engine_kinds.recorded(e.kind).llama:
        assert isinstance(e, GgufEngineInfo) and e.model is not None, e  # (llama.cpp's record names its file)
        if e.repack is False:
            ran = str((e.recipe_auto or {}).get("repack", "off"))
            _check_repack_here(b, Path(e.model), rerun.environment.compute.digest, ran)
    doc: dict[str, Any] = serial.to_json(rerun)  # (compared with the recorded file, key by key)
    return doc


def _model_at_hand(cfg: RunConfig) -> Path | None:
    """The model file a GGUF rerun loads, where it is here before anything runs (None: make_model writes it)."""
    if not engine_kinds.of(cfg.engine.kind).llama:
        return None
    if cfg.engine.package:
        return packaged.path(cfg.engine.package)
    model = Path(cfg.engine.model) if cfg.engine.model else None
    return model if model is not None and model.is_file() else None


def _recorded_recipe(cfg: RunConfig, b: NodeBundle) -> RunConfig:
    """The rerun runs the recipe that ran where the bundle was made, whatever its echo said: flash attention as it
    ran; weight repacking off where it ran off, and auto where it ran on, so on wherever llama.cpp's repacked
    kernels run here and off, said in the rerun's recipe_auto, where they die (``_check_repack_here``)."""
    if not engine_kinds.of(cfg.engine.kind).llama:
        return cfg
    e = b.results.engine
    repack: bool | str = recipe.AUTO if getattr(e, "repack", False) else False
    flash_attn = bool(getattr(e, "flash_attn", False))
    return dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, repack=repack, flash_attn=flash_attn))


def _check_repack_here(b: NodeBundle, model: Path, here: object, ran: str | None = None) -> None:
    """A bundle made with repacking reruns without it only where the probe found that the repacked kernels die
    here (its verdict, not a timeout), on another CPU or llama.cpp build than the bundle's (``here``: this
    machine's compute fingerprint); its tokens are then judged as on other kernels. After the sweep (``ran``: what
    the rerun's recipe_auto says of repacking) the probe must say what the rerun ran by. Anything else is said in
    one line instead of turning the token checks off."""
    if not engine_kinds.recorded(b.results.engine.kind).llama or not getattr(b.results.engine, "repack", False):
        return
    try:
        used, reason = recipe.repack(recipe.AUTO, model)
    except OSError as err:
        raise MeshbenchError(f"model {model}: cannot be read ({err.strerror or err})") from None
    if used and ran is None:
        return
    probe = recipe.repack_failure(model)
    same = serial.to_json(b.results.environment.compute).get("digest") == here
    if ran is not None and ran != reason:
        problem = f": the rerun ran without it ({ran}), and a probe here now says {reason}"
    elif same or not probe.kernels_die:
        where = " on this same CPU and llama.cpp build (its compute fingerprint)" if same else ""
        problem = f"{where}, and here its repacked kernels {probe.why} in a probe of this model"
    else:
        return
    raise MeshbenchError(
        f"engine.repack: this bundle ran with llama.cpp's weight repacking{problem}: its tokens are not judged "
        "here; probe again (delete probes/ in meshbench's cache) or rerun where the repacked kernels run"
    )
