"""The package's modules form layers: a module imports only modules below it, never one that
imports it back (directly or through others). Imports inside functions count too: a lazy
import is still a dependency. Read from the sources with ``ast``, nothing imported."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "fastensor"
NAME = "fastensor"


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that the module at ``path`` imports, anywhere in it."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 or node.module == NAME or (node.module or "").startswith(NAME):
                base = node.module or ""
                if node.level == 0:
                    base = base[len(NAME) :].lstrip(".")
                if base:
                    out.add(base.split(".")[0])
                else:  # `from . import a, b`
                    out.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == NAME:
                    out.add(parts[1] if len(parts) > 1 else "__init__")
    return out & modules


def graph() -> dict[str, set[str]]:
    """Each module of the package and the package's modules it imports."""
    files = {p.stem: p for p in PACKAGE.glob("*.py")}
    return {name: _imports(path, set(files)) - {name} for name, path in files.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each group of modules that import each other (Tarjan's strongly
    connected components of more than one module), each as the modules in a loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_detector_finds_cycles_direct_and_through_others():
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_the_import_reader_sees_every_form_of_import(tmp_path):
    code = (
        "from . import a, b as bb\n"
        "from .c import x\n"
        "import fastensor.d\n"
        "from fastensor.e import y\n"
        "def f():\n"
        "    from .g import z\n"
        "import numpy\n"
    )
    (tmp_path / "m.py").write_text(code)
    mods = {"a", "b", "c", "d", "e", "g", "h"}
    assert _imports(tmp_path / "m.py", mods) == {"a", "b", "c", "d", "e", "g"}


def test_no_module_of_the_package_imports_one_that_imports_it_back():
    edges = graph()
    assert {"torch", "numpy", "_common", "errors"} <= set(edges), sorted(edges)
    assert cycles(edges) == [], "import cycles among fastensor's modules"
