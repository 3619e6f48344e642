"""Secrets kept out of every output: a command's credentials, read as the engine's parser reads
them, replaced by `...` before the command reaches a result, a scenario, a note or an error.

A pasted serve command (`redacted_command`) hides the values of:
- the engines' credential flags (CREDENTIAL_FLAGS), in every form their parsers take: `--hf-token
  X`, `--hf-token=X`, `--hf_token X` (vLLM's FlexibleArgumentParser reads `_` as `-`) and any
  abbreviation argparse resolves, or finds ambiguous, among them (`--hf-tok X`, `--api-ke=X`):
  a word that is a prefix of a credential flag and no other option of the engine's flag table;
- any other flag the engine does not know whose name says it holds a secret (`--auth-token X`);
- `NAME=VALUE` words whose name says so, anywhere (`HF_TOKEN=x vllm serve`, `env HF_TOKEN=x`,
  `export HF_TOKEN=x;`, `-e HF_TOKEN=x`).
mlamem's own command line (`redacted_argv`, `redacted_command_line`) hides the same, with
`--serve`'s command redacted as a pasted one. `scrubbed` takes the hidden values out of a
message (an argparse error quotes the words it could not read). Light: no engine module, no
torch or pydantic; the flag tables are read on first use.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from importlib import resources
from pathlib import Path

from mlamem.spec.errors import UserError

HIDDEN = "..."

# Every flag whose value is a credential: (engine, flag, where the engine declares it).
# trtllm-serve (tensorrt_llm/commands/serve.py at 00209af1, spec/engines/trtllm.py OPTIONS) has
# none: it reads the Hub token from the environment (HF_TOKEN), hidden by the NAME=VALUE rule.
CREDENTIAL_FLAGS = (
    ("vllm", "--hf-token", "vLLM 0.33.0 config/model.py ModelConfig.hf_token (the Hub token), "
                           "engine/arg_utils.py EngineArgs.add_cli_args"),
    ("vllm", "--api-key", "vLLM 0.33.0 entrypoints/common/cli_args.py FrontendArgs.api_key "
                          "(list[str]: one or more keys)"),
    ("sglang", "--api-key", "SGLang 0.5.23 srt/arg_groups/fields/serving.py Serving.api_key"),
    ("sglang", "--admin-api-key", "SGLang 0.5.23 srt/arg_groups/fields/serving.py "
                                  "Serving.admin_api_key"),
    ("sglang", "--ssl-keyfile-password", "SGLang 0.5.23 srt/arg_groups/fields/serving.py "
                                         "Serving.ssl_keyfile_password"),
)
# each engine's flag table (spec/engines/), and the programs that start it
FLAG_TABLES = {"vllm": "vllm-0.33.0-flags.json", "sglang": "sglang-0.5.23-flags.json"}
CREDENTIALS = frozenset(flag for _, flag, _ in CREDENTIAL_FLAGS)
# what a name says of its value: a secret where its last part is one of SECRET_NOUNS (HF_TOKEN,
# --auth-token, OPENAI_API_KEY; not --dbo-decode-token-threshold) or any part one of SECRET_WORDS
SECRET_NOUNS = frozenset(("token", "key", "apikey", "auth"))
SECRET_WORDS = frozenset(("secret", "password", "passwd", "credential", "credentials"))
_ENV_WORD = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)
MIN_SCRUBBED = 4  # shorter values are not taken out of messages: they would garble the words


def says_secret(name: str) -> bool:
    """Whether a flag's or variable's name says it holds a secret (`--hf-token`, `HF_TOKEN`,
    `apiKey`, `AWS_SECRET_ACCESS_KEY`; not `--max-num-batched-tokens`, `--tokenizer`)."""
    parts = re.split(r"[-_.]+", re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower())
    return parts[-1] in SECRET_NOUNS or any(part in SECRET_WORDS for part in parts)


@cache
def engine_options(engine: str) -> dict[str, bool]:
    """The engine's option names (aliases too, `_` read as `-`) -> whether it takes several
    values (nargs "+"); empty for an engine without a table here (trtllm-serve, or none)."""
    if engine not in FLAG_TABLES:
        return {}
    text = resources.files("mlamem.spec.engines").joinpath(FLAG_TABLES[engine]).read_text()
    options = {}
    for flag, entry in json.loads(text)["flags"].items():
        many = entry["kind"] == "list" or entry.get("nargs") in ("+", "*")
        options |= {_dashed(name): many for name in (flag, *entry["aliases"])}
    return options


def _dashed(option: str) -> str:
    return option[:2] + option[2:].replace("_", "-") if option.startswith("--") else option


def hides(option: str, engine: str | None) -> int:
    """How many words after `option` (a word's part before any `=`) hold a secret: 0 for an
    option that holds none, 1, or -1 for all up to the next option (vLLM's --api-key)."""
    if not option.startswith("--") or len(option) < 3:
        return 0
    name, options = _dashed(option), engine_options(engine or "")
    if name in CREDENTIALS or (name not in options and (
            any(flag.startswith(name) for flag in CREDENTIALS) or says_secret(name))):
        matches = [flag for flag in CREDENTIALS if flag.startswith(name)]
        return -1 if any(options.get(flag) for flag in matches) else 1
    return 0


def engine_of(words: list[str]) -> str | None:
    """The engine whose server the words start (after `NAME=VALUE` words and `env`), if any."""
    while words and (_ENV_WORD.fullmatch(words[0]) or words[0] in ("env", "export")):
        words = words[1:]
    program = Path(words[0]).name if words else ""
    if program == "vllm" and words[1:2] == ["serve"]:
        return "vllm"
    if program == "sglang" or "sglang.launch_server" in words[1:3]:
        return "sglang"
    return "trtllm" if program == "trtllm-serve" else None


def redacted_words(words: list[str], engine: str | None = None) -> tuple[list[str], list[str]]:
    """The words with every secret value replaced by HIDDEN, and the values hidden."""
    shown, hidden, pending = [], [], 0
    for word in words:
        if pending and not word.startswith("-"):
            shown.append(HIDDEN)
            hidden.append(word)
            pending -= 1
            continue
        pending = 0
        option, eq, value = word.partition("=")
        env = _ENV_WORD.fullmatch(word)
        if env and says_secret(env[1]):
            shown.append(f"{env[1]}={HIDDEN}")
            hidden.append(env[2].rstrip(";"))
            continue
        count = hides(option, engine)
        if count and eq:
            shown.append(f"{option}={HIDDEN}")
            hidden.append(value)
            continue
        pending = count
        shown.append(word)
    return shown, hidden


def _words(command: str) -> list[str]:
    """The command's words as a shell splits them (lines joined at backslash-newline); words
    split at blanks where the shell could not (an open quote)."""
    joined = re.sub(r"\\\r?\n", "", command)
    try:
        return shlex.split(joined)
    except ValueError:
        return joined.split()


def redacted_command(command: str) -> str:
    """A pasted serve command as one line, its secrets hidden."""
    words = _words(command)
    return shlex.join(redacted_words(words, engine_of(words))[0])


def secret_values(command: str) -> list[str]:
    """The values `redacted_command` hides in a pasted command."""
    words = _words(command)
    return redacted_words(words, engine_of(words))[1]


def _argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """mlamem's arguments with their secrets hidden (`--serve`'s command as a pasted one), and
    the values hidden."""
    heads = {i: "" for i in range(1, len(argv)) if argv[i - 1] == "--serve"}
    heads |= {i: "--serve=" for i, word in enumerate(argv)
              if word.startswith("--serve=") and i not in heads}
    shown, hidden = redacted_words(["-" if i in heads else w for i, w in enumerate(argv)])
    for i, head in heads.items():  # "-": no value of a flag before it
        words = _words(argv[i][len(head):])
        inner, values = redacted_words(words, engine_of(words))
        shown[i] = head + shlex.join(inner) if values else argv[i]
        hidden += values
    return shown, hidden


def redacted_argv(argv: list[str]) -> list[str]:
    """mlamem's arguments as a result records them: secrets hidden."""
    return _argv(argv)[0]


def argv_secrets(argv: list[str]) -> list[str]:
    """The values `redacted_argv` hides."""
    return _argv(argv)[1]


def redacted_command_line(line: str) -> str:
    """A recorded command line (`mlamem plan --serve '...'`, from a result file of any age)
    with its secrets hidden; unchanged where it holds none."""
    words = _words(line)
    shown, hidden = _argv(words)
    return shlex.join(shown) if hidden else line


def scrubbed(message: str, values: list[str]) -> str:
    """`message` with each of `values` (MIN_SCRUBBED characters or more), as written or as
    Python quotes it, replaced by HIDDEN."""
    for value in sorted(set(values), key=len, reverse=True):
        if len(value) >= MIN_SCRUBBED:
            for form in {value, repr(value)[1:-1]}:
                message = message.replace(form, HIDDEN)
    return message


def table_secrets(table, engine: str | None) -> list[str]:
    """The values a `--config` file's table holds under a key that hides: a top-level key as
    the flag the engine makes of it (`hf_token` -> --hf-token, `hf_tok` too), a nested key by
    its name (`api_key`); true, false and null are no secret."""
    values, stack = [], [(table, True)]
    while stack:  # no recursion: a file may nest as deep as YAML reads
        node, top = stack.pop()
        items = node.items() if isinstance(node, dict) else ()
        for key, value in items:
            name = str(key)
            if hides("--" + name, engine) if top else says_secret(name):
                values += [json.dumps(value, default=str)] if isinstance(value, dict) else [
                    str(v) for v in (value if isinstance(value, list) else [value])
                    if not isinstance(v, bool) and v is not None]
            elif isinstance(value, dict):
                stack.append((value, False))
            elif isinstance(value, list):
                stack += [(item, False) for item in value if isinstance(item, dict)]
    return values


@contextmanager
def errors_without(values: list[str]) -> Iterator[None]:
    """A UserError raised inside, with `values` scrubbed out of its message."""
    try:
        yield
    except UserError as error:
        error.message = scrubbed(error.message, values)
        error.args = (error.message,)
        raise
