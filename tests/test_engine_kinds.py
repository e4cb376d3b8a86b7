"""The registry of engine kinds (meshbench.engine.kinds): every per-kind table covers exactly its kinds, and no
code decides by comparing a kind's name (it asks the kind what it is)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Callable

import pytest

from meshbench.engine import factory, kinds, spec_rules
from meshbench.engine.spec import EngineSpec
from meshbench.errors import MeshbenchError
from meshbench.records import serial
from meshbench.workload import config

PACKAGE = Path(__file__).resolve().parent.parent / "meshbench"


def test_every_table_by_kind_covers_the_registry():
    every, own = set(kinds.KINDS), set(kinds.names(own=True))
    assert set(spec_rules.KIND_RULES) == every
    assert set(config.STORIES) == every
    assert set(factory.SETUPS) == own
    assert set(serial._ENGINE_KINDS) == own
    committed = json.loads((PACKAGE.parent / "schemas" / "config.schema.json").read_text())
    assert committed["properties"]["engine"]["properties"]["kind"]["enum"] == list(kinds.KINDS)


def test_the_sets_a_setting_belongs_to_come_from_what_each_kind_is():
    assert spec_rules.NODE == {"synthetic", "gguf"}
    assert spec_rules.GGUF == {"gguf"}
    assert spec_rules.ENDPOINT == {"endpoint"}
    assert spec_rules.TOKENIZED == {"gguf", "endpoint"}
    assert spec_rules.ALL == {"synthetic", "gguf", "endpoint"}
    assert kinds.names(numpy=True) == {"synthetic"}
    assert kinds.names(own=True, llama=False) == {"synthetic"}
    with pytest.raises(TypeError):
        kinds.names(fast=True)


@pytest.mark.parametrize("name", ["vllm", "", "GGUF", "gguf "])
def test_a_name_of_no_kind_is_refused_in_one_line(name):
    with pytest.raises(MeshbenchError) as e:
        kinds.of(name)
    assert "\n" not in str(e.value) and "synthetic, gguf, endpoint" in str(e.value)


def test_a_server_kind_has_no_setup_of_meshbench_s_own():
    spec = EngineSpec(kind="endpoint", url="http://127.0.0.1:1")
    with pytest.raises(MeshbenchError, match="over HTTP"):
        factory.setup(spec, None)  # type: ignore[arg-type]


def _kind_like(node: ast.AST) -> bool:
    """Something's kind: a name or attribute ending in ``kind``, ``x["kind"]``, ``x.get("kind")``,
    ``getattr(x, "kind")``."""
    if isinstance(node, ast.Name):
        return node.id.endswith("kind")
    if isinstance(node, ast.Attribute):
        return node.attr.endswith("kind")
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "kind"
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
        called = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
        keyed = any(isinstance(a, ast.Constant) and a.value == "kind" for a in node.args)
        return keyed and called in ("get", "getattr")
    return False


def _a_name(node: ast.AST) -> bool:
    """A kind's name written out: a constant, or one inside a tuple, list, set or a call (``frozenset({...})``)."""
    names = set(kinds.KINDS)
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_a_name(e) for e in node.elts)
    if isinstance(node, ast.Call):
        return any(_a_name(a) for a in node.args)
    return False


def _name_comparisons(tree: ast.AST) -> list[int]:
    """Lines deciding by a kind's name: a comparison (==, !=, in) of something's kind with a name written out, or
    a ``match`` on something's kind with a case of one."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_kind_like(s) for s in sides) and any(_a_name(s) for s in sides):
                lines.append(node.lineno)
        if isinstance(node, ast.Match) and _kind_like(node.subject):
            cases = [c.pattern for c in node.cases]
            if any(isinstance(p, ast.MatchValue) and _a_name(p.value) for p in cases):
                lines.append(node.lineno)
    return sorted(lines)


def scan(lines_of: Callable[[ast.AST], list[int]], skip: str = "") -> dict[str, list[int]]:
    """Each module of meshbench/ (but one named ``skip``) where ``lines_of`` finds lines, with those lines."""
    return {
        str(p.relative_to(PACKAGE.parent)): lines
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != skip and (lines := lines_of(ast.parse(p.read_text())))
    }


def test_no_code_compares_an_engine_kind_with_its_name():
    found = scan(_name_comparisons)
    assert found == {}


def test_the_scan_sees_each_form_of_comparison():
    src = "\n".join(
        ['a = x.kind == "gguf"', 'b = "endpoint" != y.kind', 'c = e.get("kind") in ("synthetic",)', 'd = x.kind == "z"',
         'e = kind == "gguf"', 'f = e["kind"] == "gguf"', 'g = engine_kind == "endpoint"',
         'h = x.kind in frozenset({"gguf"})', 'i = getattr(x, "kind") == "gguf"', 'match x.kind:',
         '    case "gguf":', '        pass', 'j = x.kinds == "gguf"', 'k = x.name == "gguf"']
    )  # fmt: skip
    assert _name_comparisons(ast.parse(src)) == [1, 2, 3, 5, 6, 7, 8, 9, 10]


@pytest.mark.parametrize("name", ["syntheticx", None, 3, ""])
def test_a_record_naming_no_kind_is_none_of_them_and_reading_it_raises_nothing(name):
    kind = kinds.recorded(name)
    assert not (kind.own or kind.llama or kind.tokenized or kind.numpy) and kind.name not in kinds.KINDS
    assert kinds.recorded("gguf") is kinds.GGUF
