"""The registry of servers meshbench starts (meshbench.endpoint.launchers): the config's choices are its names, each
launcher's flags and flavour, a name it lacks refused in one line, and no code deciding by a launcher's name."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from meshbench.endpoint import transformers_server
from meshbench.engine import launchers, servers
from meshbench.engine.spec import properties
from meshbench.errors import MeshbenchError

ROOT = Path(__file__).resolve().parent.parent


def test_the_configs_choices_are_the_registrys_names_and_each_starts_a_flavour_it_serves():
    assert properties()["serve"]["enum"] == [*launchers.NAMES, None]
    assert launchers.NAMES == ("llama-server", "transformers")
    for launcher in launchers.LAUNCHERS.values():
        assert servers.FLAVOURS[launcher.flavour.name] is launcher.flavour
        assert launcher.flavour.apis  # (a server meshbench starts is swept over one of its APIs)


def test_a_name_no_launcher_has_is_refused_in_one_line():
    with pytest.raises(MeshbenchError, match=r"^--serve 'vllm': meshbench starts llama-server or transformers$"):
        launchers.of("vllm")


def test_the_flags_meshbench_adds_are_each_servers_own():
    llama = launchers.LLAMA_SERVER.own_flags
    assert llama([]) == ["--metrics"] and llama(["--metrics"]) == []
    own = launchers.TRANSFORMERS.own_flags
    assert own([]) == ["--continuous-batching"]
    assert own(["--no-continuous-batching"]) == [] and own(["--continuous-batching", "--cb-block-size", "32"]) == []


def test_transformers_serve_loads_a_gguf_file_by_its_folder_and_name_and_a_folder_as_it_is(tmp_path):
    model = tmp_path / "m.gguf"
    assert transformers_server.model_id(str(model)) == f"{tmp_path}:m.gguf"
    assert transformers_server.model_id(str(tmp_path)) == str(tmp_path)


def test_transformers_serve_missing_is_said_in_one_line(monkeypatch):
    # (every other package there, whether or not this machine has it: the line names exactly what is missing)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fastapi" else object())
    with pytest.raises(MeshbenchError, match=r"^no transformers serve here \(fastapi not installed\): pip install"):
        launchers.TRANSFORMERS.program(None, "")


def _serve_like(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.endswith("serve")


def test_no_code_decides_by_a_launchers_name():
    registry = ROOT / "meshbench" / "engine" / "launchers.py"
    found = {
        str(p.relative_to(ROOT)): n.lineno
        for p in sorted((ROOT / "meshbench").rglob("*.py"))
        if p != registry
        for n in ast.walk(ast.parse(p.read_text()))
        if isinstance(n, ast.Compare)
        and any(_serve_like(s) for s in (n.left, *n.comparators))
        and any(isinstance(s, ast.Constant) and s.value in launchers.NAMES for s in (n.left, *n.comparators))
    }
    assert found == {}
