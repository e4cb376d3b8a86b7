"""The records of an endpoint's canaries: at each level, the first C sessions sent at once, each prompt its own
unique code repeated (a planted canary); and every answer of the sweep searched for every canary but the one its
own request carried (meshbench.analysis.canary)."""

from __future__ import annotations

from dataclasses import dataclass

from meshbench.records.completion import Completion


@dataclass(frozen=True, slots=True, kw_only=True)
class CanaryRun:
    """One level's canary run: the first C sessions at once, each sending its canary repeated."""

    sessions: list[str]
    canaries: list[str]  # each session's code, in ``sessions`` order (meshbench.analysis.canary.canaries)
    canary_ids: list[list[int]]  # each code's ids as the server tokenizes it mid-prompt ([]: text compared)
    prompts: list[list[int]]  # the ids each session was sent ([]: a text API, which sends the text)
    answers: list[Completion]
    echoed: list[str]  # sessions whose answer repeated their own canary: where a leak would show


@dataclass(frozen=True, slots=True, kw_only=True)
class CanaryHit:
    """A canary found in an answer whose request did not carry it: a proven leak, naming both sessions."""

    canary: str
    carrier: str  # the session whose prompt carried it
    carrier_level: int  # at that concurrency's canary run
    receiver: str  # the session whose answer holds it
    where: str  # which answer: e.g. levels[2].repetitions[1], levels[0].canary, margins.warm
    by: list[str]  # "text" (the code in its text), "ids" (its ids in its tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class CanarySearch:
    """Every answer of the sweep searched for every canary planted: the hits, and whether they can be judged."""

    planted: int  # canaries sent (one per session per level)
    echoed: int  # of them, repeated by their own session: the search's power
    searched: int  # answers searched (those sent beside or after a canary run)
    failed: int  # canary answers that failed
    hits: list[CanaryHit]
    leak: bool | None  # True: a canary crossed; None: not judged (a canary answer failed, or a level of two or more
    # sessions where none repeated its own code: no power there)
