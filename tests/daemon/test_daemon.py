"""The daemon end to end: real daemons on a socket in a folder of the test's own, real commands through them,
held side by side with the same commands run in-process; and its faults, limits and credential check."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from support import ROOT, daemon_served, run_cli

from autobatch.daemon.client import Client, _Connection
from autobatch.daemon.place import Place
from autobatch.daemon.server import Daemon, Server, refusal

SCRIPTS = ROOT / "tests" / "scripts"
CHECK = ("check", str(SCRIPTS / "small_cnn.py"), "--batch-size", "4", "--device", "cpu", "--memory", "512MiB",
         "-p", "32-true", "-o", "sgd", "--steps", "3", "--json")  # fmt: skip
#: What a check measures (step times, peaks to the page) varies between any two runs, in-process or not.
MEASURED = ("peak_bytes", "step_peaks", "step_seconds", "samples_per_second", "wall_seconds")


def env_for(place: Place, mode: str = "auto") -> dict[str, str]:
    return {"AUTOBATCH_DAEMON_DIR": str(place.folder), "AUTOBATCH_DAEMON": mode}


def daemon_pid(place: Place) -> int:
    status = Client(place).status()
    assert status is not None
    return int(status["pid"])


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().split(")")[-1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def wait_for(condition, seconds: float = 120.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s: {condition}")


@pytest.mark.slow
def test_check_through_the_daemon_answers_as_in_process(place: Place, tmp_path: Path) -> None:
    here = run_cli(*CHECK, cwd=tmp_path)
    through = run_cli(*CHECK, cwd=tmp_path, env=env_for(place))
    assert (through.returncode, here.returncode) == (0, 0), through.stderr
    assert daemon_served(place) == 1  # it did go through the daemon
    ours, theirs = json.loads(here.stdout), json.loads(through.stdout)
    for key in MEASURED:
        ours.pop(key), theirs.pop(key)
    assert ours == theirs
    for run in (here, through):  # the same verdict line (its time stamp and figures differ)
        assert "32-true/sgd/no-recompute batch 4 on cpu: fits" in run.stderr.splitlines()[-1]
    # The client of a routed command reaches the daemon before Typer, rich or torch are imported.
    light = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "autobatch", *CHECK], cwd=tmp_path, capture_output=True,
        text=True, env={**os.environ, "NO_COLOR": "1", **env_for(place)}, check=False,
    )  # fmt: skip
    assert light.returncode == 0 and daemon_served(place) == 2
    assert not heavy(light.stderr), heavy(light.stderr)


@pytest.mark.slow
def test_commands_through_the_daemon_read_its_inventory_and_nvml_starts_once(
    place: Place, tmp_path: Path
) -> None:
    """``--device auto`` reads the inventory; through the daemon, from its reader (NVML started once in the
    daemon's process, never in a command), with the answer an in-process run gives. The reader follows the
    GPUs: one appearing is listed with no new start, a lost session starts NVML again. A stand-in ``pynvml``
    (``fake_pynvml/``) lists one GPU, hidden by ``CUDA_VISIBLE_DEVICES`` so that ``auto`` is the CPU here."""
    state = tmp_path / "nvml.json"
    gpu = {"uuid": "GPU-aaaa", "bus": "00000000:17:00.0", "name": "NVIDIA A100-SXM4-80GB", "total": 80 << 30}
    state.write_text(json.dumps({"devices": [{**gpu, "used": 1 << 30}]}))
    fake = {
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent / "fake_pynvml"), os.environ.get("PYTHONPATH", "")]
        ),
        "AUTOBATCH_FAKE_NVML": str(state),
        "CUDA_VISIBLE_DEVICES": "",
    }
    auto = [a if a != "cpu" else "auto" for a in CHECK]
    here = run_cli(*auto, cwd=tmp_path, env=fake)
    starts = state.with_suffix(".log")
    assert here.returncode == 0, here.stderr
    (in_process,) = starts.read_text().splitlines()  # the command started NVML itself
    runs = [run_cli(*auto, cwd=tmp_path, env={**fake, **env_for(place)}) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr
    pid = daemon_pid(place)
    assert starts.read_text().splitlines() == [in_process, f"init {pid}"]  # once, in the daemon
    status = Client(place).status()
    assert status is not None and status["served"] == 2
    assert status["inventory"] == {"starts": 1, "fixed_reads": 1, "reads": 2}
    ours, theirs = json.loads(here.stdout), json.loads(runs[-1].stdout)
    for key in MEASURED:
        ours.pop(key), theirs.pop(key)
    assert ours == theirs
    assert "device auto found no CUDA device" in runs[-1].stderr

    state.write_text(
        json.dumps({"devices": [{**gpu, "used": 3 << 30}, {**gpu, "uuid": "GPU-bbbb", "used": 0}]})
    )
    code, served = Client(place).ask("GET", "/v1/inventory")
    assert code == 200 and [(g["uuid"], g["used_bytes"]) for g in served["facts"]["gpus"]] == [
        ("GPU-aaaa", 3 << 30),
        ("GPU-bbbb", 0),
    ]
    assert served["counts"] == {"starts": 1, "fixed_reads": 2, "reads": 3}
    state.write_text(json.dumps({**json.loads(state.read_text()), "lost": 1}))
    code, served = Client(place).ask("GET", "/v1/inventory")
    assert code == 200 and len(served["facts"]["gpus"]) == 2
    assert served["counts"] == {"starts": 2, "fixed_reads": 3, "reads": 4}
    assert starts.read_text().splitlines()[-1] == f"init {pid}"


@pytest.mark.slow
def test_a_bad_script_exits_through_the_daemon_as_in_process(place: Place, tmp_path: Path) -> None:
    args = (
        "tune",
        str(SCRIPTS / "value_error.py"),
        "--device",
        "cpu",
        "--memory",
        "512MiB",
        "-p",
        "32-true",
        "-o",
        "sgd",
    )
    here = run_cli(*args, cwd=tmp_path)
    through = run_cli(*args, cwd=tmp_path, env=env_for(place))
    assert here.returncode == through.returncode == 3

    def errors(stderr: str) -> list[str]:  # the batch it fails at depends on the machine's noise
        return [re.sub(r"\d+", "N", line) for line in stderr.splitlines() if line.startswith("error:")]

    assert errors(here.stderr) == errors(through.stderr) != []
    assert daemon_served(place) == 1


@pytest.mark.slow
def test_a_command_through_the_daemon_keeps_its_own_temporary_folder(place: Place, tmp_path: Path) -> None:
    """A cluster job's ``TMPDIR`` is a folder of that job's, removed when it ends; the daemon (started by the first
    job's command, or a prolog) outlives it. Python's ``tempfile`` reads ``TMPDIR`` once and keeps it, so every
    command forked from the warm process used the first job's folder: after that job's end, a script that
    creates a temporary file at import failed in every probe of the next job."""
    jobs = Path(tempfile.mkdtemp(prefix="abj-"))  # short: a TMPDIR too long for sockets is warned about
    first, second, work = jobs / "1", jobs / "2", tmp_path / "work"
    for folder in (first, second, work):
        folder.mkdir()
    script = SCRIPTS / "scratch_at_import.py"
    record = tmp_path / "where.txt"
    env = {**env_for(place), "RECORD_TO": str(record)}
    args = (
        "check",
        str(script),
        "--batch-size",
        "4",
        "--device",
        "cpu",
        "--memory",
        "512MiB",
        "--steps",
        "3",
    )
    started = run_cli(*args, cwd=work, env={**env, "TMPDIR": str(first)})  # starts the daemon in job 1
    assert started.returncode == 0, started.stderr
    shutil.rmtree(first)  # job 1 ended: the scheduler's epilog removes its folder
    record.unlink()
    through = run_cli(*args, cwd=work, env={**env, "TMPDIR": str(second)})
    assert through.returncode == 0, through.stderr
    assert daemon_served(place) == 2
    assert set(record.read_text().split()) == {str(second)}  # the fresh process's and the probes'
    assert "warning" not in through.stderr
    shutil.rmtree(jobs)


@pytest.mark.slow
def test_the_files_a_command_writes_through_the_daemon_get_its_clients_modes(
    place: Place, tmp_path: Path
) -> None:
    """A daemon started under a umask that lets the group read (a prolog's, a shared project's 002) writes a
    client's files under the client's own umask (077: readable by its user alone), as an in-process run does:
    the result of a tune, its emitted configuration."""

    def run(mask: int, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "autobatch", *args],
            cwd=tmp_path, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=600,
            preexec_fn=lambda: os.umask(mask), check=False,
        )  # fmt: skip

    assert run(0o002, "daemon", "start", env=env_for(place)).returncode == 0
    tune = ("tune", str(SCRIPTS / "small_cnn.py"), "--device", "cpu", "--memory", "512MiB", "-p", "32-true",
            "-o", "sgd", "--no-recompute", "--emit", "env")  # fmt: skip
    here = run(0o077, *tune, "--output", "here.json")
    assert here.returncode == 0, here.stderr
    through = run(0o077, *tune, "--output", "through.json", env=env_for(place, "on"))
    assert through.returncode == 0, through.stderr
    assert daemon_served(place) == 1
    written = {path.name: stat.S_IMODE(path.stat().st_mode) for path in tmp_path.iterdir() if path.is_file()}
    assert written["here.json"] == written["through.json"] == 0o600, written
    assert set(written.values()) == {0o600}, written  # the emitted file too


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: a client cannot be bound to fewer")
def test_a_client_bound_to_fewer_cores_gets_the_answer_its_job_has(place: Place, tmp_path: Path) -> None:
    """torch starts a thread per core the process may run on, each with memory of its own: the maximum of
    examples/mlp.py under 600 MiB was 161 bound to one core of two and 134 on both. A command through the
    daemon ran on the daemon's cores, with the warm process's threads, and a bound job got 134."""
    one = {min(os.sched_getaffinity(0))}

    def tune(env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "autobatch", "tune", str(ROOT / "examples" / "mlp.py"), "--device", "cpu",
             "--memory", "600MiB", "-p", "32-true", "-o", "sgd", "--no-recompute", "--objective", "max-batch",
             "--no-cache", "--json"],
            cwd=tmp_path, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=600,
            preexec_fn=lambda: os.sched_setaffinity(0, one), check=False,
        )  # fmt: skip

    here = tune()
    assert here.returncode == 0, here.stderr
    assert run_cli("daemon", "start", env=env_for(place)).returncode == 0
    through = tune(env_for(place, "on"))
    assert through.returncode == 0, through.stderr
    assert daemon_served(place) == 1

    def maximum(done: subprocess.CompletedProcess[str]) -> int:
        return int(json.loads(done.stdout)["combinations"][0]["max_batch_size"])

    assert abs(maximum(through) - maximum(here)) <= 1, (maximum(here), maximum(through))


def niceness(pid: int) -> set[int]:
    """The niceness of each thread of process ``pid`` (Linux keeps one per thread; none once it has gone)."""
    found = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.add(int((task / "stat").read_text().split(")")[-1].split()[16]))
        except (OSError, IndexError, ValueError):
            pass
    return found


def probing(place: Place, client: subprocess.Popen[str]) -> dict[int, set[int]]:
    """The niceness of the command the daemon runs for ``client`` and of every process below it (its probe
    server, its probe), read while it probes."""

    def tree() -> list[int] | None:
        running = [r for r in (Client(place).status() or {}).get("requests", []) if r["pid"]]
        if not running:
            return None
        below = descendants(int(running[0]["pid"]))
        return [int(running[0]["pid"]), *below] if len(below) >= 2 else None

    seen = {pid: niceness(pid) for pid in wait_for(tree, 180)}
    return {pid: values for pid, values in seen.items() if values}


#: A check whose one probe lives for seconds (20 steps of a slow source): its processes are read as it runs.
SLOW_CHECK = ("check", str(SCRIPTS / "as_is" / "slow_source.py"), "--batch-size", "8", "--device", "cpu",
              "--memory", "512MiB", "--steps", "20", "--", "--batch-size", "{batch}")  # fmt: skip


def nice_client(place: Place, folder: Path, *prefix: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*prefix, sys.executable, "-m", "autobatch", *SLOW_CHECK], cwd=folder, text=True,
        env={**os.environ, "NO_COLOR": "1", "STEP_SECONDS": "0.3", **env_for(place, "on")},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def probed(place: Place, client: subprocess.Popen[str]) -> tuple[dict[int, set[int]], str]:
    """The niceness each process of ``client``'s command showed while it probed (:func:`probing`), and its
    standard error once it ended (it must exit 0)."""
    try:
        seen = probing(place, client)
        _, err = client.communicate(timeout=300)
    finally:
        client.kill()
    assert client.returncode == 0, err
    return seen, err


@pytest.mark.slow
def test_a_command_through_the_daemon_probes_at_its_clients_niceness(place: Place, tmp_path: Path) -> None:
    """A job script's `nice -n 5 autobatch check ...` through a daemon started at the job's own niceness: the
    command, its probe server and its probe run 5 above it, as they do in-process (they ran at the daemon's)."""
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert run_cli("daemon", "start", env=env_for(place)).returncode == 0
    seen, err = probed(place, nice_client(place, tmp_path, "nice", "-n", "5"))
    assert len(seen) >= 3 and all(values == {min(19, base + 5)} for values in seen.values()), seen
    assert "niceness" not in err


@pytest.mark.slow
def test_a_client_below_the_daemons_niceness_is_served_at_the_daemons_with_a_note(
    place: Place, tmp_path: Path
) -> None:
    """A daemon at nice 10 (started by a niced job's first command) may not lower a command's niceness: the
    command runs at 10, and says so in one line, with the fix."""
    import resource

    base = os.getpriority(os.PRIO_PROCESS, 0)
    if 20 - resource.getrlimit(resource.RLIMIT_NICE)[0] <= base:
        pytest.skip("RLIMIT_NICE lets the daemon lower its niceness")
    unprivileged: tuple[str, ...] = ()
    if os.getuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("no setpriv to start a root daemon without CAP_SYS_NICE")
        unprivileged = ("setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice")
    started = subprocess.run(
        ["nice", "-n", "10", *unprivileged, sys.executable, "-m", "autobatch", "daemon", "start"],
        env={**os.environ, **env_for(place)}, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    daemon = min(19, base + 10)
    seen, err = probed(place, nice_client(place, tmp_path))
    assert len(seen) >= 3 and all(values == {daemon} for values in seen.values()), seen
    notes = [line for line in err.splitlines() if "niceness" in line]
    assert notes == [
        f"note: this command runs at the autobatch daemon's niceness {daemon}, not its own {base} (the daemon may "
        f"not lower a command's): on a busy CPU its steps run slower than its job's will; to run at {base} "
        f"through the daemon, stop it (autobatch daemon stop) and let a command at nice {base} start it"
    ], err


@pytest.mark.slow
def test_start_status_stop_and_the_modes_of_its_files(place: Place) -> None:
    env = {"AUTOBATCH_DAEMON_DIR": str(place.folder)}
    started = run_cli("daemon", "start", env=env)
    assert started.returncode == 0, started.stderr
    assert stat.S_IMODE(place.folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(place.socket.stat().st_mode) == 0o600
    status = run_cli("daemon", "status", "--json", env=env)
    answer = json.loads(status.stdout)
    assert status.returncode == 0 and answer["requests"] == [] and answer["identity"]["torch"]
    assert run_cli("daemon", "start", env=env).returncode == 0  # a second start finds it running
    assert daemon_pid(place) == answer["pid"]
    assert run_cli("daemon", "stop", env=env).returncode == 0
    assert gone(answer["pid"]) and not place.socket.exists()
    # the warm process exits at the end of its control socket (it was killed after a 10 s wait once, when the
    # socket was closed under the thread that reads it: every stop took 10 s)
    assert "killed" not in place.log.read_text()
    assert run_cli("daemon", "status", env=env).returncode == 1


@pytest.mark.slow
def test_a_client_killed_mid_tune_ends_its_command_and_probes(place: Place, tmp_path: Path) -> None:
    client = subprocess.Popen(
        [sys.executable, "-m", "autobatch", "tune", str(SCRIPTS / "sleepy.py"), "--device", "cpu",
         "--memory", "512MiB", "-p", "32-true", "-o", "sgd", "--timeout", "300"],
        cwd=tmp_path, env={**os.environ, **env_for(place)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        request = wait_for(
            lambda: next((r for r in (Client(place).status() or {}).get("requests", []) if r["pid"]), None),
            180,
        )
        command = int(request["pid"])
        probes = wait_for(lambda: descendants(command), 120)  # its probe server, at least
    finally:
        client.kill()
        client.wait()
    wait_for(lambda: gone(command) and all(gone(pid) for pid in probes), 60)
    wait_for(lambda: Client(place).status()["requests"] == [], 30)  # type: ignore[index]
    assert run_cli(*CHECK, cwd=tmp_path, env=env_for(place)).returncode == 0  # the next one is served


@pytest.mark.slow
def test_a_daemon_killed_outright_leaves_nothing_that_blocks_the_next(place: Place, tmp_path: Path) -> None:
    assert run_cli("daemon", "start", env=env_for(place)).returncode == 0
    first = daemon_pid(place)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: gone(first), 30)
    assert place.socket.exists()  # left behind
    through = run_cli(*CHECK, cwd=tmp_path, env=env_for(place))
    assert through.returncode == 0, through.stderr
    assert "cannot be reached" not in through.stderr
    assert daemon_pid(place) != first


@pytest.mark.slow
def test_a_daemon_of_another_install_is_replaced(place: Place, tmp_path: Path) -> None:
    assert run_cli("daemon", "start", env=env_for(place)).returncode == 0
    first = daemon_pid(place)
    other = tmp_path / "other"
    shutil.copytree(ROOT / "autobatch", other / "autobatch", ignore=shutil.ignore_patterns("__pycache__"))
    through = run_cli(*CHECK, cwd=tmp_path, env={**env_for(place), "PYTHONPATH": str(other)})
    assert through.returncode == 0, through.stderr
    status = Client(place).status()
    assert status is not None and status["pid"] != first and gone(first)
    assert status["identity"]["package"] == str(other / "autobatch")


def raw(place: Place, payload: bytes) -> tuple[int, dict[str, object]]:
    connection = _Connection(str(place.socket), 30)
    try:
        connection.request("POST", "/v1/run", body=payload, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


@pytest.mark.slow  # starts a daemon, whose warm process imports torch
def test_malformed_and_oversized_requests_get_errors_and_the_daemon_serves_on(place: Place) -> None:
    assert run_cli("daemon", "start", env=env_for(place)).returncode == 0
    code, answer = raw(place, b"{not json")
    assert code == 400 and "not JSON" in str(answer["error"])
    code, answer = raw(place, json.dumps({"argv": "check", "cwd": "/nowhere"}).encode())
    assert code == 400 and "argv" in str(answer["error"]) and "cwd" in str(answer["error"])
    code, answer = raw(place, b"x" * (10 << 20))
    assert code == 413 and "at most" in str(answer["error"])
    limits = {"argv": ["check"], "cwd": "/", "env": {}, "sys_path": [], "limits": {"RLIMIT_NOFILE": [8, 8]}}
    code, answer = raw(place, json.dumps(limits).encode())  # only the memory limits, as [soft, hard]
    assert code == 400 and "limits: null or an object of RLIMIT_DATA, RLIMIT_AS" in str(answer["error"])
    code, answer = raw(place, json.dumps({**limits, "limits": None, "umask": 0o1777}).encode())
    assert code == 400 and "umask: null or a file mode creation mask" in str(answer["error"])
    code, answer = raw(place, json.dumps({**limits, "limits": None, "cores": []}).encode())
    assert code == 400 and "cores: null or a list of the CPU numbers" in str(answer["error"])
    with socket.socket(socket.AF_UNIX) as sock:  # not even HTTP
        sock.connect(str(place.socket))
        sock.sendall(b"\x00\x01garbage\r\n\r\n")
        assert b"400" in sock.recv(4096)
    status = Client(place).status()
    assert status is not None and status["requests"] == []


def test_a_daemon_folder_that_cannot_be_made_is_named_with_the_fix(tmp_path: Path) -> None:
    """With the daemon on, a folder for it that cannot be made (an unwritable XDG_RUNTIME_DIR, a path under a
    file) is an error naming the folder and the fix; the hint was "autobatch daemon logs", which had none."""
    (tmp_path / "a-file").write_text("")
    folder = tmp_path / "a-file" / "daemon"
    done = run_cli(*CHECK, cwd=tmp_path, env={"AUTOBATCH_DAEMON_DIR": str(folder), "AUTOBATCH_DAEMON": "on"})
    assert done.returncode == 1, done.stderr
    assert f"hint: the daemon's folder {folder} cannot be made or used" in done.stderr
    assert "AUTOBATCH_DAEMON_DIR" in done.stderr and "daemon logs" not in done.stderr


def test_another_uid_is_refused_with_a_clear_message() -> None:
    assert refusal(1000, 1000) is None
    assert "belongs to uid 1000" in str(refusal(1001, 1000))
    folder = Path(tempfile.mkdtemp(prefix="abd-"))
    try:
        place = Place(folder / "rt")
        place.make()
        server = Server(str(place.socket), Daemon(place, idle=60, owner=os.getuid() + 1))  # no warm process
        import threading

        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
        thread.start()
        try:
            code, answer = Client(place).ask("GET", "/v1/status")
            assert code == 403
            assert f"uid {os.getuid()} was refused" in str(answer["error"])
            assert stat.S_IMODE(place.socket.stat().st_mode) == 0o600
            assert stat.S_IMODE(place.folder.stat().st_mode) == 0o700
        finally:
            server.shutdown()
            server.server_close()
            thread.join()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_real_second_user_cannot_reach_the_socket() -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to act as a second user")
    folder = Path(tempfile.mkdtemp(prefix="abd-"))
    os.chmod(folder, 0o755)
    try:
        place = Place(folder / "rt")
        place.make()
        server = Server(str(place.socket), Daemon(place, idle=60))
        try:
            python = next(
                (p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None
            )
            if python is None:
                pytest.skip("no interpreter the second user may run")
            probe = subprocess.run(
                [python, "-c", f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({str(place.socket)!r})"],
                user=65534, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert probe.returncode != 0 and "PermissionError" in probe.stderr
        finally:
            server.server_close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def heavy(importtime: str) -> list[str]:
    """What ``-X importtime`` says was imported of Typer, rich and torch."""
    names = [
        line.split("|")[-1].strip() for line in importtime.splitlines() if line.startswith("import time:")
    ]
    return [name for name in names if name.split(".")[0] in ("typer", "rich", "torch")]


def test_the_command_entry_point_imports_neither_typer_rich_nor_torch() -> None:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import autobatch.cli, autobatch.daemon.client"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert heavy(out.stderr) == []


def test_the_client_path_does_not_import_torch() -> None:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import autobatch.daemon.client, autobatch.cli.daemon"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "torch" not in out.stderr


def rss(pid: int) -> int:
    """Resident memory of a process, in bytes (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def run_through(place: Place, argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> int:
    """``autobatch ARGV`` through the daemon, as the command's client sends it with this process's environment
    and ``env``; its output read and dropped; its exit code."""
    connection = _Connection(str(place.socket), 60)
    try:
        body = {"argv": argv, "cwd": str(cwd), "env": {**os.environ, **(env or {})}, "sys_path": sys.path}
        connection.request("POST", "/v1/run", body=json.dumps(body).encode())
        response = connection.getresponse()
        assert response.status == 200
        lines = [json.loads(line) for line in response.read().splitlines()]
        return int(next(line["exit"] for line in lines if "exit" in line))
    finally:
        connection.close()


@pytest.mark.slow  # starts a daemon, whose warm process imports torch
def test_the_daemons_memory_stays_flat_over_200_check_requests(place: Place, tmp_path: Path) -> None:
    # Checks of a script that is not there: each is a whole request to the daemon (a fork of its warm
    # process, the command's output streamed, its exit code), without a probe's seconds: what a check
    # measures lives in its own forked command, never in the daemon.
    argv = ["check", str(tmp_path / "missing.py"), "--batch-size", "4", "--device", "cpu"]
    assert run_cli("daemon", "start", env=env_for(place)).returncode == 0
    daemon = daemon_pid(place)
    (warm,) = descendants(daemon)  # the warm process every command is forked from
    for _ in range(10):  # buffers, thread stacks and caches of the first requests
        assert run_through(place, argv, tmp_path) == 2
    before = rss(daemon) + rss(warm)
    for _ in range(200):
        assert run_through(place, argv, tmp_path) == 2
    after = rss(daemon) + rss(warm)
    assert after < before * 1.10, f"{before / 2**20:.1f} MiB grew to {after / 2**20:.1f} MiB"
    assert daemon_served(place) == 210
