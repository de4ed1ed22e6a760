"""The throughput choice through the real ``tune`` (in process, fake probes): dominance, interleaved
timing, the margin in the result."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest
from support import run_main, session_settings, wire_fake_runner

from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.testing import FakeRunner, affine

MiB = 1 << 20


class TimedRunner(FakeRunner):
    """Step times per combination: ``seconds[(precision, recompute)]``, with a repeating jitter."""

    seconds: dict[tuple[str, bool], float] = {}
    jitter = itertools.cycle((0.9, 1.1, 1.0, 0.95, 1.05))

    def _probe(self, request: ProbeRequest) -> ProbeOutcome:
        outcome = super()._probe(request)
        if outcome.fits:
            base = self.seconds[(request.step.precision, request.step.recompute)]
            outcome.step_seconds = [base * next(self.jitter) for _ in range(outcome.steps)]
            outcome.samples_per_second = (
                request.batch_size * (outcome.steps - 1) / sum(outcome.step_seconds[1:])
            )
        return outcome


def curve(precision: str, optimizer: str, recompute: bool) -> object:
    return affine(
        400 * MiB, 1.7 * MiB * (0.35 if recompute else 1.0) * (0.5 if precision == "bf16-mixed" else 1)
    )


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TimedRunner:
    fake = TimedRunner(curve)  # type: ignore[arg-type]
    return wire_fake_runner(fake, tmp_path, monkeypatch)


def tune(*extra: str) -> dict[str, object]:
    code, out, err = run_main(
        "tune",
        "train.py",
        "--device",
        "cpu",
        "--memory",
        "1GiB",
        "-o",
        "adamw",
        "--no-cache",
        "--json",
        *extra,
    )
    assert code == 0, err
    return json.loads(out)


def test_recompute_that_measured_faster_is_not_chosen_when_its_twin_fits(runner: TimedRunner) -> None:
    # The measurement says recomputation is three times faster (noise, as seen on a busy machine).
    runner.seconds = {("32-true", False): 0.3, ("32-true", True): 0.1}
    Path("autobatch.toml").write_text('[search]\nrecompute = "both"\n')
    result = tune("-p", "32-true", "--global-batch-size", "64", "--exact-all")
    assert len(result["combinations"]) == 2  # type: ignore[arg-type]
    chosen = result["chosen"]
    assert isinstance(chosen, dict) and chosen["recompute"] is False and chosen["micro_batch_size"] == 64
    assert any("only adds work" in note for note in result["notes"])  # type: ignore[union-attr]


def test_recompute_that_cannot_plan_beyond_its_twin_is_not_searched(runner: TimedRunner) -> None:
    # Without recomputation the whole global batch of 64 fits one micro-batch (maximum ~306): with it, no
    # maximum plans a larger one, so the search is skipped; --exact-all above searches it all the same.
    runner.seconds = {("32-true", False): 0.3, ("32-true", True): 0.1}
    Path("autobatch.toml").write_text('[search]\nrecompute = "both"\n')
    result = tune("-p", "32-true", "--global-batch-size", "64")
    twin, recompute = result["combinations"]  # type: ignore[misc]
    assert twin["status"] == "exact" and twin["max_batch_size"] > 64
    assert recompute["status"] == "skipped" and recompute["probes"] == 0
    assert "cannot win" in recompute["reason"] and "--exact-all" in recompute["reason"]
    chosen = result["chosen"]
    assert isinstance(chosen, dict) and chosen["recompute"] is False and chosen["micro_batch_size"] == 64


def test_one_probe_settles_whether_recompute_can_plan_beyond_its_twin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A global batch of 512: without recomputation the maximum (~306) plans 256 x 2. With it, only a maximum
    # of 512 plans fewer steps: the calibration goes there, not lower, and settles that in one probe. Where recomputation saves little (0.9x the activations'
    # slope), 512 does not fit and the combination is pruned after that probe; where it saves much (0.35x,
    # maximum ~875), it is searched to its exact maximum and timed against the twin.
    def probe_counts(saving: float) -> dict[str, object]:
        def curve(precision: str, optimizer: str, recompute: bool) -> object:
            return affine(400 * MiB, 1.7 * MiB * (saving if recompute else 1.0))

        fake = TimedRunner(curve)  # type: ignore[arg-type]
        fake.seconds = {("32-true", False): 0.2, ("32-true", True): 0.3}
        (tmp_path / str(saving)).mkdir()
        wire_fake_runner(fake, tmp_path / str(saving), monkeypatch)
        Path("autobatch.toml").write_text('[search]\nrecompute = "both"\n')
        return tune("-p", "32-true", "--global-batch-size", "512")

    little = probe_counts(0.9)
    twin, recompute = little["combinations"]  # type: ignore[misc]
    assert twin["max_batch_size"] < 512 and recompute["status"] == "pruned" and recompute["probes"] == 1
    assert [(p["batch_size"], p["kind"]) for p in recompute["trace"]] == [(512, "oom")]  # the calibration
    assert "cannot win" in recompute["reason"]
    much = probe_counts(0.35)
    twin, recompute = much["combinations"]  # type: ignore[misc]
    assert recompute["status"] == "exact" and recompute["max_batch_size"] >= 512
    chosen = much["chosen"]
    assert isinstance(chosen, dict) and chosen["recompute"] is True and chosen["micro_batch_size"] == 512


def test_the_result_states_the_margin_of_a_timed_choice(runner: TimedRunner) -> None:
    runner.seconds = {("32-true", False): 0.2, ("bf16-mixed", False): 0.1}
    result = tune("-p", "32-true", "-p", "bf16-mixed", "--no-recompute", "--global-batch-size", "64")
    chosen = result["chosen"]
    assert isinstance(chosen, dict) and chosen["precision"] == "bf16-mixed"
    assert chosen["runner_up"] == "32-true/adamw/no-recompute"
    assert 0.5 < chosen["margin"] < 1.5 and "samples/s over" in chosen["decided_by"]
    # Both contenders were timed at the planned micro-batch, interleaved.
    timed = [p for c in result["combinations"] for p in c["trace"] if p["purpose"] == "throughput"]  # type: ignore[index]
    assert {p["batch_size"] for p in timed} == {64}


def test_a_difference_within_the_noise_goes_to_the_users_order(runner: TimedRunner) -> None:
    runner.seconds = {("32-true", False): 0.101, ("bf16-mixed", False): 0.1}
    result = tune("-p", "32-true", "-p", "bf16-mixed", "--no-recompute", "--global-batch-size", "64")
    chosen = result["chosen"]
    assert isinstance(chosen, dict) and chosen["precision"] == "32-true"
    assert "tie within the noise" in chosen["decided_by"]


def test_rounds_alternate_their_order_and_keep_each_probes_fastest_step() -> None:
    # settle alone, with injected timings: two contenders 8 % apart (outside the equivalence band) whose
    # probes disagree keep being timed; each round runs in the reverse order of the one before, so a load
    # that rises or falls favours neither.
    from autobatch.run.throughput import Entry, StepTimes, settle

    times, order = StepTimes(), []
    entries = [Entry(0, ("32-true", "adamw", False), 16), Entry(1, ("32-true", "sgd", False), 16)]
    slow = itertools.cycle((1.0, 1.3, 0.8))  # load between probes: fastest steps 0.7, 0.91, 0.56

    def time_once(e: Entry) -> None:
        order.append(e.index)
        base = next(slow) * (1.0 if e.index == 0 else 0.92)
        times.add(
            e.key,
            ProbeOutcome("fits", batch_size=16, step_seconds=[9.0] + [base * 0.7, base, base * 1.3] * 2),
        )

    decision = settle(entries, times, time_once, 1, rounds=3)
    assert len(order) >= 4 and order[:2] == [0, 1]
    rounds = [order[i : i + 2] for i in range(0, len(order), 2)]
    assert all(sorted(r) == [0, 1] for r in rounds)
    assert all(later == earlier[::-1] for earlier, later in zip(rounds, rounds[1:]))  # each reverses the last
    probes = len(order) // 2
    fastest = times.timing(0, entries[0].key, 16, 1).probe_seconds
    assert len(fastest) == probes  # one per probe, the first step excluded
    assert fastest[0] == pytest.approx(0.7)
    assert decision is not None


def test_steps_timed_under_another_wait_policy_are_timed_again() -> None:
    # The probe server restarted with OpenMP's passive wait policy after the first contender's timing: its
    # steps (spinning threads, a quiet machine) are not compared with the second's (sleeping threads), so
    # settle times the first again under the new policy before it decides.
    from autobatch.run.throughput import Entry, StepTimes, settle

    times, order = StepTimes(), []
    entries = [Entry(0, ("32-true", "adamw", False), 16), Entry(1, ("32-true", "sgd", False), 16)]
    spinning = ProbeOutcome("fits", batch_size=16, step_seconds=[9.0, 0.06, 0.06], cpu_wait=0.0)
    times.add(entries[0].key, spinning)
    passive = ProbeOutcome(
        "fits", batch_size=16, step_seconds=[9.0, 0.09, 0.09], cpu_wait=0.0, omp_wait_policy="PASSIVE"
    )
    times.add(entries[1].key, passive)
    assert times.get(entries[0].key, 16) == ()  # another policy's steps: as if never timed

    def time_once(e: Entry) -> None:
        order.append(e.index)
        times.add(
            e.key, replace(passive, step_seconds=[9.0, 0.1, 0.1] if e.index == 0 else [9.0, 0.09, 0.09])
        )

    decision = settle(entries, times, time_once, 1, rounds=3)
    assert order[0] == 0  # timed again first, under the passive policy
    assert decision is not None and decision.winner == 1  # 0.09 s against 0.1 s, both passive
    # A replayed probe from an earlier run's journal leaves the policy as it is.
    times.add(entries[0].key, replace(spinning, cached=True))
    assert times.policy == "PASSIVE"


def test_a_timing_probe_at_the_maximum_on_the_edge_becomes_a_note() -> None:
    from autobatch.devices.budget import DeviceInfo
    from autobatch.run.throughput import edge_note

    mib = 1 << 20
    cpu = DeviceInfo("cpu", "cpu", 500 * mib, 500 * mib, 0.0, "VmData")
    inside = ProbeOutcome("fits", batch_size=46, peak_bytes=500 * mib - mib // 2, budget_bytes=500 * mib)
    note = edge_note("32-true/adamw/no-recompute", 46, inside, cpu)
    assert note is not None and "within the 3.00 MiB margin" in note and "autobatch check -b 46" in note
    oom = ProbeOutcome("oom", batch_size=46, reason="out of memory at step 3")
    assert "did not fit (out of memory at step 3)" in (edge_note("k", 46, oom, cpu) or "")
    clear = ProbeOutcome("fits", batch_size=46, peak_bytes=400 * mib)
    assert edge_note("k", 46, clear, cpu) is None  # fits with room: nothing to say
    assert edge_note("k", 47, inside, cpu) is None  # not at the maximum (a smaller planned micro-batch)
    cuda = DeviceInfo("cuda", "cuda:0", 500 * mib, 500 * mib, 0.0, "allocated")
    assert edge_note("k", 46, inside, cuda) is None  # no margin on CUDA: a fit is a fit


def test_a_timing_probe_again_is_measured_again_not_read_from_the_journal(tmp_path) -> None:
    """The choice's second probe of a contender must be a new measurement: the journal's answer to the
    same request would count the first probe's steps twice, as two probes that agree (no error at all)."""
    from autobatch.cache import CacheFolder, ProbeJournal
    from autobatch.core.space import Combo
    from autobatch.devices.budget import device_info
    from autobatch.run.session import Session, SessionWiring
    from autobatch.step.spec import ScriptSpec
    from autobatch.testing import FakeRunner, affine

    runner = FakeRunner(affine(300 << 20, 1 << 20))
    settings = session_settings(memory=1 << 30, timeout=60)
    session = Session(
        settings, spec=ScriptSpec.file(tmp_path / "train.py"), wiring=SessionWiring(runner=runner)
    )
    session.device = device_info("cpu", {"available_bytes": 8 << 30, "baseline_bytes": 300 << 20}, memory=1 << 30, headroom=0.1)  # fmt: skip
    session.journal = ProbeJournal.open(CacheFolder(tmp_path / "cache"), "k", {"script": "train.py"})
    combo = Combo("32-true", "adamw")
    first = session.probe(combo, 16, min_steps=8, max_steps=8)
    again = session.probe(combo, 16, min_steps=8, max_steps=8)  # a search probe: answered by the journal
    assert not first.cached and again.cached and len(runner.requests) == 1
    timed = session.probe(combo, 16, min_steps=8, max_steps=8, strict=False, fresh=True)
    assert not timed.cached and len(runner.requests) == 2


def test_the_search_probes_steps_count_as_the_timing_probes_do() -> None:
    # Every probe runs as the job runs (on the CPU, the pinned allocator the plan carries), so a search's
    # fitting probe gives its contender steps, its first excluded, as a timing probe's would.
    from autobatch.run.throughput import StepTimes

    times = StepTimes()
    key = ("32-true", "adamw", "off", False)
    fit = ProbeOutcome("fits", batch_size=16, step_seconds=[9.0, 0.2, 0.2], update_seconds=[1.0, 0.05, 0.05])
    times.add(key, fit)
    assert times.get(key, 16) == (0.2, 0.2)
    plan = times.timing(0, key, 16, 1, accumulation_steps=2)
    assert plan.update_time == pytest.approx(0.05) and plan.global_time == pytest.approx(0.35)
