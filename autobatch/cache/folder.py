"""One cache folder: where it is, its lock, and what happens when it cannot be written or a file is damaged.

Every write (a journal line, a stored result, a file moved aside, a clear) happens under one lock per
folder, ``.autobatch-cache.lock`` (filelock: ``flock`` on Linux, which the kernel releases when the
holder dies, so a killed run never leaves it held). Readers tolerate a line being appended while they
read. On a shared file system the folder needs working ``flock`` (NFSv4 does; Lustre needs the
``flock`` mount option); otherwise point ``cache_dir`` at node-local storage.

A folder that cannot be created or written leaves the run working: one warning, then whatever is
already there is read and nothing new is kept. A damaged file is renamed to
``NAME.corrupt-YYYYmmdd-HHMMSS`` with a warning, and the entry is rebuilt by the run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from autobatch.records.result import Circumstance

Warn = Callable[[str], None]

LOCK_NAME = ".autobatch-cache.lock"
#: Seconds a writer waits for another process's write (writes are single lines or small files).
LOCK_TIMEOUT = 120.0


def stamp() -> str:
    """Now, as the cache's entries record when they were made: UTC, ISO 8601, to the second."""
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def default_folder() -> Path:
    """``<user cache>/autobatch/probes`` (platformdirs)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("autobatch")) / "probes"


def inductor_folder() -> str:
    """Where compiled probes keep inductor's caches, shared by every probe and tune of this user
    (``AUTOBATCH_INDUCTOR_CACHE`` when set, else ``<user cache>/autobatch/inductor``)."""
    import platformdirs

    return os.environ.get("AUTOBATCH_INDUCTOR_CACHE") or str(
        Path(platformdirs.user_cache_dir("autobatch")) / "inductor"
    )


class CacheFolder:
    """The folder of the probe journals and stored results (``path`` None: the user cache folder)."""

    def __init__(self, path: str | Path | None = None, warn: Warn | None = None) -> None:
        self.path = Path(path) if path else default_folder()
        self._warn = warn
        self._writable: bool | None = None
        self._warned: set[str] = set()

    def warn(self, message: str) -> None:
        """Report a problem once per folder (the run goes on): a circumstance of this run, which a result served
        from the cache later says as this run's."""
        if message in self._warned:
            return
        self._warned.add(message)
        if self._warn is not None:
            self._warn(Circumstance(message))

    @property
    def writable(self) -> bool:
        """Whether the folder exists (created if need be) and a file can be written in it."""
        if self._writable is None:
            self._writable = self._try_write()
        return self._writable

    def _try_write(self) -> bool:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            with open(self.path / LOCK_NAME, "a"):
                pass
            return True
        except OSError as exc:
            self.unwritable(exc)
            return False

    def unwritable(self, exc: BaseException) -> None:
        """Stop writing: the folder (or a file in it) cannot be written; warn once."""
        self._writable = False
        self.warn(
            f"the cache folder {self.path} cannot be written ({_reason(exc)}): this run keeps no probes "
            "for the next one; set cache_dir (AUTOBATCH_CACHE_DIR) to a writable folder"
        )

    def lock(self) -> AbstractContextManager[object]:
        """The folder's write lock (a no-op when the folder cannot be written)."""
        if not self.writable:
            return nullcontext()
        return _locked(self)

    def move_aside(self, file: Path, why: str) -> None:
        """Rename a damaged file out of the way (with a warning); the run rebuilds the entry."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = file.with_name(f"{file.name}.corrupt-{stamp}")
        try:
            with self.lock():
                if file.exists():
                    os.replace(file, target)
            where = f"moved aside to {target.name}"
        except OSError as exc:
            where = f"could not be moved aside ({_reason(exc)}) and is ignored"
        self.warn(f"the cache file {file} is damaged ({why}): {where}; it is rebuilt by this run")

    def read_json(self, path: Path, what: str) -> Any:
        """The JSON document in ``path``, ``what`` it holds named in messages; None when there is none, when it
        cannot be read (a warning) or is not JSON (moved aside)."""
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.warn(f"cannot read the {what} {path}: {exc}")
            return None
        except ValueError as exc:
            self.move_aside(path, f"not JSON: {exc}")
            return None

    def write_json(self, path: Path, document: Any) -> Path | None:
        """Write ``document`` to ``path`` at once (atomically), under the folder's lock; None when the folder
        cannot be written."""
        if not self.writable:
            return None
        from autobatch.records.files import write_atomic

        try:
            with self.lock():
                return write_atomic(path, json.dumps(document, indent=1) + "\n")
        except OSError as exc:
            self.unwritable(exc)
            return None

    @staticmethod
    def touch(path: Path) -> None:
        """Mark an entry used now: ``cache clear --older-than`` counts from its last use."""
        try:
            os.utime(path)
        except OSError:
            pass

    def files(self, pattern: str) -> list[Path]:
        """The folder's files matching ``pattern`` (none when the folder does not exist)."""
        if not self.path.is_dir():
            return []
        return sorted(p for p in self.path.glob(pattern) if p.is_file())


@contextmanager
def _locked(folder: CacheFolder) -> Iterator[object]:
    import filelock

    lock = filelock.FileLock(str(folder.path / LOCK_NAME))
    try:
        lock.acquire(timeout=LOCK_TIMEOUT)
    except filelock.Timeout:
        folder.warn(
            f"the cache folder {folder.path} stayed locked for {LOCK_TIMEOUT:g} s; writing without the lock"
        )
        yield None
        return
    except OSError as exc:  # a file system without flock
        folder.warn(
            f"the cache folder {folder.path} cannot be locked ({_reason(exc)}); writing without the lock"
        )
        yield None
        return
    try:
        yield lock
    finally:
        lock.release()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"
