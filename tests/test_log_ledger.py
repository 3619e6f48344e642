"""`repro-oom --log`: the server log beside mlamem's rank (mlamem/commands/log_ledger.py): the
ledger, the OOM explained from its message, and the serve command that fits."""

from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path

import pytest

from mlamem.cli import main
from mlamem.results.ledger import NOT_MODELLED
from mlamem.spec.serve_command import with_flag
from mlamem.testing import check_bad_input

GiB = 2**30
ROOT = Path(__file__).parent.parent
SEED_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a "
            "total capacity of 79.19 GiB of which 5.29 GiB is free.")


def seed_serve() -> str:
    """The seed's serve command, as scripts/gpu_check.py runs it on the GPU."""
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SEED_SERVE + " --enforce-eager"


def seed_args(log: Path) -> list[str]:
    return ["repro-oom", "--serve", seed_serve(), "--gpu", "H100 SXM 80GB",
            "--weights-per-rank", "40GiB", "--predict", "--log", str(log)]


def ledger(log: Path, capsys) -> dict:
    assert main([*seed_args(log), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)["log"]


@pytest.fixture(scope="module")
def seed_ledger(tmp_path_factory) -> dict:
    log = tmp_path_factory.mktemp("log") / "seed-oom.log"
    log.write_text(f"INFO startup\n{SEED_OOM}\n")
    out = log.with_suffix(".json")  # a module fixture has no capsys: the JSON goes to a file
    assert main([*seed_args(log), "--format", "json", "--output", str(out)]) == 0
    return json.loads(out.read_text())["log"]


def test_seed_oom_names_o_accum_at_8_gib(seed_ledger):
    """The seed's OOM line at the seed's command: o_accum, 8.000 GiB, at 32768 tokens, on
    every path; with what the rank held, mlamem's verdict is the user's: oom."""
    for path in seed_ledger["paths"]:
        assert (path["failing_buffer"], path["failing_buffer_bytes"]) == ("o_accum", 8 * GiB)
        assert path["step_tokens"] == 32768
        assert path["verdict_with_log"] == "oom"


def test_seed_held_memory_comes_from_the_free_figure(tmp_path, seed_ledger, capsys):
    """The memory held beyond the model is derived from "5.29 GiB free": a log with 1 GiB
    more free gives exactly 1 GiB less held, on each path, and it is the ledger's last row."""
    log = tmp_path / "more-free.log"
    log.write_text(SEED_OOM.replace("5.29 GiB is free", "6.29 GiB is free"))
    more_free = ledger(log, capsys)
    for seed, other in zip(seed_ledger["paths"], more_free["paths"], strict=True):
        assert seed["held_bytes"] > 0
        assert seed["held_bytes"] - other["held_bytes"] == round(6.29 * GiB) - round(5.29 * GiB)
        last = seed["rows"][-1]
        assert last["component"] == NOT_MODELLED and last["difference_bytes"] == seed["held_bytes"]


def test_seed_safe_tokens_below_32768_and_the_command_carries_them(seed_ledger):
    """The largest safe max_num_batched_tokens for the rank as the log shows it is below the
    user's 32768, and the command that fits is the user's with that value put in."""
    for path in seed_ledger["paths"]:
        safe = path["max_safe_tokens"]
        assert 0 < safe < 32768
        words = shlex.split(path["command_that_fits"])
        assert words[words.index("--max-num-batched-tokens") + 1] == str(safe)
        assert words.count("--max-num-batched-tokens") == 1 and "--enforce-eager" in words
        assert 0 < path["max_safe_fraction"] < 0.85 and path["fraction_knob"] == "utilization"


def test_ledger_puts_the_logs_figures_beside_mlamems(tmp_path, capsys):
    """A log that prints the weights and the KV cache: each row holds the log's figure, its
    line, mlamem's and the difference; what the log does not print is labelled mlamem's only."""
    log = tmp_path / "server.log"
    log.write_text("INFO 04-25 [gpu_model_runner.py:4879] Model loading took 40.50 GiB memory "
                   "and 31.6 seconds\nINFO 04-25 [gpu_worker.py:300] Available KV cache memory: "
                   f"20.00 GiB\n{SEED_OOM}\n")
    rows = {r["component"]: r for r in ledger(log, capsys)["paths"][0]["rows"]}
    weights = rows["weights"]
    assert (weights["log_bytes"], weights["log_line"]) == (round(40.5 * GiB), 1)
    assert weights["difference_bytes"] == round(40.5 * GiB) - 40 * GiB
    assert rows["KV cache"]["log_line"] == 2
    assert rows["non-torch"]["log_bytes"] is None
    assert rows["non-torch"]["source"] == "mlamem only"


def test_table_shows_the_ledger_and_the_command(tmp_path, capsys):
    """The table carries the ledger and the command that fits, ready to paste."""
    log = tmp_path / "seed-oom.log"
    log.write_text(SEED_OOM)
    assert main(seed_args(log)) == 0
    out = capsys.readouterr().out
    assert "the ledger, alloc" in out and NOT_MODELLED.split(",")[0] in out
    assert "the command that fits" in out


def test_markdown_carries_the_ledger(tmp_path, capsys):
    log = tmp_path / "seed-oom.log"
    log.write_text(SEED_OOM)
    assert main([*seed_args(log), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "#### The server log beside mlamem" in out and "failing buffer o_accum" in out


def test_a_log_with_nothing_known_is_one_line(tmp_path):
    """A log mlamem cannot read: one line, exit 2, before any work."""
    log = tmp_path / "server.log"
    log.write_bytes(b"\xff\xfe not a server log\n")
    check_bad_input(["repro-oom", "--predict", "--log", str(log)], "no line of a vLLM, SGLang")


def test_with_flag_changes_or_adds():
    """The flag the user gave is changed (either spelling, `=` or not); else it is added."""
    assert with_flag("vllm serve m --max-num-batched-tokens 32768 -tp 8",
                     "--max-num-batched-tokens", 100) == "vllm serve m --max-num-batched-tokens 100 -tp 8"
    assert with_flag("vllm serve m --max_num_batched_tokens=32768", "--max-num-batched-tokens",
                     7) == "vllm serve m --max_num_batched_tokens=7"
    assert with_flag("vllm serve m", "--max-num-batched-tokens", 7) == (
        "vllm serve m --max-num-batched-tokens 7")


def test_with_flag_leaves_secrets_out():
    """The printed command goes through `redacted`: a token's value is not printed."""
    out = with_flag("vllm serve m --hf-token hf_secret", "--max-num-batched-tokens", 7)
    assert "hf_secret" not in out and "--max-num-batched-tokens 7" in out


def field_script():
    spec = importlib.util.spec_from_file_location("field_table", ROOT / "scripts" / "field_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_field_table_is_current_and_each_modelled_verdict_is_the_users():
    """reports/field's table is what scripts/field_table.py prints now; in every record mlamem
    models, its verdict with the log, on the path the user's server ran, is the user's
    outcome."""
    script = field_script()
    assert script.main(["--check"]) == 0
    for record_file in sorted((ROOT / "reports" / "field").glob("oom-*.json")):
        record = json.loads(record_file.read_text())
        if record["not_modelled"]:
            continue
        ledger = script._ledger(record, ROOT / "reports" / "field" / record["log"])
        ran = [p for p in ledger["paths"] if p["case"] == ledger["held_path"]]
        assert ran and ran[0]["verdict_with_log"] == record["outcome"], record_file.name


def test_plan_carries_the_same_ledger(tmp_path, seed_ledger, capsys):
    """`plan --log` carries the ledger of the rank repro-oom emulates: the same held memory,
    safe values and commands as repro-oom's at the same command."""
    log = tmp_path / "seed-oom.log"
    log.write_text(SEED_OOM)
    args = ["plan", "--serve", seed_serve(), "--gpu", "H100 SXM 80GB", "--weights-per-rank",
            "40GiB", "--log", str(log), "--format", "json"]
    assert main(args) == 0
    plan_log = json.loads(capsys.readouterr().out)["log"]
    keys = ("case", "held_bytes", "failing_buffer", "max_safe_tokens", "command_that_fits")
    assert [{k: p[k] for k in keys} for p in plan_log["paths"]] == [
        {k: p[k] for k in keys} for p in seed_ledger["paths"]]


def test_with_the_held_memory_the_model_has_the_logs_free_memory(seed_ledger):
    """The memory held is what closes the gap: with it beside the rank, the model's free memory
    at the failed request, as torch counts it, is the message's 5.29 GiB (within the 2 MiB
    steps the allocator and the search move in), on the path the server ran (alloc)."""
    import dataclasses

    from mlamem.commands.log_ledger import FREE_UNDER_LIMIT, Rank
    from mlamem.commands.repro import host_setup
    from mlamem.engines import load_engine
    from mlamem.kernels import DEFAULT_KERNEL, load_kernel
    from mlamem.spec.serve_command import from_command

    scenario = from_command(seed_serve(), gpu_name="H100 SXM 80GB", weights_bytes=40 * GiB).scenario
    engine = load_engine("vllm")
    budget = engine.make_budget(gpu_memory_bytes=scenario.gpu.memory_bytes, utilization=0.85,
                                max_num_batched_tokens=32768)
    host = dataclasses.replace(host_setup(DEFAULT_KERNEL, predict=True),
                               gpu_memory_bytes=round(79.19 * GiB))
    rank = Rank(engine, scenario, load_kernel(DEFAULT_KERNEL)(), budget, host, scenario.gpu.sm_count)
    for path in [p for p in seed_ledger["paths"] if p["case"] == seed_ledger["held_path"]]:
        case = rank.case(path["case"], path["held_bytes"])
        assert case["oom_buffer"] == "o_accum"
        free = int(FREE_UNDER_LIMIT.search(case["failure"])[1]) + host.unallocatable_bytes
        assert abs(free - round(5.29 * GiB)) <= 4 * 2**20, path["case"]


def test_seed_held_memory_is_derived_once_on_the_alloc_path(seed_ledger):
    """The user's server ran one path: vLLM's (0.33.0) pads q with new_zeros and lets the kernel
    allocate out, PR #60220's staging being in no release. The held memory is derived on alloc
    and the same on every path, so the workspace path, which allocates less per call, is safe
    at as many step tokens as alloc or more."""
    assert seed_ledger["held_path"] == "alloc"
    assert "PR #60220" in seed_ledger["held_path_reason"]
    paths = {p["case"]: p for p in seed_ledger["paths"]}
    assert paths["alloc"]["held_bytes"] == paths["workspace"]["held_bytes"]
    assert paths["workspace"]["max_safe_tokens"] >= paths["alloc"]["max_safe_tokens"]


def test_log_path_says_which_path_the_engine_ran(tmp_path, seed_ledger, capsys):
    """`--log-path workspace`: the held memory is derived on the workspace path, said so, and
    used on both paths; the table says on which path and why."""
    log = tmp_path / "seed-oom.log"
    log.write_text(SEED_OOM)
    assert main([*seed_args(log), "--log-path", "workspace", "--format", "json"]) == 0
    stated = json.loads(capsys.readouterr().out)["log"]
    assert stated["held_path"] == "workspace" and "--log-path" in stated["held_path_reason"]
    held = {p["held_bytes"] for p in stated["paths"]}
    assert len(held) == 1 and held != {seed_ledger["paths"][0]["held_bytes"]}
    assert main([*seed_args(log), "--log-path", "workspace"]) == 0
    assert "derived on the workspace path" in " ".join(capsys.readouterr().out.split())


def test_log_path_without_log_is_refused():
    """--log-path says which path the log's engine ran: without --log it is one line, exit 2."""
    check_bad_input(["repro-oom", "--predict", "--log-path", "alloc"],
                    "--log-path: it names the path the engine of a server log ran; give the log with --log")


@pytest.fixture(scope="module")
def repro_with_log(tmp_path_factory) -> Path:
    """repro-oom's JSON at the seed's command with a log that prints the weights, the KV cache
    and the seed's OOM line."""
    folder = tmp_path_factory.mktemp("report")
    log = folder / "server.log"
    log.write_text("INFO 04-25 [gpu_model_runner.py:4879] Model loading took 40.50 GiB memory "
                   "and 31.6 seconds\nINFO 04-25 [gpu_worker.py:300] Available KV cache memory: "
                   f"20.00 GiB\n{SEED_OOM}\n")
    out = folder / "repro.json"
    assert main([*seed_args(log), "--format", "json", "--output", str(out)]) == 0
    return out


def test_the_ledger_plot_has_each_paths_log_and_mlamem_bars(repro_with_log):
    """The ledger's figure (matplotlib Agg): per path a bar of the log's figures and one of
    mlamem's, whose last segment is the memory held beyond mlamem's model, at its size."""
    from mlamem.render import plots
    from mlamem.results.repro import ReproFile

    ledger = ReproFile.parse(json.loads(repro_with_log.read_text())).log
    figure = plots.ledger_figure(ledger)
    ax = figure.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    for path in ("alloc", "workspace"):
        assert any(label.startswith(f"{path}: the log") for label in labels)
        assert any(label.startswith(f"{path}: mlamem") for label in labels)
    def widths(gid: str) -> set[float]:
        return {round(p.get_width(), 3) for p in ax.patches if p.get_gid() == gid}

    assert widths(f"mlamem: {plots.HELD_LABEL}") == {round(ledger.paths[0].held_bytes / GiB, 3)}
    assert widths("the log: weights") == {40.5}  # the log's figure, its line 1
    assert widths("mlamem: weights") == {40.0}  # --weights-per-rank
    assert widths(f"the log: {plots.HELD_LABEL}") == set()  # the log does not know it
    assert plots.log_ledger(ledger).startswith(b"\x89PNG")


def test_report_carries_the_ledger_and_its_plot(tmp_path, repro_with_log):
    """`mlamem report` of a repro-oom result made with --log: the ledger's Markdown and its
    figure, a PNG referenced from the Markdown."""
    output = tmp_path / "report.md"
    assert main(["report", str(repro_with_log), "--output", str(output)]) == 0
    text = output.read_text()
    assert "#### The server log beside mlamem" in text
    ledger_pngs = sorted(p.name for p in tmp_path.glob("*ledger*.png"))
    assert len(ledger_pngs) == 1 and f"]({ledger_pngs[0]})" in text
    assert (tmp_path / ledger_pngs[0]).read_bytes().startswith(b"\x89PNG")


def test_the_graph_estimate_a_log_gives_as_a_share_sits_beside_mlamems(tmp_path, capsys):
    """vLLM 0.21+ may print its CUDA-graph estimate only as the utilization it is worth
    ("--gpu-memory-utilization=0.9200 is equivalent to ...=0.9129"): the ledger's row is that
    share of the target's total, beside the estimate mlamem's rank sets aside (graphs on)."""
    quoted = (ROOT / "tests" / "fixtures" / "logs" / "vllm-cuda-graph-estimate.log").read_text()
    log = tmp_path / "server.log"
    log.write_text(f"{quoted.splitlines()[1]}\n{SEED_OOM}\n")
    graphs = seed_serve().removesuffix(" --enforce-eager")
    assert main(["repro-oom", "--serve", graphs, "--gpu", "H100 SXM 80GB", "--weights-per-rank",
                 "40GiB", "--predict", "--paths", "alloc", "--log", str(log),
                 "--format", "json"]) == 0
    rows = {r["component"]: r for r in json.loads(capsys.readouterr().out)["log"]["paths"][0]["rows"]}
    estimate = rows["CUDA-graph estimate"]
    assert (estimate["log_bytes"], estimate["log_line"]) == (round(0.0071 * 81079 * 2**20), 1)
    assert estimate["mlamem_bytes"] > 0
    assert estimate["difference_bytes"] == estimate["log_bytes"] - estimate["mlamem_bytes"]


def test_a_report_plots_a_ledger_with_the_graph_estimate(tmp_path):
    """The graph estimate is set aside from the KV cache, not held beside it: `mlamem report`
    plots a ledger that has its row (a vLLM 0.21+ log), leaving it out of the stacked bars."""
    from mlamem.render import plots
    from mlamem.results.repro import ReproFile

    log = tmp_path / "server.log"
    log.write_text((ROOT / "tests" / "fixtures" / "logs" / "vllm-cuda-graph-estimate.log").read_text())
    out, report = tmp_path / "repro.json", tmp_path / "report.md"
    graphs = seed_serve().removesuffix(" --enforce-eager")
    assert main(["repro-oom", "--serve", graphs, "--gpu", "H100 SXM 80GB", "--weights-per-rank",
                 "40GiB", "--predict", "--paths", "alloc", "--log", str(log),
                 "--output", str(out)]) == 0
    ledger = ReproFile.parse(json.loads(out.read_text())).log
    assert "CUDA-graph estimate" in {row.component for row in ledger.paths[0].rows}
    gids = {p.get_gid() for p in plots.ledger_figure(ledger).axes[0].patches}
    assert not any(gid.endswith("CUDA-graph estimate") for gid in gids)
    assert main(["report", str(out), "--output", str(report)]) == 0
    assert len(list(tmp_path.glob("*ledger*.png"))) == 1


def test_vllm_0_27_split_sits_beside_the_sums_of_mlamems_components(tmp_path, capsys, seed_ledger):
    """vLLM 0.27+ prints the weights with the non-torch memory, and the profile's peak with the
    graph estimate, each as one figure: each row sits beside the sum of mlamem's two; a log
    without them has neither row."""
    graphs = seed_serve().removesuffix(" --enforce-eager")
    result = _fixture_ledger(tmp_path, capsys, graphs, "H100 SXM 80GB",
                             "vllm-split-consumed-wrapped.log", "--weights-per-rank", "40GiB")
    rows = {r["component"]: r for r in result["log"]["paths"][0]["rows"]}
    consumed = rows["weights + non-torch"]
    assert consumed["log_bytes"] == round(106.85 * GiB)
    assert consumed["mlamem_bytes"] == rows["weights"]["mlamem_bytes"] + rows["non-torch"]["mlamem_bytes"]
    peak = rows["activation peak + CUDA-graph estimate"]
    assert peak["mlamem_bytes"] == (rows["activation peak"]["mlamem_bytes"]
                                    + rows["CUDA-graph estimate"]["mlamem_bytes"])
    assert peak["difference_bytes"] == round(11.09 * GiB) - peak["mlamem_bytes"]
    seed_rows = {r["component"] for r in seed_ledger["paths"][0]["rows"]}
    assert not seed_rows & {"weights + non-torch", "activation peak + CUDA-graph estimate"}


def _fixture_ledger(tmp_path, capsys, command: str, gpu: str, log_name: str, *extra: str) -> dict:
    """repro-oom's JSON (alloc path, predicted) for `command` with the fixture log `log_name`."""
    log = tmp_path / "server.log"
    log.write_text((ROOT / "tests" / "fixtures" / "logs" / log_name).read_text())
    assert main(["repro-oom", "--serve", command, "--gpu", gpu, "--predict", "--paths", "alloc",
                 "--log", str(log), "--format", "json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_without_an_oom_sglangs_memory_before_the_weights_is_held_beside_the_rank(tmp_path, capsys):
    """SGLang's "Load weight begin. avail mem=137.34 GB" at TP8 on an H200: what the device used
    then beyond mlamem's one-process rank (its context) is held beside the rank for the whole
    run, a row of its own from that line, and the verdict and the largest safe values follow."""
    command = ("python3 -m sglang.launch_server --model-path zai-org/GLM-5.2-FP8 --tp-size 8 "
               "--kv-cache-dtype fp8_e4m3 --mem-fraction-static 0.85 --context-length 524288")
    result = _fixture_ledger(tmp_path, capsys, command, "H200 SXM 141GB",
                             "sglang-0.5-load-weight-begin.log", "--engine-version", "0.5.13")
    ledger = result["log"]
    path = ledger["paths"][0]
    total = 143155 * 2**20  # the H200's total as CUDA gives it (mlamem/spec/gpus.py)
    setup = result["non_torch"]  # mlamem's rank before its model: its context, the host's own
    context = setup["context_bytes"] + setup["process_bytes"]
    assert path["held_bytes"] == total - round(137.34 * GiB) - context > GiB
    held = path["rows"][-1]
    assert (held["component"], held["source"]) == (NOT_MODELLED, "startup line 1")
    assert path["verdict_with_log"] == "fits" and path["max_safe_tokens"] > 0
    assert ledger["held_path"] is None  # the same on every path: no path derived it
    docs = " ".join((ROOT / "docs" / "repro-oom.md").read_text().split())
    assert f"is {path['held_bytes'] / GiB:.2f} GiB beyond mlamem's rank" in docs


def test_without_an_oom_vllms_free_memory_at_startup_is_held_beside_the_rank(tmp_path, capsys):
    """vLLM's split line gives the device's free memory at its init snapshot: the rest of its
    total beyond mlamem's rank's context is held beside the rank (a B300's log, read at the
    seed's command: the figure is what the device used, whatever its size)."""
    result = _fixture_ledger(tmp_path, capsys, seed_serve(), "H100 SXM 80GB",
                             "vllm-split-weight.log", "--weights-per-rank", "40GiB")
    path = result["log"]["paths"][0]
    used = round(267.69 * GiB) - round(264.19 * GiB)
    assert 0 < path["held_bytes"] < used and used - path["held_bytes"] < GiB
    assert path["rows"][-1]["source"] == "startup line 1"
    assert path["max_safe_tokens"] is not None


def test_a_rank_that_held_no_more_than_mlamems_at_startup_adds_no_row(tmp_path, capsys):
    """A startup reading with less used than mlamem's rank holds then: nothing held, no row."""
    log = tmp_path / "server.log"
    log.write_text("(Worker_TP0 pid=1) INFO [gpu_worker.py:841] Free memory on device "
                   "(79.10/79.19 GiB) on startup. Desired GPU memory utilization is (0.9, 71.27 GiB).\n")
    assert main([*seed_args(log), "--format", "json"]) == 0
    path = json.loads(capsys.readouterr().out)["log"]["paths"][0]
    assert path["held_bytes"] is None
    assert NOT_MODELLED not in {row["component"] for row in path["rows"]}


def test_a_vllm_tp8_rank_held_its_communicators_at_startup(tmp_path, capsys):
    """vLLM 0.28 at TP8 on 8 x H200 used 2.16 GiB at its init snapshot (after its NCCL setup):
    the part beyond mlamem's one-process rank is held beside the rank, the figure the docs
    quote."""
    result = _fixture_ledger(tmp_path, capsys, "vllm serve zai-org/GLM-5-FP8 -tp 8 --kv-cache-dtype fp8",
                             "H200 SXM 141GB", "vllm-0.28-tp8-h200-startup.log")
    path, setup = result["log"]["paths"][0], result["non_torch"]
    context = setup["context_bytes"] + setup["process_bytes"]
    assert path["held_bytes"] == round(139.8 * GiB) - round(137.64 * GiB) - context
    docs = " ".join((ROOT / "docs" / "repro-oom.md").read_text().split())
    assert f"is {path['held_bytes'] / GiB:.2f} GiB beyond it" in docs


def _stand_in_result(tmp_path, capsys, command: str, gpu: str, *extra: str) -> dict:
    output = tmp_path / "stand-in.json"
    assert main(["repro-oom", "--predict", "--serve", command, "--gpu", gpu, "--paths", "alloc",
                 "--format", "json", "--output", str(output), *extra]) == 0
    capsys.readouterr()
    return json.loads(output.read_text())


def test_without_a_log_a_tp_rank_holds_a_public_ranks_startup_memory(tmp_path, capsys):
    """No --log at TP8: vLLM 0.28's public TP8 line (137.64 of 139.8 GiB free at its init
    snapshot) stands in, its use beyond mlamem's one-process rank held beside the rank, the one
    row of the ledger, and the verdict and largest safe values follow with it."""
    result = _stand_in_result(tmp_path, capsys, "vllm serve zai-org/GLM-5-FP8 -tp 8 "
                              "--kv-cache-dtype fp8", "H100 SXM 80GB", "--weights-per-rank", "40GiB")
    ledger, setup = result["log"], result["non_torch"]
    assert "vllm 0.28.1rc1.dev580+g385dce36b at TP8" in ledger["stand_in"]
    assert "shawnawshk/model-viz" in ledger["stand_in"]
    [path] = ledger["paths"]
    context = setup["context_bytes"] + setup["process_bytes"]
    assert path["held_bytes"] == round(139.8 * GiB) - round(137.64 * GiB) - context
    assert [row["source"] for row in path["rows"]] == ["a public TP8 rank's startup line"]
    [case] = result["cases"]
    assert path["max_safe_tokens"] < case["max_safe_tokens"]  # the held memory costs tokens


def test_the_user_log_and_a_single_rank_take_no_stand_in(tmp_path, capsys):
    """A rank of TP1 sets up no communicator: no ledger; a user's own log is read instead of any
    public one (its lines, its source)."""
    single = _stand_in_result(tmp_path, capsys, "vllm serve zai-org/GLM-5-FP8 --kv-cache-dtype fp8",
                              "H200 SXM 141GB", "--weights-per-rank", "40GiB")
    assert single.get("log") is None
    own = _stand_in_result(tmp_path, capsys, "vllm serve zai-org/GLM-5-FP8 -tp 8 --kv-cache-dtype fp8",
                           "H200 SXM 141GB", "--weights-per-rank", "40GiB", "--log",
                           str(ROOT / "tests" / "fixtures" / "logs" / "vllm-free-on-startup.log"))
    assert own["log"]["stand_in"] is None and own["log"]["source"].endswith("vllm-free-on-startup.log")


def test_the_table_names_the_stand_in_and_the_verdict_with_it(capsys):
    """The table's ledger says no log was given, which public line stands in, and the verdict
    and largest safe step tokens with the memory it holds."""
    assert main(["repro-oom", "--predict", "--serve", "vllm serve zai-org/GLM-5-FP8 -tp 8 "
                 "--kv-cache-dtype fp8", "--gpu", "H100 SXM 80GB", "--paths", "alloc",
                 "--weights-per-rank", "40GiB"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "no server log (--log): a public startup log stands in, vllm 0.28.1rc1" in out
    assert "beyond mlamem's model at startup (a public TP8 rank's startup line); with it, the " \
           "verdict is" in out
    assert "largest safe step tokens for this rank:" in out


@pytest.mark.parametrize(("engine", "ranks", "address", "why"), [
    ("vllm", 8, "shawnawshk/model-viz", "the same TP size"),
    ("vllm", 2, "vllm/pull/48601", "the fewest ranks recorded above TP2"),
    ("sglang", 8, "sglang/pull/11716", "the same TP size"),
    ("sglang", 4, "sglang/pull/11716", "the fewest ranks recorded above TP4"),
    ("sglang", 2, "sglang/pull/11716", "the fewest ranks recorded above TP2"),
    ("vllm", 16, "shawnawshk/model-viz", "a lower bound"),
])
def test_the_stand_in_is_the_nearest_layouts_record(engine, ranks, address, why):
    """Of the records of at least the rank's TP size, the engine's own where it has one, the
    fewest ranks of them; past every record, the engine's largest, named a lower bound."""
    from mlamem.spec.engines.rank_startup import stand_in

    record, reason = stand_in(engine, ranks)
    assert address in record.address and why in reason
    assert stand_in(engine, 1) is None


def test_each_record_is_a_startup_line_the_log_reader_reads():
    """Every shipped record's line gives its engine's startup reading, and a free figure under
    the record's GPU's total: 2.16 GiB used at TP8 on the H200 (vLLM 0.28), 1.54 at TP4 on the
    H100, 2.46 at SGLang's TP8 on the H200."""
    from mlamem.commands.log_ledger import STARTUP_FREE
    from mlamem.spec.engines.rank_startup import records

    used = {}
    for record in records():
        log = record.log()
        assert log.engine == record.engine
        free = log.first(STARTUP_FREE[record.engine])
        total = log.first("total_gpu_memory")
        total = total.value if total is not None else record.total_bytes
        used[(record.engine, record.tensor_parallel)] = round((total - free.value) / GiB, 2)
    assert used == {("vllm", 8): 2.16, ("vllm", 4): 1.54, ("sglang", 8): 2.46}


def test_the_readme_quotes_the_stand_in_figures_of_its_first_command(capsys):
    """The README's first repro-oom command, run as shown: the public TP8 rank's held memory and
    each path's largest safe step with it are the figures the README quotes."""
    readme = (ROOT / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("$ mlamem repro-oom --serve")
                and "--log" not in line)
    assert main([*shlex.split(line)[2:], "--format", "json"]) == 0
    ledger = json.loads(capsys.readouterr().out)["log"]
    alloc, workspace = ledger["paths"]
    text = " ".join(readme.split())
    assert f"public TP8 rank's startup line ({alloc['held_bytes'] / GiB:.3f} GiB)" in text
    assert (f"the largest safe steps are {alloc['max_safe_tokens']} and "
            f"{workspace['max_safe_tokens']} tokens") in text


def test_sglangs_pool_shrinks_by_its_fraction_of_the_memory_held_before_it_reads(tmp_path, capsys):
    """SGLang sizes its pool as free after the weights less free before them x (1 - fraction),
    both read on the device (cudaMemGetInfo): memory another rank holds before either reading
    takes fraction x that memory from the pool, in whole pages, and the ledger's KV cache shows
    it (GLM-5.2 at SGLang 0.5.23: 78 x 656 B of latent and 21 x 132 B of indexer keys, the
    layers IndexCache keeps an indexer on)."""
    result = _stand_in_result(tmp_path, capsys, "python3 -m sglang.launch_server --model-path "
                              "zai-org/GLM-5.2-FP8 --tp-size 8 --kv-cache-dtype fp8_e4m3 "
                              "--mem-fraction-static 0.85", "H200 SXM 141GB")
    [case], [path] = result["cases"], result["log"]["paths"]
    cell, page = case["kv_cell_bytes"], 64
    assert cell == 78 * 656 + 21 * 132
    taken = (case["kv_cache_tokens"] - path["kv_cache_tokens_with_log"]) * cell
    assert abs(taken - 0.85 * path["held_bytes"]) <= page * cell
    assert path["held_bytes"] > 1.9 * GiB  # SGLang's public TP8 line: 2.46 GiB used at startup


def test_plan_of_a_tp_rank_carries_the_stand_in_ledger(tmp_path, capsys):
    """`plan` without --log: a DSA model's TP rank gets the same stand-in ledger repro-oom
    gives (SGLang's public TP8 line at TP8), the KV cache with its memory held among it; a
    single rank gets none."""
    command = ("python3 -m sglang.launch_server --model-path zai-org/GLM-5.2-FP8 --tp-size {} "
               "--kv-cache-dtype fp8_e4m3 --mem-fraction-static 0.85")
    assert main(["plan", "--serve", command.format(8), "--gpu", "H200 SXM 141GB",
                 "--format", "json"]) == 0
    ledger = json.loads(capsys.readouterr().out)["log"]
    assert "SGLang PR 11716" in ledger["stand_in"] and "sglang/pull/11716" in ledger["stand_in_address"]
    assert all(path["kv_cache_tokens_with_log"] for path in ledger["paths"])
    repro = _stand_in_result(tmp_path, capsys, command.format(8), "H200 SXM 141GB")
    assert ledger["paths"][0]["held_bytes"] == repro["log"]["paths"][0]["held_bytes"]
    assert main(["plan", "--serve", command.format(1), "--gpu", "H200 SXM 141GB",
                 "--weights-per-rank", "40GiB", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out).get("log") is None
