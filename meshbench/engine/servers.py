"""Every flavour of server an endpoint sweep can meet, in one registry, and what each one is: how it is told apart,
the APIs it serves (the first is the one ``--api auto`` takes), how it tokenizes a text, whether it says what it
is (``/props``: its build, model and slots) and whether it honours ``cache_prompt``.

Code asks a flavour what it does (``recorded(e.server).cache_prompt``), never compares its name: a new flavour is one
entry here and its test in ``detect``; tests/test_servers.py holds the registry to what a bundle records. Two so
far, told apart by ``/props``: llama-server answers it; any other server is taken for an OpenAI-compatible one
with llama-cpp-python's tokenizer endpoint (the only other server meshbench has measured)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from meshbench.engine import apis


@dataclass(frozen=True, slots=True)
class Tokenizer:
    path: str  # where a text is tokenized
    body: Callable[[str, bool], dict[str, Any]]  # the request for a text, and whether special tokens are added
    switch: bool  # it honours that switch (else what it adds to an empty text is cut from each text's start)


@dataclass(frozen=True, slots=True)
class Flavour:
    name: str  # as a bundle records it (endpoint.server)
    apis: tuple[str, ...]  # the APIs it serves; the first is the one --api auto takes
    tokenizer: Tokenizer | None
    props: bool  # it answers /props: its build, its model's path, its slots
    cache_prompt: bool  # a request's cache_prompt false keeps its prompt out of the server's cache


LLAMA_SERVER = Flavour(
    "llama-server",
    apis=(apis.NATIVE.name, apis.OPENAI.name, apis.CHAT.name),
    tokenizer=Tokenizer("/tokenize", lambda text, special: {"content": text, "add_special": special}, switch=True),
    props=True,
    cache_prompt=True,
)
OPENAI_COMPATIBLE = Flavour(
    "openai-compatible",
    apis=(apis.OPENAI.name, apis.CHAT.name),
    tokenizer=Tokenizer("/extras/tokenize", lambda text, special: {"input": text}, switch=False),
    props=False,
    cache_prompt=False,  # (llama-cpp-python's server ignores it)
)
FLAVOURS: dict[str, Flavour] = {f.name: f for f in (LLAMA_SERVER, OPENAI_COMPATIBLE)}


def detect(props: object) -> Flavour:
    """The flavour of a server from what it answered to ``/props`` (None: nothing, or not a JSON object)."""
    return LLAMA_SERVER if isinstance(props, dict) else OPENAI_COMPATIBLE


UNKNOWN = Flavour("unknown", apis=(), tokenizer=None, props=False, cache_prompt=False)


def recorded(name: object) -> Flavour:
    """The flavour a record names; of a name no flavour has (a forged or damaged record), nothing is assumed."""
    return FLAVOURS.get(name, UNKNOWN) if isinstance(name, str) else UNKNOWN
