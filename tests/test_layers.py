"""No import cycle among mlamem's modules, counting function-level and TYPE_CHECKING imports (CPU).

grimp reads the installed package, in which pyproject.toml's package-dir puts `kernels/` and
`scenarios/` inside `mlamem`. An editable install maps them without a folder grimp can walk, so
there the checkout is laid out the same way in a temporary folder first. The layers themselves
are import-linter's contracts in pyproject.toml, which .ci/run checks with `lint-imports`.
"""

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import mlamem

pytest.importorskip("grimp", reason="grimp comes with the test extra: pip install -e '.[test]'")
CHECKOUT = Path(__file__).resolve().parent.parent

# The import cycles: each strongly connected set of modules (Tarjan's), as one sorted list.
FIND_CYCLES = """
import json, sys
import grimp

graph = grimp.build_graph("mlamem", exclude_type_checking_imports=False, cache_dir=None)
modules = sorted(graph.modules)
imports = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
index, low, stack, on_stack, cycles = {}, {}, [], set(), []

def visit(module):
    index[module] = low[module] = len(index)
    stack.append(module)
    on_stack.add(module)
    for imported in imports[module]:
        if imported not in index:
            visit(imported)
            low[module] = min(low[module], low[imported])
        elif imported in on_stack:
            low[module] = min(low[module], index[imported])
    if low[module] == index[module]:
        connected = []
        while not connected or connected[-1] != module:
            connected.append(stack.pop())
            on_stack.discard(connected[-1])
        if len(connected) > 1:
            cycles.append(sorted(connected))

sys.setrecursionlimit(10000)
for module in modules:
    if module not in index:
        visit(module)
print(json.dumps({"modules": len(modules), "cycles": sorted(cycles)}))
"""

def package_root(tmp_path: Path) -> Path:
    """A folder holding mlamem as installed: the installed copy when it holds its kernels,
    else the checkout laid out by pyproject.toml's package-dir."""
    installed = Path(mlamem.__file__).parent
    if (installed / "kernels" / "__init__.py").is_file():
        return installed.parent
    package_dir = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"]
    for package, folder in sorted(package_dir.items()):  # "mlamem" before "mlamem.kernels"
        shutil.copytree(CHECKOUT / folder, tmp_path.joinpath(*package.split(".")),
                        ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    return tmp_path


def test_no_import_cycle(tmp_path):
    root = package_root(tmp_path / "site")
    found = subprocess.run([sys.executable, "-c", FIND_CYCLES], cwd=tmp_path, capture_output=True,
                           text=True, env={"PYTHONPATH": str(root), "PATH": ""}, check=True)
    result = json.loads(found.stdout)
    assert result["modules"] > 60, result  # the whole package was read, kernels included
    assert result["cycles"] == [], "import cycles (modules importing each other): " + \
        "; ".join(" <-> ".join(cycle) for cycle in result["cycles"])
