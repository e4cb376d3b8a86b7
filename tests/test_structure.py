"""The shape of the code: packages in layers, each importing only its own layer and the ones below;
no package cycles; functions stay short."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "meshbench"
# Bottom to top. A module may import its own layer and the layers below it, never one above.
# The top-level modules (errors, limits, files, machine, names, records, validation) are the floor every layer uses.
LAYERS = [
    (
        "core",
        [
            "meshbench",
            "meshbench.errors",
            "meshbench.limits",
            "meshbench.files",
            "meshbench.machine",
            "meshbench.names",
            "meshbench.records",
            "meshbench.validation",
            "meshbench.codebase",  # counts of meshbench's own code, run as commands: it imports nothing of ours
        ],
    ),
    ("model", ["meshbench.model"]),  # the numpy dense Llama, its KV state, GGUF files of its weights
    ("engine", ["meshbench.engine"]),  # what runs a batch, and the process it may run in
    ("scheduler", ["meshbench.scheduler"]),  # admission and the batching policy: no arrays, no engine calls
    ("workload", ["meshbench.workload"]),  # the config, arrivals, prompts, fault specs
    ("analysis", ["meshbench.analysis"]),  # pure functions from records to figures and verdicts
    ("results", ["meshbench.results"]),  # results.json, the bundle, its README and chart
    ("verify", ["meshbench.verify"]),  # checking a bundle: below the runner, which it never imports
    ("sweep", ["meshbench.sweep"]),  # the driver: engine calls, passes, levels, a run
    ("endpoint", ["meshbench.endpoint"]),  # a serving endpoint as the node under test: HTTP clients, its sweep
    ("hunt", ["meshbench.hunt"]),  # generated request histories against a server, judged, shrunk, replayed
    ("compare", ["meshbench.compare"]),
    ("bench", ["meshbench.bench"]),
    ("cli", ["meshbench.cli"]),
]
# verify sits below the sweep (the CLI injects the rerun), and loads no engine either: checking a JSON file
# starts no process and loads no model.
FORBIDDEN = {
    "meshbench.verify": [
        "meshbench.sweep",
        "meshbench.engine.process",
        "meshbench.engine.factory",
        "meshbench.engine.gguf_engine",
        "meshbench.engine.llama_model",
    ]
}


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


def all_modules() -> list[str]:
    return sorted(module_name(p) for p in PACKAGE.rglob("*.py"))


def layer_of(module: str) -> int:
    """The index of the layer a module belongs to: the longest matching prefix wins."""
    best, index = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact = prefix == "meshbench"
            if (module == prefix) if exact else (module == prefix or module.startswith(prefix + ".")):
                if len(prefix) > best:
                    best, index = len(prefix), i
    assert index is not None, f"{module} is in no layer: add it to LAYERS"
    return index


def package_of(module: str) -> str:
    """The package a module belongs to (meshbench.engine.process.proxy -> meshbench.engine.process)."""
    path = module_path(module)
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


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


def chain(seen: dict[str, str], m: str) -> str:
    out = [m]
    while seen[out[-1]]:
        out.append(seen[out[-1]])
    return " <- ".join(out)


@pytest.mark.parametrize("module", all_modules())
def test_no_module_imports_a_layer_above_its_own(module):
    mine = layer_of(module)
    upward = sorted(m for m in imports_of(module_path(module)) if layer_of(m) > mine)
    assert not upward, f"{module} ({LAYERS[mine][0]}) imports upward: {upward}"


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for m in all_modules():
        src = package_of(m)
        graph.setdefault(src, set())
        graph[src] |= {package_of(t) for t in imports_of(module_path(m)) if package_of(t) != src}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every package cycle, found by a depth-first walk (each reported from its first package)."""
    found, state = [], {}

    def walk(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            walk(node, [node])
    return found


def test_no_package_cycles():
    assert cycles(package_graph()) == []


def test_the_cycle_walk_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


@pytest.mark.parametrize("top", sorted(FORBIDDEN))
def test_verify_never_loads_the_runner(top):
    for m in [m for m in all_modules() if m == top or m.startswith(top + ".")]:
        seen = reachable(m)
        bad = [chain(seen, s) for s in seen for f in FORBIDDEN[top] if s == f or s.startswith(f + ".")]
        assert not bad, f"{m} loads the runner: {bad}"


def test_the_walk_finds_an_upward_import(tmp_path, monkeypatch):
    """The tests above can fail: a module that imports run is caught, through a lazy import too."""
    fake = tmp_path / "meshbench"
    (fake / "engine").mkdir(parents=True)
    (fake / "sweep").mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "engine" / "__init__.py").write_text("")
    (fake / "sweep" / "__init__.py").write_text("")
    (fake / "sweep" / "run.py").write_text("")
    (fake / "engine" / "bad.py").write_text("def f():\n    from meshbench.sweep import run\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert "meshbench.sweep.run" in reachable("meshbench.engine.bad")
    assert layer_of("meshbench.sweep.run") > layer_of("meshbench.engine.bad")
    assert package_graph()["meshbench.engine"] == {"meshbench.sweep"}


def body_lines(node: ast.FunctionDef) -> int:
    """A function's length from its first statement after the docstring to its end. The signature is not
    counted: a command's signature declares its options (ruff format puts one per line; sweep has 40)."""
    body = node.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return node.end_lineno - body[0].lineno + 1


def test_no_function_body_is_longer_than_sixty_lines():
    long = []
    for p in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and body_lines(node) > 60:
                long.append(f"{module_name(p)}.{node.name}: {body_lines(node)} lines")
    assert long == []


def test_no_module_is_longer_than_four_hundred_lines():
    long = [
        f"{module_name(p)}: {n} lines"
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > 400
    ]
    assert long == []


def test_body_lines_counts_from_the_first_statement():
    fn = ast.parse('def f(\n    a,\n    b,\n):\n    """Doc."""\n    x = 1\n    return x\n').body[0]
    assert body_lines(fn) == 2


def test_every_package_is_installed_by_a_build_not_only_an_editable_one():
    tomllib = pytest.importorskip("tomllib")  # (Python 3.11+)
    root = Path(__file__).resolve().parent.parent
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(root).parts) for p in (root / "meshbench").rglob("__init__.py")} | {
        "meshbench.schemas"
    }
    assert found == listed


def test_the_lookup_count_finds_every_kind_a_grep_misses(tmp_path):
    from meshbench.codebase import lookups

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        "def f(d, k, rec):\n"
        "    a = d['single'] + d[\"double\"] + d[0] + d[1:2]\n"
        "    b = f\"{d['inside']} {d['again']}\"\n"
        "    c = d.get('x') or d.get(k) or getattr(rec, k) or getattr(rec, 'name')\n"
        "    names = ('ttft_ms.p50', 'plain', \"tpot_ms.p99\")\n"
        "    return Record(**d, other=1), a, b, c, names\n"
        "def g(rows, sid):\n"
        "    by_id = {r.id: r for r in rows}\n"
        "    by_id[sid] = None\n"  # (an item set in a map does not bind its name again)
        "    def inner(k):\n"
        "        return by_id.get(k)\n"  # (a closure over the map its function built: an index)
        "    return by_id.get(sid), rows.get(sid), inner\n"  # (rows was given: counted)
        "class C:\n"
        "    def __init__(self):\n"
        "        self.seen = defaultdict(int)\n"
        "    def add(self, k):\n"
        "        self.seen[k] += 1\n"
        "    def has(self, k):\n"
        "        return self.seen.get(k), self.other.get(k)\n"
    )
    (tmp_path / "top.py").write_text("x = {}['k']\n")
    parts = lookups.by_part(tmp_path)
    pkg = parts["pkg"]
    assert [pkg[k] for k in lookups.KINDS] == [2, 2, 1, 3, 1, 2, 1]
    assert pkg[lookups.INDEX] == 3
    assert parts["."][lookups.KINDS[0]] == 1
    assert "| total | 3 | 2 | 1 | 3 | 1 | 2 | 1 | 13 | 3 |" in lookups.table(parts)
    assert lookups.main([str(tmp_path / "missing")]) == 2


# maps a function did not build, though a name like theirs was bound to a new map somewhere near: each counted
NOT_INDEXES = """
def rebound(given, k):
    d = {}
    d = given
    return d.get(k)
def shadowed_by_a_parameter(k):
    m = {}
    def g(m, key):
        return m.get(key)
    return g, [m.get(k) for m in ()], lambda m: m.get(k)
def built_only_inside(cache, k):
    def inner():
        cache = {}
        return cache
    return cache.get(k)
def copies_and_records(record, obj, name):
    row, data, d = dict(record), obj.dict(), {"ttft_ms": 1, "tpot_ms": 2}
    return row.get(name), data.get(name), d.get(name)
class C:
    def __init__(self):
        self.x = {}
    def load(self, given):
        self.x = given
    def read(self, k):
        return self.x.get(k)
def filled_by_field_name(names, ttft):
    out = {}
    out["ttft_ms.p50"] = ttft
    return [out.get(n) for n in names]
class Fields:
    def __init__(self):
        self.fields = {}
        self.fields["title"] = "t"
    def read(self, k):
        return self.fields.get(k)
"""


def test_the_lookup_count_sets_aside_only_maps_built_where_they_are_read(tmp_path):
    from meshbench.codebase import lookups

    (tmp_path / "m.py").write_text(NOT_INDEXES)
    counts = lookups.counted(tmp_path / "m.py")
    assert (counts[lookups.KINDS[3]], counts[lookups.INDEX]) == (11, 0)
