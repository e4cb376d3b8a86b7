"""The registry of server APIs (meshbench.engine.apis): the config's choices and the bundle's schema name exactly its
APIs, each API carries what the code asks of it, and no code outside the registry writes an API's name out."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from meshbench.endpoint import conversation
from meshbench.engine import apis
from meshbench.errors import MeshbenchError
from meshbench.workload import request

ROOT = Path(__file__).resolve().parent.parent


def test_the_schemas_name_exactly_the_registrys_apis():
    config = json.loads((ROOT / "schemas" / "config.schema.json").read_text())
    assert config["properties"]["engine"]["properties"]["api"]["enum"] == list(apis.CHOICES)
    endpoint = json.loads((ROOT / "schemas" / "endpoint.schema.json").read_text())
    assert endpoint["properties"]["endpoint"]["properties"]["api"]["enum"] == list(apis.APIS)


def test_what_each_api_carries():
    assert apis.names(ids=True) == ("native",)
    assert conversation.APIS == apis.names(conversations=True) == ("native", "chat")
    assert apis.names(cancels=True) == ("native",)
    assert {a.path for a in apis.APIS.values()} == {"/completion", "/v1/completions", "/v1/chat/completions"}
    assert request.logprobs("native", 2) == {"n_probs": 2}
    assert request.logprobs("openai", 2) == {"logprobs": 2}
    assert request.logprobs("chat", 2) == {"logprobs": True, "top_logprobs": 2}
    with pytest.raises(TypeError):
        apis.names(streams=True)


@pytest.mark.parametrize("name", ["auto", "vllm", "", "Native"])
def test_a_name_of_no_api_is_refused_in_one_line_and_a_record_of_one_is_none(name):
    with pytest.raises(MeshbenchError) as e:
        apis.of(name)
    assert "\n" not in str(e.value) and "native, openai, chat" in str(e.value)
    assert apis.recorded(name) is apis.UNKNOWN and not apis.recorded(name).ids and not apis.recorded(3).messages


def _names_written_out(tree: ast.AST) -> list[int]:
    """Lines holding an API's name as a string constant (a comparison, a default, a table key alike)."""
    return sorted(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in apis.APIS)


def test_no_code_outside_the_registry_writes_an_apis_name():
    registry = ROOT / "meshbench" / "engine" / "apis.py"
    found = {
        str(p.relative_to(ROOT)): lines
        for p in sorted((ROOT / "meshbench").rglob("*.py"))
        if p != registry and (lines := _names_written_out(ast.parse(p.read_text())))
    }
    assert found == {}
    assert _names_written_out(ast.parse('a = x.api == "native"\nb = {"chat": 1}\nc = "natives"')) == [1, 2]
