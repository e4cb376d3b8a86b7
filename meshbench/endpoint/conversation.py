"""A conversation over HTTP: a session's later user turns, each sent as soon as the turn before it is answered,
its prompt the whole conversation so far, as a chat client sends it:
- ``native`` (``/completion``): the last turn's prompt ids, its answer's ids, then the next user turn's ids (as
  the server tokenizes it, nothing special added): the growing context of a meshbench node's conversations;
- ``chat`` (``/v1/chat/completions``): the messages so far, the answer as the assistant's message, then the next
  user turn.

The server's prompt cache can serve a turn's earlier part from the slot that ran the turn before it: the path a
conversation takes through a server, and the one it is here to exercise. A turn after a failed or cut one is
not sent. ``bodies`` rebuilds a conversation's requests from its recorded answers, for the cold pass and verify.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from meshbench.engine import apis

APIS = apis.names(conversations=True)  # the APIs a conversation runs over


@dataclass(frozen=True, slots=True)
class Turns:
    """A session's later user turns: their ids (the server's tokenizer, nothing special added) and texts."""

    ids: tuple[tuple[int, ...], ...]
    texts: tuple[str, ...]


class Answer(Protocol):
    @property
    def tokens(self) -> list[int]: ...

    @property
    def text(self) -> str: ...


def follow(api: str, body: dict, answer: Answer, ids: Sequence[int], text: str) -> dict:
    """The next turn's request: ``body`` (the turn answered), its ``answer``, then the user's next turn."""
    if apis.of(api).ids:
        return {**body, "prompt": [*body["prompt"], *answer.tokens, *ids]}
    said = [{"role": "assistant", "content": answer.text}, {"role": "user", "content": text}]
    return {**body, "messages": [*body["messages"], *said]}


def bodies(api: str, first: dict, answers: Sequence[Answer], turns: Turns) -> list[dict]:
    """The requests of a conversation's later turns, rebuilt from its first request and the answers before each
    (``answers``: turn 1, 2, ... in order): one per later turn among them."""
    out, body = [], first
    for k in range(1, min(len(answers), len(turns.ids) + 1)):
        body = follow(api, body, answers[k - 1], turns.ids[k - 1], turns.texts[k - 1])
        out.append(body)
    return out
