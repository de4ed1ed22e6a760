"""A stand-in for nvidia-ml-py over a JSON file named by ``AUTOBATCH_FAKE_NVML``: first on ``PYTHONPATH``, it is
the ``pynvml`` a daemon's process imports, so that a test can count NVML's starts (one line per ``nvmlInit`` in
the file's ``.log``, with the starting process's pid) and change the GPUs under a running daemon.

The file: ``{"devices": [{"uuid", "bus", "name", "total", "used"}], "lost": N}``; while ``lost`` is above 0, the
next device count fails as a lost GPU does (and counts ``lost`` down): NVML must be started again. A device may
also have ``reserved`` (the driver's reservation: version 1 of the memory info counts it as used, version 2
reports it apart; without it the driver has no version 2), ``procs`` (``[{"pid", "used"}]``) and ``mig`` (its
MIG instances, ``[{"uuid", "name", "gi", "ci", "total", "used"}]``: MIG is enabled; a handle is then
``(device, slot)``). Other commands' tests (``autobatch devices``) use it too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    pass


def _file() -> Path:
    return Path(os.environ["AUTOBATCH_FAKE_NVML"])


def _state() -> dict[str, Any]:
    return json.loads(_file().read_text())


def _device(handle: int | tuple[int, int]) -> dict[str, Any]:
    if isinstance(handle, tuple):  # a MIG instance
        device, slot = handle
        return dict(_state()["devices"][device]["mig"][slot])
    return dict(_state()["devices"][handle])


def nvmlInit() -> None:  # noqa: N802 - pynvml's names
    with _file().with_suffix(".log").open("a") as log:
        log.write(f"init {os.getpid()}\n")


def nvmlShutdown() -> None:  # noqa: N802
    pass


def nvmlDeviceGetCount() -> int:  # noqa: N802
    state = _state()
    if state.get("lost", 0) > 0:
        state["lost"] -= 1
        _file().write_text(json.dumps(state))
        raise NVMLError("GPU is lost")
    return len(state["devices"])


def nvmlDeviceGetHandleByIndex(index: int) -> int:  # noqa: N802
    return index


def nvmlDeviceGetName(handle: int) -> str:  # noqa: N802
    return str(_device(handle)["name"])


def nvmlDeviceGetUUID(handle: int) -> str:  # noqa: N802
    return str(_device(handle)["uuid"])


def nvmlDeviceGetPciInfo(handle: int) -> SimpleNamespace:  # noqa: N802
    return SimpleNamespace(busId=str(_device(handle)["bus"]).encode())


nvmlMemory_v2 = 0x02000028


def nvmlDeviceGetMemoryInfo(handle: Any, version: int | None = None) -> SimpleNamespace:  # noqa: N802
    device = _device(handle)
    reserved = device.get("reserved", 0)
    free = device["total"] - device["used"] - reserved
    if not version:
        return SimpleNamespace(total=device["total"], used=device["used"] + reserved, free=free)
    if "reserved" not in device:
        raise NVMLError("Function Not Found")
    return SimpleNamespace(
        version=version, total=device["total"], reserved=reserved, used=device["used"], free=free
    )


def nvmlDeviceGetMigMode(handle: Any) -> list[int]:  # noqa: N802
    if isinstance(handle, tuple) or "mig" not in _device(handle):
        raise NVMLError("Not Supported")
    return [1, 1]


def nvmlDeviceGetMaxMigDeviceCount(handle: int) -> int:  # noqa: N802
    return 7


def nvmlDeviceGetMigDeviceHandleByIndex(handle: int, slot: int) -> tuple[int, int]:  # noqa: N802
    if slot >= len(_device(handle).get("mig", ())):
        raise NVMLError("Not Found")
    return (handle, slot)


def nvmlDeviceGetGpuInstanceId(handle: tuple[int, int]) -> int:  # noqa: N802
    return int(_device(handle)["gi"])


def nvmlDeviceGetComputeInstanceId(handle: tuple[int, int]) -> int:  # noqa: N802
    return int(_device(handle)["ci"])


def nvmlDeviceGetComputeRunningProcesses(handle: Any) -> list[Any]:  # noqa: N802
    return [SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used"]) for p in _device(handle).get("procs", ())]


def nvmlDeviceGetGraphicsRunningProcesses(handle: int) -> list[Any]:  # noqa: N802
    return []


def nvmlSystemGetDriverVersion() -> str:  # noqa: N802
    return "535.104.05"


def nvmlSystemGetCudaDriverVersion() -> int:  # noqa: N802
    return 12020
