"""The daemon's warm path: a command it runs forks its probe server from the warm process (no fresh Python, no
torch import) and answers as in-process; its memory stays flat over hundreds of requests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT, run_cli

from autobatch.daemon.client import Client
from autobatch.daemon.place import Place

from .test_daemon import run_through, wait_for

SCRIPTS = ROOT / "tests" / "scripts"
#: A small tune whose maximum is below any cap, with room above the probe process's 310 MiB of imports (under
#: 400 MiB the room was 67 MiB, and runs spread from 165 to 256).
TUNE = ("tune", str(SCRIPTS / "small_cnn.py"), "--device", "cpu", "--memory", "700MiB", "-p", "32-true", "-o", "sgd",
        "--no-recompute", "--objective", "max-batch", "--no-cache", "--json", "--output", "r.json")  # fmt: skip


@pytest.fixture
def place() -> Iterator[Place]:
    folder = Path(tempfile.mkdtemp(prefix="abw-")) / "rt"
    here = Place(folder)
    yield here
    if (folder / "daemon.sock").exists():
        Client(here).stop(timeout=60)
    shutil.rmtree(folder.parent, ignore_errors=True)


def common_env(place: Place, tmp_path: Path) -> dict[str, str]:
    # The user's own wait policy is kept, so no probe server restarts with another one (a restart starts a
    # fresh Python: what OpenMP reads as it loads differs from the warm process's). The locks are the test's:
    # other tunes on the machine do not queue it.
    return {"OMP_WAIT_POLICY": "PASSIVE", "AUTOBATCH_LOCK_DIR": str(tmp_path / "locks"),
            "AUTOBATCH_DAEMON_DIR": str(place.folder)}  # fmt: skip


def below(pid: int) -> dict[int, str]:
    """The processes below ``pid``, with their command lines."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().split(")")[-1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        parent = todo.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                try:
                    found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                todo.append(child)
    return found


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _through_the_daemon(env: dict[str, str], tmp_path: Path) -> tuple[dict[int, str], dict]:
    """A tune through the daemon (started here), and the processes seen below the daemon while it ran."""
    assert run_cli("daemon", "start", env={**env, "AUTOBATCH_DAEMON": "on"}).returncode == 0
    status = Client(Place(Path(env["AUTOBATCH_DAEMON_DIR"]))).status()
    assert status is not None
    seen: dict[int, str] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            seen.update(below(int(status["pid"])))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        through = run_cli(*TUNE, cwd=tmp_path, env={**env, "AUTOBATCH_DAEMON": "on"})
    finally:
        done.set()
        watcher.join()
    assert through.returncode == 0, through.stderr
    assert len(seen) >= 4, seen  # the warm process, the command, its probe server, a probe at least
    return seen, json.loads(through.stdout)


@pytest.mark.slow
def test_a_tune_forks_its_probe_server_from_the_warm_process_and_answers_as_in_process(
    place: Place, tmp_path: Path
) -> None:
    # The fresh-process offset on, as users run: it counts what a forked server holds of the warm process's.
    env = {**common_env(place, tmp_path), "AUTOBATCH_FRESH_BASELINE": "true"}
    here = run_cli(*TUNE, cwd=tmp_path, env=env)
    assert here.returncode == 0, here.stderr
    seen, theirs = _through_the_daemon(env, tmp_path)
    started = [cmd for cmd in seen.values() if "autobatch.probe.server" in cmd]
    assert not started, f"a probe server started as a fresh Python: {started}"
    ours = json.loads(here.stdout)
    # The same answer up to the spread between any two runs on a loaded machine (a few percent); a forked
    # server's larger processes left uncounted would be off by far more.
    for mine, other in zip(theirs["combinations"], ours["combinations"]):
        assert abs(mine["max_batch_size"] - other["max_batch_size"]) <= 0.1 * other["max_batch_size"], (
            mine,
            other,
        )
    assert theirs["status"] == ours["status"]


@pytest.mark.slow
def test_with_the_fresh_process_offset_off_the_probe_server_starts_cold_and_answers_as_in_process(
    place: Place, tmp_path: Path
) -> None:
    """Without the offset, a forked server's peaks would count the warm process's memory: the examples' MLP
    under 440 MiB answered 34 through the daemon against 41 in-process (2026-11-29). The server starts as a
    fresh Python instead, as in-process."""
    env = common_env(place, tmp_path)  # the suite turns the offset off (tests/conftest.py)
    here = run_cli(*TUNE, cwd=tmp_path, env=env)
    assert here.returncode == 0, here.stderr
    seen, theirs = _through_the_daemon(env, tmp_path)
    assert any("autobatch.probe.server" in cmd for cmd in seen.values()), seen
    ours = json.loads(here.stdout)
    for mine, other in zip(theirs["combinations"], ours["combinations"]):
        assert abs(mine["max_batch_size"] - other["max_batch_size"]) <= max(
            1, 0.02 * other["max_batch_size"]
        ), (
            mine,
            other,
        )


@pytest.mark.slow
def test_commands_of_another_load_time_environment_get_a_warm_process_of_their_own(
    place: Place, tmp_path: Path
) -> None:
    """A client whose OpenMP threads differ from the daemon's (``OMP_NUM_THREADS``, read as the library loads):
    its first command is forked from the daemon's own warm process and starts its probe server as a fresh Python
    (a fork would keep the daemon's threads), a warm process of its environment starts beside it, and the next
    commands are forked from that one: no fresh Python, the answer in-process gives. That warm process killed
    costs the daemon nothing: the next command of its environment is served, and another one starts."""
    env = {**common_env(place, tmp_path), "AUTOBATCH_FRESH_BASELINE": "true", "AUTOBATCH_DAEMON": "on"}
    other = {**env, "OMP_NUM_THREADS": "1"}
    check = ("check", str(SCRIPTS / "small_cnn.py"), "--batch-size", "4", "--device", "cpu", "--memory", "700MiB",
             "-p", "32-true", "-o", "sgd", "--steps", "3", "--json")  # fmt: skip
    here = run_cli(*check, cwd=tmp_path, env={**other, "AUTOBATCH_DAEMON": "off"})
    assert here.returncode == 0, here.stderr
    assert run_cli("daemon", "start", env=env).returncode == 0
    status = Client(place).status()
    assert status is not None and len(status["warm_processes"]) == 1
    daemon = int(status["pid"])

    def through(expect_fresh: bool) -> dict:
        seen: dict[int, str] = {}
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.05):
                seen.update(below(daemon))

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            run = run_cli(*check, cwd=tmp_path, env=other)
        finally:
            done.set()
            watcher.join()
        assert run.returncode == 0, run.stderr
        fresh = [cmd for cmd in seen.values() if "autobatch.probe.server" in cmd]
        assert bool(fresh) is expect_fresh, seen
        return json.loads(run.stdout)

    def theirs() -> dict:
        ready = wait_for(lambda: [w for w in Client(place).status()["warm_processes"] if not w["own"]])  # type: ignore[index]
        (warm,) = ready
        assert warm["load_time_env"]["OMP_NUM_THREADS"] == "1", warm
        return warm

    through(expect_fresh=True)
    first = theirs()
    answer = through(expect_fresh=False)
    assert abs(answer["peak_bytes"] - json.loads(here.stdout)["peak_bytes"]) < 8 << 20, (answer, here.stdout)
    assert answer["fits"] is json.loads(here.stdout)["fits"] is True
    os.kill(first["pid"], signal.SIGKILL)
    wait_for(lambda: all(w["pid"] != first["pid"] for w in Client(place).status()["warm_processes"]))  # type: ignore[index]
    through(expect_fresh=True)  # from the daemon's own again, while another one of its environment starts
    assert theirs()["pid"] != first["pid"]
    status = Client(place).status()
    assert status is not None and int(status["pid"]) == daemon


@pytest.mark.slow
def test_the_daemons_memory_stays_flat_over_200_requests(place: Place, tmp_path: Path) -> None:
    env = {
        **common_env(place, tmp_path),
        "AUTOBATCH_CACHE_DIR": str(tmp_path / "cache"),
        "AUTOBATCH_DAEMON": "on",
    }
    # A tune served from the result cache: the cheapest request that runs a whole command (a check always probes).
    cached = (*TUNE[:-4], "--max-batch-size", "8", "--json", "--output", "r.json")
    assert run_cli(*cached, cwd=tmp_path, env={**env, "AUTOBATCH_DAEMON": "off"}).returncode == 0
    first = run_cli(*cached, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["cache"]["served"]
    status = Client(place).status()
    assert status is not None
    daemon = int(status["pid"])
    warm = next(pid for pid, cmd in below(daemon).items() if "autobatch.daemon.zygote" in cmd)
    # The requests themselves, as the command's client sends them, from this process: 200 client processes'
    # starts would measure nothing of the daemon's and cost this test two thirds of its time.
    for _ in range(10):  # past what the first requests allocate once (threads, buffers)
        assert run_through(place, list(cached), tmp_path, env) == 0
    before = rss(daemon), rss(warm)
    for _ in range(200):
        assert run_through(place, list(cached), tmp_path, env) == 0
    after = rss(daemon), rss(warm)
    assert after[0] < before[0] * 1.10, f"the daemon grew from {before[0]} to {after[0]} bytes"
    assert after[1] < before[1] * 1.10, f"the warm process grew from {before[1]} to {after[1]} bytes"


@pytest.mark.slow
def test_the_forked_half_is_measured_once_per_warm_process_and_replayed_until_it_restarts(
    place: Place, tmp_path: Path
) -> None:
    """Every probe server the warm process forks for one script starts from the same heap: the forked half of
    the fresh-process offset, counted against the kept fresh half, is measured by the first command and
    replayed for the next ones. A new warm process (the daemon started again) measures it again."""
    env = {
        **common_env(place, tmp_path),
        "AUTOBATCH_CACHE_DIR": str(tmp_path / "cache"),
        "AUTOBATCH_FRESH_BASELINE": "true",
        "AUTOBATCH_DAEMON": "on",
    }

    def fresh_process(cap: int) -> dict:
        # another cap each time: another result, not one served from the cache
        tune = (*TUNE[:-4], "--max-batch-size", str(cap), "--json", "--output", "r.json")
        done = run_cli(*tune, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["device"]["fresh_process"]

    assert run_cli("daemon", "start", env=env).returncode == 0
    first = fresh_process(4)  # both halves measured, the fresh one kept in the cache
    assert "kept" not in first and "forked_replayed" not in first, first
    measured = fresh_process(5)  # the forked half measured on a server forked from the warm process
    assert measured["kept"] and "forked_replayed" not in measured, measured
    replayed = fresh_process(6)
    assert replayed.get("forked_replayed") is True, replayed
    assert replayed["offset_bytes"] == measured["offset_bytes"], (replayed, measured)
    assert place.warm.exists()

    assert run_cli("daemon", "stop", env=env).returncode == 0
    assert not place.warm.exists()
    assert run_cli("daemon", "start", env=env).returncode == 0
    again = fresh_process(7)  # a new warm process: its servers' heap is measured again
    assert again["kept"] and "forked_replayed" not in again, again


@pytest.mark.slow
def test_the_script_s_import_and_inspection_are_replayed_until_the_config_file_they_read_changes(
    place: Place, tmp_path: Path
) -> None:
    """A command through the daemon replays what an earlier one's probe server found of the same script: that it
    imports cleanly (no process imports it only to check it) and what its model's inspection found (its
    blocks, its parameters: no probe builds the model for it). A config file the script read at import that
    changed is a new model: checked and inspected again, and its blocks are the new ones. With the cache off,
    the model is inspected each time."""
    work = tmp_path / "run"
    work.mkdir()
    shutil.copy(SCRIPTS / "configured_blocks.py", work / "train.py")
    config = work / "model.json"
    config.write_text(json.dumps({"width": 64, "depth": 2}))
    builds = tmp_path / "builds.log"
    env = {
        **common_env(place, tmp_path),
        "AUTOBATCH_CACHE_DIR": str(tmp_path / "cache"),
        "AUTOBATCH_FRESH_BASELINE": "true",
        "AUTOBATCH_DAEMON": "on",
        "BUILDS_LOG": str(builds),
    }

    def explain(**more: str) -> tuple[int, int, list[str]]:
        """The processes of an ``explain`` that only imported the script (the server's check) and that built the
        model and no batch (inspections), and the blocks its recomputation lever names."""
        builds.write_text("")
        done = run_cli("explain", "train.py", "--device", "cpu", "--memory", "600MiB", "--batch-size", "8",
                       "--json", cwd=work, env={**env, **more})  # fmt: skip
        assert done.returncode == 0, done.stderr
        seen: dict[str, set[str]] = {"import": set(), "build": set(), "batch": set()}
        for line in builds.read_text().splitlines():
            what, pid = line.split()
            seen[what].add(pid)
        levers = json.loads(done.stdout)["levers"]
        notes = [lever["description"] for lever in levers if lever["name"] == "recompute"]
        checks = seen["import"] - seen["build"] - seen["batch"]
        return len(checks), len(seen["build"] - seen["batch"]), notes

    two, three = ["activation checkpointing of Block x 2"], ["activation checkpointing of Block x 3"]
    assert run_cli("daemon", "start", env=env).returncode == 0
    assert explain() == (1, 1, two)
    assert explain() == (0, 0, two)
    config.write_text(json.dumps({"width": 64, "depth": 3}))
    assert explain() == (1, 1, three)
    assert explain() == (0, 0, three)
    assert explain(AUTOBATCH_CACHE="false")[1] == 1  # the model inspected again


#: An installed library: each process that imports it notes it in ``BUILDS_LOG``, and its ``width()`` imports a
#: module of its own at its first call (a lazy import, as ``Trainer.train()`` imports DeepSpeed's).
LIBRARY = """import os
with open(os.environ["BUILDS_LOG"], "a") as log:
    log.write(f"library {os.getpid()}\\n")


def width():
    from warmlib import sizes
    return sizes.WIDTH
"""
SIZES = """import os
with open(os.environ["BUILDS_LOG"], "a") as log:
    log.write(f"lazy {os.getpid()}\\n")
WIDTH = 64
"""


def _warm_parents(place: Place, count: int) -> list[dict]:
    """The daemon's warm parents once ``count`` of them are ready (within a minute)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = Client(place).status()
        assert status is not None
        ready = [parent for parent in status["warm_parents"] if parent["state"] == "ready"]
        if len(ready) >= count:
            return ready
        time.sleep(0.2)
    raise AssertionError(f"no {count} ready warm parent(s): {status['warm_parents']}")


def _library_env(place: Place, tmp_path: Path) -> tuple[dict[str, str], Path, Path, Path]:
    """(the environment of commands whose script imports a library of the user's, their working folder, the
    library's file, the file each process that imports it notes itself in)."""
    site = tmp_path / "site-packages"
    (site / "warmlib").mkdir(parents=True)
    library = site / "warmlib" / "__init__.py"
    library.write_text(LIBRARY)
    (site / "warmlib" / "sizes.py").write_text(SIZES)
    imports = tmp_path / "imports.log"  # outside the working folder, which probes do not write into
    work = tmp_path / "run"
    work.mkdir()
    env = {
        **common_env(place, tmp_path),
        "AUTOBATCH_CACHE_DIR": str(tmp_path / "cache"),
        "AUTOBATCH_FRESH_BASELINE": "true",
        "AUTOBATCH_DAEMON": "on",
        "BUILDS_LOG": str(imports),
        "PYTHONPATH": str(site),
    }
    return env, work, library, imports


@pytest.mark.slow
def test_a_script_s_library_stays_imported_in_a_warm_parent_until_its_file_changes(
    place: Place, tmp_path: Path
) -> None:
    """The modules a command's probe server warmed (the script's library) and those its probes imported
    themselves (the library's lazy import) are imported once more, by a warm parent of the command's
    environment and script, and the next such commands are forked from it: no process of theirs imports either. An edited library file retires the parent (never stale code), and
    a command whose budget is smaller than the one the parent imported under (a smaller data limit for the
    imports) starts its server as a fresh Python, while a larger one forks from the parent; each answers as the
    first."""
    env, work, library, imports = _library_env(place, tmp_path)

    def check(memory: str = "600MiB") -> tuple[int, float]:
        """(the processes that imported the library during a check through the daemon, its peak in MiB)."""
        imports.write_text("")
        done = run_cli("check", str(SCRIPTS / "library_user.py"), "--device", "cpu", "--memory", memory,
                       "--batch-size", "16", "--steps", "3", "--json", cwd=work, env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["fits"], answer
        return len(imports.read_text().splitlines()), answer["peak_bytes"] / (1 << 20)

    assert run_cli("daemon", "start", env=env).returncode == 0
    first, peak = check()
    assert first >= 1  # its probe server (and the job's fresh process) imported it
    parent = _warm_parents(place, 1)[0]
    # the library first (its server warmed it), then what the probes imported themselves (warmlib.sizes, a torch
    # submodule or two); torch itself is the warm process's
    assert parent["modules"][0] == "warmlib" and parent["cwd"] == str(work), parent
    status = run_cli("daemon", "status", env=env)
    assert f"warm parent pid {parent['pid']} (ready" in status.stderr, status.stderr

    for _ in range(2):
        again, peak_again = check()
        assert again == 0, "a command forked from the warm parent imported the library"
        assert abs(peak_again - peak) < 0.02 * peak, (peak_again, peak)

    library.write_text(LIBRARY + "# edited\n")
    edited, _ = check()
    assert (
        edited >= 1
    )  # the parent is retired: the command came from the warm process, its server imported it
    replaced = _warm_parents(place, 1)[0]
    assert replaced["pid"] != parent["pid"]

    larger, peak_larger = check("700MiB")  # the parent imported under a smaller limit: forked from it still
    assert larger == 0 and abs(peak_larger - peak) < 0.02 * peak, (peak_larger, peak)
    # imported under a larger limit than this one's: a fresh server's own import
    smaller, peak_smaller = check("500MiB")
    assert smaller >= 1 and abs(peak_smaller - peak) < 0.02 * peak, (peak_smaller, peak)
    # and the parent is replaced by one of the smaller limit, which serves both budgets
    deadline = time.monotonic() + 60
    while (now := _warm_parents(place, 1)[0])["data_limit"] == replaced["data_limit"]:
        assert time.monotonic() < deadline, now
        time.sleep(0.2)
    assert now["data_limit"] < replaced["data_limit"]
    assert check("500MiB")[0] == 0 and check()[0] == 0


@pytest.mark.slow
def test_the_next_job_of_the_same_environment_forks_from_the_parent_the_last_one_left(
    place: Place, tmp_path: Path
) -> None:
    """Ten jobs of one user on a node: each job's scheduler variables name it (its id, its task's pid), and
    the script's libraries stay imported for the next job all the same; a variable of another kind (a setting a
    library may read as it loads) makes an environment of its own."""
    env, work, _, imports = _library_env(place, tmp_path)

    def job(number: int, **more: str) -> int:
        """The processes that imported the library during a check of job ``number`` through the daemon."""
        imports.write_text("")
        scheduler = {"SLURM_JOB_ID": str(1000 + number), "SLURM_JOBID": str(1000 + number),
                     "SLURM_TASK_PID": str(40000 + number), "SLURM_JOB_NAME": f"train-{number}"}  # fmt: skip
        done = run_cli("check", str(SCRIPTS / "library_user.py"), "--device", "cpu", "--memory", "600MiB",
                       "--batch-size", "16", "--steps", "3", cwd=work, env={**env, **scheduler, **more})  # fmt: skip
        assert done.returncode == 0, done.stderr
        return len(imports.read_text().splitlines())

    assert run_cli("daemon", "start", env=env).returncode == 0
    assert job(1) >= 1
    parent = _warm_parents(place, 1)[0]
    assert job(2) == 0 and job(3) == 0  # forked from job 1's parent
    assert [p["pid"] for p in _warm_parents(place, 1)] == [parent["pid"]]
    assert job(4, WARMLIB_MODE="other") >= 1  # another environment: not from that parent


@pytest.mark.slow
def test_a_warm_parent_that_dies_costs_the_commands_it_ran_only(place: Place, tmp_path: Path) -> None:
    """A warm parent killed under a running tune: that command ends (exit 128 + 9, and says where), no probe
    process of it is left, and the next command is served (from the warm process)."""
    env, work, _library, _imports = _library_env(place, tmp_path)
    check = ("check", str(SCRIPTS / "library_user.py"), "--device", "cpu", "--memory", "600MiB", "-b", "16")
    assert run_cli("daemon", "start", env=env).returncode == 0
    assert run_cli(*check, cwd=work, env=env).returncode == 0
    parent = _warm_parents(place, 1)[0]
    tune = ("tune", str(SCRIPTS / "library_user.py"), "--device", "cpu", "--memory", "600MiB", "--no-cache",
            "--output", str(tmp_path / "r.json"))  # fmt: skip
    before = set(_pythons())
    done: dict[str, object] = {}
    runner = threading.Thread(target=lambda: done.update(run=run_cli(*tune, cwd=work, env=env)))
    runner.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = Client(place).status()
        assert status is not None
        tunes = [r for r in status["requests"] if r["argv"][0] == "tune" and r["state"].startswith("running")]
        if tunes and len(below(int(tunes[0]["pid"]))) >= 2:  # its probe server and a probe of it
            break
        time.sleep(0.1)
    os.kill(parent["pid"], signal.SIGKILL)
    runner.join(120)
    ended = done["run"]
    assert ended.returncode == 128 + signal.SIGKILL, ended.stderr  # type: ignore[attr-defined]
    assert "ended by SIGKILL in the daemon" in ended.stderr  # type: ignore[attr-defined]
    status = Client(place).status()
    assert status is not None and not status["requests"]
    time.sleep(1.0)  # the servers die with the command (their parent-death signal), their probes with them
    daemon = below(int(status["pid"]))
    # forked from this test's daemon: its warm process's command line, which names the daemon's folder
    ours = {pid: cmd for pid, cmd in _pythons().items() if str(place.folder) in cmd or str(tmp_path) in cmd}
    assert not {pid: cmd for pid, cmd in ours.items() if pid not in before and pid not in daemon}
    assert run_cli(*check, cwd=work, env=env).returncode == 0


def _pythons() -> dict[int, str]:
    """Every live Python process of the machine, with its command line (a zombie has none)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "python" in cmd:
                found[int(entry.name)] = cmd
    return found
