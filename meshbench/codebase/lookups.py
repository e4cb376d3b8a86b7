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

A subscript by an integer or a slice is not counted; neither is a ``get`` on something that is not a mapping
(the count cannot tell, and says so by naming the category, not the type)."""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from pathlib import Path

KINDS = ('["key"]', "f\"{x['key']}\"", '.get("key")', ".get(var)", "getattr(x, var)", '"a.b" names', "**splat")
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z_0-9]*\.[A-Za-z_0-9]+$")


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


class _Counter(ast.NodeVisitor):
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._fstring = 0

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
            self.counts[KINDS[2] if _is_str(node.args[0]) else KINDS[3]] += 1
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
    head = "| part | " + " | ".join(f"`{k}`" for k in KINDS) + " | all |"
    lines = [head, "|" + "---|" * (len(KINDS) + 2)]
    for name, c in rows:
        lines.append(f"| {name} | " + " | ".join(str(c[k]) for k in KINDS) + f" | {sum(c[k] for k in KINDS)} |")
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
