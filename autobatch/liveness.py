"""Public path of :func:`run_state`: is the tune that wrote a result file still running?

The rules live in :mod:`autobatch.records.liveness`; this module keeps ``autobatch.liveness`` working
for job scripts that poll a result file.
"""

from __future__ import annotations

from autobatch.records.liveness import RESUME_HINT, RunState, run_state, unfinished

__all__ = ["RESUME_HINT", "RunState", "run_state", "unfinished"]
