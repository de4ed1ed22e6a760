"""The published JSON Schema of the result, and the check of a result file when it is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from autobatch.errors import UsageError
from autobatch.records.result import TuneResult
from autobatch.records.schema import SCHEMA_FILE, result_problems, result_schema

GOLDEN = Path(__file__).resolve().parents[1] / "emit" / "golden"
RESULTS = sorted(GOLDEN.glob("*/autobatch-result.json"))


def test_the_schema_is_a_valid_json_schema_shipped_with_the_package() -> None:
    Draft202012Validator.check_schema(result_schema())
    assert SCHEMA_FILE.parent.name == "autobatch"


@pytest.mark.parametrize("path", RESULTS, ids=[p.parent.name for p in RESULTS])
def test_written_results_match_it(path: Path) -> None:
    data = json.loads(path.read_text())
    assert result_problems(data) == []
    assert not list(
        Draft202012Validator(result_schema()).iter_errors(data)
    )  # the schema alone, as users run it


def result() -> dict:
    return json.loads(RESULTS[0].read_text())


def test_a_string_where_a_number_belongs_is_named() -> None:
    """Issue 12: "micro_batch_size": "48" became "train_batch_size": "4848" in the DeepSpeed config."""
    data = result()
    data["chosen"]["micro_batch_size"] = "48"
    data["combinations"][1]["max_batch_size"] = 4.5
    problems = result_problems(data)
    assert 'chosen.micro_batch_size: expected an integer, found "48"' in problems
    assert "combinations[1].max_batch_size: expected an integer or null, found 4.5" in problems


@pytest.mark.parametrize(
    "change, problem",
    [
        (lambda d: d.pop("schema_version"), "schema_version: missing"),
        (lambda d: d.update(schema_version=2), "schema_version: 2 was written by a newer autobatch"),
        (lambda d: d.update(schema_version="1"), 'schema_version: expected an integer >= 1, found "1"'),
        (lambda d: d["chosen"].update(optimizer="adamx"), 'chosen.optimizer: expected one of "sgd"'),
        (lambda d: d["chosen"].update(global_batch_size=7), "expected micro_batch_size x accumulation_steps"),
        (lambda d: d.pop("combinations"), "(the document): 'combinations' is missing"),
    ],
)
def test_each_kind_of_problem(change: object, problem: str) -> None:
    data = result()
    change(data)  # type: ignore[operator]
    assert any(problem in p for p in result_problems(data)), result_problems(data)


def test_loading_a_bad_file_lists_every_problem(tmp_path: Path) -> None:
    data = result()
    data["chosen"]["micro_batch_size"] = "48"
    data["chosen"]["world_size"] = 0
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError) as info:
        TuneResult.load(path)
    assert info.value.exit_code == 2 and "(2 problems)" in info.value.message
    assert "chosen.micro_batch_size" in info.value.message and "chosen.world_size" in info.value.message


def test_what_recomputation_wrapped_is_kept_and_older_results_load_without_it(tmp_path: Path) -> None:
    data = result()
    on = data["combinations"][0]
    assert all("recompute_blocks" not in c for c in data["combinations"])  # written before the field
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    assert all(c.recompute_blocks == {} for c in TuneResult.load(path).combinations)
    on["recompute_blocks"] = {"Block": 12}
    path.write_text(json.dumps(data))
    loaded = TuneResult.load(path)
    assert loaded.to_dict() == data  # absent where empty, {"Block": 12} where recomputation wrapped twelve
    on["recompute_blocks"] = {"Block": 0}
    assert any("recompute_blocks.Block" in p for p in result_problems(data)), result_problems(data)
