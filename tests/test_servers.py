"""The registry of server flavours (meshbench.engine.servers): how each is told apart, what it serves and how it
tokenizes, what a record of one is, and no code deciding by a flavour's name."""

from __future__ import annotations

import ast
import http.client
import json
import socket
import threading
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
        (_answers({"build_info": "b1"}, ["me"]), servers.LLAMA_SERVER),  # (/props outranks a model's owner)
        (_answers(None, ["llamacpp"]), servers.LLAMA_SERVER),  # (its /props hidden: its models' owner)
        (_answers({}, ["me"]), servers.LLAMA_CPP_PYTHON),  # (a /props without llama-server's keys is not its)
        (_answers(None, ["me"]), servers.LLAMA_CPP_PYTHON),
        (_answers(None, ["vllm", "vllm"], {"version": "0.11.0"}), servers.VLLM),
        (_answers(None, ["vllm"]), servers.OPENAI_COMPATIBLE),  # (an owner alone is not vLLM's whole mark)
        (_answers(None, ["vllm"], {"version": None}), servers.OPENAI_COMPATIBLE),
        (_answers(None, ["local"]), servers.TRANSFORMERS),
        (_answers(None, ["vllm", "local", "me"], {"version": "1"}), servers.OPENAI_COMPATIBLE),  # (owners disagree)
        (_answers(None, ["sglang"]), servers.OPENAI_COMPATIBLE),
        (_answers(None, []), servers.OPENAI_COMPATIBLE),
    ],
)
def test_each_server_is_the_first_flavour_whose_mark_it_carries_and_the_bundle_says_why(answers, flavour):
    found, why = servers.detect(answers)
    assert found is flavour and why == flavour.why and flavour.mark(answers)
    assert len({f.why for f in servers.FLAVOURS.values()}) == len(servers.FLAVOURS)  # (a reason names one flavour)


def test_a_flavour_named_by_the_config_is_taken_as_named_and_an_unknown_name_is_refused_in_one_line():
    found, why = servers.detect(_answers({"total_slots": 1}), "vllm")
    assert found is servers.VLLM and why == servers.NAMED
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


def _answered(raw_http: bytes, done: bool) -> Completion:
    """``raw_http`` (a whole HTTP answer, as bytes) served once on a loopback socket and read as a stream."""
    sock = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = sock.accept()
        conn.recv(65536)
        conn.sendall(raw_http)
        conn.shutdown(socket.SHUT_WR)
        time.sleep(0.2)
        conn.close()
        sock.close()

    threading.Thread(target=serve, daemon=True).start()
    client = http.client.HTTPConnection("127.0.0.1", sock.getsockname()[1], timeout=5)
    client.request("POST", "/v1/completions", "{}")
    c = Completion("s0", 0)
    Stream(apis.OPENAI.name, {"max_tokens": 2}, c, 0, time.monotonic() + 5, None, done).read(client.getresponse())
    return c


def _sse(chunks: list[dict], marker: bool = False) -> bytes:
    return b"".join(b"data: " + json.dumps(x).encode() + b"\n\n" for x in chunks) + b"data: [DONE]\n\n" * marker


def _chunked(body: bytes, whole: bool = True) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + b"%x\r\n%s\r\n" % (len(body), body) + (b"0\r\n\r\n" if whole else b"")


def _sized(body: bytes, length: int) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % length + body


PIECES = [{"choices": [{"text": "a"}]}, {"choices": [{"text": "b", "finish_reason": "length"}]}]
USAGE = {"choices": [], "usage": {"completion_tokens": 2, "prompt_tokens": 3}}


def test_a_stream_ends_with_done_where_the_flavour_sends_it_else_with_its_finish_usage_and_the_bodys_whole_end():
    body = _sse([*PIECES, USAGE])  # (transformers serve: no [DONE])
    for whole in (_chunked(body), _sized(body, len(body))):
        c = _answered(whole, done=False)
        assert (c.text, c.stop, c.predicted, c.evaluated) == ("ab", "limit", 2, 3)
    assert _answered(_chunked(_sse([*PIECES, USAGE], marker=True)), done=True).text == "ab"
    cut = [
        (_chunked(body), True),  # a flavour that ends with [DONE] and did not
        (_chunked(body, whole=False), False),  # no last chunk: cut
        (_sized(body, len(body) + 40), False),  # shorter than its length: cut
        (b"HTTP/1.0 200 OK\r\n\r\n" + body, False),  # ends at close: cannot say it is whole
        (_chunked(_sse(PIECES)), False),  # no usage
        (_chunked(_sse(PIECES[:1])), False),  # no finish reason
    ]
    for raw, done in cut:
        with pytest.raises(Malformed, match="the stream closed before its end"):
            _answered(raw, done)
    with pytest.raises(Malformed, match="text after the finish reason"):
        _answered(_chunked(_sse([*PIECES, {"choices": [{"text": "X"}]}, USAGE])), done=False)
    assert all(f.done for f in (servers.LLAMA_SERVER, servers.LLAMA_CPP_PYTHON, servers.VLLM))
    assert not servers.TRANSFORMERS.done


@pytest.mark.parametrize(
    ("edit", "failed"),
    [
        ({"detected": servers.VLLM.why}, "endpoint.detected"),  # (another flavour's reason)
        ({"detected": "it said so"}, "endpoint.detected"),
        ({"server": "vllm", "detected": servers.VLLM.why}, "endpoint.server"),  # (not the flavour it started)
    ],
)
def test_a_forged_flavour_or_reason_fails_verify_by_name(edit, failed, tmp_path):
    from test_probe5 import _copy_defaults, _verify

    src, b, data = _copy_defaults(tmp_path)
    data["endpoint"].update(edit)
    code, fields, _ = _verify(src, b, data)
    assert code == 1 and any(f.startswith(failed) for f in fields), fields


def test_the_reason_a_bundle_records_is_its_flavours_and_verify_holds_it(tmp_path):
    from test_probe5 import _copy_defaults, _verify

    src, b, data = _copy_defaults(tmp_path)
    data["endpoint"]["detected"] = servers.LLAMA_SERVER.why
    assert _verify(src, b, data)[0] == 0
    data["config"]["engine"]["flavour"] = "llama-server"  # (named: its reason is the naming)
    assert "endpoint.detected" in " ".join(_verify(src, b, data)[1])
    data["endpoint"]["detected"] = servers.NAMED
    assert _verify(src, b, data)[0] == 0


def test_a_served_server_named_as_another_flavour_is_refused_in_one_line():
    from meshbench.engine.spec import EngineSpec

    with pytest.raises(MeshbenchError, match=r"^engine.flavour vllm: engine.serve starts llama-server, a llama-server"):
        EngineSpec(kind="endpoint", serve="llama-server", model="m.gguf", flavour="vllm")
    assert EngineSpec(kind="endpoint", serve="transformers", model="m.gguf", flavour="transformers").flavour


def test_the_local_tokenizer_reads_a_path_only_on_loopback_and_says_a_bad_file_in_one_line(tmp_path):
    from meshbench.endpoint import local_tokenizer
    from meshbench.endpoint.client import Endpoint, parse_target

    far = Endpoint(parse_target("http://10.0.0.1:8000"), "openai")
    far.flavour, far.models = servers.TRANSFORMERS, [f"{tmp_path}:m.gguf"]
    with pytest.raises(MeshbenchError, match=r"off this machine: meshbench reads a tokenizer .* only for a server on"):
        far.tokenize(["a"])
    with pytest.raises(MeshbenchError, match=r"no model file on this machine"):
        local_tokenizer.tokenize(f"{tmp_path}:nope.gguf", ["a"], True)
    pytest.importorskip("transformers")
    (tmp_path / "cut.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(MeshbenchError, match=r"transformers cannot read its tokenizer \(") as e:
        local_tokenizer.tokenize(f"{tmp_path}:cut.gguf", ["a"], True)
    assert "\n" not in str(e.value)
