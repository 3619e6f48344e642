"""Secrets stay out of every output: a pasted command's credentials, in every form the engines'
parsers take them, are hidden from results, scenarios, notes, reports and errors."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from mlamem.cli import main
from mlamem.cli.app import app
from mlamem.commands.shards import merge
from mlamem.spec import redaction
from mlamem.spec.engines import sglang, trtllm, vllm
from mlamem.spec.errors import UserError
from mlamem.spec.serve_command import from_command
from mlamem.testing import split_into_shards

DS = "deepseek-ai/DeepSeek-V3.2"
VLLM = f"vllm serve {DS} -tp 8 --max-model-len 4096 --kv-cache-dtype fp8 --max-num-batched-tokens 8192"
SGLANG = f"python -m sglang.launch_server --model-path {DS} --tp 8 --kv-cache-dtype fp8_e4m3"
GPU = "H200 SXM 141GB"
SECRET = re.compile(r"SECRET\w*")  # every secret below has this in it
RESULTS = Path(__file__).parent / "fixtures" / "results"


def _leaks(*texts: str) -> list[str]:
    return [m for text in texts for m in SECRET.findall(text)]


def _main(monkeypatch, *args: str) -> int:
    """`mlamem ARGS`, as typed: the result records sys.argv."""
    monkeypatch.setattr(sys, "argv", ["mlamem", *args])
    return main(list(args))


def _error(command: str) -> str:
    with pytest.raises(UserError) as caught:
        from_command(command, gpu_name=GPU)
    return caught.value.message


def test_abbreviations_argparse_resolves_are_hidden():
    """vLLM's and SGLang's parsers take any unambiguous prefix of a flag: its value is hidden."""
    built = from_command(f"{VLLM} --hf-tok hf_abbrSECRET --api-k sk_oneSECRET sk_twoSECRET "
                         "--port 8000", gpu_name=GPU)
    description = built.scenario.description
    assert _leaks(description, *built.notes) == []
    assert "--hf-tok ... --api-k ... ... --port 8000" in description
    built = from_command(f"{SGLANG} --admin-api adminSECRET --ssl-keyfile-pass pwSECRET "
                         "--ssl-keyfile /etc/key.pem", gpu_name=GPU)
    assert _leaks(built.scenario.description, *built.notes) == []
    assert "--ssl-keyfile /etc/key.pem" in built.scenario.description  # a path, kept


def test_equals_and_underscore_forms_are_hidden():
    """`--flag=VALUE`, abbreviated or with vLLM's underscores, hides the value, keeps the flag."""
    built = from_command(f"{VLLM} --api-ke=sk_eqSECRET --hf_token=hf_underSECRET", gpu_name=GPU)
    assert _leaks(built.scenario.description) == []
    assert "--api-ke=... --hf_token=..." in built.scenario.description
    assert "--max-num-batched-tokens 8192" in built.scenario.description  # a count is no secret


def test_environment_prefixes_are_hidden_in_the_result_and_the_error(capsys, monkeypatch):
    """`HF_TOKEN=...` and `env NAME=...` before the command are hidden in the result's command;
    an `export NAME=...;` the parser cannot take is refused without its value."""
    serve = f"HF_TOKEN=hf_envSECRET env OPENAI_API_KEY=sk_envSECRET VLLM_LOGGING_LEVEL=INFO {VLLM}"
    assert _main(monkeypatch, "plan", "--serve", serve, "--format", "json") == 0
    out, err = capsys.readouterr()
    command = json.loads(out)["command"]
    assert _leaks(out, err) == []
    assert "HF_TOKEN=... env OPENAI_API_KEY=... VLLM_LOGGING_LEVEL=INFO vllm serve" in command
    message = _error(f"export HF_TOKEN=hf_exportSECRET; {VLLM}")
    assert _leaks(message) == [] and "HF_TOKEN=..." in message


@pytest.mark.parametrize(("command", "yaml"), [
    (SGLANG, "api-key: [sk_cfgSECRETone, sk_cfgSECRETtwo]\n"),
    (VLLM, "hf_token: [hf_cfgSECRETone, hf_cfgSECRETtwo]\n"),
    (VLLM, "max-model-len: 4096\nhf_tok: [hf_cfgSECRETone, hf_cfgSECRETtwo]\n"),  # abbreviated
])
def test_secrets_in_a_config_file_stay_out_of_errors(tmp_path, command, yaml):
    """A `--config` file's credentials, which the parser reads as flags, are hidden from its
    errors (a list under a one-value flag: 'unrecognized arguments: ...')."""
    config = tmp_path / "serve.yaml"
    config.write_text(yaml)
    message = _error(f"{command} --config {config}")
    assert "unrecognized arguments" in message and _leaks(message) == []


@pytest.mark.parametrize("command", [
    f"{SGLANG} --hf-token hf_echoSECRET",  # SGLang has no --hf-token: unrecognized, quoted
    f"{VLLM} --api=sk_ambiguousSECRET",  # ambiguous: --api-key or --api-server-count
    f"{VLLM} --auth-token tokenSECRET",  # no such flag, but its name says secret
])
def test_errors_do_not_echo_secret_values(command, capsys):
    """An argparse error quotes the words it could not read: their secrets are hidden, in the
    library's error and on mlamem's stderr."""
    assert _leaks(_error(command)) == []
    assert main(["scenarios", "--serve", command]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("mlamem: error:") and _leaks(out, err) == []


def test_the_result_command_and_plans_output_hide_the_serve_commands_secrets(capsys, monkeypatch):
    """mlamem's own argv, `--serve "..."` in it, is recorded and printed with secrets hidden."""
    serve = f"{VLLM} --hf-token hf_planSECRET --api-key=sk_planSECRET"
    assert _main(monkeypatch, "plan", "--serve", serve) == 0
    out, err = capsys.readouterr()
    assert "Command: mlamem plan --serve" in out and _leaks(out, err) == []
    assert _main(monkeypatch, "plan", f"--serve={serve}", "--format", "json") == 0
    out, err = capsys.readouterr()
    assert _leaks(out, err) == []
    assert json.loads(out)["command"].startswith("mlamem plan '--serve=vllm serve")


def test_scenarios_serve_writes_a_toml_without_secrets(capsys):
    """`scenarios --serve` prints a scenario file (and notes) that hold no secret, and its
    loader reads it back."""
    serve = (f"HF_TOKEN=hf_tomlSECRET {VLLM} --hf-tok hf_tomlSECRET --api-ke=sk_tomlSECRET "
             "--api-key sk_tomlSECRETa sk_tomlSECRETb")
    assert main(["scenarios", "--serve", serve]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("name = ") and _leaks(out, err) == []


def test_a_report_of_an_older_result_hides_its_recorded_secret(tmp_path, capsys):
    """A result file written before redaction, its secret in `command`, renders without it."""
    data = json.loads((RESULTS / "profile-glm5-h200.json").read_text())
    data["command"] = ("mlamem profile --serve 'HF_TOKEN=hf_oldSECRET vllm serve m --hf-tok "
                       "hf_oldSECRET' --api-key sk_oldSECRET")
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    assert main(["report", str(old)]) == 0
    out, err = capsys.readouterr()
    assert "mlamem profile --serve" in out and _leaks(out, err) == []


def test_click_errors_quoting_mlamem_arguments_hide_secrets(capsys):
    """A word click cannot place is quoted in its error: a secret among them is hidden."""
    assert main(["scenarios", "--serve", f"vllm serve {DS}", "HF_TOKEN=hf_strayENVSECRET"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("mlamem: error: Got unexpected extra") and "HF_TOKEN=..." in err
    assert _leaks(out, err) == []


def _table_names(engine: str) -> dict[str, bool]:
    """The engine's option names (aliases too) -> whether it takes a value."""
    if engine == "trtllm":
        return {name: kind is not None for names, kind in trtllm.OPTIONS.items() for name in names}
    table = {"vllm": vllm.flag_table, "sglang": sglang.flag_table}[engine]()
    return {name: entry["kind"] not in ("bool", "flag") for flag, entry in table.items()
            for name in (flag, *entry["aliases"])}


_SAYS = re.compile(r"secret|password|passwd|credential")
# flags whose name ends in token but whose value is no credential (SGLang 0.5.23's help)
NO_CREDENTIAL = {("sglang", "--bucket-time-to-first-token"): "latency buckets, in seconds",
                 ("sglang", "--kt-max-deferred-experts-per-token"): "a count of experts"}


def _says_credential(name: str) -> bool:
    """Token or key as the name's last word (what the value is: --hf-token, --api-key; not
    --dbo-decode-token-threshold), or secret, password or credential anywhere in it."""
    last = re.split(r"[-_]+", name.lower())[-1]
    return last in ("token", "key", "apikey") or bool(_SAYS.search(name.lower()))


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_every_credential_flag_of_the_engines_tables_is_listed(engine):
    """Every flag of the engine's table (aliases too) that takes a value and whose name says
    token or key, or secret, password or credential, is in CREDENTIAL_FLAGS (or named above as
    no credential); every listed flag is in its engine's table."""
    names = _table_names(engine)
    listed = {flag for e, flag, _ in redaction.CREDENTIAL_FLAGS if e == engine}
    said = {name for name, takes in names.items() if takes and _says_credential(name)}
    assert said - {flag for e, flag in NO_CREDENTIAL if e == engine} == listed
    assert listed <= set(names) and all(names[flag] for flag in listed)
    assert engine != "trtllm" or not listed  # trtllm-serve reads HF_TOKEN, no flag


def test_no_option_of_mlamem_is_hidden():
    """mlamem's own options are neither credential flags nor prefixes of one: their values show."""
    group = typer.main.get_command(app)
    options = {opt for command in group.commands.values() for param in command.params
               for opt in getattr(param, "opts", []) if opt.startswith("--")}
    assert len(options) > 40 and [o for o in options if redaction.hides(o, None)] == []


@pytest.mark.parametrize(("command", "shown"), [
    ("vllm serve m --api-key a b c --port 1", "vllm serve m --api-key ... ... ... --port 1"),
    ("vllm serve --hf-token hf_x m", "vllm serve --hf-token ... m"),
    ("vllm serve m --hf-token", "vllm serve m --hf-token"),
    ("vllm serve m --tokenizer t --ssl-keyfile k --max-num-batched-tokens 8k "
     "-cc.pass_config.fuse=true", None),
    (f"{SGLANG} --ssl-keyfile k --speculative-token-map p --api-key a b", f"{SGLANG} --ssl-keyfile "
     "k --speculative-token-map p --api-key ... b"),
    ("trtllm-serve m --tokenizer t --hf_token x", "trtllm-serve m --tokenizer t --hf_token ..."),
    ("VLLM_USE_V1=1 HF_HUB_TOKEN='a b' vllm serve m", "VLLM_USE_V1=1 HF_HUB_TOKEN=... vllm serve m"),
    ("vllm serve m --hf-token 'unclosed", "vllm serve m --hf-token ..."),
])
def test_what_a_pasted_command_shows(command, shown):
    """Values are hidden as the engine's parser takes them (vLLM's --api-key takes several,
    SGLang's one); a path, a count or a tokenizer is no secret."""
    assert redaction.redacted_command(command) == (command if shown is None else shown)


def test_a_recorded_command_line_is_redacted_once_and_for_all():
    """Redacting a recorded line twice changes nothing; a line without secrets is kept as is."""
    line = "mlamem plan --serve 'HF_TOKEN=x vllm serve m --api-key a b' --gpu 'H100 SXM 80GB'"
    once = redaction.redacted_command_line(line)
    assert once == "mlamem plan --serve 'HF_TOKEN=... vllm serve m --api-key ... ...' --gpu 'H100 SXM 80GB'"
    assert redaction.redacted_command_line(once) == once
    plain = "mlamem profile  --tokens 1024"
    assert redaction.redacted_command_line(plain) == plain


def test_merging_older_shards_hides_their_recorded_secret():
    """`merge` writes the sweep's command from the shards' own (raw JSON): hidden there too."""
    whole = json.loads((RESULTS / "validate-h200.json").read_text())
    parts = split_into_shards({**whole, "command": "mlamem validate --format json HF_TOKEN="
                                                   "hf_shardSECRET"}, 2)
    merged = merge([(f"validate-{i}.json", part) for i, part in enumerate(parts)])
    assert merged["command"] == "mlamem validate --format json HF_TOKEN=..."


def test_the_redaction_loads_no_heavy_library():
    """Hiding a command's secrets (on every error line) imports no torch, pydantic or yaml."""
    code = ("import sys; from mlamem.spec import redaction; "
            "print(redaction.redacted_command('vllm serve m --hf-tok x'), "
            "redaction.argv_secrets(['plan', '--serve', 'vllm serve m --api-key k'])); "
            "print(sorted({'torch', 'pydantic', 'yaml', 'typer'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out == "vllm serve m --hf-tok ... ['k']\n[]\n"
