"""Every option of the commands, declared once: its flag, help, panel and bounds (the Typer option), the type
Typer parses it as, and where its value goes in the run config (``paths``, parsed on the way by ``parse``). The
rows are in options_engine and options_run.

From this table the commands get their parameters (``command``, or an option's ``annotated`` type) and the
sweep its config overrides (``overrides``): adding an option is one row, plus the field it sets.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, Callable, Mapping, Sequence, TypeVar

from meshbench.cli.flags import Option, float_list, int_list, per_session  # noqa: F401 - the shared parsers
from meshbench.cli.options_engine import ENGINE
from meshbench.cli.options_run import RUN
from meshbench.cli.options_shared import SHARED

F = TypeVar("F", bound=Callable[..., Any])

OPTIONS: dict[str, Option] = {o.name: o for o in (*ENGINE, *RUN)}
# every flag of every command, by its name: the sweep's table, then the rows other commands share
BY_FLAG: dict[str, Option] = {o.flag: o for o in (*ENGINE, *RUN, *SHARED)}
_WORDS = {"help", "rich_help_panel", "show_default"}  # what a command may say its own way; bounds only narrow


def flag(name: str, **changes: Any) -> Any:
    """The table's option ``name`` (``--levels``) for a command's own signature, ``Annotated[type, flag(...)]``:
    the same flag and bounds, with the command's own words for it (``help``) and bounds no wider than the table's
    (``min``, ``max``). Anything else is the table's to change. The type is the command's annotation, which
    tests/test_options_once.py holds to the row's."""
    row = BY_FLAG[name]
    option = copy.copy(row.option)
    option.rich_help_panel = None  # (the sweep's panels are the sweep's: a command groups its own, if it says so)
    for key, value in changes.items():
        if key in ("min", "max"):
            limit = getattr(row.option, key)
            if limit is not None and (value < limit if key == "min" else value > limit):
                raise AssertionError(f"{name}: {key}={value} is wider than the table's {limit}")
        elif key not in _WORDS:
            raise AssertionError(f"{name}: {key} is the table's to declare (meshbench.cli.options)")
        setattr(option, key, value)
    return option


def overrides(values: Mapping[str, Any]) -> dict:
    """The config overrides of the options given (not None), as a nested mapping: each value parsed and put at
    its paths. Values of names that are no option here (a command's own) are left to the command."""
    out: dict = {}
    given = [(OPTIONS[n], v) for n, v in values.items() if n in OPTIONS and v is not None]
    for o, value in given:
        parsed = o.parse(value, o.flag) if o.parse else value
        for path in o.paths if parsed is not None else ():
            _put(out, path, parsed)
    for o, _ in given:  # what an option implies wins over any other option (--target: an endpoint, whatever --engine)
        for path, constant in o.sets.items():
            _put(out, path, constant)
    return out


def _put(mapping: dict, path: str, value: Any) -> None:
    *parents, key = path.split(".")
    for p in parents:
        mapping = mapping.setdefault(p, {})
    mapping[key] = value


def command(names: Sequence[str]) -> Callable[[F], F]:
    """A command whose parameters are the named options, in that order (the function takes them as keywords)."""

    def wrap(func: F) -> F:
        params = [
            inspect.Parameter(
                n, inspect.Parameter.KEYWORD_ONLY, default=OPTIONS[n].default, annotation=OPTIONS[n].annotated
            )
            for n in names
        ]
        func.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
        func.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        return func

    return wrap
