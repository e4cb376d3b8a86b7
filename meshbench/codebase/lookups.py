"""Data read by name rather than by attribute, counted from the syntax tree of every module under a folder.

``python -m meshbench.codebase.lookups [FOLDER] [--modules | --sites]`` prints, per package (or per module), how
many of each kind it finds (``--sites``: each one found, as ``path:line: kind``):

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


_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp, ast.DictComp,
           ast.GeneratorExp)  # fmt: skip


def _builds_map(node: ast.AST | None) -> bool:
    """A new, empty or computed map: ``{}`` (or a display keyed by anything but string constants, which is a
    record), a dict comprehension, ``defaultdict()``, ``Counter()``, ``dict()`` of no name (``dict(given)`` copies
    what it was given)."""
    if isinstance(node, ast.DictComp):
        return True
    if isinstance(node, ast.Dict):
        return not node.keys or not all(k is not None and _is_str(k) for k in node.keys)
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.id if isinstance(f, ast.Name) else None
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "collections":
        name = f.attr
    if name == "dict":
        return not any(isinstance(a, ast.Name) for a in node.args)
    return name in _BUILDERS


def _holder(node: ast.AST) -> str | None:
    """``name`` or ``self.name``: what an assignment binds, or what a ``get`` is called on."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return f"self.{node.attr}"
    return None


def _own(scope: ast.AST) -> list[ast.AST]:
    """The nodes of ``scope``'s own body: nothing inside a nested function, lambda, class or comprehension."""
    out, todo = [], list(ast.iter_child_nodes(scope))
    while todo:
        n = todo.pop()
        out.append(n)
        if not isinstance(n, _NESTED):
            todo.extend(ast.iter_child_nodes(n))
    return out


def _params(scope: ast.AST) -> set[str]:
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = scope.args
        return {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x is not None}
    if isinstance(scope, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return {n.id for g in scope.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
    return set()


def _bound(target: ast.AST) -> list[tuple[str, bool]]:
    """What an assignment target binds, and whether it may still be a new map: a name (or ``self.name``); each of
    a tuple's or a starred target's own; ``d["key"] = v`` binds ``d`` as a record (a field set by its name, as a
    display keyed by string constants is one); ``d[k] = v`` and ``x.y = v`` bind nothing (an item or attribute
    changes what the name holds, not what it is)."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [b for e in target.elts for b in _bound(e)]
    if isinstance(target, ast.Starred):
        return _bound(target.value)
    if isinstance(target, ast.Subscript):
        h = _holder(target.value) if _is_str(target.slice) else None
        return [(h, False)] if h else []
    h = _holder(target)
    return [(h, True)] if h else []


def _bindings(nodes: list[ast.AST]) -> list[tuple[str, bool]]:
    """Every (name or ``self.name``, whether to a new map) that these nodes bind."""
    out: list[tuple[str, bool]] = []
    for n in nodes:
        if isinstance(n, ast.Assign):
            out += [(h, may and _builds_map(n.value)) for t in n.targets for h, may in _bound(t)]
        elif isinstance(n, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
            value = n.value if isinstance(n, ast.AnnAssign) else None  # (x += ..., x := ...: not a new map)
            out += [(h, may and _builds_map(value)) for h, may in _bound(n.target)]
        elif isinstance(n, (ast.For, ast.AsyncFor, ast.withitem)):
            target = n.target if isinstance(n, (ast.For, ast.AsyncFor)) else n.optional_vars
            out += [(x.id, False) for x in ast.walk(target) if isinstance(x, ast.Name)] if target else []
    return out


def _scope_maps(scope: ast.AST) -> tuple[set[str], set[str]]:
    """(what ``scope`` binds, which of those it only ever binds to a new map: its indexes). A class's are the
    ``self.`` attributes its methods bind."""
    if isinstance(scope, ast.ClassDef):
        methods = [m for m in scope.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
        pairs = [(h, b) for m in methods for h, b in _bindings(list(ast.walk(m))) if h.startswith("self.")]
    else:
        pairs = [(h, b) for h, b in _bindings(_own(scope)) if not h.startswith("self.")]
        pairs += [(x, False) for x in _params(scope)]
    bound = {h for h, _ in pairs}
    return bound, {h for h in bound if all(b for x, b in pairs if x == h)}


class _Counter(ast.NodeVisitor):
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.sites: list[tuple[int, str]] = []  # (line, kind), one per lookup counted
        self._fstring = 0
        self._scopes: list[tuple[bool, set[str], set[str]]] = []  # (a class?, bound, indexes), innermost last

    def _scope(self, node: ast.AST) -> None:
        self._scopes.append((isinstance(node, ast.ClassDef), *_scope_maps(node)))
        self.generic_visit(node)
        self._scopes.pop()

    visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _scope
    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _scope

    def _add(self, kind: str, node: ast.AST, n: int = 1) -> None:
        self.counts[kind] += n
        self.sites += [(getattr(node, "lineno", 0), kind)] * n

    def _index(self, held: str | None) -> bool:
        """Whether ``held`` is, where it is read, a map its scope built (the innermost scope binding it decides;
        ``self.x``: the innermost class)."""
        for is_class, bound, built in reversed(self._scopes):
            if held and is_class == held.startswith("self.") and held in bound:
                return held in built
        return False

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        self._fstring += 1
        self.generic_visit(node)
        self._fstring -= 1

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if _is_str(node.slice):
            self._add(KINDS[1] if self._fstring else KINDS[0], node)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "get" and node.args:
            if _is_str(node.args[0]):
                self._add(KINDS[2], node)
            else:
                self._add(INDEX if self._index(_holder(f.value)) else KINDS[3], node)
        if isinstance(f, ast.Name) and f.id == "getattr" and len(node.args) >= 2 and not _is_str(node.args[1]):
            self._add(KINDS[4], node)
        self._add(KINDS[6], node, sum(k.arg is None for k in node.keywords))
        self.generic_visit(node)

    def _names(self, node: ast.Tuple | ast.List | ast.Set) -> None:
        self._add(KINDS[5], node, sum(_is_str(e) and bool(_DOTTED.match(e.value)) for e in node.elts))  # type: ignore[attr-defined]
        self.generic_visit(node)

    visit_Tuple = visit_List = visit_Set = _names


def _visited(path: Path) -> _Counter:
    c = _Counter()
    c.visit(ast.parse(path.read_text(), str(path)))
    return c


def counted(path: Path) -> Counter[str]:
    """Each kind's count in one module."""
    return _visited(path).counts


def sites(root: Path) -> list[str]:
    """Each lookup under ``root`` as ``path:line: kind``, the indexes set aside included (so marked)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for line, kind in sorted(_visited(path).sites):
            out.append(f"{path}:{line}: {kind}" + (" (not in all)" if kind == INDEX else ""))
    return out


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
    print("\n".join(sites(root)) if "--sites" in argv else table(by_part(root, modules)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
