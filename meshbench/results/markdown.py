"""Text from a results file set into markdown: one line, its markup shown rather than obeyed."""

from __future__ import annotations

import re

from meshbench.records.endpoint_figures import Spread
from meshbench.records.model import Summary

_SPECIAL = re.compile(r"([\\`*<>\[\]|])")


def inline(text: str) -> str:
    """``text`` as literal inline markdown: backslash-escaped where a character would start markup (a link, a
    tag, code, emphasis, a table cell), and on one line."""
    return _SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def code(text: str) -> str:
    """``text`` as an inline code span, on one line, whatever backticks it holds: fenced by one more backtick
    than its longest run of them (CommonMark), padded where it starts or ends with one."""
    one_line = " ".join(str(text).split())
    longest = max((len(m) for m in re.findall(r"`+", one_line)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if one_line.startswith("`") or one_line.endswith("`") else ""
    return f"{fence}{pad}{one_line}{pad}{fence}"


def median_range(
    summary: Summary | Spread | None,
    fmt: str = ".1f",
    sep: str = "-",
    drop_single: bool = False,
    drop_equal: bool = False,
) -> str:
    """A figure over repetitions as one cell: its median, then ``(min<sep>max)``; the median alone
    (``drop_single``) for one repetition, or (``drop_equal``) when the range's ends look the same at this
    precision; "-" for none. ``fmt`` is a format spec (``.1f``, ``.1%``)."""
    if summary is None:
        return "-"
    n = summary.n if isinstance(summary, Summary) else None
    med, lo, hi = (format(x, fmt) for x in (summary.median, summary.min, summary.max))
    if (drop_single and n == 1) or (drop_equal and lo == hi):
        return med
    return f"{med} ({lo}{sep}{hi})"
