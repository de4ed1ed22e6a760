"""autobatch: find the largest batch that fits your real PyTorch training step, and plan accumulation.

The public API is :func:`tune` and :func:`check` (:mod:`autobatch.api`: your code or a notebook, same
isolated probes as the CLI), the result schema (:mod:`autobatch.result`, published as
``result.schema.json``), the pure core (search, plan, space), the error tree, the adapters of
:mod:`autobatch.integrations` (Hugging Face, Lightning) and the fake probes of :mod:`autobatch.testing`.
Importing ``autobatch`` does not import torch.
"""

from __future__ import annotations

from .api import ProbeEvent, check, tune
from .check_result import CheckResult
from .core.plan import Plan, choose, knee, plan_accumulation
from .core.search import Affine, Observation, SearchResult, probe_bound, search_max_batch
from .errors import (
    AutobatchError,
    ConfigError,
    ContractError,
    DeviceError,
    NothingFitsError,
    ProbeFailure,
    ScriptError,
    UsageError,
)
from .result import Chosen, ComboResult, ProbeRecord, TuneResult

__version__ = "0.1.0"

__all__ = [
    "Affine",
    "AutobatchError",
    "CheckResult",
    "Chosen",
    "ComboResult",
    "ConfigError",
    "ContractError",
    "DeviceError",
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
    "check",
    "choose",
    "knee",
    "plan_accumulation",
    "probe_bound",
    "search_max_batch",
    "tune",
]
