"""A request history: steps run one after another, the requests of a step sent at once. What a hunt generates,
runs, shrinks and writes as a replayable file (``meshbench hunt --replay FILE``).

A request is its prompt as token ids (what the server is sent: no tokenizer between the file and the server), its
answer's length (eos banned, so the length is fixed), whether it goes through the server's prompt cache (as the
server ships: ``cache_prompt`` not sent) and, for a client that disconnects, after how many tokens. ``carries``
says in words what the strategy put in it (a reader's note, never read back)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from meshbench import validation
from meshbench.errors import MeshbenchError

SCHEMA = "history.schema.json"
VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    name: str  # r0, r1, ...: unique in its history
    prompt: tuple[int, ...]
    new_tokens: int
    cancel_at: int | None = None  # the client disconnects once this many tokens are in, and its answer is not judged
    carries: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    requests: tuple[Request, ...]  # sent at once, one client each


@dataclass(frozen=True, slots=True, kw_only=True)
class History:
    strategy: str
    seed: list[int]  # the draw it came from (the hunt's seed, then its index)
    steps: tuple[Step, ...]

    def requests(self) -> list[Request]:
        return [r for s in self.steps for r in s.requests]

    def size(self) -> tuple[int, int, int]:
        """Steps, requests and prompt ids: how big a history is (a shrink makes each smaller or none larger)."""
        reqs = self.requests()
        return len(self.steps), len(reqs), sum(len(r.prompt) for r in reqs)


def to_json(h: History) -> dict[str, object]:
    return {"kind": "history", "version": VERSION, **dataclasses.asdict(h)}


def from_json(data: object, where: str) -> History:
    """A history from its JSON (schema-checked first), or one line naming what is wrong."""
    errors = validation.errors(data, SCHEMA)
    if errors:
        raise MeshbenchError(f"{where}: not a meshbench history: {errors[0]}")
    assert isinstance(data, dict)
    steps = tuple(
        Step(requests=tuple(Request(**{**r, "prompt": tuple(r["prompt"])}) for r in s["requests"]))
        for s in data["steps"]
    )
    h = History(strategy=data["strategy"], seed=list(data["seed"]), steps=steps)
    names = [r.name for r in h.requests()]
    if len(set(names)) != len(names):
        raise MeshbenchError(f"{where}: request names must be unique ({_repeated(names)} is said twice)")
    return h


def _repeated(names: list[str]) -> str:
    return next(n for n in names if names.count(n) > 1)


def read(path: Path) -> History:
    try:
        data = json.loads(path.read_bytes())
    except OSError as e:
        raise MeshbenchError(f"{path}: cannot read it ({e.strerror})") from None
    except (ValueError, RecursionError):
        raise MeshbenchError(f"{path}: not JSON") from None
    return from_json(data, str(path))
