import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402


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
