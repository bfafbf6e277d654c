"""The package's modules form layers: a module imports only modules below it, never one that
imports it back (directly or through others). Imports inside functions count too: a lazy
import is still a dependency. Read from the sources with ``ast``, nothing imported."""

import ast
import importlib.util
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


def _layer_checker():
    """The repository's layering checker (``scripts/check-layers.py``), whose cycle finder
    this test shares."""
    path = Path(__file__).resolve().parents[2] / "scripts" / "check-layers.py"
    spec = importlib.util.spec_from_file_location("check_layers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each group of modules that import each other (strongly connected components of more
    than one module), its modules sorted."""
    return _layer_checker().strongly_connected(edges)


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
