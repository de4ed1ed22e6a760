"""The daemon's spare fresh process: the job's fresh process started ahead, torch imported, taken by the next
request of the same environment; measured side by side with a new process, refused where it would differ, and
ended with the daemon."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from support import ROOT, run_cli

from autobatch.daemon.client import Client
from autobatch.daemon.place import Place
from autobatch.daemon.spares import malformed, spare_key

from .test_daemon import gone, wait_for

SCRIPTS = ROOT / "tests" / "scripts"
#: A short tune (a maximum below any cap, few probes); no cache, so that every run measures the job's fresh process.
TUNE = ("tune", str(SCRIPTS / "small_cnn.py"), "--device", "cpu", "--memory", "700MiB", "-p", "32-true", "-o",
        "sgd", "--no-recompute", "--objective", "max-batch", "--max-batch-size", "64", "--no-cache", "--json",
        "--output", "r.json")  # fmt: skip
#: The job's fresh process's data memory moves by about 0.1 MiB between any two new processes (the allocator's
#: arenas), measured here side by side; a spare that were another process (another environment, other
#: imports) would be off by MiBs.
SAME = 1 << 20


def asked(**env: str) -> dict:
    return {
        "env": {"PATH": "/usr/bin", **env},
        "cwd": "/",
        "nice": 0,
        "limits": [[-1, -1], [-1, -1]],
        "cores": [0],
    }


def test_the_spare_s_key_leaves_out_only_what_is_new_in_every_run_or_job() -> None:
    same = spare_key(asked(PWD="/a", AUTOBATCH_SCRATCH_ROOT="/s1", SLURM_JOB_ID="1", SHLVL="1"))
    assert same == spare_key(asked(PWD="/b", AUTOBATCH_SCRATCH_ROOT="/s2", SLURM_JOB_ID="2", SHLVL="2"))
    # anything else may be read as the interpreter and torch load: another key
    for other in ({"TMPDIR": "/t"}, {"OMP_NUM_THREADS": "1"}, {"LANG": "C"}, {"MY_SETTING": "x"}):
        assert spare_key(asked(**other)) != spare_key(asked()), other
    assert spare_key({**asked(), "cores": [0, 1]}) != spare_key(asked())
    assert spare_key({**asked(), "limits": [[1 << 30, -1], [-1, -1]]}) != spare_key(asked())
    assert malformed({"request": "r1", **asked()}) is None
    assert "malformed spare request" in (malformed({"request": "r1", "env": {}}) or "")


def _env(place: Place, tmp_path: Path) -> dict[str, str]:
    # the offset on, as users run (the suite turns it off elsewhere)
    return {"AUTOBATCH_DAEMON_DIR": str(place.folder), "AUTOBATCH_LOCK_DIR": str(tmp_path / "locks"),
            "OMP_WAIT_POLICY": "PASSIVE", "AUTOBATCH_FRESH_BASELINE": "true"}  # fmt: skip


def _fresh(env: dict[str, str], cwd: Path) -> dict:
    done = run_cli(*TUNE, cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["device"]["fresh_process"]


def _spares(place: Place) -> list[dict]:
    status = Client(place).status()
    assert status is not None
    return list(status["spares"])


@pytest.mark.slow  # a daemon, its warm process and spares each import torch; tunes
def test_a_spare_measures_the_jobs_fresh_process_as_a_new_process_does(place: Place, tmp_path: Path) -> None:
    env = _env(place, tmp_path)
    daemon = {**env, "AUTOBATCH_DAEMON": "on"}
    assert run_cli("daemon", "start", env=daemon).returncode == 0
    first = _fresh(daemon, tmp_path)  # no spare yet: a new process, and one is started after it
    assert first["spare"] == "none ready", first
    (waiting,) = wait_for(lambda: _spares(place))
    taken = _fresh(daemon, tmp_path)
    assert taken["spare"] == "taken", taken
    assert gone(waiting["pid"])  # it ended with its measurement
    cold = _fresh({**env, "AUTOBATCH_DAEMON": "off"}, tmp_path)  # in-process: a new process, as ever
    assert "spare" not in cold
    for new in (first, cold):  # the same process: the same memory, as two new ones are to each other
        assert abs(taken["job_bytes"][0] - new["job_bytes"][0]) < SAME, (taken, new)
        assert taken["own_import_bytes"] == pytest.approx(new["own_import_bytes"], abs=SAME)
    assert abs(first["job_bytes"][0] - cold["job_bytes"][0]) < SAME, (first, cold)


@pytest.mark.slow
def test_a_spare_of_another_environment_or_shadowed_by_the_working_folder_is_not_used(
    place: Place, tmp_path: Path
) -> None:
    daemon = {**_env(place, tmp_path), "AUTOBATCH_DAEMON": "on"}
    assert run_cli("daemon", "start", env=daemon).returncode == 0
    _fresh(daemon, tmp_path)
    (waiting,) = wait_for(lambda: _spares(place))
    # a variable of its own (read by nothing here, but a library could read it as it loads): another key
    other = _fresh({**daemon, "A_SETTING_OF_THE_JOB": "1"}, tmp_path)
    assert other["spare"] == "none ready", other
    # not taken (it is replaced by one of the new environment's: one spare at most)
    log = run_cli("daemon", "logs", "-n", "500", env=daemon).stdout
    assert f"measured by spare {waiting['pid']}" not in log, log
    # the working folder holds a module the spare imported from elsewhere (the job's process, started there,
    # imports the folder's): refused, and a new process measures it
    (pid,) = [s["pid"] for s in wait_for(lambda: [s for s in _spares(place) if s["pid"] != waiting["pid"]])]
    stdlib = Path(json.__file__).parent.parent / "numbers.py"
    assert "numbers" in _imported_with_torch()
    folder = tmp_path / "shadowing"
    folder.mkdir()
    shutil.copy(stdlib, folder / "numbers.py")  # the same module: the job runs as ever
    shadowed = _fresh({**daemon, "A_SETTING_OF_THE_JOB": "1"}, folder)
    assert shadowed["spare"].startswith("refused: the working folder's numbers.py"), shadowed
    assert wait_for(lambda: gone(pid), 30)


def _imported_with_torch() -> set[str]:
    import subprocess

    done = subprocess.run([sys.executable, "-c", "import sys, torch; print(' '.join(sys.modules))"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return set(done.stdout.split())


@pytest.mark.slow
def test_no_spare_survives_the_daemons_stop(place: Place, tmp_path: Path) -> None:
    daemon = {**_env(place, tmp_path), "AUTOBATCH_DAEMON": "on"}
    assert run_cli("daemon", "start", env=daemon).returncode == 0
    _fresh(daemon, tmp_path)
    (waiting,) = wait_for(lambda: _spares(place))
    assert b"--spare" in Path(f"/proc/{waiting['pid']}/cmdline").read_bytes()
    assert run_cli("daemon", "stop", env=daemon).returncode == 0
    deadline = time.monotonic() + 10
    while not gone(waiting["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(waiting["pid"])
    assert not list(place.folder.glob("spare-*.sock"))
    assert os.path.isdir(place.folder)
