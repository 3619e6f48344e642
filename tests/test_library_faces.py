"""The library speaks in fields, the faces in flags: no library module imports typer (or click),
and no error a library module raises names a `--flag` (the CLI maps `UserError.field` to one)."""

import ast
import pickle
import re
from collections import Counter
from pathlib import Path

import pytest

from mlamem.cli import flag_for
from mlamem.spec.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
# The CLI's doors and the test helpers that run it as a user would (`mlamem.testing.check_bad_input`);
# the CLI itself, mlamem/cli/, is left out by path.
FACES = {"mlamem/entry.py", "mlamem/__main__.py", "mlamem/testing.py"}
# The engines' spec modules, which parse an engine's own command line (`--serve "vllm serve ..."`):
# their errors name that command's flags (vLLM's, TensorRT-LLM's, SGLang's), which are the input,
# not mlamem's options.
ENGINE_COMMAND_PARSERS = {"mlamem/spec/engines/vllm.py", "mlamem/spec/engines/trtllm.py",
                          "mlamem/spec/engines/sglang.py"}
FLAG = re.compile(r"(?<![\w-])--([a-z]|$)")  # `--x`, or `--` before a formatted name
# Another program's command line (an install hint, a cited nvidia-smi query) and notes (output
# that tells where a figure came from, not an error) keep their flags.
OTHER_PROGRAM = re.compile(r"(pip|nvidia-smi) ")


def library_modules() -> list[Path]:
    files = sorted((ROOT / "mlamem").rglob("*.py")) + sorted((ROOT / "kernels").rglob("*.py"))
    return [f for f in files if str(f.relative_to(ROOT)) not in FACES
            and not str(f.relative_to(ROOT)).startswith("mlamem/cli/")]


def imported(tree: ast.AST) -> set[str]:
    """The top-level packages a module imports anywhere (function level included), and
    `mlamem.cli` where it imports the CLI."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {n.split(".")[0] for n in names} | {n for n in names if n.startswith("mlamem.cli")}


def raise_texts(tree: ast.AST) -> list[str]:
    """Every string constant inside a raise statement, f-strings' literal parts included."""
    return [node.value for statement in ast.walk(tree) if isinstance(statement, ast.Raise)
            for node in ast.walk(statement)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def hint_texts(tree: ast.AST) -> list[str]:
    """The strings an error can take in from elsewhere: module-level string constants (a fix
    kept as `RAISE_LIMIT = "..."`) and parameters' string defaults (`option="--output"`)."""
    constants = [node.value.value for node in getattr(tree, "body", [])
                 if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                 and isinstance(node.value.value, str)
                 and not any(t.id.endswith("_NOTE") for t in node.targets if isinstance(t, ast.Name))
                 and not OTHER_PROGRAM.match(node.value.value)]
    defaults = [d.value for node in ast.walk(tree)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                for d in node.args.defaults + [k for k in node.args.kw_defaults if k is not None]
                if isinstance(d, ast.Constant) and isinstance(d.value, str)]
    return constants + defaults


def flag_counts() -> Counter:
    counts = Counter()
    for path in library_modules():
        tree = ast.parse(path.read_text(), str(path))
        texts = raise_texts(tree) + hint_texts(tree)
        counts[str(path.relative_to(ROOT))] += sum(bool(FLAG.search(t)) for t in texts)
    return +counts


def test_the_scan_sees_library_modules():
    names = {str(p.relative_to(ROOT)) for p in library_modules()}
    assert {"mlamem/commands/gate.py", "mlamem/engines/base.py", "kernels/plugins.py"} <= names
    assert not names & FACES


@pytest.mark.parametrize("path", library_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_library_module_imports_no_face(path):
    """typer and click belong to the CLI: a library module imports neither, nor the CLI."""
    found = imported(ast.parse(path.read_text()))
    assert not found & {"typer", "click"} and not any(n.startswith("mlamem.cli") for n in found)


def test_the_import_scan_finds_typer_and_the_cli():
    assert "typer" in imported(ast.parse("def f():\n    from typer import Option\n"))
    assert "mlamem.cli" in imported(ast.parse("from mlamem import cli\n"))
    assert "mlamem.cli" in imported(ast.parse("import mlamem.cli\n"))


def test_no_library_error_names_a_flag():
    naming = {name: count for name, count in flag_counts().items()
              if count and name not in ENGINE_COMMAND_PARSERS}
    assert not naming, f"library errors naming a --flag (name the field instead): {naming}"


def test_the_flag_scan_finds_a_flag_kept_apart_from_the_raise():
    tree = ast.parse('FIX = "raise it with --tokens"\nA_NOTE = "as --x"\nHINT = "pip install --no-deps x"\n'
                     'def f(path, option="--output"):\n    pass\n')
    assert hint_texts(tree) == ["raise it with --tokens", "--output"]


def test_the_flag_scan_finds_a_flag():
    tree = ast.parse('def f(x):\n    raise UserError(f"--tokens: {x} is bad", field=None)\n')
    assert [t for t in raise_texts(tree) if FLAG.search(t)] == ["--tokens: "]
    assert raise_texts(ast.parse('raise ValueError("a-- b")')) == ["a-- b"]
    assert not FLAG.search("a-- b") and not FLAG.search("max-num--x")


@pytest.mark.parametrize(("field", "flag"), [
    ("max_num_batched_tokens", "--max-num-batched-tokens"), ("tokens[2]", "--tokens"),
    ("gpu_memory_bytes", "--gpu-memory"), ("report_dir", "--report"), ("shard", "--shard")])
def test_the_cli_words_a_field_as_its_flag(field, flag):
    assert flag_for(field) == flag


def test_a_field_error_reads_as_field_then_message():
    error = UserError("'x' is not a shard", field="shard")
    assert str(error) == "shard: 'x' is not a shard"
    assert error.worded("--shard") == "--shard: 'x' is not a shard"
    assert UserError("plain").worded("--shard") == "plain"


def test_a_field_error_keeps_its_field_across_processes():
    copy = pickle.loads(pickle.dumps(UserError("bad", field="tokens[1]")))
    assert (type(copy), copy.message, copy.field, str(copy)) == (
        UserError, "bad", "tokens[1]", "tokens[1]: bad")


def _library_refusals(tmp_path):
    """Refusals reached through the library, as the API's callers reach them."""
    from mlamem.commands import gate
    from mlamem.commands.sweep import check_request
    from mlamem.kernels import load_kernel
    from mlamem.spec import files, scenario

    glm5 = scenario.load("glm5-fp8-tp8")
    reference = load_kernel("reference")()
    return {
        "a missing baseline": lambda: gate.load(tmp_path / "missing.json"),
        "an output in a missing folder": lambda: files.check_output_path(tmp_path / "no" / "x.json"),
        "stdout as an output": lambda: files.write_atomic(Path("-"), "x"),
        "a T no tensor can hold": lambda: scenario.check_decode_tokens(glm5, 64, [2**31 - 1]),
        "a T over the workspace": lambda: check_request(glm5, [10**6], ["workspace"], reference),
    }


@pytest.mark.parametrize("case", ["a missing baseline", "an output in a missing folder",
                                  "stdout as an output", "a T no tensor can hold",
                                  "a T over the workspace"])
def test_a_refusal_through_the_library_names_fields_not_flags(case, tmp_path):
    """What the library raises names the field (the CLI words it as its flag), never a flag."""
    with pytest.raises(UserError) as caught:
        _library_refusals(tmp_path)[case]()
    assert caught.value.field and not FLAG.search(str(caught.value)), str(caught.value)
