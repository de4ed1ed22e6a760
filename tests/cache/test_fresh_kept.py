"""The job's fresh process, kept for the next run: used only for equal inputs and unchanged files."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autobatch.cache import CacheFolder
from autobatch.cache.fresh import FreshInputs, FreshStore, KeptFresh
from autobatch.cache.manage import clear, entries
from autobatch.devices.cpu import environment

MIB = 1 << 20


def inputs(**change: object) -> FreshInputs:
    base = FreshInputs(
        sources={"train.py": "ab" * 32},
        script_args=[],
        versions={"torch": "2.13.0", "autobatch": "0.1.0", "python": "3.11.7"},
        step={"device": "cpu", "ranks": None, "seq_len": None, "as_is": None},
        interpreter={"executable": "/venv/bin/python", "site": {"/venv/site-packages": 1}},
        environment={},
    )
    return replace(base, **change)  # type: ignore[arg-type]


def test_a_kept_fresh_process_is_used_for_the_same_inputs_only(tmp_path: Path) -> None:
    store = FreshStore(CacheFolder(tmp_path))
    assert store.get(inputs()) is None
    measured = KeptFresh.now([300 * MIB])
    assert store.put(inputs(), measured, "train.py", []) is not None
    assert store.get(inputs()) == measured
    for other in (
        inputs(sources={"train.py": "cd" * 32}),
        inputs(script_args=["--width", "2"]),
        inputs(versions={"torch": "2.14.0", "autobatch": "0.1.0", "python": "3.11.7"}),
        inputs(step={"device": "cpu", "ranks": ["ddp", 2], "seq_len": None, "as_is": None}),
        inputs(interpreter={"executable": "/venv/bin/python", "site": {"/venv/site-packages": 2}}),
        inputs(environment={"MALLOC_ARENA_MAX": "2"}),
    ):
        assert store.get(other) is None, other


def test_a_file_the_script_read_that_changed_measures_it_again(tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text("one")
    store = FreshStore(CacheFolder(tmp_path / "cache"))
    store.put(inputs(), KeptFresh.now([300 * MIB]), "train.py", [str(data)])
    assert store.get(inputs()) is not None
    data.write_text("two, longer")
    assert store.get(inputs()) is None


def test_a_file_that_cannot_be_fingerprinted_keeps_nothing(tmp_path: Path) -> None:
    store = FreshStore(CacheFolder(tmp_path / "cache"))
    (tmp_path / "shards").mkdir()  # opened by the script: not a regular file
    assert store.put(inputs(), KeptFresh.now([1]), "train.py", [str(tmp_path / "shards")]) is None
    assert store.get(inputs()) is None


def test_a_file_tried_where_there_is_none_is_kept_as_absent_until_it_appears(tmp_path: Path) -> None:
    store = FreshStore(CacheFolder(tmp_path / "cache"))
    local = tmp_path / "local.json"
    assert store.put(inputs(), KeptFresh.now([1]), "train.py", [str(local)]) is not None
    assert store.get(inputs()) is not None
    local.write_text("{}")
    assert store.get(inputs()) is None


def test_a_damaged_file_is_moved_aside_and_listed_as_such(tmp_path: Path) -> None:
    folder = CacheFolder(tmp_path)
    store = FreshStore(folder)
    store.path(inputs().key()).write_text("{not json")
    assert store.get(inputs()) is None
    assert [e.kind for e in entries(folder)] == ["damaged"]


def test_cache_list_shows_and_clear_removes_a_kept_fresh_process(tmp_path: Path) -> None:
    folder = CacheFolder(tmp_path)
    FreshStore(folder).put(inputs(), KeptFresh.now([300 * MIB]), "train.py", [])
    (entry,) = entries(folder)
    assert (entry.kind, entry.script, entry.device) == ("fresh", "train.py", "cpu")
    assert "300.00 MiB" in entry.detail
    assert json.loads(entry.path.read_text())["job_bytes"] == [300 * MIB]
    assert [e.kind for e in clear(folder)] == ["fresh"] and entries(folder) == []


def test_the_environment_it_depends_on_is_the_allocators_the_threads_and_the_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", "/src")
    monkeypatch.setenv("SLURM_JOB_ID", "17")  # every job has its own: it would never be reused
    seen = environment()
    assert {"MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1", "PYTHONPATH": "/src"}.items() <= seen.items()
    assert "SLURM_JOB_ID" not in seen


def test_inputs_json_cannot_hold_are_kept_as_their_text(tmp_path: Path) -> None:
    store = FreshStore(CacheFolder(tmp_path))
    odd = inputs(step={"device": "cpu", "as_is": {"config": tmp_path / "c.yaml"}})
    assert store.put(odd, KeptFresh.now([1]), "train.py", []) is not None
    assert store.get(odd) is not None
