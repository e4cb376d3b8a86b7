"""An option's declaration (``Option``) and the parsers of its value on the way into the config: the rows
themselves are in options_engine (the Engine panel) and options_run (the rest); meshbench.cli.options builds
the commands' parameters and the config overrides from them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Mapping, TypeVar

import typer

from meshbench import limits
from meshbench.errors import MeshbenchError

F = TypeVar("F", bound=Callable[..., Any])


def int_list(
    value: str,
    flag: str,
    minimum: int = 1,
    unique: bool = False,
    maximum: int | None = None,
    max_items: int = limits.MAX_LEVELS,
) -> list[int]:
    if value is None or not value.strip():
        raise MeshbenchError(f"{flag}: empty; expected comma-separated integers such as 1,2,4,8")
    items = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            raise MeshbenchError(f"{flag}: empty entry in {value!r}")
        try:
            n = int(part)
        except ValueError:
            raise MeshbenchError(f"{flag}: {part!r} is not an integer") from None
        if n < minimum:
            raise MeshbenchError(f"{flag}: {n} is below the minimum {minimum}")
        if maximum is not None and n > maximum:
            raise MeshbenchError(f"{flag}: {n} is above the maximum {maximum}")
        if unique and n in items:
            raise MeshbenchError(f"{flag}: {n} appears twice in {value!r}")
        items.append(n)
        if len(items) > max_items:
            raise MeshbenchError(f"{flag}: more than {max_items} entries")
    return items


def per_session(value: str | None, flag: str):
    if value is None:
        return None
    items = int_list(value, flag, maximum=limits.MAX_TOKENS, max_items=limits.MAX_SESSIONS)
    return items[0] if len(items) == 1 else items


def float_list(value: str, flag: str, unique: bool = True) -> list[float]:
    """Comma-separated positive numbers, e.g. --rates 0.25,0.5,1."""
    items = []
    for part in value.split(","):
        try:
            x = float(part)
        except ValueError:
            raise MeshbenchError(f"{flag}: {part.strip()!r} is not a number") from None
        if not 0 < x <= 1e4:
            raise MeshbenchError(f"{flag}: {part.strip()} must be above 0 and at most 10000")
        if unique and x in items:
            raise MeshbenchError(f"{flag}: {part.strip()} appears twice")
        items.append(x)
    if not 1 <= len(items) <= limits.MAX_LEVELS:
        raise MeshbenchError(f"{flag}: give 1 to {limits.MAX_LEVELS} rates")
    return items


def _slo(value: float | None) -> float | None:
    """An SLO is a finite positive time: NaN and infinities are refused as what they are, not as out of range."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    if value is not None and not 0.001 <= value <= 10_000_000:
        raise typer.BadParameter(f"{value:g} must be between 0.001 and 10000000")
    return value


def _levels(value: str, flag: str) -> list[int]:
    return int_list(value, flag, unique=True)


def _rates(value: str, flag: str) -> list[float]:
    return float_list(value, flag)


def _split(value: str, flag: str) -> list[float]:
    return float_list(value, flag, unique=False)


def _cancel(value: str, flag: str) -> int | str:
    """auto, off, or a token index >= 1."""
    if value in ("auto", "off"):
        return value
    if not (value.isascii() and value.isdigit()):
        raise MeshbenchError(f"{flag}: {value!r} is none of auto, off or a token index")
    n = int(value)
    if not 1 <= n <= limits.MAX_TOKENS:
        raise MeshbenchError(f"{flag}: {n} must be between 1 and {limits.MAX_TOKENS}")
    return n


def _text(value: Any, flag: str) -> str:
    return str(value)


def _rows(value: list[str], flag: str) -> list[str] | None:
    return list(value) or None


@dataclass(frozen=True)
class Option:
    """One option: its parameter name, the type Typer parses, the Typer option, where it goes in the config."""

    name: str
    kind: Any
    option: Any  # typer.Option(...): the flag, its help and panel, its bounds
    paths: tuple[str, ...] = ()  # config paths the value goes to (none: not a config value)
    parse: Callable[[Any, str], Any] | None = None  # (value as typed, flag) -> the config's value
    sets: Mapping[str, Any] = field(default_factory=dict)  # config paths set to a constant when the option is given
    default: Any = None

    @property
    def annotated(self) -> Any:
        return Annotated[self.kind, self.option]

    @property
    def flag(self) -> str:
        # (in Annotated, Typer takes the option's first name as its first positional argument, "default")
        first = self.option.param_decls[0] if self.option.param_decls else self.option.default
        return str(first).split("/")[0]
