"""One tuner per device: a lock keyed by the device's identity, which a killed process cannot leave held.

Two runs aimed at the same device (two tunes, a tune and a ``check``) never probe at the same time:
the one that comes second waits, and says what it waits for, who holds it and since when. The lock
is keyed by the GPU's UUID (a MIG instance's own UUID; two instances of one GPU do not share a lock)
or, for the CPU device, the host name (:mod:`autobatch.devices.selection`).

The lock is ``flock`` on a file (filelock) in the ``lock_dir`` setting's folder, by default
``$TMPDIR/autobatch-locks`` (created world-writable with the sticky bit, as /tmp is, so that every user
of a node shares it). The kernel releases ``flock`` when its holder dies, however it dies (SIGKILL,
an out-of-memory kill, a node's scheduler ending the job), so a lock is never left held. Beside it,
``KEY.holder.json`` says who holds it (PID, host, command, since when), for the waiting run's
message; a stale one is never trusted, only shown while the lock is really held.

A folder that cannot be created or locked leaves the run working, with a warning: it then probes
without the guarantee.

One run per result file: :class:`OutputLock` holds ``.NAME.lock`` beside a tune's result file for the
whole run (in the result's own folder, so that nodes sharing the storage see it too); a second run
writing the same file waits, saying for whom, and gives up after ``lock_timeout`` with exit 2.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Callable

from autobatch.errors import DeviceError, UsageError

#: Seconds between "still waiting" messages.
REPORT_EVERY = 60.0
#: Seconds each blocking attempt waits (the loop checks the timeout and reports between attempts).
POLL = 1.0


def default_lock_dir() -> Path:
    return Path(tempfile.gettempdir()) / "autobatch-locks"


class DeviceLock:
    """``with DeviceLock(key, label): ...`` holds the device for the block; see the module docstring."""

    def __init__(
        self,
        key: str,
        label: str,
        *,
        folder: str | Path | None = None,
        timeout: float | None = None,
        on_wait: Callable[[str], None] | None = None,
        on_warning: Callable[[str], None] | None = None,
        command: str | None = None,
    ) -> None:
        self.key, self.label = key, label
        self.folder = Path(folder) if folder else default_lock_dir()
        self.timeout = timeout
        self.on_wait = on_wait or (lambda _m: None)
        self.on_warning = on_warning or (lambda _m: None)
        self.command = command or " ".join(["autobatch", *sys.argv[1:]])
        self.waited: float = 0.0
        self._lock: Any = None

    @property
    def path(self) -> Path:
        return self.folder / f"{self.key}.lock"

    @property
    def holder_path(self) -> Path:
        return self.folder / f"{self.key}.holder.json"

    def __enter__(self) -> DeviceLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def acquire(self) -> None:
        import filelock

        try:
            _make_shared_folder(self.folder)
            lock = filelock.FileLock(str(self.path), mode=0o666)
            if not self._try(lock, 0):
                self._wait(lock)
        except OSError as exc:
            self.on_warning(
                f"cannot lock {self.label} in {self.folder} ({exc.strerror or exc}): probing without the "
                "one-tuner-per-device guarantee; set lock_dir to a writable local folder"
            )
            return
        self._lock = lock
        self._write_holder()

    def release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is None:
            return
        try:
            if _read_json(self.holder_path).get("pid") == os.getpid():
                self.holder_path.unlink()
        except OSError:
            pass
        lock.release()

    def _try(self, lock: Any, seconds: float) -> bool:
        import filelock

        try:
            lock.acquire(timeout=seconds)
            return True
        except filelock.Timeout:
            return False

    def _wait(self, lock: Any) -> None:
        started = time.monotonic()
        holder = self._holder()
        for _ in range(10):  # the holder writes who it is just after it took the lock
            if holder.get("pid") or self._try(lock, 0.1):
                break
            holder = self._holder()
        else:
            holder = {}
        if not lock.is_locked:
            self.on_wait(f"waiting for {self.label}: {describe_holder(holder)}")
        next_report = started + REPORT_EVERY
        while not lock.is_locked and not self._try(lock, POLL):
            now = time.monotonic()
            if self.timeout is not None and now - started >= self.timeout:
                raise DeviceError(
                    f"{self.label} stayed busy for {self.timeout:g} s: "
                    + describe_holder(_read_json(self.holder_path)),
                    hint="wait for the other run to finish, or raise lock_timeout (--lock-timeout)",
                )
            if now >= next_report:
                self.on_wait(f"still waiting for {self.label} ({_duration(now - started)})")
                next_report += REPORT_EVERY
        self.waited = time.monotonic() - started
        if self.waited >= 1.0:
            self.on_wait(f"{self.label} is free after {_duration(self.waited)}")

    def _holder(self) -> dict[str, Any]:
        return _live_holder(self.holder_path)

    def _write_holder(self) -> None:
        from autobatch.records.files import write_atomic

        now = datetime.datetime.now().astimezone().replace(microsecond=0)
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": self.command,
            "since": now.isoformat(),
        }
        try:
            write_atomic(self.holder_path, json.dumps(holder) + "\n")
            os.chmod(self.holder_path, 0o644)
        except OSError:
            pass  # only the message of a waiting run is poorer


def describe_holder(holder: dict[str, Any]) -> str:
    """ "held by pid 123 on node7 (autobatch tune train.py) since 10:03:04, 2 min ago"."""
    if not holder.get("pid"):
        return "held by another run (who and since when is not recorded)"
    since = str(holder.get("since", ""))
    ago = ""
    try:
        then = datetime.datetime.fromisoformat(since)
        ago = ", " + _duration((datetime.datetime.now(then.tzinfo) - then).total_seconds()) + " ago"
        since = then.strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        pass
    command = f" ({holder['command']})" if holder.get("command") else ""
    return f"held by pid {holder['pid']} on {holder.get('host', '?')}{command} since {since}{ago}"


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _make_shared_folder(folder: Path) -> None:
    if folder.is_dir():
        return
    folder.mkdir(parents=True, exist_ok=True)
    try:
        os.chmod(folder, 0o1777)
    except OSError:
        pass


class OutputLock:
    """One run per result file: ``with OutputLock(path): ...`` holds ``.NAME.lock`` beside the file.

    The lock is ``flock`` on a file in the result's own folder, so runs on other nodes that write the
    same file on shared storage see it too (as the cache folder's lock does), and the kernel releases it
    however its holder dies. The lock file holds who holds it (PID, host, command, since when) and is
    removed on release (before it is unlocked, so a run that took a removed file sees it and takes the
    new one): nothing is left beside the result. A second run waits, saying for whom, at most
    ``timeout`` seconds (None: as long as it takes), then fails with a
    :class:`~autobatch.errors.UsageError` (exit 2) naming the holder. A folder where the lock cannot be
    taken leaves the run working, with a warning.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        timeout: float | None = None,
        on_wait: Callable[[str], None] | None = None,
        on_warning: Callable[[str], None] | None = None,
        command: str | None = None,
    ) -> None:
        self.target = Path(path)
        self.label = f"the result file {self.target}, which another run writes"
        self.timeout = timeout
        self.on_wait = on_wait or (lambda _m: None)
        self.on_warning = on_warning or (lambda _m: None)
        self.command = command or " ".join(["autobatch", *sys.argv[1:]])
        self.waited: float = 0.0
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.target.absolute().parent / f".{self.target.name}.lock"

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = self._take()
            self._fd = fd if fd is not None else self._wait()
        except (OSError, ImportError) as exc:
            self.on_warning(
                f"cannot lock {self.target} ({getattr(exc, 'strerror', None) or exc}): writing it without "
                "the one-run-per-result-file guarantee"
            )
            return
        now = datetime.datetime.now().astimezone().replace(microsecond=0)
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": self.command,
            "since": now.isoformat(),
        }
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, (json.dumps(holder) + "\n").encode(), 0)
        except OSError:
            pass  # opened read-only (another user's file): only a waiting run's message is poorer

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            self.path.unlink()
        except OSError:
            pass
        os.close(fd)

    def _take(self) -> int | None:
        """The locked file's descriptor, or None while another run holds it."""
        import fcntl  # POSIX; elsewhere the ImportError below leaves the run unlocked, with a warning

        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except PermissionError:
                fd = os.open(self.path, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    return None
                raise
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)  # its holder removed it as this run took it: take the one there now

    def _wait(self) -> int:
        started = time.monotonic()
        holder = self._holder()
        for _ in range(10):  # the holder writes who it is just after it took the lock
            if holder.get("pid"):
                break
            time.sleep(0.1)
            holder = self._holder()
        self.on_wait(f"waiting for {self.label}: {describe_holder(holder)}")
        next_report = started + REPORT_EVERY
        while (fd := self._take()) is None:
            now = time.monotonic()
            if self.timeout is not None and now - started >= self.timeout:
                raise UsageError(
                    f"another run writes the result file {self.target} ({describe_holder(self._holder())}); "
                    f"gave up after {self.timeout:g} s",
                    hint="give each run its own --output (or [output] result), or wait for the other run "
                    "to finish (raise lock_timeout, --lock-timeout)",
                )
            if now >= next_report:
                self.on_wait(f"still waiting for {self.label} ({_duration(now - started)})")
                next_report += REPORT_EVERY
            time.sleep(POLL / 4)
        self.waited = time.monotonic() - started
        self.on_wait(f"the result file {self.target} is free after {_duration(self.waited)}")
        return fd

    def _holder(self) -> dict[str, Any]:
        return _live_holder(self.path)


def _live_holder(path: Path) -> dict[str, Any]:
    """Who holds a lock, as its holder wrote it in ``path`` (empty when unknown or when that process is gone)."""
    holder = _read_json(path)
    pid = holder.get("pid")
    if isinstance(pid, int) and holder.get("host") == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return {}
        except PermissionError:
            pass  # alive, another user's
    return holder
