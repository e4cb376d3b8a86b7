"""Data read by name rather than by attribute, counted from the syntax tree of every module under a folder.

``python -m meshbench.codebase.lookups [FOLDER] [--modules]`` prints, per package (or per module), how many of
each kind it finds:

- ``["key"]``: a subscript by a string constant, outside an f-string;
- ``f"{x['key']}"``: the same inside an f-string (which a grep for double quotes misses);
- ``.get("key")``: a ``get`` call whose first argument is a string constant;
- ``.get(var)``: a ``get`` call whose first argument is anything else (a name held in a variable);
- ``getattr(x, var)``: ``getattr`` with a name that is not a constant;
- ``"a.b" names``: string constants shaped ``word.word`` inside a tuple, list or set literal (figure names such
  as ``"ttft_ms.p50"`` listed for lookups elsewhere);
- ``**splat``: a mapping splatted into a call's keywords.

Reported beside them, not in ``all``: ``.get(var)`` on a map the same function (or, for ``self.x``, the same
class) built itself, from ``{}``, a dict comprehension, ``dict()``, ``defaultdict()`` or ``Counter()``: an index a
check builds (sessions by id, counts by tick), read by a key that is data, not a field's name.

A subscript by an integer or a slice is not counted; neither is a ``get`` on something that is not a mapping
(the count cannot tell, and says so by naming the category, not the type)."""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from pathlib import Path

KINDS = ('["key"]', "f\"{x['key']}\"", '.get("key")', ".get(var)", "getattr(x, var)", '"a.b" names', "**splat")
INDEX = ".get(var) on a map it built"
_BUILDERS = frozenset({"dict", "defaultdict", "Counter", "OrderedDict"})
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z_0-9]*\.[A-Za-z_0-9]+$")


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _builds_map(node: ast.AST | None) -> bool:
    if isinstance(node, (ast.Dict, ast.DictComp)):
        return True
    if isinstance(node, ast.Call):
        f = node.func
        return (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None) in _BUILDERS
    return False


def _holder(node: ast.AST) -> str | None:
    """``name`` or ``self.name``: what an assignment binds, or what a ``get`` is called on."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return f"self.{node.attr}"
    return None


def _built_maps(scope: ast.AST) -> set[str]:
    """The names (and ``self.`` attributes) ``scope`` assigns a new map to, anywhere in it."""
    out = set()
    for n in ast.walk(scope):
        pairs: list[tuple[ast.expr, ast.expr | None]] = []
        if isinstance(n, ast.Assign):
            pairs = [(t, n.value) for t in n.targets]
        if isinstance(n, ast.AnnAssign):
            pairs = [(n.target, n.value)]
        out |= {h for t, v in pairs if _builds_map(v) and (h := _holder(t))}
    return out


class _Counter(ast.NodeVisitor):
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._fstring = 0
        self._built: list[set[str]] = [set()]  # the maps built in each enclosing class or function

    def _scope(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        built = _built_maps(node)
        if isinstance(node, ast.ClassDef):  # (a class's own: the maps its methods keep on self)
            built = {h for h in built if h.startswith("self.")}
        self._built.append(built)
        self.generic_visit(node)
        self._built.pop()

    visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _scope

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        self._fstring += 1
        self.generic_visit(node)
        self._fstring -= 1

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if _is_str(node.slice):
            self.counts[KINDS[1] if self._fstring else KINDS[0]] += 1
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "get" and node.args:
            if _is_str(node.args[0]):
                self.counts[KINDS[2]] += 1
            else:
                held = _holder(f.value)
                self.counts[INDEX if held and any(held in b for b in self._built) else KINDS[3]] += 1
        if isinstance(f, ast.Name) and f.id == "getattr" and len(node.args) >= 2 and not _is_str(node.args[1]):
            self.counts[KINDS[4]] += 1
        self.counts[KINDS[6]] += sum(k.arg is None for k in node.keywords)
        self.generic_visit(node)

    def _names(self, node: ast.Tuple | ast.List | ast.Set) -> None:
        self.counts[KINDS[5]] += sum(_is_str(e) and bool(_DOTTED.match(e.value)) for e in node.elts)  # type: ignore[attr-defined]
        self.generic_visit(node)

    visit_Tuple = visit_List = visit_Set = _names


def counted(path: Path) -> Counter[str]:
    """Each kind's count in one module."""
    c = _Counter()
    c.visit(ast.parse(path.read_text(), str(path)))
    return c.counts


def by_part(root: Path, modules: bool = False) -> dict[str, Counter[str]]:
    """Counts per package under ``root`` (its top-level modules as ``.``), or per module."""
    parts: dict[str, Counter[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        key = str(rel) if modules else (rel.parts[0] if len(rel.parts) > 1 else ".")
        parts.setdefault(key, Counter()).update(counted(path))
    return parts


def table(parts: dict[str, Counter[str]]) -> str:
    """The counts as a Markdown table, a total row last."""
    total: Counter[str] = Counter()
    for c in parts.values():
        total.update(c)
    rows = [*parts.items(), ("total", total)]
    head = "| part | " + " | ".join(f"`{k}`" for k in KINDS) + f" | all | not in all: `{INDEX}` |"
    lines = [head, "|" + "---|" * (len(KINDS) + 3)]
    for name, c in rows:
        counts = " | ".join(str(c[k]) for k in KINDS)
        lines.append(f"| {name} | {counts} | {sum(c[k] for k in KINDS)} | {c[INDEX]} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    modules = "--modules" in argv
    folders = [a for a in argv if not a.startswith("--")]
    root = Path(folders[0] if folders else Path(__file__).resolve().parents[1])
    if not root.is_dir():
        print(f"error: {root}: not a folder", file=sys.stderr)
        return 2
    print(table(by_part(root, modules)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
