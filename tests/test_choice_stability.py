"""scripts/choice_stability.py: its pure parts (a run read from a result, the table, the summary)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import choice_stability as cs  # noqa: E402


def _result(chosen: tuple[str, bool], margin: float | None, rates: dict[tuple[str, bool], float]) -> dict:
    combos = [
        {"precision": "32-true", "optimizer": o, "recompute": r, "samples_per_second": rate}
        for (o, r), rate in rates.items()
    ]
    runner = next(k for k in rates if k != chosen)
    return {
        "combinations": combos,
        "chosen": {
            "precision": "32-true",
            "optimizer": chosen[0],
            "recompute": chosen[1],
            "micro_batch_size": 32,
            "margin": margin,
            "runner_up": f"32-true/{runner[0]}/{'recompute' if runner[1] else 'no-recompute'}",
            "decided_by": "+25.0% samples/s over 32-true/adamw/no-recompute (1.0% relative error)",
        },
    }


def test_a_run_reads_the_winner_and_the_runner_up_from_the_result() -> None:
    rates = {("sgd", False): 50.0, ("adamw", False): 40.0}
    run = cs.read_run(1, 0, _result(("sgd", False), 0.25, rates), 61.2)
    assert run.chosen == "32-true/sgd/no-recompute"
    assert (run.winner_rate, run.runner_up, run.runner_up_rate) == (50.0, "32-true/adamw/no-recompute", 40.0)
    assert run.micro_batch_size == 32
    row = cs.table([run])[-1]
    assert "| 1 | 0 | 32-true/sgd/no-recompute | 32 | 50.0 |" in row
    assert "+25.0%" in row and "61 s" in row


def test_a_failed_run_is_a_row_of_dashes_and_counts_against_the_summary() -> None:
    good = cs.read_run(1, 0, _result(("sgd", False), 0.25, {("sgd", False): 50.0, ("adamw", False): 40.0}), 1)
    failed = cs.read_run(2, 6, None, 3)
    assert failed.chosen is None and "| 2 | 6 | - | - | - |" in cs.table([failed])[-1]
    assert cs.summary([good, failed]).startswith(
        "same choice in 1 of 2 (32-true/sgd/no-recompute; margins +25.0%"
    )
    assert cs.summary([failed]) == "same choice in 0 of 1 (no run chose a combination)"


def test_the_summary_counts_the_most_frequent_choice_and_names_the_others() -> None:
    rates = {("sgd", False): 50.0, ("adamw", False): 40.0}
    runs = [
        cs.read_run(1, 0, _result(("sgd", False), 0.25, rates), 1),
        cs.read_run(2, 0, _result(("sgd", False), 0.10, rates), 1),
        cs.read_run(3, 0, _result(("adamw", False), 0.02, rates), 1),
    ]
    assert cs.summary(runs) == (
        "same choice in 2 of 3 (32-true/sgd/no-recompute; margins +10.0% to +25.0%; "
        "others: 32-true/adamw/no-recompute 1x)"
    )
