"""The locks a run holds while it works: one tuner per device, one run per result file.

One class, :class:`RunLock` (``flock`` through filelock, released by the kernel however its holder dies),
with a ``*.holder.json`` beside it saying who holds it: :meth:`RunLock.device` (keyed by the GPU's UUID or,
on the CPU, the host; giving up is exit 7) and :meth:`RunLock.result_file` (``.NAME.lock`` beside a tune's
result file, removed at the end; giving up is exit 2). The second run waits and says for whom, up to
``lock_timeout``. Where and why: docs/clusters.md.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from autobatch.errors import AutobatchError, DeviceError, UsageError
from autobatch.records.node import node_temp
from autobatch.records.result import Circumstance

#: Seconds between "still waiting" messages.
REPORT_EVERY = 60.0
#: Seconds each blocking attempt waits (the loop checks the timeout and reports between attempts).
POLL = 1.0


def default_lock_dir() -> Path:
    """``autobatch-locks`` in the node's temporary folder, whatever ``TMPDIR`` says (:mod:`autobatch.records.node`): a
    scheduler that gives each job a ``TMPDIR`` of its own (or pam_tmpdir, each user) would give each run a lock
    folder of its own, and two runs would probe one device at once."""
    return node_temp() / "autobatch-locks"


@dataclass(frozen=True)
class _Use:
    """What one kind of lock says and does that the other does not."""

    waits_for: str  # "waiting for ...", "still waiting for ..."
    name: str  # "... is free after"
    unguarded: str  # the warning when it cannot be taken, with ``{why}``
    busy: Callable[
        [float, dict[str, Any]], AutobatchError
    ]  # the error after ``timeout`` seconds, given the holder
    removed: bool  # the lock file goes with its holder (else it stays, shared by every run on the device)


class RunLock:
    """``with RunLock.device(key, label): ...`` or ``RunLock.result_file(path)``: held for the block; see the
    module docstring."""

    def __init__(
        self,
        path: Path,
        use: _Use,
        *,
        timeout: float | None = None,
        on_wait: Callable[[str], None] | None = None,
        on_warning: Callable[[str], None] | None = None,
        command: str | None = None,
    ) -> None:
        self.path, self.use = path, use
        self.holder_path = path.with_name(path.name.removesuffix(".lock") + ".holder.json")
        self.timeout = timeout
        self.on_wait = on_wait or (lambda _m: None)
        self.on_warning = on_warning or (lambda _m: None)
        self.command = command or " ".join(["autobatch", *sys.argv[1:]])
        self.waited: float = 0.0
        self._lock: Any = None

    @classmethod
    def device(
        cls,
        key: str,
        label: str,
        *,
        folder: str | Path | None = None,
        waits_for: str | None = None,
        **options: Any,
    ) -> RunLock:
        """The lock of the device (or other shared thing) ``key``, named ``label`` in messages ("LABEL is free
        after 12 s"), and ``waits_for`` where a run waits for it (default ``label``: "waiting for WAITS_FOR:
        held by ..."), in ``folder`` (default: :func:`default_lock_dir`, made shared). ``options``: timeout,
        on_wait, on_warning, command."""
        where = Path(folder) if folder else default_lock_dir()

        def busy(timeout: float, holder: dict[str, Any]) -> AutobatchError:
            return DeviceError(
                f"{label} stayed busy for {timeout:g} s: {describe_holder(holder)}",
                hint="wait for the other run to finish, or raise lock_timeout (--lock-timeout)",
            )

        use = _Use(
            waits_for=waits_for or label,
            name=label,
            unguarded=f"cannot lock {label} in {where} ({{why}}): probing without the one-tuner-per-device "
            "guarantee; set lock_dir to a writable local folder",
            busy=busy,
            removed=False,
        )
        return cls(where / f"{key}.lock", use, **options)

    @classmethod
    def result_file(cls, path: str | Path, **options: Any) -> RunLock:
        """One run per result file ``path``: ``.NAME.lock`` beside it. ``options``: as :meth:`device`'s."""
        target = Path(path)

        def busy(timeout: float, holder: dict[str, Any]) -> AutobatchError:
            return UsageError(
                f"another run writes the result file {target} ({describe_holder(holder)}); "
                f"gave up after {timeout:g} s",
                hint="give each run its own --output (or [output] result), or wait for the other run "
                "to finish (raise lock_timeout, --lock-timeout)",
            )

        use = _Use(
            waits_for=f"the result file {target}, which another run writes",
            name=f"the result file {target}",
            unguarded=f"cannot lock {target} ({{why}}): writing it without the one-run-per-result-file guarantee",
            busy=busy,
            removed=True,
        )
        return cls(target.absolute().parent / f".{target.name}.lock", use, **options)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def acquire(self) -> None:
        import filelock

        self._report("queued")
        try:
            _make_folder(self.path.parent, shared=not self.use.removed)
            lock = filelock.FileLock(str(self.path), mode=0o666)
            while True:
                if not self._try(lock, 0):
                    self._wait(lock)
                if self.path.exists():
                    break
                lock.release()  # its holder removed the file as this run took it: take the one there now
        except OSError as exc:
            self.on_warning(Circumstance(self.use.unguarded.format(why=exc.strerror or exc)))
            return
        self._lock = lock
        self._write_holder()
        self._report("running")

    def release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is None:
            return
        self._report("released")  # before it is: a report of the next holder's "running" always comes later
        try:
            if _read_json(self.holder_path).get("pid") == os.getpid():
                self.holder_path.unlink()
            if self.use.removed:
                self.path.unlink()  # before it is unlocked: a run that took the removed file sees it gone
        except OSError:
            pass
        lock.release()

    def _report(self, state: str) -> None:
        """Tell the daemon, when it runs this command, where it stands in the device's queue."""
        if not self.use.removed:
            from autobatch.records import daemon_events as events

            events.report(state, self.use.name)

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
        if lock.is_locked:
            return
        self.on_wait(f"waiting for {self.use.waits_for}: {describe_holder(holder)}")
        next_report = started + REPORT_EVERY
        while not self._try(lock, POLL):
            now = time.monotonic()
            if self.timeout is not None and now - started >= self.timeout:
                raise self.use.busy(self.timeout, _read_json(self.holder_path))
            if now >= next_report:
                self.on_wait(f"still waiting for {self.use.waits_for} ({_duration(now - started)})")
                next_report += REPORT_EVERY
        self.waited = time.monotonic() - started
        self.on_wait(f"{self.use.name} is free after {_duration(self.waited)}")

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


def _make_folder(folder: Path, shared: bool) -> None:
    """Create ``folder``; a ``shared`` one world-writable with the sticky bit, as /tmp is."""
    if folder.is_dir():
        return
    folder.mkdir(parents=True, exist_ok=True)
    if shared:
        try:
            os.chmod(folder, 0o1777)
        except OSError:
            pass


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
