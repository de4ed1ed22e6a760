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

import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

Warn = Callable[[str], None]

LOCK_NAME = ".autobatch-cache.lock"
#: Seconds a writer waits for another process's write (writes are single lines or small files).
LOCK_TIMEOUT = 120.0


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
        """Report a problem once per folder (the run goes on)."""
        if message in self._warned:
            return
        self._warned.add(message)
        if self._warn is not None:
            self._warn(message)

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
