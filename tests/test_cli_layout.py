"""cli/ is a package of short functions: no function body in mlamem/cli/ is longer than 40
lines, counted after its signature and docstring; the work lives in the library."""

import ast
from pathlib import Path

import pytest

CLI = Path(__file__).resolve().parents[1] / "mlamem" / "cli"
LIMIT = 40


def body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of the body after the signature and the docstring."""
    body = function.body
    if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        body = body[1:]
    if not body:
        return 0
    return body[-1].end_lineno - body[0].lineno + 1


def functions(source: str) -> list[tuple[str, int]]:
    """(name, body lines) of every function in `source`, nested ones included."""
    return [(node.name, body_lines(node)) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]


def test_the_cli_is_a_package_of_command_modules():
    names = {p.stem for p in CLI.glob("*.py")}
    assert {"__init__", "options", "main", "profile", "validate", "compare", "repro_oom",
            "report", "merge", "gate", "plan", "graphs", "listings"} <= names
    assert not (CLI.parent / "cli.py").exists()


@pytest.mark.parametrize("path", sorted(CLI.glob("*.py")), ids=lambda p: p.name)
def test_no_function_body_is_longer_than_40_lines(path):
    long = {name: lines for name, lines in functions(path.read_text()) if lines > LIMIT}
    assert not long, f"{path.name}: function bodies over {LIMIT} lines: {long}"


def test_the_count_starts_after_the_signature_and_docstring():
    source = ('def f(\n    a: int = 1,\n) -> None:\n    """Doc.\n\n    More.\n    """\n'
              '    x = 1\n    return x\n')
    assert functions(source) == [("f", 2)]
    long = "def g():\n" + "".join(f"    x{i} = {i}\n" for i in range(41))
    assert functions(long) == [("g", 41)]
    assert functions('def h():\n    """Only a docstring."""\n') == [("h", 0)]
