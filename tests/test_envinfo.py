"""git_state: which changes to a checkout make a result's code 'dirty', and where there is no checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from meshbench.results.envinfo import git_state

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@pytest.fixture(autouse=True)
def own_git(monkeypatch, tmp_path: Path) -> None:
    """git as in a plain shell: none of a caller's GIT_* variables (a hook's index), no repository above."""
    for name in [n for n in os.environ if n.startswith("GIT_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))


def _git(where: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=where, check=True, capture_output=True)


def _repo(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", "commit", "-qm", "c")
    return root


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    files = {".gitignore": "__pycache__/\n", "meshbench/core.py": "x = 1\n", "evidence/README.md": "bundle\n"}
    return _repo(tmp_path / "checkout", files)


def test_a_clean_checkout_is_not_dirty(checkout: Path) -> None:
    commit, dirty = git_state(checkout)
    assert commit is not None and len(commit) == 40 and dirty is False


def test_a_changed_module_is_dirty(checkout: Path) -> None:
    (checkout / "meshbench" / "core.py").write_text("x = 2\n")
    assert git_state(checkout)[1] is True


def test_a_new_module_the_commit_lacks_is_dirty(checkout: Path) -> None:
    (checkout / "meshbench" / "sub").mkdir()
    (checkout / "meshbench" / "sub" / "extra.py").write_text("y = 1\n")
    assert git_state(checkout)[1] is True


def test_evidence_configs_caches_and_scratch_files_are_not_dirty(checkout: Path) -> None:
    (checkout / "evidence" / "README.md").write_text("bundle, rerun\n")
    (checkout / "evidence" / "NEW").mkdir()
    (checkout / "evidence" / "NEW" / "results.json").write_text("{}\n")
    (checkout / "configs").mkdir()
    (checkout / "configs" / "mine.yaml").write_text("levels: [1]\n")  # (a config is recorded in its bundle)
    (checkout / "meshbench" / "__pycache__").mkdir()
    (checkout / "meshbench" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0")
    (checkout / "notes.txt").write_text("scratch\n")
    assert git_state(checkout)[1] is False


def test_outside_a_work_tree_says_nothing(tmp_path: Path) -> None:
    assert git_state(tmp_path) == (None, None)


def test_an_installed_copy_inside_another_repository_is_no_checkout(tmp_path: Path) -> None:
    """A wheel installed in a virtualenv some other project's repository holds: not that project's commit."""
    other = _repo(tmp_path / "other", {"app.py": "a = 1\n"})
    site = other / "venv" / "lib" / "site-packages"
    (site / "meshbench").mkdir(parents=True)
    (site / "meshbench" / "__init__.py").write_text("")
    assert git_state(site) == (None, None)
