"""A stand-in for nvidia-ml-py over a JSON file named by ``AUTOBATCH_FAKE_NVML``: first on ``PYTHONPATH``, it is
the ``pynvml`` a daemon's process imports, so that a test can count NVML's starts (one line per ``nvmlInit`` in
the file's ``.log``, with the starting process's pid) and change the GPUs under a running daemon.

The file: ``{"devices": [{"uuid", "bus", "name", "total", "used"}], "lost": N}``; while ``lost`` is above 0, the
next device count fails as a lost GPU does (and counts ``lost`` down): NVML must be started again.
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


def _device(handle: int) -> dict[str, Any]:
    return _state()["devices"][handle]


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


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:  # noqa: N802
    device = _device(handle)
    return SimpleNamespace(total=device["total"], used=device["used"], free=device["total"] - device["used"])


def nvmlDeviceGetMigMode(handle: int) -> list[int]:  # noqa: N802
    raise NVMLError("Not Supported")


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[Any]:  # noqa: N802
    return []


def nvmlDeviceGetGraphicsRunningProcesses(handle: int) -> list[Any]:  # noqa: N802
    return []


def nvmlSystemGetDriverVersion() -> str:  # noqa: N802
    return "535.104.05"


def nvmlSystemGetCudaDriverVersion() -> int:  # noqa: N802
    return 12020
