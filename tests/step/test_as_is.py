"""A script run as it is: the batch's way in, which scripts run so, and the message when nothing says how."""

from __future__ import annotations

import pytest
from support import SCRIPTS, run_main

from autobatch.core.step_peaks import StepRule
from autobatch.errors import EXIT_USAGE, UsageError
from autobatch.step.as_is import (
    BATCH_ENV,
    AsIsScript,
    check_env_name,
    defines_contract,
    defines_none,
    is_as_is,
    no_way_error,
    own_finder,
    substitute,
)
from autobatch.step.spec import select_spec

PLAIN = "import torch\nfor x in range(3):\n    pass\n"
FUNCTIONS = "def build_model():\n    pass\n\ndef make_batch(n):\n    pass\n"


def test_placeholder_replaced_everywhere_and_env_set() -> None:
    assert substitute(["--batch-size", "{batch}", "--bs={batch}", "--epochs", "1"], 48) == [
        "--batch-size",
        "48",
        "--bs=48",
        "--epochs",
        "1",
    ]
    script = AsIsScript(SCRIPTS / "x.py", ("-b", "{batch}"), "BS")
    assert script.argv(7) == [str(SCRIPTS / "x.py"), "-b", "7"]
    assert script.environment(7) == {BATCH_ENV: "7", "BS": "7"}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (PLAIN, False),
        (FUNCTIONS, True),
        ("from mylib import build_model, make_batch\n", True),
        ("from mylib import *\n", True),  # may define them: imported as today
        ("build_model = make_batch = None\n", True),
        ("def build_model():\n    pass\n", False),  # make_batch missing
        ("if __name__ == '__main__':\n    def build_model(): pass\n    def make_batch(n): pass\n", False),
        ("def broken(:\n", True),  # a syntax error is reported by importing it, as today
    ],
)
def test_defines_contract_reads_the_top_level(source: str, expected: bool) -> None:
    assert defines_contract(source) is expected


def test_which_way_a_script_runs() -> None:
    assert is_as_is(PLAIN, ["--batch-size", "{batch}"], None)
    assert is_as_is(PLAIN, [], "BATCH_SIZE")
    assert not is_as_is(FUNCTIONS, ["--batch-size", "{batch}"], None)
    assert not is_as_is(PLAIN, ["--epochs", "1"], None)  # the server's check refuses it (no_way_error)
    assert defines_none(PLAIN) and defines_none("if __name__ == '__main__':\n    main()\n")
    assert not defines_none("") and not defines_none("import no_such_module\n")  # imported: its error shows
    assert not defines_none(
        "def make_batch(n): ...\nprint(1)\n"
    )  # the contract's error names what is missing
    hint = str(no_way_error("t.py").hint)
    assert "-- --batch-size {batch}" in hint and "--batch-env" in hint


def test_batch_env_must_be_a_name() -> None:
    check_env_name("BATCH_SIZE", "--batch-env", "batch size", "BATCH_SIZE")
    with pytest.raises(UsageError, match="--batch-env 'BATCH SIZE' is not an environment variable name"):
        check_env_name("BATCH SIZE", "--batch-env", "batch size", "BATCH_SIZE")


def test_own_finder_is_named() -> None:
    assert own_finder("args = TrainingArguments(auto_find_batch_size=True)") is not None
    assert "find_executable_batch_size" in (own_finder("@find_executable_batch_size\ndef loop(b): ...") or "")
    assert own_finder(PLAIN) is None


def test_spec_selection(tmp_path) -> None:
    plain, functions = tmp_path / "plain.py", tmp_path / "functions.py"
    plain.write_text(PLAIN)
    functions.write_text(FUNCTIONS)

    def spec(script, args=(), batch_env=None):
        values = {"script": str(script), "script_args": list(args), "batch_env": batch_env}
        return select_spec(values, lambda name: "SCRIPT")

    assert spec(plain, ["--bs", "{batch}"]).kind == "as_is"
    assert spec(plain, [], "BS").options == {"batch_env": "BS"}
    assert spec(functions, ["--bs", "{batch}"]).kind == "path"
    assert spec(plain).kind == "path"  # refused by the server's check, before it imports the script


@pytest.mark.slow  # starts a probe server
def test_no_way_to_pass_the_batch_exits_2_with_both_ways(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(PLAIN)
    code, _, err = run_main("tune", str(script), "--device", "cpu", "--", "--epochs", "1")
    assert code == EXIT_USAGE == 2
    assert "does not define build_model() and make_batch(batch_size)" in err
    assert "-- --batch-size {batch}" in err and "--batch-env BATCH_SIZE" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("peaks", "expected"),
    [
        ([], None),
        ([100], None),
        ([100, 100], None),  # under min_steps 3
        ([100, 100, 100], "steady"),
        ([100, 150, 200], None),
        ([100, 150, 200, 250], "max"),
        ([100, 950], "above"),
    ],
)
def test_step_rule(peaks: list[int], expected: str | None) -> None:
    assert StepRule(min_steps=3, max_steps=4, tolerance=10, stop_above=900).why_stop(peaks) == expected


# -- argument variants (--variant NAME=ARGS) --------------------------------------------------------------


def test_variants_are_parsed_and_reach_the_probes_argv(tmp_path) -> None:
    from pathlib import Path

    from autobatch.core.space import SCRIPT_COMBO, script_combo, script_note, variant_of
    from autobatch.step.as_is import parse_variants

    variants = parse_variants(["bf16=--bf16 --amp", "wide=--width '2 048'", "same="])
    assert variants == {"bf16": ["--bf16", "--amp"], "wide": ["--width", "2 048"], "same": []}
    assert script_combo() == SCRIPT_COMBO and script_combo("bf16").precision == "script:bf16"
    assert (
        variant_of("script:bf16") == "bf16"
        and variant_of("script") is None
        and variant_of("bf16-mixed") is None
    )
    assert "script:bf16 is the script with --bf16 --amp after its own" in script_note(variants)
    script = AsIsScript(Path("/t/train.py"), ("--bs", "{batch}"), options={"variants": variants})
    assert script.argv(8, "bf16") == ["/t/train.py", "--bs", "8", "--bf16", "--amp"]
    assert script.argv(8) == ["/t/train.py", "--bs", "8"]


@pytest.mark.parametrize(
    ("items", "message"),
    [(["bf16"], "expected NAME=ARGS"), (["a=--x", "a=--y"], "a name used twice"), (["b f=--x"], "expected NAME=ARGS"),
     (["q=--x 'open"], "quotation")],
)  # fmt: skip
def test_a_bad_variant_names_the_fix(items: list[str], message: str) -> None:
    from autobatch.step.as_is import parse_variants

    with pytest.raises(UsageError, match=message) as info:
        parse_variants(items)
    assert "--variant" in info.value.message and info.value.hint


def test_variants_belong_to_a_script_run_as_it_is(tmp_path) -> None:
    plain, functions = tmp_path / "plain.py", tmp_path / "functions.py"
    plain.write_text(PLAIN)
    functions.write_text(FUNCTIONS)
    values = {"script": str(plain), "script_args": ["--bs", "{batch}"], "variants": ["bf16=--bf16"]}
    assert select_spec(values, lambda name: "SCRIPT").options["variants"] == {"bf16": ["--bf16"]}
    with pytest.raises(UsageError, match="--variant compares a script run as it is"):
        select_spec({**values, "script": str(functions)}, lambda name: "SCRIPT")


@pytest.mark.parametrize(
    ("laps", "micro"),
    [([4, 4, 4], 4), ([1, 1, 1], 1), ([4], 1), ([4, 4, -1, 4], 1), ([2, 3, 2], 1), ([], 1)],
)
def test_accumulation_is_the_same_count_before_every_step(laps: list[int], micro: int) -> None:
    from autobatch.step.as_is import accumulation

    assert accumulation(laps) == micro
