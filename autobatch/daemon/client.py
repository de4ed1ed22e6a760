"""The command's side of the daemon: reach it, start it, run a command through it, stop it.

HTTP over the Unix socket with the standard library's ``http.client`` (:func:`request`); nothing here imports
torch, so ``autobatch --help`` and a command answered by the daemon stay light. :func:`route` is what
:func:`autobatch.cli.main` asks first, before the Typer app is imported: with the ``daemon`` setting at
``auto`` or ``on``, ``tune``, ``check``, ``explain`` and ``estimate`` run through the daemon (started on first
use; replaced when its versions differ from this client's), and their output and exit code are the command's.
A daemon that cannot be reached leaves the command to run in-process with a note (``auto``) or is an error
(``on``). So does a connection that breaks while the daemon runs the command, once the daemon's run of it has
ended (:meth:`Client.run`): never beside it, and a tune then picks up the probes that run measured.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autobatch.daemon.place import Place, identity
from autobatch.errors import EXIT_SIGINT, EXIT_SIGTERM, DaemonError

if TYPE_CHECKING:
    from autobatch.devices.inventory import NvmlFacts

#: The commands that run through the daemon when it is used.
ROUTED = ("tune", "check", "explain", "estimate")
#: Seconds a started daemon may take to answer (its warm process imports torch).
START_TIMEOUT = 180.0
#: Seconds a stopping daemon may take to end its requests and exit.
STOP_TIMEOUT = 60.0
#: The resource limits of the client's process that bound what a job started from its shell may hold: a
#: command the daemon runs takes them on.
LIMITS = ("RLIMIT_DATA", "RLIMIT_AS")
#: Seconds the daemon gives a cancelled command to stop its probes and keep what they measured before SIGKILL.
CANCEL_GRACE = 20.0
#: Seconds a client whose connection broke waits for the daemon's run of its command to end.
END_WAIT = CANCEL_GRACE + 10.0


class _Connection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def request(
    socket_path: str, method: str, path: str, body: bytes = b"", timeout: float | None = None
) -> http.client.HTTPResponse:
    """Send one HTTP request over the daemon's Unix socket; its answer, to read to the end or a line at a time
    (the daemon answers HTTP/1.0: the connection ends with the answer)."""
    connection = _Connection(socket_path, timeout)
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        return connection.getresponse()
    except BaseException:
        connection.close()
        raise


def served_facts(socket_path: str) -> NvmlFacts:
    """NVML's facts as the daemon's reader has them now (``GET /v1/inventory``): how a command the daemon runs
    reads its inventory."""
    from autobatch.devices.inventory import NvmlFacts

    code, answer = ask(socket_path, "GET", "/v1/inventory")
    if code != 200:
        raise DaemonError(f"the daemon did not serve the inventory ({code})")
    return NvmlFacts.from_dict(answer["facts"])


def malformed_run(body: Any) -> str | None:
    """What is wrong with a run request (``POST /v1/run``), for its 400; None: nothing."""
    if not isinstance(body, dict):
        return "the run request must be a JSON object"
    problems = []
    if not (isinstance(body.get("argv"), list) and all(isinstance(a, str) for a in body["argv"])):
        problems.append("argv: a list of strings")
    if not isinstance(body.get("cwd"), str) or not os.path.isdir(body["cwd"]):
        problems.append("cwd: an existing folder")
    if not (isinstance(body.get("env"), dict) and all(isinstance(v, str) for v in body["env"].values())):
        problems.append("env: an object of strings")
    if not (isinstance(body.get("sys_path"), list) and all(isinstance(a, str) for a in body["sys_path"])):
        problems.append("sys_path: a list of strings")
    cgroup = body.get("cgroup")
    if cgroup is not None and not (
        isinstance(cgroup, list) and len(cgroup) == 2 and all(isinstance(n, int) and n >= 0 for n in cgroup)
    ):
        problems.append("cgroup: null or [limit, used] in bytes")
    limits = body.get("limits")
    if limits is not None and not (
        isinstance(limits, dict)
        and set(limits) <= set(LIMITS)
        and all(
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(n, int) and n >= -1 for n in pair)
            for pair in limits.values()
        )
    ):
        problems.append(f"limits: null or an object of {', '.join(LIMITS)} to [soft, hard] (-1: unlimited)")
    umask = body.get("umask")
    if umask is not None and not (
        isinstance(umask, int) and not isinstance(umask, bool) and 0 <= umask <= 0o777
    ):
        problems.append("umask: null or a file mode creation mask (0 to 0o777)")
    cores = body.get("cores")
    if cores is not None and not (
        isinstance(cores, list) and cores and all(isinstance(n, int) and n >= 0 for n in cores)
    ):
        problems.append("cores: null or a list of the CPU numbers the client may run on")
    nice = body.get("nice")
    if nice is not None and not (isinstance(nice, int) and not isinstance(nice, bool) and -20 <= nice <= 19):
        problems.append("nice: null or the client's niceness (-20 to 19)")
    return "malformed run request; expected " + "; ".join(problems) if problems else None


def spare_for(socket_path: str, request: str, asked: dict[str, Any]) -> str | None:
    """The socket of a spare fresh process for what ``asked`` describes (``POST /v1/spare``), None: none."""
    code, answer = ask(socket_path, "POST", "/v1/spare", {"request": request, **asked}, timeout=10.0)
    if code != 200:
        raise DaemonError(f"the daemon did not answer for a spare ({code})")
    return answer.get("socket")


def ask(
    socket_path: str, method: str, path: str, body: Any = None, timeout: float = 30.0
) -> tuple[int, dict[str, Any]]:
    """One request with a JSON body (or none) and its JSON answer: the status code and the decoded object."""
    data = b"" if body is None else json.dumps(body).encode()
    answer = request(socket_path, method, path, data, timeout)
    try:
        return answer.status, json.loads(answer.read() or b"{}")
    finally:
        answer.close()


class _Broken(DaemonError):
    """The connection broke while the daemon ran the command (a read error, the answer cut short): ``state`` is
    what the client heard of it (the request's id and pid, whether its stdout was written)."""

    def __init__(self, why: str, state: dict[str, Any]) -> None:
        super().__init__(why)
        self.state = state


class Client:
    """Talks to the daemon at ``place``."""

    def __init__(self, place: Place | None = None) -> None:
        self.place = place or Place.default()

    def ask(
        self, method: str, path: str, body: Any = None, timeout: float = 30.0
    ) -> tuple[int, dict[str, Any]]:
        return ask(str(self.place.socket), method, path, body, timeout)

    def status(self) -> dict[str, Any] | None:
        """The daemon's status, or None when no daemon answers."""
        try:
            code, answer = self.ask("GET", "/v1/status", timeout=10.0)
        except (OSError, http.client.HTTPException, ValueError):
            return None
        if code != 200:
            raise DaemonError(f"the daemon at {self.place.socket} refused: {answer.get('error', code)}")
        return answer

    def stop(self, timeout: float = STOP_TIMEOUT) -> bool:
        """Stop the daemon and wait until it has gone (its lock released and its process ended); False when none
        ran."""
        pid = _pid(self.place)
        try:
            self.ask("POST", "/v1/stop")
        except (OSError, http.client.HTTPException, ValueError):
            return False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not _locked(self.place) and (pid is None or _ended(pid)):
                return True
            time.sleep(0.1)
        raise DaemonError(
            f"the daemon did not stop within {timeout:g} s",
            hint=f"its pid is in {self.place.pid_file}; end it with kill",
        )

    def cancel(self, request_id: str, signum: str = "TERM") -> dict[str, Any]:
        code, answer = self.ask("POST", f"/v1/cancel/{request_id}?signal={signum}")
        if code != 200:
            raise DaemonError(answer.get("error", f"cancel failed ({code})"))
        return answer

    def start(self, idle: float) -> dict[str, Any]:
        """Start a daemon in the background (under the start lock: one at a time) and wait until it answers."""
        import filelock

        self.place.make()
        with filelock.FileLock(str(self.place.start_lock), timeout=START_TIMEOUT):
            return self._start_locked(idle)

    def _start_locked(self, idle: float) -> dict[str, Any]:
        status = self.status()
        if status is not None:
            if status.get("identity") == identity():
                return status
            self.stop()  # another version's daemon: never a stale answer
        import subprocess

        with open(self.place.log, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "autobatch", "serve", "--idle", str(idle)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                cwd="/",
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            status = self.status()
            if status is not None:
                return status
            if process.poll() is not None and not _locked(self.place):
                break
            time.sleep(0.1)
        raise DaemonError(
            f"the daemon did not start (exit code {process.poll()})",
            hint=f"its log says why: {self.place.log} (autobatch daemon logs)",
        )

    def run(self, argv: Sequence[str]) -> int:
        """Run ``autobatch ARGV`` through the daemon, printing its output as it comes; its exit code.

        Ctrl-C (and SIGTERM, SIGHUP) is passed on to the command, which stops its probes and keeps what it
        measured, as in-process; a second one leaves without waiting (the daemon then ends the command). A
        connection that breaks once the daemon runs the command is closed (the daemon ends the command, as for
        any client that goes away), the command's end is waited for (:meth:`outlive`), and :class:`_Broken` says
        what was heard of it: whatever runs the command next runs after it."""
        import resource

        from autobatch.devices.cgroup import cgroup_memory

        # the job's (a container's, a job's --mem): the command's probes run in the daemon's
        cgroup = cgroup_memory()
        body: dict[str, Any] = {
            "argv": list(argv),
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "sys_path": list(sys.path),
            "cgroup": list(cgroup) if cgroup is not None else None,
            # the job's own (a job script's ulimit): the command takes them on (autobatch.daemon.zygote)
            "limits": {name: list(resource.getrlimit(getattr(resource, name))) for name in LIMITS},
            "umask": _umask(),  # the files the command writes get the modes they get in-process
            "cores": sorted(os.sched_getaffinity(0)),  # a job's CPU binding: its threads, and their memory
            "nice": os.getpriority(
                os.PRIO_PROCESS, 0
            ),  # a job's `nice -n`: its probes get the job's share of the CPU
        }
        response = request(str(self.place.socket), "POST", "/v1/run", json.dumps(body).encode())
        if response.status != 200:
            refused = json.loads(response.read() or b"{}")
            response.close()
            raise DaemonError(f"the daemon refused the command: {refused.get('error', response.status)}")
        state: dict[str, Any] = {"id": None, "pid": None, "signals": 0, "wrote": False}

        def on_signal(signum: int, _frame: Any) -> None:
            state["signals"] += 1
            if state["signals"] > 1 or state["id"] is None:
                raise KeyboardInterrupt
            try:
                self.cancel(state["id"], signal.Signals(signum).name.removeprefix("SIG"))
            except (OSError, http.client.HTTPException, DaemonError, ValueError):
                raise KeyboardInterrupt from None

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            return _relay(response, state)
        except KeyboardInterrupt:
            return EXIT_SIGINT if state["signals"] < 2 else EXIT_SIGTERM
        except (OSError, http.client.HTTPException, ValueError) as exc:
            response.close()
            self.outlive(state)
            raise _Broken(str(exc) or type(exc).__name__, state) from exc
        finally:
            for each, handler in previous.items():
                signal.signal(each, handler)
            response.close()

    def outlive(self, state: dict[str, Any]) -> None:
        """Wait until the command the daemon ran for this client has ended, :data:`END_WAIT` at most (the
        connection closed, the daemon ends it as it ends any client's that goes away: SIGTERM, then SIGKILL after
        :data:`CANCEL_GRACE`; a second SIGTERM of ours would cut short the clean-up that keeps what it measured).
        ``state["ended"]`` says whether it did, ``state["daemon"]`` whether the daemon still answers (one that
        died took its commands with it)."""
        pid = state["pid"]
        deadline = time.monotonic() + END_WAIT
        while pid is not None and not _ended(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        state["ended"] = pid is None or _ended(pid)
        try:
            state["daemon"] = self.status() is not None
        except DaemonError:
            state["daemon"] = True


def _relay(response: http.client.HTTPResponse, state: dict[str, Any]) -> int:
    """Print the command's output as its lines come; its exit code (128 + N for a signal N)."""
    while True:
        line = response.readline()
        if not line:
            raise ConnectionError("the answer ended before the command did")
        message = json.loads(line)
        if "out" in message:
            state["wrote"] = True
            sys.stdout.write(message["out"])
            sys.stdout.flush()
        elif "err" in message:
            sys.stderr.write(message["err"])
            sys.stderr.flush()
        elif "id" in message:
            state["id"], state["pid"] = message["id"], message.get("pid")
        elif "exit" in message:
            code = int(message["exit"])
            if code >= 0:
                return code
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            # what a shell prints of a command a signal ended: this one ran in the daemon, not in the shell
            print(
                f"autobatch: the command was ended by {name} in the daemon (autobatch daemon logs)",
                file=sys.stderr,
            )
            return 128 - code


def _pid(place: Place) -> int | None:
    """The running daemon's pid, from its pid file (None: none written, or unreadable)."""
    try:
        return int(place.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _ended(pid: int) -> bool:
    """Has process ``pid`` ended (gone, or a zombie its parent has yet to reap)?"""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _locked(place: Place) -> bool:
    """Does a daemon hold its lock (run, or still start or stop)?"""
    import fcntl

    try:
        with open(place.lock, "a+") as held:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(held, fcntl.LOCK_UN)
            return False
    except OSError:
        return False


def route(argv: Sequence[str]) -> int | None:
    """The exit code of ``autobatch ARGV`` run through the daemon, or None to run it in-process."""
    from autobatch.records import daemon_events as events

    if not argv or argv[0] not in ROUTED or events.inside():
        return None
    ours = argv[: list(argv).index("--")] if "--" in argv else argv
    if "--help" in ours or "-h" in ours:
        return None
    mode = _mode(ours)
    if mode is None or mode == "off":
        return None
    client = Client()
    try:
        status = client.status()
        if status is None or status.get("identity") != identity():
            setting = _setting(ours)  # the idle time a started daemon keeps
            if setting is None:
                return None  # the command reports what is wrong with its settings
            client.start(setting[1])
        return client.run(argv)
    except _Broken as broken:
        _after_break(broken, mode)
        return None
    except (OSError, http.client.HTTPException, DaemonError, ValueError) as exc:
        if mode == "on":
            if isinstance(exc, DaemonError):
                raise
            hint = "autobatch daemon logs"
            if isinstance(exc, OSError) and str(exc.filename or "").startswith(str(client.place.folder)):
                hint = (
                    f"the daemon's folder {client.place.folder} cannot be made or used: point AUTOBATCH_DAEMON_DIR "
                    "(or XDG_RUNTIME_DIR) at a folder of yours, or run in-process (AUTOBATCH_DAEMON=auto or off)"
                )
            raise DaemonError(f"the daemon cannot be reached: {exc}", hint=hint) from exc
        why = exc.message if isinstance(exc, DaemonError) else str(exc)
        print(
            f"note: the autobatch daemon cannot be reached ({why}); running in this process", file=sys.stderr
        )
        return None


def _after_break(broken: _Broken, mode: str) -> None:
    """The note that the command runs here, after a connection that broke while the daemon ran it
    (:meth:`Client.run` waited for the daemon's run of it to end); an error under ``on``, or once the command's
    answer had begun on stdout (run again, it would be written twice)."""
    state = broken.state
    where = (
        "the autobatch daemon ended"
        if not state["daemon"]
        else "the connection to the autobatch daemon broke"
    )
    what = f"{where} while it ran this command ({broken.message})"
    if state["wrote"]:
        raise DaemonError(
            f"{what}, after the command's answer had begun on stdout: not run again, which would write it twice",
            hint="run it again (a tune it finished is served from the cache); autobatch daemon logs says how it ended",
        )
    ended = (
        "its run there has ended"
        if state["ended"]
        else f"its run there has not ended after {END_WAIT:g} s, and is waited for as any run on the device"
    )
    if mode == "on":
        raise DaemonError(
            f"{what}; {ended}",
            hint="run it again: a tune picks up the probes measured so far (autobatch daemon logs)",
        )
    print(
        f"note: {what}; {ended}: running it in this process (a tune picks up the probes measured so far)",
        file=sys.stderr,
    )


def _mode(ours: Sequence[str]) -> str | None:
    """The ``daemon`` setting for this command: its environment variable when it names a mode (it overrides
    any config file, and reading it spares the client the settings' import), else the settings'."""
    from autobatch.core.daemon_mode import DAEMON_ENV, DAEMON_MODES

    named = os.environ.get(DAEMON_ENV, "").strip()
    if named in DAEMON_MODES:
        return named
    setting = _setting(ours)
    return setting[0] if setting is not None else None


def _setting(ours: Sequence[str]) -> tuple[str, float] | None:
    """The ``daemon`` and ``daemon_idle`` settings for this command (None: let the command report the error)."""
    from autobatch.errors import ConfigError
    from autobatch.settings import load_settings

    config = None
    for i, arg in enumerate(ours):
        if arg == "--config" and i + 1 < len(ours):
            config = ours[i + 1]
        elif arg.startswith("--config="):
            config = arg.split("=", 1)[1]
    try:
        settings = load_settings(config=config)
    except (ConfigError, OSError):
        return None
    return settings.daemon.daemon, settings.daemon.daemon_idle


def _umask() -> int:
    """This process's file mode creation mask (read by setting it, and set back)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask
