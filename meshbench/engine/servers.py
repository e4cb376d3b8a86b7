"""Every flavour of server an endpoint sweep can meet, in one registry, and what each one is: how it is told apart
(its mark, in words a bundle records), the APIs it serves (the first is the one ``--api auto`` takes), how it
tokenizes a text, whether it says what it is (``/props``: its build, model and slots), whether it honours
``cache_prompt``, whether it reports top log-probabilities, whose metrics it exposes and what it promises of a
request's seed.

Code asks a flavour what it does (``recorded(e.server).cache_prompt``), never compares its name: a new flavour is one
entry here, its mark and its test; tests/test_servers.py holds the registry to what a bundle records. A server
is the first flavour whose mark its answers carry (``detect``), in the registry's order, else a generic
OpenAI-compatible server, of which meshbench assumes nothing it does not see; ``engine.flavour`` (``--flavour``)
names one instead. The endpoints each flavour's mark and tokenizer use are in docs/guides/endpoint.md, with
where each is documented."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from meshbench.engine import apis
from meshbench.errors import MeshbenchError

AUTO = "auto"  # engine.flavour's default: detected from the server's answers
NAMED = "named by engine.flavour (--flavour)"  # why a flavour the user named is the server's


@dataclass(frozen=True, slots=True)
class Tokenizer:
    path: str  # where a text is tokenized
    body: Callable[[str, bool], dict[str, Any]]  # the request for a text, and whether special tokens are added
    switch: bool  # it honours that switch (else what it adds to an empty text is cut from each text's start)


@dataclass(frozen=True, slots=True)
class Answers:
    """What a server answered to the probe (each None where it answered nothing, or no JSON object)."""

    props: dict[str, Any] | None  # GET /props (llama-server's build, model and slots)
    owners: tuple[str, ...]  # GET /v1/models: each model's owned_by, as a string ("" where absent)

    def owned_by(self, owner: str) -> bool:
        """Every model the server lists is ``owner``'s (and it lists one)."""
        return bool(self.owners) and all(x == owner for x in self.owners)

    version: dict[str, Any] | None = None  # GET /version (vLLM's {"version": ...})


@dataclass(frozen=True, slots=True)
class Flavour:
    name: str  # as a bundle records it (endpoint.server)
    mark: Callable[[Answers], bool]  # how it is told apart: these answers are its (an owner: of every model listed)
    why: str  # the mark in words, as a bundle records it (endpoint.detected)
    apis: tuple[str, ...]  # the APIs it serves; the first is the one --api auto takes
    tokenizer: Tokenizer | None  # None: it tokenizes nothing on request
    local: bool  # (no tokenizer) it names its model by a path here, whose tokenizer meshbench loads itself
    props: bool  # it answers /props: its build, its model's path, its slots
    cache_prompt: bool  # a request's cache_prompt false keeps its prompt out of the server's cache
    done: bool  # it ends a stream with "data: [DONE]" (else its end is a finish reason, then the body's clean end)
    logprobs: bool  # it may answer a request for top log-probabilities (False: it ignores one, so none is sent)
    metrics: str | None  # the prefix of its own gauges and counters in /metrics (None: it exposes none)
    seeds: str  # what it promises of a request's seed, in words

    @property
    def counted(self) -> bool:
        """Does meshbench know a prompt only by the server's count of it (``usage.prompt_tokens``): no tokenizer
        served, nor one loaded here? Then no prompt's ids are known (the generic flavour)."""
        return self.tokenizer is None and not self.local


PROPS = ("total_slots", "build_info", "default_generation_settings")  # llama-server's own /props keys


LLAMA_SERVER = Flavour(
    "llama-server",
    mark=lambda a: (a.props is not None and any(k in a.props for k in PROPS)) or a.owned_by("llamacpp"),
    why="it answers /props with llama-server's keys, or /v1/models says owned_by 'llamacpp'",
    apis=(apis.NATIVE.name, apis.OPENAI.name, apis.CHAT.name),
    tokenizer=Tokenizer("/tokenize", lambda text, special: {"content": text, "add_special": special}, switch=True),
    local=False,
    props=True,
    cache_prompt=True,
    done=True,
    logprobs=True,
    metrics="llamacpp:",
    seeds="each slot samples from its own generator, seeded by the request's seed",
)
LLAMA_CPP_PYTHON = Flavour(
    "llama-cpp-python",
    mark=lambda a: a.owned_by("me"),
    why="/v1/models says owned_by 'me', as llama-cpp-python's server does",
    apis=(apis.OPENAI.name, apis.CHAT.name),
    tokenizer=Tokenizer("/extras/tokenize", lambda text, special: {"input": text}, switch=False),
    local=False,
    props=False,
    cache_prompt=False,  # (it ignores the field)
    done=True,
    logprobs=True,
    metrics=None,
    seeds="one request at a time (one model behind a lock): a request's seed reseeds the model's generator",
)
VLLM = Flavour(
    "vllm",
    mark=lambda a: a.owned_by("vllm") and a.version is not None and isinstance(a.version.get("version"), str),
    why="/v1/models says owned_by 'vllm' and /version answers",
    apis=(apis.OPENAI.name, apis.CHAT.name),
    tokenizer=Tokenizer(
        "/tokenize", lambda text, special: {"prompt": text, "add_special_tokens": special}, switch=True
    ),
    local=False,
    props=False,
    cache_prompt=False,
    done=True,
    logprobs=True,
    metrics="vllm:",
    seeds="a generator per request, seeded by its seed; batch-invariant only with VLLM_BATCH_INVARIANT=1",
)
TRANSFORMERS = Flavour(
    "transformers",
    mark=lambda a: a.owned_by("local"),
    why="/v1/models says owned_by 'local', as transformers serve says of a model on its machine",
    apis=(apis.OPENAI.name, apis.CHAT.name),
    tokenizer=None,  # (it serves none: meshbench loads its model's own, from the path /v1/models names)
    local=True,
    props=False,
    cache_prompt=False,
    done=False,
    logprobs=False,  # (it ignores logprobs)
    metrics=None,
    seeds="a request's temperature samples only where the model's generation config sets do_sample (else every "
    "answer is greedy: measured on transformers 5.25.0); its seed sets torch's one global generator",
)
OPENAI_COMPATIBLE = Flavour(
    "openai-compatible",
    mark=lambda a: True,
    why="no other flavour's mark: a generic OpenAI-compatible server",
    apis=(apis.OPENAI.name, apis.CHAT.name),
    tokenizer=None,
    local=False,
    props=False,
    cache_prompt=False,
    done=False,
    logprobs=True,  # (asked; where none come, none are recorded)
    metrics=None,
    seeds="nothing assumed",
)
FLAVOURS: dict[str, Flavour] = {
    f.name: f for f in (LLAMA_SERVER, LLAMA_CPP_PYTHON, VLLM, TRANSFORMERS, OPENAI_COMPATIBLE)
}  # (in the order detect tries their marks: the generic one last)
CHOICES = (AUTO, *FLAVOURS)  # what engine.flavour and --flavour accept


def detect(answers: Answers, chosen: str = AUTO) -> tuple[Flavour, str]:
    """The flavour of a server, and why: the one ``chosen`` names, else the first whose mark its answers carry
    (the generic flavour's mark is every server's)."""
    if chosen != AUTO:
        flavour = FLAVOURS.get(chosen)
        if flavour is None:
            raise MeshbenchError(f"engine.flavour {chosen!r:.40} is none of {', '.join(CHOICES)}")
        return flavour, NAMED
    return next((f, f.why) for f in FLAVOURS.values() if f.mark(answers))  # (the generic one's mark is every server's)


UNKNOWN = Flavour(
    "unknown", mark=lambda a: False, why="", apis=(), tokenizer=None, local=False, props=False, cache_prompt=False,
    done=True, logprobs=False, metrics=None, seeds="nothing assumed",
)  # fmt: skip


def recorded(name: object) -> Flavour:
    """The flavour a record names; of a name no flavour has (a forged or damaged record), nothing is assumed."""
    return FLAVOURS.get(name, UNKNOWN) if isinstance(name, str) else UNKNOWN
