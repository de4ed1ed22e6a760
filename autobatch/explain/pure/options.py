"""The options of explain's two probe operations, typed, and the module that registers the operations.

The parent builds an options record and sends its ``to_dict()`` as
:attr:`autobatch.records.protocol.ProbeRequest.options`; the probe process's registry
(:mod:`autobatch.probe.ops`) decodes it with ``from_dict`` before calling the operation
(:mod:`autobatch.explain.worker.ops`). No torch here: both sides import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autobatch.explain.pure.maxima import CPU_RUNTIME_BYTES, Offset
from autobatch.explain.pure.records import Scenario, Transforms

#: The modules a probe server imports to register ``explain`` and ``estimate`` (the parent passes them
#: as ``op_modules``; it never imports them itself: they import torch).
OP_MODULES: tuple[str, ...] = ("autobatch.explain.worker.ops",)
EXPLAIN = "explain"
ESTIMATE = "estimate"

#: Measured peaks: (batch size, bytes) pairs.
Points = tuple[tuple[int, int], ...]


def _points(data: Any) -> Points:
    return tuple((int(b), int(m)) for b, m in data or ())


@dataclass(frozen=True)
class ExplainOptions:
    """``op="explain"``: one probe of the real step with the levers' model changes (``transforms``),
    instrumented (categories, modules, FLOPs) unless ``instrument`` is false."""

    instrument: bool = True
    transforms: Transforms = Transforms()

    def to_dict(self) -> dict[str, Any]:
        return {"instrument": self.instrument, "transforms": self.transforms.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExplainOptions:
        return cls(bool(data.get("instrument", True)), Transforms.from_dict(data.get("transforms")))


@dataclass(frozen=True)
class NamedScenario:
    """A scenario to estimate, under a name; ``points`` calibrate it on its own measured step."""

    name: str
    scenario: Scenario
    points: Points = ()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.scenario.to_dict(), "points": [list(p) for p in self.points]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NamedScenario:
        return cls(str(data.get("name", "")), Scenario.from_dict(data), _points(data.get("points")))


@dataclass(frozen=True)
class Calibration:
    """A measured step: ``scenario`` measured at ``points``, to calibrate the simulations on."""

    scenario: Scenario
    points: Points

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario.to_dict(), "points": [list(p) for p in self.points]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        return cls(Scenario.from_dict(data["scenario"]), _points(data["points"]))


@dataclass(frozen=True)
class EstimateOptions:
    """``op="estimate"``: no real step; fake-tensor simulations of each scenario, searched for the
    largest batch within ``budget_bytes`` on ``target`` ("cpu" or "cuda").

    What a simulation does not see (the offset) is, by precedence: calibrated on a measured step
    (``calibrate``), given (``offset``), or, on the CPU, the baseline the probe process measures plus
    ``cpu_runtime_bytes``. ``report_at``: batch sizes to report predictions at.
    """

    budget_bytes: int
    max_batch_size: int  # the search's candidates, from the settings
    batch_multiple: int
    scenarios: tuple[NamedScenario, ...] = ()
    target: str = "cpu"
    optimizer_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)  # per optimizer
    calibrate: Calibration | None = None
    offset: Offset | None = None
    cpu_runtime_bytes: int = CPU_RUNTIME_BYTES
    report_at: tuple[int, ...] = ()
    strategy: str = "none"  # ddp | fsdp: one rank of world_size (autobatch.explain.worker.ranks)
    world_size: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_bytes": self.budget_bytes,
            "scenarios": [s.to_dict() for s in self.scenarios],
            "target": self.target,
            "max_batch_size": self.max_batch_size,
            "batch_multiple": self.batch_multiple,
            "optimizer_kwargs": {k: dict(v) for k, v in self.optimizer_kwargs.items()},
            "calibrate": self.calibrate.to_dict() if self.calibrate else None,
            "offset": self.offset.to_dict() if self.offset else None,
            "cpu_runtime_bytes": self.cpu_runtime_bytes,
            "report_at": list(self.report_at),
            "strategy": self.strategy,
            "world_size": self.world_size,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EstimateOptions:
        return cls(
            budget_bytes=int(data["budget_bytes"]),
            scenarios=tuple(NamedScenario.from_dict(s) for s in data.get("scenarios", ())),
            target=str(data.get("target", "cpu")),
            max_batch_size=int(data["max_batch_size"]),
            batch_multiple=int(data["batch_multiple"]),
            optimizer_kwargs={k: dict(v) for k, v in (data.get("optimizer_kwargs") or {}).items()},
            calibrate=Calibration.from_dict(data["calibrate"]) if data.get("calibrate") else None,
            offset=Offset.from_dict(data["offset"]) if data.get("offset") else None,
            cpu_runtime_bytes=int(data.get("cpu_runtime_bytes", CPU_RUNTIME_BYTES)),
            report_at=tuple(int(b) for b in data.get("report_at", ())),
            strategy=str(data.get("strategy", "none")),
            world_size=int(data.get("world_size", 1)),
        )
