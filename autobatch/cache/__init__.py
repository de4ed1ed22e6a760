"""The cache: probe journals and stored tune results, keyed by what decides memory, safe to share.

``sources``  the script's local modules (what its fingerprint reads besides the script)
``keys``     the inputs of a tune and its key; the probe journal's fingerprint
``folder``   the cache folder: its lock, an unwritable folder, damaged files moved aside
``journal``  every probe's outcome, appended as it finishes (resume after an interruption)
``results``  complete results, served by a second identical tune without a probe server
``evidence`` what jobs saw at runtime, per tuned key (``autobatch run``, the in-loop guard)
``fresh``    the job's fresh process on the CPU, measured once and kept for the next tune or check
``manage``   ``autobatch cache list | show | clear``: the entries of a folder

Importing this package imports no torch.
"""

from __future__ import annotations

from autobatch.cache.evidence import Event, EvidenceStore
from autobatch.cache.folder import CacheFolder, default_folder
from autobatch.cache.journal import ProbeJournal, request_key
from autobatch.cache.keys import TuneInputs, fingerprint, tune_inputs
from autobatch.cache.results import ResultStore, StoredResult

__all__ = [
    "CacheFolder",
    "Event",
    "EvidenceStore",
    "ProbeJournal",
    "ResultStore",
    "StoredResult",
    "TuneInputs",
    "default_folder",
    "fingerprint",
    "request_key",
    "tune_inputs",
]
