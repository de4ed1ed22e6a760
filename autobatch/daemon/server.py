"""The daemon: HTTP/1.0 over a Unix socket (the standard library's ``http.server``), one thread per connection.

* ``GET /v1/status``: versions, pid, uptime, the requests running and queued.
* ``GET /v1/inventory``: what NVML says of the node's GPUs now (:class:`autobatch.devices.inventory.NvmlFacts`,
  as ``{"facts": ..., "counts": ...}``), from a reader kept open while it is used: NVML started once, the GPUs'
  fixed facts read once and again when they change, their memory and processes read at each request; after
  :data:`NVML_IDLE` without a read, NVML is let go and started again by the next. The
  commands the daemon runs read their inventory here; a scheduler can too, with no Python of its own
  (``curl --unix-socket SOCKET http://localhost/v1/inventory``).
* ``POST /v1/run`` (a JSON body: argv, cwd, env, sys_path): the command runs in a child forked from the
  zygote; the answer is a stream of JSON lines (``{"id", "pid"}``, then ``{"out": text}`` and ``{"err": text}``
  as the child writes them, then ``{"exit": code}``), ended by closing the connection. A client that goes away
  cancels its request: SIGTERM to the child's process group, SIGKILL after :data:`CANCEL_GRACE`.
* ``POST /v1/spare`` (a JSON body: the request's id, and what its job's fresh process would start with:
  :func:`autobatch.probe.spare.asked`): ``{"socket": path}`` of a spare fresh process of that key, handed out
  once, or ``{"socket": null}`` (:mod:`autobatch.daemon.spares`).
* ``POST /v1/cancel/ID?signal=TERM|INT``, ``POST /v1/stop``.

Every connection's peer credentials (``SO_PEERCRED``) are checked: another uid is refused (403). A body over
:data:`MAX_BODY`, more than :data:`MAX_REQUESTS` requests at once, a malformed request: an error with a JSON
body, and the daemon serves on. SIGTERM (or ``/v1/stop``) ends the daemon cleanly: every running command gets
SIGTERM, as an interrupted tune does (its partial results kept), and the daemon waits for them.
"""

from __future__ import annotations

import codecs
import contextlib
import datetime
import fcntl
import io
import itertools
import json
import os
import queue
import select
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from autobatch.daemon.client import CANCEL_GRACE, malformed_run
from autobatch.daemon.place import Place, identity
from autobatch.daemon.spares import Spares, malformed
from autobatch.devices.cpu import MALLOC_ENV
from autobatch.devices.inventory import NvmlReader
from autobatch.errors import DaemonError

#: Largest request body (the client's environment is its bulk).
MAX_BODY = 1 << 20
#: A larger body than this is not even read: the connection is closed.
MAX_DRAIN = 64 << 20
#: Requests running or queued at once.
MAX_REQUESTS = 64
#: The signals a client passes on to its command (``/v1/cancel/ID?signal=NAME``; anything else: SIGTERM).
CANCEL_SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "HUP": signal.SIGHUP}
#: Seconds the zygote may take to import torch and autobatch.
ZYGOTE_START = 300.0
#: Seconds the zygote gets to exit once it read end of file, before SIGKILL.
ZYGOTE_EXIT = 10.0
#: Seconds a connection may take to send its request.
READ_TIMEOUT = 30.0
#: Seconds without an inventory read after which the daemon lets NVML go (its device files closed: nothing of
#: ours holds the GPUs between bursts of jobs, say for a reset in a job's epilog); the next read starts it again.
NVML_IDLE = 300.0
#: Warm processes at most: the daemon's own, and one per other load-time environment its clients run with (the
#: least recently used one without a running command makes room for a new one).
MAX_WARM = 3


def log(message: str) -> None:
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    print(f"{now} autobatch daemon[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def peer_uid(connection: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket."""
    creds = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def refusal(peer: int, owner: int) -> str | None:
    """Why a peer of uid ``peer`` is refused by the daemon of ``owner`` (None: it is the owner)."""
    if peer == owner:
        return None
    return (
        f"this autobatch daemon belongs to uid {owner} and runs commands only for that user; "
        f'uid {peer} was refused: run your own (autobatch daemon start), or run without one (daemon = "off")'
    )


@dataclass
class Request:
    """One command the daemon runs for a client."""

    id: str
    argv: list[str]
    cwd: str
    since: float = field(default_factory=time.time)
    pid: int | None = None
    state: str = "starting"  # then "queued" or "running" as the device lock says
    warm: str = ""  # the key of the warm process that forked it (load_time_key)
    device: str = ""
    exit_code: int | None = None
    started: threading.Event = field(default_factory=threading.Event)
    #: Set once ``exit_code`` is known.
    exited: threading.Event = field(default_factory=threading.Event)

    def describe(self) -> dict[str, Any]:
        script = next((a for a in self.argv[1:] if a.endswith(".py")), "")
        return {
            "id": self.id,
            "command": self.argv[0] if self.argv else "",
            "argv": self.argv,
            "script": script,
            "cwd": self.cwd,
            "device": self.device,
            "state": self.state,
            "pid": self.pid,
            "since": datetime.datetime.fromtimestamp(self.since).astimezone().isoformat(timespec="seconds"),
        }


class Daemon:
    """The requests, the warm processes they are forked from, and the daemon's life (idle exit, clean stop)."""

    def __init__(self, place: Place, idle: float, owner: int | None = None) -> None:
        self.place, self.idle = place, idle
        self.owner = os.getuid() if owner is None else owner
        self.identity = identity()
        self.started = time.time()
        self.requests: dict[str, Request] = {}
        self.served = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.last_active = time.monotonic()
        self._ids = itertools.count(1)
        #: The warm processes by load-time environment (:func:`load_time_key`); the daemon's own is ``default``.
        self.warm: dict[str, Warm] = {}
        self.default: Warm | None = None
        self._starts: queue.SimpleQueue[Warm | None] = queue.SimpleQueue()
        threading.Thread(target=self._starter, name="warm starter", daemon=True).start()
        self.on_stop: Any = None  # set by serve(): stops the HTTP server
        #: NVML, open while commands read it (``GET /v1/inventory``): started at the first read, let go when idle.
        self.inventory = NvmlReader()
        #: The spare fresh processes: the job's fresh process of a request's key, started ahead for the next.
        self.spares = Spares(place.folder, log)

    # The warm processes ---------------------------------------------------------------------------------

    def start_own_warm(self) -> None:
        """Start the daemon's own warm process, with the daemon's environment; returns once it is ready."""
        warm = Warm(self, {**os.environ, **MALLOC_ENV}, self.place.warm)
        warm.start()
        self.default = warm
        self.warm[warm.key] = warm

    def _warm_for(self, request: Request, env: dict[str, str]) -> Warm:
        """The warm process ``request``, of environment ``env``, is forked from: the one started with its load-time
        environment when it is ready; else the daemon's own (whose forks start their probe servers as a fresh
        Python, as every command of another load-time environment did), and one of ``env``'s is started beside
        it for the next commands."""
        key = load_time_key(env)
        assert self.default is not None
        with self.lock:
            found = self.warm.get(key)
            if found is None and not self.stopping.is_set() and self._room():
                found = Warm(self, _warm_env(env), self.place.folder / f"warm-{_digest(key)}.json")
                self.warm[key] = found
                self._starts.put(found)
            if found is None or not found.ready.is_set():
                found = self.default
            found.last_used = time.monotonic()
            request.warm = found.key  # from now on it is busy: not ended to make room
            return found

    def _room(self) -> bool:
        """Whether another warm process may start (the least recently used one without a command ended if need
        be); called with the lock held."""
        if len(self.warm) < MAX_WARM:
            return True
        busy = {r.warm for r in self.requests.values()}
        idle = [
            w
            for w in self.warm.values()
            if w is not self.default and (w.ready.is_set() or w.failed) and w.key not in busy
        ]
        if not idle:
            return False
        oldest = min(idle, key=lambda w: w.last_used)
        del self.warm[oldest.key]
        log(f"warm process {oldest.pid} ({oldest.describe()['load_time_env']}) ended to make room")
        threading.Thread(target=oldest.close, daemon=True).start()
        return True

    def _starter(self) -> None:
        """Start the warm processes asked for, one at a time, for the daemon's life: from this thread, which
        outlives them (a warm process dies with the thread that started it: ``PR_SET_PDEATHSIG`` is the
        thread's)."""
        while True:
            warm = self._starts.get()
            if warm is None:
                return
            self._start(warm)

    def _start(self, warm: Warm) -> None:
        try:
            warm.start()
        except DaemonError as exc:
            warm.failed = (
                True  # kept, never ready: not started again for this environment, unless room is made
            )
            log(
                f"a warm process for {warm.describe()['load_time_env']} did not start ({exc.message}): its commands "
                "are forked from the daemon's own"
            )
            return
        log(f"warm process {warm.pid} started for {warm.describe()['load_time_env']}")

    def heard(self, warm: Warm, answer: dict[str, Any]) -> None:
        """What a warm process answered: the warm parents it keeps, a command forked, a command ended."""
        with self.lock:
            if "parents" in answer:
                warm.parents = list(answer["parents"])
            elif "started" in answer and answer["started"] in self.requests:
                request = self.requests[answer["started"]]
                request.pid = answer["pid"]
                request.started.set()
            elif "exited" in answer:
                for request in self.requests.values():
                    if request.pid == answer["exited"]:
                        request.exit_code = answer["code"]
                        request.exited.set()

    def lost(self, warm: Warm) -> None:
        """A warm process's end: the daemon's own stops the daemon; another one's costs its commands only (they
        died with it: SIGKILL)."""
        if self.stopping.is_set() or not warm.ready.is_set() or warm.closing:
            return
        if warm is self.default:
            log("the warm process died; stopping")
            self.stop()
            return
        log(f"warm process {warm.pid} died: its commands ended with it")
        with self.lock:
            if self.warm.get(warm.key) is warm:
                del self.warm[warm.key]
            for request in self.requests.values():
                if request.warm == warm.key and request.exit_code is None:
                    request.exit_code = -signal.SIGKILL
                    request.exited.set()

    # Requests ---------------------------------------------------------------------------------------------

    def submit(self, body: dict[str, Any], pipes: tuple[int, int, int]) -> Request:
        """Fork the command ``body`` asks for, with ``pipes`` (stdout, stderr, events write ends)."""
        with self.lock:
            if self.stopping.is_set():
                raise _Refused(503, "the daemon is stopping")
            if len(self.requests) >= MAX_REQUESTS:
                raise _Refused(503, f"the daemon runs {MAX_REQUESTS} requests already; retry later")
            request = Request(f"r{next(self._ids)}", list(body["argv"]), str(body["cwd"]))
            self.requests[request.id] = request
            self.last_active = time.monotonic()
        message = {"id": request.id, **{k: body[k] for k in ("argv", "cwd", "env", "sys_path")}}
        # the client's memory cgroup (autobatch.devices.cgroup.for_job) and resource limits (autobatch.daemon.zygote)
        for bound in ("cgroup", "limits", "umask", "cores", "nice"):
            message[bound] = body.get(bound)
        message["socket"] = str(self.place.socket)  # where the command reads its inventory
        self._warm_for(request, body["env"]).fork(message, pipes)
        if not request.started.wait(60):
            self.forget(request)
            raise _Refused(500, "the daemon's warm process did not fork the command")
        log(f"{request.id} pid {request.pid}: autobatch {' '.join(request.argv)} (in {request.cwd})")
        return request

    def forget(self, request: Request) -> None:
        with self.lock:
            self.requests.pop(request.id, None)
            self.served += 1
            self.last_active = time.monotonic()
        log(f"{request.id} ended with exit code {request.exit_code}")
        self.spares.ended(request.id)

    def cancel(self, request: Request, signum: int = signal.SIGTERM) -> None:
        """Signal the command's process group; SIGKILL it if it has not ended after :data:`CANCEL_GRACE`."""
        if request.pid is None or request.exit_code is not None:
            return
        log(f"{request.id}: cancelled ({signal.Signals(signum).name})")
        _killpg(request.pid, signum)

        def backstop() -> None:
            if not request.exited.wait(CANCEL_GRACE) and request.pid is not None:
                _killpg(request.pid, signal.SIGKILL)

        threading.Thread(target=backstop, daemon=True).start()

    def status(self) -> dict[str, Any]:
        with self.lock:
            requests = [r.describe() for r in self.requests.values()]
            ready = [w for w in self.warm.values() if w.ready.is_set()]
            parents = [parent for w in ready for parent in w.parents]
            warm = [w.describe() for w in ready]
        return {
            "pid": os.getpid(),
            "identity": self.identity,
            "socket": str(self.place.socket),
            "started": datetime.datetime.fromtimestamp(self.started)
            .astimezone()
            .isoformat(timespec="seconds"),
            "uptime_seconds": round(time.time() - self.started, 1),
            "idle_exit_seconds": self.idle,
            "served": self.served,
            "requests": requests,
            "warm_processes": warm,
            "warm_parents": parents,
            "spares": self.spares.describe(),
            "inventory": dict(self.inventory.counts),
        }

    # Life ---------------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """End every running command (SIGTERM, as an interrupted run) and stop serving; returns at once."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        with self.lock:
            running = list(self.requests.values())
        for request in running:
            self.cancel(request)
        if self.on_stop is not None:
            threading.Thread(target=self.on_stop, daemon=True).start()

    def watch_idle(self) -> None:
        while not self.stopping.wait(1.0):
            self.inventory.close_if_idle(NVML_IDLE)
            self.spares.reap()
            with self.lock:
                idle = not self.requests and time.monotonic() - self.last_active > self.idle
            if idle:
                log(f"no request for {self.idle:g} s: stopping")
                self.stop()

    def close(self) -> None:
        self.inventory.close()
        self.spares.close()
        self._starts.put(None)
        with self.lock:
            every = list(self.warm.values())
        for warm in every:
            warm.close()


class Warm:
    """A warm process (:mod:`autobatch.daemon.zygote`) started with one load-time environment (the variables
    native libraries read as they load: a process forked from it keeps what it read), and what the daemon knows of
    it: the warm parents it keeps, when it was last used. Its answers go to :meth:`Daemon.heard`."""

    def __init__(self, daemon: Daemon, env: dict[str, str], kept: Path) -> None:
        self.daemon, self.env, self.kept = daemon, env, kept
        self.key = load_time_key(env)
        self.pid: int | None = None
        self.since = time.time()
        self.last_used = time.monotonic()
        self.ready = threading.Event()
        self.failed = self.closing = False
        #: The warm parents it keeps (autobatch.daemon.parents), as it last described them.
        self.parents: list[dict[str, Any]] = []
        self._process: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._send = threading.Lock()

    def start(self) -> None:
        """Start it and wait until it has imported torch and autobatch (:data:`ZYGOTE_START` at most)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "autobatch.daemon.zygote", str(theirs.fileno()), str(self.kept)],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=self.env,  # MALLOC_ENV is read by glibc at start: probe servers forked from it need it
        )
        theirs.close()
        ours.settimeout(ZYGOTE_START)
        try:
            hello = ours.recv(4096)
        except OSError:
            hello = b""
        if not hello:
            self._process.kill()
            ours.close()
            raise DaemonError(
                "the daemon's warm process did not start (importing torch and autobatch failed)",
                hint="run `autobatch check` without the daemon to see the error, or read `autobatch daemon logs`",
            )
        ours.settimeout(None)
        self._control, self.pid = ours, self._process.pid
        self.since = time.time()
        self.ready.set()
        threading.Thread(target=self._hear, name=f"warm {self.pid}", daemon=True).start()

    def fork(self, message: dict[str, Any], pipes: tuple[int, int, int]) -> None:
        """Ask it to fork the command ``message`` describes, with ``pipes``."""
        assert self._control is not None
        with self._send:
            socket.send_fds(self._control, [json.dumps(message).encode()], list(pipes))

    def _hear(self) -> None:
        assert self._control is not None
        while True:
            try:
                message = self._control.recv(4096)
            except OSError:
                message = b""
            if not message:
                self.daemon.lost(self)
                return
            self.daemon.heard(self, json.loads(message))

    def describe(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "own": self
            is self.daemon.default,  # the daemon's own (else started for its commands' environment)
            "load_time_env": json.loads(self.key),
            "since": datetime.datetime.fromtimestamp(self.since).astimezone().isoformat(timespec="seconds"),
            "kept": self.kept.name,
        }

    def close(self) -> None:
        self.closing = True
        if self._control is not None:
            # shut down before closing: the thread that hears it is blocked in recv on this socket, and a close
            # alone leaves the connection open under it, so the warm process never read end of file and the stop
            # waited out the timeout below (10 s for every `autobatch daemon stop`)
            with contextlib.suppress(OSError):
                self._control.shutdown(socket.SHUT_RDWR)
            self._control.close()  # it reads end of file and exits
        if self._process is not None:
            try:
                self._process.wait(ZYGOTE_EXIT)
            except subprocess.TimeoutExpired:
                log(
                    f"the warm process {self.pid} did not exit within {ZYGOTE_EXIT:g} s of its end of file: killed"
                )
                self._process.kill()
        self.kept.unlink(missing_ok=True)


def load_time_key(env: Mapping[str, str]) -> str:
    """Which warm process a command of environment ``env`` is forked from: what native libraries read of it as
    they load (:func:`autobatch.probe.forked.load_time_env`), with the CPU's allocator pinned as every warm
    process and probe server starts."""
    from autobatch.probe.forked import load_time_env

    return json.dumps(load_time_env({**env, **MALLOC_ENV}), sort_keys=True)


def _warm_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a warm process for commands of ``env``: the daemon's own, its load-time variables those
    of ``env``."""
    from autobatch.probe.forked import load_time_env

    ours = {k: v for k, v in os.environ.items() if k not in load_time_env(os.environ)}
    return {**ours, **load_time_env({**env, **MALLOC_ENV})}


def _digest(key: str) -> str:
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()[:12]


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = False
    block_on_close = True

    def __init__(self, path: str, daemon: Daemon) -> None:
        self.daemon = daemon
        previous = os.umask(0o177)  # the socket is created 0600, never wider even for an instant
        try:
            super().__init__(path, Handler)
        finally:
            os.umask(previous)
        os.chmod(path, 0o600)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    default_request_version = "HTTP/1.0"  # a request too broken to name its version still gets a status line
    server: Server
    timeout = READ_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  # http.server's name
        log(format % args)

    def address_string(self) -> str:
        return "peer"

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        self._json(code, {"error": message or explain or "bad request"})

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        why = refusal(peer_uid(self.connection), self.server.daemon.owner)
        if why:
            log(f"refused a connection: {why}")
            self._json(403, {"error": why})
            return False
        return True

    def do_GET(self) -> None:
        if self.path == "/v1/status":
            self._json(200, self.server.daemon.status())
        elif self.path == "/v1/inventory":
            reader = self.server.daemon.inventory
            facts = reader.read()
            self._json(200, {"facts": facts.to_dict(), "counts": dict(reader.counts)})
        else:
            self._json(404, {"error": f"no such endpoint: GET {self.path}"})

    def do_POST(self) -> None:
        daemon = self.server.daemon
        try:
            body = self._body()
            if self.path == "/v1/run":
                if (why := malformed_run(body)) is not None:
                    raise _Refused(400, why)
                self._run(body)
            elif self.path.startswith("/v1/cancel/"):
                rid, _, query = self.path.removeprefix("/v1/cancel/").partition("?")
                with daemon.lock:
                    request = daemon.requests.get(rid)
                if request is None:
                    raise _Refused(404, f"no request {rid} runs")
                daemon.cancel(request, CANCEL_SIGNALS.get(query.removeprefix("signal="), signal.SIGTERM))
                self._json(200, {"cancelled": rid})
            elif self.path == "/v1/spare":
                if (why := malformed(body)) is not None:
                    raise _Refused(400, why)
                self._json(200, {"socket": daemon.spares.ask(body.pop("request"), body)})
            elif self.path == "/v1/stop":
                self._json(200, {"stopping": True})
                daemon.stop()
            else:
                raise _Refused(404, f"no such endpoint: POST {self.path}")
        except _Refused as refused:
            self._json(refused.status, {"error": refused.message})

    def _body(self) -> Any:
        raw_length = self.headers.get("Content-Length")
        try:
            length = int(raw_length or 0)
        except ValueError:
            raise _Refused(400, f"bad Content-Length: {raw_length!r}") from None
        if length > MAX_BODY:
            if length <= MAX_DRAIN:  # read and drop it, so that the client reads the answer
                left = length
                while left > 0:
                    chunk = self.rfile.read(min(left, 1 << 16))
                    if not chunk:
                        break
                    left -= len(chunk)
            else:
                self.close_connection = True
            raise _Refused(413, f"the request body is {length} bytes; at most {MAX_BODY} are accepted")
        if not length:
            return None
        try:
            return json.loads(self.rfile.read(length))
        except ValueError as exc:
            raise _Refused(400, f"the request body is not JSON: {exc}") from None

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = (json.dumps(payload) + "\n").encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass  # the client is gone

    def _run(self, body: dict[str, Any]) -> None:
        daemon = self.server.daemon
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ev_r, ev_w = os.pipe()
        try:
            request = daemon.submit(body, (out_w, err_w, ev_w))
        except BaseException:
            for fd in (out_r, err_r, ev_r):
                os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w, ev_w):
                os.close(fd)
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.end_headers()
            self.connection.settimeout(None)
            _Stream(daemon, request, self.connection, self.wfile).run(out_r, err_r, ev_r)
        finally:
            for fd in (out_r, err_r, ev_r):
                os.close(fd)
            if request.exit_code is None:  # the stream failed: its command ends, never left running unseen
                daemon.cancel(request)
                request.exited.wait()
            daemon.forget(request)


class _Stream:
    """Forward a command's stdout and stderr to its client as they come, then its exit code."""

    def __init__(
        self, daemon: Daemon, request: Request, connection: socket.socket, wfile: io.BufferedIOBase
    ) -> None:
        self.daemon, self.request = daemon, request
        self.connection, self.wfile = connection, wfile
        self.gone = False

    def send(self, payload: dict[str, Any]) -> None:
        if self.gone:
            return
        try:
            self.wfile.write((json.dumps(payload) + "\n").encode())
            self.wfile.flush()
        except OSError:
            self._client_gone()

    def _client_gone(self) -> None:
        if not self.gone:
            self.gone = True
            log(f"{self.request.id}: the client went away")
            self.daemon.cancel(self.request)

    def _closed(self) -> bool:
        """Has the client closed its end (a reset: it closed with output of ours unread, as a killed one does)?"""
        try:
            return not self.connection.recv(1, socket.MSG_PEEK)
        except OSError:
            return True

    def run(self, out: int, err: int, events: int) -> None:
        request = self.request
        self.send({"id": request.id, "pid": request.pid})
        names = {out: "out", err: "err"}
        decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in names}
        open_fds = {out, err, events}
        ended_at: float | None = None
        buffer = b""
        while open_fds:
            watched = list(open_fds) + ([] if self.gone else [self.connection.fileno()])
            readable, _, _ = select.select(watched, [], [], 0.1)
            if self.connection.fileno() in readable and self._closed():
                self._client_gone()
            for fd in readable:
                if fd not in open_fds:
                    continue
                data = os.read(fd, 1 << 16)
                if not data:
                    open_fds.discard(fd)
                elif fd == events:
                    buffer = self._events(buffer + data)
                else:
                    self.send({names[fd]: decoders[fd].decode(data)})
            if request.exit_code is not None:
                # Whatever the command wrote is in the pipes by now; a descendant that holds them open
                # does not keep the answer waiting.
                ended_at = ended_at or time.monotonic()
                if not readable and time.monotonic() - ended_at > 0.2:
                    break
        for fd, name in names.items():
            tail = decoders[fd].decode(b"", final=True)
            if tail:
                self.send({name: tail})
        request.exited.wait()
        self.send({"exit": request.exit_code})

    def _events(self, data: bytes) -> bytes:
        *lines, rest = data.split(b"\n")
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            self.request.state = (
                "running"
                if event.get("state") == "running"
                else ("queued" if event.get("state") == "queued" else "starting")
            )
            self.request.device = str(event.get("device", ""))
            at = event.get("at")
            stamp = (
                datetime.datetime.fromtimestamp(at).astimezone().isoformat(timespec="microseconds")
                if isinstance(at, (int, float))
                else "?"
            )
            log(f"{self.request.id}: device lock {event.get('state')} at {stamp} on {self.request.device}")
        return rest


def serve(place: Place, idle: float) -> None:
    """Run the daemon in this process until it is stopped (SIGTERM, SIGINT, SIGHUP, ``/v1/stop``, idle)."""
    place.make()
    held = open(place.lock, "a+")  # noqa: SIM115  # held for the daemon's whole life
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = place.pid_file.read_text().strip() if place.pid_file.exists() else "?"
        raise DaemonError(
            f"an autobatch daemon already runs for you on this node (pid {pid}, {place.socket})",
            hint="autobatch daemon status shows it; autobatch daemon stop ends it",
        ) from None
    for left in [
        *place.folder.glob("warm-*.json"),
        *place.folder.glob("spare-*.sock"),
    ]:  # a daemon killed outright left its warm processes' files
        left.unlink(missing_ok=True)
    daemon = Daemon(place, idle)
    daemon.start_own_warm()
    place.socket.unlink(missing_ok=True)  # a daemon that died left it: this one holds the lock now
    server = Server(str(place.socket), daemon)
    daemon.on_stop = server.shutdown
    place.pid_file.write_text(f"{os.getpid()}\n")

    def on_signal(signum: int, _frame: Any) -> None:
        log(f"{signal.Signals(signum).name}: stopping")
        daemon.stop()

    for each in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: the session `serve` ran in closed
        signal.signal(each, on_signal)
    threading.Thread(target=daemon.watch_idle, daemon=True).start()
    log(
        f"serving on {place.socket} (autobatch {daemon.identity['autobatch']}, torch {daemon.identity['torch']})"
    )
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()  # waits for every request's stream to end
        place.socket.unlink(missing_ok=True)
        place.pid_file.unlink(missing_ok=True)
        daemon.close()  # each warm process's file removed with it
        log("stopped")
        held.close()
