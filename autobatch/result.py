"""Public path of the result record (``tune --json``, the result file, ``result.schema.json``).

The record lives in :mod:`autobatch.records.result`; this module keeps ``autobatch.result`` working for
readers of results. Code inside the package imports the record from its own module.
"""

from __future__ import annotations

from autobatch.records.result import Chosen, ComboResult, ProbeRecord, TuneResult, limited_failure

__all__ = ["Chosen", "ComboResult", "ProbeRecord", "TuneResult", "limited_failure"]
