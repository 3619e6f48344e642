"""The README is a short front door, and every relative link in it and in docs/ leads somewhere:
to a file that exists and, where the link names a heading, to a heading of that file."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The Markdown outside fenced code blocks (their `#` lines are no headings)."""
    return FENCE.sub("", text)


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the file's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", prose(path.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def relative_links(path: Path) -> list[str]:
    return [link for link in LINK.findall(prose(path.read_text()))
            if not re.match(r"[a-z]+:", link)]


def test_the_readme_is_at_most_250_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move the rest to docs/"


def test_the_readme_links_every_docs_page():
    linked = {(README.parent / link.partition("#")[0]).resolve() for link in relative_links(README)}
    unlinked = [page.name for page in PAGES[1:] if page.resolve() not in linked]
    assert not unlinked, f"README.md's contents list lacks {unlinked}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading(page):
    broken = []
    for link in relative_links(page):
        target, _, anchor = link.partition("#")
        resolved = (page.parent / target).resolve() if target else page
        if not resolved.exists():
            broken.append(f"{link}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{link}: no such heading in {resolved.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_names_a_tracker_number(page):
    """The docs say what the code does, not which ticket asked for it; upstream pull requests
    (`vLLM PR #60220`) are sources and stay."""
    found = TRACKER_NUMBER.findall(page.read_text())
    assert not found, f"{page.relative_to(ROOT)} names {found}"


TRACKER_NUMBER = re.compile(r"\bissue[- ]?\d+|(?<!PR )(?<!request )#\d+\b", re.I)
SOURCES = [p for top in ("mlamem", "kernels", "scripts", "benchmarks", "tests", "scenarios", ".ci")
           for p in sorted((ROOT / top).rglob("*"))
           if p.is_file() and p.suffix in {".py", ".toml", ".sh", ".json", ""} and "fixtures" not in p.parts]


def test_no_source_names_a_tracker_number():
    """The code, scripts, benchmarks, tests and scenarios name no ticket either (fixtures are
    recorded output and stay as they were made)."""
    found = [f"{p.relative_to(ROOT)}:{n}" for p in SOURCES
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             if TRACKER_NUMBER.search(line)]
    assert SOURCES and not found, f"tracker numbers at {found}"


def test_the_tracker_check_tells_a_ticket_from_an_upstream_pull_request():
    """The pattern can fail: a ticket is found, an upstream pull request is a source."""
    ticket = 26  # spelled apart, so this file passes its own check
    found = TRACKER_NUMBER.findall(f"see issue {ticket} and #{ticket + 1}")
    assert found == [f"issue {ticket}", f"#{ticket + 1}"]
    assert not TRACKER_NUMBER.findall("vLLM PR #60220, pull request #6117, colour #1f77b4")


def test_the_link_check_finds_a_broken_link_and_heading(tmp_path):
    """The checks above can fail: a missing file and a missing heading are both caught."""
    (tmp_path / "other.md").write_text("# A heading\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#a-heading) [b](missing.md) [c](other.md#not-a-heading)\n"
                    "[d](https://example.com/x.md)\n```\n[e](in-code.md)\n```\n")
    assert relative_links(page) == ["other.md#a-heading", "missing.md", "other.md#not-a-heading"]
    assert anchors(tmp_path / "other.md") == {"a-heading"}


# A shown session: a fenced block that starts with a command (`$ ...`), or a block of output (a
# fenced block or a quote of rendered Markdown) right under an HTML comment that holds its
# commands (`<!-- $ ... -->`, unseen on the rendered page). Each `$` command (lines joined until
# its quotes close) is run by bash, in order, in one temporary folder, and the lines under it are
# its output, "..." where lines are left out. Every page's sessions are rerun, on the CPU (CUDA
# hidden, so every figure is PREDICTED), with the interpreter's own `mlamem` and `python`: the
# README's from an empty folder, as a newcomer runs the tour after its setup command; docs/'s
# beside links to the checkout's files, which their commands name.
SESSION = re.compile(r"^```(?:console)?\n(\$ .*?)^```$"
                     r"|^<!-- (\$ .*?) -->\n\n?(?:```\w*\n(.*?)^```$|((?:^>[^\n]*\n?)+))", re.M | re.S)


def sessions(text: str) -> list[tuple[int, list[tuple[str, list[str]]]]]:
    """(the block's first line number, its (command, lines shown) pairs) of each shown session."""
    found = []
    for block in SESSION.finditer(text):
        session, commented, fenced, quoted = block.groups()
        if commented:  # the commands, then the output block's lines
            quote = [re.sub(r"^> ?", "", line) for line in (quoted or "").splitlines()]
            session = "\n".join([commented, *(fenced or "").splitlines(), *quote])
        found.append((text[:block.start()].count("\n") + 1 + (not commented),
                      _steps(session.splitlines())))
    return found


def _steps(lines: list[str]) -> list[tuple[str, list[str]]]:
    """A session's lines as (command, lines shown) pairs."""
    steps: list[tuple[str, list[str]]] = []
    pending = None
    for line in lines:
        if pending is None and line.startswith("$ "):
            pending = line[2:]
        elif pending is not None:
            pending += "\n" + line
        else:
            steps[-1][1].append(line)
        if pending is not None and _complete(pending):
            steps.append((pending, []))
            pending = None
    return steps


def _complete(command: str) -> bool:
    """Whether a command's quotes are closed (a `python -c '...'` spans lines)."""
    try:
        shlex.split(command)
    except ValueError:
        return False
    return True


def _assignment(command: str) -> bool:
    words = shlex.split(command)
    return len(words) == 1 and re.match(r"[A-Z_]+=", words[0]) is not None


def missing_lines(shown: list[str], printed: list[str]) -> list[str]:
    """The shown lines not printed, in order; a "..." line stands for any lines."""
    at, missing = 0, []
    for line in (line.rstrip() for line in shown if line.strip() != "..."):
        found = next((i for i in range(at, len(printed)) if printed[i].rstrip() == line), None)
        if found is None:
            missing.append(line)
        else:
            at = found + 1
    return missing


def run_session(steps: list[tuple[str, list[str]]], folder: Path, *, linked: bool) -> list[str]:
    """Run a session's commands in `folder` (`linked`: beside links to the checkout's files); the
    failures, each with what it prints now."""
    for entry in ROOT.iterdir() if linked else ():
        if not entry.name.startswith(".") and not (folder / entry.name).exists():
            (folder / entry.name).symlink_to(entry)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "COLUMNS": "80",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    assignments, failures = [], []
    for command, shown in steps:
        if _assignment(command):  # `SEED="..."`: set for the commands after it
            assignments.append(command)
        done = subprocess.run(["bash", "-c", "\n".join([*assignments, command])], cwd=folder,
                              env=env, capture_output=True, text=True, timeout=600)
        out, err = done.stdout.splitlines(), done.stderr.splitlines()
        missing = missing_lines(missing_lines(shown, out), err)  # stdout's in order, then stderr's
        refused = done.returncode == 2 and any("error:" in line for line in shown)
        if missing or not (done.returncode == 0 or refused):
            failures.append(f"$ {command}\n(exit {done.returncode}) no longer prints {missing};"
                            f" it prints:\n" + "\n".join(out + err))
    return failures


@pytest.mark.parametrize("page", [page for page in PAGES if sessions(page.read_text())],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shown_session_prints_what_the_page_shows(page, tmp_path):
    """Each command the page shows, run as shown (a page's sessions in order, in one folder: a
    file one writes, the next reads), exits 0 (2 for a refusal shown) and prints the page's lines
    in order: a figure that moves fails here, naming the command to rerun."""
    failures = [f"{page.relative_to(ROOT)}:{line}: {failure}"
                for line, steps in sessions(page.read_text())
                for failure in run_session(steps, tmp_path, linked=page != README)]
    where = "an empty folder" if page == README else "a folder linking the checkout's files"
    assert not failures, (
        f"rerun the page's commands in order (in {where}, CUDA hidden: CUDA_VISIBLE_DEVICES=,"
        " COLUMNS=80 unless given) and paste what they print into the page; each below prints"
        " in full:\n" + "\n\n".join(failures))


def test_the_session_check_finds_a_changed_figure(tmp_path):
    """The check above can fail: a figure the page shows that the command no longer prints, a
    command that fails; a variable set in a session reaches the commands after it."""
    page = ("```\n$ WORD=\"KV 25.649\"\n$ echo \"$WORD GiB\"\nKV 25.649 GiB\n$ python -c 'print(\n"
            "1)'\n...\n1\n$ echo KV 25.655 GiB\nKV 25.649 GiB\n$ false\n```\n")
    [(line, steps)] = sessions(page)
    assert line == 2 and [command for command, _ in steps] == [
        'WORD="KV 25.649"', 'echo "$WORD GiB"', "python -c 'print(\n1)'", "echo KV 25.655 GiB",
        "false"]
    failures = run_session(steps, tmp_path, linked=False)
    assert [failure.splitlines()[0] for failure in failures] == ["$ echo KV 25.655 GiB", "$ false"]
    assert "no longer prints ['KV 25.649 GiB']" in failures[0]
    assert missing_lines(["...", "a", "...", "c"], ["x", "a", "b", "c"]) == []
    quoted = "text\n<!-- $ echo '# A'\n$ echo b -->\n\n> # A\n>\n> b\n\nafter\n"
    assert sessions(quoted) == [(2, [("echo '# A'", []), ("echo b", ["# A", "", "b"])])]


# The README's seed table is measured on the H200: each row is the cited results' (the alloc and
# workspace paths of sgl-flash-mla's profile, the workspace path of vLLM's build's), to the digit.
SEED_RESULTS = [ROOT / "reports" / "profile-h200" / "glm5-fp8-tp8.json",
                ROOT / "reports" / "kernels-h200" / "profile-flashmla-vllm-sparse-decode.json"]
SEED_ROW = re.compile(r"^\| (\d+) \| ([\d.]+) GiB \| ([\d.]+) GiB \| ([\d.]+) GiB \| ([\d.]+) GiB \| "
                      r"(yes|no) \|$", re.M)


def _gib(row_bytes: int) -> str:
    return f"{row_bytes / 2**30:.3f}"


def test_the_seed_table_is_the_cited_h200_results():
    """Every figure of the README's seed table, and the software it names, is the committed H200
    results' (a figure typed by hand, or results rerun without the table, fails here)."""
    sgl, vllm = (json.loads(path.read_text()) for path in SEED_RESULTS)
    peak = [{(row["tokens"], row["path"]): row["peak_allocated_bytes"] for row in results["rows"]}
            for results in (sgl, vllm)]
    equal = {(row["tokens"], row["path"]): row["outputs_equal"] for row in vllm["rows"]}
    rows = SEED_ROW.findall(README.read_text())
    assert [int(row[0]) for row in rows] == [1024, 8192, 16384, 32768]
    for tokens, *shown in rows:
        at = int(tokens)
        assert peak[0][at, "alloc"] == peak[1][at, "alloc"]  # the same bytes with both builds
        assert shown == [_gib(peak[0][at, "alloc"]), _gib(peak[0][at, "workspace"]),
                         _gib(peak[1][at, "workspace"]),
                         _gib(peak[0][at, "alloc"] - peak[1][at, "workspace"]),
                         "yes" if equal[at, "alloc"] and equal[at, "workspace"] else "no"]
    text = " ".join(README.read_text().split())
    software = sgl["environment"]
    for named in (f"torch {software['torch']}", f"sgl-flash-mla {software['flash_mla']}",
                  f"driver {software['driver']}"):
        assert named in text, f"README.md's seed table names other software than {named}"


def test_the_tours_measured_limits_are_the_cited_results():
    """The README's tour gives the limits `mlamem repro-oom` measured on the H100 (the target
    as the physical device) as the cited result (reports/repro-oom-h100) holds them."""
    results = json.loads((ROOT / "reports" / "repro-oom-h100" / "h100" / "repro-glm5.json")
                         .read_text())
    assert results["measured"] and results["command"].startswith("mlamem repro-oom")
    alloc, workspace = [case["max_safe_tokens"] for case in results["cases"]]
    text = " ".join(README.read_text().split())
    assert f"({alloc} fits, {alloc + 1} OOMs; {workspace} fits, {workspace + 1} OOMs;" in text


# docs/scenarios.md's lists of the fields where a pasted command's scenario differs from a shipped
# one: (the words the list follows, how the page gives the command, --gpu, the weights, shipped)
DIFFERENCE_LISTS = [
    ("`seed.toml` holds the same figures", r'^\$ SEED="([^"]+)"', "H100 SXM 80GB", 40,
     "glm5-fp8-tp8"),
    ("that differ are these", r"The shipped `kimi-k2-dense-fp8-tp4-dp` as a command is `([^`]+)`",
     "H200 SXM 141GB", 60, "kimi-k2-dense-fp8-tp4-dp")]
WORDS = {"name", "description", "model.name", "parallel.weights_note"}  # not figures


def documented_fields(text: str, lead: str) -> set[str]:
    """The fields the bulleted list after `lead` names before each item's first ': '
    (`[vllm] max_num_seqs` -> vllm.max_num_seqs, `engines` -> engines)."""
    after = text[text.index(lead):].split("\n\n", 2)[1]  # the paragraph after the lead's
    items = re.split(r"^- ", after, flags=re.M)[1:]
    return {f"{section}.{key}" if section else key
            for item in items
            for section, key in re.findall(r"`(?:\[(\w+)\] )?(\w+)`", item.split(": ", 1)[0])}


def _flat(table: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in table.items():
        flat.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict)
                    else {prefix + key: value})
    return flat


@pytest.mark.parametrize("listed", DIFFERENCE_LISTS, ids=lambda d: d[4])
def test_a_documented_difference_list_is_every_field_that_differs(listed):
    """The page's command, built as `scenarios --serve` builds it, differs from the shipped
    scenario in exactly the fields the page lists, the words aside."""
    from mlamem.spec import scenario
    from mlamem.spec.serve_command import from_command

    lead, command, gpu, gib, shipped = listed
    text = (ROOT / "docs" / "scenarios.md").read_text()
    found = re.search(command, text, re.M)
    assert found, f"docs/scenarios.md gives no command matching {command!r}"
    built = from_command(" ".join(found[1].split()), gpu_name=gpu, weights_bytes=gib * 1024**3)
    ours = _flat(scenario.to_dict(built.scenario))
    theirs = _flat(scenario.to_dict(scenario.load(shipped)))
    differ = {k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)} - WORDS
    assert documented_fields(text, lead) == differ


def test_the_difference_check_reads_a_list():
    """The check above can fail: the fields a list names, and only those."""
    page = "Lead:\n\n- `engines`: `[\"vllm\"]`;\n- `[vllm] a` and `[vllm] b`: 0, `x`\n\nafter\n"
    assert documented_fields(page, "Lead") == {"engines", "vllm.a", "vllm.b"}
