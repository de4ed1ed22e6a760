"""Atomic file writes: a reader sees the old file or the new one, never half of one.

:func:`preflight` says, before a run measures anything, that a path cannot be written, so that a file the
run writes at its end (the result, a launcher config) never fails after the work it records.

The temporary file ``mkstemp`` creates is private (0600); before it replaces the target it gets the
mode a plain ``open(path, "w")`` would give: the existing file's mode when it replaces one, else
0666 less the process's umask. Configs written on shared storage stay as readable to the team as
any other file the user writes there.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from autobatch.errors import UsageError


def current_umask() -> int:
    """The process's umask, read without changing it where Linux tells (``/proc/self/status``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (not thread-safe, but brief)
    os.umask(mask)
    return mask


def new_file_mode(path: Path) -> int:
    """The mode ``path`` gets: that of the file it replaces, else 0666 less the umask."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return 0o666 & ~current_umask()


def write_atomic(path: str | Path, text: str | bytes) -> Path:
    """Write ``text`` (or bytes) to ``path`` through a temporary file in the same folder and ``os.replace``.

    Text is written as UTF-8, and a file name the locale could not decode (``données/`` under ``LC_ALL=C``, where
    Python holds it as surrogate escapes, as ``os.fsdecode`` does) as the bytes the file system has: a command
    line in the file (``args``, ``env``) then names the file that is there."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = new_file_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def preflight(path: Path, what: str, fix: str) -> None:
    """Raise a :class:`UsageError` naming ``what`` (``"result file"``) and ``path``, with ``fix`` as its hint,
    when :func:`write_atomic` could not write ``path``: it is a folder, under a file, or in a folder this process
    cannot write. A missing folder is fine: it is created when the file is written."""
    if path.is_dir():
        raise UsageError(f"the {what} {path} is a folder", hint=f"name a file, not a folder: {fix}")
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"cannot write the {what} {path}: {parent} is a file, not a folder", hint=fix)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write the {what} {path}: {parent} is not writable", hint=fix)
    try:  # what the OS says, for root too (a read-only mount, /proc)
        with tempfile.TemporaryFile(dir=parent, prefix=".autobatch-check-"):
            pass
    except OSError as exc:
        raise UsageError(
            f"cannot write the {what} {path}: {parent} is not writable ({exc.strerror or exc})", hint=fix
        ) from None
