"""The package version, where every layer can read it (the package's ``__init__`` re-exports it).

:data:`MEASURED_BY` names what a probe measures for the same script, settings and device: the version,
and a counter raised whenever that changes between releases (2: recomputation wraps the outermost
repeated blocks, and every step of a probe draws its own batch; 3: CPU probes count as the job's fresh
process, :mod:`autobatch.probe.fresh`; 4: probes run from a scratch folder and report the files the script
reads, whose fingerprints a stored answer is checked against, :mod:`autobatch.probe.files`). The result cache and the probe journal
key on it, so no answer measured the old way is served after such a change.
"""

__version__ = "0.1.0"
MEASURED_BY = f"{__version__}+measures.4"
