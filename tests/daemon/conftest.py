"""The daemon tests' folder: each test's own daemon folder, its daemon stopped after it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from autobatch.daemon.client import Client
from autobatch.daemon.place import Place


@pytest.fixture
def place() -> Iterator[Place]:
    """A daemon folder of the test's own (short: a socket's path has at most 107 bytes); its daemon stopped."""
    folder = Path(tempfile.mkdtemp(prefix="abd-")) / "rt"
    here = Place(folder)
    yield here
    if (folder / "daemon.sock").exists():
        Client(here).stop(timeout=60)
    shutil.rmtree(folder.parent, ignore_errors=True)
