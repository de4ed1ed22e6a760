"""The daemon's cluster recipes: the systemd user unit, the SLURM prolog and epilog (run against a fake
``squeue`` on PATH), the job script whose calibration goes through the daemon."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

from autobatch.daemon.client import Client
from autobatch.daemon.place import Place

from .test_daemon import gone, wait_for

SLURM = ROOT / "scripts" / "slurm"
SHELL = [SLURM / "daemon-prolog.sh", SLURM / "daemon-epilog.sh", SLURM / "train.sbatch"]
UNIT = ROOT / "scripts" / "systemd" / "autobatch.service"


@pytest.mark.parametrize("script", SHELL, ids=[p.name for p in SHELL])
def test_the_scripts_are_valid_bash_and_shellcheck_clean(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    if shutil.which("shellcheck"):
        checked = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, check=False)
        assert checked.returncode == 0, checked.stdout


def test_the_systemd_unit_parses() -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # verify also checks that ExecStart's program exists: point it at this environment's autobatch
    installed = Path(sys.executable).with_name("autobatch")
    if not installed.exists():
        pytest.skip("no autobatch executable beside this interpreter")
    unit = Path(os.environ.get("TMPDIR", "/tmp")) / f"autobatch-test-{os.getpid()}" / "autobatch.service"
    unit.parent.mkdir(exist_ok=True)
    try:
        text = UNIT.read_text()
        assert "ExecStart=%h/.venv/bin/autobatch serve" in text
        unit.write_text(text.replace("%h/.venv/bin/autobatch", str(installed)))
        done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, check=False)
    finally:
        shutil.rmtree(unit.parent, ignore_errors=True)
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr  # an unknown key is a warning


def slurm_env(place: Place, tmp_path: Path, job: int, queue: str | None) -> dict[str, str]:
    """The environment slurmd gives a prolog or epilog, with a fake ``squeue`` that lists ``queue`` (one job
    id a line) or fails (None)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    squeue = bin_dir / "squeue"
    answer = "exit 1" if queue is None else f"printf '%s' '{queue}'"
    squeue.write_text(f'#!/bin/bash\necho "$*" >> {tmp_path}/squeue.calls\n{answer}\n')
    squeue.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOBATCH_", "SLURM"))}
    return {
        **env, "PATH": f"{bin_dir}:{env['PATH']}", "PYTHONPATH": str(ROOT), "SLURM_JOB_ID": str(job),
        "SLURMD_NODENAME": "node7", "AUTOBATCH": f"{sys.executable} -m autobatch",
        "AUTOBATCH_DAEMON_DIR": str(place.folder),
    }  # fmt: skip


def run(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", str(SLURM / script)], env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr  # a prolog or epilog never fails the job
    return done


@pytest.mark.slow  # starts a daemon, whose warm process imports torch
def test_the_prolog_starts_the_daemon_once_and_the_epilog_stops_it_after_the_last_job(
    place: Place, tmp_path: Path
) -> None:
    run("daemon-prolog.sh", slurm_env(place, tmp_path, 101, None))
    first = Client(place).status()
    assert first is not None
    run("daemon-prolog.sh", slurm_env(place, tmp_path, 102, None))  # a second job: the same daemon
    assert Client(place).status()["pid"] == first["pid"]  # type: ignore[index]

    run("daemon-epilog.sh", slurm_env(place, tmp_path, 101, "101\n102\n"))  # job 102 still runs here
    assert Client(place).status()["pid"] == first["pid"]  # type: ignore[index]
    failed = run("daemon-epilog.sh", slurm_env(place, tmp_path, 102, None))  # squeue cannot answer: left
    assert "idle exit" in failed.stderr and Client(place).status() is not None
    run("daemon-epilog.sh", slurm_env(place, tmp_path, 102, "102\n"))  # the last one (still completing)
    wait_for(lambda: gone(int(first["pid"])), 60)
    assert Client(place).status() is None and not place.socket.exists()
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    assert (tmp_path / "squeue.calls").read_text().splitlines()[0] == f"-h -w node7 -u {user} -o %A"
    run("daemon-epilog.sh", slurm_env(place, tmp_path, 103, ""))  # none runs: nothing to stop, no error


@pytest.mark.slow
def test_the_job_scripts_calibration_goes_through_the_daemon(place: Place, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOBATCH_", "SLURM"))}
    env.update(
        AUTOBATCH=f"{sys.executable} -m autobatch", PYTHONPATH=str(ROOT), NO_COLOR="1", AUTOBATCH_DEVICE="cpu",
        AUTOBATCH_MEMORY="400MiB", AUTOBATCH_PRECISIONS="32-true", AUTOBATCH_OPTIMIZERS="sgd",
        AUTOBATCH_RECOMPUTE="false", AUTOBATCH_MAX_BATCH_SIZE="16", AUTOBATCH_CACHE_DIR=str(tmp_path / "cache"),
        AUTOBATCH_LOCK_DIR=str(tmp_path / "locks"), CALIBRATION_DIR=str(tmp_path / "calibration"),
        AUTOBATCH_DAEMON="on", AUTOBATCH_DAEMON_DIR=str(place.folder),
    )  # fmt: skip
    done = subprocess.run(
        ["bash", str(SLURM / "train.sbatch"), "--calibrate-only", str(ROOT / "examples" / "mlp.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "plan for " in done.stderr and list((tmp_path / "calibration").glob("*/autobatch.env"))
    status = Client(place).status()
    assert status is not None and status["served"] == 1  # the tune went through the daemon


def test_a_job_with_a_tmpdir_of_its_own_finds_the_nodes_daemon_and_locks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A scheduler's per-job TMPDIR (which tempfile follows) moves neither the daemon's folder nor the device
    locks: one daemon and one queue per node, where the recipes look (`/tmp/autobatch-daemon-UID`). Before, the
    daemon's default followed TMPDIR, so each job's command started a daemon of its own."""
    import tempfile

    from autobatch.run.locks import default_lock_dir

    for name in ("AUTOBATCH_DAEMON_DIR", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert Place.default().folder == Path("/tmp", f"autobatch-daemon-{os.getuid()}")
    assert default_lock_dir() == Path("/tmp/autobatch-locks")
    prolog = (SLURM / "daemon-prolog.sh").read_text()
    assert "folder=${AUTOBATCH_DAEMON_DIR:-/tmp/autobatch-daemon-$uid}" in prolog
