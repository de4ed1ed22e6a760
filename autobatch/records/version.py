"""The package version, where every layer can read it (the package's ``__init__`` re-exports it).

:data:`MEASURED_BY` names what a probe measures for the same script, settings and device: the version,
and a counter raised whenever that changes between releases (2: recomputation wraps the outermost
repeated blocks, and every step of a probe draws its own batch; 3: CPU probes count as the job's fresh
process, :mod:`autobatch.probe.fresh`; 4: probes run from a scratch folder and report the files the script
reads, whose fingerprints a stored answer is checked against, :mod:`autobatch.probe.files`; 5: CPU timing probes
run the probes' pinned allocator, which every CPU plan carries, :data:`autobatch.devices.cpu.MALLOC_ENV`). The result cache and the probe journal
key on it, so no answer measured the old way is served after such a change.
"""

from __future__ import annotations

__version__ = "0.1.0"
MEASURED_BY = f"{__version__}+measures.5"


def torch_version() -> str:
    """The installed torch's version, read from ``torch/version.py`` without importing torch (which
    takes seconds), else from its package metadata."""
    import importlib.util
    import re
    from pathlib import Path

    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        try:
            text = (Path(spec.origin).parent / "version.py").read_text()
            found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
            if found:
                return found.group(1)
        except OSError:
            pass
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "not installed"
