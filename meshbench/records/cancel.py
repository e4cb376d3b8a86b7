"""The records of an endpoint's cancel-and-retry run: at one level, the first C sessions sent at once (the
reference), then again with every second session disconnecting mid-stream and sending its request again; and the
verdict (meshbench.analysis.cancel): did a cancellation change another session's answer, and does a retried
request answer as it does cold?"""

from __future__ import annotations

from dataclasses import dataclass

from meshbench.records.completion import Completion
from meshbench.records.margins import Divergence


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelVerdict:
    threshold: float  # a divergence whose margin is at most this is a near-tie (the sweep's measured numerics)
    cut: int  # cancelled sessions whose client did disconnect mid-stream (an answer may end before the token)
    others_differing: list[Divergence]  # sessions that ran through with an output never seen without a cancel,
    # where it leaves their reference answer
    retries_differing: list[Divergence]  # retried sessions with such an output, where it leaves their cold answer
    failed: int  # answers of the two runs that failed, cut attempts included
    affected: bool | None  # True: a confident divergence; None: not judged (a failed answer, nothing cut, a
    # divergence of unknown margin, or an answer with nothing to judge it against)
    unjudged: int | None = None  # answers with a new output and nothing to judge it against: no cold answer (a
    # retried one) or reference (one that ran through); any makes ``affected`` None unless another is confident.
    # None: none (and bundles made before it was counted)


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelRun:
    sessions: list[str]  # the first C
    cancelled: list[str]  # every second of them: s1, s3, ...
    at_token: int  # a cancelled client disconnects once this many tokens are in
    reference: list[Completion]  # the first C at once, nothing cancelled, in session order
    cut: list[Completion]  # each cancelled session's first attempt, cut (stop "cancelled"), in ``cancelled`` order
    answers: list[Completion]  # the run: the others' answers and the retried ones, in session order
    verdict: CancelVerdict
