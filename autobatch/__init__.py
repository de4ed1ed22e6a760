"""autobatch: find the largest batch that fits your real PyTorch training step, and plan accumulation.

The public API is :func:`tune` and :func:`check` (:mod:`autobatch.api`: your code or a notebook, same
isolated probes as the CLI), the result schema (:mod:`autobatch.records.result`, published as
``result.schema.json``), the pure core (search, plan, space), the runtime guard (:class:`Guard`, for the job's own loop), the error tree, the adapters of
:mod:`autobatch.integrations` (Hugging Face, Lightning) and the fake probes of :mod:`autobatch.testing`.
Importing ``autobatch`` does not import torch, nor any of these until one is used (the command's entry
point, which asks the daemon first, stays light).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autobatch.api import ProbeEvent, apply_recompute, check, tune
    from autobatch.core.plan import Plan, choose, knee, plan_accumulation
    from autobatch.core.search import (
        Affine,
        Guidance,
        Observation,
        SearchResult,
        probe_bound,
        search_max_batch,
    )
    from autobatch.errors import (
        AutobatchError,
        ConfigError,
        ContractError,
        DeviceError,
        GuardError,
        NothingFitsError,
        ProbeFailure,
        ScriptError,
        UsageError,
    )
    from autobatch.guard import Guard, GuardStep, GuardSummary, LadderSettings
    from autobatch.records.check import CheckResult
    from autobatch.records.result import Chosen, ComboResult, ProbeRecord, TuneResult

from autobatch.records.version import __version__

#: Where each public name lives: imported on first use (PEP 562).
_HOMES = {
    "autobatch.api": ("ProbeEvent", "apply_recompute", "check", "tune"),
    "autobatch.core.plan": ("Plan", "choose", "knee", "plan_accumulation"),
    "autobatch.core.search": (
        "Affine",
        "Guidance",
        "Observation",
        "SearchResult",
        "probe_bound",
        "search_max_batch",
    ),
    "autobatch.errors": (
        "AutobatchError",
        "ConfigError",
        "ContractError",
        "DeviceError",
        "GuardError",
        "NothingFitsError",
        "ProbeFailure",
        "ScriptError",
        "UsageError",
    ),
    "autobatch.guard": ("Guard", "GuardStep", "GuardSummary", "LadderSettings"),
    "autobatch.records.check": ("CheckResult",),
    "autobatch.records.result": ("Chosen", "ComboResult", "ProbeRecord", "TuneResult"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'autobatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})


__all__ = [
    "Affine",
    "AutobatchError",
    "CheckResult",
    "Chosen",
    "ComboResult",
    "ConfigError",
    "ContractError",
    "DeviceError",
    "Guard",
    "GuardError",
    "GuardStep",
    "GuardSummary",
    "Guidance",
    "LadderSettings",
    "NothingFitsError",
    "Observation",
    "Plan",
    "ProbeEvent",
    "ProbeFailure",
    "ProbeRecord",
    "ScriptError",
    "SearchResult",
    "TuneResult",
    "UsageError",
    "__version__",
    "apply_recompute",
    "check",
    "choose",
    "knee",
    "plan_accumulation",
    "probe_bound",
    "search_max_batch",
    "tune",
]
