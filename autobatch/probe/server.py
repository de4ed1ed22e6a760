"""The probe server (the daemon): imports torch and the user script once, then forks a probe per request.

JSON lines on stdin and on the fd that was its stdout; torch, the probe operations and the step's
third-party modules are imported before the first fork, and no user code or tensor operation runs in the
server itself. Every probe is a fresh fork that dies with the server, and the server, subreaper of all its
probes start, kills what a probe left behind. The protocol: docs/architecture.md ("The probe server's
protocol"); isolation: docs/how-a-tune-works.md ("Isolation and processes").
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

from autobatch.probe.files import (
    SCRATCH_ENV,
    install_for,
    multiprocessing_folder,
    remove_root,
    scratch_root,
    use_multiprocessing_folder,
)
from autobatch.probe.lineage import (
    become_subreaper,
    die_with_parent,
    end_descendants,
    end_descendants_on,
    read_until_exit,
)
from autobatch.records.protocol import ProbeOutcome, ProbeRequest, read_start_word, start_word

#: Modules a probe imports lazily (building any optimizer imports torch._dynamo: about 2 s). Importing
#: them here, once, keeps that cost out of every probe; importing runs no tensor operation.
PRELOAD = ("torch._dynamo", "torch.optim", "torch.utils.checkpoint", "torch.amp")


def preload() -> None:
    """Import :data:`PRELOAD` (those that import cleanly: an optional speed-up, never a failure)."""
    from autobatch.probe.warming import warm

    warm(list(PRELOAD))


@contextlib.contextmanager
def lifelong_imports() -> Iterator[None]:
    """Imports whose objects live as long as the process (torch's, the step's libraries'). While they run, the
    collector keeps its young collections, which free short-lived cycles as they come, and skips the full
    ones, which walk every object imported so far again and again (a fifth of importing torch and the
    preloaded modules, with the same heap after; docs/how-a-tune-works.md, "Isolated probes"). Then one full
    collection, and what they built is moved out of the collector's reach: no process forked from here walks
    it again (the collection before each probe's fork, :func:`_tidy_heap`, took 0.14 s otherwise)."""
    import gc

    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], 1 << 30)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.collect()
        gc.freeze()


#: The server's ends of the protocol's pipes. A child closes them first thing (:func:`_leave_protocol`): a
#: process the script forks would inherit them, and the client would neither see end of file on the
#: server's death nor a broken pipe on its next request while that process lives.
_protocol_fds: list[int] = []


def _leave_protocol() -> None:
    """In a child just forked from the server: close the server's ends of the protocol's pipes."""
    for fd in _protocol_fds:
        try:
            os.close(fd)
        except OSError:
            pass


#: Seconds the server waits, on its client's death signal, for the client's process to be gone.
ORPHAN_WAIT = 1.0


def main() -> None:
    init = read_start_word(sys.argv[1])
    parent = os.getppid()
    # the handlers end the probes and what they started, then the server: on the client's stop, and on its death
    end_descendants_on(signal.SIGTERM)
    end_descendants_on(signal.SIGHUP, then=lambda: _orphaned(init, parent))
    die_with_parent(signal.SIGHUP)
    if os.getppid() != parent:  # the client died before we asked
        os._exit(1)
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    # Requests come on a private copy of stdin; the script's stdin is /dev/null, so a script that reads
    # stdin at import (input(), sys.stdin.read()) gets end-of-file instead of eating the protocol or
    # hanging the tune.
    requests = os.fdopen(os.dup(0), "r")
    _protocol_fds.extend((proto.fileno(), requests.fileno()))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - lives as long as the server
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client decides when we stop

    become_subreaper()
    started = time.perf_counter()
    try:
        start = _load(init)
        if start.get("restart"):  # an import started threads: start again, warming less (torch alone at last)
            os.dup2(proto.fileno(), 1)
            os.dup2(requests.fileno(), 0)
            again = start_word({**init, "warm": start["warm"], "cold": start.get("cold")}, init["log_dir"])
            os.execv(sys.executable, [sys.executable, "-m", "autobatch.probe.server", again])
        # a server forked from the daemon's warm process for a script one of its servers imported cleanly, with
        # its sources and the files it read as they were then, is not checked again (autobatch.probe.client)
        error, read = (None, None) if init.get("checked") else _check_script(init)
    except BaseException as exc:  # noqa: BLE001
        error = _startup_error(exc)
    if error is not None:
        _send(proto, {"ready": False, "error": error})
        return
    import torch

    hello = {"pid": os.getpid(), "import_seconds": time.perf_counter() - started, "start": start}
    if read is not None:
        hello["script_reads"] = read
    _send(proto, {"ready": True, "torch_version": torch.__version__, **hello})

    compiler = Compiler(init)
    for line in requests:
        if not line.strip():
            continue
        message = json.loads(line)
        request = ProbeRequest.from_dict(message["request"])
        outcome = compiler.run(request) if request.step.compile else None
        if outcome is None:
            outcome = _fork_probe(request, init, spare=compiler.pid)
        _send(proto, {"id": message.get("id"), "outcome": outcome.to_dict()})


def _orphaned(init: dict[str, Any], parent: int) -> None:
    """On the signal of the client's death (the thread that started this server ended): once the client's
    process is gone, remove its folders (the server's log, the probes' scratch folders, the job's fresh
    processes' scratch folders), which nobody is left to read or remove. A dying client passes this process
    from thread to thread before it is gone; one whose other threads live on keeps its folders."""
    deadline = time.monotonic() + ORPHAN_WAIT
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.01)
    if os.getppid() != parent:
        for folder in [init.get("log_dir"), *init.get("client_folders", [])]:
            if folder:
                remove_root(folder)


def _load(init: dict[str, Any]) -> dict[str, Any]:
    """Import torch, the operations and the step's third-party modules once: what every probe inherits.

    Returns how probes start (:mod:`autobatch.probe.warming`): the modules warmed, or ``restart`` with
    what to warm instead when warming started threads: the modules without the names taken from them
    when only the names did, else torch alone (with the reason, which the result notes). Torch alone too
    when the warm imports left a forked probe unable to use CUDA (a library that asks
    ``torch.cuda.is_available()`` as it loads).
    """
    with lifelong_imports():
        import torch  # noqa: F401  (imported once here, inherited by every probe)

        from autobatch.devices.cuda.runtime import fork_breaks_cuda
        from autobatch.probe.ops import load_operations
        from autobatch.probe.warming import Warming, step_imports, thread_count, top_package, warm

        load_operations(init.get("op_modules", []))
        preload()
        warming = Warming.from_dict(init.get("warming"))
        threads = thread_count(warming.fork_safe)
        level = init.get("warm", True)  # True: modules and names; "modules"; False: torch alone
        wanted = step_imports(init["script"]) if level else []
        with warming.importing():
            warmed = warm([name for name in wanted if ":" not in name])
        started = thread_count(warming.fork_safe) - threads
        if started > 0:
            return {
                "restart": True,
                "warm": False,
                "cold": f"importing {', '.join(warmed)} started {started} thread(s)",
            }
        if level is True:
            with warming.importing():
                warmed += warm([name for name in wanted if ":" in name])
            # a name loaded lazily started them: probes load the names themselves
            if thread_count(warming.fork_safe) > threads:
                return {"restart": True, "warm": "modules"}
        if warmed and (why := fork_breaks_cuda()) is not None:  # every probe would fail to initialise CUDA
            named = [name for name in warmed if top_package(name) != "torch"] or warmed
            return {
                "restart": True,
                "warm": False,
                "cold": f"after importing {', '.join(named)} the server {why}",
            }
    return {"warmed": warmed, "cold": init.get("cold")}


def _as_is(init: dict[str, Any]) -> bool:
    """The script runs as it is (:mod:`autobatch.probe.as_is`): never imported for its functions."""
    script = init["script"]
    return isinstance(script, dict) and script.get("kind") == "as_is"


def _check_script(init: dict[str, Any]) -> tuple[dict[str, Any] | None, list[str] | None]:
    """Import the script in a child and check the contract: ``(the start-up error or None when it holds, the
    files importing it read)``.

    A script run as it is would run its training loop if imported: only its syntax is checked (compiling
    runs none of it, and reads no file but the script: None); every probe then runs it as ``__main__``."""
    if _as_is(init):
        from autobatch.step.as_is import compile_error

        error = compile_error(init["script"]["target"])
        return (None if error is None else _startup_error(error)), None
    read_fd, write_fd = os.pipe()
    scratch = scratch_root(init.get("log_dir"))
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _leave_protocol()
        os.environ[SCRATCH_ENV] = scratch
        code = 0
        try:
            die_with_parent()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            from autobatch.step.contract import load_script

            files = install_for(init)  # what the script does at import touches none of the user's files
            load_script(init["script"], init.get("script_args", []))
            answer: dict[str, Any] = {"read": sorted(files.outcome.files_read)}
        except BaseException as exc:  # noqa: BLE001
            answer, code = {"error": _startup_error(exc)}, 1
        finally:
            os.write(write_fd, json.dumps(answer).encode())
            os._exit(code)
    os.close(write_fd)
    data, status = read_until_exit(read_fd, pid, None)
    os.close(read_fd)
    end_descendants()  # what importing the script started (a helper, a pool) ends with this process
    remove_root(scratch)
    if not data:
        return {"type": "crash", "message": f"importing the script ended the process (status {status})"}, None
    answer = json.loads(data)
    return answer.get("error"), answer.get("read")


def _startup_error(exc: BaseException) -> dict[str, Any]:
    """The ``error`` of a ``ready: false`` message (autobatch's errors with their hint and exit code)."""
    from autobatch.errors import AutobatchError

    error: dict[str, Any] = {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": traceback.format_exc(),
    }
    if isinstance(exc, AutobatchError):
        error.update(message=exc.message, hint=exc.hint, detail=exc.detail, exit_code=exc.exit_code)
    return error


def _tidy_heap() -> None:
    """Give the server's free heap back before forking, so every probe starts equally tight.

    A probe inherits the server's heap; free space left there by earlier requests would absorb the
    probe's small allocations without growing VmData, making a probe late in a tune fit more than
    the same probe from a fresh server (seen here: a few MiB at the boundary).
    """
    from autobatch.devices.cpu import release_heap

    release_heap()


def _fork_probe(request: ProbeRequest, init: dict[str, Any], spare: int | None = None) -> ProbeOutcome:
    """Run one request in a fresh forked process and return its outcome (or its timeout, or its crash).
    Whatever the probe started ends with it; ``spare``: a child of this process left running (:class:`Compiler`)."""
    log_dir = init.get("log_dir")
    _tidy_heap()
    read_fd, write_fd = os.pipe()
    log_path = (
        os.path.join(log_dir, f"probe-{os.getpid()}-{time.monotonic_ns()}.log") if log_dir else os.devnull
    )
    # the probe's scratch folders and multiprocessing's folder (autobatch.probe.files), removed once it ended
    scratch, spool = scratch_root(init.get("log_dir")), multiprocessing_folder(init.get("log_dir"))
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the probe process
        os.close(read_fd)
        _leave_protocol()
        os.environ[SCRATCH_ENV] = scratch
        use_multiprocessing_folder(spool)
        _child(request, init, write_fd, log_path)
    os.close(write_fd)
    data, status = read_until_exit(read_fd, pid, started + request.timeout)
    if status is None:  # timed out
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    # whatever the script started, in a session of its own too, was reparented here
    end_descendants(spare=spare)
    remove_root(scratch)
    remove_root(spool)
    os.close(read_fd)
    wall = time.perf_counter() - started
    if status is None:
        return ProbeOutcome(
            kind="timeout",
            batch_size=request.batch_size,
            wall_seconds=wall,
            log_tail=_tail(log_path),
            reason=f"no answer within {request.timeout:g} s; the probe was killed",
        )
    return _answer(request, data, status, wall, log_path)


#: What a compiled probe imports and checks before its first compile: inductor (about 1 s here) and the CPU's
#: vector instruction sets, each tried by building and loading a library in a Python of its own (about 1 s).
COMPILER_MODULES = ("torch._inductor.compile_fx", "torch._inductor.cpu_vec_isa")


class Compiler:
    """Where compiled probes fork from: a child of the server that did, once, what a compiled probe does
    before its first compile (:data:`COMPILER_MODULES`, then ``valid_vec_isa_list()``, which inductor caches
    for the process). Forked from the server at the first compiled request and kept; a compiled probe then
    skips those seconds (0.5 s against 1.9 s for a small MLP's three compiled steps, measured here with
    inductor's caches warm). Eager probes keep forking from the server itself: the compiler's imports hold
    about 50 MiB of data memory, which a compiled job holds too and an eager one never does.

    ``run`` returns None when compiled probes cannot fork from it (warming it started a thread, which a fork
    would not carry over; it ended): the server then forks them itself, as without it."""

    def __init__(self, init: dict[str, Any]) -> None:
        self.init = init
        self.pid: int | None = None
        self.failed = False
        self._send: Any = None
        self._receive: Any = None

    def run(self, request: ProbeRequest) -> ProbeOutcome | None:
        if self.failed or (self.pid is None and not self._start()):
            return None
        try:
            self._send.write(json.dumps(request.to_dict()) + "\n")
            self._send.flush()
            line = self._receive.readline()
        except OSError:
            line = ""
        if not line:  # it died (killed with its probe, say): the next compiled request starts another
            self._ended()
            return ProbeOutcome(
                kind="crash",
                batch_size=request.batch_size,
                reason="the process compiled probes fork from ended without reporting",
            )
        return ProbeOutcome.from_dict(json.loads(line))

    def _start(self) -> bool:
        requests_read, requests_write = os.pipe()
        replies_read, replies_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(requests_write)
            os.close(replies_read)
            _leave_protocol()
            _protocol_fds[:] = [requests_read, replies_write]  # what its probes close first thing
            self._serve(requests_read, replies_write)
        os.close(requests_read)
        os.close(replies_write)
        self._send = os.fdopen(requests_write, "w")
        self._receive = os.fdopen(replies_read, "r")
        if self._receive.readline().strip() != "ready":  # warming started a thread: it ended
            self._ended()
            self.failed = True
            os.waitpid(pid, 0)
            return False
        self.pid = pid
        return True

    def _serve(self, requests_fd: int, replies_fd: int) -> None:
        code = 0
        try:
            die_with_parent()
            signal.signal(signal.SIGHUP, signal.SIG_DFL)  # the server's handler is the server's
            become_subreaper()
            from autobatch.probe.warming import thread_count, warm

            threads = thread_count()
            with lifelong_imports():
                warm(list(COMPILER_MODULES))  # never a failure: a probe imports what did not import here
                _check_instruction_sets()
            replies = os.fdopen(replies_fd, "w", buffering=1)
            if thread_count() > threads:
                replies.write("threads\n")
                return
            replies.write("ready\n")
            for line in os.fdopen(requests_fd, "r"):
                request = ProbeRequest.from_dict(json.loads(line))
                replies.write(json.dumps(_fork_probe(request, self.init).to_dict()) + "\n")
        except BaseException:  # noqa: BLE001 - the server answers the request with a crash, and starts another
            code = 70
        finally:
            os._exit(code)

    def _ended(self) -> None:
        for handle in (self._send, self._receive):
            if handle is not None:
                with contextlib.suppress(OSError):
                    handle.close()
        self._send = self._receive = None
        if self.pid is not None:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
        self.pid = None


def _check_instruction_sets() -> None:
    """inductor's check of the CPU's vector instruction sets, whose answer it keeps for the process."""
    try:
        from torch._inductor.cpu_vec_isa import valid_vec_isa_list

        valid_vec_isa_list()
    except Exception:  # noqa: BLE001 - a warm-up, never a failure: the probe does it for real
        pass


def _answer(request: ProbeRequest, data: bytes, status: int, wall: float, log_path: str) -> ProbeOutcome:
    """The outcome the child wrote, or a crash when it wrote none (a signal, an abort, an exit)."""
    tail = _tail(log_path)
    try:
        outcome = ProbeOutcome.from_dict(json.loads(data))
    except ValueError:
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            how = f"killed by signal {sig} ({signal.Signals(sig).name})"
        else:
            how = f"exited with status {os.WEXITSTATUS(status)}"
        return ProbeOutcome(
            kind="crash",
            batch_size=request.batch_size,
            wall_seconds=wall,
            log_tail=tail,
            reason=f"the probe process {how} without reporting",
        )
    outcome.wall_seconds = wall
    if outcome.kind in ("error", "crash"):
        outcome.log_tail = tail
    if log_path != os.devnull:
        try:
            os.unlink(log_path)
        except OSError:
            pass
    return outcome


def _child(request: ProbeRequest, init: dict[str, Any], write_fd: int, log_path: str) -> None:
    from autobatch.probe import ops

    code = 0
    try:
        die_with_parent()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's handler is the server's
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        ops.outcome_fd = write_fd  # for an operation that ends the process itself (ops.report_and_exit)
        ops.modules_at_fork = frozenset(sys.modules)
        outcome = _run_request(request, init)
        ops.write_outcome(write_fd, outcome)
    except BaseException:  # noqa: BLE001
        code = 70
        try:
            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)


def _run_request(request: ProbeRequest, init: dict[str, Any]) -> ProbeOutcome:
    """Import the script in this probe process (its own code runs here, never in the server), then run
    the request; an import that raises is the outcome."""
    from autobatch.probe.ops import dispatch
    from autobatch.records.failures import describe_failure
    from autobatch.step.contract import load_script

    if _as_is(init):  # run as __main__ by its operation (autobatch.probe.as_is), never imported here
        from autobatch.step.as_is import AsIsScript

        as_is = AsIsScript.from_spec(init["script"], init.get("script_args", []))
        return dispatch(request, as_is)  # type: ignore[arg-type]
    files = install_for(init)  # from a scratch folder, as a script run as it is (autobatch.probe.files)
    try:
        script = load_script(init["script"], init.get("script_args", []))
    except BaseException as exc:  # noqa: BLE001 - the script's error, as data
        return files.report(describe_failure(ProbeOutcome(kind="error", batch_size=request.batch_size), exc))
    return files.report(dispatch(request, script))


def _tail(path: str, limit: int = 4000) -> str | None:
    if path == os.devnull:
        return None
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            text = handle.read().decode(errors="replace").strip()
        return text or None
    except OSError:
        return None


def _send(proto: Any, message: dict[str, Any]) -> None:
    proto.write(json.dumps(message) + "\n")
    proto.flush()


if __name__ == "__main__":
    main()
