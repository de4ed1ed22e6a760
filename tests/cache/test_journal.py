"""The probe journal: appended per probe, shared safely, resilient to crashes and damage."""

from __future__ import annotations

import json
import multiprocessing
from dataclasses import replace
from pathlib import Path

from requesting import probe_request

from autobatch.cache import CacheFolder, ProbeJournal
from autobatch.records.protocol import ProbeOutcome, ProbeRequest


def request(batch: int, optimizer: str = "adamw") -> ProbeRequest:
    return probe_request(batch, "32-true", optimizer)


def fits(batch: int) -> ProbeOutcome:
    return ProbeOutcome(kind="fits", batch_size=batch, peak_bytes=1000 + batch)


def opened(tmp_path: Path, warnings: list[str] | None = None) -> ProbeJournal:
    folder = CacheFolder(tmp_path / "cache", warn=(warnings.append if warnings is not None else None))
    return ProbeJournal.open(folder, "k", {"script": "train.py"})


def test_records_answers_and_replays_them_marked_cached(tmp_path: Path) -> None:
    journal = opened(tmp_path)
    journal.record(request(8), fits(8))
    journal.record(request(9), ProbeOutcome(kind="oom", batch_size=9))
    journal.record(request(10), ProbeOutcome(kind="crash", batch_size=10))  # after its retry: not paid again
    journal.record(request(11), ProbeOutcome(kind="error", batch_size=11))  # the script's own: measured again
    again = opened(tmp_path)
    assert len(again) == 3 and again.meta["script"] == "train.py"
    replay = again.get(request(8))
    assert replay is not None and replay.cached and replay.peak_bytes == 1008
    crash = again.get(request(10))
    assert crash is not None and crash.kind == "crash"
    assert again.get(request(11)) is None and again.get(request(8, "sgd")) is None


def test_a_line_cut_short_by_a_crash_is_skipped_and_the_next_append_is_whole(tmp_path: Path) -> None:
    journal = opened(tmp_path)
    journal.record(request(8), fits(8))
    path = journal.path
    assert path is not None
    with open(path, "a") as handle:
        handle.write('{"key": "[\\"32-true\\", \\"adamw\\", false, 9, 3')  # the writer died here
    warnings: list[str] = []
    again = opened(tmp_path, warnings)
    assert len(again) == 1 and not warnings
    again.record(request(11), fits(11))
    third = opened(tmp_path, warnings)
    assert len(third) == 2 and third.get(request(11)) is not None and not warnings
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_a_damaged_journal_is_moved_aside_with_a_warning_and_rebuilt(tmp_path: Path) -> None:
    journal = opened(tmp_path)
    journal.record(request(8), fits(8))
    path = journal.path
    assert path is not None
    path.write_bytes(b"\x00\xff garbage\n" + path.read_bytes())
    warnings: list[str] = []
    again = opened(tmp_path, warnings)
    assert len(again) == 0
    assert len(warnings) == 1 and "damaged" in warnings[0] and "moved aside" in warnings[0]
    assert list(path.parent.glob("k.jsonl.corrupt-*"))
    again.record(request(8), fits(8))
    assert len(opened(tmp_path)) == 1


def test_an_unwritable_folder_warns_once_and_keeps_probes_in_memory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    warnings: list[str] = []
    journal = ProbeJournal.open(CacheFolder(blocker / "cache", warn=warnings.append), "k")
    journal.record(request(8), fits(8))
    journal.record(request(9), fits(9))
    assert journal.get(request(8)) is not None  # this run still reuses its own answers
    assert len(warnings) == 1 and "cannot be written" in warnings[0]


def test_a_run_sees_what_another_appended_before_each_probe(tmp_path: Path) -> None:
    mine, theirs = opened(tmp_path), opened(tmp_path)
    theirs.record(request(8), fits(8))
    assert mine.get(request(8)) is not None


def _append_many(folder: str, worker: int) -> None:
    journal = ProbeJournal.open(CacheFolder(folder), "shared", {"worker": worker})
    for batch in range(200):
        journal.record(request(batch * 10 + worker), fits(batch))


def test_two_writers_never_interleave_a_line(tmp_path: Path) -> None:
    folder = str(tmp_path / "cache")
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_append_many, args=(folder, w)) for w in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    lines = (tmp_path / "cache" / "shared.jsonl").read_text().splitlines()
    entries = [json.loads(line) for line in lines]  # every line is whole JSON
    assert sum(1 for e in entries if "key" in e) == 400 and sum(1 for e in entries if "meta" in e) == 1
    assert len(ProbeJournal.open(CacheFolder(folder), "shared")) == 400


def test_answers_are_one_combinations_fits_and_ooms_at_the_asked_lengths_in_order(tmp_path: Path) -> None:
    journal = opened(tmp_path)
    journal.record(request(33), fits(33))
    journal.record(request(8), fits(8))
    journal.record(request(40), ProbeOutcome(kind="oom", batch_size=40))
    journal.record(request(12, "sgd"), fits(12))  # another combination
    journal.record(request(50), ProbeOutcome(kind="crash", batch_size=50))  # after its retry: not paid again
    journal.record(
        request(60), ProbeOutcome(kind="timeout", batch_size=60)
    )  # 60 s: a run allowing 90 asks again
    longer = probe_request(20, min_steps=12, max_steps=12)
    journal.record(longer, fits(20))
    timing = probe_request(24, min_steps=30, max_steps=30)
    journal.record(timing, fits(24))  # a length not asked for
    combination = ("32-true", "adamw", "off", False, None)
    answers = opened(tmp_path).answers(combination, {(3, 8), (12, 12)}, 90.0)
    expected = [(33, "fits"), (8, "fits"), (40, "oom"), (50, "crash"), (20, "fits")]
    assert [(a.batch_size, a.kind) for a in answers] == expected
    assert all(a.cached for a in answers)
    again = opened(tmp_path).answers(combination, {(3, 8)}, 60.0)
    assert [a.batch_size for a in again] == [33, 8, 40, 50, 60]


def test_a_probe_stopped_at_a_search_line_answers_only_requests_whose_line_its_peak_is_above(
    tmp_path: Path,
) -> None:
    """A search's probe stops once its peak crosses the budget less the margin: that settles "does not
    fit" for that line and any lower one, never the cap's own verdict that `check` asks for."""
    journal = opened(tmp_path)
    line = (1 << 30) - (3 << 20)
    stopped = ProbeOutcome(kind="oom", batch_size=9, peak_bytes=line + 1, steps=2, stopped_above_bytes=line)
    search = replace(request(9), stop_above_bytes=line)
    journal.record(search, stopped)
    again = opened(tmp_path)
    served = again.get(search)
    assert served is not None and served.kind == "oom" and served.stopped_above_bytes == line
    assert again.get(request(9)) is None  # check: every step, the cap's verdict
    assert again.get(replace(request(9), stop_above_bytes=line + 2)) is None  # a smaller margin
    combination = ("32-true", "adamw", "off", False, None)
    assert [a.batch_size for a in again.answers(combination, {(3, 8)}, 60.0, line)] == [9]
    assert again.answers(combination, {(3, 8)}, 60.0, None) == []
