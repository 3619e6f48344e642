"""Writing output files whole or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from mlamem.errors import UserError


def check_output_path(path: Path, option: str = "--output") -> Path:
    """Fail before any work if `path` cannot be written; returns its folder."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UserError(f"{option}: folder {folder} does not exist; create it or pick another path")
    if path.is_dir():
        raise UserError(f"{option}: {path} is a folder; give a file path")
    return folder


def write_atomic(path: Path, data: str | bytes, option: str = "--output") -> None:
    """Write `data` to `path` via a temporary file in the same folder and a rename."""
    folder = check_output_path(path, option)
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UserError(f"{option}: cannot write in {folder} ({exc.strerror}); "
                        "pick a writable folder") from None
    try:
        with os.fdopen(fd, mode) as handle:
            handle.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UserError(f"{option}: cannot write {path} ({exc.strerror}); "
                        "pick a writable path") from None
