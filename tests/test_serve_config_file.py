"""A pasted serve command's structured input read under a bound, whatever it holds: a `--config
FILE` (serve_command/config_file.py) and the JSON values of vLLM's flags."""

import pytest

from mlamem.testing import check_bad_input

DS = "deepseek-ai/DeepSeek-V3.2"
COMMANDS = {"vllm": "vllm serve {model} --config {path}",
            "sglang": "python -m sglang.launch_server --model-path {model} --config {path}",
            "trtllm": "trtllm-serve {model} --max_seq_len 4096 --config {path}"}


def alias_bomb(levels: int, width: int) -> str:
    """A few hundred bytes whose aliases expand to width**levels scalars."""
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("engine", sorted(COMMANDS))
def test_an_alias_bomb_is_one_line(engine, tmp_path):
    """8**6 (262k) scalars from 300 bytes: refused before anything is built from them."""
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(5, 8))
    assert path.stat().st_size < 400
    command = COMMANDS[engine].format(model=DS, path=path)
    check_bad_input(["scenarios", "--serve", command], "values, aliases expanded")


def test_a_self_referencing_alias_is_one_line(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("a: &a [1, *a]\n")
    check_bad_input(["scenarios", "--serve", f"vllm serve {DS} --config {path}"],
                    "values, aliases expanded")


@pytest.mark.parametrize("engine", sorted(COMMANDS))
def test_a_config_of_more_keys_than_any_engine_has_flags_is_one_line(engine, tmp_path):
    """20k keys would take argparse (whose option loop is quadratic) minutes: refused as read."""
    path = tmp_path / "many.yaml"
    path.write_text("".join(f"key-{i}: {i}\n" for i in range(20_000)))
    command = COMMANDS[engine].format(model=DS, path=path)
    check_bad_input(["scenarios", "--serve", command], "20000 keys")


def test_an_alias_that_expands_a_little_is_read(tmp_path):
    """Aliases are YAML: one shared table stays fine."""
    from mlamem.spec.serve_command import config_file

    path = tmp_path / "ok.yaml"
    path.write_text("base: &b {cudagraph_mode: NONE}\ncompilation-config: *b\n")
    assert config_file.load(path) == {"base": {"cudagraph_mode": "NONE"},
                                      "compilation-config": {"cudagraph_mode": "NONE"}}


@pytest.mark.parametrize("flag", ["--compilation-config", "--speculative-config.method"])
def test_json_in_a_flag_nested_deeper_than_the_parser_reaches_is_one_line(flag):
    """A JSON value of 100k nested lists: one line naming the flag, not a RecursionError."""
    deep = "[" * 100_000 + "]" * 100_000
    check_bad_input(["scenarios", "--serve", f"vllm serve {DS} {flag} '{deep}'"], "--")


def test_a_character_yaml_refuses_is_one_line(tmp_path):
    """A NUL byte (YAML's reader refuses it as it takes the stream): not YAML, one line."""
    path = tmp_path / "nul.yaml"
    path.write_bytes(b"\x00")
    check_bad_input(["scenarios", "--serve", f"vllm serve {DS} --config {path}"], "not YAML")
