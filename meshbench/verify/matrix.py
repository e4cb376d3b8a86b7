"""verify for a settings matrix: what ran (its config echo, held to its command, its settings and flags), then
every setting's endpoint bundle checked as verify checks any (its failures named by its folder), each held to the
digest, the config and the command the matrix records for it, then the matrix's README and commands.txt as its
results.json and the settings' bundles render them."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from pathlib import Path
from typing import Any, Callable

from meshbench import files
from meshbench.analysis.checks import Checks
from meshbench.errors import MeshbenchError
from meshbench.names import README, RESULTS
from meshbench.records.matrix import MatrixDocument, MatrixEntry
from meshbench.results import bundle, matrix_report
from meshbench.results import matrix as matrix_doc
from meshbench.verify import bundle as verify_bundle
from meshbench.verify import endpoint as verify_endpoint
from meshbench.workload import config, matrix
from meshbench.workload.config import RunConfig
from meshbench.workload.matrix_config import as_run, setting_config


def check(path: Path, tokens: verify_bundle.Tokens | None = None) -> Checks:
    """The matrix and every setting's bundle; with ``tokens`` (injected, as verify_bundle's), the prompt ids the
    settings share held to the model's tokenizer here (once: every setting's are the first's)."""
    doc = matrix_doc.load(path)
    errors = verify_bundle.config_echo_errors(doc.config)
    if errors:
        raise MeshbenchError(f"{path / RESULTS}: its config echo fails the config schema: {errors[0]}")
    cfg = config.from_mapping(doc.config, f"{path / RESULTS} config")
    c = Checks()
    _check_what_ran(c, doc, cfg)
    settings = []
    for entry in doc.settings:
        found = _check_setting(c, path, cfg, doc.command, entry)
        if found is not None:
            settings.append(found)
    _check_alike(c, settings)
    ids = {json_key(s.bundle.results.workload.prompt_ids) for s in settings}
    c.equal(RESULTS, "the prompts' ids (one server's tokenizer, every setting alike)", 1, len(ids))
    if tokens is not None and settings:
        _check_prompt_ids(c, settings, tokens(settings[0].bundle))
    if len(settings) == len(doc.settings):
        _check_files(c, path, doc, settings)
    return c


def _check_prompt_ids(c: Checks, settings: list[matrix_doc.Setting], here: list[list[int]] | str) -> None:
    """Every setting's prompt ids held to one tokenization (one model and prompts file for all), or one note."""
    if isinstance(here, str):
        verify_endpoint.check_prompt_ids(c, settings[0].bundle, here)
        return
    for s in settings:
        own = Checks()
        verify_endpoint.check_prompt_ids(own, s.bundle, here)
        c.failures += [dataclasses.replace(f, file=f"{s.folder}/{f.file}") for f in own.failures]
        c.count += own.count


def _check_alike(c: Checks, settings: list[matrix_doc.Setting]) -> None:
    """Every setting ran on one server build, one model file, one machine: the README names them once."""
    first = settings[0].bundle.results if settings else None
    for s in settings[1:]:
        r, at = s.bundle.results, f"{s.folder}/{RESULTS}"
        for name, get in ALIKE.items():
            c.equal(at, f"{name} (the first setting's: one server, model and machine)", get(first), get(r))


ALIKE: dict[str, Callable[[Any], object]] = {  # what every setting of a matrix shares, by where it is recorded
    "endpoint.launched.version": lambda r: r.endpoint.launched and r.endpoint.launched.version,
    "endpoint.launched.model": lambda r: r.endpoint.launched and r.endpoint.launched.model,
    "endpoint.models": lambda r: r.endpoint.models,
    "environment.compute.digest": lambda r: r.environment.compute.digest,
}


def json_key(value: object) -> str:
    return json.dumps(value)


def _check_what_ran(c: Checks, doc: MatrixDocument, cfg: RunConfig) -> None:
    """The matrix's command is one meshbench command whose flags are its config echo's; its settings, flags,
    story and title are the echo's."""
    c.equal(
        RESULTS,
        "command (one meshbench command line, its words quoted)",
        True,
        verify_bundle.plain_command(doc.command),
    )
    c.equal(
        RESULTS,
        "command (its flags = the config echo's)",
        [],
        verify_bundle.command_disagreements(doc.command, cfg),
    )
    c.equal(
        RESULTS,
        "settings (the config echo's engine.server_settings)",
        list(cfg.engine.server_settings or ()),
        [s.flags for s in doc.settings],
    )
    c.equal(RESULTS, "story (the config echo's)", cfg.story, doc.story)
    c.equal(RESULTS, "title (the config echo's)", cfg.title, doc.title)
    c.equal(RESULTS, "server_args (the config echo's engine.server_args)", cfg.engine.server_args, doc.server_args)


def _check_setting(
    c: Checks, path: Path, cfg: RunConfig, made_by: str, entry: MatrixEntry
) -> matrix_doc.Setting | None:
    """One setting's bundle, as verify checks any, and as the matrix says it ran."""
    folder = path / entry.folder
    at = f"{entry.folder}/{RESULTS}"
    if folder.is_symlink() or not folder.is_dir():
        c.equal(
            entry.folder,
            "(a folder of the matrix, not a link)",
            "a folder",
            "a link" if folder.is_symlink() else "missing",
        )
        return None
    data, typed, own = verify_bundle.checked_bundle(folder)
    s = matrix_doc.setting(entry, data, path)
    c.failures += [dataclasses.replace(f, file=f"{s.folder}/{f.file}") for f in own.failures]
    c.count += own.count
    c.notes += [f"{s.folder}: {n}" for n in own.notes]
    c.equal(at, "sha256 (the matrix's record of it)", s.results_sha256, files.sha256(folder / RESULTS))
    expected = setting_config(cfg, s.flags)
    c.equal(at, "config (the matrix's, with the setting's flags)", as_run(expected.to_dict()), as_run(data["config"]))
    launched = s.bundle.results.endpoint.launched  # (setting() has refused a bundle of any other kind)
    c.equal(at, "endpoint.launched (a server meshbench started)", True, launched is not None)
    if launched is not None:
        argv = expected.engine.server_argv
        tail = launched.args[len(launched.args) - len(argv) :]
        c.equal(at, "endpoint.launched.args (ending in the matrix's flags, then the setting's)", argv, tail)
    try:
        command = matrix.sub_command(made_by, cfg.engine.server_args, s.flags)
    except MeshbenchError as e:
        command = str(e)
    c.equal(at, "command (the matrix's, for this setting alone)", command, typed.results.command)
    return s


def _check_files(c: Checks, path: Path, doc: MatrixDocument, settings: list[matrix_doc.Setting]) -> None:
    """README.md and commands.txt as the matrix renders them; nothing else in the folder but the settings'."""
    readme = path / README
    if not readme.is_file() or readme.is_symlink():
        c.equal(README, "(file)", "present", "missing")
        return
    text = files.read_text(readme, "README", bundle.MAX_RESULTS_BYTES)
    name = shlex.quote(verify_bundle.bundle_name(text, path))
    want, got = matrix_report.render_readme(doc, settings, name).split("\n"), text.split("\n")
    if want != got:
        k = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
        c.equal(
            README,
            f"line {k + 1} (the README as the matrix renders it)",
            repr(want[k]) if k < len(want) else "(end of file)",
            repr(got[k]) if k < len(got) else "(end of file)",
        )
    commands = path / bundle.COMMANDS
    found = (
        files.read_text(commands, "commands.txt", bundle.MAX_RESULTS_BYTES)
        if commands.is_file() and not commands.is_symlink()
        else "(missing)"
    )
    c.equal(bundle.COMMANDS, "(as results.json renders it)", matrix_report.render_commands(doc, name), found)
    folders = {s.folder for s in settings}
    for entry in sorted(os.listdir(path)):
        if entry in (RESULTS, README, bundle.COMMANDS) or entry in folders:
            continue
        if (path / entry / RESULTS).exists():  # a bundle the matrix does not name: a setting hidden from it?
            c.equal(entry, "(a setting of the matrix's results.json)", "named there", "not named")
        else:
            c.notes.append(f"{entry}: not a file meshbench writes; unchecked")
