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


def _guard(kind: str, step: int, micro: int, new: int, run: str = "r1", **kw: object) -> Event:
    return Event("guard", kind, micro, 2, step=step, new_micro_batch_size=new, extra={"run": run}, **kw)  # type: ignore[arg-type]


def test_one_summary_for_the_launches_of_run_and_the_runs_of_the_guard() -> None:
    shapes = [[16, 2048], [16]]
    events = [
        _launch(8, "oom", 1, 1),
        _launch(4, "exit", 0, 2),
        _guard("change", 149, 8, 6, reason="out of memory", shapes=shapes),
        _guard("change", 149, 6, 2, reason="out of memory", shapes=shapes),  # the same batch: one sentence
        _guard("change", 160, 2, 8, reason="grow"),
        _guard("run", 200, 8, 8, outcome="exit"),
        _guard("run", 7, 2, 1, run="r2", outcome="oom", shapes=[[1, 9000]], reason="DefaultCPUAllocator"),
    ]
    said = summary(events)
    assert said == (
        "runtime evidence of this tune's jobs: held for 1 launch(es) to exit 0 at micro-batch 4; ran out of memory "
        "at micro-batch 8; the guard held for 200 steps in 1 run(s); ran out of memory at step 149 with shapes "
        "[16, 2048] [16] (micro-batch 8 -> 2); ran out of memory at step 7 even one sample at a time with shapes "
        "[1, 9000]; highest peak 500.00 MiB of budget 549.00 MiB (`autobatch cache show` lists each)"
    )
    assert (
        events[2]
        .line()
        .endswith("guard: step 149: micro-batch 8 -> 6 (out of memory) with shapes [16, 2048] [16]")
    )
    assert "guard: held for 200 steps (micro-batch 8 x accumulation 2)" in events[5].line()
    assert "ran out of memory at step 7 even one sample at a time" in events[6].line()


def test_a_launch_its_guard_ended_says_so_with_the_guards_message() -> None:
    ended = Event("run", "launch", 4, 1, outcome="guard", exit_code=1, launch=1,
                  reason="GuardError: batch 3 (4 samples) ran out of memory even one sample at a time",
                  extra={"hint": "shorten or bucket its longest samples"})  # fmt: skip
    line = ended.line()
    assert "run launch 1: ended by its guard's error (exit 1) at micro-batch 4 x accumulation 1" in line
    assert line.endswith(": GuardError: batch 3 (4 samples) ran out of memory even one sample at a time")
    said = summary([_launch(8, "oom", 1, 1), ended])
    assert (
        said is not None
        and "ran out of memory at micro-batch 8; the job's guard gave up at micro-batch 4" in said
    )
