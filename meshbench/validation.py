"""Loading the committed JSON Schemas and turning violations into one-line messages."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

import jsonschema


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    return json.loads(resources.files("meshbench.schemas").joinpath(name).read_text())


def errors(instance, name: str) -> list[str]:
    """Every violation as 'path: message', in a stable order."""
    validator = jsonschema.Draft202012Validator(load(name))
    out = []
    for e in sorted(validator.iter_errors(instance), key=lambda e: (list(map(str, e.absolute_path)), e.message)):
        path = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        out.append(f"{path}: {_short(e)}")
    return out


def _short(e: jsonschema.ValidationError) -> str:
    if e.validator == "additionalProperties":
        return e.message.replace("Additional properties are not allowed", "unknown key")
    if e.validator == "oneOf":
        return f"{e.instance!r} is not valid: {e.schema.get('description', 'no alternative matches')}"
    return e.message
