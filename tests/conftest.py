"""Shared fixtures: every test gets its own probe cache and its own folder of device locks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Helpers shared by the tests (support.py) are imported by name from every folder under tests/.
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees another's probes, or waits for another's device lock."""
    monkeypatch.setenv("AUTOBATCH_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("AUTOBATCH_LOCK_DIR", str(tmp_path_factory.mktemp("locks")))
