"""The tune's checks on its probes (autobatch.run.watch): a leak ends the tune with exit 8; a peak that depends on
the data is a note and a warning, and with strict exit 3; strict keys the cache apart. Synthetic outcomes: the
rules themselves are tested in tests/core/test_step_peaks.py, the command in tests/reliability/test_unsteady_peaks.py."""

from __future__ import annotations

import pytest

from autobatch.cache.keys import key_settings
from autobatch.errors import EXIT_LEAK, EXIT_SCRIPT, ContractError, DataDependentError, LeakError
from autobatch.records.protocol import ProbeOutcome
from autobatch.records.result import ComboResult, ProbeRecord
from autobatch.run.session import Warnings
from autobatch.run.watch import Watch
from autobatch.settings import load_settings

MiB = 1 << 20
BUDGET = 921 * MiB
KEY = "32-true/adamw/no-recompute"


def outcome(
    batch: int, step_peaks: list[int], shapes: tuple[str, ...] = (), kind: str = "fits"
) -> ProbeOutcome:
    return ProbeOutcome(
        kind, batch, peak_bytes=step_peaks[-1], step_peaks=step_peaks, baseline_bytes=300 * MiB,
        steps=len(step_peaks), batch_shapes=list(shapes),
    )  # fmt: skip


def entry(*outcomes: ProbeOutcome) -> ComboResult:
    combo = ComboResult("32-true", "adamw", False, status="exact", max_batch_size=outcomes[-1].batch_size)
    combo.trace = [ProbeRecord.of(o) for o in outcomes]
    return combo


def test_a_probe_that_grows_at_every_step_ends_the_tune_with_the_leak() -> None:
    watch = Watch(BUDGET, strict=False, warn=lambda _m: None)
    watch.probe(KEY, outcome(8, [320 * MiB, 324 * MiB, 324 * MiB]))
    peaks = [600 * MiB + 2 * MiB * i for i in range(8)]
    with pytest.raises(LeakError) as raised:
        watch.probe(KEY, outcome(2015, peaks))
    assert raised.value.exit_code == EXIT_LEAK == 8
    assert "grew at every step from step 3 to step 8 at batch 2015: 2.00 MiB per step" in raised.value.message
    assert "loss.item()" in (raised.value.hint or "")


def test_a_peak_that_depends_on_the_data_is_a_note_and_a_warning() -> None:
    warned: list[str] = []
    notes: list[str] = []
    warnings = Warnings(warned.append)
    warnings.keep_in(notes)
    watch = Watch(BUDGET, strict=False, warn=warnings)
    probes = [
        outcome(8, [320 * MiB, 330 * MiB, 335 * MiB], ("(8, 162, 80)", "(8, 219, 80)")),
        outcome(300, [800 * MiB] * 3),
    ]
    for probe in probes:
        watch.probe(KEY, probe)
    watch.answer(KEY, entry(*probes), notes)
    assert notes == [f"warning: {warned[0]}"]  # once: the run's warnings make the note
    assert warned[0].startswith(
        f"{KEY}: the peak depends on the data: make_batch(8) returned batches of different"
    )
    assert "at batch 8 step 3 raised the peak by 5.00 MiB" in warned[0]


def test_strict_makes_it_the_contract_error() -> None:
    watch = Watch(BUDGET, strict=True, warn=lambda _m: None)
    probes = [outcome(300, [800 * MiB] * 3), outcome(300, [700 * MiB] * 3)]  # one batch, 100 MiB apart
    for probe in probes:
        watch.probe(KEY, probe)
    with pytest.raises(DataDependentError) as raised:
        watch.answer(KEY, entry(*probes), [])
    assert raised.value.exit_code == EXIT_SCRIPT
    assert "batch 300 peaked 100.00 MiB below batch 300" in raised.value.message
    assert "without --strict" in (raised.value.hint or "")


def test_a_steady_step_says_nothing() -> None:
    watch = Watch(BUDGET, strict=True, warn=lambda _m: None)
    probes = [
        outcome(8, [320 * MiB, 324 * MiB, 324 * MiB]),
        outcome(300, [700 * MiB, 760 * MiB] + [760 * MiB] * 8),
    ]
    for probe in probes:
        watch.probe(KEY, probe)
    notes: list[str] = []
    watch.answer(KEY, entry(*probes), notes)
    assert notes == []


def test_a_strict_tune_is_cached_apart_and_a_lenient_one_as_before() -> None:
    lenient = key_settings(load_settings(overrides={"device": "cpu"}), 1)
    strict = key_settings(load_settings(overrides={"device": "cpu", "strict": True}), 1)
    assert "strict" not in lenient and strict == {**lenient, "strict": True}


def test_a_script_run_as_it_is_is_asked_about_its_own_batch_not_make_batch() -> None:
    way = "`--batch-size {batch}` in its arguments"
    watch = Watch(BUDGET, strict=False, warn=lambda _m: None, batch_way=way)
    probes = [outcome(8, [320 * MiB] * 3), outcome(64, [320 * MiB] * 3)]
    for probe in probes:
        watch.probe(KEY, probe)
    notes: list[str] = []
    watch.answer(KEY, entry(*probes), notes)
    assert len(notes) == 1 and "make_batch" not in notes[0]
    assert f"does the script use the batch size it is given ({way})?" in notes[0]


def test_a_batch_that_never_reached_the_step_is_the_contract_error_naming_the_placeholder() -> None:
    way = "`--batch-size {batch}` in its arguments"
    watch = Watch(BUDGET, strict=False, warn=lambda _m: None, batch_way=way)
    probes = [outcome(8, [314 * MiB] * 3), outcome(65536, [314 * MiB] * 10)]
    for probe in probes:
        probe.step_seconds = [0.2, 0.15, 0.15]
        watch.probe(KEY, probe)
    with pytest.raises(ContractError) as raised:
        watch.answer(KEY, entry(*probes), [])
    assert raised.value.exit_code == EXIT_SCRIPT
    assert "never reached the script's step" in raised.value.message and way in (raised.value.hint or "")
