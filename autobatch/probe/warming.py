"""What the probe server imports before it forks, and the check that forking from it stays safe.

No user code runs in the process that forks. The server imports torch, the probe operations and the
third-party modules the step's source imports at its top level (read from the source with :mod:`ast`,
never run), down to the names a ``from X import a, b`` takes (a library that loads its names lazily,
as transformers does, would otherwise load them again in every probe), then forks a probe per request,
and each probe imports the user's script itself. A child
forked after an OpenMP thread pool has started hangs in its first parallel region (GNU OpenMP is not
fork-safe), and a script that prepares its data at import starts that pool (``X.mean(0)`` on a large
tensor) or a ``multiprocessing.Pool``: run in the server, such a script made every probe hang.

Importing a third-party module can start threads too. The server counts its threads after importing
torch and again after the third-party modules; when the count grew, it starts again with torch alone,
and the result says which modules were left for every probe to import (:func:`describe`). A thread whose
library makes a fork safe by itself does not count where the device allows it (:class:`Warming`): a Hugging
Face ``Trainer`` script's probes fork with ``Trainer`` loaded instead of loading it again each (2.2 s here).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import resource
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autobatch.devices.cpu import under_hard

#: Threads whose library makes a fork with them safe, by the name the kernel shows (``/proc/.../comm``):
#: jemalloc's background purging thread (pyarrow's jemalloc starts one as it loads, and ``from transformers
#: import Trainer`` loads pyarrow): jemalloc's own fork handlers take its locks before a fork and, in the child,
#: reinitialise them and mark its background threads stopped (the child purges as it allocates instead).
FORK_SAFE_THREADS = frozenset({"jemalloc_bg_thd"})
#: The libraries an adapter's step imports, by the spec's kind (autobatch.step.spec).
ADAPTER_MODULES = {"hf": ("transformers",), "lightning": ("lightning",)}


@dataclass(frozen=True)
class Warming:
    """What the device being probed allows the probe server's warm-up, beyond the plain case (every thread
    counts, the imports run unlimited).

    ``fork_safe``: the threads of :data:`FORK_SAFE_THREADS` may stay. Where the budget is the process's data
    memory (the CPU device) that needs ``data_limit``, the budget, as the import's soft ``RLIMIT_DATA``: a
    library loaded without a limit reserves address space by what it finds (pyarrow's allocators: 1.2 GiB of
    data memory for ``from transformers import Trainer``, 0.3 GiB under a 0.9 GiB limit), and every forked probe
    would start with the unlimited reservation, where a probe that imports it itself, under its cap, has the
    smaller one. On a GPU the host's data memory is not what is measured: no limit is needed."""

    fork_safe: bool = False
    data_limit: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"fork_safe": self.fork_safe, "data_limit": self.data_limit}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Warming:
        data = data or {}
        limit = data.get("data_limit")
        return cls(bool(data.get("fork_safe")), int(limit) if limit is not None else None)

    def holds_no_more_than(self, other: Warming) -> bool:
        """Whether what imports under this warm-up reserves no more than it would under ``other``: the same, or a
        data limit at most ``other``'s (a library reserves by the limit it finds). A server of ``other``'s may
        then be forked from a process that imported under this one: the fresh-process offset, measured on that
        server, counts the smaller reservation back, and nothing it holds before building can exceed what its
        own imports would."""
        if self == other:
            return True
        return self.data_limit is not None and (
            other.data_limit is None or self.data_limit <= other.data_limit
        )

    def describe(self) -> str:
        """How the step's modules import, in words."""
        if self.data_limit is None:
            return "imports without a data limit"
        from autobatch.core.units import format_bytes

        return f"imports under a data limit of {format_bytes(self.data_limit)}"

    @contextmanager
    def importing(self) -> Iterator[None]:
        """While the step's modules import: the soft data limit, if any (the hard one stays; restored after)."""
        if self.data_limit is None:
            yield
            return
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        resource.setrlimit(resource.RLIMIT_DATA, (under_hard(self.data_limit, hard), hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def thread_count(fork_safe: bool = False) -> int:
    """The threads of this process, as the kernel counts them (started by C libraries too); ``fork_safe``:
    all but those of :data:`FORK_SAFE_THREADS`."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return threading.active_count()
    if not fork_safe:
        return len(tasks)
    return sum(1 for task in tasks if _thread_name(task) not in FORK_SAFE_THREADS)


def _thread_name(task: str) -> str:
    try:
        with open(f"/proc/self/task/{task}/comm", encoding="utf-8", errors="replace") as comm:
            return comm.read().strip()
    except OSError:  # ended since the listing
        return ""


def step_imports(spec: str | Mapping[str, Any]) -> list[str]:
    """The third-party imports of the step's top level, never the user's own modules: ``module`` for an
    ``import``, ``module:name`` for each name a ``from module import`` takes."""
    if isinstance(spec, str):
        spec = {"kind": "path", "target": spec}
    kind, target = spec.get("kind"), str(spec.get("target", ""))
    names = list(ADAPTER_MODULES.get(str(kind), ()))
    files: list[Path] = []
    if kind in ("path", "as_is"):
        files.append(Path(target))
    elif kind in ("reference", "lightning"):
        for where in (target, str((spec.get("options") or {}).get("datamodule") or "")):
            where = where.rpartition(":")[0] if ":" in where else where
            if where.endswith(".py") or "/" in where:
                files.append(Path(where))
    for file in files:
        names.extend(_top_level_imports(file))
    local = {file.resolve().parent for file in files if file.is_file()}
    third_party = {top for top in {top_package(name) for name in names} if _third_party(top, local)}
    return [name for name in dict.fromkeys(names) if top_package(name) in third_party]


def warm(names: list[str]) -> list[str]:
    """Import ``names`` (``module`` or ``module:name``, those that import cleanly); returns the ones imported."""
    imported = []
    for name in names:
        module, _, attribute = name.partition(":")
        try:
            loaded = importlib.import_module(module)
            if attribute:
                getattr(loaded, attribute)  # a lazy module's name loads its submodule now
        except BaseException:  # noqa: BLE001 - a warm-up, never a failure: the probe imports it for real
            continue
        imported.append(name)
    return imported


def describe(start: Mapping[str, Any]) -> str | None:
    """The result's note on how probes start, when it is not the plain case; None otherwise."""
    cold = start.get("cold")
    if not cold:
        return None
    return (
        f"probe processes start from a server that imported torch only: {cold}; every probe imports those "
        "modules itself (slower probes, the same memory)"
    )


def _top_level_imports(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in tree.body:  # module level only: an import inside a function has not run at import time
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.append(node.module)
            names.extend(f"{node.module}:{alias.name}" for alias in node.names if alias.name != "*")
    return names


def top_package(name: str) -> str:
    """The top-level package of ``module`` or ``module:name``."""
    return name.partition(":")[0].partition(".")[0]


def loaded_since(before: frozenset[str] | set[str]) -> dict[str, str]:
    """The modules imported since ``before`` (a snapshot of ``sys.modules``) that have a file: name -> file."""
    found = {}
    for name in set(sys.modules) - before:
        try:  # a lazy module's attribute may load more, or raise: never the caller's failure
            path = getattr(sys.modules.get(name), "__file__", None)
        except Exception:  # noqa: BLE001
            continue
        if path:
            found[name] = str(path)
    return found


def _standard(name: str) -> bool:
    names = getattr(sys, "stdlib_module_names", None)  # Python 3.10+
    if names is not None:
        return name in names
    import sysconfig

    found = importlib.util.find_spec(name)
    origin = getattr(found, "origin", None) or ""
    return origin.startswith(sysconfig.get_paths()["stdlib"]) and "site-packages" not in origin


def _third_party(name: str, local: set[Path]) -> bool:
    """Installed outside the script's folder (not the user's own module); not the standard library (cheap,
    and mostly imported by torch already), not autobatch itself."""
    if name in ("autobatch", "__main__") or name in sys.builtin_module_names or _standard(name):
        return False
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if found is None or not found.origin or found.origin in ("built-in", "frozen"):
        return False
    origin = Path(found.origin).resolve()
    return not any(folder in origin.parents for folder in local)
