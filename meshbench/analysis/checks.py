"""Named checks that collect every failure, each saying what was expected and what was found."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Failure:
    file: str
    field: str
    expected: object
    found: object
    check: str | None = None  # the named check it belongs to (a fault-matrix column), where one applies

    def __str__(self) -> str:
        return f"{self.file}: {self.field} expected={clipped(self.expected)} found={clipped(self.found)}"


SHOWN = 200  # characters of a value a failure's line shows: a whole history differing is one line, not 500 KB


def clipped(value: object) -> str:
    """``value`` as a failure shows it: whole, or its first SHOWN characters and how long it is, on one line, every
    character a terminal would act on (a newline, an escape sequence that clears a line) written out as its escape."""
    text = printable(value)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} characters)"


def printable(value: object) -> str:
    """``value`` on one line, every character a terminal would act on written out as its escape."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(value))


class Checks:
    def __init__(self) -> None:
        self.failures: list[Failure] = []
        self.count = 0
        self.notes: list[str] = []  # outcomes that are not failures: how a rerun reproduced, what it could not compare
        # records taken as written, which only a rerun checks: noted where there was none (verify.bundle)
        self.until_rerun: list[str] = []
        self.kernel_bound = 0  # records a rerun on other llama.cpp kernels did not reproduce (meshbench.verify.kernels)

    def equal(self, file: str, field: str, expected: object, found: object, check: str | None = None) -> None:
        """Exact equality; floats within 1e-12 (the same arithmetic in another order)."""
        self.count += 1
        if not _same(expected, found):
            self.failures.append(Failure(file, field, expected, found, check))


def _same(a: object, b: object) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):  # (False is not 0: a flag is not a count)
        return type(a) is type(b) and a == b
    if isinstance(a, float) or isinstance(b, float):
        return (
            isinstance(a, (int, float))
            and isinstance(b, (int, float))
            and not isinstance(a, bool)
            and not isinstance(b, bool)
            and math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a) and not isinstance(a, type) and type(a) is type(b):  # a record: field by field
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return bool(a == b)
