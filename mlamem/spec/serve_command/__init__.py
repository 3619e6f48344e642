"""A scenario from the command that started the server: `vllm serve MODEL ...` (vLLM 0.33.0's flags),
`trtllm-serve MODEL ...` (TensorRT-LLM's tensorrt_llm/commands/serve.py) or
`python -m sglang.launch_server ...` / `sglang serve ...` (SGLang 0.5.23's flags), with the model's
config.json and a GPU by name.

`from_command` splits the command as a shell does, sets `NAME=VALUE` prefixes aside (named in
the notes' `not modelled:` line), parses the flags with the engine's own names (each engine's
spec module: spec/engines/vllm.py, trtllm.py, sglang.py), and builds the scenario through
`scenario.from_dict`, so the scenario model validates it. What the command sets that mlamem
does not model is named in the notes, never dropped.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from mlamem.spec import gpus, redaction, scenario
from mlamem.spec.engines import sglang, trtllm, vllm
from mlamem.spec.errors import UserError
from mlamem.spec.models import hf_config
from mlamem.spec.models.overrides import (
    OVERRIDE_NOTE,
    config_name,
    counted_weights,
    indexers_on_every_layer,
    model_table,
    override_gib,
    scenario_from_config,
)
from mlamem.spec.models.weights import fit_line, weights_fit
from mlamem.spec.serve_command import config_file
from mlamem.spec.serve_command.parsed import Parsed

# a model argument that is a hub name of a shipped config (mlamem/spec/models): that config
HUB_NAMES = hf_config.HUB_NAMES
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Built:
    scenario: scenario.Scenario
    notes: tuple[str, ...]  # unmodelled flags, CUDA graphs, where figures come from
    cuda_graphs: bool  # the engine captures CUDA graphs (repro-oom --cuda-graphs on)


def split_command(command: str) -> list[str]:
    """The command's words, `NAME=VALUE` environment prefixes (and `env`) left out."""
    return _split(command)[1]


def _split(command: str) -> tuple[list[str], list[str]]:
    """The names of the command's `NAME=VALUE` environment prefixes, and its other words (`env`
    left out). A command pasted over several lines reads as the shell reads it:
    backslash-newline joins the lines."""
    try:
        words = shlex.split(re.sub(r"\\\r?\n", "", command))
    except ValueError as error:
        raise UserError(f"cannot split the command: {error}", field="serve") from None
    names = []
    while words and (_ENV.match(words[0]) or words[0] == "env"):
        if words[0] != "env":
            names.append(words[0].partition("=")[0])
        words = words[1:]
    return names, words


def secrets(command: str) -> list[str]:
    """The secret values a command holds (redaction.secret_values), those of its `--config`
    files too: kept out of every error its parsing raises."""
    values = redaction.secret_values(command)
    words = _split(command)[1]
    engine = redaction.engine_of(words)
    files = {"--config", "--extra_llm_api_options"}  # trtllm-serve's second name for it
    paths = [after for word, after in zip(words, words[1:], strict=False) if word in files]
    paths += [word.partition("=")[2] for word in words if word.partition("=")[0] in files]
    for path in paths:
        try:
            values += redaction.table_secrets(config_file.load(Path(path)), engine)
        except UserError:  # the engine's parser says what is wrong with the file
            continue
    return values


def with_flag(command: str, flag: str, value: object) -> str:
    """The command with `flag` (e.g. `--max-num-batched-tokens`, given with dashes or
    underscores, as `FLAG V` or `FLAG=V`) set to `value`: changed where given, else added at
    the end; one line, its secrets left out (`redaction.redacted_command`), ready to paste."""
    try:
        words = shlex.split(re.sub(r"\\\r?\n", "", command))
    except ValueError as error:
        raise UserError(f"cannot split the command: {error}", field="serve") from None
    spellings = {flag, "--" + flag[2:].replace("-", "_")}
    for i, word in enumerate(words):
        name, eq, _ = word.partition("=")
        if eq and name in spellings:
            words[i] = f"{name}={value}"
            return redaction.redacted_command(shlex.join(words))
        if word in spellings and i + 1 < len(words):
            words[i + 1] = str(value)
            return redaction.redacted_command(shlex.join(words))
    return redaction.redacted_command(shlex.join([*words, flag, str(value)]))


def parse_command(command: str, engine_version: str | None = None) -> Parsed:
    """The command parsed by its engine's flags, by the rules of `engine_version` (None: the
    engine's default, vLLM 0.33.0 or SGLang 0.5.23); its environment prefixes, which mlamem does
    not model (vLLM 0.33.0 no longer reads VLLM_ATTENTION_BACKEND), joined to `not modelled:`."""
    env, words = _split(command)
    with redaction.errors_without(secrets(command)):
        parsed = _parse_words(words, engine_version)
    if env:
        named = ", ".join(f"{name} (environment)" for name in env)
        lines = [i for i, note in enumerate(parsed.notes) if note.startswith("not modelled: ")]
        if lines:
            parsed.notes[lines[0]] += ", " + named
        else:
            parsed.notes.insert(0, "not modelled: " + named)
    return parsed


def _parse_words(words: list[str], engine_version: str | None = None) -> Parsed:
    program = Path(words[0]).name if words else ""
    if program == "vllm" and words[1:2] == ["serve"]:
        return vllm.parse(words[2:], engine_version)
    if re.fullmatch(r"python(3(\.\d+)?)?", program) and words[1:3] == ["-m", "sglang.launch_server"]:
        return sglang.parse(words[3:], sglang.PROGS[0], engine_version)
    if program == "sglang" and words[1:2] == ["serve"]:
        return sglang.parse(words[2:], sglang.PROGS[1], engine_version)
    if engine_version is not None:
        raise UserError(f"{engine_version}: mlamem reads versions of vLLM and SGLang only; for "
                        "TensorRT-LLM it follows the rules as shipped: leave the version out",
                        field="engine_version")
    if program == "trtllm-serve":
        return trtllm.parse(words[2:] if words[1:2] == ["serve"] else words[1:])
    raise UserError(f"expected `vllm serve MODEL ...`, `trtllm-serve MODEL ...`, `python -m "
                    f"sglang.launch_server ...` or `sglang serve MODEL ...`, got "
                    f"{' '.join(words[:3])!r}", field="serve")


def _is_local_config(path: Path) -> bool:
    """Whether `path` is a file here; a name too long for a file system is none."""
    try:
        return path.is_file()
    except OSError:
        return False


def model_config(argument: str, override: str | None,
                 notes: list[str]) -> tuple[hf_config.ModelConfig, str]:
    """The model's config and its display name: `override` (a config.json or its folder), the
    command's model as a local folder, or a shipped model's exact hub name (a note names it)."""
    if override is not None:
        return hf_config.load_config(override), config_name(override)
    if _is_local_config(Path(argument) / "config.json"):
        return hf_config.load_config(argument), config_name(argument)
    hub = {name.lower(): name for name in HUB_NAMES}.get(argument.rstrip("/").lower())
    local = hub is None and _hub_name_of_folder(argument)
    hub = hub or local
    if hub:  # a shipped model's exact hub name, in any case, or a folder of that name
        shipped = HUB_NAMES[hub]
        how = (f"no config.json there, so read by the folder's name as {hub}'s shipped config"
               if local else "the shipped config")
        bf16 = " without its quantization_config (bf16 weights)" if hub in hf_config.BF16_HUB_NAMES else ""
        notes.append(f"model {argument}: {how} mlamem/spec/models/{hf_config.SHIPPED[shipped]}{bf16}"
                     + (" (--model FOLDER reads the checkpoint's own)" if local else f" ({hub})"))
        return hf_config.hub_config(hub), hub.split("/")[-1]
    raise UserError(f"the model {argument!r} is no local folder with a config.json and no shipped "
                    f"model ({', '.join(HUB_NAMES)}): give the model's config.json", field="model")


def _hub_name_of_folder(argument: str) -> str | None:
    """The hub name a local path names by its last folder (`/models/GLM-5.1-FP8`, any case) or by a
    Hugging Face cache folder in it (`models--zai-org--GLM-5.1-FP8/snapshots/...`), if shipped. A
    path is what no hub id is: absolute, from ~ or ., or of three parts or more; `org/name` is
    another organisation's checkpoint and a bare name no path, so neither is read by name."""
    parts = Path(argument).parts
    cached = [part[len("models--"):].replace("--", "/", 1) for part in parts if part.startswith("models--")]
    if cached:
        return {name.lower(): name for name in HUB_NAMES}.get(cached[-1].lower())
    if not (argument.startswith(("/", "~", ".")) or len(parts) > 2):
        return None
    return {name.split("/")[-1].lower(): name for name in HUB_NAMES}.get(parts[-1].lower())


def weights(config: hf_config.ModelConfig, name: str, parsed: Parsed, override_bytes: int | None,
            target: gpus.GPU) -> tuple[float, str]:
    """One rank's weights in GiB and their note: the override, else counted from the config;
    either is refused in one line where it exceeds the GPU."""
    layout = {"tp": parsed.tensor_parallel, "dp": parsed.attention_data_parallel,
              "mtp": parsed.engine_settings.get("loads_mtp", False),
              "shared_head": parsed.engine_settings.get("mtp_shared_head", False),
              "engine": parsed.engines[0],
              "every_indexer": indexers_on_every_layer(
                  parsed.engines[0], parsed.sections.get(parsed.engines[0], {}).get("engine_version"))}
    gpu = {"gpu": target.name, "gpu_bytes": target.memory_mib * 1024**2}
    if override_bytes is not None:
        gib = override_gib(override_bytes)
        line = fit_line(name, override_bytes, tp=layout["tp"], dp=layout["dp"], **gpu)
        if line:
            raise UserError(f"{line}: give the weights one rank holds, or a larger GPU",
                            field="weights_per_rank")
        return gib, OVERRIDE_NOTE
    line = weights_fit(name, config, **gpu, **layout)
    if line:
        raise UserError(f"{line}: serve on more ranks, or give the weights per rank",
                        field="weights_per_rank")
    gib, note = counted_weights(config, **layout)
    return round(gib, 3), note  # the printed TOML's figure


def _left_out(built: scenario.Scenario, engines: list[str]) -> list[str]:
    """What vLLM's rank leaves out of the MoE layer (vllm_moe.moe_note), where it leaves out
    anything: a "fits" the reader weighs against it."""
    from mlamem.spec.engines import vllm_moe  # it imports spec.engines.vllm: a cycle

    note = vllm_moe.moe_note(built) if engines == ["vllm"] else None
    return [note] if note else []


def _fill_defaults(parsed: Parsed, config: hf_config.ModelConfig, target: gpus.GPU) -> None:
    """What the command leaves to the engine and the engine decides by the GPU or the model."""
    if parsed.engines == ["sglang"]:
        if not config.has_indexer:
            raise UserError("the model has no DSA indexer (dense MLA): SGLang runs flashmla_kv, "
                            "the decode mlamem drives, only for a DSA model", field="model")
        sglang.fill_defaults(parsed, config, target.name, target.smi_mib)
        return
    rules = vllm.version_rules(parsed.sections.get("vllm", {}).get("engine_version"))
    tokens, seqs = vllm.batch_defaults(target.memory_mib, target.name, rules)
    if parsed.serving["max_num_batched_tokens"] is None:  # vLLM's, by the GPU's memory
        parsed.serving["max_num_batched_tokens"] = tokens
        parsed.notes.append(f"max_num_batched_tokens {tokens}: vLLM {rules.version}'s default on "
                            f"the {target.name}")
        if "max_num_seqs" not in parsed.sections.get("vllm", {}) and seqs != 1024:
            parsed.sections.setdefault("vllm", {})["max_num_seqs"] = seqs
    if config.has_indexer:
        return
    if "trtllm-context-reuse" in parsed.engines:
        parsed.serving["synthetic_topk"] = 2048
        parsed.notes.append("synthetic_topk 2048: drives vLLM's sparse decode beside TensorRT-LLM "
                            "on this dense model, as kimi-k2-context-reuse does")
        return
    _dense_decode_batch(parsed, seqs, target, rules.version)


def _dense_decode_batch(parsed: Parsed, default_seqs: int, target: gpus.GPU, version: str) -> None:
    """vLLM's dense decode step: --max-num-seqs requests (vLLM's default by the GPU), each at
    the longest context vLLM admits."""
    given = parsed.engine_settings["max_num_seqs"]  # --max-num-seqs
    parsed.serving["max_batch_size"] = default_seqs if given is None else given
    if given is None:
        parsed.notes.append(f"max_batch_size {default_seqs}: vLLM {version}'s max_num_seqs "
                            f"default on the {target.name} (EngineArgs.get_batch_defaults)")
    parsed.serving["decode_context_len"] = parsed.serving["max_model_len"]
    parsed.notes.append(f"decode_context_len {parsed.serving['max_model_len']}: --max-model-len, "
                        "the longest context vLLM admits per request (the synthetic batch's worst "
                        "case; profile --context-len takes a shorter one)")

def from_command(command: str, *, gpu_name: str, model: str | None = None,
                 weights_bytes: int | None = None, engine_version: str | None = None) -> Built:
    """The scenario a serve command, its model's config and a GPU make, by the rules of
    `engine_version` (None: vLLM 0.33.0, SGLang 0.5.23)."""
    target = gpus.gpu(gpu_name)
    parsed = parse_command(command, engine_version)
    config, name = model_config(parsed.model, model, parsed.notes)
    fill_max_len = {"vllm": vllm.fill_max_model_len,  # the engine's default from the config
                    "sglang": sglang.fill_max_model_len}.get(parsed.engines[0])
    if fill_max_len is not None:
        fill_max_len(parsed, config)
    if parsed.engines == ["vllm"]:
        vllm.for_model(parsed, dense=not config.has_indexer,
                       index_head_dim=config.index_head_dim or None, gpu_name=target.name)
    gib, note = weights(config, name, parsed, weights_bytes, target)
    _fill_defaults(parsed, config, target)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    words = split_command(command)
    shown = shlex.join(redaction.redacted_words(words, redaction.engine_of(words))[0])
    data = {"name": f"{slug}-tp{parsed.tensor_parallel}",
            "description": f"From `{shown}` on {target.name}",
            "operations": parsed.operations, "engines": parsed.engines,
            "model": model_table(config, name),
            "parallel": {"tensor_parallel": parsed.tensor_parallel,
                         "attention_data_parallel": parsed.attention_data_parallel,
                         "expert_parallel": parsed.expert_parallel,
                         "weights_gib_per_rank": gib, "weights_note": note},
            "serving": parsed.serving,
            "gpu": {"name": target.name, "memory_mib": target.memory_mib,
                    "gpu_memory_utilization": parsed.memory_fraction,
                    "sm_count": target.sm_count},
            **parsed.sections}
    try:
        built = scenario_from_config(data, f"{parsed.prog} command")
    except UserError as error:  # the scenario's rule, told by the engine's flag that broke it
        field = re.search(r"\]\.(\w+)", error.message)
        flag = parsed.flags.get(field.group(1)) if field else None
        own = re.match(rf"{re.escape(parsed.prog)} command: \[\w+\]\.\w+ ", error.message)
        problem = (error.message[own.end():].removesuffix("; fix that field") if own  # no TOML field
                   else error.message)
        raise UserError(f"{parsed.prog} {flag}: {problem}" if flag else error.message,
                        field="serve") from None
    _check_topk(built, parsed)
    notes = [*parsed.notes, *_left_out(built, parsed.engines), f"weights: {note}",
             f"gpu: {target.memory_note()}"]
    return Built(built, tuple(notes), parsed.cuda_graphs)


def _check_topk(built: scenario.Scenario, parsed: Parsed) -> None:
    """The rule every command holds a scenario to before it runs (scenario.check_decode), told
    now by the command's flag: a sequence at least as long as the top-k each query attends."""
    topk, longest = built.decode_topk, built.serving.max_model_len
    if topk is not None and topk > longest:
        flag = parsed.flags["max_model_len"]
        whose = ("the model's index_topk" if built.model.index_topk else
                 "the synthetic_topk of the sparse decode driven beside it")
        raise UserError(f"{parsed.prog} {flag} {longest}: {whose} {topk} is the tokens each "
                        "query attends, more than a sequence then holds; give "
                        f"{flag} {topk} or more", field="serve")
