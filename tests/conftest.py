import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


import os  # noqa: E402

import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402


def _pin_this_worker() -> None:
    """Under pytest-xdist, each worker (and every process it starts) on a core of its own: llama.cpp defaults to a
    thread per usable CPU (meshbench.machine.usable_cpus) and its threads spin at every barrier, so two workers
    each running two threads on two cores wait on each other many times a token."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return
    if worker.startswith("gw") and 1 < count <= len(cpus):
        os.sched_setaffinity(0, {cpus[int(worker[2:]) % len(cpus)]})


_pin_this_worker()


_invoke = CliRunner.invoke


def _invoke_as_typed(self, app, args=None, *more, **kw):
    """CliRunner.invoke with sys.argv as a user's shell gives it (``meshbench ARGS``): a bundle records the command
    that ran it (meshbench.cli.common.command_line), and verify reads its flags back, so a test's bundle records
    the test's command, not pytest's."""
    words = [args] if isinstance(args, str) else list(args or [])
    saved = sys.argv
    sys.argv = ["meshbench", *map(str, words)]
    try:
        return _invoke(self, app, args, *more, **kw)
    finally:
        sys.argv = saved


CliRunner.invoke = _invoke_as_typed  # type: ignore[method-assign]


@pytest.fixture(scope="session")
def made(tmp_path_factory) -> Path:
    """A small synthetic bundle (levels 1 and 2, one isolation round), made once: tests copy it before editing."""
    from meshbench.cli import app

    out = tmp_path_factory.mktemp("made") / "B"
    r = CliRunner().invoke(app, ["sweep", "--levels", "1,2", "--isolation-rounds", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="session")
def model(tmp_path_factory) -> Path:
    """The tiny GGUF the server tests serve (make-tiny's bench preset, Q8_0, a llama vocabulary), made once; a
    module with a ``model`` of its own uses that."""
    import factories as f

    return f.tiny_gguf(tmp_path_factory.mktemp("m") / "bench.gguf", "q8_0", "bench")


# What each module's tests need, in one table (``-m`` selects by it; docs/development.md lists the tiers):
# gguf: llama-cpp-python (they skip in one line without it); server: an HTTP server of their own on loopback, a
# real one or a misbehaving one; process: child processes they start, signal or kill (RPC workers, sweeps);
# slow: the modules the inner loop leaves out (the fast tier is -m "not slow", under 90 s on 2 cores).
NEEDS = {
    "gguf": {
        "bench", "burst", "chunked", "cli_edges", "conversations", "endpoint", "endpoint_conversations",
        "endpoint_sibling", "faults_gguf", "gguf",
        "flavours_live", "gguf_prefix", "hostile", "hunt_live", "integrity", "kernels", "llama_server_defaults",
        "model", "own_kv",
        "probe4_inputs", "prompts", "real_model", "recipe", "rpc", "server_bench", "server_matrix", "structure",
    },
    "server": {
        "bad_server", "endpoint", "endpoint_conversations", "endpoint_sibling", "flavours_live", "hunt", "hunt_corpus",
        "hunt_live", "llama_server_defaults", "sampling", "server_bench", "server_matrix", "transformers_serve",
    },
    "process": {
        "bundle_files", "cli_edges", "faults", "faults_gguf", "hostile", "integrity", "recipe", "rpc", "endpoint",
        "transformers_serve",
    },
    "slow": {
        "bad_server", "burst", "chunked", "conversations", "endpoint", "endpoint_conversations", "faults_gguf",
        "fields", "flavours_live", "gguf", "gguf_prefix", "hostile", "hunt_corpus", "hunt_live", "integrity",
        "llama_server_defaults",
        "prompts", "readme_commands",
        "real_model", "recipe", "records", "rpc", "sampling", "server_bench", "server_matrix", "transformers_serve",
    },
}  # fmt: skip


# The module fixtures that start a real llama-server (skipping without one): a test using one is marked
# llama_server, as a test decorated with factories.needs_llama_server is; .ci/run runs them where it has the server.
LLAMA_SERVER_FIXTURES = {"upstream", "hunted"}


def pytest_collection_modifyitems(items):
    for item in items:
        module = item.module.__name__.removeprefix("test_") if item.module else ""
        for marker, modules in NEEDS.items():
            if module in modules:
                item.add_marker(marker)
        if LLAMA_SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker("llama_server")
