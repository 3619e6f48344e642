"""No mlamem module imports another from a string (CPU): import-linter and grimp see only
plain imports, so an `importlib.import_module` or `__import__` would hide an edge of the
layers. The registries' loading is the one exception: an adapter of a kernel by its entry
(`kernel_registry.load_kernel`, `kernel_plugins.load_plugin_adapter`); engines load their specs
and ranks as entry points (`importlib.metadata.EntryPoint.load`), which this scan allows."""

import ast
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
ALLOWED = {("mlamem/spec/kernel_registry.py", "load_kernel"),
           ("mlamem/spec/kernel_plugins.py", "load_plugin_adapter")}


def string_imports(path: Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of each import_module / __import__ call in `path`."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Call):
                callee = child.func
                name = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", "")
                if name in ("import_module", "__import__"):
                    found.append((function, child.lineno))
            visit(child, function)

    visit(ast.parse(path.read_text()), "<module>")
    return found


def test_the_scan_finds_a_string_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import importlib\n\ndef f():\n    return importlib.import_module('mlamem.x')\n"
                      "g = __import__('mlamem')\n")
    assert string_imports(module) == [("f", 4), ("<module>", 5)]


def test_no_module_imports_another_from_a_string():
    bad = []
    for folder in ("mlamem", "kernels"):
        for path in sorted((CHECKOUT / folder).rglob("*.py")):
            relative = path.relative_to(CHECKOUT).as_posix()
            bad += [f"{relative}:{line} in {function}" for function, line in string_imports(path)
                    if (relative, function) not in ALLOWED]
    assert bad == [], "string imports (use a plain import, function-level where start-up needs it): " + \
        "; ".join(bad)
