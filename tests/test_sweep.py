"""The one sweep planner: a request checked before any work and split into parts; every error
names the request's field, never a flag."""

import re

import pytest

from mlamem.commands.sweep import Request, plan
from mlamem.kernels import load_kernel
from mlamem.spec import scenario as scenarios
from mlamem.spec.errors import UserError

FLAG = re.compile(r"(?<![\w-])--[a-z]")


@pytest.fixture(scope="module")
def flashmla():
    return load_kernel("flashmla")()


def glm5():
    return [("glm5-fp8-tp8", scenarios.load("glm5-fp8-tp8"))]


def refused(request: Request, field: str) -> str:
    with pytest.raises(UserError) as caught:
        plan(request)
    assert caught.value.field == field and not FLAG.search(caught.value.message)
    return caught.value.message


def test_one_part_with_the_request_max_num_batched_tokens(flashmla):
    [part] = plan(Request("profile", flashmla, scenarios=glm5(), ops=["sparse-decode"],
                          values={"sparse-decode": [64, 128]}, max_num_batched_tokens=256))
    assert (part.op, part.values, part.source) == ("sparse-decode", [64, 128], "glm5-fp8-tp8")
    assert part.scenario.serving.max_num_batched_tokens == 256
    assert part.paths == ["alloc", "workspace"]  # every path FlashMLA has


def test_values_a_workspace_cannot_hold_are_dropped_unless_asked_for(flashmla):
    mnbt = glm5()[0][1].serving.max_num_batched_tokens
    values = {"sparse-decode": [1024, mnbt * 2]}
    [part] = plan(Request("gate", flashmla, scenarios=glm5(), ops=["sparse-decode"], defaults=values))
    assert part.values == [1024]
    with pytest.raises(UserError, match=f"T={mnbt * 2} exceeds .*; drop it"):
        plan(Request("gate", flashmla, scenarios=glm5(), ops=["sparse-decode"], values=values, fix="drop it"))


def test_paths_listed_twice_or_unknown_name_the_paths(flashmla):
    assert "listed twice" in refused(Request("profile", flashmla, scenarios=glm5(),
                                             paths=["alloc", "alloc"]), "paths")
    assert "unknown path 'cuda'" in refused(Request("profile", flashmla, scenarios=glm5(),
                                                    paths=["cuda"]), "paths")


def test_max_num_batched_tokens_is_refused_where_it_sizes_nothing(flashmla):
    dense = [("kimi-k2-dense-tp4-dp", scenarios.load("kimi-k2-dense-tp4-dp"))]
    assert "dense-decode's holds" in refused(Request("profile", flashmla, scenarios=dense,
                                                     ops=["dense-decode"],
                                                     max_num_batched_tokens=64),
                                             "max_num_batched_tokens")
    assert "must be > 0" in refused(Request("profile", flashmla, scenarios=glm5(),
                                            max_num_batched_tokens=0), "max_num_batched_tokens")


def test_a_command_about_one_operation_names_the_kernel_or_scenario():
    flashinfer = load_kernel("flashinfer")()
    assert "pick a kernel that runs sparse-decode" in refused(
        Request("graphs", flashinfer, scenarios=glm5()), "kernel")
    dense = [("kimi-k2-dense-tp4-dp", scenarios.load("kimi-k2-dense-tp4-dp"))]
    assert "pick a sparse-decode scenario" in refused(
        Request("graphs", load_kernel("flashmla")(), scenarios=dense),
        "scenario")


def test_a_swept_quantity_no_part_takes_is_refused(flashmla):
    message = refused(Request("gate", flashmla, scenarios=glm5(), values={"sparse-decode": [8]},
                              keys=["requests"]), "requests")
    assert "give tokens instead" in message
