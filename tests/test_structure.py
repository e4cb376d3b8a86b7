"""The shape of the code: engines and the scheduler sit below orchestration, functions stay short."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "meshbench"
LOWER = ["engine", "model", "kv.py", "scheduler"]  # the layers that run a batch
UPPER = {"meshbench.run", "meshbench.sweep", "meshbench.results", "meshbench.bundle", "meshbench.verify",
         "meshbench.recompute", "meshbench.figures", "meshbench.report", "meshbench.admission",
         "meshbench.divergence", "meshbench.cli", "meshbench.cli_common", "meshbench.cli_bench"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_path(name: str) -> Path | None:
    base = PACKAGE.parent.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def imports_of(path: Path) -> set[str]:
    """Every meshbench module ``path`` imports, at any depth of the file (lazy imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("meshbench")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("meshbench"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names if module_path(f"{node.module}.{a.name}")}
    return {m for m in found if module_path(m)}


def reachable(start: str) -> dict[str, str]:
    """Every meshbench module ``start`` imports, directly or not, each with the module that imports it."""
    seen, todo = {start: ""}, [start]
    while todo:
        current = todo.pop()
        for m in imports_of(module_path(current)):
            if m not in seen:
                seen[m] = current
                todo.append(m)
    return seen


def lower_modules() -> list[str]:
    out = []
    for entry in LOWER:
        p = PACKAGE / entry
        out += [module_name(f) for f in (sorted(p.rglob("*.py")) if p.is_dir() else [p])]
    return out


@pytest.mark.parametrize("module", lower_modules())
def test_engines_model_kv_and_scheduler_import_nothing_above_them(module):
    seen = reachable(module)
    upward = sorted(m for m in seen if m in UPPER)
    chains = []
    for m in upward:
        chain = [m]
        while seen[chain[-1]]:
            chain.append(seen[chain[-1]])
        chains.append(" <- ".join(chain))
    assert not upward, f"{module} reaches orchestration: {chains}"


def test_the_walk_finds_an_upward_import(tmp_path, monkeypatch):
    """The test above can fail: a module that imports run is caught, through a lazy import too."""
    fake = tmp_path / "meshbench"
    (fake / "engine").mkdir(parents=True)
    (fake / "run.py").write_text("")
    (fake / "engine" / "bad.py").write_text("def f():\n    from meshbench import run\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert "meshbench.run" in reachable("meshbench.engine.bad")


def test_no_function_is_longer_than_sixty_lines():
    long = []
    for p in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 60:
                    long.append(f"{module_name(p)}.{node.name}: {n} lines")
    assert long == []
