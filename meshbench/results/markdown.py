"""Text from a results file set into markdown: one line, its markup shown rather than obeyed."""

from __future__ import annotations

import re

_SPECIAL = re.compile(r"([\\`*<>\[\]|])")


def inline(text: str) -> str:
    """``text`` as literal inline markdown: backslash-escaped where a character would start markup (a link, a
    tag, code, emphasis, a table cell), and on one line."""
    return _SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def median_range(
    summary: dict | None, fmt: str = ".1f", sep: str = "-", drop_single: bool = False, drop_equal: bool = False
) -> str:
    """A figure over repetitions as one cell: its median, then ``(min<sep>max)``; the median alone
    (``drop_single``) for one repetition, or (``drop_equal``) when the range's ends look the same at this
    precision; "-" for none. ``fmt`` is a format spec (``.1f``, ``.1%``)."""
    if summary is None:
        return "-"
    med, lo, hi = (format(summary[k], fmt) for k in ("median", "min", "max"))
    if (drop_single and summary.get("n") == 1) or (drop_equal and lo == hi):
        return med
    return f"{med} ({lo}{sep}{hi})"
