"""The files a training script's memory depends on: the script, the local modules it imports, the files it reads.

:func:`source_digests` finds the local modules by reading the import statements (installed packages never
count); :func:`file_fingerprint` and :func:`changed_files` fingerprint the files a probe saw the script read
(:mod:`autobatch.probe.files`). What counts, and what cannot be seen, is told in docs/clusters.md.
"""

from __future__ import annotations

import ast
import hashlib
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autobatch.records.protocol import ProbeOutcome
    from autobatch.step.spec import ScriptSpec

#: Files up to this size are fingerprinted by their bytes; larger ones by their size and modification time.
HASHED_BYTES = 256 << 20
#: The fingerprint of a path the script tried to read where no file was (an optional config it looks for, a
#: package's metadata file that is not there): a file that appears there later is a change.
ABSENT = "absent"
#: Folders whose files are installed packages, never the user's own sources.
INSTALLED_MARKERS = ("site-packages", "dist-packages")


def local_sources(script: str | Path, cwd: str | Path | None = None) -> list[Path]:
    """The script and every local module it imports, directly or through other local modules."""
    script = Path(script).resolve()
    roots = _roots(script, cwd)
    found: dict[Path, None] = {}
    queue = [script]
    while queue:
        path = queue.pop()
        if path in found:
            continue
        found[path] = None
        for name, level in _imports(path):
            queue.extend(_resolve(name, level, path, roots))
    return list(found)


def source_digests(script: str | Path, cwd: str | Path | None = None) -> dict[str, str]:
    """Relative path -> sha256 of the script and its local modules (the script first).

    "Local" is what the probe server imports from the script's folder or the working folder (both on its
    ``sys.path``, the script's folder first, as :func:`autobatch.step.contract.load_script` and ``python -m``
    put them); paths are relative to that folder, so the same sources checked out elsewhere have the same
    fingerprint."""
    script = Path(script).resolve()
    roots = _roots(script, cwd)
    out: dict[str, str] = {}
    for path in local_sources(script, cwd):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        out[_relative(path, roots)] = hashlib.sha256(data).hexdigest()
    return out


def spec_sources(spec: ScriptSpec) -> dict[str, str]:
    """The digests of a spec's script and its local modules (:func:`source_digests`); a spec of callables: its
    content's (:meth:`autobatch.step.spec.ScriptSpec.content`)."""
    if spec.is_file:
        return source_digests(spec.target)
    return {"spec": hashlib.sha256(spec.content()).hexdigest()}


def file_fingerprint(path: str | Path, cwd: str | Path | None = None) -> str | None:
    """``sha256:<hex>`` of a file's bytes, or ``stat:<size>:<mtime ns>`` above :data:`HASHED_BYTES`; :data:`ABSENT`
    where there is no file; None when it cannot be fingerprinted (not a regular file, unreadable). A relative
    path is under ``cwd``."""
    where = Path(cwd or Path.cwd()) / path
    try:
        info = where.stat()
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT
    try:
        if not stat.S_ISREG(info.st_mode):
            return None
        if info.st_size > HASHED_BYTES:
            return f"stat:{info.st_size}:{info.st_mtime_ns}"
        hasher = hashlib.sha256()
        with open(where, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                hasher.update(block)
        return f"sha256:{hasher.hexdigest()}"
    except OSError:
        return None


def changed_files(read: Mapping[str, str | None], cwd: str | Path | None = None) -> list[str]:
    """The files of ``read`` (path -> fingerprint then) whose fingerprint is not the same now, or none."""
    return [path for path, then in read.items() if then is None or file_fingerprint(path, cwd) != then]


class FilesSeen:
    """The files a session's probes read (path -> fingerprint when first seen) and tried to write; each file is
    fingerprinted once a session (:func:`file_fingerprint`), as it is now."""

    def __init__(self) -> None:
        self.read: dict[str, str | None] = {}
        self.written: list[str] = []
        self._now: dict[str, str | None] = {}

    def take(self, outcome: ProbeOutcome) -> None:
        """Keep a probe's files; one run now gets their fingerprints (a journaled one carries its own)."""
        for path, then in outcome.files_read.items():
            outcome.files_read[path] = then if outcome.cached else self.now(path)
            self.read.setdefault(path, outcome.files_read[path])
        self.written.extend(p for p in outcome.files_written if p not in self.written)

    def unchanged(self, outcome: ProbeOutcome) -> bool:
        """Whether every file a journaled probe read is as it was then (one without a fingerprint never is)."""
        return all(then is not None and self.now(p) == then for p, then in outcome.files_read.items())

    def now(self, path: str) -> str | None:
        if path not in self._now:
            self._now[path] = file_fingerprint(path)
        return self._now[path]

    def to_result(self) -> dict[str, Any] | None:
        """The result's ``script_files`` (None: nothing seen)."""
        if not (self.read or self.written):
            return None
        return {"read": dict(self.read), "written": list(self.written)}


def _roots(script: Path, cwd: str | Path | None) -> list[Path]:
    roots = [script.parent]
    here = Path(cwd).resolve() if cwd is not None else Path.cwd().resolve()
    if here not in roots:
        roots.append(here)
    return roots


def _relative(path: Path, roots: list[Path]) -> str:
    for root in roots:
        try:
            return path.relative_to(root).as_posix()
        except ValueError:
            continue
    return path.as_posix()


def _imports(path: Path) -> list[tuple[str, int]]:
    """(dotted name, level) of every import in the file; ``from a import b`` also yields ``a.b``."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return []  # the probe server reports a broken script; its bytes still count
    names: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend((alias.name, 0) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            names.append((base, node.level))
            names.extend(
                (f"{base}.{alias.name}" if base else alias.name, node.level)
                for alias in node.names
                if alias.name != "*"
            )
    return names


def _resolve(name: str, level: int, importer: Path, roots: list[Path]) -> list[Path]:
    """The local files that importing ``name`` executes (empty for installed or missing modules)."""
    parts = [p for p in name.split(".") if p]
    if level:
        base = importer.parent
        for _ in range(level - 1):
            base = base.parent
        candidates = [base] if any(_inside(base, root) for root in roots) else []
    else:
        # Python takes the first folder on sys.path that has the top-level name.
        candidates = [root for root in roots if parts and _module_at(root, parts[:1])]
        candidates = candidates[:1]
    files: list[Path] = []
    for base in candidates:
        folder = base
        for index in range(len(parts)):
            init = folder / parts[index] / "__init__.py"
            module = folder / f"{parts[index]}.py"
            if init.is_file():
                files.append(init)
                folder = folder / parts[index]
            elif module.is_file():
                files.append(module)
                break
            elif (folder / parts[index]).is_dir():  # a namespace package
                folder = folder / parts[index]
            else:
                break
    return [f.resolve() for f in files if not _installed(f)]


def _module_at(root: Path, parts: list[str]) -> bool:
    head = root / parts[0]
    return (head.with_suffix(".py")).is_file() or head.is_dir()


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root)
        return True
    except ValueError:
        return False


def in_site_folder(path: str | Path) -> bool:
    """Whether ``path`` lies in a folder of installed packages (``site-packages``, ``dist-packages``)."""
    return any(marker in Path(path).parts for marker in INSTALLED_MARKERS)


def _installed(path: Path) -> bool:
    resolved = path.resolve()
    if in_site_folder(resolved):
        return True
    prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return any(_inside(resolved, prefix) for prefix in prefixes if prefix != Path("/"))
