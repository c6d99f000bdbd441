"""The package's structure: the store never imports what is built on it, and no private name
(a leading underscore) is imported from another module."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "attattr_cli"
ABOVE_STORE = ("engine", "models", "analysis", "api", "cli", "views", "ops")


def _imports(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            yield node.level, node.module or "", [a.name for a in node.names]


def test_the_store_imports_nothing_built_on_it():
    for path in (PACKAGE / "store").glob("*.py"):
        for level, module, _names in _imports(path):
            top = module.split(".")[0] if level == 2 else (module.split(".")[1] if module.startswith("attattr_cli.") else "")
            assert top not in ABOVE_STORE, f"{path.name} imports {module}"


def test_no_private_name_crosses_a_module():
    crossing = []
    for path in PACKAGE.rglob("*.py"):
        for level, module, names in _imports(path):
            if module == "__future__":
                continue
            crossing += [f"{path.relative_to(PACKAGE)}: {module}.{n}" for n in names
                         if n.startswith("_") and not n.startswith("__")]
    assert crossing == []


def test_no_private_member_of_another_module_is_used():
    """``module._name`` where ``module`` is one of the package's modules imported here."""
    used = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:  # from . import attention; from ..engine import adaptive
                modules.update(a.asname or a.name for a in node.names)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                used.append(f"{path.relative_to(PACKAGE)}: {node.value.id}.{node.attr}")
    assert used == []


def test_every_command_module_imports_the_api_and_nothing_below_it():
    """A command is parse -> one public API call -> print (the errors module and the table of
    argument and flag names are shared by all)."""
    below = []
    for path in (PACKAGE / "cli").glob("*.py"):
        for level, module, names in _imports(path):
            if level == 2 and module.split(".")[0] not in ("api", "errors", "names", ""):
                below.append(f"cli/{path.name}: ..{module}")
    assert below == []


def _module_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _edges() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at the top or inside a function."""
    modules = {_module_of(p): p for p in PACKAGE.rglob("*.py")}
    out: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
                names = [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                target, names = "", [a.name for a in node.names]
            else:
                continue
            for name in names + [target]:
                if name in modules and name != mod and not (path.name == "__init__.py" and name.startswith(mod + ".")):
                    out[mod].add(name)
                    break
    return out


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_the_views_or_the_store():
    """store/reader, steps and writer, and views/html and still, import one another one way
    only (lazy imports count); the store's family datasets live in store/family.py."""
    circles = [c for c in _cycles(_edges()) if any(m.startswith(("attattr_cli.store.", "attattr_cli.views."))
                                                   for m in c)]
    assert circles == []
