"""Fault injection against the real command (issue #10): a probe killed, segfaulting, hanging or exhausting
memory; the probe server killed; the tune killed with SIGKILL, SIGINT, SIGTERM or SIGHUP; the script edited
between probes. Each run watches the whole process tree of the tune (psutil, by pid, never by name) and
reports the processes that outlived it and the probes it lost (measured before the fault, in neither
the final result nor the probe journal).

Used by ``tests/reliability/test_faults.py`` (slow) and ``scripts/reliability.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .catalogue import BAD, ROOT

SMALL = ("--device", "cpu", "--memory", "1GiB", "-p", "32-true", "-o", "sgd", "--no-recompute")


@dataclass
class FaultRun:
    name: str
    code: int
    stderr: str
    stray: list[int]  # pids of the tune's tree still alive after it ended
    lost: int  # probes measured before the fault that neither the result nor the journal kept
    result: dict[str, object] = field(default_factory=dict)
    seconds: float = 0.0


class Tree:
    """Every process that was ever a descendant of ``root`` while watched."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.seen: dict[int, float] = {}  # pid -> create time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.snapshot()
            time.sleep(0.05)

    def snapshot(self) -> list[psutil.Process]:
        try:
            found = psutil.Process(self.root).children(recursive=True)
        except psutil.Error:
            return []
        for proc in found:
            try:
                self.seen.setdefault(proc.pid, proc.create_time())
            except psutil.Error:
                pass
        return found

    def server(self) -> psutil.Process | None:
        for proc in self.snapshot():
            try:
                if proc.ppid() == self.root:
                    return proc
            except psutil.Error:
                pass
        return None

    def probes(self) -> list[psutil.Process]:
        server = self.server()
        if server is None:
            return []
        try:
            return server.children()
        except psutil.Error:
            return []

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def alive(self, grace: float = 3.0) -> list[int]:
        """The pids seen that still run (the same process: same create time; zombies do not count)."""
        deadline = time.monotonic() + grace
        while True:
            left = []
            for pid, created in self.seen.items():
                try:
                    proc = psutil.Process(pid)
                    if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                        left.append(pid)
                except psutil.Error:
                    pass
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)


def probes_in(folder: Path) -> set[tuple[object, ...]]:
    """The probes the result file in ``folder`` holds (combination, batch, steps, kind)."""
    try:
        data = json.loads((folder / "autobatch-result.json").read_text())
    except (OSError, ValueError):
        return set()
    return {
        (c["precision"], c["optimizer"], c["recompute"], p["batch_size"], p["steps"], p["kind"])
        for c in data.get("combinations", [])
        for p in c.get("trace", [])
        if p["kind"] in ("fits", "oom")
    }


def journaled(cache: Path) -> set[tuple[object, ...]]:
    """The (combination, batch, kind) of every probe in the journal files under ``cache``."""
    out: set[tuple[object, ...]] = set()
    for path in cache.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if "key" not in entry:  # the journal's first line describes it ({"meta": ...})
                continue
            precision, optimizer, recompute, batch, _min, _max = json.loads(entry["key"])
            out.add((precision, optimizer, recompute, batch, entry["outcome"]["kind"]))
    return out


def run_fault(
    name: str,
    folder: Path,
    script: str,
    inject: Callable[[subprocess.Popen[str], Tree, Path], None] | None = None,
    *,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> FaultRun:
    """Run `autobatch tune SCRIPT` in ``folder``; ``inject(proc, tree, folder)`` runs in a thread."""
    cache = folder / "cache"
    full_env = {
        **os.environ, "NO_COLOR": "1", "COLUMNS": "200", "PYTHONPATH": str(ROOT),
        "AUTOBATCH_CACHE_DIR": str(cache), **(env or {}),
    }  # fmt: skip
    argv = [sys.executable, "-m", "autobatch", "tune", script, *SMALL, *extra]
    started = time.perf_counter()
    with open(folder / "stderr.txt", "w+") as err:
        proc = subprocess.Popen(
            argv, cwd=folder, env=full_env, stdout=subprocess.DEVNULL, stderr=err, text=True
        )
        tree = Tree(proc.pid)
        before: set[tuple[object, ...]] = set()
        injector = None
        if inject is not None:

            def run_inject() -> None:
                inject(proc, tree, folder)
                before.update(probes_in(folder))

            injector = threading.Thread(target=run_inject, daemon=True)
            injector.start()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        if injector is not None:
            injector.join(timeout=10)
        tree.stop()
        stray = tree.alive()
        for pid in stray:  # never leave them behind, even when the test fails
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        err.seek(0)
        stderr = " ".join(err.read().split())
    kept = {p[:4] + p[5:] for p in probes_in(folder)} | journaled(cache)
    lost = sum(1 for p in before if p[:4] + p[5:] not in kept)
    try:
        result = json.loads((folder / "autobatch-result.json").read_text())
    except (OSError, ValueError):
        result = {}
    return FaultRun(name, code, stderr, stray, lost, result, time.perf_counter() - started)


def wait_for(predicate: Callable[[], bool], timeout: float = 300) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def after_probes(n: int, folder: Path) -> Callable[[], bool]:
    return lambda: len(probes_in(folder)) >= n


# -- the faults -----------------------------------------------------------------------------------------


def kill_a_probe(proc: subprocess.Popen[str], tree: Tree, folder: Path) -> None:
    """SIGKILL the first probe process that runs after two probes were measured."""
    wait_for(after_probes(2, folder))
    if wait_for(lambda: bool(tree.probes())):
        for probe in tree.probes():
            probe.send_signal(signal.SIGKILL)


def kill_the_server(proc: subprocess.Popen[str], tree: Tree, folder: Path) -> None:
    # After the first probe and while another runs: a flat curve's tune needs only a few probes, and on a
    # busy machine it could finish between "two probes recorded" and the kill.
    wait_for(after_probes(1, folder))
    wait_for(lambda: bool(tree.probes()), timeout=30)
    server = tree.server()
    if server is not None:
        server.send_signal(signal.SIGKILL)


def signal_the_tune(sig: int) -> Callable[[subprocess.Popen[str], Tree, Path], None]:
    def inject(proc: subprocess.Popen[str], tree: Tree, folder: Path) -> None:
        wait_for(after_probes(2, folder))
        wait_for(lambda: bool(tree.probes()), timeout=30)  # mid-probe
        proc.send_signal(sig)

    return inject


def edit_the_script(script: Path) -> Callable[[subprocess.Popen[str], Tree, Path], None]:
    def inject(proc: subprocess.Popen[str], tree: Tree, folder: Path) -> None:
        wait_for(after_probes(1, folder))
        with open(script, "a") as handle:
            handle.write("\n# edited while tuned\n")

    return inject


def slow_copy(folder: Path) -> Path:
    """A copy of the slow-steps fixture in ``folder`` (so that editing it touches no shared file)."""
    target = folder / "slow_steps.py"
    target.write_text((BAD / "slow_steps.py").read_text())
    return target


SLOW = {"SLOW_STEP_SECONDS": "0.3"}
#: The exit code each fault must end with (the README's table): retried probes and a memory hog end
#: well; a persistent crash or timeout and a dead server exit 6; signals 130/143/129 (SIGKILL: -9, nothing
#: can run); an edited script 2.
EXPECTED = {
    "probe SIGKILLed": 0,
    "probe killed once (script)": 0,
    "probe segfaults": 6,
    "probe hangs": 6,
    "probe exhausts memory": 0,
    "server killed": 6,
    "tune SIGKILL": -9,
    "tune SIGINT": 130,
    "tune SIGTERM": 143,
    "tune SIGHUP": 129,
    "script edited": 2,
}


def all_faults(base: Path) -> list[FaultRun]:
    """Every fault, each in its own folder under ``base``."""
    runs: list[FaultRun] = []

    def folder(name: str) -> Path:
        path = base / name.replace(" ", "-")
        path.mkdir(parents=True, exist_ok=True)
        return path

    f = folder("probe SIGKILLed")
    runs.append(
        run_fault(
            "probe SIGKILLed", f, str(slow_copy(f)), kill_a_probe, env=SLOW, extra=("--max-batch-size", "64")
        )
    )
    f = folder("probe killed once (script)")
    runs.append(
        run_fault(
            "probe killed once (script)",
            f,
            str(BAD / "killed_once.py"),
            extra=("--max-batch-size", "64"),
            # the marker outside the run's folder, which a probe does not write into (autobatch.probe.files)
            env={"KILLED_ONCE_MARKER": str(f.with_name(f"{f.name}.marker"))},
        )
    )
    f = folder("probe segfaults")
    runs.append(run_fault("probe segfaults", f, str(BAD / "segfaults.py"), extra=("--max-batch-size", "64")))
    f = folder("probe hangs")
    runs.append(
        run_fault("probe hangs", f, str(BAD / "hangs.py"), extra=("--max-batch-size", "32", "--timeout", "4"))
    )
    f = folder("probe exhausts memory")
    runs.append(
        run_fault("probe exhausts memory", f, str(BAD / "hogs_memory.py"), extra=("--max-batch-size", "64"))
    )
    f = folder("server killed")
    runs.append(run_fault("server killed", f, str(slow_copy(f)), kill_the_server, env=SLOW))
    for sig in (signal.SIGKILL, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        f = folder(f"tune {sig.name}")
        runs.append(run_fault(f"tune {sig.name}", f, str(slow_copy(f)), signal_the_tune(sig), env=SLOW))
    f = folder("script edited")
    script = slow_copy(f)
    runs.append(run_fault("script edited", f, str(script), edit_the_script(script), env=SLOW))
    return runs
