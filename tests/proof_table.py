"""The server x API x proof table of docs/guides/endpoint.md, generated from the tests that back its cells.

A test backs a cell with ``@pytest.mark.cell(server, api, proof)`` (it runs that proof on that server over that
API, against a real server or a proxy in front of one), or ``cell(..., cannot=True)`` (it shows that the proof
cannot run there: a refusal in one line, or the bundle saying so). A cell no test backs is "cannot" where
``CANNOT`` gives the reason, by construction, else "untested". The servers and their APIs come from the flavour
registry (meshbench.engine.servers). ``tests/test_proof_table.py`` holds the guide to this output; rewrite it
with ``python tests/proof_table.py``."""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

from meshbench.engine import servers

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guides" / "endpoint.md"
BEGIN, END = "<!-- proof table: python tests/proof_table.py -->", "<!-- end of the proof table -->"
PROOFS = {  # a column: the proofs it stands for
    "verdicts": "verdicts, canaries",
    "perturbation": "perturbation, cancel and retry",
    "margins": "margins",
    "conversations": "conversations",
    "sampling": "sampling",
}
SHOWN = {  # a server's name in the table (a proxy stands in for vLLM and for the generic server)
    "vllm": "vllm (a proxy shaped as its docs, before llama-server)",
    "openai-compatible": "openai-compatible (a proxy that says nothing of itself, before llama-server)",
}
NO_IDS = "a text API carries no token ids"
TRANSFORMERS_CHAT = "its chat API refuses the packaged GGUF (no chat template)"
CANNOT = {  # (server, api, proof) -> why it cannot run there, by construction ("*": any)
    ("*", "openai", "perturbation"): NO_IDS,
    ("*", "chat", "perturbation"): NO_IDS,
    ("transformers", "*", "margins"): "it ignores `logprobs`",
    ("transformers", "chat", "*"): TRANSFORMERS_CHAT,
    ("transformers", "openai", "sampling"): (
        "it answers a request's temperature greedily unless the model's generation config samples (measured: "
        "[TRANSFORMERS-SERVE-GEMMA3-SAMPLED](servers-measured.md#evidence-sampled-with-a-seed-per-session))"
    ),
    ("*", "openai", "conversations"): "a conversation runs over the native or chat API",
    ("openai-compatible", "chat", "conversations"): "no tokenizer: a later turn's length is unknown",
}
FLAVOURS = ("llama-server", "llama-cpp-python", "transformers", "vllm", "openai-compatible")


def marks(tests: Path = ROOT / "tests") -> dict[tuple[str, str, str], list[tuple[str, bool]]]:
    """Every ``cell`` mark on a test function: (server, api, proof) -> [(``file::test``, cannot), ...]."""
    out: dict[tuple[str, str, str], list[tuple[str, bool]]] = defaultdict(list)
    for path in sorted(tests.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                for d in filter(_is_cell, node.decorator_list):
                    key = tuple(ast.literal_eval(a) for a in d.args)  # type: ignore[attr-defined]
                    cannot = any(k.arg == "cannot" and ast.literal_eval(k.value) for k in d.keywords)  # type: ignore[attr-defined]
                    out[key].append((f"{path.name}::{node.name}", cannot))  # type: ignore[index]
    return dict(out)


def stray(tests: Path = ROOT / "tests") -> list[str]:
    """Every ``cell`` mark that is not a test function's decorator (a class's, a module's, a helper's): no cell
    counts it, so it is an error, never silently dropped."""
    out = []
    for path in sorted(tests.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        held = {
            id(d)
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")
            for d in node.decorator_list
        }
        out += [f"{path.name}:{n.lineno}" for n in ast.walk(tree) if _is_cell(n) and id(n) not in held]
    return out


def _is_cell(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func) == "pytest.mark.cell"


def why(server: str, api: str, proof: str) -> str | None:
    for key in ((server, api, proof), ("*", api, proof), (server, "*", proof), (server, api, "*")):
        if key in CANNOT:
            return CANNOT[key]
    return None


def cell(server: str, api: str, proof: str, found: dict) -> str:
    tests = found.get((server, api, proof), [])
    runs = [t for t, cannot in tests if not cannot]
    shown = [t for t, cannot in tests if cannot]
    if runs:
        return "runs: " + ", ".join(f"`{t}`" for t in runs)
    reason = why(server, api, proof)
    if reason is not None:
        return f"cannot: {reason}" + "".join(f" (`{t}`)" for t in shown)
    return "untested"


def table(found: dict | None = None) -> str:
    found = marks() if found is None else found
    head = ["server", "API", *PROOFS.values()]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in FLAVOURS:
        for api in servers.FLAVOURS[name].apis:
            cells = [cell(name, api, proof, found) for proof in PROOFS]
            lines.append("| " + " | ".join([SHOWN.get(name, name), api, *cells]) + " |")
    return "\n".join(lines)


def problems(found: dict) -> list[str]:
    """Marks no cell can hold: an unknown server, API or proof; a test that runs a cell CANNOT says cannot run; a
    test that shows a cell cannot run where CANNOT gives no reason."""
    out = []
    for (server, api, proof), tests in found.items():
        flavour = servers.FLAVOURS.get(server)
        reason = why(server, api, proof)
        if flavour is None or api not in flavour.apis or proof not in PROOFS:
            out.append(f"{tests[0][0]}: no cell ({server}, {api}, {proof})")
        elif any(not cannot for _, cannot in tests) and reason is not None:
            out.append(f"{tests[0][0]}: runs ({server}, {api}, {proof}), which CANNOT says cannot run")
        elif any(cannot for _, cannot in tests) and reason is None:
            out.append(f"{tests[0][0]}: shows ({server}, {api}, {proof}) cannot run, and CANNOT gives no reason")
    return out


def in_guide(text: str) -> str | None:
    """The table as the guide has it between its markers (None: no markers)."""
    m = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    return m.group(1) if m else None


if __name__ == "__main__":
    text = GUIDE.read_text()
    if in_guide(text) is None:
        sys.exit(f"{GUIDE}: no table markers ({BEGIN} ... {END})")
    GUIDE.write_text(re.sub(re.escape(BEGIN) + r"\n.*?\n" + re.escape(END),
                            lambda _: f"{BEGIN}\n{table()}\n{END}", text, flags=re.S))  # fmt: skip
