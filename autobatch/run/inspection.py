"""What a session learns before its first probe: the device, the model, and on the CPU the job's own process.

:func:`inspect_device` resolves ``auto`` (CUDA when torch sees it, else the CPU), runs the ``inspect``
operation (the model built once, the device's figures) and turns what it found into the session's
:class:`~autobatch.devices.budget.DeviceInfo`. On the CPU device it then measures how much more the job's
fresh process of each rank holds than a probe forked from the probe server (:mod:`autobatch.probe.fresh`):
every later request carries those offsets, so that every maximum is the job's. It is measured once per
session, never journaled (a few seconds: one fresh start), and only through the probe server the session
started itself: a runner of the caller's (a fake one, an in-process one) measures what it measures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from autobatch.core.space import Combo
from autobatch.core.units import format_bytes
from autobatch.devices.backend import backend_for
from autobatch.devices.budget import DeviceInfo, cuda_name, device_info
from autobatch.errors import DeviceError
from autobatch.records.failures import raise_for
from autobatch.records.protocol import ProbeOutcome, ProbeRequest, ProbeRunner
from autobatch.step.spec import ScriptSpec

if TYPE_CHECKING:
    from autobatch.settings import Settings


class Session(Protocol):
    """What inspecting needs of :class:`autobatch.run.session.Session`, which imports this module (the
    structure check reads imports under TYPE_CHECKING too, so the real type would be a cycle)."""

    settings: Settings
    spec: ScriptSpec
    ranks: int
    runner: ProbeRunner | None
    own_server: bool
    blocks: tuple[str, ...]
    device: DeviceInfo | None
    fresh_offsets: list[int]
    plan_seq_len: int | None

    @property
    def requested_device(self) -> str: ...

    @property
    def as_is(self) -> bool: ...

    @property
    def torch_version(self) -> str | None: ...
    def run(self, request: ProbeRequest, *, what: str) -> ProbeOutcome: ...
    def request(
        self,
        combo: Combo,
        batch_size: int,
        *,
        steps: tuple[int, int],
        op: str = ...,
        options: dict[str, Any] | None = ...,
        budget_bytes: int | None = ...,
        timeout: float | None = ...,
        device: str | None = ...,
    ) -> ProbeRequest: ...
    def warn(self, message: str) -> None: ...


#: The note (first in the result's notes) of a ``--device auto`` that found no CUDA device.
FALLBACK_NOTE = (
    "device auto found no CUDA device (torch {torch}) and tuned on the CPU: these numbers hold for CPU "
    "training only; launcher configs for GPU jobs are refused unless allow_cpu is set"
)

#: The fresh-process measurement's step: any combination (every optimizer imports the same modules lazily)
#: at a small batch (what differs is the process, not the batch; 2, as BatchNorm fails at 1).
FRESH_COMBO = Combo("32-true", "sgd")
FRESH_BATCH = 2
#: What the inspection builds: the model alone (its step is never run).
INSPECT_COMBO = Combo("32-true", "sgd")


def inspect_device(session: Session) -> DeviceInfo:
    """The session's device with what inspecting the model found (and, on the CPU, the fresh-process offsets
    in ``session.fresh_offsets``)."""
    device, info = _resolve(session)
    session.blocks = tuple(info.get("recompute_blocks", ()))  # what recomputation and FSDP wrap
    asked = session.settings.device
    memory = asked.memory
    backend = backend_for(device)
    if memory is None and backend.ranks_share_memory and session.ranks > 1 and info.get("available_bytes"):
        memory = int(info["available_bytes"]) // session.ranks  # the ranks share the machine
    found = device_info(device, info, memory=memory, headroom=asked.headroom)
    found.requested = asked.device  # "auto" stays "auto" when a target was picked for it
    if found.fell_back:
        found.notes.insert(0, FALLBACK_NOTE.format(torch=session.torch_version))
    session.device = found
    ranks_as_is = session.as_is and session.ranks > 1  # a script's own ranks: not yet measured
    # a runner of the caller's (a fake one, an in-process one) measures what it measures
    fresh = session.settings.probe.fresh_baseline and session.own_server
    if backend.fresh_process_differs and fresh and not ranks_as_is:
        _measure_fresh_offsets(session, found)
    return found


def _resolve(session: Session) -> tuple[str, dict[str, Any]]:
    """``auto`` -> CUDA when torch sees it, else the CPU; the inspection of the chosen device."""
    info = _inspect(session, "cpu")
    device = session.requested_device
    if device == "auto":
        device = "cuda:0" if info.get("cuda_available") else "cpu"
    elif device.startswith("cuda") and not info.get("cuda_available"):
        raise DeviceError(
            f"--device {device} asked for, but torch sees no CUDA device (torch {session.torch_version})",
            hint="use --device cpu (or auto), or install a CUDA build of torch on a machine with a GPU",
        )
    return device, info if device == "cpu" else _inspect(session, cuda_name(device))


def _inspect(session: Session, device: str) -> dict[str, Any]:
    op = "as_is_inspect" if session.as_is else "inspect"
    request = session.request(INSPECT_COMBO, 0, steps=(0, 0), op=op, budget_bytes=0, device=device)
    outcome = session.run(request, what="building the model")
    raise_for(outcome, what="building the model")
    return outcome.info


def _measure_fresh_offsets(session: Session, device: DeviceInfo) -> None:
    """How much more the job's fresh process of each rank holds than a forked probe process, into
    ``session.fresh_offsets`` and the device's record; a warning when it cannot be measured."""
    from autobatch.probe.fresh import FreshOptions

    assert session.runner is not None
    options = FreshOptions(session.spec.to_init(), list(session.settings.script.script_args)).to_dict()
    request = session.request(
        FRESH_COMBO.at(session.plan_seq_len), FRESH_BATCH, steps=(3, 3), op="fresh_baseline", options=options
    )
    outcome = session.runner.run(request)
    # a broken contract (make_batch takes no length, say) fails every probe too: report it now, not as a warning
    if outcome.kind == "error" and outcome.contract:
        raise_for(outcome, what="measuring the job's fresh process")
    offsets = outcome.info.get("offset_bytes") if outcome.fits else None
    if not offsets:
        why = outcome.info.get("fresh_error") or outcome.reason or outcome.error_message or outcome.kind
        session.warn(
            f"the job's fresh process could not be measured against a forked probe ({why}): maxima count as a "
            "forked process's, which can be a few percent above a fresh one's near the cap"
        )
        return
    session.fresh_offsets = [int(offset) for offset in offsets]
    device.fresh_process = {"batch_size": FRESH_BATCH, **outcome.info}
    device.notes.append(fresh_note(session.fresh_offsets))
    if device.baseline_bytes is not None:
        device.baseline_bytes += session.fresh_offsets[0]


def fresh_note(offsets: list[int]) -> str:
    """The result's note on the fresh-process offsets (one, or one per rank)."""

    def signed(offset: int) -> str:
        return ("+" if offset >= 0 else "") + format_bytes(offset)

    if len(offsets) == 1:
        who = f"the job's fresh process: {signed(offsets[0])} against a probe forked"
    else:
        each = ", ".join(f"rank {rank} {signed(offset)}" for rank, offset in enumerate(offsets))
        who = f"the job's fresh rank processes, started as torchrun starts them: {each} against ranks forked"
    return (
        f"probes count as {who} from the probe server (measured once per run, after the steps of batch "
        f"{FRESH_BATCH})"
    )
