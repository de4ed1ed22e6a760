"""Stored results: served only for the same inputs on a device that is not busier; damage is moved aside."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from requesting import probe_request

from autobatch.cache import CacheFolder, ResultStore, TuneInputs
from autobatch.cache.manage import clear, entries, find, parse_age
from autobatch.cache.results import busier, served
from autobatch.errors import UsageError
from autobatch.probe.yielding import switch_note
from autobatch.records.protocol import ProbeOutcome
from autobatch.records.result import Chosen, Circumstance, ComboResult, ProbeRecord, TuneResult
from autobatch.run.session import Warnings

GiB = 1 << 30


def inputs(**change: object) -> TuneInputs:
    base: dict[str, object] = {
        "sources": {"train.py": "ab" * 32},
        "script_args": [],
        "settings": {"precisions": ["32-true"], "memory": GiB},
        "device": {"type": "cpu", "processor": "x"},
        "versions": {"torch": "2.13.0", "autobatch": "0.1.0"},
    }
    base.update(change)
    return TuneInputs(**base)  # type: ignore[arg-type]


def result(status: str = "complete") -> TuneResult:
    combo = ComboResult("32-true", "adamw", False, status="exact", max_batch_size=64, probes=2)
    combo.trace = [ProbeRecord(64, "fits", 900, 10, 1.0, started_at=1.0)]
    return TuneResult(
        "train.py", [], {"type": "cpu", "budget_bytes": GiB}, "throughput", [combo],
        chosen=Chosen("32-true", "adamw", False, 64, 1, 1, 64), status=status, probes=2,
    )  # fmt: skip


def store(tmp_path: Path, warnings: list[str] | None = None) -> ResultStore:
    return ResultStore(
        CacheFolder(tmp_path / "cache", warn=warnings.append if warnings is not None else None)
    )


def test_a_complete_result_is_served_for_the_same_inputs_only(tmp_path: Path) -> None:
    s = store(tmp_path)
    assert s.put(inputs(), result()) is not None
    hit = s.get(inputs())
    assert hit is not None and hit.result.combinations[0].max_batch_size == 64
    for changed in (
        inputs(sources={"train.py": "cd" * 32}),
        inputs(sources={"train.py": "ab" * 32, "model.py": "ef" * 32}),
        inputs(script_args=["--seq-len", "2048"]),
        inputs(settings={"precisions": ["32-true", "bf16-mixed"], "memory": GiB}),
        inputs(device={"type": "cpu", "processor": "y"}),
        inputs(versions={"torch": "2.14.0", "autobatch": "0.1.0"}),
    ):
        assert changed.key() != inputs().key()
        assert s.get(changed) is None


def test_what_is_served_says_so(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.put(inputs(), result())
    hit = s.get(inputs())
    assert hit is not None
    answer = served(hit, "elsewhere/train.py", ["--x"])
    assert (
        answer.probes == 0
        and answer.cache
        and answer.cache["served"]
        and answer.cache["key"] == inputs().key()
    )
    assert answer.script == "elsewhere/train.py" and all(
        p.cached for c in answer.combinations for p in c.trace
    )


def test_what_the_measuring_run_warned_of_its_circumstances_is_served_as_that_run_s(tmp_path: Path) -> None:
    """A busy CPU (the server's switch to passive threads) and the run's world source are that run's; a peak that
    depends on the data is the answer's. Served: the first labelled with the run's date, the second left to the
    serving run to state, the third as it was; a document stored before circumstances were kept, as it was."""
    run = Warnings()
    kept = result()
    kept.created = "2026-11-30T23:53:55+00:00"
    kept.notes.append(Circumstance("world size 2 from WORLD_SIZE=2"))
    run.keep_in(kept.notes)
    busy = switch_note(probe_request(8), ProbeOutcome("fits", cpu_wait=0.6, steps=3))
    run(busy)
    run("32-true/adamw/no-recompute: the peak depends on the data")
    s = store(tmp_path)
    s.put(inputs(), kept)
    hit = s.get(inputs())
    assert hit is not None
    assert served(hit, "train.py", []).notes == [
        f"the run that measured, on 2026-11-30T23:53:55+00:00, warned: {busy}",
        "warning: 32-true/adamw/no-recompute: the peak depends on the data",
    ]
    document = json.loads(s.path(inputs().key()).read_text())
    del document["circumstances"]
    s.path(inputs().key()).write_text(json.dumps(document))
    old = s.get(inputs())
    assert old is not None and served(old, "train.py", []).notes == kept.notes


def test_only_complete_and_cacheable_results_are_stored(tmp_path: Path) -> None:
    s = store(tmp_path)
    assert s.put(inputs(), result("interrupted")) is None
    assert s.put(inputs(why_not="the CPU's capacity moves"), result()) is None
    assert not list((tmp_path / "cache").glob("*.result.json"))


def test_a_busier_gpu_is_not_served_an_old_answer(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.put(inputs(), result(), device_used_bytes=1 * GiB)
    assert s.get(inputs(), 1 * GiB) is not None
    assert s.get(inputs(), 1 * GiB + (32 << 20)) is not None  # within the tolerance
    assert s.get(inputs(), 2 * GiB) is None
    assert s.get(inputs(), 0) is not None  # freer than then: the old answer still holds
    assert busier(None, None) is False and busier(GiB, None) is True


@pytest.mark.parametrize("damage", [b"{ not json", b'{"kind": "result", "key": "x"}', b"\x00\x01\x02"])
def test_a_damaged_result_is_moved_aside_with_a_warning(tmp_path: Path, damage: bytes) -> None:
    warnings: list[str] = []
    s = store(tmp_path, warnings)
    path = s.put(inputs(), result())
    assert path is not None
    path.write_bytes(damage)
    assert s.get(inputs()) is None
    assert len(warnings) == 1 and "damaged" in warnings[0]
    assert not path.exists() and list(path.parent.glob(f"{path.name}.corrupt-*"))
    assert s.put(inputs(), result()) is not None and s.get(inputs()) is not None  # rebuilt


def test_list_show_and_clear_by_age(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.put(inputs(), result())
    s.put(inputs(script_args=["old"]), result())
    old = s.path(inputs(script_args=["old"]).key())
    os.utime(old, (time.time() - 10 * 86400,) * 2)
    (tmp_path / "cache" / "j.jsonl").write_text(json.dumps({"meta": {"script": "t.py"}}) + "\n")
    found = {e.key: e for e in entries(s.folder)}
    assert {e.kind for e in found.values()} == {"result", "journal"} and len(found) == 3
    assert found[inputs().key()].detail.startswith("32-true/adamw/no-recompute micro-batch 64")
    assert [e.key for e in find(s.folder, inputs().key()[:6])] == [inputs().key()]
    removed = clear(s.folder, parse_age("7d"))
    assert [e.path for e in removed] == [old]
    assert len(clear(s.folder)) == 2 and entries(s.folder) == []


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 604800), ("2w", 1209600)]
)
def test_ages(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


def test_an_age_without_a_unit_is_refused() -> None:
    with pytest.raises(UsageError, match="unit"):
        parse_age("7")
