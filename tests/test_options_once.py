"""Every flag of every command is declared once (issue 59): the sweep's table (options_engine, options_run) and the
rows other commands share (options_shared). A command that takes one of them takes it from there
(``options.flag``), in its own words and with bounds no wider; a flag typed out again is a failure here."""

from __future__ import annotations

import ast
import types
import typing
from pathlib import Path

import pytest

from meshbench.cli import options
from meshbench.cli.options_engine import ENGINE
from meshbench.cli.options_run import RUN
from meshbench.cli.options_shared import SHARED

PACKAGE = Path(__file__).resolve().parents[1] / "meshbench"
TABLES = {"options_engine.py", "options_run.py", "options_shared.py"}
# the same name, another option: bench gguf's --workers is a list of worker counts compared, the table's one count
OWN = {("bench.py", "--workers")}
# the table's flag, typed otherwise by one command: bench gguf's prompt is one length for every session, where the
# sweep's is one length or one per session
RETYPED = {("bench gguf", "--prompt-tokens"), ("bench gguf", "--workers")}  # (and OWN's, by its command)


def _typed_out() -> list[tuple[str, int, str]]:
    """(module, line, flag) of every typer.Option("--flag", ...) outside the tables."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in TABLES:
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and n.func.attr == "Option"
                and n.args
                and isinstance(n.args[0], ast.Constant)
                and isinstance(n.args[0].value, str)
            ):
                found.append((path.name, n.lineno, n.args[0].value.split("/")[0]))
    return found


def test_the_tables_name_each_flag_once():
    rows = [*ENGINE, *RUN, *SHARED]
    assert len(options.BY_FLAG) == len(rows), "a flag is in two rows"


def test_no_command_types_out_a_flag_the_tables_declare_or_another_command_does():
    found = _typed_out()
    again = [f"{m}:{line}: {f}" for m, line, f in found if f in options.BY_FLAG and (m, f) not in OWN]
    assert not again, f"take these from the table (options.flag): {again}"
    seen: dict[str, str] = {}
    for m, line, f in found:
        assert f not in seen, f"{f} declared at {seen[f]} and {m}:{line}: one row in options_shared"
        seen[f] = f"{m}:{line}"


def test_a_command_words_a_flag_its_own_way_but_cannot_widen_or_retype_it():
    mine = options.flag("--levels", help="Closed-loop clients per level.")
    assert mine.help == "Closed-loop clients per level." and options.BY_FLAG["--levels"].option.help != mine.help
    assert options.flag("--repeat", max=10).max == 10 and options.BY_FLAG["--repeat"].option.max == 100
    with pytest.raises(AssertionError, match="wider"):
        options.flag("--repeat", max=1000)
    with pytest.raises(AssertionError, match="wider"):
        options.flag("--sessions", min=0)
    with pytest.raises(AssertionError, match="the table's to declare"):
        options.flag("--levels", callback=print)


def _commands(group, prefix=""):
    for c in group.registered_commands:
        yield f"{prefix}{c.name or c.callback.__name__}", c.callback
    for g in group.registered_groups:
        yield from _commands(g.typer_instance, f"{prefix}{g.name} ")


def _plain(t):
    """A type without its None, a path as the text it is typed as."""
    args = [a for a in typing.get_args(t) if a is not type(None)]
    t = args[0] if len(args) == 1 and typing.get_origin(t) in (typing.Union, types.UnionType) else t
    return str if t is Path else t


def test_a_command_takes_a_table_flag_as_the_tables_type():
    from meshbench.cli.app import app

    retyped = set()
    for name, callback in _commands(app):
        for hint in typing.get_type_hints(callback, include_extras=True).values():
            if typing.get_origin(hint) is not typing.Annotated:
                continue
            kind, *meta = typing.get_args(hint)
            for m in meta:
                decl = getattr(m, "default", None)
                row = options.BY_FLAG.get(decl.split("/")[0]) if isinstance(decl, str) else None
                if row is not None and _plain(kind) != _plain(row.kind) and (name, row.flag) not in RETYPED:
                    retyped.add(f"{name} {row.flag}: {_plain(kind)}, the table's {_plain(row.kind)}")
    assert not retyped
