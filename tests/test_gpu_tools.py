"""The GPU tools of the repository (benchmarks/, scripts/decode_call.py), which CI cannot run,
read against the code they call: every name they import from mlamem exists, every call of one
binds to its signature, and every kernel method or attribute they use is on the kernel contract
(`KernelContract`) and on the adapter. Read from their source (ast), so no GPU, flash_mla or
triton is needed: a module that imports triton is read from its source too."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
from pathlib import Path

import pytest

from mlamem.spec.kernel_api import KernelContract

ROOT = Path(__file__).resolve().parent.parent
TOOLS = sorted((ROOT / "benchmarks").glob("*.py")) + [ROOT / "scripts" / "decode_call.py"]


def _stub(node: ast.FunctionDef):
    """A function of `node`'s parameters (defaults None, no annotations), for its signature."""
    args = node.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is not None:
            arg.annotation = None
    args.defaults = [ast.Constant(None) for _ in args.defaults]
    args.kw_defaults = [None if d is None else ast.Constant(None) for d in args.kw_defaults]
    stub = ast.Module([ast.FunctionDef(name=node.name, args=args, body=[ast.Pass()],
                                       decorator_list=[])], type_ignores=[])
    namespace: dict = {}
    exec(compile(ast.fix_missing_locations(stub), "<stub>", "exec"), namespace)
    return namespace[node.name]


def _source_names(module: str) -> dict[str, object]:
    """A module that cannot be imported here (triton missing): its top-level names, each
    function as a stub of its signature, anything else as None (not checked when called)."""
    tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text())
    names: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            names[node.name] = _stub(node)
        elif isinstance(node, ast.ClassDef):
            names[node.name] = None
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update({t.id: None for t in targets if isinstance(t, ast.Name)})
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: None for a in node.names})
    return names


def _resolve(module: str, name: str) -> object:
    """`from module import name` as Python does it (an attribute, else a submodule); a module
    that imports triton, missing here, read from its source. AssertionError where none is."""
    try:
        found = importlib.import_module(module)
        return getattr(found, name) if hasattr(found, name) \
            else importlib.import_module(f"{module}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != "triton":
            raise AssertionError(f"{module} has no {name} ({exc})") from None
    names = _source_names(module)
    assert name in names, f"{module} has no {name}"
    return names[name]


def imported_names(tree: ast.Module) -> dict[str, object]:
    """Every `from mlamem... import NAME` of the tool (at any depth): NAME -> what it is."""
    return {alias.asname or alias.name: _resolve(node.module, alias.name)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mlamem")
            for alias in node.names}


def _binds(target, call: ast.Call, skip: int = 0) -> str | None:
    """Why `call`'s arguments (its first `skip` left out) do not bind to `target`, or None."""
    if not callable(target) or any(isinstance(a, ast.Starred) for a in call.args) \
            or any(k.arg is None for k in call.keywords):
        return None
    try:
        signature = inspect.signature(target)
    except ValueError:  # a builtin without one
        return None
    bind = signature.bind_partial if skip else signature.bind  # partial: the rest comes later
    try:
        bind(*call.args[skip:], **{k.arg: k for k in call.keywords})
    except TypeError as exc:
        return f"line {call.lineno}: {ast.unparse(call)}: {exc}"
    return None


def _kernel_values(tree: ast.Module, names: dict[str, object]) -> dict[int, type]:
    """The nodes that stand for a kernel adapter: `Kernel()` calls and the names a for loop
    binds over a tuple of them, by id(node) -> the adapter's class."""
    kernels = {n for n, v in names.items() if isinstance(v, type) and issubclass(v, KernelContract)}
    values = {id(node): names[node.func.id] for node in ast.walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in kernels}
    for loop in (n for n in ast.walk(tree) if isinstance(n, ast.For)):
        items = getattr(loop.iter, "elts", [])
        if isinstance(loop.target, ast.Name) and items and all(id(i) in values for i in items):
            for node in ast.walk(loop):
                if isinstance(node, ast.Name) and node.id == loop.target.id:
                    values[id(node)] = values[id(items[0])]
    return values


def problems(path: Path) -> list[str]:
    """What in the tool does not match the code it calls, one line each."""
    tree = ast.parse(path.read_text())
    names = imported_names(tree)
    kernels = _kernel_values(tree, names)
    contract = set(dir(KernelContract)) | set(KernelContract.__annotations__)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node.value) in kernels:
            adapter = kernels[id(node.value)]
            if node.attr not in contract or not hasattr(adapter(), node.attr):
                found.append(f"line {node.lineno}: {adapter.__name__}().{node.attr}: not an "
                             "attribute of the kernel contract (KernelContract)")
        if not isinstance(node, ast.Call):
            continue
        func, skip = node.func, 0
        if isinstance(func, ast.Attribute) and func.attr == "partial" and node.args:
            func, skip = node.args[0], 1  # functools.partial(f, ...): f's arguments
        if isinstance(func, ast.Name) and func.id in names:
            found.append(_binds(names[func.id], node, skip))
        elif isinstance(func, ast.Attribute) and id(func.value) in kernels:
            found.append(_binds(getattr(kernels[id(func.value)](), func.attr, None), node, skip))
    return sorted((p for p in found if p is not None), key=lambda p: int(p.split(":")[0][5:]))


@pytest.mark.parametrize("path", TOOLS, ids=lambda p: p.name)
def test_a_gpu_tool_calls_the_code_as_it_is(path):
    """Each benchmark and scripts/decode_call.py: no name, argument or kernel method that the
    code no longer has (benchmarks/triton_vs_flashmla.py called FlashMLA().decode after the
    kernel contract became run(problem, q, inputs))."""
    assert problems(path) == []


def test_the_check_finds_a_method_the_contract_does_not_have(tmp_path):
    """The check itself: a tool calling contract 1's decode, or a call missing an argument,
    is named with its line."""
    tool = tmp_path / "tool.py"
    tool.write_text("from mlamem.kernels import FlashMLA\n"
                    "from mlamem.operations.sparse_decode import run_kernel\n"
                    "FlashMLA().decode(1, 2, 3, sm_scale=1, d_v=512)\n"
                    "run_kernel(FlashMLA(), 1, 2, d_v=512)\n")
    found = problems(tool)
    assert found[0].startswith("line 3: FlashMLA().decode: not an attribute")
    assert found[1].startswith("line 4: run_kernel(") and "missing" in found[1]
