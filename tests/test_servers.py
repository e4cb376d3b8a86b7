"""The registry of server flavours (meshbench.engine.servers): how each is told apart, what it serves and how it
tokenizes, what a record of one is, and no code deciding by a flavour's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from meshbench.engine import apis, servers

ROOT = Path(__file__).resolve().parent.parent


def test_a_server_answering_props_is_llama_server_and_any_other_openai_compatible():
    assert servers.detect({"total_slots": 4}) is servers.LLAMA_SERVER
    assert servers.detect(None) is servers.detect([1]) is servers.detect("x") is servers.OPENAI_COMPATIBLE


def test_what_each_flavour_serves_and_how_it_tokenizes():
    assert servers.LLAMA_SERVER.apis[0] == apis.NATIVE.name and apis.NATIVE.name not in servers.OPENAI_COMPATIBLE.apis
    assert all(a in apis.APIS for f in servers.FLAVOURS.values() for a in f.apis)
    llama, other = servers.LLAMA_SERVER.tokenizer, servers.OPENAI_COMPATIBLE.tokenizer
    assert llama is not None and llama.path == "/tokenize"
    assert llama.body("a", False) == {"content": "a", "add_special": False}
    assert other is not None and other.path == "/extras/tokenize" and other.body("a", False) == {"input": "a"}
    assert llama.switch and not other.switch


@pytest.mark.parametrize("name", ["vllm", "", None, 3, "LLAMA-SERVER"])
def test_a_record_naming_no_flavour_is_none_of_them(name):
    f = servers.recorded(name)
    assert f is servers.UNKNOWN and f.apis == () and f.tokenizer is None and not f.cache_prompt


def _server_like(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id.endswith("server")
    if isinstance(node, ast.Attribute):
        return node.attr.endswith("server")
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "server"
    return False


def _name_comparisons(tree: ast.AST) -> list[int]:
    """Lines comparing something's server (``x.server``, ``server``, ``x["server"]``) with a flavour's name."""
    return sorted(
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Compare)
        and any(_server_like(s) for s in (n.left, *n.comparators))
        and any(isinstance(s, ast.Constant) and s.value in servers.FLAVOURS for s in (n.left, *n.comparators))
    )


def test_no_code_decides_by_a_flavours_name():
    registry = ROOT / "meshbench" / "engine" / "servers.py"
    found = {
        str(p.relative_to(ROOT)): lines
        for p in sorted((ROOT / "meshbench").rglob("*.py"))
        if p != registry and (lines := _name_comparisons(ast.parse(p.read_text())))
    }
    assert found == {}
    src = 'a = r.endpoint.server == "llama-server"\nb = "openai-compatible" != server\nc = e["server"] == "x"'
    assert _name_comparisons(ast.parse(src)) == [1, 2]
    constants = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "meshbench").rglob("*.py")
        if p != registry
        and any(
            isinstance(n, ast.Constant) and n.value == "openai-compatible" for n in ast.walk(ast.parse(p.read_bytes()))
        )
    }
    assert constants == set()
