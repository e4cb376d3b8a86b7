"""Every kind of engine a config names (``engine.kind``), in one registry, and what each kind is.

Code asks a kind what it is (``of(spec.kind).llama``), never compares its name: a new kind is one entry here, its
rules in ``spec_rules.KIND_RULES``, its name for a sweep in ``workload.config.STORIES`` and, where meshbench runs it,
its setup in ``factory.SETUPS`` and its record in ``records.serial._ENGINE_KINDS``; tests/test_engine_kinds.py holds
every table to this registry."""

from __future__ import annotations

from dataclasses import dataclass

from meshbench.errors import MeshbenchError


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    own: bool  # an engine of meshbench's own, driven by the node's scheduler (else a server over HTTP)
    llama: bool  # llama.cpp runs a GGUF model in meshbench's process: its build and the CPU decide the numerics
    tokenized: bool  # its model has a tokenizer and end-of-generation tokens of its own
    numpy: bool  # numpy computes it at the dtype it is given (float64: exact to 2.2e-16 per operation)


SYNTHETIC = Kind("synthetic", own=True, llama=False, tokenized=False, numpy=True)
GGUF = Kind("gguf", own=True, llama=True, tokenized=True, numpy=False)
ENDPOINT = Kind("endpoint", own=False, llama=False, tokenized=True, numpy=False)  # a server's kernels are its own

KINDS: dict[str, Kind] = {k.name: k for k in (SYNTHETIC, GGUF, ENDPOINT)}


def of(name: str) -> Kind:
    """The kind named ``name``; a name of no kind is the input's error, in one line."""
    kind = KINDS.get(name)
    if kind is None:
        raise MeshbenchError(f"engine.kind {name!r:.40} is none of {', '.join(KINDS)}")
    return kind


UNKNOWN = Kind("unknown", own=False, llama=False, tokenized=False, numpy=False)


def recorded(name: object) -> Kind:
    """The kind a record names. A config's kind is checked when it is read (``of``); a record's is checked by the
    schema, but a forged or damaged record is read before that (a rerun's view, a forged field's test): a name of
    no kind is then none of them, and nothing is assumed of it."""
    return KINDS.get(name, UNKNOWN) if isinstance(name, str) else UNKNOWN


def names(**asked: bool) -> frozenset[str]:
    """The names of the kinds that are (or are not) each thing asked: ``names(own=True)``."""
    unknown = set(asked) - {"own", "llama", "tokenized", "numpy"}
    if unknown:
        raise TypeError(f"a kind is not {sorted(unknown)}")
    return frozenset(k.name for k in KINDS.values() if all(getattr(k, a) == v for a, v in asked.items()))
