"""The script's files in a probe: what it reads (for the cache's key) and where what it writes goes.

A probe runs the user's script from a scratch folder of symbolic links to the working folder's entries
(:func:`scratch_folder`): relative reads work as in the job, and writes land in the scratch folder or are
refused. :class:`ScriptFiles` sees every open, move and removal through Python's audit hooks (and
``torch.save``) and reports the files read and written on the outcome. What is seen and what is not:
docs/as-is.md ("The script's files").
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autobatch.cache.sources import INSTALLED_MARKERS, in_site_folder
from autobatch.records.protocol import ProbeOutcome

#: The folder the probe server makes for each probe: scratch folders are made inside it, and it is removed
#: with them when the probe ends.
SCRATCH_ENV = "AUTOBATCH_SCRATCH_ROOT"
#: The user's working folder, and the probe's scratch folder, for the processes a probe starts (its ranks, a
#: fresh process).
WORKING_ENV = "AUTOBATCH_WORKING_FOLDER"
SHARED_ENV = "AUTOBATCH_SCRATCH_FOLDER"
#: Folders whose files are never the script's own inputs or outputs.
_SYSTEM = ("/proc", "/sys", "/dev")
#: Folders of an installed package's metadata (a development install's sit beside its sources).
_METADATA = (".dist-info", ".egg-info")
#: autobatch's own package: its files are never the script's.
_AUTOBATCH = Path(__file__).resolve().parent.parent
#: Flags of ``os.open`` (and ``open``'s) that write.
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
#: Audit events that change the file system at their first argument (the second too: :data:`_TWO_PATHS`).
_CHANGES = {
    "os.mkdir": "mkdir",
    "os.rmdir": "remove",
    "os.remove": "remove",
    "os.truncate": "modify",
    "os.chmod": "modify",
    "os.utime": "modify",
    "shutil.rmtree": "rmtree",
    "os.rename": "move",
    "os.link": "create",
    "os.symlink": "create",
}
_WATCHED = frozenset({"open", "os.chdir", *_CHANGES})
_TWO_PATHS = {"os.rename": ("move", "replace"), "os.link": (None, "create"), "os.symlink": (None, "create")}


#: The watch this probe process installed (:func:`install`), None before.
_watch: ScriptFiles | None = None


class ScriptFiles:
    """The watch on one probe's files: the working folder, its scratch twin, what was read and written."""

    def __init__(self, outcome: ProbeOutcome, script: Path | None, user: Path, scratch: Path) -> None:
        self.outcome = outcome
        self.user = user  # the working folder the tune was started in
        self.scratch = scratch
        self.protected = [user, *([script.resolve().parent] if script is not None else [])]
        self.written: set[str] = set()
        self.read: set[str] = set()
        self.own: set[Path] = set()  # files the script wrote outside the scratch folder
        self.looked_at: set[str] = set()  # paths opened for reading so far
        self.busy = False  # copying on write: the hook's own file operations are not the script's
        self.inside = threading.local()  # in this thread, the hook is deciding: what it opens is its own
        # worked out here, before the hook runs: tempfile works the folder out under a lock and opens files to
        # do it, so asking it from inside the hook, the first time, would wait for that lock for ever
        self.caches = _caches()
        prefixes = {Path(p).resolve() for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}} - {Path("/")}
        #: The interpreter's prefixes but one that holds the working folder (a project under ``/usr``).
        self.prefixes = [p for p in prefixes if not any(_under(folder, p) for folder in self.protected)]
        self.skipped = [*prefixes, *(Path(p) for p in _SYSTEM)]

    # -- the hook -------------------------------------------------------------------------------

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event not in _WATCHED or self.busy or getattr(self.inside, "deciding", False):
            return
        self.inside.deciding = True
        try:
            self._decide(event, args)
        finally:
            self.inside.deciding = False

    def _decide(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path, mode, flags = args
            if isinstance(path, (str, bytes, os.PathLike)):
                if _writes(mode, flags):
                    self.writing(path, "truncate" if _truncates(mode, flags) else "modify")
                else:
                    self.reading(path, mode)
        elif event == "os.chdir":
            if _is_path(args[0]):
                self.entering(args[0])
        elif event in _CHANGES:
            first, second = _TWO_PATHS.get(event, (_CHANGES[event], None))
            if first is not None and _is_path(args[0]):
                self.writing(args[0], first)
            if second is not None and _is_path(args[1]):
                self.writing(args[1], second)

    def entering(self, path: Any) -> None:
        """Before ``os.chdir(path)``: a folder of the working folder's entered through the scratch folder (a link
        there) becomes the scratch folder's own, its entries links, so that the process stays in the scratch
        folder and what it writes relative to its new folder lands there, as in the job. Entered through the link,
        the process's folder was the working folder's own, and every write there was refused (a Hydra-style
        ``os.chdir("outputs")``)."""
        where = self._absolute(path)
        if where is None or not _under(where, self.scratch):
            return
        inside = where.relative_to(self.scratch)
        if inside.parts:
            self.busy = True
            try:
                self._copy_on_write(inside, "modify")
            finally:
                self.busy = False

    def writing(self, path: Any, how: str) -> None:
        """Before a write to ``path``: make it land in the scratch folder, or refuse it."""
        where = self._absolute(path)
        if where is None or _under(where, *(Path(p) for p in _SYSTEM)):
            return
        bytecode = "__pycache__" in where.parts
        if _under(where, self.scratch):
            inside = where.relative_to(self.scratch)
            if not bytecode and inside.parts:
                self._note_write(inside.as_posix())
                self.busy = True
                try:
                    self._copy_on_write(inside, how)
                finally:
                    self.busy = False
            return
        real = Path(os.path.realpath(where))
        if any(_under(real, folder) for folder in self.protected):
            if not bytecode:
                self._note_write(self._shown(real))
            raise PermissionError(
                13,
                f"autobatch: a probe does not write into your folders (a tune leaves your files as they were), and "
                f"{real} is reached by a path other than one relative to the working folder, which cannot be "
                "redirected to the probe's scratch folder; write relative to the working folder, or to a folder "
                "that is neither it nor the script's",
                str(path),
            )
        self.own.add(real)
        if not bytecode and not _under(real, *self.caches):
            self._note_write(str(real))  # not redirected: listed

    def reading(self, path: Any, mode: Any = None) -> None:
        try:
            where = os.path.abspath(os.fsdecode(os.fspath(path)))
        except TypeError:
            return
        if where in self.looked_at:  # a data loader opens its files again and again: decided once
            return
        self.looked_at.add(where)
        real = Path(os.path.realpath(where))
        if _under(real, self.scratch) and isinstance(mode, str) and not os.path.lexists(where):
            # a file opened where the working folder has none (an optional config it tries): read as absent;
            # not a descriptor-relative ``os.open`` (``shutil.rmtree``'s, whose names this cannot place)
            real = self.user / real.relative_to(self.scratch)
        if _under(real, self.scratch) or real in self.own or "__pycache__" in real.parts:
            return  # the script's own files
        if self._installed(real):
            return
        if not any(_under(real, folder) for folder in self.protected) and self._not_an_input(real):
            return
        shown = self._shown(real)
        if shown not in self.read:
            self.read.add(shown)
            self.outcome.files_read[shown] = None  # the tuner fingerprints it

    def sources(self, outcome: ProbeOutcome) -> None:
        """List on ``outcome``, as files read, the Python sources of the user's own modules this process ran:
        every imported module whose file is not an installed package's, the interpreter's or autobatch's, nor in a
        cache (:meth:`_not_an_input`). The script's folder and the working folder are followed through their
        imports before any probe (:func:`autobatch.cache.sources.source_digests`); this adds what that cannot
        see: a module found on ``PYTHONPATH``, a project installed for development (its sources outside
        ``site-packages``), one imported under a name computed at run time, and those the probe server imported
        before it forked (a module outside the script's folder reads as a library's: warmed, never opened
        here)."""
        installed = tuple(f"{os.sep}{marker}{os.sep}" for marker in INSTALLED_MARKERS)
        interpreter = tuple(f"{prefix}{os.sep}" for prefix in self.prefixes)
        for module in list(sys.modules.values()):
            path = getattr(module, "__file__", None)
            if not isinstance(path, str) or not path.endswith(".py") or not os.path.isabs(path):
                continue  # no source, or a name and no path (torch.ops's "_ops.py")
            if path.startswith(interpreter) or any(marker in path for marker in installed):
                continue  # most of them, torch's and Python's own, told by their path alone
            real = Path(os.path.realpath(path))
            if _under(real, self.scratch) or self._installed(real) or self._not_an_input(real):
                continue
            outcome.files_read.setdefault(self._shown(real), None)

    def report(self, outcome: ProbeOutcome) -> ProbeOutcome:
        """``outcome`` with what this watch saw (when it listed on another outcome)."""
        if outcome is not self.outcome:
            outcome.files_read.update(self.outcome.files_read)
            outcome.files_written.extend(
                p for p in self.outcome.files_written if p not in outcome.files_written
            )
        return outcome

    # -- helpers --------------------------------------------------------------------------------

    def _installed(self, real: Path) -> bool:
        """An installed package's file or the interpreter's, wherever it sits: a ``.venv`` inside the working
        folder (as uv and Poetry make it) holds no input of the script's (the result's interpreter key covers
        what is installed), nor does autobatch's own package or a development install's metadata beside the
        sources, and importlib's search for package metadata that is not there is no read of the script's. A
        prefix that holds the working folder (a project under ``/usr``) does not count."""
        if in_site_folder(real) or any(p.endswith(_METADATA) for p in real.parts):
            return True
        return any(_under(real, prefix) for prefix in [*self.prefixes, _AUTOBATCH])

    def _not_an_input(self, real: Path) -> bool:
        """Python's, the system's, or in the temporary folder (libraries' caches, such as compilers')."""
        return any(_under(real, folder) for folder in [*self.skipped, self.caches[0]])

    def _absolute(self, path: Any) -> Path | None:
        try:
            text = os.fsdecode(os.fspath(path))
        except TypeError:
            return None
        return Path(os.path.abspath(text))  # lexical: a link along the path is the point

    def _shown(self, real: Path) -> str:
        """A path as the outcome reports it: relative to the working folder inside it, else absolute."""
        return real.relative_to(self.user).as_posix() if _under(real, self.user) else str(real)

    def _note_write(self, shown: str) -> None:
        if shown not in self.written:
            self.written.add(shown)
            self.outcome.files_written.append(shown)

    def _copy_on_write(self, inside: Path, how: str) -> None:
        """Replace the links along ``inside`` (relative to the scratch folder) that the write would follow."""
        current = self.scratch
        parts = inside.parts
        for index, part in enumerate(parts):
            current = current / part
            last = index == len(parts) - 1
            if not current.is_symlink():
                if not current.exists():
                    return
                continue
            target = Path(os.path.realpath(current))
            try:  # another rank of the probe may be copying the same link
                if target.is_dir() and (not last or how in ("rmtree", "modify")):
                    current.unlink()
                    current.mkdir()
                    for entry in os.listdir(target):
                        (current / entry).symlink_to(target / entry)
                elif last and target.is_file() and how in ("truncate", "modify"):
                    current.unlink()
                    if how == "modify":
                        shutil.copy2(target, current)
            except (FileExistsError, FileNotFoundError):
                continue
            # a link the write replaces or removes (rename, remove) is the scratch folder's own: left as it is


def install(outcome: ProbeOutcome, script: Path | None) -> ScriptFiles:
    """Run the rest of this probe from a scratch folder that mirrors the working folder, watched (see the
    module docstring): the process's working folder changes to it, and what the script reads and writes is
    listed on ``outcome``. ``script``: the script's file (its folder is protected too), None for a step that
    is not a file."""
    global _watch
    user, scratch = scratch_folder()
    files = _watch = ScriptFiles(outcome, script, user, scratch)
    os.chdir(scratch)
    os.environ["PWD"] = str(scratch)
    sys.addaudithook(files.audit)
    _wrap_torch_save(files)
    return files


def scratch_folder() -> tuple[Path, Path]:
    """(the working folder, the probe's scratch folder): made on the first call of a probe, which the processes
    it starts then share (the ranks of a probe, a fresh process), as the job's processes share its folder."""
    user = Path(os.environ.get(WORKING_ENV) or Path.cwd()).resolve()
    shared = os.environ.get(SHARED_ENV)
    if shared and os.path.isdir(shared):
        return user, Path(shared)
    root = os.environ.get(SCRATCH_ENV)
    scratch = Path(tempfile.mkdtemp(prefix="scratch-", dir=root if root and os.path.isdir(root) else None))
    for entry in os.listdir(user):
        (scratch / entry).symlink_to(user / entry)
    os.environ.update({WORKING_ENV: str(user), SHARED_ENV: str(scratch.resolve())})
    return user, scratch.resolve()


def note_sources(outcome: ProbeOutcome) -> None:
    """:meth:`ScriptFiles.sources` of this probe process's watch onto ``outcome`` as it is reported (none
    without a watch: a process that runs no script of the user's)."""
    if _watch is not None:
        _watch.sources(outcome)


def install_for(init: dict[str, Any]) -> ScriptFiles:
    """:func:`install` for a probe of the step the probe server's ``init`` names; what it sees is copied onto
    the probe's outcome by :meth:`ScriptFiles.report`."""
    script = init["script"]
    target = Path(str(script.get("target") if isinstance(script, dict) else script))
    return install(ProbeOutcome(kind="fits"), target if target.suffix == ".py" and target.is_file() else None)


def _wrap_torch_save(files: ScriptFiles) -> None:
    """``torch.save`` to a path opens it in C++, where no audit event fires: the same check, first."""
    import torch
    import torch.serialization

    original: Callable[..., Any] = torch.serialization.save

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(f, (str, bytes, os.PathLike)):
            files.writing(f, "truncate")
        return original(obj, f, *args, **kwargs)

    torch.save = torch.serialization.save = save  # type: ignore[assignment]


def scratch_root(under: str | None) -> str:
    """A new folder for one probe's scratch folders, in the folder ``under`` (the client's, which it removes
    with the server: a probe whose server was killed leaves nothing behind; None: the temporary folder, for
    the job's fresh processes the command starts itself); whoever made it removes it once the probe ended
    (:func:`remove_root`)."""
    return tempfile.mkdtemp(prefix="autobatch-files-", dir=under if under and os.path.isdir(under) else None)


def remove_root(root: str) -> None:
    shutil.rmtree(root, ignore_errors=True)


#: The longest folder name multiprocessing's sockets fit under: a socket's path holds 107 bytes, and
#: multiprocessing names one ``listener-XXXXXXXX`` in a ``pymp-XXXXXXXX`` folder of its own.
SOCKET_ROOM = 107 - len("/pymp-XXXXXXXX/listener-XXXXXXXX")
#: Where the sockets go when neither the client's folder nor the temporary folder leaves them room.
SHORT_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm")


def multiprocessing_folder(under: str | None) -> str:
    """A new folder for what the script's ``multiprocessing`` keeps in one (its ``pymp-*`` folder: the sockets
    of a ``DataLoader``'s tensor sharing, a forkserver's, a manager's), made before a probe starts and removed
    by whoever made it once the probe ended (:func:`remove_root`). multiprocessing makes that folder when first
    asked and removes it at the process's normal exit, which a probe, ended by ``os._exit``, never reaches:
    each probe of a script with ``DataLoader`` workers left one in the temporary folder. In the first folder
    whose name leaves the sockets room: ``under`` (the client's, removed with it however the tune ends), the
    temporary folder (where multiprocessing would have made it), a short system one (a deeper path hangs a
    ``DataLoader``'s workers: the socket's name does not fit; :func:`deep_temp_note` tells the user); else
    the temporary folder all the same."""
    for folder in (under, tempfile.gettempdir(), *SHORT_FOLDERS):
        if (
            folder
            and len(folder) <= SOCKET_ROOM
            and os.path.isdir(folder)
            and os.access(folder, os.W_OK | os.X_OK)
        ):
            return tempfile.mkdtemp(prefix="pymp-", dir=folder)
    return tempfile.mkdtemp(prefix="pymp-")


def deep_temp_note() -> str | None:
    """The warning for a temporary folder too deep for multiprocessing's sockets (None: it leaves them room)."""
    where = tempfile.gettempdir()
    if len(where) <= SOCKET_ROOM:
        return None
    return (
        f"the temporary folder ({where}, {len(where)} characters; TMPDIR) leaves multiprocessing's sockets no room "
        f"(a socket's path holds 107 bytes, {SOCKET_ROOM} for the folder): a DataLoader with workers cannot bind "
        "one under it and hangs, in your job as it would in a probe. Probes put theirs in a short folder; run the "
        "job with a shorter TMPDIR (export TMPDIR=/tmp)"
    )


def use_multiprocessing_folder(folder: str) -> None:
    """In a probe: ``multiprocessing`` keeps its files in ``folder`` (the configuration its
    ``util.get_temp_dir`` reads, inherited by the processes the probe forks)."""
    import multiprocessing.process

    multiprocessing.process.current_process()._config["tempdir"] = folder  # type: ignore[attr-defined]


def written_note(written: list[str], shown: int = 8) -> str | None:
    """The note that lists what the script tried to write (None: nothing)."""
    if not written:
        return None
    more = f" and {len(written) - shown} more" if len(written) > shown else ""
    return (
        f"the script wrote {', '.join(written[:shown])}{more} during the probes: writes into the working folder "
        "went to a scratch folder, removed after each probe, and one by an absolute path into it or into the "
        "script's folder is refused, so your files there are as they were"
    )


def _is_path(value: Any) -> bool:
    return isinstance(value, (str, bytes, os.PathLike))


def _writes(mode: Any, flags: Any) -> bool:
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


def _truncates(mode: Any, flags: Any) -> bool:
    if isinstance(mode, str):
        return "w" in mode
    return isinstance(flags, int) and bool(flags & os.O_TRUNC)


def _under(path: Path, *folders: Path) -> bool:
    return any(path == folder or folder in path.parents for folder in folders)


def _caches() -> list[Path]:
    """The temporary folder and the user's cache folder: libraries' caches (compilers', downloads')."""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return [Path(tempfile.gettempdir()).resolve(), Path(home).resolve()]
