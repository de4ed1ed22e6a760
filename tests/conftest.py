"""Shared fixtures: every test gets its own probe cache."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees another's probes."""
    monkeypatch.setenv("AUTOBATCH_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
