"""A small fake of nvidia-ml-py: the subset of pynvml autobatch calls, over a list of fake devices.

Imported by name (tests/ is on sys.path under pytest) by the NVML tests and the probe worker's tests.
An instance can stand in for the module itself (``sys.modules["pynvml"]``).
"""

from __future__ import annotations

from types import SimpleNamespace

MiB, GiB = 1 << 20, 1 << 30

A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
M = "MIG-cccccccc-1111-2222-3333-444444444444"


class FakeNvmlError(Exception):
    pass


class FakeMismatch(Exception):
    pass


class FakeDevice:
    #: The driver's reservation, which memory info v2 reports apart (None: a driver with version 1 only); set on a
    #: device after it is made, as ``ids``, a MIG instance's (GPU instance id, compute instance id).
    reserved: int | None = None
    ids: tuple[int, int] | None = None

    def __init__(
        self,
        uuid,
        bus,
        procs=(),
        mig=None,
        used=0,
        locked=False,
        name="NVIDIA A100-SXM4-80GB",
        total=80 * GiB,
    ):
        self.uuid, self.bus, self.procs, self.mig, self.used, self.locked = (
            uuid,
            bus,
            list(procs),
            mig,
            used,
            locked,
        )
        self.name, self.total = name, total


class FakeNvml:
    """The subset of pynvml autobatch calls, over a list of devices (MIG children in ``mig``)."""

    NVMLError = FakeNvmlError
    NVMLLibraryMismatchError = FakeMismatch

    def __init__(self, devices, v3=True):
        self.devices, self.v3 = devices, v3

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        if self.devices[i].locked:
            raise FakeNvmlError("Insufficient Permissions")
        return self.devices[i]

    def nvmlDeviceGetUUID(self, h):
        return h.uuid

    def nvmlDeviceGetMigMode(self, h):
        if h.mig is None:
            raise FakeNvmlError("Not Supported")
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, slot):
        if slot >= len(h.mig) or h.mig[slot] is None:
            raise FakeNvmlError("Not Found")
        return h.mig[slot]

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        for d in self.devices:
            if d.bus == bus.upper():
                return d
        raise FakeNvmlError("Not Found")

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        if not self.v3:
            raise FakeMismatch("Unversioned function called and the pyNVML version does not match")
        return [p for p in h.procs if getattr(p, "kind", "compute") == "compute"]

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h):
        return [p for p in h.procs if getattr(p, "kind", "compute") == "compute"]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return [p for p in h.procs if getattr(p, "kind", "compute") == "graphics"]

    nvmlMemory_v2 = 0x02000028

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        """Version 1 counts the driver's reservation as used; version 2 reports it apart (a driver without it:
        nvidia-ml-py raises FunctionNotFound, an NVMLError)."""
        reserved = h.reserved or 0
        free = h.total - h.used - reserved
        if not version:
            return SimpleNamespace(total=h.total, free=free, used=h.used + reserved)
        if h.reserved is None:
            raise FakeNvmlError("Function Not Found")
        return SimpleNamespace(version=version, total=h.total, reserved=reserved, free=free, used=h.used)

    def nvmlDeviceGetGpuInstanceId(self, h):
        if h.ids is None:
            raise FakeNvmlError("Not Supported")
        return h.ids[0]

    def nvmlDeviceGetComputeInstanceId(self, h):
        if h.ids is None:
            raise FakeNvmlError("Not Supported")
        return h.ids[1]

    def nvmlDeviceGetName(self, h):
        return h.name

    def nvmlDeviceGetPciInfo(self, h):
        if h.bus is None:
            raise FakeNvmlError("Not Supported")
        return SimpleNamespace(busId=h.bus.encode())

    def nvmlSystemGetDriverVersion(self):
        return "535.104.05"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12020


def proc(pid, used, kind="compute"):
    return SimpleNamespace(pid=pid, usedGpuMemory=used, kind=kind)


def machine(**kw):
    """Two GPUs and a third with MIG enabled (one instance, in slot 1)."""
    mig_parent = FakeDevice(
        "GPU-dddddddd-1111-2222-3333-444444444444", "00000000:CA:00.0", mig=[None, FakeDevice(M, None)]
    )
    devices = [FakeDevice(A, "00000000:17:00.0"), FakeDevice(B, "00000000:65:00.0"), mig_parent]
    return FakeNvml(devices, **kw)
