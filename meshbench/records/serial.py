"""The one module that knows results.json's keys: records to JSON values and back.

``to_json`` writes a record's fields in order, leaving out an optional key (a field that defaults to None)
when it is None. ``from_json`` builds the typed record from a JSON value that already passed the schema
(verify checks the raw file first): numbers are taken as they are (an int stays an int), a key the record
does not have, or a value of the wrong type, is a MeshbenchError naming the record.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, TypeVar

import cattrs
from cattrs.gen import make_dict_structure_fn, override
from cattrs.v import format_exception

from meshbench.errors import MeshbenchError
from meshbench.records import (
    canary,
    cancel,
    context,
    conversation,
    documents,
    endpoint_figures,
    hunt,
    margins,
    matrix,
    model,
    open_loop,
    perturbation,
    sharing,
    tick,
)
from meshbench.records import completion as answers
from meshbench.records import history as histories

T = TypeVar("T")


def _exact(kind: type, name: str) -> Any:
    """A number or string taken as it is: no coercion (3 stays 3, never 3.0; "3" is no int)."""
    allowed = (int, float) if kind is float else (kind,)

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, allowed) or (isinstance(value, bool) and kind is not bool):
            raise TypeError(f"{value!r} is not {name}")
        return value

    return structure


def _converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    for kind, name in ((int, "an integer"), (float, "a number"), (str, "a string"), (bool, "a boolean")):
        conv.register_structure_hook(kind, _exact(kind, name))
    conv.register_structure_hook_func(_by_level, _levels(conv))  # (before the records' hooks, which look it up)
    conv.register_structure_hook(TURN_TOKENS, _turn_tokens(conv))  # (before the records' hooks, which look it up)
    # a request history is its own file's shape too (history.schema.json, its own checks): read and written as one
    # (inside a document whose schema holds it to history.schema.json: a hunt's, checked before it is typed)
    conv.register_structure_hook(histories.History, lambda v, _: histories.from_json(v, "a history", True))
    conv.register_unstructure_hook(histories.History, histories.to_json)
    conv.register_unstructure_hook(histories.Facts, _unstructure(conv, histories.Facts))
    conv.register_structure_hook(histories.Facts, _structure(conv, histories.Facts))
    for cls in _records():
        conv.register_unstructure_hook(cls, _unstructure(conv, cls))
        conv.register_structure_hook(cls, _structure(conv, cls))
    conv.register_structure_hook(ENGINE_INFO, _engine_info(conv))
    return conv


ENGINE_INFO = context.SyntheticEngineInfo | context.GgufEngineInfo
# each kind of engine of meshbench's own (engine.kinds: tests/test_engine_kinds.py holds this to it), its record
_ENGINE_KINDS = {"synthetic": context.SyntheticEngineInfo, "gguf": context.GgufEngineInfo}


def _engine_info(conv: cattrs.Converter) -> Any:
    """An engine record is its kind's: the ``kind`` key says which."""

    def structure(value: Any, _: Any) -> Any:
        kind = value.get("kind") if isinstance(value, dict) else None
        if kind not in _ENGINE_KINDS:
            raise ValueError(f"engine kind {kind!r} is none of {sorted(_ENGINE_KINDS)}")
        return conv.structure(value, _ENGINE_KINDS[kind])

    return structure


# workload.turn_tokens: one count of synthetic ids, or the real turns' lengths, a list per session
TURN_TOKENS = int | list[list[int]] | None


def _turn_tokens(conv: cattrs.Converter) -> Any:
    def structure(value: Any, _: Any) -> Any:
        return None if value is None else conv.structure(value, list[list[int]] if isinstance(value, list) else int)

    return structure


def _structure(conv: cattrs.Converter, cls: type) -> Any:
    """A record from its JSON object: every key one of its fields' (a field may name its own key: ``json``)."""
    renamed = {f.name: override(rename=f.metadata["json"]) for f in dataclasses.fields(cls) if "json" in f.metadata}
    # (cattrs takes the overrides as keyword arguments its stubs type as its own flags)
    return make_dict_structure_fn(cls, conv, _cattrs_forbid_extra_keys=True, **renamed)  # type: ignore[arg-type]


def _unstructure(conv: cattrs.Converter, cls: type) -> Any:
    """A record as a JSON object: its fields in order, each under its own key (its name, or the ``json`` its field
    says), an optional one (defaulting to None) left out when None."""
    fields = [(f.name, f.metadata.get("json", f.name), f.default is None) for f in dataclasses.fields(cls)]

    def unstructure(record: Any) -> dict[str, Any]:
        out = {}
        for name, key, optional in fields:
            value = getattr(record, name)
            if not (optional and value is None):
                out[key] = _level_keys(conv.unstructure(value))
        return out

    return unstructure


def _by_level(t: Any) -> bool:
    """A map by concurrency (``dict[int, X]``): results.json keys it by the level's decimal digits."""
    return typing.get_origin(t) is dict and typing.get_args(t)[:1] == (int,)


def _levels(conv: cattrs.Converter) -> Any:
    """A map by concurrency from its JSON object: each key a positive integer's digits as Python writes them."""

    def structure(value: Any, t: Any) -> dict[int, Any]:
        if not isinstance(value, dict):
            raise TypeError(f"{value!r} is not an object")
        inner = typing.get_args(t)[1]
        out = {}
        for k, x in value.items():
            if not (isinstance(k, str) and 0 < len(k) <= 9 and k.isascii() and k.isdecimal() and k[0] != "0"):
                raise MeshbenchError(f"{str(k)[:20]!r} is not a concurrency (a positive integer's decimal digits)")
            try:
                out[int(k)] = conv.structure(x, inner)
            except (cattrs.BaseValidationError, TypeError, ValueError, KeyError, MeshbenchError) as e:
                raise MeshbenchError(f"[{k!r}]: {_reason(e)}") from None
        return out

    return structure


def _level_keys(value: Any) -> Any:
    """A map by concurrency as JSON keys it: by its digits (JSON's keys are strings)."""
    if isinstance(value, dict) and any(type(k) is int for k in value):
        return {str(k): x for k, x in value.items()}
    return value


def _records() -> list[type]:
    """Every record class of the model's modules."""
    return [
        v
        for m in MODULES
        for v in vars(m).values()
        if isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == m.__name__
    ]


# (in the order their hooks are made: a record's hook takes its fields' hooks as they are when it is made)
MODULES = (
    endpoint_figures,
    tick,
    model,
    answers,
    context,
    documents,
    sharing,
    margins,
    perturbation,
    canary,
    cancel,
    open_loop,
    conversation,
    hunt,
    matrix,
)


_CONVERTER = _converter()


def to_json(record: Any) -> Any:
    """A record (or a list of them) as the JSON value results.json holds."""
    return _CONVERTER.unstructure(record)


def engine_info(value: Any, where: str = "results.json") -> context.SyntheticEngineInfo | context.GgufEngineInfo:
    """The engine's record, of whichever engine its ``kind`` says (ENGINE_INFO's hook decides)."""
    return from_json(value, ENGINE_INFO, where)  # type: ignore[arg-type]  # (a union: its own structure hook)


def from_json(value: Any, cls: type[T], where: str = "results.json") -> T:
    """The typed record of ``cls`` from its JSON value (already checked against the schema)."""
    try:
        record: T = _CONVERTER.structure(value, cls)
        return record
    except (cattrs.BaseValidationError, TypeError, ValueError, KeyError) as e:
        raise MeshbenchError(f"{where}: not a {getattr(cls, '__name__', 'engine')} record: {_reason(e)}") from None


def _reason(e: BaseException) -> str:
    """The first leaf of a cattrs error group, with where it was."""
    if isinstance(e, cattrs.BaseValidationError):
        notes = cattrs.transform_error(e, format_exception=_said)
        return notes[0] if notes else str(e)
    return str(e)


def _said(e: BaseException, kind: type | None) -> str:
    """A leaf error in words: a MeshbenchError's own (a record's own checks), else cattrs'."""
    return str(e) if isinstance(e, MeshbenchError) else format_exception(e, kind)


def matrix_document(value: Any, where: str = "results.json") -> matrix.MatrixDocument:
    """A settings matrix's results.json, typed whole (the file already checked against the schema)."""
    return from_json(value, matrix.MatrixDocument, where)


def hunt_document(value: Any, where: str = "results.json") -> hunt.HuntDocument:
    """A hunt's results.json, typed whole (the file already checked against the schema)."""
    return from_json(value, hunt.HuntDocument, where)


def node_results(value: Any) -> documents.NodeResults:
    """A node results.json, typed whole (the file already checked against the schema)."""
    return from_json(value, documents.NodeResults, "results.json")


def endpoint_results(value: Any) -> documents.EndpointResults:
    """An endpoint results.json, typed whole (the file already checked against the schema)."""
    return from_json(value, documents.EndpointResults, "results.json")


def completion(value: Any) -> model.Completion:
    """An endpoint's answer, from its JSON value."""
    return from_json(value, model.Completion, "a completion")
