"""The kernel contract, checked for every shipped kernel on the CPU (no kernel library needed).

Plug-ins installed in the environment are left out: their packages answer for them, and
`load_kernel` checks that a plug-in's adapter is its entry's (tests/test_plugin_kernel.py).

- The registry tells the truth without importing: each entry's operations are its adapter's.
- `capabilities(op)` answers for every operation a kernel declares, for every cache it reads;
  a FlashMLA build whose library cannot load says its schema is assumed, in `assumed` and in
  `source`.
- A declared capability is one the call takes: a schema-based adapter's `takes_*` flags match
  the arguments of the op schema it reads (parsed with `torch._C.parse_schema`, the output
  argument one the op writes), and a Python adapter's entry point has `out` / `lse` /
  `accum_workspace` parameters when it says it takes them.
- Every operation of every kernel predicts on the CPU; vLLM's FlashMLA build predicts the vLLM
  PR's "after" column at GLM-5.
- No code outside `kernels/` names a specific kernel: everything goes through the registry.
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import tokenize
from dataclasses import replace as dataclasses_replace
from pathlib import Path

import pytest
import torch

from mlamem import operations
from mlamem.commands.profile import run_profile
from mlamem.kernels import SHIPPED, Capabilities, load_kernel
from mlamem.kernels.base import KV_FORMATS, SPARSE_DECODE, KernelContract, operation_names
from mlamem.kernels.flashmla import FlashMLABuild, schema_op
from mlamem.runtime.paths import available_paths
from mlamem.spec import scenario as scenarios

ROOT = Path(__file__).parent.parent
GiB = 1024**3

CASES = [(name, op) for name, entry in SHIPPED.items() for op in entry.operations]
CASE_IDS = [f"{name}-{op}" for name, op in CASES]


def adapter(name: str) -> KernelContract:
    return load_kernel(name)()


def formats(op: str) -> tuple[str, ...]:
    return KV_FORMATS[op]


# The registry

@pytest.mark.parametrize("name", list(SHIPPED))
def test_the_registry_entry_is_the_adapters_own(name):
    """Listing without importing is truthful: the entry's operations (in operation_names() order) and
    name are the adapter class's."""
    entry, cls = SHIPPED[name], load_kernel(name)
    assert cls.__name__ == entry.cls and cls.__module__ == entry.module
    assert issubclass(cls, KernelContract) and cls.contract == 2
    assert cls.name == name
    assert entry.operations == tuple(cls.operations)
    assert entry.operations == tuple(op for op in operation_names() if op in entry.operations)
    assert entry.help and "\n" not in entry.help


# Capabilities, per operation and cache

@pytest.mark.parametrize(("name", "op"), CASES, ids=CASE_IDS)
def test_capabilities_answer_on_the_cpu_for_every_declared_operation(name, op):
    kernel = adapter(name)
    read = kernel.capabilities(op).kv_formats
    assert read and set(read) <= set(formats(op)), (name, op, read)
    for fmt in read:
        capabilities = kernel.capabilities(op, fmt)
        assert isinstance(capabilities, Capabilities)
        assert capabilities.head_counts and all(
            isinstance(h, int) and h > 0 for h in capabilities.head_counts)
        assert fmt in capabilities.kv_formats, (name, op, fmt, capabilities.kv_formats)
        assert capabilities.source
        assert capabilities.assumed == ("assumed" in capabilities.source), capabilities.source


SCHEMA_CASES = [(name, op) for name, op in CASES if issubclass(load_kernel(name), FlashMLABuild)]


@pytest.mark.parametrize(("name", "op"), SCHEMA_CASES, ids=[f"{n}-{o}" for n, o in SCHEMA_CASES])
def test_a_flashmla_build_without_its_library_says_its_schema_is_assumed(name, op):
    kernel = adapter(name)
    if kernel.unavailable_reason() is None:
        pytest.skip(f"{name} loads here: its schema is read at run time")
    for fmt in formats(op):
        capabilities = kernel.capabilities(op, fmt)
        assert capabilities.assumed
        assert "assumed" in capabilities.source and kernel.assumed_source in capabilities.source


# A declared capability is an argument of the call

SCHEMA_ARGUMENTS = {"takes_out": {"out", "out_"}, "takes_lse": {"lse", "lse_", "softmax_lse"},
                    "takes_accum_workspace": {"o_accum", "accum_workspace"}}
PARAMETERS = {"takes_out": "out", "takes_lse": "lse", "takes_accum_workspace": "accum_workspace"}


def schema_mismatches(schema: str, capabilities: Capabilities) -> list[str]:
    """Each takes_* flag that disagrees with the schema's arguments, or names an argument the
    op does not write."""
    arguments = {arg.name: arg for arg in torch._C.parse_schema(schema).arguments}
    problems = []
    for flag, names in SCHEMA_ARGUMENTS.items():
        present = sorted(names & set(arguments))
        if getattr(capabilities, flag) != bool(present):
            problems.append(f"{flag}={getattr(capabilities, flag)} but the schema has "
                            f"{present or 'none of ' + ', '.join(sorted(names))}")
        for arg_name in present:
            alias = arguments[arg_name].alias_info
            if alias is None or not alias.is_write:
                problems.append(f"{flag}: {arg_name} is not written by the op (no `!`)")
    return problems


def signature_gaps(kernel: KernelContract, op: str, capabilities: Capabilities) -> list[str]:
    """Each declared takes_* whose parameter `run` lacks."""
    method = kernel.run
    parameters = inspect.signature(method).parameters
    return [f"{flag} declared, but {type(kernel).__name__}.{method.__name__} has no "
            f"{parameter}= parameter" for flag, parameter in PARAMETERS.items()
            if getattr(capabilities, flag) and parameter not in parameters]


@pytest.mark.parametrize(("name", "op"), CASES, ids=CASE_IDS)
def test_every_declared_capability_is_an_argument_of_the_call(name, op):
    kernel = adapter(name)
    for fmt in formats(op):
        capabilities = kernel.capabilities(op, fmt)
        if isinstance(kernel, FlashMLABuild):  # the schema it reads (recorded, where not loaded)
            schema, _ = kernel._schema(schema_op(op, fmt))
            assert schema_mismatches(schema, capabilities) == [], (name, op, fmt, schema)
        else:
            assert signature_gaps(kernel, op, capabilities) == [], (name, op, fmt)


def test_the_checks_catch_a_capability_the_call_lacks():
    """A schema without the declared out_, an out_ the op does not write, and a decode without
    the declared lse= are each reported."""
    with_out = ("ns::op(Tensor q, Tensor(a!)? out_=None) -> Tensor", "ns::op(Tensor q) -> Tensor",
                "ns::op(Tensor q, Tensor? out_=None) -> Tensor")
    takes_out = Capabilities(True, False, False, (64,), "test")
    assert schema_mismatches(with_out[0], takes_out) == []
    assert schema_mismatches(with_out[1], takes_out) == [
        "takes_out=True but the schema has none of out, out_"]
    assert schema_mismatches(with_out[2], takes_out) == [
        "takes_out: out_ is not written by the op (no `!`)"]
    assert schema_mismatches(with_out[0], Capabilities(False, False, False, (64,), "test")) == [
        "takes_out=False but the schema has ['out_']"]

    class Claims(KernelContract):
        name, label = "claims", "Claims"

        def unavailable_reason(self):
            return None

        def capabilities(self, op=SPARSE_DECODE, kv_format=None):
            return Capabilities(True, True, False, (64,), "test")

        def run(self, problem, q, inputs, *, out=None):
            raise NotImplementedError

        def allocations(self, problem, sm_count):
            return []

    kernel = Claims()
    assert signature_gaps(kernel, SPARSE_DECODE, kernel.capabilities()) == [
        "takes_lse declared, but Claims.run has no lse= parameter"]


# One interface: run, allocations(problem, sm_count), capabilities, version, unavailable_reason

OLD_ENTRY_POINTS = ("decode", "op_allocations", "accum_workspace_numel")  # contract 1's


@pytest.mark.parametrize("name", list(SHIPPED))
def test_every_kernel_is_called_through_the_one_interface(name):
    """No adapter keeps contract 1's entry points, and none answers for an operation it does
    not run: its capabilities, run and allocations refuse it."""
    cls = load_kernel(name)
    assert not [m for m in OLD_ENTRY_POINTS if hasattr(cls, m)], name
    kernel = cls()
    for op in (o for o in operation_names() if o not in cls.operations):
        with pytest.raises((ValueError, NotImplementedError)):
            kernel.capabilities(op)
        problem = operations.problem_for(scenarios.load("glm5-fp8-tp8"), SPARSE_DECODE, 8, 64)
        problem = dataclasses_replace(problem, op=op, kv_format=formats(op)[0])
        with pytest.raises((ValueError, NotImplementedError)):
            kernel.allocations(problem, 132)
        with pytest.raises((ValueError, NotImplementedError)):
            kernel.run(problem, None, None)


# Every operation predicts on the CPU

def scenarios_driving(op: str) -> list[str]:
    """One shipped scenario per cache `op` reads there (dense decode: bf16 and fp8)."""
    chosen = {}
    for name in scenarios.shipped_names():
        s = scenarios.load(name)
        if op in operations.scenario_operations(s):
            try:
                chosen.setdefault(operations.kv_format(s, op), name)
            except Exception:  # a cache this operation does not read
                continue
    return list(chosen.values())


PREDICT_CASES = [(name, op, s) for name, op in CASES for s in scenarios_driving(op)
                 if operations.reads_cache(adapter(name), scenarios.load(s), op)]


def test_every_operation_has_a_shipped_scenario_to_predict():
    assert {op for _, op, _ in PREDICT_CASES} == {op for _, op in CASES}


@pytest.mark.parametrize(("name", "op", "scenario_name"), PREDICT_CASES,
                         ids=[f"{n}-{o}-{s}" for n, o, s in PREDICT_CASES])
def test_every_operation_predicts_on_the_cpu(name, op, scenario_name):
    chosen, kernel = scenarios.load(scenario_name), adapter(name)
    capabilities = kernel.capabilities(op, operations.kv_format(chosen, op))
    paths = available_paths(capabilities)
    value = operations.operation(op).default_sweep[0]
    result = run_profile(chosen, [value], paths, command="test", kernel=kernel, predict=True,
                         op=op)
    assert not result.measured and result.op == op and result.kernel.name == name
    assert [row.path for row in result.rows] == paths
    for row in result.rows:
        assert row.failure is None, (row.path, row.failure)
        assert row.peak_allocated_bytes is not None and row.peak_allocated_bytes >= 0
        assert row.peak_reserved_bytes is not None and row.peak_reserved_bytes >= 0


def test_vllm_build_predicts_the_prs_after_column_at_glm5():
    """flashmla-vllm stages q and out (out_): the workspace path is vLLM PR #60220's "after"
    column, 0.251 / 2.006 / 4.012 / 8.023 GiB at T = 1024, 8192, 16384, 32768."""
    result = run_profile(scenarios.load("glm5-fp8-tp8"), [1024, 8192, 16384, 32768],
                         ["workspace"], command="test", kernel=adapter("flashmla-vllm"),
                         predict=True)
    rows = result.rows
    assert all(row.staged == ["padded_q", "out"] for row in rows)
    assert [row.peak_allocated_bytes / GiB for row in rows] == pytest.approx(
        [0.251, 2.006, 4.012, 8.023], abs=0.0005)


# Nothing outside kernels/ names a kernel

NAMES = set(SHIPPED)
CLASSES = {entry.cls for entry in SHIPPED.values()}

# (file, text on the line) -> why that mention of a kernel is right where it is.
ALLOWED = {
    ("mlamem/results/legacy.py", "LEGACY_KERNEL_FIELDS ="):
        "old result files' field names (flash_mla, triton), read into kernels.<name>",
    ("mlamem/results/legacy.py", "KERNEL_BEFORE_FLAG ="):
        "the kernel old baselines ran, before --kernel was recorded: a fact about those files",
    ("mlamem/spec/kernel_registry.py", ""): "the registry itself: the one table naming every kernel",
    ("mlamem/runtime/frames.py", "LIBRARIES = frozenset"):
        "the Python packages whose frames are machinery, not a caller's: package names",
    ("mlamem/version.py", '("flashinfer", "flashinfer-python")'):
        "the distributions --version reads from metadata: distribution names",
}
# Mentions in files other changes own, to go through the registry (DEFAULT_KERNEL,
# load_kernel, full_staging_kernels) when those files are next edited. Listed so that a new
# mention fails this test; an entry that no longer matches does no harm.
PENDING = {
}


def _word(name: str) -> re.Pattern:
    return re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w-])")


def _docstring_lines(tree: ast.AST) -> set[int]:
    """Lines of string statements (docstrings, attribute docs): prose, not code."""
    return {line for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for line in range(node.lineno, node.end_lineno + 1)}


def _string_value(token: str) -> str:
    try:
        value = ast.literal_eval(token)
    except (ValueError, SyntaxError):  # an f-string: its text will do
        return token
    return value if isinstance(value, str) else token


def kernel_mentions(source: str) -> list[tuple[int, str]]:
    """(line, why) for each place code names a registered kernel: an adapter class, a kernel
    name as a string or attribute (`"triton"`, `KernelName.flashmla`), `--kernel NAME` in a
    string, or a string listing two or more kernel names. Comments and docstrings are prose
    and are skipped; the triton library (`import triton`) is not the kernel."""
    skip = _docstring_lines(ast.parse(source))
    found, previous = [], None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        line, why = token.start[0], None
        if token.type == tokenize.NAME:
            if token.string in CLASSES:
                why = f"adapter class {token.string}"
            elif token.string in NAMES and previous is not None and previous.string == ".":
                why = f"attribute .{token.string}"
        elif token.type == tokenize.STRING and line not in skip:
            value = _string_value(token.string)
            listed = sorted(n for n in NAMES if _word(n).search(value))
            if value.strip() in NAMES:
                why = f"kernel name {value.strip()!r}"
            elif any(re.search(rf"--kernel[ =]{re.escape(n)}(?![\w-])", value) for n in NAMES):
                why = "--kernel NAME"
            elif len(listed) >= 2:
                why = f"lists kernels {', '.join(listed)}"
        if why:
            found.append((line, why))
        if token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            previous = token
    return found


def test_the_scan_finds_each_way_of_naming_a_kernel():
    source = '''"""Docstring naming flashmla and triton: prose."""
import triton  # the library, and a comment naming FlashMLA
from mlamem.kernels import FlashMLA
kernel = KERNELS[request.get("kernel", "flashmla")]
default = KernelName.triton
HELP = "workspace-full needs --kernel triton"
CHOICES = "flashmla, triton or reference"
fine = "FlashMLA's split-KV scheduler; triton's do_bench"
'''
    assert kernel_mentions(source) == [
        (3, "adapter class FlashMLA"), (4, "kernel name 'flashmla'"), (5, "attribute .triton"),
        (6, "--kernel NAME"), (7, "lists kernels flashmla, reference, triton")]


def test_no_code_outside_kernels_names_a_kernel():
    """Code in mlamem/ reaches kernels through the registry (DEFAULT_KERNEL, load_kernel,
    REGISTRY), so a plug-in is a kernel like any other; ALLOWED says why each exception is
    right, PENDING lists the known ones in files still to be changed."""
    unexplained = []
    for path in sorted((ROOT / "mlamem").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        source = path.read_text()
        lines = source.splitlines()
        for line, why in kernel_mentions(source):
            text = lines[line - 1]
            if any(file == relative and snippet in text
                   for file, snippet in (*ALLOWED, *PENDING)):
                continue
            unexplained.append(f"{relative}:{line}: {why}: {text.strip()}")
    assert unexplained == [], ("name kernels through mlamem.kernels (DEFAULT_KERNEL, "
                               "load_kernel, REGISTRY), or add the line to ALLOWED with its "
                               "reason:\n" + "\n".join(unexplained))


def test_a_contract_1_adapter_runs_through_the_shim_on_the_cpu():
    """A class written against contract 1 (decode, allocations(q_shape)) is run, sized and asked
    through contract 2 by `adapted`, and answers as the shipped reference does."""
    from mlamem.kernels.flashmla import flashmla_allocations
    from mlamem.kernels.reference import sparse_mla_decode_reference
    from mlamem.operations.sparse_decode import run_kernel
    from mlamem.spec.kernel_api import SparseDecodeKernel, adapted

    class OldReference(SparseDecodeKernel):
        name, label = "old-reference", "Old reference"

        def unavailable_reason(self):
            return None

        def capabilities(self, op=SPARSE_DECODE):
            return Capabilities(False, False, False, (64,), "test")

        def decode(self, q, kv_cache, indices, *, sm_scale, d_v, out=None):
            return sparse_mla_decode_reference(q, kv_cache, indices, sm_scale=sm_scale, d_v=d_v)

        def allocations(self, q_shape, d_v, sm_count):
            return flashmla_allocations(q_shape, d_v, sm_count)

    cls = adapted(OldReference)
    assert issubclass(cls, KernelContract) and cls.contract == 2 and cls.name == "old-reference"
    glm = scenarios.load("glm5-fp8-tp8")
    problem = operations.problem_for(glm, SPARSE_DECODE, 4, 64)
    q, inputs = cls().make_inputs(problem, 64, torch.device("cpu"), seed=1)
    q = q.unsqueeze(0)
    got = cls().run(problem, q, inputs)
    want = run_kernel(load_kernel("reference")(), q, inputs.kv, inputs.indices,
                      sm_scale=problem.sm_scale, d_v=problem.d_v)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert cls().allocations(problem, 132) == flashmla_allocations((1, 4, 64, 576), 512, 132)
    assert cls().capabilities(SPARSE_DECODE).source == "test"
    with pytest.raises(ValueError, match="runs only sparse-decode"):
        cls().capabilities("dense-decode")


def test_a_class_of_another_contract_is_refused_in_one_line():
    from mlamem.spec.kernel_api import adapted

    class Future(KernelContract):
        contract = 3

    with pytest.raises(ValueError, match="implements kernel contract 3; this mlamem implements 2 "
                                         r"\(and adapts 1\)"):
        adapted(Future)
    with pytest.raises(ValueError, match="is not a KernelContract subclass"):
        adapted(int)
