"""A function imports one of mlamem's modules only for start-up time or to break a cycle (CPU):
the module it imports loads a heavy library when imported (torch, triton, matplotlib, pydantic,
rich, pandas, numpy, yaml, pynvml, typer), or imports the importing module back. Every other import
sits at the top of its module, where a reader and import-linter see it."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mlamem"
HEAVY = {"torch", "triton", "matplotlib", "pydantic", "rich", "pandas", "numpy", "yaml", "pynvml",
         "typer", "click"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolved(node: ast.ImportFrom | ast.Import, package: str) -> list[str]:
    """The modules an import statement names, relative ones resolved; `from a import b` names
    a.b too when b may be a module."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _top_level_imports(tree: ast.Module) -> list[ast.stmt]:
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + [s for h in node.handlers for s in h.body] + node.orelse + node.finalbody
    return found


def _function_imports(tree: ast.Module):
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield function, node


def _graph():
    modules, top, inner = {}, {}, {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        tree = ast.parse(path.read_text())
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        modules[name] = path
        top[name] = {m for node in _top_level_imports(tree) for m in _resolved(node, package)}
        inner[name] = [(f.name, node.lineno, _resolved(node, package)) for f, node in _function_imports(tree)]
    return modules, top, inner


def _reach(start: str, top: dict[str, set[str]], modules: dict) -> set[str]:
    """Everything importing `start` loads, transitively through mlamem's top-level imports (a
    package's __init__ included)."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        for module in (*parents, name):
            for imported in top.get(module, ()):
                if imported.split(".")[0] == "mlamem" and imported in modules:
                    todo.append(imported)
                else:
                    seen.add(imported)
    return seen


def unjustified() -> list[str]:
    modules, top, inner = _graph()
    found = []
    for importer, imports in inner.items():
        for function, line, names in imports:
            targets = [n for n in names if n in modules and n != "mlamem"]
            loaded = {m for target in targets for m in _reach(target, top, modules)}
            heavy = any(m.split(".")[0] in HEAVY for m in loaded)
            cycle = importer in loaded
            if targets and not (heavy or cycle):
                found.append(f"{modules[importer].relative_to(PACKAGE.parent)}:{line} {function} "
                             f"imports {targets[0]}")
    return found


def test_function_level_imports_have_a_reason():
    """Each function-level import of an mlamem module saves start-up time or breaks a cycle."""
    found = unjustified()
    assert not found, "\n".join(["move to the top of the module:", *found])


def test_no_function_is_over_60_lines():
    """A function in mlamem/ fits one screen."""
    long = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} "
            f"({node.end_lineno - node.lineno + 1})"
            for path in sorted(PACKAGE.rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > 60]
    assert not long, "\n".join(long)
