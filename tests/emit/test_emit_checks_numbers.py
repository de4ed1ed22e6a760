"""``autobatch emit`` refuses a result whose numbers a launcher cannot take ("Answers that hold in the job,
round two", 6): integers where integers go, and a chosen micro-batch no larger than its combination's
maximum; exit 2, every problem named, nothing written.

Before the fix ``"micro_batch_size": 139.0`` (or ``1e30``) passed the check, since JSON Schema counts a
number whose value is whole as an integer, and came out as ``AUTOBATCH_MICRO_BATCH_SIZE=139.0``, which
the project's own example reader fails on with ``int(...)``; a micro-batch above its combination's
maximum was emitted as it was.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from support import run_main

from autobatch.errors import EXIT_USAGE
from autobatch.records.schema import result_problems, result_schema

GOLDEN = Path(__file__).resolve().parent / "golden" / "cpu_bf16" / "autobatch-result.json"


def with_chosen(micro: object, maximum: object) -> dict:  # type: ignore[type-arg]
    """The golden result (bf16-mixed/sgd/no-recompute chosen) with this micro-batch, no accumulation, and
    this maximum for the chosen combination."""
    data = json.loads(GOLDEN.read_text())
    chosen = data["chosen"]
    chosen.update(
        micro_batch_size=micro,
        accumulation_steps=1,
        global_batch_size=micro,
        requested_global_batch_size=micro,
    )
    (combo,) = [
        c
        for c in data["combinations"]
        if (c["precision"], c["optimizer"], c["recompute"]) == ("bf16-mixed", "sgd", False)
    ]
    combo["max_batch_size"] = maximum
    return data  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (with_chosen(139.0, 139), "chosen.micro_batch_size: expected an integer, found 139.0"),
        (with_chosen(1e30, 139), "chosen.micro_batch_size: expected an integer, found 1e+30"),
        (with_chosen(139, 139.0), "combinations[6].max_batch_size: expected an integer or null, found 139.0"),
        (with_chosen(139, 88), "chosen.micro_batch_size: 139 is larger than the maximum 88 of bf16-mixed/sgd/no-recompute"),
        (with_chosen(10**30, 88), "chosen.micro_batch_size: 1000000000000000000000000000000 is larger than the maximum 88"),
        (with_chosen(48, None), "chosen: names the combination bf16-mixed/sgd/no-recompute, whose max_batch_size is null"),
    ],
    ids=["float-micro-batch", "exponent-micro-batch", "float-maximum", "above-its-maximum", "huge-int", "null-maximum"],
)  # fmt: skip
def test_emit_refuses_a_batch_a_launcher_cannot_take(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    data: dict,
    problem: str,  # type: ignore[type-arg]
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("r.json").write_text(json.dumps(data))
    code, _, err = run_main("emit", "r.json", "--format", "env", "--format", "deepspeed")
    assert code == EXIT_USAGE, err
    assert "r.json is not a valid autobatch result" in err and problem in err
    assert not Path("autobatch.env").exists() and not Path("ds_config.json").exists()


def test_a_choice_without_its_combination_has_no_maximum_to_check() -> None:
    """A result made by hand may hold only its choice: the arithmetic is checked, the bound cannot be."""
    data = with_chosen(139, 88)
    data["combinations"] = [c for c in data["combinations"] if c["precision"] != "bf16-mixed"]
    assert result_problems(data) == []


def test_json_schema_alone_takes_139_0_for_an_integer_and_the_check_does_not() -> None:
    """Why the check is more than the published schema: any JSON Schema validator accepts the float."""
    data = with_chosen(139.0, 139)
    assert not list(Draft202012Validator(result_schema()).iter_errors(data))
    assert "chosen.micro_batch_size: expected an integer, found 139.0" in result_problems(data)


def test_a_good_result_still_emits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("r.json").write_text(json.dumps(with_chosen(88, 88)))
    code, _, err = run_main("emit", "r.json", "--format", "env")
    assert code == 0, err
    assert "export AUTOBATCH_MICRO_BATCH_SIZE=88\n" in Path("autobatch.env").read_text()
