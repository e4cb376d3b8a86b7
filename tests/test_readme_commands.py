"""Every command README.md shows works as written: those that finish in seconds are run, in order, in a folder
where `evidence/` and `configs/` are the repository's; the others (a server to start or reach, every bundle
rerun) are parsed by the app itself, so a renamed flag or a wrong value fails here."""

from __future__ import annotations

import glob
import os
import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from meshbench.cli import app

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def blocks() -> list[list[str]]:
    """The meshbench commands of each of README's bash blocks, in order, each without its comment."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        found.append([])
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            for part in line.split(" && "):
                if part.startswith("meshbench "):
                    found[-1].append(part.split(" > ", 1)[0])
    return found


def commands() -> list[str]:
    return [c for block in blocks() for c in block]


def slow(command: str) -> bool:
    """A server to start or reach, or a rerun of every committed bundle (CI's own stage)."""
    return any(flag in command for flag in ("--serve", "--target")) or "evidence/*" in command


def quick() -> list[str]:
    """The commands of every block with no slow command (a block's later commands read what its first wrote)."""
    return [c for block in blocks() if not any(map(slow, block)) for c in block]


def parse(args: list[str]) -> None:
    """Resolve the command path and parse every option as the app would, without running it."""
    command = typer.main.get_command(app)
    ctx = command.make_context("meshbench", list(args))
    while hasattr(command, "resolve_command"):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not rest:
            break
        name, command, rest = command.resolve_command(ctx, rest)
        assert command is not None, args
        ctx = command.make_context(name, rest, parent=ctx)


def test_the_readme_shows_commands_of_both_kinds():
    assert len(quick()) >= 6
    assert any(map(slow, commands()))


@pytest.mark.parametrize("command", commands())
def test_every_readme_command_parses(command):
    parse(shlex.split(command)[1:])


def test_the_readme_commands_that_finish_in_seconds_work_as_written(tmp_path, monkeypatch):
    for name in ("evidence", "configs"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    ran = []
    for command in quick():
        args = [m for a in shlex.split(command)[1:] for m in (sorted(glob.glob(a)) if "*" in a else [a])]
        r = runner.invoke(app, args)
        assert r.exit_code == 0, f"{command}: exit {r.exit_code}\n{r.output}"
        ran.append(command)
    assert os.path.isfile(tmp_path / "dgr-012" / "results.json"), ran
