"""Text from a results file set into markdown: one line, its markup shown rather than obeyed."""

from __future__ import annotations

import re

_SPECIAL = re.compile(r"([\\`*<>\[\]|])")


def inline(text: str) -> str:
    """``text`` as literal inline markdown: backslash-escaped where a character would start markup (a link, a
    tag, code, emphasis, a table cell), and on one line."""
    return _SPECIAL.sub(r"\\\1", " ".join(str(text).split()))
