"""A probing session: one script, one device, one budget, one probe server, one probe cache.

It resolves ``--device auto``, computes the budget (the device's capacity, or ``--memory``, minus
the headroom), and runs probes through the server, reusing outcomes recorded by earlier runs with
the same fingerprint (script content and arguments, torch version, device, budget, steps). The
cache doubles as the journal: every probe is appended the moment it finishes, so an interrupted
run keeps what it measured and a re-run is instant.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from . import __version__
from .core.space import Combo
from .core.units import format_bytes

#: Environment of the probe server (inherited by every probe); see autobatch.devices.cpu.
from .devices.cpu import MALLOC_ENV, MEMORY_DEFINITION  # noqa: E402
from .errors import DeviceError, UsageError
from .probe.client import ProbeClient
from .probe.failures import raise_for
from .probe.protocol import ProbeOutcome, ProbeRequest

if TYPE_CHECKING:
    from .settings.groups import Settings


@dataclass
class DeviceInfo:
    type: str  # "cpu" | "cuda"
    name: str  # "cpu" | "cuda:0"
    capacity_bytes: int
    budget_bytes: int
    headroom: float
    memory_definition: str
    unsupported_precisions: dict[str, str] = field(default_factory=dict)
    recompute_blocks: list[str] = field(default_factory=list)
    param_shapes: list[list[int]] = field(default_factory=list)
    param_count: int = 0
    baseline_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def margin_bytes(self) -> int:
        """How close to the budget a fitting peak may come and still count as a fit for the search.

        On the CPU the same probe's peak differs between fresh processes by up to ~150 KiB (Python's
        heap, page rounding; measured with ``autobatch check`` on tests/scripts/later_step_trap.py),
        so a batch whose peak lands within that of the cap fits once and fails the next time: the
        search does not accept it. On CUDA the verdict compares allocator statistics: no margin.
        """
        return max(1 << 20, self.budget_bytes // 1000) if self.type == "cpu" else 0

    def within_margin(self, peak_bytes: int | None) -> bool:
        """Whether a peak that fitted came within :attr:`margin_bytes` of the budget."""
        margin = self.margin_bytes
        return bool(margin and (peak_bytes or 0) > self.budget_bytes - margin)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "name": self.name,
            "capacity_bytes": self.capacity_bytes,
            "budget_bytes": self.budget_bytes,
            "headroom": self.headroom,
            "memory_definition": self.memory_definition,
            "baseline_bytes": self.baseline_bytes,
        }


class Session:
    """Open with :meth:`start`; always :meth:`close` (or use it as a context manager)."""

    def __init__(
        self,
        *,
        script: str | Path,
        script_args: tuple[str, ...] | list[str],
        device: str,
        memory: int | None,
        headroom: float,
        timeout: float,
        optimizer_kwargs: dict[str, dict[str, Any]] | None = None,
        recompute_classes: tuple[str, ...] = (),
        cache: bool = True,
        on_probe: Callable[[Combo, ProbeOutcome, bool], None] | None = None,
        op_modules: tuple[str, ...] = (),
    ) -> None:
        self.script = Path(script)
        self.script_args = list(script_args)
        self.requested_device = device
        self.memory = memory
        self.headroom = headroom
        self.timeout = timeout
        self.optimizer_kwargs = optimizer_kwargs or {}
        self.recompute_classes = tuple(recompute_classes)
        self.use_cache = cache
        self.on_probe = on_probe
        self.op_modules = op_modules  # modules registering probe operations (see autobatch.probe.ops)
        self.client: ProbeClient | None = None
        self.device: DeviceInfo | None = None
        self.cache_hits = 0
        self._cache: dict[str, dict[str, Any]] = {}
        self._journal: Path | None = None

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        cache: bool | None = None,
        on_probe: Callable[[Combo, ProbeOutcome, bool], None] | None = None,
        op_modules: tuple[str, ...] = (),
    ) -> Session:
        """The session that resolved settings describe (``cache`` defaults to the ``cache`` setting;
        ``op_modules`` register probe operations beyond ``probe`` and ``inspect``)."""
        if not settings.script.script:
            raise UsageError(
                "no training script given", hint="pass SCRIPT, or set `script` in autobatch.toml"
            )
        return cls(
            script=settings.script.script,
            script_args=settings.script.script_args,
            device=settings.device.device,
            memory=settings.device.memory,
            headroom=settings.device.headroom,
            timeout=settings.probe.timeout,
            optimizer_kwargs={k: dict(v) for k, v in settings.search.optimizer_kwargs.items()},
            recompute_classes=settings.search.recompute_classes,
            cache=settings.probe.cache if cache is None else cache,
            on_probe=on_probe,
            op_modules=op_modules,
        )

    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def start(self) -> DeviceInfo:
        if not self.script.is_file():
            raise UsageError(
                f"training script not found: {self.script}",
                hint="pass the path of a .py file that defines build_model, make_batch and compute_loss",
            )
        self.client = ProbeClient(
            self.script, self.script_args, env=dict(MALLOC_ENV), op_modules=self.op_modules
        )
        device = self.requested_device
        info = self._inspect("cpu")
        if device == "auto":
            device = "cuda:0" if info.get("cuda_available") else "cpu"
        elif device.startswith("cuda") and not info.get("cuda_available"):
            raise DeviceError(
                f"--device {device} asked for, but torch sees no CUDA device (torch {self.client.torch_version})",
                hint="use --device cpu (or auto), or install a CUDA build of torch on a machine with a GPU",
            )
        self.device = self._device_info(
            device, info if device == "cpu" else self._inspect(_cuda_name(device))
        )
        self._open_cache()
        return self.device

    def _inspect(self, device: str) -> dict[str, Any]:
        assert self.client is not None
        request = ProbeRequest(
            batch_size=0,
            precision="32-true",
            optimizer="sgd",
            recompute=False,
            device=device,
            budget_bytes=0,
            timeout=self.timeout,
            recompute_classes=self.recompute_classes,
            op="inspect",
        )
        outcome = self.client.run(request)
        if outcome.kind != "fits":
            raise_for(outcome, what="building the model")
        return outcome.info

    def _device_info(self, device: str, info: dict[str, Any]) -> DeviceInfo:
        common: dict[str, Any] = {
            "unsupported_precisions": dict(info.get("unsupported_precisions", {})),
            "recompute_blocks": list(info.get("recompute_blocks", [])),
            "param_shapes": [list(s) for s in info.get("param_shapes", [])],
            "param_count": int(info.get("param_count", 0)),
        }
        if device == "cpu":
            capacity = self.memory or int(info["available_bytes"])
            budget = int(capacity * (1 - self.headroom))
            baseline = info.get("baseline_bytes")
            notes: list[str] = []
            if baseline and budget <= baseline:
                raise UsageError(
                    f"the CPU budget {format_bytes(budget)} is below what a probe process holds before building the model "
                    f"({format_bytes(baseline)}: Python, torch and the script)",
                    hint="raise --memory: on the CPU device it caps the whole probe process, imports included",
                )
            return DeviceInfo(
                "cpu",
                "cpu",
                capacity,
                budget,
                self.headroom,
                MEMORY_DEFINITION,
                baseline_bytes=baseline,
                notes=notes,
                **common,
            )
        from .devices import cuda

        snapshot = cuda.CudaSnapshot.from_dict(info["snapshot"])
        budget_obj = cuda.cuda_budget(snapshot, memory=self.memory, headroom=self.headroom)
        return DeviceInfo(
            "cuda",
            device,
            budget_obj.capacity_bytes,
            budget_obj.budget_bytes,
            self.headroom,
            cuda.MEMORY_DEFINITION,
            notes=list(budget_obj.breakdown),
            **common,
        )

    # -- probes -------------------------------------------------------------------------------

    def request(
        self,
        combo: Combo,
        batch_size: int,
        *,
        steps: tuple[int, int],
        op: str = "probe",
        options: dict[str, Any] | None = None,
        budget_bytes: int | None = None,
        timeout: float | None = None,
    ) -> ProbeRequest:
        """The request for one operation on this session's device (``budget_bytes``: the budget's by default)."""
        assert self.device is not None
        return ProbeRequest(
            batch_size=batch_size,
            precision=combo.precision,
            optimizer=combo.optimizer,
            recompute=combo.recompute,
            device=self.device.name,
            budget_bytes=self.device.budget_bytes if budget_bytes is None else budget_bytes,
            min_steps=steps[0],
            max_steps=steps[1],
            timeout=self.timeout if timeout is None else timeout,
            optimizer_kwargs=dict(self.optimizer_kwargs.get(combo.optimizer, {})),
            recompute_classes=self.recompute_classes,
            op=op,
            options=dict(options or {}),
        )

    def run(self, request: ProbeRequest, *, what: str) -> ProbeOutcome:
        """Run any operation uncached; the script's own error raises, a crash or timeout is an outcome."""
        assert self.client is not None
        outcome = self.client.run(request)
        if outcome.kind == "error":
            raise_for(outcome, what=what)
        return outcome

    def probe(
        self, combo: Combo, batch_size: int, *, min_steps: int, max_steps: int, strict: bool = True
    ) -> ProbeOutcome:
        """One probe (cached); raises ScriptError/ContractError when the script itself fails.

        ``strict`` (the search's verdict) turns a fit whose peak comes within the device's margin of
        the budget into an out-of-memory outcome that says so; ``check`` asks only what the cap says.
        """
        assert self.client is not None and self.device is not None
        request = self.request(combo, batch_size, steps=(min_steps, max_steps))
        key = json.dumps(
            [combo.precision, combo.optimizer, combo.recompute, batch_size, min_steps, max_steps]
        )
        cached = self._cache.get(key) if self.use_cache else None
        if cached is not None:
            outcome = ProbeOutcome.from_dict(cached)
            outcome.cached = True
            self.cache_hits += 1
        else:
            outcome = self.client.run(request)
            if outcome.kind in ("fits", "oom"):
                self._record(key, outcome)
        if strict:
            within_margin(outcome, self.device)
        if self.on_probe:
            self.on_probe(combo, outcome, cached is not None)
        if outcome.kind == "error":
            raise_for(outcome, what=f"{combo.key} at batch {batch_size}")
        return outcome

    def _open_cache(self) -> None:
        assert self.device is not None
        digest = hashlib.sha256()
        digest.update(self.script.read_bytes())
        for part in (
            self.script_args,
            __version__,
            self.client.torch_version if self.client else "",
            self.device.name,
            self.device.budget_bytes,
            self.optimizer_kwargs,
            self.recompute_classes,
        ):
            digest.update(json.dumps(part, sort_keys=True, default=str).encode())
        self.fingerprint = digest.hexdigest()[:16]
        if not self.use_cache:
            return
        folder = Path(os.environ.get("AUTOBATCH_CACHE_DIR") or _default_cache_dir()) / "probes"
        folder.mkdir(parents=True, exist_ok=True)
        self._journal = folder / f"{self.fingerprint}.jsonl"
        if self._journal.exists():
            for line in self._journal.read_text().splitlines():
                try:
                    entry = json.loads(line)
                    self._cache[entry["key"]] = entry["outcome"]
                except (ValueError, KeyError):
                    continue  # a line cut short by a crash

    def _record(self, key: str, outcome: ProbeOutcome) -> None:
        self._cache[key] = outcome.to_dict()
        if self._journal is not None:
            with open(self._journal, "a") as handle:
                handle.write(json.dumps({"key": key, "outcome": outcome.to_dict()}) + "\n")


def _cuda_name(device: str) -> str:
    if device == "cuda":
        return "cuda:0"
    if not device.startswith("cuda:") or not device[5:].isdigit():
        raise DeviceError(f"unknown device {device!r}", hint="use auto, cpu, cuda or cuda:N")
    return device


def _default_cache_dir() -> str:
    import platformdirs

    return platformdirs.user_cache_dir("autobatch")


def within_margin(outcome: ProbeOutcome, device: DeviceInfo) -> bool:
    """Turn a fit whose peak came within the device's margin of the budget into an out-of-memory outcome.

    Returns whether it did. The search never stands on a batch that fitted by less than the variation
    between processes (see :attr:`DeviceInfo.margin_bytes`).
    """
    if not (outcome.fits and device.within_margin(outcome.peak_bytes)):
        return False
    outcome.kind = "oom"
    outcome.reason = (
        f"fitted by less than the {format_bytes(device.margin_bytes)} margin (peak {format_bytes(outcome.peak_bytes)} of "
        f"{format_bytes(device.budget_bytes)}): a fresh process can exceed the budget"
    )
    return True
