"""The registry of server flavours (meshbench.engine.servers): how each is told apart, what it serves and how it
tokenizes, what a record of one is, and no code deciding by a flavour's name."""

from __future__ import annotations

import ast
import io
import json
import time
from pathlib import Path

import pytest

from meshbench.endpoint.stream import Completion, Malformed, Stream
from meshbench.engine import apis, servers
from meshbench.errors import MeshbenchError

ROOT = Path(__file__).resolve().parent.parent


def _answers(props=None, owners=(), version=None):
    return servers.Answers(props, tuple(owners), version)


@pytest.mark.parametrize(
    ("answers", "flavour"),
    [
        (_answers({"total_slots": 4}, ["llamacpp"]), servers.LLAMA_SERVER),
        (_answers({}, ["me"]), servers.LLAMA_SERVER),  # (/props outranks a model's owner)
        (_answers(None, ["me"]), servers.LLAMA_CPP_PYTHON),
        (_answers(None, ["vllm"], {"version": "0.11.0"}), servers.VLLM),
        (_answers(None, ["vllm"]), servers.OPENAI_COMPATIBLE),  # (an owner alone is not vLLM's whole mark)
        (_answers(None, ["local"]), servers.TRANSFORMERS),
        (_answers(None, ["sglang"]), servers.OPENAI_COMPATIBLE),
        (_answers(None, []), servers.OPENAI_COMPATIBLE),
    ],
)
def test_each_server_is_the_first_flavour_whose_mark_it_carries_and_the_bundle_says_why(answers, flavour):
    found, why = servers.detect(answers)
    assert found is flavour and why == flavour.mark(answers) and why


def test_a_flavour_named_by_the_config_is_taken_as_named_and_an_unknown_name_is_refused_in_one_line():
    found, why = servers.detect(_answers({"total_slots": 1}), "vllm")
    assert found is servers.VLLM and "engine.flavour" in why
    with pytest.raises(MeshbenchError, match=r"^engine.flavour 'vllm2' is none of auto, llama-server, "):
        servers.detect(_answers(), "vllm2")
    assert servers.CHOICES == (servers.AUTO, *servers.FLAVOURS)


def test_what_each_flavour_serves_and_how_it_tokenizes():
    assert servers.LLAMA_SERVER.apis[0] == apis.NATIVE.name
    assert all(apis.NATIVE.name not in f.apis for f in servers.FLAVOURS.values() if f is not servers.LLAMA_SERVER)
    assert all(a in apis.APIS for f in servers.FLAVOURS.values() for a in f.apis)
    llama, python, vllm = (f.tokenizer for f in (servers.LLAMA_SERVER, servers.LLAMA_CPP_PYTHON, servers.VLLM))
    assert llama is not None and llama.path == "/tokenize"
    assert llama.body("a", False) == {"content": "a", "add_special": False}
    assert python is not None and python.path == "/extras/tokenize" and python.body("a", False) == {"input": "a"}
    assert vllm is not None and vllm.path == "/tokenize"
    assert vllm.body("a", True) == {"prompt": "a", "add_special_tokens": True}
    assert llama.switch and vllm.switch and not python.switch
    assert servers.TRANSFORMERS.tokenizer is None and servers.OPENAI_COMPATIBLE.tokenizer is None
    assert [f.name for f in servers.FLAVOURS.values() if f.props] == ["llama-server"]
    assert [f.name for f in servers.FLAVOURS.values() if f.cache_prompt] == ["llama-server"]


@pytest.mark.parametrize("name", ["vllm2", "", None, 3, "LLAMA-SERVER", "auto"])
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


def _streamed(chunks: list[dict], done: bool, marker: bool = False) -> Completion:
    raw = b"".join(b"data: " + json.dumps(x).encode() + b"\n\n" for x in chunks) + (b"data: [DONE]\n\n" * marker)
    c = Completion("s0", 0)
    Stream(apis.OPENAI.name, {"max_tokens": 2}, c, 0, time.monotonic() + 5, None, done).read(io.BytesIO(raw))
    return c


PIECES = [{"choices": [{"text": "a"}]}, {"choices": [{"text": "b", "finish_reason": "length"}]}]
USAGE = {"choices": [], "usage": {"completion_tokens": 2, "prompt_tokens": 3}}


def test_a_stream_ends_with_done_where_the_flavour_sends_it_else_with_a_finish_reason_and_the_bodys_end():
    c = _streamed([*PIECES, USAGE], done=False)  # (transformers serve: no [DONE])
    assert (c.text, c.stop, c.predicted) == ("ab", "limit", 2)
    assert _streamed([*PIECES, USAGE], done=True, marker=True).text == "ab"
    with pytest.raises(Malformed, match="the stream closed before its end"):
        _streamed([*PIECES, USAGE], done=True)  # (a flavour that ends with [DONE] and did not)
    with pytest.raises(Malformed, match="the stream closed before its end"):
        _streamed(PIECES[:1], done=False)  # (no finish reason: cut)
    assert all(f.done for f in (servers.LLAMA_SERVER, servers.LLAMA_CPP_PYTHON, servers.VLLM))
    assert not servers.TRANSFORMERS.done
