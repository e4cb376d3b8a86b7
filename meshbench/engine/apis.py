"""Every API a server is asked over (``engine.api``), in one registry, and what each one can carry.

Code asks an API what it can do (``of(api).ids``), never compares its name: a new API is one entry here (its path,
what it carries, how it asks for probabilities and how it frames a prompt); tests/test_apis.py holds the config's
choices and every table that names APIs to this registry. ``auto`` is a choice, not an API: the probe resolves it
(meshbench.endpoint.client) to the native API where the server answers ``/props``, else the completions API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from meshbench.errors import MeshbenchError


@dataclass(frozen=True, slots=True)
class Api:
    name: str
    path: str  # where a completion is asked
    ids: bool  # prompts go as token ids, and answers come back as ids with what the server evaluated and computed
    messages: bool  # the prompt is one user message (a chat template between it and the model)
    probs: Callable[[int], dict[str, Any]]  # the fields that ask for the top k log-probabilities per token
    says: str  # in words, for --help

    @property
    def conversations(self) -> bool:
        """A conversation's turns can carry each answer as the model gave it: as ids, or as the assistant's
        message (a text prompt would be tokenized again, and an answer's ids need not survive that)."""
        return self.ids or self.messages

    @property
    def cancels(self) -> bool:
        """A client's disconnect is judged from what came before it: only where answers are ids the server says
        it evaluated (a text stream's last piece need not be a whole token)."""
        return self.ids


NATIVE = Api("native", "/completion", ids=True, messages=False, probs=lambda k: {"n_probs": k},
             says="llama-server's /completion, token ids")  # fmt: skip
OPENAI = Api("openai", "/v1/completions", ids=False, messages=False, probs=lambda k: {"logprobs": k},
             says="/v1/completions, text")  # fmt: skip
CHAT = Api("chat", "/v1/chat/completions", ids=False, messages=True,
           probs=lambda k: {"logprobs": True, "top_logprobs": k},
           says="/v1/chat/completions, each prompt one user message, text")  # fmt: skip

APIS: dict[str, Api] = {a.name: a for a in (NATIVE, OPENAI, CHAT)}
AUTO = "auto"  # the config's default: the probe picks NATIVE or OPENAI
CHOICES = (AUTO, *APIS)  # what engine.api and --api accept


def of(name: str) -> Api:
    """The API named ``name`` (resolved: never ``auto``); any other name is the input's error, in one line."""
    api = APIS.get(name)
    if api is None:
        raise MeshbenchError(f"engine.api {name!r:.40} is none of {', '.join(APIS)}")
    return api


UNKNOWN = Api("unknown", "", ids=False, messages=False, probs=lambda k: {}, says="")


def recorded(name: object) -> Api:
    """The API a record names: one of them, or (a forged or damaged record, read before its schema refuses it)
    none, of which nothing is assumed."""
    return APIS.get(name, UNKNOWN) if isinstance(name, str) else UNKNOWN


def names(**asked: bool) -> tuple[str, ...]:
    """The names of the APIs that are (or are not) each thing asked: ``names(conversations=True)``."""
    unknown = set(asked) - {"ids", "messages", "conversations", "cancels"}
    if unknown:
        raise TypeError(f"an API is not {sorted(unknown)}")
    return tuple(a.name for a in APIS.values() if all(getattr(a, k) == v for k, v in asked.items()))
