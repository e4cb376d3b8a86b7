"""A node across processes: llama.cpp RPC workers on loopback, started and always stopped by the tests."""

import json
import os
import socket
import subprocess
import sys

import factories as f
import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not importable: RPC is untested")
if not llama_cpp.llama_supports_rpc():
    pytest.skip("this llama-cpp-python has no RPC backend (.ci/run builds one)", allow_module_level=True)

from test_bad_input import run_refused  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from meshbench.cli import app  # noqa: E402
from meshbench.engine import rpc  # noqa: E402
from meshbench.engine.process import workers  # noqa: E402

runner = CliRunner()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return f.tiny_gguf(tmp_path_factory.mktemp("m") / "q8.gguf")


@pytest.fixture(scope="module")
def two_workers():
    with workers.spawned(2, threads=1) as pool:  # stopped in finally, whatever the tests do
        yield pool.endpoints


def sweep_json(*args):
    r = runner.invoke(app, ["sweep", *map(str, args), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def digests(data):
    return {lv["concurrency"]: [s["digest"] for s in lv["sessions"]] for lv in data["levels"]}


def test_tokens_with_one_and_two_workers_equal_the_local_run(model, two_workers):
    common = ["--engine", "gguf", "--model", model, "--levels", "1,4", "--threads", "1", "--warmup", "0"]
    local = sweep_json(*common)
    one = sweep_json(*common, "--rpc", two_workers[0])
    two = sweep_json(*common, "--rpc", ",".join(map(str, two_workers)))
    assert digests(one) == digests(local) == digests(two)
    assert one["engine"]["recipe_fingerprint"] == local["engine"]["recipe_fingerprint"]
    topo = two["engine"]["rpc"]
    assert topo["endpoints"] == [str(e) for e in two_workers] and topo["spawned"] is False
    assert topo["protocol"] == {str(e): "7.0.0" for e in two_workers}  # ggml-rpc's HELLO, asked by meshbench
    assert sorted(topo["layers"]) == sorted(topo["devices"]) and len(topo["devices"]) == 2
    assert sorted(i for layers in topo["layers"].values() for i in layers) == [0, 1, 2, 3]
    assert local["engine"]["rpc"] is None


def test_spawned_workers_are_stopped_after_the_run(model):
    before = _serving_pids()
    data = sweep_json("--engine", "gguf", "--model", model, "--levels", "1", "--workers", "2", "--threads", "1")
    assert data["engine"]["rpc"]["spawned"] is True and len(data["engine"]["rpc"]["endpoints"]) == 2
    assert _serving_pids() == before


def test_the_worker_context_stops_its_processes_even_on_error():
    with pytest.raises(RuntimeError):
        with workers.spawned(1, threads=1) as pool:
            endpoints = pool.endpoints
            rpc.check_reachable(endpoints[0])
            raise RuntimeError("the run failed")
    with pytest.raises(Exception):
        rpc.check_reachable(endpoints[0], timeout=1.0)  # nobody listens any more


def _serving_pids() -> set[int]:
    """This process's own RPC workers (its children): another test on another xdist worker may run its own."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    rows = [line.split(None, 2) for line in out.splitlines()]
    return {int(r[0]) for r in rows if len(r) == 3 and int(r[1]) == os.getpid() and "meshbench.cli node serve" in r[2]}


def test_refusals(model, tmp_path):
    free = workers.free_port()
    run_refused(
        "sweep",
        "--engine",
        "gguf",
        "--model",
        model,
        "--rpc",
        "127.0.0.1",
        expect="is not HOST:PORT",
        cwd_files=tmp_path,
    )
    run_refused("sweep", "--engine", "gguf", "--model", model, "--rpc", "127.0.0.1:70000", expect="is not HOST:PORT")
    run_refused(
        "sweep",
        "--engine",
        "gguf",
        "--model",
        model,
        "--rpc",
        f"127.0.0.1:{free}",
        expect=f"rpc worker 127.0.0.1:{free}: cannot connect",
    )
    run_refused("sweep", "--rpc", f"127.0.0.1:{free}", expect="engine.rpc needs the gguf engine")
    run_refused("node", "serve", "--host", "0.0.0.0", expect="not a loopback address")


def test_something_that_is_not_an_rpc_worker_is_refused(model):
    import threading

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]

        def answer_like_a_web_server():
            conn, _ = s.accept()
            conn.recv(64)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

        threading.Thread(target=answer_like_a_web_server, daemon=True).start()
        run_refused(
            "sweep",
            "--engine",
            "gguf",
            "--model",
            model,
            "--rpc",
            f"127.0.0.1:{port}",
            expect="not a llama.cpp RPC server",
        )


def test_a_port_in_use_is_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        run_refused("node", "serve", "--port", port, expect=f"--port {port}: cannot listen")


def test_rpc_on_a_build_without_rpc_says_how_to_rebuild(model, monkeypatch):
    monkeypatch.setattr(llama_cpp, "llama_supports_rpc", lambda: False)
    line = run_refused(
        "sweep",
        "--engine",
        "gguf",
        "--model",
        model,
        "--rpc",
        "127.0.0.1:50052",
        expect="built without RPC; rebuild it with: pip cache remove llama_cpp_python",
    )
    assert "-DGGML_RPC=on" in line


def test_node_serve_exits_0_on_sigterm():
    port = workers.free_port()
    p = subprocess.Popen(
        [sys.executable, "-m", "meshbench.cli", "node", "serve", "--port", str(port), "--threads", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        workers._wait_ready(p, rpc.Endpoint("127.0.0.1", port))
        os.kill(p.pid, 15)
        _, err = p.communicate(timeout=30)
    finally:
        workers.stop(p)
    assert p.returncode == 0 and b"stopped (SIGTERM)" in err


def test_bench_gguf_measures_local_against_workers(model):
    r = runner.invoke(
        app,
        [
            "bench",
            "gguf",
            "--model",
            str(model),
            "--workers",
            "0,1",
            "--batches",
            "1,2",
            "--steps",
            "4",
            "--threads",
            "1",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["worker_counts"] == [0, 1] and [row["batch"] for row in d["batches"]] == [1, 2]
    for row in d["batches"]:
        assert [x["workers"] for x in row["on"]] == [0, 1]
        for x in row["on"]:
            assert x["samples"] == row["on"][0]["samples"] > 0  # two rounds each, the same ticks timed
            assert x["tokens_per_s"] == pytest.approx(row["batch"] / x["step_ms"] * 1e3)


def test_split_puts_the_given_share_of_layers_on_each_worker(model):
    data = sweep_json(
        "--engine",
        "gguf",
        "--model",
        model,
        "--levels",
        "1,4",
        "--workers",
        "2",
        "--split",
        "1,3",
        "--threads",
        "1",
        "--warmup",
        "0",
    )
    topo = data["engine"]["rpc"]
    first, second = topo["devices"]  # RPC device names count up within a process
    assert topo["split"] == [1.0, 3.0] and topo["layers"] == {first: [0], second: [1, 2, 3]}
    local = sweep_json("--engine", "gguf", "--model", model, "--levels", "1,4", "--threads", "1", "--warmup", "0")
    assert digests(data) == digests(local)
    run_refused(
        "sweep",
        "--engine",
        "gguf",
        "--model",
        model,
        "--workers",
        "2",
        "--split",
        "1,2,3",
        expect="engine.split has 3 shares for 2 RPC workers",
    )


def test_admit_runs_on_spawned_workers_and_stops_them(model):
    before = _serving_pids()
    r = runner.invoke(
        app, ["admit", "--engine", "gguf", "--model", str(model), "--workers", "1", "--burst", "3", "--json"]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["summary"] == {"ADMITTED": 3}
    assert _serving_pids() == before


def test_bench_gguf_on_given_workers(model, two_workers):
    r = runner.invoke(
        app,
        [
            "bench",
            "gguf",
            "--model",
            str(model),
            "--rpc",
            str(two_workers[0]),
            "--batches",
            "1",
            "--steps",
            "3",
            "--threads",
            "1",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["rpc"] == [str(two_workers[0])] and d["batches"][0]["raw_tokens_per_s"] > 0
