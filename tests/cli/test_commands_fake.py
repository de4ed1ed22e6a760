"""``tune``, ``check`` and ``explain`` end to end in this process, through a fake probe runner.

The real command's ``main()`` runs under Typer's CliRunner isolation with the CLI's sessions wired to
:class:`autobatch.testing.FakeRunner` (no torch, no probe server): settings, the session, the tuner,
the per-combination search, the plan, the output and the exit codes are all the real ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import run_main, wire_fake_runner

from autobatch.devices.budget import margin_bytes
from autobatch.errors import EXIT_NOTHING_FITS, EXIT_OOM, EXIT_SCRIPT
from autobatch.testing import FakeRunner, affine, true_max

GiB, MiB = 1 << 30, 1 << 20
MEMORY = GiB
BUDGET = int(MEMORY * 0.9)  # the default headroom of 10 %
BASE = affine(400 * MiB, 1.7 * MiB)


def slower_with_recompute(precision: str, optimizer: str, recompute: bool) -> object:
    """bf16 halves the activations, recomputation keeps a third of them."""
    slope = 1.7 * MiB * (0.5 if precision == "bf16-mixed" else 1.0) * (0.35 if recompute else 1.0)
    return affine(400 * MiB, slope)


def expected_max(curve: object) -> int | None:
    """The exact maximum the search must find: fits with at least the CPU margin to spare."""
    return true_max(curve, BUDGET - margin_bytes("cpu", BUDGET), 65536)  # type: ignore[arg-type]


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    return wire_fake_runner(FakeRunner(BASE), tmp_path, monkeypatch)


def tune(*extra: str) -> tuple[int, dict[str, object], str]:
    code, out, err = run_main(
        "tune", "train.py", "--device", "cpu", "--memory", "1GiB", "-o", "adamw", "--json", *extra
    )
    return code, (json.loads(out) if out.strip() else {}), err


def test_tune_finds_the_exact_maximum_of_each_combination(fake: FakeRunner) -> None:
    fake.curve = slower_with_recompute
    code, result, err = tune("-p", "32-true", "-p", "bf16-mixed")
    assert code == 0, err
    combos = {  # off and full (the levels between: tests/api/test_levels_fake.py)
        (c["precision"], c["recompute"]): c
        for c in result["combinations"]  # type: ignore[union-attr]
        if c["recompute_level"] in ("off", "full")
    }
    for (precision, recompute), entry in combos.items():
        assert entry["status"] == "exact"
        assert entry["max_batch_size"] == expected_max(slower_with_recompute(precision, "adamw", recompute))
        confirming = [
            p for p in entry["trace"] if p["batch_size"] == entry["max_batch_size"] and p["kind"] == "fits"
        ]
        # A confirmation runs six steps at least, then up to 10 while its peak grows (the fake's holds still).
        assert max(p["steps"] for p in confirming) >= 6, "the maximum is confirmed by a longer probe"
    assert result["status"] == "complete" and result["chosen"]
    assert Path("autobatch-result.json").is_file()
    assert fake.closed
    assert "chosen" in err


def test_tune_reuses_the_journal_on_a_rerun(fake: FakeRunner) -> None:
    code, first, _ = tune("-p", "32-true", "--no-recompute")
    assert code == 0
    probes = sum(1 for r in fake.requests if r.op == "probe")
    code, again, _ = tune("-p", "32-true", "--no-recompute")
    assert code == 0
    assert sum(1 for r in fake.requests if r.op == "probe") == probes, "no probe measured twice"
    assert again["probes"] == 0
    assert again["chosen"] == first["chosen"]


def test_tune_with_nothing_that_fits_exits_4(fake: FakeRunner) -> None:
    fake.curve = affine(2 * GiB, MiB)
    code, _, err = tune("-p", "32-true", "--no-recompute")
    assert code == EXIT_NOTHING_FITS
    assert "no combination fits" in err and "static memory" in err


def test_a_tune_that_ends_without_an_answer_keeps_its_warnings_in_the_notes(
    fake: FakeRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("AUTOBATCH_LOCK_DIR", str(tmp_path / "not-a-folder" / "locks"))  # the lock warns
    fake.curve = affine(2 * GiB, MiB)
    code, _, err = tune("-p", "32-true", "--no-recompute")
    assert code == EXIT_NOTHING_FITS
    notes = json.loads(Path("autobatch-result.json").read_text())["notes"]
    warned = [note for note in notes if "one-tuner-per-device guarantee" in note]
    assert len(warned) == 1 and warned[0].startswith("warning: "), err
    assert err.count("one-tuner-per-device guarantee") == 1


def test_tune_without_a_script_names_the_fix(fake: FakeRunner) -> None:
    code, _, err = run_main("tune", "--device", "cpu")
    assert code == 2
    assert "no training script given" in err and "autobatch init" in err


def test_check_fits_and_runs_out_of_memory(fake: FakeRunner) -> None:
    top = expected_max(BASE)
    assert top is not None
    code, out, err = run_main(
        "check", "train.py", "-b", str(top), "--device", "cpu", "--memory", "1GiB", "--json"
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["fits"] and report["steps"] == 10 and report["peak_bytes"] == BASE(top)
    code, out, _ = run_main(
        "check", "train.py", "-b", str(top + 200), "--device", "cpu", "--memory", "1GiB", "--json"
    )
    assert code == EXIT_OOM
    assert json.loads(out)["kind"] == "oom"


def test_check_of_several_sizes_probes_each_in_order_in_one_session(fake: FakeRunner) -> None:
    top = expected_max(BASE)
    assert top is not None
    sizes = ("-b", str(top + 200), "-b", str(top), "-b", "8")
    code, out, err = run_main("check", "train.py", *sizes, "--device", "cpu", "--memory", "1GiB", "--json")
    assert code == EXIT_OOM, err  # one of them ran out of memory
    reports = json.loads(out)
    assert [(r["batch_size"], r["fits"]) for r in reports] == [(top + 200, False), (top, True), (8, True)]
    assert [r["kind"] for r in reports] == ["oom", "fits", "fits"]
    probed = [r.batch_size for r in fake.requests if r.op == "probe"]
    assert probed == [top + 200, top, 8], probed  # in the order given
    assert len([r for r in fake.requests if r.op == "inspect"]) == 1, fake.requests  # one session for all
    assert (
        err.count("batch 8 on cpu: fits") == 1 and err.count(f"batch {top + 200} on cpu: out of memory") == 1
    )
    code, out, _ = run_main("check", "train.py", "-b", "8", "-b", "16", "--device", "cpu", "--memory", "1GiB")
    assert code == 0


def test_check_refuses_a_precision_the_device_cannot_run(fake: FakeRunner) -> None:
    fake.unsupported_precisions = {"bf16-true": "no bfloat16 here"}
    code, _, err = run_main("check", "train.py", "-b", "8", "-p", "bf16-true", "--device", "cpu")
    assert code == 2
    assert "cpu cannot run bf16-true: no bfloat16 here" in err


def test_explain_breaks_the_peak_down_and_ranks_levers(fake: FakeRunner) -> None:
    fake.curve = slower_with_recompute
    code, out, err = run_main(
        "explain", "train.py", "-b", "64", "--device", "cpu", "--memory", "1GiB", "--json"
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["fits"] and report["peak_bytes"] == BASE(64)
    assert sum(report["categories"].values()) + report["residual_bytes"] == report["peak_bytes"]
    assert [m["batch_size"] for m in report["measured"]] == [64, 32]
    levers = {lever["name"]: lever for lever in report["levers"]}
    assert levers["bf16-mixed"]["predicted_max_batch_size"] > levers["now"]["predicted_max_batch_size"]


def test_explain_verify_confirms_each_lever_as_tune_does(fake: FakeRunner) -> None:
    fake.curve = slower_with_recompute
    code, out, err = run_main(
        "explain", "train.py", "-b", "64", "--device", "cpu", "--memory", "1GiB", "--verify", "--json"
    )
    assert code == 0, err
    levers = {lever["name"]: lever for lever in json.loads(out)["levers"]}
    assert levers["now"]["verified_max_batch_size"] == expected_max(BASE)
    recompute = slower_with_recompute("32-true", "adamw", True)
    assert levers["recompute"]["verified_max_batch_size"] == expected_max(recompute)


def test_a_script_error_is_reported_with_exit_3(fake: FakeRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    from autobatch.records.protocol import ProbeOutcome

    def broken(request: object) -> ProbeOutcome:
        return ProbeOutcome(kind="error", error_type="ValueError", error_message="bad batch", traceback="tb")

    monkeypatch.setattr(fake, "_probe", broken)
    code, _, err = tune("-p", "32-true", "--no-recompute")
    assert code == EXIT_SCRIPT
    assert "the training script raised ValueError" in err and "bad batch" in err
    assert json.loads(Path("autobatch-result.json").read_text())["status"] == "failed"


def test_every_cpu_plan_carries_the_allocator_the_probes_ran(fake: FakeRunner) -> None:
    """The answer holds under the probes' pinned allocator, and the job runs it: a CPU plan carries it whether a
    timing probe ran or not (it carried it only after a timing probe under glibc's defaults ran out or peaked
    above the budget: a tune of one combination times nothing, and `examples/as_is/plain_loop.py`'s plan of 64
    under 600 MiB then ran out in the job, 626-665 MiB under glibc's defaults against 442 MiB pinned)."""
    fake.curve = slower_with_recompute
    code, data, err = tune("-p", "32-true", "-o", "sgd", "--recompute-level", "off", "--emit", "env")
    assert code == 0, err
    assert data["chosen"]["environment"] == {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    env = Path("autobatch.env").read_text()
    assert "export MALLOC_ARENA_MAX=1" in env and "export MALLOC_MMAP_THRESHOLD_=65536" in env


def test_memory_that_grows_past_the_search_steps_gets_the_batch_that_holds_a_confirmation(
    fake: FakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short probes fit far above the batch at which a probe as long as a confirmation still fits (memory that
    grows over the steps, or a boundary that flickers): the tune answers that batch. It walked down one
    batch per confirmation and exited 4, "nothing fits even the smallest batch"."""
    from autobatch.records.protocol import ProbeOutcome, ProbeRequest

    holds = (expected_max(BASE) or 0) // 3
    short = fake._probe

    def growing(request: ProbeRequest) -> ProbeOutcome:
        if request.min_steps >= 6 and request.batch_size > holds:  # a confirmation's length
            return ProbeOutcome(kind="oom", batch_size=request.batch_size, steps=5, reason="fake: grew")
        return short(request)

    monkeypatch.setattr(fake, "_probe", growing)
    code, data, err = tune("-p", "32-true", "--no-recompute")
    assert code == 0, err
    (entry,) = data["combinations"]  # type: ignore[misc]
    assert entry["max_batch_size"] == holds and entry["status"] == "exact", entry
    assert data["chosen"]["micro_batch_size"] == holds  # type: ignore[index]
    assert any("not its confirmation" in n for n in data["notes"]), data["notes"]  # type: ignore[union-attr]
