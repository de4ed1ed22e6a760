"""``autobatch devices`` run as a command, over a stand-in ``pynvml`` (``tests/daemon/fake_pynvml``) first on
``PYTHONPATH``: there is no GPU and no driver on the development machines, so NVML's answers are the stand-in's,
and everything after them (the inventory, ``CUDA_VISIBLE_DEVICES``, the output) is the real command's."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from support import ROOT, run_cli

FAKE = ROOT / "tests" / "daemon" / "fake_pynvml"
MiB, GiB = 1 << 20, 1 << 30
A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"


def devices(tmp_path: Path, gpus: list[dict[str, Any]], **env: str) -> tuple[dict[str, Any], str]:
    """``autobatch devices --json`` over ``gpus``: the inventory and what it said on stderr."""
    state = tmp_path / "nvml.json"
    state.write_text(json.dumps({"devices": gpus}))
    path = os.pathsep.join([str(FAKE), str(ROOT), os.environ.get("PYTHONPATH", "")])
    done = run_cli(
        "devices", "--json", cwd=tmp_path, env={"PYTHONPATH": path, "AUTOBATCH_FAKE_NVML": str(state), **env}
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_an_idle_gpus_driver_reservation_is_not_memory_of_unlisted_processes(tmp_path: Path) -> None:
    # An idle A10 under driver 535: NVML's memory info v1 counts the 517 MiB the driver and firmware reserve as
    # used; v2 reports them apart, as CUDA's total leaves them out. No process is listed and none holds memory.
    idle = {"uuid": A, "bus": "00000000:17:00.0", "name": "NVIDIA A10", "total": 22 * GiB, "used": 0}
    inventory, said = devices(tmp_path, [{**idle, "reserved": 517 * MiB}])
    (gpu,) = inventory["gpus"]
    assert (gpu["used_bytes"], gpu["unlisted_bytes"]) == (0, 0)
    assert "no listed process accounts for" not in said
    assert gpu["reserved_bytes"] == 517 * MiB and gpu["free_bytes"] == 22 * GiB - 517 * MiB
    # one process listed, and memory no listed process holds (a container's neighbours): that much, no more
    busy = {**idle, "reserved": 517 * MiB, "used": 3 * GiB, "procs": [{"pid": 4_000_000, "used": GiB}]}
    (gpu,) = devices(tmp_path, [busy])[0]["gpus"]
    assert gpu["unlisted_bytes"] == 2 * GiB
    # a driver with version 1 alone: its used memory, the reservation in it, and the line says so
    inventory, said = devices(tmp_path, [{**idle, "used": 517 * MiB}])
    (gpu,) = inventory["gpus"]
    assert (gpu["used_bytes"], gpu["reserved_bytes"], gpu["unlisted_bytes"]) == (517 * MiB, None, 517 * MiB)
    assert "the driver's reservation" in " ".join(said.split())
