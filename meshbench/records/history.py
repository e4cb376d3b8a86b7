"""A request history, and the facts of the server it was drawn for: steps run one after another, the requests
of a step sent at once. What a hunt generates, runs, shrinks and writes as a replayable file (``meshbench hunt
--replay FILE``).

A request is its prompt as token ids (what the server is sent: no tokenizer between the file and the server), its
answer's length (eos banned, so the length is fixed), whether it goes through the server's prompt cache (as the
server ships: ``cache_prompt`` not sent) and, for a client that disconnects, after how many tokens. A
conversation's request also holds the user's message of each later turn: after each answer the client sends the
conversation so far (the prompt, every answer, every message) and its answer is every turn's, one after another.
``carries`` says in words what the strategy put in it (a reader's note, never read back)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshbench import files, validation
from meshbench.errors import MeshbenchError

BLOCKS = (16, 32, 64, 256)  # cache and attention block sizes servers use (llama.cpp's KV cells are per token)
N_UBATCH, N_BATCH = 512, 2048  # llama-server's defaults for its micro-batch and logical batch
SCHEMA = "history.schema.json"
MAX_BYTES = 64 << 20  # a history file, at most
VERSION = 1
NODE_COLD = (
    "the request alone on an engine made for it, its prefix cache off"  # where the node's cold answers come from
)
NODE_REPLAYS = "a fresh node (a new engine, nothing cached)"  # where a finding on the node runs again
SERVER_COLD = "cache_prompt false on the idle server"  # where a server's cold answers come from
SERVER_FRESH = "a fresh server process"  # where a finding runs again on a server meshbench started
SERVER_SAME = "the same server (meshbench did not start it)"  # ... on a server it was pointed at


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    name: str  # r0, r1, ...: unique in its history
    prompt: tuple[int, ...]
    new_tokens: int
    cancel_at: int | None = None  # the client disconnects once this many tokens are in, and its answer is not judged
    carries: str = ""
    turns: tuple[tuple[int, ...], ...] = ()  # a conversation: each later turn's message (never with cancel_at)

    def key(self) -> tuple[tuple[int, ...], int, tuple[tuple[int, ...], ...]]:
        """What its answer depends on (alike requests have one cold answer)."""
        return self.prompt, self.new_tokens, self.turns

    def sent(self) -> tuple[int, ...]:
        """Every id its client sends of its own: the prompt and each later turn's message."""
        return tuple(t for part in (self.prompt, *self.turns) for t in part)

    @property
    def answer_tokens(self) -> int:
        """Its answer's ids: ``new_tokens`` for each turn."""
        return self.new_tokens * (1 + len(self.turns))


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
        """Steps, requests and prompt ids (a conversation's messages counted): how big a history is (a shrink makes
        each smaller or none larger)."""
        reqs = self.requests()
        return len(self.steps), len(reqs), sum(len(r.sent()) for r in reqs)


def unshrinkable(small: History, big: History, head: int) -> str | None:
    """What stops ``small`` being a history a shrink of ``big`` could give (None: nothing). A shrink (meshbench.hunt.
    shrink) drops steps and requests, sends a step's requests one after another, cuts a prompt from its end, drops
    a conversation's last turns and shortens an answer (and its cancel with it), each by its own steps (a prompt's
    content, after its ``head`` ids, by a half or a quarter; an answer by half, to no fewer than 2 ids); it never
    adds, reorders, renames or rewrites a request, nor changes the strategy and seed the history was drawn from."""
    if (small.strategy, small.seed) != (big.strategy, big.seed):
        return "its strategy and seed are not the history's it was shrunk from"
    where = {r.name: (k, j, r) for k, s in enumerate(big.steps) for j, r in enumerate(s.requests)}
    last = (-1, -1)
    for s in small.steps:
        missing = next((r.name for r in s.requests if r.name not in where), None)
        if missing is not None:
            return f"request {missing} is not one of the history's it was shrunk from"
        if len({where[r.name][0] for r in s.requests}) != 1:
            return "a step holds requests of different steps of the history it was shrunk from"
        for r in s.requests:
            at = where[r.name][:2]
            if at <= last:
                return f"request {r.name} is out of the order of the history it was shrunk from"
            last = at
            said = _cut_from(r, where[r.name][2], head)
            if said is not None:
                return f"request {r.name} {said}"
    return None


def _cut_from(small: Request, big: Request, head: int) -> str | None:
    cut = small.prompt != big.prompt[: len(small.prompt)]
    if cut or len(small.prompt) - head not in _bodies(len(big.prompt) - head):
        return "has a prompt that is not its prompt before the shrink cut from its end by halves and quarters"
    if small.turns != big.turns[: len(small.turns)]:
        return "has turns that are not the first of its turns before the shrink"
    if small.new_tokens not in _answers(big.new_tokens) or small.carries != big.carries:
        return "asks new tokens the shrink never asks (halves, to 2 at least), or carries other words"
    cancel = big.cancel_at
    if cancel is not None and small.new_tokens != big.new_tokens:
        cancel = min(cancel, small.new_tokens - 1)
    if small.cancel_at != cancel:
        return "is cancelled otherwise than the shrink cancels it"
    return None


def _bodies(body: int) -> set[int]:
    """Every length a prompt's content of ``body`` ids can be cut to: by half or a quarter, leaving at least one."""
    seen, todo = {body}, [body]
    while todo:
        b = todo.pop()
        for cut in (b // 2, b // 4):
            if cut >= 1 and b - cut >= 1 and b - cut not in seen:
                seen.add(b - cut)
                todo.append(b - cut)
    return seen


def _answers(n: int) -> set[int]:
    """Every answer length the shrink gives from ``n``: halved while more than 2, to 2 at least."""
    out = {n}
    while n > 2:
        n = max(2, n // 2)
        out.add(n)
    return out


@dataclass(frozen=True, slots=True)
class Facts:
    slots: int  # parallel sequences the server runs (its total_slots; 1 where it does not say)
    n_ctx: int  # context of one slot, in tokens (where the server does not say: 4096)
    head: tuple[int, ...]  # what every prompt starts with: the BOS the server adds to a tokenized text
    pool: tuple[int, ...]  # ids prompts are drawn from (after the head)
    n_batch: int = N_BATCH
    n_ubatch: int = N_UBATCH

    def boundaries(self, room: int) -> list[int]:
        """Every boundary the server has, each and its neighbours, that a prompt of at most ``room`` ids can
        cross: the blocks, the micro-batch and the batch."""
        sizes = {*BLOCKS, self.n_ubatch, self.n_batch}
        return sorted({b + d for b in sizes for d in (-1, 0, 1) if len(self.head) + 2 <= b + d <= room})


def to_json(h: History) -> dict[str, object]:
    """The history as JSON values (lists, never tuples): what the file holds and the schema reads."""
    steps = [{"requests": [_request_json(r) for r in s.requests]} for s in h.steps]
    return {"kind": "history", "version": VERSION, "strategy": h.strategy, "seed": list(h.seed), "steps": steps}


def _request_json(r: Request) -> dict[str, object]:
    """A request as JSON values (``turns`` only where it has some: a history file of single answers is as before)."""
    out: dict[str, object] = {**dataclasses.asdict(r), "prompt": list(r.prompt), "turns": [list(t) for t in r.turns]}
    if not r.turns:
        del out["turns"]
    return out


def _request(r: dict[str, Any]) -> Request:
    return Request(**{**r, "prompt": tuple(r["prompt"]), "turns": tuple(tuple(t) for t in r.get("turns", ()))})


def from_json(data: object, where: str, schema_checked: bool = False) -> History:
    """A history from its JSON (schema-checked first, unless its document's schema checked it), or one line naming
    what is wrong."""
    errors = [] if schema_checked else validation.errors(data, SCHEMA)
    if errors:
        raise MeshbenchError(f"{where}: not a meshbench history: {errors[0]}")
    assert isinstance(data, dict)
    steps = tuple(Step(requests=tuple(_request(r) for r in s["requests"])) for s in data["steps"])
    h = History(strategy=data["strategy"], seed=list(data["seed"]), steps=steps)
    names = [r.name for r in h.requests()]
    both = next((r.name for r in h.requests() if r.turns and r.cancel_at is not None), None)
    if both is not None:
        raise MeshbenchError(f"{where}: request {both} is a conversation with cancel_at (a conversation runs whole)")
    if len(set(names)) != len(names):
        raise MeshbenchError(f"{where}: request names must be unique ({_repeated(names)} is said twice)")
    return h


def _repeated(names: list[str]) -> str:
    return next(n for n in names if names.count(n) > 1)


def read(path: Path) -> History:
    """A history file (a regular file, never a FIFO waited on; strict JSON, each key said once), or one line naming
    what is wrong."""
    return from_json(files.strict_json(files.read_text(path, "history", MAX_BYTES), str(path), "a history"), str(path))
