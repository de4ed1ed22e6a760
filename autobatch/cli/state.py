"""Process-wide CLI state (set by the root callback)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _State:
    verbose: bool = False


STATE = _State()
