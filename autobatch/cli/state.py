"""Process-wide CLI state (set by the root callback; ``runner_factory`` by tests that run the CLI
in-process with a fake probe runner, as httpx's ``MockTransport`` stands in for the network)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from autobatch.records.protocol import ProbeRunner


@dataclass
class _State:
    verbose: bool = False
    quiet: bool = False  # --quiet: only errors and the final summary line
    #: Makes the runner every session of a command probes through (None: the real probe server).
    runner_factory: Optional[Callable[[], ProbeRunner]] = None


STATE = _State()
