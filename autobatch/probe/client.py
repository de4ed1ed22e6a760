"""The parent side of the probe server: start it, send probes, and leave no process behind.

The server runs in a session and process group of its own (``start_new_session``) with every probe forked
inside it. :meth:`ProbeClient.close` sends it SIGTERM, on which it kills every process below it, those the
script moved to a session of their own included (:mod:`autobatch.probe.lineage`), then ``killpg`` ends
whatever is left in its group. ``PR_SET_PDEATHSIG`` in the server (SIGHUP: the same clean-up, and its
folders removed) and in each probe covers the case where this process is killed outright.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from autobatch.cache.folder import inductor_folder
from autobatch.cache.keys import digest
from autobatch.cache.sources import changed_files, file_fingerprint, spec_sources
from autobatch.devices.cpu import MALLOC_ENV
from autobatch.devices.visible import PROBE_ENV
from autobatch.errors import ProbeFailure
from autobatch.probe import forked
from autobatch.probe.lineage import exit_fd, group_running, has_exited, interrupts_held
from autobatch.probe.ops import LAZY_IMPORTS
from autobatch.probe.warming import Warming, describe
from autobatch.probe.yielding import YieldingRunner
from autobatch.records.failures import server_error
from autobatch.records.protocol import ProbeOutcome, ProbeRequest, start_word
from autobatch.settings.levers import neutral

if TYPE_CHECKING:
    from autobatch.step.spec import ScriptSpec

#: Extra seconds the client waits beyond a probe's own timeout before it gives up on the server.
SERVER_GRACE = 30.0
#: Seconds the server's start-up may take beyond the probe timeout: importing Python and torch.
IMPORT_GRACE = 60.0
#: Seconds the server gets to end the processes below it on SIGTERM before its group is killed.
STOP_GRACE = 5.0
#: The operations that build the model (or read the device) and run no step: a server forked from the daemon's
#: warm process replays what one reported when the request's options allow it (:data:`REPLAYABLE`, the CPU device
#: only: a GPU's free memory is read now), :meth:`ProbeClient._inspection`.
INSPECTIONS = ("inspect", "as_is_inspect")
REPLAYABLE = "replayable"
#: The kept answer that a script imported cleanly on a server forked from the warm process (the files it read then):
#: the next server forked for it is not asked to import it again before its first operation.
IMPORTED = "imported"
#: Variables a shell sets per command, which no script's model depends on.
SHELL_KEYS = ("_", "OLDPWD", "SHLVL")
#: Why a server asked not to fork (``fork=False``) starts as a fresh Python: its caller's device budget counts
#: the whole probe process, and no fresh-process offset counts the warm process's memory back.
NOT_FORKED = "the fresh-process offset is off, and a forked server's memory would count the warm process's"


def _exited(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for the child ``pid`` to exit, without reaping it (woken by its exit where
    the kernel offers a pidfd, else polled)."""
    watch = exit_fd(pid)
    if watch is not None:
        try:
            select.select([watch], [], [], timeout)
        finally:
            os.close(watch)
        return has_exited(pid)
    deadline = time.monotonic() + timeout
    while not has_exited(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _group_gone(group: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds until no process of the killed process group ``group`` runs (one killed
    by a signal runs on until the kernel has delivered it)."""
    deadline = time.monotonic() + timeout
    while group_running(group):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


#: When set, starting a probe server is refused with its value as the reason: the test suite sets it for tests
#: not marked ``slow``, so that the quick run cannot start one by accident.
NO_SERVER_ENV = "AUTOBATCH_NO_PROBE_SERVER"


def steady_environment(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """``env`` as a key: every variable but what a shell sets per command (:data:`SHELL_KEYS`), sorted."""
    return sorted((k, v) for k, v in env.items() if k not in SHELL_KEYS)


def _timeless(request: ProbeRequest) -> dict[str, Any]:
    """``request`` as a key: the same operation with any timeout."""
    return replace(request, run=replace(request.run, timeout=0.0)).to_dict()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class FreshMeasure(NamedTuple):
    """The run's fresh-process measurement (:mod:`autobatch.probe.fresh`), as a later server counts against it."""

    request: ProbeRequest
    #: The forked probes' settled data, per rank.
    settled: list[int]
    #: The server that measured it was forked from a warm process (:mod:`autobatch.probe.forked`).
    forked: bool


class ProbeClient:
    """A running probe server for one script.

    ``op_modules``: modules the server imports at start-up, before any fork, to register operations
    beyond the built-in ``probe`` and ``inspect`` (see :mod:`autobatch.probe.ops`). ``fork``: False starts
    the server as a fresh Python even in a warm process (:data:`NOT_FORKED`). ``folders``: the caller's
    temporary folders, which the server removes with its own log folder when this process is killed outright.
    ``warming``: what the device allows the server's warm-up (:class:`autobatch.probe.warming.Warming`).
    """

    def __init__(
        self,
        script: str | Path | dict[str, Any],
        script_args: list[str] | tuple[str, ...] = (),
        *,
        env: dict[str, str] | None = None,
        start_timeout: float = 300.0,
        op_modules: Sequence[str] = (),
        fork: bool = True,
        folders: Sequence[str] = (),
        warming: Warming = Warming(),
    ) -> None:
        # a script's path, or a script spec record (autobatch.step.spec) that the server's load_script resolves
        self.script: str | dict[str, Any] = script if isinstance(script, dict) else str(script)
        self._log_dir = tempfile.TemporaryDirectory(prefix="autobatch-")
        self._stderr = open(os.path.join(self._log_dir.name, "server.log"), "wb")  # noqa: SIM115
        self._init = {
            "script": self.script,
            "script_args": list(script_args),
            "log_dir": self._log_dir.name,
            "op_modules": list(op_modules),
            "client_folders": list(folders),
            "warming": warming.to_dict(),
        }
        self.env = dict(env or {})
        self._warming = warming
        #: The installed packages' modules this server's probes imported themselves (:meth:`_learn`).
        self._lazy: set[str] = set()
        self._start_timeout = start_timeout
        self._fork = fork
        self.probes_run = 0
        self._fresh: FreshMeasure | None = None
        #: What this server's probes add to the measured offsets (per rank): a server of another start holds
        #: another baseline, and its probes are counted against the same fresh process.
        self._recount: list[int] = []
        self._start()

    def _start(self) -> None:
        forbidden = os.environ.get(NO_SERVER_ENV)
        if forbidden:
            raise RuntimeError(f"a probe server may not start here ({NO_SERVER_ENV}): {forbidden}")
        env = {**os.environ, **self.env}
        #: Why the server started as a fresh Python rather than forked from a warm process (autobatch.probe.forked).
        self.cold = forked.why_cold(env, self._warming) if self._fork else NOT_FORKED
        self._proc: subprocess.Popen[bytes] | forked.ForkedServer
        init: dict[str, Any] = self._init
        if self.cold is None:
            self._script_now = self._script_state()
            known = forked.kept(self._kept_key(IMPORTED, *self._script_now)) if self._script_now else None
            checked = known is not None and not changed_files(known["read"])
            init = {**self._init, "checked": True} if checked else self._init
        self._next_id = 0
        self._buffer = b""
        try:
            # Ctrl-C (an interrupted notebook cell) between the server's start and its handle kept here would
            # leave a server nobody stops: it is held until the handle is kept, then raised, and the server closed
            with interrupts_held():
                if self.cold is None:
                    self._proc = forked.start(start_word(init, self._log_dir.name), env, self._stderr)
                else:
                    self._proc = subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "autobatch.probe.server",
                            start_word(init, self._log_dir.name),
                        ],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=self._stderr,
                        env=env,
                        start_new_session=True,
                    )
            hello = self._read(
                self._start_timeout,
                what="the probe server to import torch and the script",
                hint="the server imports torch and the script's libraries, then a first process imports the "
                "script: a script that waits at import (for a thread or pool it joins, input, the network, a "
                f"lock) must not; if importing it is only slow, raise {neutral('timeout')}",
            )
        except BaseException:  # a failed or interrupted start (Ctrl-C in a notebook) leaves no server behind
            if getattr(self, "_proc", None) is not None:  # else the start itself failed: nothing runs
                self.close()
            raise
        if not hello.get("ready"):
            self.close()
            raise server_error(hello.get("error", {}))
        self.import_seconds = float(hello.get("import_seconds", 0.0))
        if self.cold is None and self._script_now and hello.get("script_reads") is not None:
            read = {path: file_fingerprint(path) for path in hello["script_reads"]}
            if None not in read.values():  # a file that cannot be fingerprinted: checked each time
                forked.keep(self._kept_key(IMPORTED, *self._script_now), {"read": read})
        #: How probes start: the libraries the server warmed, or why it imports torch alone (probe.warming).
        self.start: dict[str, Any] = dict(hello.get("start") or {})
        #: Whether what this server warmed (and its probes import) may be kept warm for the next command.
        self._warm_ok = self._fork and not self.start.get("cold") and forked.why_cold(env, None) is None
        if self._warm_ok:
            forked.learn(list(self.start.get("warmed") or []), self._warming)
        self.torch_version = str(hello.get("torch_version", ""))
        self.pid = int(hello.get("pid", self._proc.pid))

    def reopen(self, env: dict[str, str]) -> None:
        """Stop the server and start another with ``env`` added to its environment (what the probes inherit
        from the start of their process: OpenMP reads its settings when torch loads it)."""
        self._stop()
        self.env.update(env)
        self._start()
        self._recount = []
        if self._fresh is not None and (self.cold is None) != self._fresh.forked:
            self._recount_fresh(self._fresh)

    def _recount_fresh(self, fresh: FreshMeasure) -> None:
        """The forked half of the fresh-process measurement again, on this server (one forked from the warm
        process where the first was a fresh Python, or the other way round): its probes hold another baseline,
        and the difference is added to every offset, so they count as the job's fresh process as the first
        server's did. A measurement that fails leaves the offsets as measured (the server log says so)."""
        outcome = self._send(replace(fresh.request, options={**fresh.request.options, "forked_only": True}))
        again = outcome.info.get("forked_settled_bytes") if outcome.fits else None
        if not again or len(again) != len(fresh.settled):
            self._stderr.write(
                b"autobatch: the forked half of the fresh-process measurement failed on this server: its probes count "
                b"with the first server's offsets\n"
            )
            return
        self._recount = [int(before) - int(now) for before, now in zip(fresh.settled, again, strict=True)]

    def __enter__(self) -> ProbeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, request: ProbeRequest) -> ProbeOutcome:
        """Run one operation (a probe, an inspection, ...) in a fresh process and return its outcome."""
        offsets = request.run.fresh_offset_bytes
        if self._recount and offsets:
            counted = (
                tuple(o + c for o, c in zip(offsets, self._recount, strict=False))
                + offsets[len(self._recount) :]
            )
            request = request.with_run(fresh_offset_bytes=counted)
        if request.op == "fresh_baseline" and request.options.get("kept") is not None and self.cold is None:
            outcome = self._forked_half(request)
        elif request.op in INSPECTIONS and request.options.get(REPLAYABLE) and self.cold is None:
            outcome = self._inspection(request)
        else:
            outcome = self._send(request)
        self._learn(outcome)
        if request.op == "fresh_baseline" and "offset_bytes" in outcome.info:
            settled = [int(b) for b in outcome.info["forked_settled_bytes"]]
            self._fresh = FreshMeasure(request, settled, forked=self.cold is None)
        return outcome

    def _learn(self, outcome: ProbeOutcome) -> None:
        """Take the installed packages' modules a probe imported itself off its outcome; on a server forked from
        the daemon's warm process, keep them with the ones the server warmed for the environment's warm parent
        (:func:`autobatch.probe.forked.learn`)."""
        lazy = outcome.info.pop(LAZY_IMPORTS, None) or []
        if self._lazy.issuperset(lazy) or not self._warm_ok:
            return
        self._lazy.update(lazy)
        warmed = list(self.start.get("warmed") or [])
        forked.learn([*warmed, *sorted(self._lazy - set(warmed))], self._warming)

    def _forked_half(self, request: ProbeRequest) -> ProbeOutcome:
        """The forked half of the fresh-process offset, counted against a kept fresh half, on a server forked
        from the daemon's warm process: measured once per warm process, script and request, then replayed
        (every server forked from it for the same script starts from the same heap; the probes of one vary
        between each other as much as between servers)."""
        key = self._kept_key(_timeless(request))
        known = forked.kept(key)
        if known is not None:
            replayed = ProbeOutcome.from_dict(known)
            replayed.cached = True
            replayed.info = {**replayed.info, "forked_replayed": True}
            return replayed
        outcome = self._send(request)
        if outcome.fits and "offset_bytes" in outcome.info:
            forked.keep(key, outcome.to_dict())
        return outcome

    def _inspection(self, request: ProbeRequest) -> ProbeOutcome:
        """The model's inspection on the CPU, on a server forked from the daemon's warm process: run once per warm
        process, script (its sources), request, working folder and environment, then replayed while every file it
        read is as it was, with the machine's memory read now. Its model is built in a probe that forks from the
        same heap each time, so what it reports (the parameters, the blocks, the data memory after the build)
        is what it reported; a config file the script reads that changed builds it again."""
        from autobatch.devices.cpu import BOUND_KEYS, machine_memory

        if not self._script_now:
            return self._send(request)
        key = self._kept_key(_timeless(request), *self._script_now)
        known = forked.kept(key)
        if known is not None:
            replayed = ProbeOutcome.from_dict(known)
            if not changed_files(replayed.files_read):
                replayed.cached = True
                kept = {
                    k: v for k, v in replayed.info.items() if k not in BOUND_KEYS
                }  # bounds are read again
                replayed.info = {**kept, **machine_memory()}
                return replayed
        outcome = self._send(request)
        read = {path: file_fingerprint(path) for path in outcome.files_read}
        if outcome.fits and None not in read.values():  # a file that cannot be fingerprinted: run each time
            forked.keep(key, replace(outcome, files_read=read).to_dict())
        return outcome

    def _kept_key(self, *inputs: object) -> str:
        """What an answer kept by the warm process (:mod:`autobatch.probe.forked`) is kept under: the server's
        start (the script, its arguments, the operation modules, the warm-up), the warm parent it descends from
        (another heap) and ``inputs``."""
        init = {k: v for k, v in self._init.items() if k not in ("log_dir", "client_folders")}
        return digest([init, forked.lineage(), *inputs], length=32)

    def _script_state(self) -> list[object]:
        """What else a script's import and model depend on, as the server starts: its sources and local modules,
        the working folder and the environment (all of it, but for what a shell sets per command); empty when
        its sources cannot be read (nothing is replayed then: the server and the session say why)."""
        from autobatch.errors import AutobatchError
        from autobatch.step.spec import ScriptSpec

        script = self.script
        spec = ScriptSpec.file(script) if isinstance(script, str) else ScriptSpec.from_dict(script)
        try:
            sources = spec_sources(spec)
        except (OSError, AutobatchError):
            return []
        return [sources, os.getcwd(), steady_environment(os.environ)]

    def _send(self, request: ProbeRequest) -> ProbeOutcome:
        """``request`` to the server as it is; its outcome."""
        self._next_id += 1
        message = {"id": self._next_id, "request": request.to_dict()}
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write((json.dumps(message) + "\n").encode())
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise ProbeFailure(
                "the probe server died", hint=f"{neutral('verbose')} to see its log", detail=self.server_log()
            ) from None
        answer = self._read(request.timeout + SERVER_GRACE, what=f"the probe at batch {request.batch_size}")
        if request.op == "probe":
            self.probes_run += 1
        return ProbeOutcome.from_dict(answer["outcome"])

    def server_log(self) -> str:
        try:
            self._stderr.flush()
            return Path(self._log_dir.name, "server.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def close(self) -> None:
        """Stop the server and every probe it forked; safe to call more than once."""
        self._stop()
        if not self._stderr.closed:
            self._stderr.close()
        self._log_dir.cleanup()

    def _stop(self) -> None:
        proc = self._proc
        try:
            if proc.stdin:
                proc.stdin.close()
        except OSError:
            pass
        # Nothing in the server is left to save (its log is written as it goes, every probe has answered
        # or is to be stopped): on SIGTERM it kills every process below it and leaves at once (os._exit,
        # not its interpreter's exit). Then anything left in its group is killed, before the server is
        # reaped (while it is unreaped, its group's id cannot be reused).
        if proc.returncode is None:  # not reaped yet: the pid is still the server's
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except OSError:
                pass
            _exited(proc.pid, STOP_GRACE)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        _group_gone(proc.pid, STOP_GRACE)  # no process of the server's is left when the command exits
        if proc.stdout:
            proc.stdout.close()

    def _read(self, timeout: float, what: str, hint: str | None = None) -> dict[str, Any]:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.close()
                raise ProbeFailure(
                    f"timed out after {timeout:g} s waiting for {what}",
                    hint=hint or f"raise {neutral('timeout')}, or {neutral('verbose')}",
                )
            ready, _, _ = select.select([fd], [], [], min(remaining, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                log = self.server_log()
                try:  # end of file comes a moment before the server can be reaped
                    code: int | None = self._proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    code = None
                how = (
                    f"was killed by signal {-code} ({_signal_name(-code)})"
                    if code and code < 0
                    else f"exited (status {code})"
                )
                raise ProbeFailure(
                    f"the probe server {how} while waiting for {what}",
                    hint=f"{neutral('verbose')} to see its log",
                    detail=log,
                )
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)


def server_env() -> dict[str, str]:
    """What a session's probe server adds to the environment (and so every process it starts: probes, the job's
    fresh process): the CPU allocator pinned, CUDA devices as the job sees them, the compile cache's folder, and
    in place of the variables a launcher set for a rank of its job, those ``torchrun`` gives a world of one
    (:func:`autobatch.probe.ranks.one_process_env`; the ranks of a probe set their own)."""
    from autobatch.probe.ranks import one_process_env

    return {
        **MALLOC_ENV,
        **PROBE_ENV,
        "AUTOBATCH_INDUCTOR_CACHE": inductor_folder(),
        **one_process_env(os.environ),
    }


def start_server(
    spec: ScriptSpec,
    script_args: list[str],
    op_modules: tuple[str, ...],
    timeout: float,
    warn: Callable[[str], None],
    fork: bool = True,
    folders: Sequence[str] = (),
    warming: Warming = Warming(),
) -> YieldingRunner:
    """The probe server a session probes through: the CPU allocator pinned, CUDA devices as the job sees them,
    its threads yielding once the CPU is busy; ``warn`` hears how probes start when it is not the plain case
    (:func:`autobatch.probe.warming.describe`); ``fork``, ``folders`` and ``warming`` as :class:`ProbeClient`'s."""
    client = ProbeClient(
        spec.to_init(),
        script_args,
        env=server_env(),
        op_modules=op_modules,
        start_timeout=timeout + IMPORT_GRACE,  # importing the script counts like a probe
        fork=fork,
        folders=folders,
        warming=warming,
    )
    cold = describe(client.start)
    if cold is not None:
        warn(cold)
    return YieldingRunner(client, warn)
