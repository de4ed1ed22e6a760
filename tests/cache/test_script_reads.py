"""The files a script reads decide whether its stored result and its journaled probes are reused.

The probes here are a fake runner's that report reading ``config.json`` (the real probe's report is
autobatch.probe.files', exercised in tests/probe/test_script_files.py and tests/cli/test_as_is_files_e2e.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from support import FAKE_STEP, ONE_COMBINATION

import autobatch
from autobatch.cache.sources import ABSENT, HASHED_BYTES, changed_files, file_fingerprint
from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.settings import FIELDS
from autobatch.testing import FakeRunner, affine

MiB = 1 << 20


@dataclass
class ReadsConfig(FakeRunner):
    """Every probe reads config.json (and ``also``) and writes ckpt_last.pt, as a real probe reports it."""

    also: str | None = None

    def run(self, request: ProbeRequest) -> ProbeOutcome:
        outcome = super().run(request)
        if request.op == "probe":
            outcome.files_read = {"config.json": None, **({self.also: None} if self.also else {})}
            outcome.files_written = ["ckpt_last.pt"]
        return outcome


@pytest.fixture(autouse=True)
def _clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for info in FIELDS:
        if info.env not in ("AUTOBATCH_CACHE_DIR", "AUTOBATCH_LOCK_DIR"):  # the test's own (conftest)
            monkeypatch.delenv(info.env, raising=False)


def _tune(**extra: object) -> autobatch.TuneResult:
    return autobatch.tune(
        **FAKE_STEP, **ONE_COMBINATION, runner=ReadsConfig(affine(400 * MiB, 1.7 * MiB), **extra)
    )  # type: ignore[arg-type]


def test_an_edited_file_the_script_reads_is_measured_again(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"width": 64}')
    first = _tune()
    assert first.script_files == {
        "read": {"config.json": file_fingerprint(config)},
        "written": ["ckpt_last.pt"],
    }
    assert first.probes > 0 and any("the script wrote ckpt_last.pt" in note for note in first.notes)

    again = _tune()
    assert again.cache is not None and again.cache["served"] and again.script_files == first.script_files

    config.write_text('{"width": 2048}')
    edited = _tune()
    assert (
        not (edited.cache or {}).get("served") and edited.probes == first.probes
    )  # the journal's probes are not reused either
    assert edited.script_files is not None
    assert edited.script_files["read"]["config.json"] == file_fingerprint(config)


def test_a_file_that_cannot_be_fingerprinted_keeps_the_result_out_of_the_cache(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "shards").mkdir()  # opened by the probes: not a regular file
    first = _tune(also="shards")
    assert first.script_files is not None and first.script_files["read"]["shards"] is None
    assert any("not kept in the cache: the script reads shards" in note for note in first.notes)
    again = _tune(also="shards")
    assert not (again.cache or {}).get("served") and again.probes == first.probes


def test_a_file_tried_where_there_is_none_is_part_of_the_key(tmp_path: Path) -> None:
    """An optional override the script tries (absent): the result is kept, and the file appearing is a change."""
    (tmp_path / "config.json").write_text("{}")
    first = _tune(also="local.json")
    assert first.script_files is not None and first.script_files["read"]["local.json"] == ABSENT
    again = _tune(also="local.json")
    assert again.cache is not None and again.cache["served"]
    (tmp_path / "local.json").write_text('{"width": 2048}')
    appeared = _tune(also="local.json")
    assert not (appeared.cache or {}).get("served") and appeared.probes == first.probes


def test_fingerprints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.json").write_text("{}")
    fingerprint = file_fingerprint("a.json", tmp_path)
    assert fingerprint is not None and fingerprint.startswith("sha256:")
    assert file_fingerprint("missing.json", tmp_path) == ABSENT and file_fingerprint(tmp_path) is None
    assert changed_files({"a.json": fingerprint}, tmp_path) == []
    (tmp_path / "a.json").write_text("{ }")
    assert changed_files({"a.json": fingerprint, "b": None}, tmp_path) == ["a.json", "b"]
    monkeypatch.setattr("autobatch.cache.sources.HASHED_BYTES", 1)  # a data set: its size and time
    assert str(file_fingerprint("a.json", tmp_path)).startswith("stat:3:") and HASHED_BYTES > 1
