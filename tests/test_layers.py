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


ABOVE_ENGINE = ("analysis", "api", "cli", "views")


def test_the_engine_imports_nothing_built_on_it():
    """engine/ computes; what reads its results (analysis, the API, the commands, the views)
    lives above it and is never imported from it, lazily or not."""
    for path in (PACKAGE / "engine").rglob("*.py"):
        depth = len(path.relative_to(PACKAGE).parts) - 1  # the level that reaches the package root
        for level, module, _names in _imports(path):
            top = module.split(".")[0] if level == depth + 1 else (
                module.split(".")[1] if module.startswith("attattr_cli.") and "." in module else "")
            assert top not in ABOVE_ENGINE, f"engine/{path.relative_to(PACKAGE / 'engine')} imports {module}"


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


def test_no_private_member_of_the_scorer_is_used_outside_its_module():
    """``obj._name`` where ``_name`` is a private member of the Scorer (engine/scorer.py and its
    parts) is read only in the module that defines that member: the strategies (engine/grouped.py,
    generation.py, sweep.py) use the Scorer's public interface."""
    import sys

    from attattr_cli.engine.scorer import Scorer

    def private(path: Path) -> set[str]:  # members defined in a module: methods, class attributes, self._x =
        tree = ast.parse(path.read_text(), str(path))
        names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        names |= {t.id for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
                  for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
        return {n for n in names if n.startswith("_") and not n.startswith("__")}

    parts = [cls for cls in Scorer.__mro__ if cls.__module__.startswith("attattr_cli.")]  # Scorer and its mixins
    members = {n for cls in parts for n in vars(cls) if n.startswith("_") and not n.startswith("__")}
    members |= {n for cls in parts for n in private(Path(sys.modules[cls.__module__].__file__))}
    assert {"_step_chunk", "_score", "_encode_lm"} <= members  # the scan sees the Scorer's own
    used = []
    for path in PACKAGE.rglob("*.py"):
        own = private(path)
        tree = ast.parse(path.read_text(), str(path))
        used += [f"{path.relative_to(PACKAGE)}:{n.lineno}: .{n.attr}" for n in ast.walk(tree)
                 if isinstance(n, ast.Attribute) and n.attr in members and n.attr not in own]
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


# -- no import circle ------------------------------------------------------------------------
# One exception, a registry: analysis/methods/__init__.py defines Method and register(), then
# imports its method modules at its end so that each registers itself; their import of the
# package is that registration, not a circle. The package root's ``__getattr__`` (PEP 562)
# hands out the public names of api/ lazily: a module importing one of those names from the
# root depends on api/ (the edge goes there), one importing ``__version__`` (bound with no
# import) on the root alone. Importing a submodule runs its package's ``__init__`` first; that
# is Python's doing, not an import written in the code, and is not an edge (cli/__init__ and
# data/__init__, which import their own modules, are therefore no circle).
REGISTRIES = {"analysis/methods/__init__"}


def _module_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at the top or inside a function."""
    mods = {"/".join(p.relative_to(PACKAGE).with_suffix("").parts): p for p in PACKAGE.rglob("*.py")}

    def resolve(dotted: str) -> str | None:
        key = dotted.strip(".").replace(".", "/")
        return key if key in mods else f"{key}/__init__" if f"{key}/__init__" in mods else \
            "__init__" if key == "" else None

    root = ast.parse(mods["__init__"].read_text())
    lazy = {n.value for node in root.body if isinstance(node, ast.Assign)
            and getattr(node.targets[0], "id", None) == "__all__" for n in node.value.elts} - {"__version__"}
    graph = {}
    for name, path in mods.items():
        package, out = name.split("/")[:-1], set()
        tree = ast.parse(path.read_text(), str(path))
        skip = {id(n) for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "__getattr__"
                and name.endswith("__init__") for n in ast.walk(f)}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("attattr_cli")):
                base = package[:len(package) + 1 - node.level] if node.level else []
                base = ".".join(base + ([node.module] if node.module else []))
                base = base.removeprefix("attattr_cli").strip(".") if not node.level else base
                for alias in node.names:
                    target = resolve(f"{base}.{alias.name}") or resolve(base)
                    out.add("api/__init__" if target == "__init__" and alias.name in lazy else target)
            elif isinstance(node, ast.Import):
                out.update(resolve(a.name.removeprefix("attattr_cli")) for a in node.names
                           if a.name.split(".")[0] == "attattr_cli")
        out -= {None, name}
        if name in REGISTRIES:
            out = {t for t in out if not t.startswith(name.removesuffix("__init__"))}
        graph[name] = out
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_circle_and_none_in_a_line():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle_among_the_modules():
    """No set of modules imports itself round (lazy imports inside functions included): a
    circle means the modules are one piece that pretends to be several."""
    graph = _module_graph()
    assert graph["engine/run"] >= {"engine/scorer", "engine/grouped", "engine/generation"}  # the pass sees edges
    report = ["  " + " <-> ".join(c) + ":  " + "; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(c)))}" for m in c)
              for c in _circles(graph)]
    assert not report, "import circles:\n" + "\n".join(report)


EVALUATIONS = {"ablation", "measure", "prune", "faithfulness", "evaluate", "run"}  # what judges a method's scores


def test_no_method_imports_an_evaluation():
    """A method (head or token) gets its task and returns scores; the curve that judges it is
    never imported by it, lazily or not (a choice among candidates asks the task's context,
    on the method's own pairs)."""
    methods = [p for p in (PACKAGE / "analysis" / "circuits").glob("*.py") if "HeadMethod(" in p.read_text()]
    methods += [p for p in (PACKAGE / "analysis" / "methods").glob("*.py") if "register(" in p.read_text()]
    assert len(methods) >= 12
    for path in methods:
        for _level, module, names in _imports(path):
            assert not {module.split(".")[-1], *names} & EVALUATIONS, f"{path.name} imports {module} {names}"


def test_the_circuit_tiers_end_where_the_curve_is_read():
    from attattr_cli.analysis.ablation import PERCENTAGES
    from attattr_cli.analysis.circuits import tiers

    assert set(tiers.TIERS) <= set(PERCENTAGES) and set(tiers.CHECKED) <= set(PERCENTAGES)
    assert max(tiers.CHECKED) <= tiers.TIERS[0]
