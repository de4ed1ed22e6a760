"""The runtime guard: keep a job's batch when memory runs out (:class:`Guard`; docs/guard.md)."""

from __future__ import annotations

from autobatch.core.ladder import LadderSettings
from autobatch.errors import GuardError
from autobatch.guard.events import Evidence, GuardEvent, GuardSummary
from autobatch.guard.guard import Guard, GuardStep

__all__ = ["Evidence", "Guard", "GuardError", "GuardEvent", "GuardStep", "GuardSummary", "LadderSettings"]
