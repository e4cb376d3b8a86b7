"""A workload: the sessions' prompt lengths and new tokens, as the config's ``workload`` section writes them
(``WorkloadSection``) and typed (``Workload``), with the requests it makes: synthetic prompts drawn from the seed,
shared prefixes drawn from their own stream, or the ids of real prompts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshbench.errors import MeshbenchError
from meshbench.records import context as records
from meshbench.records import serial
from meshbench.scheduler.session import GenerationRequest

CANCEL_WORDS = ("auto", "off")  # workload.cancel: at half the shortest answer, or no cancel-and-retry run


@dataclass(frozen=True, slots=True)
class Workload:
    """One prompt length and one new-token count per session; prompt ids drawn from ``seed``."""

    prompt_tokens: tuple[int, ...]
    new_tokens: tuple[int, ...]
    seed: int = 0
    arrivals: str = "all-at-once"  # meshbench.workload.arrivals.parse reads it
    prompts: str | None = None  # a file of real prompts, tokenized by the model (meshbench.workload.prompts)
    prompt_ids: tuple[tuple[int, ...], ...] | None = None  # their token ids, once tokenized
    eos: str = "continue"  # stop | ban | continue: what an end-of-generation token does (EOS_POLICIES)
    # shared prefixes: groups of consecutive sessions whose prompts start with the same prefix_tokens ids (counted)
    prefix_groups: tuple[int, ...] = ()
    prefix_tokens: int = 0
    turns: int = 1  # a conversation of this many turns per session: each later turn adds turn_tokens user ids
    turn_tokens: int = 0
    cancel: int | str = "auto"  # an endpoint's cancel-and-retry run: auto, off, or the token clients cancel at
    # real conversations (the prompts file's ``turns``): each session's later turns' lengths, and once tokenized
    # their ids; synthetic turns draw turn_tokens ids each instead
    turn_lengths: tuple[tuple[int, ...], ...] | None = None
    turn_ids: tuple[tuple[tuple[int, ...], ...], ...] | None = None

    def __post_init__(self) -> None:
        if (
            isinstance(self.cancel, str)
            and self.cancel not in CANCEL_WORDS
            or isinstance(self.cancel, int)
            and (isinstance(self.cancel, bool) or self.cancel < 1)
        ):
            raise MeshbenchError(f"workload.cancel: {self.cancel!r} is none of auto, off or a token index >= 1")
        if not self.prompt_tokens:
            raise MeshbenchError("workload: at least one session is needed")
        if len(self.prompt_tokens) != len(self.new_tokens):
            raise MeshbenchError(
                f"workload: {len(self.prompt_tokens)} prompt lengths but {len(self.new_tokens)} new-token counts"
            )
        for name, values in (("prompt_tokens", self.prompt_tokens), ("new_tokens", self.new_tokens)):
            bad = [v for v in values if v < 1]
            if bad:
                raise MeshbenchError(f"workload: {name} must be >= 1 for every session, got {bad[0]}")
        if self.prefix_groups and sum(self.prefix_groups) != self.sessions:
            raise MeshbenchError(
                f"workload.prefix.groups: {len(self.prefix_groups)} groups hold {sum(self.prefix_groups)} sessions, "
                f"the workload has {self.sessions}"
            )
        self._check_turns()
        if self.prefix_groups and min(self.prompt_tokens) <= self.prefix_tokens:
            raise MeshbenchError("workload.prefix: every session needs prompt tokens of its own after the prefix")

    def _check_turns(self) -> None:
        if self.turns == 1 and (self.turn_tokens or self.turn_lengths is not None):
            raise MeshbenchError("workload.turn_tokens: user tokens of later turns need workload.turns > 1")
        if self.turns == 1:
            return
        if self.prompts is None and self.turn_tokens < 1:
            raise MeshbenchError("workload.turns: a later turn needs user tokens of its own (turn_tokens >= 1)")
        if self.prompts is not None and self.turn_tokens:
            raise MeshbenchError(
                "workload.turn_tokens: real prompts take each later turn from the prompts file's 'turns' (JSON "
                "lines); turn_tokens draws synthetic ids"
            )
        lengths = self.turn_lengths
        if lengths is not None and self.prompts is None:
            raise MeshbenchError("workload.turn_tokens: lists of turn lengths are real prompts' (workload.prompts)")
        if lengths is not None and (
            len(lengths) != self.sessions or any(len(x) != self.turns - 1 or min(x) < 1 for x in lengths)
        ):
            raise MeshbenchError(
                f"workload.turn_tokens: give each of the {self.sessions} sessions {self.turns - 1} later turns' "
                "lengths, each >= 1"
            )

    @classmethod
    def uniform(cls, sessions: int, prompt_tokens: int, new_tokens: int, seed: int = 0) -> "Workload":
        return cls((prompt_tokens,) * sessions, (new_tokens,) * sessions, seed)

    @property
    def sessions(self) -> int:
        return len(self.prompt_tokens)

    @property
    def longest(self) -> int:
        """Positions the longest session needs: prompt plus every new token (a conversation's last turn: every
        earlier prompt, answer and user turn)."""
        return max(
            p + sum(self.turn_sizes(k)) + self.turns * n
            for k, (p, n) in enumerate(zip(self.prompt_tokens, self.new_tokens))
        )

    @property
    def longest_prompt(self) -> int:
        """The longest prompt: a conversation's last turn holds every earlier prompt, answer and user turn."""
        return max(
            p + sum(self.turn_sizes(k)) + (self.turns - 1) * n
            for k, (p, n) in enumerate(zip(self.prompt_tokens, self.new_tokens))
        )

    def turn_sizes(self, k: int) -> tuple[int, ...]:
        """Session k's user ids in each turn after the first: the real turns' lengths (0 each until the prompts
        file is read), else turn_tokens each."""
        if self.turn_lengths is not None:
            return self.turn_lengths[k]
        if self.prompts is not None:
            return (0,) * (self.turns - 1)
        return (self.turn_tokens,) * (self.turns - 1)

    def session_ids(self) -> list[str]:
        width = len(str(self.sessions - 1))
        return [f"s{i:0{width}d}" for i in range(self.sessions)]

    def groups(self) -> list[list[str]]:
        """The sessions of each prefix group, in order (none without shared prefixes)."""
        ids, out, at = self.session_ids(), [], 0
        for n in self.prefix_groups:
            out.append(ids[at : at + n])
            at += n
        return out

    def prefixes(self, vocab_size: int) -> list[tuple[int, ...]]:
        """Each group's prefix ids, from their own stream of the seed (own ids are drawn as without a prefix)."""
        rng = np.random.default_rng([self.seed, 0x9E])
        return [tuple(int(t) for t in rng.integers(0, vocab_size, self.prefix_tokens)) for _ in self.prefix_groups]

    def requests(self, vocab_size: int, eog: frozenset[int] = frozenset()) -> list[GenerationRequest]:
        """One request per session; with ``eos: stop`` each ends at any of the model's ``eog`` tokens."""
        stop = eog if self.eos == "stop" else frozenset()
        if self.prompt_ids is not None:  # real prompts: their ids, as the model's tokenizer gave them
            turns = self.turn_ids or ((),) * self.sessions
            return [
                GenerationRequest(sid, ids, n, stop, turns=later)
                for sid, ids, n, later in zip(self.session_ids(), self.prompt_ids, self.new_tokens, turns)
            ]
        rng = np.random.default_rng(self.seed)
        heads = [p for p, group in zip(self.prefixes(vocab_size), self.groups()) for _ in group]
        heads = heads or [()] * self.sessions
        return [
            GenerationRequest(
                sid,
                head + tuple(int(t) for t in rng.integers(0, vocab_size, p - len(head))),
                n,
                stop,
                turns=self.later_turns(k, vocab_size),
            )
            for k, (sid, head, p, n) in enumerate(zip(self.session_ids(), heads, self.prompt_tokens, self.new_tokens))
        ]

    def later_turns(self, k: int, vocab_size: int) -> tuple[tuple[int, ...], ...]:
        """Session k's user ids of each turn after the first, from their own stream of the seed."""
        rng = np.random.default_rng([self.seed, 0x7E, k])
        return tuple(
            tuple(int(t) for t in rng.integers(0, vocab_size, self.turn_tokens)) for _ in range(self.turns - 1)
        )

    def record(self) -> records.Workload:
        """The workload as results.json records it: each session's own prompt tokens (after a shared prefix), the
        prefix groups, and turns where a session has more than one."""
        talk = self.turns > 1
        return records.Workload(
            sessions=self.sessions,
            prompt_tokens=[p - self.prefix_tokens for p in self.prompt_tokens],
            new_tokens=list(self.new_tokens),
            seed=self.seed,
            arrivals=self.arrivals,
            prompts=self.prompts,
            eos=self.eos,
            prefix=records.SharedPrefix(groups=list(self.prefix_groups), tokens=self.prefix_tokens)
            if self.prefix_groups
            else None,
            turns=self.turns if talk else None,
            # the real turns' lengths per session, else the synthetic count
            turn_tokens=(self.turn_tokens if self.turn_lengths is None else [list(x) for x in self.turn_lengths])
            if talk
            else None,
        )

    def to_dict(self) -> dict:
        """The config echo's workload section: the record's, and cancel where it is not auto."""
        return {**serial.to_json(self.record()), **({"cancel": self.cancel} if self.cancel != "auto" else {})}


@dataclass(frozen=True, slots=True)
class WorkloadSection:
    """The config's ``workload`` section as written, with the DGR-012 run's defaults (8 sessions, 4-token prompts,
    8 new tokens); a length is one for every session or a list of one per session."""

    sessions: int = 8
    prompt_tokens: int | tuple[int, ...] = 4
    new_tokens: int | tuple[int, ...] = 8
    seed: int = 0
    arrivals: str = "all-at-once"  # meshbench.workload.arrivals.parse reads it
    prompts: str | None = None  # a file of real prompts (meshbench.workload.prompts)
    eos: str | None = None  # null: stop for real prompts (ban for their conversations), continue for synthetic ones
    prefix: dict | None = None  # {groups: [sizes], tokens: n}: shared prefixes; prompt_tokens are then each own
    turns: int = 1  # conversations: each session's later turns, each the whole conversation so far + turn_tokens
    # synthetic user ids per later turn; with real prompts (their file's 'turns') 0, or as an echo writes them the
    # real turns' lengths, one list per session
    turn_tokens: int | tuple[tuple[int, ...], ...] = 0
    cancel: int | str = "auto"  # an endpoint's cancel-and-retry run (meshbench.endpoint.cancel)

    def build(self, source: str) -> Workload:
        # NOTE: real prompts end where the model says by default (a real conversation's answers at new_tokens, eos
        # ban: its turns have fixed lengths); synthetic ones keep the seed's behaviour.
        real = "ban" if self.turns > 1 else "stop"
        eos = self.eos or (real if self.prompts is not None else "continue")
        n = self.sessions
        groups, shared = (tuple(self.prefix["groups"]), self.prefix["tokens"]) if self.prefix else ((), 0)
        real_turns = None if isinstance(self.turn_tokens, int) else tuple(tuple(x) for x in self.turn_tokens)
        return Workload(
            tuple(shared + p for p in _per_session(self.prompt_tokens, n, "prompt_tokens", source)),
            _per_session(self.new_tokens, n, "new_tokens", source),
            self.seed,
            self.arrivals,
            self.prompts,
            eos=eos,
            prefix_groups=groups,
            prefix_tokens=shared,
            turns=self.turns,
            turn_tokens=self.turn_tokens if isinstance(self.turn_tokens, int) else 0,
            cancel=self.cancel,
            turn_lengths=real_turns,
        )


def _per_session(value, n: int, name: str, source: str) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * n
    if len(value) != n:
        raise MeshbenchError(f"{source}: workload.{name} has {len(value)} entries for {n} sessions")
    return tuple(value)
