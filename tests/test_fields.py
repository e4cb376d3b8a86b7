"""Every field of results.json is compared by --rerun, recomputed by plain verify, wall-clock data with its
checks, or provenance (meshbench.results.fields); a forged value of the first two kinds is caught."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.results import fields, kinds
from meshbench.verify import bundle as verify
from meshbench.verify import reproduce

SCHEMA = json.loads((Path(__file__).parent.parent / "schemas" / "results.schema.json").read_text())


def schema_paths(node=SCHEMA, path: str = "", seen: tuple = ()) -> list[str]:
    """Every property path the results schema allows: ``levels[].sessions[].tokens``."""
    out = []
    if "$ref" in node:
        name = node["$ref"].split("/")[-1]
        return [] if name in seen else schema_paths(SCHEMA["$defs"][name], path, (*seen, name))
    for key in ("oneOf", "anyOf"):
        for sub in node.get(key, []):
            out += schema_paths(sub, path, seen)
    for k, v in node.get("properties", {}).items():
        p = f"{path}.{k}" if path else k
        out += [p, *schema_paths(v, p, seen)]
    if isinstance(node.get("items"), dict):
        out += schema_paths(node["items"], path + "[]", seen)
    if isinstance(node.get("additionalProperties"), dict):
        out += schema_paths(node["additionalProperties"], path + ".*", seen)
    return out


def test_every_field_of_the_schema_has_a_class():
    unclassified = sorted({p for p in schema_paths() if fields.class_of(p) is None})
    assert unclassified == []


def test_every_listed_prefix_is_a_field_of_the_schema():
    known = set(schema_paths())
    assert sorted(p for p in fields.CLASSES if p not in known) == []


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fields") / "b"
    r = CliRunner().invoke(app, ["sweep", "--levels", "1,2", "--repeat", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


def _leaves(value, path: str = ""):
    """(schema path, container, key) of every scalar in ``value``, the first element of each list only."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from (
                _leaves(v, f"{path}.{k}" if path else k)
                if isinstance(v, (dict, list))
                else [(f"{path}.{k}" if path else k, value, k)]
            )
    elif isinstance(value, list) and value:
        if isinstance(value[0], (dict, list)):
            yield from _leaves(value[0], path + "[]")
        else:
            yield path, value, 0


def _mutate(container, key) -> bool:
    v = container[key]
    if isinstance(v, bool):
        container[key] = not v
    elif isinstance(v, int):
        container[key] = v + 1
    elif isinstance(v, float):
        container[key] = v * 1.5 + 1
    elif isinstance(v, str):
        container[key] = v + "x" if len(v) != 64 else ("0" if v[0] != "0" else "1") + v[1:]
    else:
        return False
    return True


def test_a_forged_recomputed_or_rerun_field_is_caught(bundle):
    """Each scalar of a real bundle is forged in turn: a recomputed one fails plain verify (or the schema), a
    rerun-compared one changes what --rerun compares."""
    data = json.loads((bundle / "results.json").read_text())
    base_view = reproduce.deterministic_view(data)
    missed = []
    checked = 0
    for path, _, _ in list(_leaves(data)):
        kind = fields.class_of(path.replace(".[]", "[]"))
        if kind not in (fields.RECOMPUTED, fields.RERUN) or path.startswith(("config", "schema_version")):
            continue
        forged = copy.deepcopy(data)
        target = next((c, k) for p, c, k in _leaves(forged) if p == path)
        if not _mutate(*target):
            continue
        checked += 1
        if kind == fields.RERUN and reproduce.deterministic_view(forged) != base_view:
            continue
        try:
            caught = bool(verify.check_data(forged).failures)
        except Exception:  # the forged value breaks a recomputation outright: caught too
            caught = True
        if not caught and not kinds.schema_errors(forged):
            missed.append(f"{path} ({kind})")
    assert checked > 150
    assert missed == [], "\n".join(missed)


# (Each record's keys against the schema, both ways: tests/test_records.py, on the typed model.)
