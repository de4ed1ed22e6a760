"""What is wrong with a training script's path, said once for every command (before any probe server).

A missing path, a folder and something that is not a regular file each get their own message; a file
without the ``.py`` suffix is accepted (autobatch imports it as Python source whatever its name).
"""

from __future__ import annotations

from pathlib import Path

from autobatch.errors import UsageError

HINT = "pass the path of a .py file that defines build_model, make_batch and compute_loss"


def check_script_path(path: str | Path) -> Path:
    """The path, resolved, if it names a readable regular file; a :class:`UsageError` otherwise."""
    resolved = Path(path).expanduser().resolve()
    if resolved.is_dir():
        scripts = sorted(p.name for p in resolved.glob("*.py"))[:5]
        found = f" (it holds {', '.join(scripts)})" if scripts else ""
        raise UsageError(f"the training script {path} is a folder, not a file{found}", hint=HINT)
    if not resolved.exists():
        raise UsageError(f"training script not found: {path}", hint=HINT)
    if not resolved.is_file():
        raise UsageError(f"the training script {path} is not a regular file", hint=HINT)
    try:
        with open(resolved, "rb"):
            pass
    except OSError as exc:
        raise UsageError(
            f"cannot read the training script {path}: {exc.strerror or exc}", hint=HINT
        ) from None
    return resolved


def script_digest(path: Path) -> str | None:
    """A digest of the script's bytes (None when it cannot be read any more)."""
    import hashlib

    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None
