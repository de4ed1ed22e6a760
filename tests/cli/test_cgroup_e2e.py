"""A tune inside a real memory cgroup (a container's ``-m``, a SLURM job's ``--mem``): the CPU device's
capacity is the cgroup's room, not the host's free memory. Before, a 1.5 GiB cgroup on this 24 GiB machine
gave a 20.6 GiB budget, 20 probes, 26 kills by the kernel and an exit blaming "a crash, not memory".

Needs a memory cgroup this test may create (root, cgroup v1's memory controller or v2 with it delegated);
skipped, not faked, where there is none."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import EXAMPLES, SCRIPTS, daemon_served

pytestmark = pytest.mark.slow

LIMIT = 1536 << 20


class Cgroup:
    """A memory cgroup of the test's own, limited to ``LIMIT``."""

    def __init__(self, folder: Path, v2: bool) -> None:
        self.folder, self.v2 = folder, v2
        (folder / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(LIMIT))

    def oom_kills(self) -> int:
        events = (self.folder / ("memory.events" if self.v2 else "memory.oom_control")).read_text()
        counts = dict(line.split() for line in events.splitlines())
        return int(counts.get("oom_kill", 0))

    def run(self, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        """``autobatch ARGS`` in this cgroup."""
        return self.python("-m", "autobatch", *args, cwd=cwd)

    def python(self, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        """``python ARGS`` in this cgroup."""
        command = " ".join(shlex.quote(a) for a in (sys.executable, *args))
        procs = shlex.quote(str(self.folder / "cgroup.procs"))
        return subprocess.run(
            ["sh", "-c", f"echo $$ > {procs} && exec {command}"], cwd=cwd, capture_output=True, text=True,
            env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}, timeout=600, check=False,
        )  # fmt: skip


def _make(tmp_name: str) -> Cgroup | None:
    v1 = Path("/sys/fs/cgroup/memory")
    if (v1 / "memory.limit_in_bytes").exists():
        parent, v2 = v1, False
    elif "memory" in _read(Path("/sys/fs/cgroup/cgroup.subtree_control")).split():
        parent, v2 = Path("/sys/fs/cgroup"), True
    else:
        return None
    folder = parent / tmp_name
    try:
        folder.mkdir()
        return Cgroup(folder, v2)
    except OSError:
        if folder.exists():
            folder.rmdir()
        return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.fixture
def cgroup(tmp_path: Path) -> Iterator[Cgroup]:
    made = _make(f"autobatch-test-{os.getpid()}-{tmp_path.name}")
    if made is None:
        pytest.skip("no memory cgroup can be created here (not root, or no memory controller)")
    yield made
    deadline = time.monotonic() + 30
    while _read(made.folder / "cgroup.procs").strip() and time.monotonic() < deadline:
        time.sleep(0.1)
    made.folder.rmdir()


def test_a_tune_in_a_memory_cgroup_fits_the_cgroup_not_the_host(cgroup: Cgroup, tmp_path: Path) -> None:
    tune = ("tune", str(EXAMPLES / "mlp.py"), "--device", "cpu", "-p", "32-true", "-o", "adamw", "--no-recompute",
            "--no-cache", "--json", "--output", "r.json")  # fmt: skip
    done = cgroup.run(*tune, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["device"]["capacity_bytes"] < LIMIT, data["device"]
    (combination,) = data["combinations"]
    assert combination["status"] == "exact" and combination["max_batch_size"] > 8, combination
    assert not [t for t in combination["trace"] if t["kind"] == "crash"], combination["trace"]
    assert cgroup.oom_kills() == 0  # the cap stopped every probe, never the kernel
    assert any("the room left in the job's memory cgroup" in note for note in data["notes"]), data["notes"]
    # A cap the cgroup would never let a probe reach is refused, naming the cgroup.
    over = cgroup.run(*tune[:4], "--memory", "4GiB", *tune[4:], cwd=tmp_path)
    assert over.returncode == 2, over.stderr
    assert "more than the job's memory cgroup allows (1.50 GiB" in " ".join(over.stderr.split())


def test_through_a_daemon_outside_the_cgroup_the_clients_cgroup_bounds_the_answer(
    cgroup: Cgroup, tmp_path: Path
) -> None:
    """A daemon started outside the job's cgroup (a prolog's, a unit's) runs the command's probes in its own;
    the job runs in the client's. The client sends its cgroup with the request, and the capacity is its room."""
    from autobatch.daemon.client import Client
    from autobatch.daemon.place import Place

    place = Place(Path(tempfile.mkdtemp(prefix="abc-")) / "rt")
    daemon = {"AUTOBATCH_DAEMON_DIR": str(place.folder), "AUTOBATCH_DAEMON": "on"}
    os.environ.update(daemon)  # the client inside the cgroup inherits it
    try:
        started = subprocess.run([sys.executable, "-m", "autobatch", "daemon", "start"], capture_output=True,
                                 text=True, timeout=300, check=False)  # fmt: skip
        assert started.returncode == 0, started.stderr
        tune = ("tune", str(EXAMPLES / "mlp.py"), "--device", "cpu", "-p", "32-true", "-o", "adamw",
                "--no-recompute", "--no-cache", "--json", "--output", "r.json")  # fmt: skip
        done = cgroup.run(*tune, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert daemon_served(place) == 1  # it went through the daemon
        data = json.loads(done.stdout)
        assert data["device"]["capacity_bytes"] < LIMIT, data["device"]
        assert any("the room left in the job's memory cgroup" in note for note in data["notes"])
    finally:
        for key in daemon:
            os.environ.pop(key, None)
        Client(place).stop(timeout=60)
        shutil.rmtree(place.folder.parent, ignore_errors=True)


def test_a_command_run_for_a_client_names_the_clients_cgroup_limit_not_its_own(
    cgroup: Cgroup, tmp_path: Path
) -> None:
    """A daemon started in a cgroup of its own (a prolog's, a unit's) runs the command of a client no cgroup limits:
    the command's inventory names no limit on its host line (it named the daemon's), as the command sets it up
    (:func:`autobatch.devices.cgroup.for_job`, with what the client sent)."""
    code = (
        "from autobatch.devices.cgroup import for_job\n"
        "from autobatch.devices.inventory import read_inventory\n"
        "print(read_inventory().host.cgroup_limit_bytes)\n"  # in-process: its own cgroup is the job's
        "for_job(None)\n"  # the daemon's command, for a client no cgroup limits
        "print(read_inventory().host.cgroup_limit_bytes)\n"
    )
    done = cgroup.python("-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(LIMIT), "None"]


def test_the_dataloader_workers_get_their_room_in_the_cgroup(
    cgroup: Cgroup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop whose DataLoader forks two workers: they live in the job's cgroup, which counts them beside the
    process that trains. The budget is the cgroup's room less what they were measured to hold beside the job's
    fresh process (before, it was the whole room, and a warning told the user to do the subtraction)."""
    monkeypatch.delenv(
        "AUTOBATCH_FRESH_BASELINE"
    )  # the default: the job's process measured (the suite's: not)
    script = SCRIPTS / "as_is" / "loader_workers.py"
    tune = ("tune", str(script), "--device", "cpu", "--max-batch-size", "1000", "--no-cache", "--json",
            "--output", "r.json", "--", "--batch-size", "{batch}")  # fmt: skip
    done = cgroup.run(*tune, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    device = json.loads(done.stdout)["device"]
    workers = device["fresh_process"]["child_own_bytes"]  # measured beside the job's process, batch 2
    assert device["workers_bytes"] == workers > 0, device
    assert device["capacity_bytes"] + workers <= device["cgroup_room_bytes"] < LIMIT, device
    assert cgroup.oom_kills() == 0
    notes = " ".join(" ".join(json.loads(done.stdout)["notes"]).split())
    assert "lowered to" in notes and "DataLoader workers" in notes and "memory cgroup" in notes, notes
    assert "tune with --memory at its room less theirs" not in " ".join(done.stderr.split())
