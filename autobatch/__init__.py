"""autobatch: find the largest batch that fits your real PyTorch training step, and plan accumulation.

The public API is the result schema (:mod:`autobatch.result`), the pure core (search, plan, space),
the error tree, and the fake probes of :mod:`autobatch.testing`. Importing ``autobatch`` does not
import torch.
"""

from __future__ import annotations

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
    "AutobatchError",
    "Chosen",
    "ComboResult",
    "ConfigError",
    "ContractError",
    "DeviceError",
    "NothingFitsError",
    "ProbeFailure",
    "ProbeRecord",
    "ScriptError",
    "TuneResult",
    "UsageError",
    "__version__",
]
