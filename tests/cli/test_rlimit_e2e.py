"""A tune under the job's own resource limits (a job script's ``ulimit -d`` or ``ulimit -v``, limits SLURM
carries over from where the job was submitted): the CPU device's capacity is what they leave for data memory.
Before, under ``ulimit -d 1500000`` on this 24 GiB machine, the capacity was the host's 22.9 GiB and the first
probe's cap could not raise the hard limit: exit 3, "the training script raised ValueError ... not allowed to
raise maximum limit", blamed on the script; under ``ulimit -v 6000000``, a 20.6 GiB budget, 24 probes and 550 s
for what the limit stopped anyway."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support import EXAMPLES, daemon_served

pytestmark = pytest.mark.slow

#: The limits a job script set: soft and hard, as ``ulimit -d`` / ``ulimit -v`` set both. Under 1 GiB of address
#: space torch's libraries and the interpreter's mappings (some 400 MiB) leave the MLP about 600 MiB: a maximum
#: above 100, found in four probes (under 1.5 GiB the same four probes of some 1.1 GiB each took twice the CPU).
DATA_LIMIT = 700 << 20
SPACE_LIMIT = 1024 << 20
TUNE = ("tune", str(EXAMPLES / "mlp.py"), "--device", "cpu", "-p", "32-true", "-o", "adamw", "--no-recompute",
        "--no-cache", "--json", "--output", "r.json")  # fmt: skip


def _run(*args: str, cwd: Path, which: int, limit: int) -> subprocess.CompletedProcess[str]:
    def limited() -> None:
        resource.setrlimit(which, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "autobatch", *args], cwd=cwd, capture_output=True, text=True, preexec_fn=limited,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}, timeout=600, check=False,
    )  # fmt: skip


def _bounded(done: subprocess.CompletedProcess[str], limit: int, name: str) -> None:
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["device"]["capacity_bytes"] <= limit, data["device"]
    (combination,) = data["combinations"]
    assert combination["status"] == "exact" and combination["max_batch_size"] > 8, combination
    assert combination["peak_bytes"] < limit
    assert not [t for t in combination["trace"] if t["kind"] in ("crash", "error")], combination["trace"]
    assert any(f"this process's {name}" in note for note in data["notes"]), data["notes"]


def test_a_tune_under_ulimit_d_fits_the_limit_and_a_memory_above_it_is_refused(tmp_path: Path) -> None:
    done = _run(*TUNE, cwd=tmp_path, which=resource.RLIMIT_DATA, limit=DATA_LIMIT)
    _bounded(done, DATA_LIMIT, "RLIMIT_DATA (ulimit -d)")
    # A cap above the limit would lift it in the probe, which the job cannot do: refused, naming the limit.
    over = _run(*TUNE[:4], "--memory", "1GiB", *TUNE[4:], cwd=tmp_path, which=resource.RLIMIT_DATA,
                limit=DATA_LIMIT)  # fmt: skip
    assert over.returncode == 2, over.stderr
    assert "RLIMIT_DATA (ulimit -d) lets it hold (700.00 MiB)" in " ".join(over.stderr.split())


def test_a_tune_under_ulimit_v_leaves_the_address_space_its_libraries_take(tmp_path: Path) -> None:
    done = _run(*TUNE, cwd=tmp_path, which=resource.RLIMIT_AS, limit=SPACE_LIMIT)
    _bounded(done, SPACE_LIMIT, "RLIMIT_AS (ulimit -v)")
    # torch's libraries and the interpreter's mappings take their share of the address space first
    assert json.loads(done.stdout)["device"]["capacity_bytes"] < SPACE_LIMIT - (100 << 20)


def test_through_a_daemon_started_without_them_the_clients_limits_bound_the_answer(tmp_path: Path) -> None:
    """A daemon started without the job's limits (a prolog's, a unit's) runs the command: it takes on the
    client's limits, which its probes then run under."""
    from autobatch.daemon.client import Client
    from autobatch.daemon.place import Place

    place = Place(Path(tempfile.mkdtemp(prefix="abr-")) / "rt")
    daemon = {"AUTOBATCH_DAEMON_DIR": str(place.folder), "AUTOBATCH_DAEMON": "on"}
    os.environ.update(daemon)  # the client inherits it
    try:
        started = subprocess.run([sys.executable, "-m", "autobatch", "daemon", "start"], capture_output=True,
                                 text=True, timeout=300, check=False)  # fmt: skip
        assert started.returncode == 0, started.stderr
        done = _run(*TUNE, cwd=tmp_path, which=resource.RLIMIT_DATA, limit=DATA_LIMIT)
        assert daemon_served(place) == 1  # it went through the daemon
        _bounded(done, DATA_LIMIT, "RLIMIT_DATA (ulimit -d)")
    finally:
        for key in daemon:
            os.environ.pop(key, None)
        Client(place).stop(timeout=60)
        shutil.rmtree(place.folder.parent, ignore_errors=True)
