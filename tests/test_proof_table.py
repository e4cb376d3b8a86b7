"""The endpoint guide's server x API x proof table is the one its tests back (tests/proof_table.py): each "runs"
cell names the tests marked ``cell`` for it, and no mark names a cell that does not exist or contradicts a reason
the table gives for a proof that cannot run."""

from __future__ import annotations

import proof_table


def test_every_mark_names_a_cell_and_none_contradicts_a_reason():
    assert proof_table.problems(proof_table.marks()) == []
    assert proof_table.stray() == []


def test_the_guide_s_table_is_the_one_the_tests_back():
    assert proof_table.in_guide(proof_table.GUIDE.read_text()) == proof_table.table(), (
        "docs/guides/endpoint.md: rewrite the table with python tests/proof_table.py"
    )


def test_a_mark_with_no_cell_or_against_a_reason_is_a_problem():
    found = {
        ("llama-server", "chat", "perturbation"): [("test_x.py::test_a", False)],
        ("vllm", "native", "margins"): [("test_x.py::test_b", False)],
        ("vllm", "openai", "margins"): [("test_x.py::test_c", False)],
        ("vllm", "chat", "margins"): [("test_x.py::test_d", True)],
    }
    assert proof_table.problems(found) == [
        "test_x.py::test_a: runs (llama-server, chat, perturbation), which CANNOT says cannot run",
        "test_x.py::test_b: no cell (vllm, native, margins)",
        "test_x.py::test_d: shows (vllm, chat, margins) cannot run, and CANNOT gives no reason",
    ]
    t = proof_table.table(found)
    assert "| vllm (a proxy shaped as its docs, before llama-server) | openai | untested | cannot: a text API" in t
    assert "runs: `test_x.py::test_c`" in t


def test_a_cell_mark_off_a_test_function_is_stray(tmp_path):
    (tmp_path / "test_y.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.cell('vllm', 'chat', 'margins')\nclass TestA:\n    pass\n\n"
        "@pytest.mark.cell('vllm', 'chat', 'margins')\ndef helper():\n    pass\n\n"
        "@pytest.mark.cell('vllm', 'openai', 'margins')\nasync def test_b():\n    pass\n"
    )
    assert proof_table.stray(tmp_path) == ["test_y.py:3", "test_y.py:7"]
    assert proof_table.marks(tmp_path) == {("vllm", "openai", "margins"): [("test_y.py::test_b", False)]}
