"""Public path of the answer of one check (``check --json``, ``autobatch.check()``).

The record lives in :mod:`autobatch.records.check`; this module keeps ``autobatch.check_result`` working.
"""

from __future__ import annotations

from autobatch.records.check import CheckResult

__all__ = ["CheckResult"]
