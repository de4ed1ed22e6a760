"""autobatch: find the largest batch that fits your real PyTorch training step, and plan accumulation.

The public API is the result schema (:mod:`autobatch.result`), the pure core (search, plan, space),
the error tree, and the fake probes of :mod:`autobatch.testing`. Importing ``autobatch`` does not
import torch.
"""

from __future__ import annotations

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
    "Chosen",
    "ComboResult",
    "ConfigError",
    "ContractError",
    "DeviceError",
    "NothingFitsError",
    "Observation",
    "Plan",
    "ProbeFailure",
    "ProbeRecord",
    "ScriptError",
    "SearchResult",
    "TuneResult",
    "UsageError",
    "__version__",
    "choose",
    "knee",
    "plan_accumulation",
    "probe_bound",
    "search_max_batch",
]
