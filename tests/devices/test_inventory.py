"""The device inventory and the tune targets, from injected NVML data (tests/fake_nvml.py).

Covers what a node shows NVML: several GPUs in PCI order, ``CUDA_VISIBLE_DEVICES`` in each of its
forms, processes (ours, and host PIDs that do not exist in this PID namespace, as in a container),
MIG instances, two GPU models on one node, and no driver at all.
"""

from __future__ import annotations

import os

import pytest
from fake_nvml import A, B, FakeDevice, FakeNvml, FakeNvmlError, GiB, M, MiB, machine, proc

from autobatch.devices.inventory import read_inventory
from autobatch.devices.selection import targets_for
from autobatch.devices.visible import MigInstance, Physical, visible_indices

C = "GPU-cccccccc-1111-2222-3333-444444444444"
#: M (GPU instance 1, compute instance 0 on A) in the form of drivers before R470.
OLD_M = f"MIG-{A}/1/0"


def gpus() -> list[Physical]:
    # NVML lists them out of PCI order on purpose: CUDA numbers by PCI bus id.
    return [
        Physical(B, "00000000:65:00.0"),
        Physical(A, "00000000:17:00.0", (MigInstance(M, 1, 0),)),
        Physical(C, "00000000:CA:00.0"),
    ]


@pytest.mark.parametrize(
    ("variable", "expected"),
    [
        (None, {A: 0, B: 1, C: 2}),
        ("", {}),
        ("2,0", {C: 0, A: 1}),
        ("1, 0", {B: 0, A: 1}),
        ("GPU-cccc", {C: 0}),
        ("GPU-cccc,0", {C: 0}),  # an entry of another kind ends the list
        ("0,7,1", {A: 0}),  # an index that matches nothing ends it
        ("0,-1,1", {A: 0}),
        ("1gpu2,2ampere", {B: 0, C: 1}),  # read as strtoul reads them
        ("0,0,1", {}),  # a device named twice: none is visible
        ("0,7,0", {}),
        ("GPU-cccc,GPU-cccccccc-1111", {}),  # two prefixes of one UUID
        ("GPU-", {}),  # a prefix of every UUID is not unique
        ("MIG-cccc", {M: 0}),
        ("MIG-cccc,1", {M: 0}),
        (OLD_M, {M: 0}),  # the form before driver R470: the GPU's UUID, GPU and compute instance ids
        (OLD_M.lower(), {}),  # torch's MIG- is upper case: read as indices, none
        (f"{OLD_M},0", {M: 0}),
        (f"MIG-{A}/1/1", {}),  # no such compute instance
        (f"MIG-{B}/1/0", {}),  # no such instance on that GPU
        (f"MIG-{A[:12]}/1/0", {}),  # the GPU's UUID in full, not a prefix
        (f"{OLD_M},MIG-cccc", {}),  # one instance named in both forms: none is visible
        ("nonsense,0", {}),
        # a UUID as written, case and all, as torch matches it: NVML writes them in lower case
        ("GPU-CCCC", {}),
        ("gpu-cccc", {}),
        ("GPU-cccc,GPU-AAAA", {C: 0}),
        ("MIG-CCCC", {}),
        ("GPU-cccc, GPU-aaaa", {C: 0}),  # a space before an entry: of another kind
        (" GPU-cccc", {}),
    ],
)
def test_cuda_visible_devices_as_cuda_reads_it(variable: str | None, expected: dict[str, int]) -> None:
    assert visible_indices(gpus(), variable) == expected


@pytest.mark.parametrize(
    "variable",
    ["", "0", "2,0", "1, 0", "0,7,1", "0,-1,1", "1gpu2,2ampere", "0,0,1", "0,7,0", "junk", "GPU-cccc",
     "GPU-cccc,0", "GPU-bbbb,GPU-aaaa", "GPU-cccc,GPU-cccccccc-1111", "GPU-", "GPU-ffff,GPU-aaaa", "0,GPU-aaaa",
     "GPU-CCCC", "gpu-cccc", "Gpu-cccc", "GPU-cccc,GPU-AAAA", "GPU-bbbb,GPU-aaaa,GPU-BBBB", "GPU-cccc, GPU-aaaa",
     " GPU-cccc", "GPU-cccc ,GPU-aaaa", " 1, 0"],
)  # fmt: skip
def test_cuda_visible_devices_agrees_with_torchs_count(
    variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PyTorch counts the visible devices without starting CUDA (NVML and the variable, by CUDA's rules): its
    # parser over the same GPUs, in PCI bus order as NVML numbers them, names the same devices in the same order.
    torch_cuda = pytest.importorskip("torch.cuda")
    ordered = [A, B, C]  # PCI bus order (gpus())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", variable)
    parsed = torch_cuda._parse_visible_devices()
    if parsed and isinstance(parsed[0], str):
        ordinals = torch_cuda._transform_uuid_to_ordinals(parsed, ordered)
    else:
        ordinals = list(parsed)
        for position, ordinal in enumerate(
            ordinals
        ):  # torch's count stops at the first index past the last GPU
            if ordinal >= len(ordered):
                ordinals = ordinals[:position]
                break
    assert visible_indices(gpus(), variable) == {ordered[o]: i for i, o in enumerate(ordinals)}


@pytest.mark.parametrize(
    "variable",
    [OLD_M, f"{OLD_M},0", f"{OLD_M},MIG-cccc", "MIG-cccc,1", f"MIG-cccc,{OLD_M},GPU-aaaa", OLD_M.lower(),
     "MIG-cccc,mig-aaaa", "MIG-cccc, MIG-aaaa"],
)  # fmt: skip
def test_mig_entries_are_the_ones_torch_parses(variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch reads both forms of a MIG instance as entries of one kind, MIG-, and leaves matching them to CUDA
    # (its NVML count skips MIG): the entries this module matches are torch's.
    from autobatch.devices.visible import _entries

    torch_cuda = pytest.importorskip("torch.cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", variable)
    assert _entries(variable) == torch_cuda._parse_visible_devices()


def test_inventory_lists_gpus_in_pci_order_with_memory_and_versions() -> None:
    fake = FakeNvml(
        [
            FakeDevice(B, "00000000:65:00.0", used=3 * GiB, name="NVIDIA H100 80GB HBM3"),
            FakeDevice(A, "00000000:17:00.0", used=0, name="NVIDIA A100-SXM4-40GB", total=40 * GiB),
        ]
    )
    inventory = read_inventory(fake, env={})
    by_uuid = {g.uuid: g for g in inventory.gpus}
    assert by_uuid[A].index == 0 and by_uuid[B].index == 1
    assert by_uuid[B].used_bytes == 3 * GiB and by_uuid[B].free_bytes == 77 * GiB
    assert by_uuid[A].total_bytes == 40 * GiB and by_uuid[A].name == "NVIDIA A100-SXM4-40GB"
    assert inventory.driver_version == "535.104.05" and inventory.cuda_driver_version == "12.2"
    assert inventory.no_gpu is None
    # two models and CUDA's default order: the inventory says its indices follow PCI bus order
    assert any("PCI bus order" in note for note in inventory.notes)
    assert not read_inventory(fake, env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}).notes


def test_processes_ours_named_and_host_pids_of_a_container_flagged() -> None:
    ours = os.getpid()
    elsewhere = 4_000_000  # above pid_max: no such process in this namespace
    fake = FakeNvml(
        [
            FakeDevice(
                A, "00000000:17:00.0", procs=[proc(ours, 1 * GiB), proc(elsewhere, 2 * GiB)], used=4 * GiB
            )
        ]
    )
    (gpu,) = read_inventory(fake, env={}).gpus
    named = {p.pid: p for p in gpu.processes}
    assert named[ours].name and named[ours].used_bytes == 1 * GiB
    assert named[elsewhere].name is None and named[elsewhere].used_bytes == 2 * GiB
    assert gpu.unlisted_bytes == 1 * GiB  # 4 GiB used, 3 GiB listed
    assert any("PID namespace" in note for note in gpu.notes)


def test_a_container_where_nvml_lists_no_process_still_shows_used_memory() -> None:
    fake = FakeNvml([FakeDevice(A, "00000000:17:00.0", procs=[], used=5 * GiB)])
    (gpu,) = read_inventory(fake, env={}).gpus
    assert gpu.processes == [] and gpu.used_bytes == 5 * GiB and gpu.unlisted_bytes == 5 * GiB


def test_mig_instances_are_listed_under_their_gpu_and_visible_by_their_uuid() -> None:
    fake = machine()
    inventory = read_inventory(fake, env={"CUDA_VISIBLE_DEVICES": "MIG-cccc"})
    parent = next(g for g in inventory.gpus if g.mig_enabled)
    (instance,) = parent.mig
    assert instance.uuid == M and instance.parent_uuid == parent.uuid and instance.index == 0
    assert [g.uuid for g in inventory.visible()] == [M]
    everything = read_inventory(fake, env={})
    parent = next(g for g in everything.gpus if g.mig_enabled)
    assert parent.index == 2 and parent.mig[0].index is None
    assert any("MIG is enabled" in note for note in parent.notes)


def test_mig_profile_comes_from_the_instance_name() -> None:
    parent = FakeDevice(
        "GPU-dddddddd-1111-2222-3333-444444444444",
        "00000000:CA:00.0",
        mig=[FakeDevice(M, None, name="NVIDIA A100-SXM4-80GB MIG 1g.10gb", total=10 * GiB)],
    )
    inventory = read_inventory(FakeNvml([parent]), env={"CUDA_VISIBLE_DEVICES": M})
    (target,) = targets_for("cuda", None, inventory)
    assert target.identity["mig_profile"] == "1g.10gb" and target.lock_key.startswith("mig-")
    assert target.device == "cuda:0"


def test_no_driver_gives_the_host_and_the_reason() -> None:
    class NoDriver(FakeNvml):
        def nvmlInit(self):
            raise self.NVMLError("NVML Shared Library Not Found")

    inventory = read_inventory(NoDriver([]), env={})
    assert inventory.gpus == [] and inventory.nvml == "no-driver"
    assert "no NVIDIA driver" in (inventory.no_gpu or "")
    assert inventory.host.total_bytes > 0 and inventory.host.available_bytes > 0
    (target,) = targets_for("auto", None, inventory)
    assert target.device == "cpu" and target.not_cached  # no --memory: the CPU's capacity moves
    (target,) = targets_for("auto", 2 * GiB, inventory)
    assert target.not_cached is None and target.lock_key.startswith("host-")


def test_one_target_per_gpu_model_and_the_one_named() -> None:
    fake = FakeNvml(
        [
            FakeDevice(A, "00000000:17:00.0", name="NVIDIA A100-SXM4-80GB"),
            FakeDevice(B, "00000000:65:00.0", name="NVIDIA A100-SXM4-80GB", used=512 * MiB),
            FakeDevice(C, "00000000:CA:00.0", name="Tesla V100-SXM2-32GB", total=32 * GiB),
        ]
    )
    inventory = read_inventory(fake, env={})
    a100, v100 = targets_for("auto", None, inventory)
    assert (a100.device, a100.indices) == ("cuda:0", (0, 1))
    assert (v100.device, v100.indices) == ("cuda:2", (2,))
    # the identity is the model's (shared by every card of it), never one card's UUID
    assert A not in str(a100.identity) and a100.identity["name"] == "NVIDIA A100-SXM4-80GB"
    assert a100.identity["driver"] == "535.104.05" and a100.identity["total_bytes"] == 80 * GiB
    assert a100.lock_key != v100.lock_key and "aaaaaaaa" in a100.lock_key
    (named,) = targets_for("cuda:1", None, inventory)
    assert named.device == "cuda:1" and named.used_bytes == 512 * MiB and named.indices == (0, 1)
    (missing,) = targets_for("cuda:5", None, inventory)
    assert missing.not_cached and "index 5" in missing.not_cached


def test_a_gpus_identity_holds_the_caching_allocators_settings_when_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # expandable_segments changes what the caching allocator reserves (what the budget caps): a tune under it must
    # not be served to a job without it, as the CPU's identity holds its allocator's variables.
    inventory = read_inventory(FakeNvml([FakeDevice(A, "00000000:17:00.0")]), env={})
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING"):
        monkeypatch.delenv(name, raising=False)
    (plain,) = targets_for("cuda:0", None, inventory)
    assert (
        "environment" not in plain.identity
    )  # the identities (cache keys) of tunes without one stay as they were
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    (expandable,) = targets_for("cuda:0", None, inventory)
    assert expandable.identity["environment"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert {**expandable.identity, "environment": None} == {**plain.identity, "environment": None}


def test_the_cpu_machine_has_no_gpu_and_the_devices_command_says_why() -> None:
    """On this machine (no NVIDIA driver): the real NVML path, the host memory and the no-driver line."""
    from support import run_main

    inventory = read_inventory()
    if inventory.gpus:
        pytest.skip("this machine has GPUs")
    code, out, err = run_main("devices")
    assert code == 0, err
    assert "host " in err and "total" in err and "available" in err
    assert "no GPU: " in err
    code, out, err = run_main("devices", "-q")
    assert code == 0 and err.count("no visible GPU") == 1
    code, out, err = run_main("devices", "--json", "-q")
    assert code == 0 and err == ""  # the answer is on stdout: stderr holds errors alone
    import json

    data = json.loads(out)
    assert data["gpus"] == [] and data["no_gpu"] and data["host"]["total_bytes"] > 0


def test_the_devices_command_on_injected_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import sys

    from support import run_main

    monkeypatch.setitem(sys.modules, "pynvml", machine())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    code, out, err = run_main("devices", "--json")
    assert code == 0, err
    data = json.loads(out)
    indices = {g["uuid"]: g["index"] for g in data["gpus"]}
    assert indices[B] == 0 and indices[A] == 1
    assert "cuda:0" in err and "CUDA_VISIBLE_DEVICES=1,0" in err


def test_the_devices_command_shows_no_gpu_visible_when_one_is_named_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # CUDA (and torch.cuda.device_count()) see no device under CUDA_VISIBLE_DEVICES=1,1: the command must not list
    # cuda:0 for a tune to pick.
    import json
    import sys

    from support import run_main

    monkeypatch.setitem(sys.modules, "pynvml", machine())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,1")
    code, out, err = run_main("devices", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert [g["index"] for g in data["gpus"]] == [None, None, None]
    assert "none visible here (CUDA_VISIBLE_DEVICES=1,1)" in data["no_gpu"]


def test_node_type_names_the_models_for_job_scripts() -> None:
    from autobatch.devices.inventory import node_type

    fake = FakeNvml(
        [
            FakeDevice(A, "00000000:17:00.0", name="NVIDIA A100-SXM4-80GB"),
            FakeDevice(B, "00000000:65:00.0", name="NVIDIA A100-SXM4-80GB"),
            FakeDevice(C, "00000000:CA:00.0", name="Tesla V100-SXM2-32GB", total=32 * GiB),
        ]
    )
    assert node_type(read_inventory(fake, env={})) == "2x-nvidia-a100-sxm4-80gb+1x-tesla-v100-sxm2-32gb"
    assert node_type(read_inventory(fake, env={"CUDA_VISIBLE_DEVICES": "2"})) == "1x-tesla-v100-sxm2-32gb"
    assert node_type(read_inventory(fake, env={"CUDA_VISIBLE_DEVICES": ""})).startswith("cpu-")


class CountingNvml(FakeNvml):
    """A fake that counts NVML's starts and the name reads (one per GPU and fixed read), and can lose its
    session once (the next device count fails, as after a GPU reset or a driver reload)."""

    def __init__(self, devices) -> None:  # type: ignore[no-untyped-def]
        super().__init__(devices)
        self.starts = self.names = 0
        self.lost = False

    def nvmlInit(self) -> None:
        self.starts += 1

    def nvmlDeviceGetName(self, h):  # type: ignore[no-untyped-def]
        self.names += 1
        return h.name

    def nvmlDeviceGetCount(self) -> int:
        if self.lost:
            self.lost = False
            raise FakeNvmlError("GPU is lost")
        return len(self.devices)


def test_a_reader_kept_open_starts_nvml_once_and_reads_fixed_facts_again_only_when_they_change() -> None:
    """The daemon's reader: memory and processes read at every call, the GPUs' names and identities once, again
    when a GPU appears or its MIG mode changes; a lost session starts NVML again, once."""
    from autobatch.devices.inventory import Inventory, NvmlFacts, NvmlReader

    a = FakeDevice(A, "00000000:17:00.0", used=1 * GiB)
    fake = CountingNvml([a])
    reader = NvmlReader(fake)
    first = reader.read()
    a.used, a.procs = 5 * GiB, [proc(os.getpid(), 4 * GiB)]
    second = reader.read()
    assert (fake.starts, fake.names) == (1, 1)  # the second read asked only what moves
    assert (first.gpus[0].used_bytes, second.gpus[0].used_bytes) == (1 * GiB, 5 * GiB)
    assert [p.pid for p in second.gpus[0].processes] == [os.getpid()] and first.gpus[0].processes == []
    assert second == NvmlFacts.from_dict(second.to_dict())  # as the daemon serves it
    # what a process sees of the facts is its own: the reader's copy keeps no index
    assert Inventory.seen(second, {}).gpus[0].index == 0 and reader.read().gpus[0].index is None

    fake.devices.append(FakeDevice(B, "00000000:65:00.0"))  # a GPU appears (or comes back after a reset)
    assert [g.uuid for g in reader.read().gpus] == [A, B] and (fake.starts, fake.names) == (1, 3)
    a.mig = [None, FakeDevice(M, None, name="NVIDIA A100-SXM4-80GB MIG 1g.10gb")]  # MIG switched on
    (mig_on, _) = reader.read().gpus
    assert mig_on.mig_enabled and [m.uuid for m in mig_on.mig] == [M] and fake.starts == 1
    fake.lost = True
    assert [g.uuid for g in reader.read().gpus] == [A, B] and fake.starts == 2
    assert reader.counts == {"starts": 2, "fixed_reads": 4, "reads": 6}
    reader.close_if_idle(60.0)  # read a moment ago: kept
    assert [g.uuid for g in reader.read().gpus] == [A, B] and fake.starts == 2
    reader.close_if_idle(0.0)  # idle: NVML let go, started again by the next read
    assert [g.uuid for g in reader.read().gpus] == [A, B] and fake.starts == 3
    reader.close()


def test_a_reader_whose_nvml_keeps_failing_says_so_and_a_missing_driver_is_tried_again() -> None:
    from autobatch.devices.inventory import NvmlReader

    class Broken(CountingNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise FakeNvmlError("Unknown Error")

    broken = Broken([FakeDevice(A, "00000000:17:00.0")])
    facts = NvmlReader(broken).read()
    assert facts.gpus == [] and "cannot list the GPUs (Unknown Error)" in (facts.no_gpu or "")
    assert broken.starts == 2  # started again once, then it says why

    class NoDriverYet(CountingNvml):
        ready = False

        def nvmlInit(self) -> None:
            if not self.ready:
                raise FakeNvmlError("Driver Not Loaded")
            super().nvmlInit()

    later = NoDriverYet([FakeDevice(A, "00000000:17:00.0")])
    reader = NvmlReader(later)
    assert reader.read().nvml == "no-driver"
    later.ready = True  # the driver loaded while a daemon ran
    assert [g.uuid for g in reader.read().gpus] == [A]
