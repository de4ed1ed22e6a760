"""Atomic writes give files the mode a plain open() would: the umask honoured, a replaced file's mode kept."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from autobatch.records.files import current_umask, write_atomic


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_gets_0666_less_the_umask(tmp_path: Path, umask: None, mask: int, expected: int) -> None:
    os.umask(mask)
    assert current_umask() == mask
    path = write_atomic(tmp_path / "out" / "ds_config.json", "{}")
    assert mode(path) == expected  # was 0600 whatever the umask (mkstemp's mode)
    assert path.read_text() == "{}"


def test_a_replaced_file_keeps_its_mode(tmp_path: Path, umask: None) -> None:
    path = tmp_path / "autobatch.env"
    path.write_text("old")
    path.chmod(0o640)
    write_atomic(path, "new")
    assert mode(path) == 0o640 and path.read_text() == "new"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_a_name_held_as_surrogate_escapes_is_written_as_the_file_system_s_bytes(tmp_path: Path) -> None:
    """Under LC_ALL=C Python holds ``données`` as ``donn\\udcc3\\udca9es``: written back as its bytes, é in UTF-8."""
    held = b"python /data/donn\xc3\xa9es/train.py".decode("ascii", "surrogateescape")  # os.fsdecode's, there
    written = write_atomic(tmp_path / "job.sh", held)
    assert written.read_bytes() == "python /data/données/train.py".encode()
