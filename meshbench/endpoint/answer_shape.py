"""What every answer a server streams is held to, shared by the stream's reader (meshbench.endpoint.stream) and
the native API's probabilities (meshbench.endpoint.native_probs): the failure of a wrong answer, and what a
token id and a count are."""

from __future__ import annotations

from typing import TypeGuard

MAX_LOGPROB = 1e-3  # a log-probability is at most 0 (rounding aside)
MAX_MARGIN = 1000.0  # top-1 minus top-2 log-probability: beyond this, no server's arithmetic (results.json's bound)


class Malformed(Exception):
    """A server's answer of the wrong shape or content: the session's failure, with what was wrong."""


def is_token(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 31


def is_count(n: object) -> TypeGuard[int]:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0
