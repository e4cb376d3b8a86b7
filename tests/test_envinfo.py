"""git_state: which changes to a checkout make a result's code 'dirty'."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from meshbench.results.envinfo import git_state

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(where: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=where, check=True, capture_output=True)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    for d in ("meshbench", "configs", "evidence"):
        (tmp_path / d).mkdir()
    (tmp_path / "meshbench" / "core.py").write_text("x = 1\n")
    (tmp_path / "evidence" / "README.md").write_text("bundle\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    return tmp_path


def test_a_clean_checkout_is_not_dirty(checkout: Path) -> None:
    commit, dirty = git_state(checkout)
    assert commit is not None and len(commit) == 40 and dirty is False


def test_a_changed_module_is_dirty(checkout: Path) -> None:
    (checkout / "meshbench" / "core.py").write_text("x = 2\n")
    assert git_state(checkout)[1] is True


def test_a_new_module_the_commit_lacks_is_dirty(checkout: Path) -> None:
    (checkout / "meshbench" / "extra.py").write_text("y = 1\n")
    assert git_state(checkout)[1] is True
    (checkout / "meshbench" / "extra.py").unlink()
    (checkout / "configs" / "new.yaml").write_text("levels: [1]\n")
    assert git_state(checkout)[1] is True


def test_rewritten_evidence_and_scratch_files_are_not_dirty(checkout: Path) -> None:
    (checkout / "evidence" / "README.md").write_text("bundle, rerun\n")
    (checkout / "evidence" / "NEW").mkdir()
    (checkout / "evidence" / "NEW" / "results.json").write_text("{}\n")
    (checkout / "notes.txt").write_text("scratch\n")
    assert git_state(checkout)[1] is False


def test_outside_a_work_tree_says_nothing(tmp_path: Path) -> None:
    assert git_state(tmp_path) == (None, None)
