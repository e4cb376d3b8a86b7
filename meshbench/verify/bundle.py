"""verify: many small named checks over an evidence bundle, every failure reported.

Each failure reads ``<file>: <field> expected=<x> found=<y>``. Problems that make a
bundle unusable (no folder, no results.json, not JSON, a newer schema_version, a
schema violation) raise MeshbenchError instead: there is nothing to check.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from meshbench import files, validation
from meshbench.analysis.checks import Checks, Failure
from meshbench.engine import kinds as engine_kinds
from meshbench.engine.spec import AUTO, EngineSpec
from meshbench.errors import MeshbenchError
from meshbench.names import CHART, README, RESULTS
from meshbench.results import bundle, fault_report, fingerprint, kinds, report
from meshbench.results import document as results
from meshbench.results.typed import EndpointBundle, NodeBundle
from meshbench.verify import checks, endpoint, reproduce
from meshbench.verify.reproduce import Rerun
from meshbench.workload import config
from meshbench.workload.config import RunConfig

Resolve = Callable[[NodeBundle], RunConfig]  # a bundle's config made concrete here (its real prompts' ids)
Tokens = Callable[[EndpointBundle], "list[list[int]] | str"]  # its prompts as the model here tokenizes them, or why not

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load_bundle(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise MeshbenchError(f"{path}: no such directory")
    if not path.is_dir():
        raise MeshbenchError(f"{path}: not a directory (a bundle is a folder holding results.json)")
    rj = path / RESULTS
    if not rj.exists():
        raise MeshbenchError(f"{path}: not a bundle: no {RESULTS}")
    data = results.load(rj)
    kinds.check_version(data, str(rj), files.sha256(rj) if kinds.PINNED else None)
    try:
        errors = kinds.schema_errors(data) or config_echo_errors(data["config"])
    except RecursionError:
        raise MeshbenchError(f"{rj}: nested too deeply to be a meshbench results file") from None
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise MeshbenchError(f"{rj}: fails the results schema: {errors[0]}{more}")
    return data


def config_echo_errors(echo: dict[str, Any]) -> list[str]:
    """The config echo must be a whole config: valid against the config schema, every key present (but those
    added since the bundle's schema, which mean their defaults)."""
    errors = [f"config.{e}" for e in validation.errors(echo, "config.schema.json")]
    for key, default in config.DEFAULTS.items():
        if key not in echo and key not in config.LEGACY_TOP:
            errors.append(f"config: '{key}' is missing")
        elif isinstance(default, dict) and isinstance(echo[key], dict):  # (else the schema said so)
            added = config.ADDED_KEYS.get(key, frozenset())
            errors += [f"config.{key}: '{k}' is missing" for k in default if k not in echo[key] and k not in added]
    return errors


def check_bundle(
    path: Path,
    rerun: Rerun | None = None,
    resolve: Resolve | None = None,
    tokens: Tokens | None = None,
    threads: int | None = None,
) -> Checks:
    return checked_bundle(path, rerun, resolve, tokens, threads)[2]


def checked_bundle(
    path: Path,
    rerun: Rerun | None = None,
    resolve: Resolve | None = None,
    tokens: Tokens | None = None,
    threads: int | None = None,
) -> tuple[dict[str, Any], NodeBundle | EndpointBundle, Checks]:
    """The bundle's results (as read, and typed) and every check of it; with ``rerun`` (the runner, injected:
    checking a file never loads an engine), its deterministic records compared with a fresh run's; ``resolve``
    (injected too) gives a node bundle's config its real prompts' ids, where the model is here; ``tokens``
    (injected) an endpoint bundle's prompts as the model here tokenizes them, or why it could not."""
    data = load_bundle(path)
    verifies = VERIFIES[kinds.of(data)]
    try:
        typed = verifies.concrete(kinds.typed_results(data), resolve)
    except MeshbenchError as e:  # (a record its own checks refuse: which bundle's, named)
        raise MeshbenchError(f"{path}: {e}") from None
    c = check_typed(data, typed)
    verifies.here(c, typed, tokens)
    check_readme(c, data, typed, path)
    if rerun is not None:
        if not kinds.kind(data).rerun:
            raise MeshbenchError(f"{path}: an endpoint bundle: a rerun needs its server (verify it without --rerun)")
        outcome = reproduce.check_rerun(
            c, data, rerun, check_own=functools.partial(check_fresh, resolve=resolve), threads=threads
        )
        c.notes.append(str(outcome))
        if outcome.kernels is not None:  # (what only a rerun on the recording kernels checks stays unchecked)
            c.notes.extend(f"{note} (not on these kernels)" for note in c.until_rerun)
    else:
        c.notes.extend(c.until_rerun)  # (a rerun compared these records with its own)
    return data, typed, c


def check_fresh(data: dict[str, Any], resolve: Resolve | None = None) -> Checks:
    """A rerun's own results (never written to a bundle) checked as a bundle's: its schema and config echo, then
    every check of its records, its config given its real prompts' ids by ``resolve`` where it has some."""
    errors = kinds.schema_errors(data) or config_echo_errors(data["config"])
    if errors:
        c = Checks()
        c.count += 1
        c.failures.append(Failure(RESULTS, "the schema", "valid", errors[0]))
        return c
    return check_typed(data, VERIFIES[kinds.of(data)].concrete(kinds.typed_results(data), resolve))


def check_data(data: dict[str, Any]) -> Checks:
    """Every check that needs only the results: ``data`` passed the schema, and is typed once here (``sweep``,
    which has typed its own output already, calls ``check_typed``)."""
    return check_typed(data, kinds.typed_results(data))


def check_typed(data: dict[str, Any], typed: NodeBundle | EndpointBundle) -> Checks:
    """Every check of a results document, on its records (``typed``, built from ``data`` once)."""
    c = Checks()
    r, cfg = typed.results, typed.cfg
    c.equal(RESULTS, "config.engine.kind (the records' kind)", kinds.of_engine(cfg.engine.kind), kinds.of(data))
    c.equal(RESULTS, "command (one meshbench command line, its words quoted)", True, plain_command(r.command))
    flags = command_disagreements(r.command, cfg)
    c.equal(RESULTS, "command (its flags = the config echo's)", [], flags)
    VERIFIES[kinds.of(data)].records(c, typed)
    compute = r.environment.compute  # a rerun trusts it to say whether floats must agree bit for bit
    c.equal(RESULTS, "environment.compute.digest", fingerprint.digest(compute), compute.digest)
    # (a rerun on other llama.cpp kernels reports the tokens they bind rather than failing them: the claim must hold)
    c.equal(RESULTS, "environment.compute (its llama.cpp against its CPU)", [],
            fingerprint.contradictions(compute))  # fmt: skip
    engine = typed.engine
    if engine is not None:
        c.equal(RESULTS, "engine.kind (= config.engine.kind)", cfg.engine.kind, engine.kind)
    if engine is not None and engine_kinds.recorded(engine.kind).llama:
        c.equal(RESULTS, "environment.compute.llama_cpp (the GGUF engine runs llama.cpp)", True,
                compute.llama_cpp is not None)  # fmt: skip
        c.equal(RESULTS, "engine recipe (repack, flash_attn, recipe_auto: = the config echo's settings)", [],
                recipe_disagreements(cfg.engine, engine))  # fmt: skip
        if cfg.engine.threads is not None:  # (a rerun on other threads rests on it: verify --threads)
            c.equal(RESULTS, "engine.threads (= config.engine.threads)", cfg.engine.threads,
                    getattr(engine, "threads", None))  # fmt: skip
    return c


def recipe_disagreements(setting: EngineSpec, record: object) -> list[str]:
    """Where the engine record's recipe contradicts the echo: a setting given as true or false is what ran; a
    setting left auto says in recipe_auto what it resolved to, and recipe_auto says nothing else."""
    auto = getattr(record, "recipe_auto", None) or {}
    out = [f"recipe_auto.{k} for a setting the echo does not leave auto" for k in auto if getattr(setting, k) != AUTO]
    for key in ("repack", "flash_attn"):
        said, used = getattr(setting, key), getattr(record, key, None)
        if said != AUTO and said is not used:
            out.append(f"{key} {used} where the echo says {said}")
        elif said == AUTO and not str(auto.get(key, "")).startswith(("on: " if used else "off: ")):
            out.append(f"{key} {used} where recipe_auto.{key} says {auto.get(key)!r}")
    return out


def plain_command(command: str) -> bool:
    """One ``meshbench`` command line, its words quoted, no control character in any of them (its flags are
    held to the echo by command_disagreements)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    return (
        words[:1] == ["meshbench"]
        and " ".join(shlex.quote(w) for w in words) == command
        and validation.unrepresentable(words) is None
        and all(ch.isprintable() for w in words for ch in w)
    )


# The flags of a recorded command that say where load, prompts or a model go, and how strong the proof is: each
# must agree with the config echo, which is what a rerun runs (a forged command is what a reader would paste).
COMMAND_FLAGS: dict[str, Callable[[RunConfig], object]] = {
    "--target": lambda cfg: cfg.engine.url,
    "--serve": lambda cfg: cfg.engine.serve,
    "--rpc": lambda cfg: cfg.engine.rpc,
    "--model": lambda cfg: cfg.engine.model,
    "--prompts": lambda cfg: cfg.workload.prompts,
    "--server-args": lambda cfg: cfg.engine.server_args,
    "--isolation-rounds": lambda cfg: cfg.isolation_rounds,
    "--isolation-family": lambda cfg: cfg.isolation_family,
    "--repeat": lambda cfg: cfg.repeat,
    "--warmup": lambda cfg: cfg.warmup,
    "--prefix-tokens": lambda cfg: cfg.workload.prefix_tokens if cfg.workload.prefix_groups else None,
    "--prefix-groups": lambda cfg: ",".join(map(str, cfg.workload.prefix_groups)) or None,
    "--block-tokens": lambda cfg: cfg.engine.block_tokens,
    "--cancel": lambda cfg: cfg.workload.cancel,
    "--server-settings": lambda cfg: json.dumps(list(cfg.engine.server_settings or ())),
    "--rates": lambda cfg: None if cfg.rates is None else _numbers(",".join(map(str, cfg.rates))),
    "--clock": lambda cfg: cfg.clock,
    "--arrivals": lambda cfg: cfg.workload.arrivals,
    "--slo-ttft": lambda cfg: _numbers(str(cfg.slo.ttft)),
    "--slo-tpot": lambda cfg: _numbers(str(cfg.slo.tpot)),
}
# A flag whose value is compared as what it means, not as it was typed (a JSON list's spacing, 2 or 2.0).
COMMAND_VALUES: dict[str, Callable[[str], str]] = {
    "--server-settings": lambda v: _json(v),
    "--rates": lambda v: _numbers(v),
    "--slo-ttft": lambda v: _numbers(v),
    "--slo-tpot": lambda v: _numbers(v),
}


def _numbers(value: str) -> str:
    """Comma-separated numbers as floats (``2,4`` and ``2.0,4.0`` alike); anything else as it is."""
    try:
        return ",".join(repr(float(x)) for x in value.split(","))
    except ValueError:
        return value


def _json(value: str) -> str:
    try:
        return json.dumps(json.loads(value))
    except (ValueError, RecursionError):
        return value


def command_disagreements(command: str, echo: RunConfig) -> list[str]:
    """The recorded command's flags that disagree with the config echo (``--allow-remote`` given without
    engine.allow_remote, a --target that is not engine.url, ...); a flag given twice is read as the CLI reads it,
    its last value (of a switch, its last spelling)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return ["(not a command line)"]
    switches = {"--prefix-cache": "p", "--no-prefix-cache": "p", "--gauges": "g", "--no-gauges": "g"}  # (one each)
    last: dict[str, tuple[str, str]] = {}
    for k, w in enumerate(words):
        flag, eq, value = w.partition("=")
        if not eq:
            value = words[k + 1] if k + 1 < len(words) else ""
        if flag == "--allow-remote" or flag in switches or flag in COMMAND_FLAGS:
            last[switches.get(flag, flag)] = (flag, value)
    out = []
    for flag, value in last.values():
        if flag == "--allow-remote" and echo.engine.allow_remote is not True:
            out.append(flag)
        if flag in ("--prefix-cache", "--no-prefix-cache") and echo.engine.prefix_cache != (flag == "--prefix-cache"):
            out.append(flag)
        if flag in ("--gauges", "--no-gauges") and echo.engine.gauges != (flag == "--gauges"):
            out.append(flag)
        if flag in COMMAND_FLAGS:
            node = COMMAND_FLAGS[flag](echo)
            value = COMMAND_VALUES.get(flag, str)(value)
            if str(node) != value:
                out.append(f"{flag} {value} (the echo says {node})")
    return out


def check_readme(c: Checks, data: dict[str, Any], typed: NodeBundle | EndpointBundle, path: Path) -> None:
    readme = path / README
    if not readme.is_file():
        c.equal(README, "(file)", "present", "missing")
        return
    text = files.read_text(readme, "README", bundle.MAX_RESULTS_BYTES)
    name = bundle_name(text, path)
    expected = kinds.kind(data).readme(typed, shlex.quote(name))
    if text != expected:  # generated from results.json: every line is checked, prose included
        # (split on \n alone: a line ending in \r differs, and so does a missing or an extra last newline)
        want, got = expected.split("\n"), text.split("\n")
        k = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
        c.equal(
            README,
            f"line {k + 1} (the README as results.json renders it)",
            repr(want[k]) if k < len(want) else "(end of file)",
            repr(got[k]) if k < len(got) else "(end of file)",
        )
    check_other_files(c, data, typed, path, name)
    VERIFIES[kinds.of(data)].tables(c, typed, text)


def _check_node_tables(c: Checks, b: NodeBundle, text: str) -> None:
    """A node README's tables, cell by cell: the sweep table and the fault matrix."""
    _check_table(c, "sweep table", report.parse_table(text), report.table_rows(b), report.TABLE_FIELDS, "levels")
    faults = fault_report.table_rows(b)
    if faults:
        _check_table(
            c,
            "fault matrix",
            report.parse_table(text, fault_report.TABLE_HEADER),
            faults,
            [h.strip() for h in fault_report.TABLE_HEADER.strip("|").split("|")],
            "fault matrix rows",
        )


def check_other_files(
    c: Checks, data: dict[str, Any], typed: NodeBundle | EndpointBundle, path: Path, name: str
) -> None:
    """commands.txt as results.json renders it; the chart a regular PNG file, drawn from results.json but not
    compared (matplotlib's bytes differ by version), said so; any other file, said to be unchecked."""
    commands = path / bundle.COMMANDS
    if not commands.is_file() or commands.is_symlink():
        c.equal(bundle.COMMANDS, "(file)", "present", "missing")
    else:
        text = files.read_text(commands, "commands.txt", bundle.MAX_RESULTS_BYTES)
        c.equal(
            bundle.COMMANDS, "(as results.json renders it)", kinds.kind(data).commands(typed, shlex.quote(name)), text
        )
    chart = path / CHART
    if chart.exists() or chart.is_symlink():
        regular = chart.is_file() and not chart.is_symlink()
        c.equal(CHART, "(a regular PNG file)", True, regular and chart.open("rb").read(8) == PNG_MAGIC)
        c.notes.append(f"{CHART}: drawn from {RESULTS}, not compared with it (unchecked)")
    for entry in sorted(os.listdir(path)):
        if entry not in bundle.BUNDLE_FILES:
            c.notes.append(f"{entry}: not a file meshbench writes; unchecked")


def bundle_name(text: str, path: Path) -> str:
    """The name the bundle was written under, as its README quotes it (``meshbench verify NAME --rerun``, NAME
    one shell word): a name is presentation, every other line is checked against results.json, and the line
    itself is rendered again from the name (so a name that is not one quoted word fails)."""
    for line in text.splitlines():
        if line.startswith("meshbench verify "):
            try:
                words = shlex.split(line)
            except ValueError:
                return path.name
            return words[2] if len(words) > 2 else path.name
    return path.name


def _check_table(
    c: Checks,
    name: str,
    rows: list[list[str]] | None,
    expected: list[list[str]],
    fields: list[str],
    at: str,
) -> None:
    if rows is None:
        c.equal(README, name, "present", "missing")
        return
    c.equal(README, f"{name} rows", len(expected), len(rows))
    for i, (e_row, f_row) in enumerate(zip(expected, rows)):
        for field, e, f in zip(fields, e_row, f_row + [""] * (len(e_row) - len(f_row))):
            c.equal(README, f"{at}[{i}].{field}", e, f)


@dataclass(frozen=True, slots=True)
class Verifies:
    """What verify does with one kind of sweep's records (meshbench.results.kinds.KINDS), each given its kind's
    typed bundle."""

    records: Callable[[Checks, Any], None]  # every check of its records and figures
    tables: Callable[[Checks, Any, str], None]  # its README's tables cell by cell, beyond the whole text
    concrete: Callable[[Any, Resolve | None], Any]  # the bundle with its config made concrete here, by ``resolve``
    here: Callable[[Checks, Any, Tokens | None], None]  # what only this machine's model checks, by ``tokens``


def _resolved(b: NodeBundle, resolve: Resolve | None) -> NodeBundle:
    return dataclasses.replace(b, cfg=resolve(b)) if resolve is not None else b


def _tokens(c: Checks, b: EndpointBundle, tokens: Tokens | None) -> None:
    if tokens is not None:
        endpoint.check_prompt_ids(c, b, tokens(b))


# Each kind's (an endpoint's table is checked with the whole README, its figures by verify.endpoint; its config
# needs nothing of this machine's, and a node's prompts are tokenized by the run itself)
VERIFIES: dict[str, Verifies] = {
    kinds.NODE: Verifies(checks.check_node, _check_node_tables, _resolved, lambda c, b, tokens: None),
    kinds.ENDPOINT: Verifies(endpoint.check_endpoint, lambda c, b, text: None, lambda b, resolve: b, _tokens),
}
