"""Runtime evidence per tuned key: appended whole, read back, listed by ``cache list``, summed up for a tune."""

from __future__ import annotations

from pathlib import Path

from autobatch.cache import CacheFolder, Event, EvidenceStore
from autobatch.cache.evidence import summary
from autobatch.cache.manage import entries


def _launch(micro: int, outcome: str, code: int, number: int) -> Event:
    return Event("run", "launch", micro, 8 // micro, outcome=outcome, exit_code=code, launch=number,
                 peak_bytes=500 << 20, budget_bytes=549 << 20, reason="DefaultCPUAllocator" if outcome == "oom" else "")  # fmt: skip


def test_recorded_events_read_back_and_sum_up(tmp_path: Path) -> None:
    store = EvidenceStore(CacheFolder(tmp_path))
    assert store.read("abc") == [] and summary([]) is None
    assert store.record("abc", _launch(8, "oom", 1, 1)) and store.record("abc", _launch(4, "exit", 0, 2))
    (tmp_path / "abc.evidence.jsonl").open("a").write("not json\n")  # a damaged line is skipped
    events = store.read("abc")
    assert [(e.micro_batch_size, e.outcome, e.launch) for e in events] == [(8, "oom", 1), (4, "exit", 2)]
    assert all(e.at for e in events)
    said = summary(events)
    assert said is not None
    assert "held for 1 launch(es) to exit 0 at micro-batch 4; ran out of memory at micro-batch 8" in said
    assert "launch 1: ran out of memory at micro-batch 8 x accumulation 1" in events[0].line()


def test_evidence_is_its_own_kind_of_cache_entry_not_a_journal(tmp_path: Path) -> None:
    store = EvidenceStore(CacheFolder(tmp_path))
    store.record("abc", _launch(8, "exit", 0, 1))
    (found,) = entries(CacheFolder(tmp_path))
    assert (found.key, found.kind, found.detail) == ("abc", "evidence", "1 runtime event(s)")
