"""Output files: checked before any work, written whole or not at all, their format agreed;
input files read through one reader (`read_text`, `read_json`), and names from files made safe
as file names (`safe_name`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from mlamem.spec.errors import UserError

# An output's extension names its format; --format, when given too, must agree with it.
FORMAT_BY_SUFFIX = {".txt": "table", ".md": "markdown", ".markdown": "markdown",
                    ".json": "json", ".csv": "csv", ".pickle": "pickle", ".pkl": "pickle"}

_written: list[Path] = []  # what this process wrote, for the line an interrupt prints
_temporaries: set[str] = set()  # temporary files not yet renamed or removed


def written() -> list[Path]:
    """Every file `write_atomic` finished in this process, in order."""
    return list(_written)


def remove_temporaries() -> None:
    """Remove every temporary file a write left half-done (an interrupt ends the process)."""
    for tmp in list(_temporaries):
        Path(tmp).unlink(missing_ok=True)
        _temporaries.discard(tmp)


def pick_format(path: Path | None, given: str | None, accepted: Sequence[str],
                  field: str = "output", what: str = "this command") -> str:
    """The format to write: `given` if any, else the one `path`'s extension names, else the
    first of `accepted` (the default). A UserError (field `format`) if they disagree or
    `accepted` lacks it.

    '.txt' is table, '.md' markdown, '.json' json, '.csv' csv; any other name takes --format.
    """
    implied = FORMAT_BY_SUFFIX.get(path.suffix.lower()) if path is not None else None
    if implied is not None and given is not None and given != implied:
        raise UserError(f"{given}, but {path} is {implied} by its extension; drop the "
                        f"format or name the file {path.stem}{_suffix_for(given)}", field="format")
    chosen = given or implied or accepted[0]
    if chosen not in accepted:
        names = ", ".join(f"{f} ({_suffix_for(f)})" for f in accepted)
        if path is None or implied is None:
            raise UserError(f"{chosen}: {what} writes {names}; pick one of those", field="format")
        raise UserError(f"{path}: {what} writes {names}, and {path.suffix} names "
                        f"{chosen}; name the file {path.stem}{_suffix_for(accepted[0])} or the like",
                        field=field)
    return chosen


def check_distinct(outputs: dict[str, Path | None]) -> None:
    """Two options naming one file would overwrite each other: a UserError naming both."""
    seen: dict[Path, str] = {}
    for option, path in outputs.items():
        if path is None:
            continue
        key = path.resolve()
        if key in seen:
            raise UserError(f"{seen[key]} and {option} both name {path}; give each its own file")
        seen[key] = option


def check_given_once(paths: list[Path], what: str) -> None:
    """Input files, each named once: a file given twice would count twice (a report's sections,
    a merge's units). A UserError naming the first one repeated."""
    seen: set[Path] = set()
    for path in paths:
        if path.resolve() in seen:
            raise UserError(f"{path} is given twice; give each {what} once")
        seen.add(path.resolve())


def _suffix_for(format_name: str) -> str:
    return next(s for s, f in FORMAT_BY_SUFFIX.items() if f == format_name)


def check_output_path(path: Path, field: str = "output", *, parents: bool = False) -> Path:
    """Fail before any work if `path` cannot be written; returns its folder.

    The folder must exist (with `parents`, its nearest existing ancestor) and take a new file:
    a file is created and removed there, which also holds for root and read-only mounts.
    """
    if str(path) == "-":  # would make a file named '-'; an output that can be stdout is printed
        raise UserError("- (stdout) is not taken here; give a file path", field=field)
    check_name_length(path, field)
    folder = path.parent if str(path.parent) else Path(".")
    probe = folder
    while parents and not probe.exists() and probe != probe.parent:
        probe = probe.parent  # the folders below it are created when the file is written
    if probe.exists() and not probe.is_dir():
        raise UserError(f"{probe} is a file, not a folder; pick another path", field=field)
    if not probe.is_dir():
        raise UserError(f"folder {folder} does not exist; create it or pick another path", field=field)
    if path.is_dir():
        raise UserError(f"{path} is a folder; give a file path", field=field)
    if _is_special(path) or _is_descriptor(path):  # by type, not by folder: /dev/shm is tmpfs
        raise UserError(f"{path} is not a regular file (a device or a pipe); "
                        "give a file path", field=field)
    free = _free_bytes(probe)
    if free is not None and free < MIN_FREE_BYTES:
        raise UserError(f"{probe} has {free} bytes free, less than mlamem needs to write "
                        f"there ({MIN_FREE_BYTES}); free some space or pick another folder", field=field)
    try:
        fd, tmp = tempfile.mkstemp(dir=probe, prefix=".mlamem-check.", suffix=".tmp")
    except OSError as exc:
        raise UserError(f"cannot write in {probe} ({exc.strerror}); "
                        "pick a writable folder", field=field) from None
    _temporaries.add(tmp)
    os.close(fd)
    os.unlink(tmp)
    _temporaries.discard(tmp)
    return folder


# What any output needs free where it goes (a report with its plots is well under it); checked
# before the work, so a full disk is one line at the start, not after the run
MIN_FREE_BYTES = 8 * 1024 * 1024


def _free_bytes(folder: Path) -> int | None:
    """The bytes free to this user in `folder`'s file system; None where that is not known
    (a pseudo file system such as /proc reports a size of 0)."""
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return None
    return usage.free if usage.total else None


def _is_special(path: Path) -> bool:
    """An existing path that is not a regular file (a device, a pipe): never replaced."""
    try:
        return not stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def _is_descriptor(path: Path) -> bool:
    """A process's file descriptor (/dev/stdout, /dev/fd/1: links into /proc/PID/fd): a stream,
    whatever type its file has (a regular file under pytest's capture)."""
    current, proc = Path(os.path.abspath(path)), Path("/proc")
    for _ in range(40):  # the kernel's limit on links followed
        folder = Path(os.path.realpath(current.parent))
        if folder.name == "fd" and folder.parent.parent == proc:  # /proc/PID/fd
            return True
        if not current.is_symlink():
            return False
        current = current.parent / os.readlink(current)
    return True


def write_atomic(path: Path, data: str | bytes, field: str = "output", *,
                 parents: bool = False) -> None:
    """Write `data` to `path` via a temporary file in the same folder and a rename, so `path`
    holds the old content or the new, never a part, even under Ctrl-C. With `parents`, missing
    folders are created first. A device or pipe (/dev/stdout) is refused."""
    mode = "wb" if isinstance(data, bytes) else "w"
    if parents:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create folder {path.parent} ({exc.strerror}); "
                            "pick a writable path", field=field) from None
    target = path.resolve() if path.is_symlink() else path  # write where a link points
    folder = check_output_path(target, field)
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{fit_name(target.name, limit=128)}.",
                                   suffix=".tmp")  # a long name's temporary fits too
    except OSError as exc:
        raise UserError(f"cannot write in {folder} ({exc.strerror}); "
                        "pick a writable folder", field=field) from None
    _temporaries.add(tmp)
    try:
        with os.fdopen(fd, mode) as handle:
            handle.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp, target)
    except BaseException as exc:  # an OSError, or an interrupt: leave no temporary file
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise UserError(f"cannot write {path} ({exc.strerror}); "
                            "pick a writable path", field=field) from None
        raise
    finally:
        _temporaries.discard(tmp)
    _written.append(path)


MAX_INPUT_BYTES = 64 * 1024 * 1024  # no scenario, baseline or result comes near this


def read_bytes(path: Path, what: str, field: str | None = None,
               limit: int = MAX_INPUT_BYTES) -> bytes:
    """The one reader of an input file: a regular file within `limit` bytes. Anything else is a
    UserError naming the file (and `field`, the option it came from)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise UserError(f"{path}: no such {what}", field=field) from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror})", field=field) from None
    if stat.S_ISDIR(info.st_mode):
        raise UserError(f"{path} is a folder; pass a {what}", field=field)
    if not stat.S_ISREG(info.st_mode):
        raise UserError(f"{path} is not a regular file (a device or a pipe); pass a {what}",
                        field=field)
    if info.st_size > limit:
        raise UserError(f"{path} is {info.st_size} bytes, more than a {what} can be "
                        f"({limit}); pass the right file", field=field)
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror})", field=field) from None
    if len(data) > limit:  # it grew while being read
        raise UserError(f"{path} is more than a {what} can be ({limit}); pass the right file",
                        field=field)
    return data


def read_text(path: Path, what: str, field: str | None = None) -> str:
    """`read_bytes`'s file decoded as UTF-8; anything else is a UserError naming the file."""
    data = read_bytes(path, what, field)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start}); pass a {what}",
                        field=field) from None


def _not_finite(constant: str):
    raise ValueError(f"{constant} is not a number mlamem accepts")


def loads_json(text: str):
    """JSON as mlamem reads it: NaN and Infinity, and nesting deeper than Python's parser
    recurses, refused (ValueError, as a decode error is)."""
    try:
        return json.loads(text, parse_constant=_not_finite)
    except RecursionError:
        raise ValueError("nested deeper than mlamem reads") from None


# Characters no text taken from a file may bring to a terminal, a table or a heading: C0 (a
# newline, ESC, BEL), DEL, C1, and Unicode's line and paragraph separators.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


NAME_MAX_BYTES = 255  # the longest name one folder entry takes (Linux NAME_MAX, most file systems)
SAFE_NAME_CHARS = 100  # safe_name's longest: room left for a prefix and a suffix


def check_name_length(path: Path, field: str | None = None) -> None:
    """A UserError where a name in `path` is longer than a file system takes (NAME_MAX_BYTES),
    before any work: the OS would refuse it only when the file is made."""
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > NAME_MAX_BYTES:
            raise UserError(f"{path}: a name in it is {size} bytes, longer than a file system "
                            f"takes ({NAME_MAX_BYTES}); pick a shorter one", field=field)


def fit_name(stem: str, suffix: str = "", limit: int = NAME_MAX_BYTES) -> str:
    """`stem + suffix` within `limit` bytes: a longer stem is cut and ends with 8 hex digits of
    its hash, so two long stems stay apart."""
    if len(os.fsencode(stem + suffix)) <= limit:
        return stem + suffix
    digest = hashlib.sha256(os.fsencode(stem)).hexdigest()[:8]
    room = limit - len(os.fsencode(suffix)) - len(digest) - 1
    cut = os.fsencode(stem)[:room].decode("utf-8", "ignore")  # never half a character
    return f"{cut}-{digest}{suffix}"


def safe_name(name: str) -> str:
    """The one way a name taken from a file (a scenario's `name`) becomes a file name: letters,
    digits, '.', '-' and '_' kept, anything else '_'; never empty, never starting with '.';
    at most SAFE_NAME_CHARS (fit_name), so a name and its prefix and suffix fit a file name."""
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name)
    return fit_name(cleaned.lstrip(".") or "unnamed", limit=SAFE_NAME_CHARS)


def read_json(path: Path) -> dict:
    """The file's JSON object; a missing, unreadable, non-finite or corrupt file is a UserError."""
    text = read_text(path, "result file (JSON, as a command saves it)")
    try:
        data = loads_json(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); save results "
                        "in the json format") from None
    except (ValueError, RecursionError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc}); save results in the json format") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: not an mlamem result (a JSON {type(data).__name__}, "
                        "not an object)")
    return data
