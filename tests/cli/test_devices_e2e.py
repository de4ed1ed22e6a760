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
MIG_A = "MIG-cccccccc-1111-2222-3333-444444444444"
MIG_B = "MIG-dddddddd-1111-2222-3333-444444444444"


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


#: One A100 as the stand-in NVML lists it.
A100 = {"uuid": A, "bus": "00000000:17:00.0", "name": "NVIDIA A100-SXM4-80GB", "total": 80 * GiB, "used": 0}


def instance(uuid: str, gpu_instance: int) -> dict[str, Any]:
    """A 3g.40gb MIG instance of the A100: ``gpu_instance``, compute instance 0."""
    name = "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    return {"uuid": uuid, "name": name, "gi": gpu_instance, "ci": 0, "total": 40 * GiB, "used": 0}


def test_a_mig_instance_named_in_the_form_before_r470_is_visible(tmp_path: Path) -> None:
    # CUDA_VISIBLE_DEVICES=MIG-GPU-<uuid>/<gpu instance>/<compute instance>, as drivers before R470 named a MIG
    # instance (and job scripts written then still do): the instance with those ids on that GPU is cuda:0.
    split = [{**A100, "mig": [instance(MIG_A, 1), instance(MIG_B, 2)]}]
    inventory, said = devices(tmp_path, split, CUDA_VISIBLE_DEVICES=f"MIG-{A}/2/0")
    (parent,) = inventory["gpus"]
    assert [(m["uuid"], m["index"]) for m in parent["mig"]] == [(MIG_A, None), (MIG_B, 0)]
    assert (parent["mig"][1]["gpu_instance_id"], parent["mig"][1]["compute_instance_id"]) == (2, 0)
    assert inventory["no_gpu"] is None and "cuda:0" in said
    # the new form names the same instance; both forms of one instance leave none visible, as a device named twice
    (parent,) = devices(tmp_path, split, CUDA_VISIBLE_DEVICES=MIG_B)[0]["gpus"]
    assert parent["mig"][1]["index"] == 0
    named_twice = devices(tmp_path, split, CUDA_VISIBLE_DEVICES=f"MIG-{A}/2/0,{MIG_B}")[0]
    assert named_twice["no_gpu"] and all(m["index"] is None for m in named_twice["gpus"][0]["mig"])


def test_a_uuid_in_cuda_visible_devices_is_matched_as_written(tmp_path: Path) -> None:
    # torch matches the variable's UUIDs as written, case and all (torch.cuda._parse_visible_devices,
    # _transform_uuid_to_ordinals), and NVML writes them in lower case: GPU-AAAAAAAA names no GPU for torch, which
    # counts none, so none is cuda:0 here either (it was matched regardless of case: cuda:0, where torch saw none).
    gpu = A100
    inventory, _ = devices(tmp_path, [gpu], CUDA_VISIBLE_DEVICES="GPU-aaaaaaaa")
    assert inventory["gpus"][0]["index"] == 0 and inventory["no_gpu"] is None
    inventory, _ = devices(tmp_path, [gpu], CUDA_VISIBLE_DEVICES="GPU-AAAAAAAA")
    assert inventory["gpus"][0]["index"] is None
    assert inventory["no_gpu"] == "NVML lists 1 GPU(s), none visible here (CUDA_VISIBLE_DEVICES=GPU-AAAAAAAA)"
