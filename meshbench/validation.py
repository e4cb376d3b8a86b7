"""Loading the committed JSON Schemas and turning violations into one-line messages."""

from __future__ import annotations

import json
import math
import reprlib
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    return json.loads(resources.files("meshbench.schemas").joinpath(name).read_text())


def _is_integer(checker, instance) -> bool:  # noqa: ARG001
    # JSON Schema's "integer" admits 4.0; meshbench counts sessions and bytes in ints only.
    return isinstance(instance, int) and not isinstance(instance, bool)


_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


SCHEMAS = (
    "config.schema.json",
    "results.schema.json",
    "endpoint.schema.json",
    "matrix.schema.json",
    "history.schema.json",
    "hunt.schema.json",
)


@lru_cache(maxsize=None)
def _registry() -> Registry:
    """Every schema by its ``$id``: one may refer to another's definition (an endpoint's environment is a
    node's)."""
    resources_ = [Resource.from_contents(load(n), default_specification=DRAFT202012) for n in SCHEMAS]
    return Registry().with_resources((i, r) for r in resources_ if (i := r.id()))


@lru_cache(maxsize=None)
def _validator(name: str):
    return _Validator(load(name), registry=_registry())


def errors(instance, name: str) -> list[str]:
    """Every violation as 'path: message', in a stable order."""
    validator = _validator(name)
    out = []
    for e in sorted(validator.iter_errors(instance), key=lambda e: (list(map(str, e.absolute_path)), e.message)):
        path = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        out.append(f"{path}: {_short(e)}")
    return out


_repr = reprlib.Repr()
_repr.maxlist = _repr.maxdict = 4
_repr.maxstring = _repr.maxother = 60
_repr.maxlevel = 2


def _short(e: jsonschema.ValidationError) -> str:
    """One line, whatever the size of the offending value (a list of 100000 entries stays short)."""
    if e.validator == "additionalProperties":
        return e.message.replace("Additional properties are not allowed", "unknown key")
    if e.validator == "oneOf":
        said = e.schema.get("description") if isinstance(e.schema, Mapping) else None
        return f"{_repr.repr(e.instance)} is not valid: {said or 'no alternative matches'}"
    if e.validator == "maxItems" and isinstance(e.instance, list):
        return f"{_repr.repr(e.instance)} has {len(e.instance)} entries, more than the {e.validator_value} allowed"
    message = e.message
    return message if len(message) <= 200 else message[:200] + "..."


def unrepresentable(value, path: str = "") -> str | None:
    """The first value JSON Schema cannot judge and a results file must never hold: a float that is not finite
    (YAML's .nan, JSON's 1e999), an integer beyond 64 bits (no float holds it), or a string with a lone
    surrogate (which no UTF-8 file can store). Its path, or None. Iterative: a deeply nested value is walked
    without recursion."""
    stack = [(path, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return f"{where or '(top level)'}: {v!r} is not a finite number"
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 1 << 63:
            return f"{where or '(top level)'}: an integer beyond 64 bits"
        if isinstance(v, str) and _surrogate(v):
            return f"{where or '(top level)'}: holds a lone surrogate (not encodable as UTF-8)"
        if isinstance(v, dict):
            for k, x in v.items():
                if isinstance(k, str) and _surrogate(k):
                    return f"{where or '(top level)'}: a key holds a lone surrogate (not encodable as UTF-8)"
                stack.append((f"{where}.{k}" if where else str(k), x))
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", x) for i, x in enumerate(v))
    return None


def _surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
