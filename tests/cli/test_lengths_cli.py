"""``autobatch lengths DATA``: the batches of real lengths a tuned plan would not survive, end to end through
the command's ``main()``. The figures are checked against counts made here, independently: the batches cut
from the file, their longest sequence, and a critical length found by brute force over the surface's
coefficients (not through ``Surface.longest``)."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from fractions import Fraction
from math import comb
from pathlib import Path

import pytest
from support import ROOT, run_cli, run_main

from autobatch.errors import EXIT_OOM, EXIT_USAGE
from autobatch.records.result import Chosen, ComboResult, Lengths, ProbeRecord, TuneResult

GiB = 1 << 30
A, B, C = 2 * GiB, 40_000.0, 20.0  # bytes static, per token, per pair of tokens
LINE = 9_350_000_000  # 24 sequences fit up to about 3,000 tokens
MICRO, TOKEN_BUDGET = 24, 57_344  # 14 x 4,096 tokens


def peak(batch: int, seq_len: int, a: float = A, b: float = B, c: float = C) -> float:
    return a + batch * (b * seq_len + c * seq_len * seq_len)


def brute_critical(batch: int, line: float = LINE) -> int:
    """The longest length at which ``batch`` sequences stay on the line, one token at a time."""
    length = 0
    while peak(batch, length + 1) <= line:
        length += 1
    return length


def long_tail(n: int = 10_000, seed: int = 26) -> list[int]:
    """Mostly 100-400 tokens, and 0.5 % between 2,000 and 4,000 anywhere in the file."""
    rng = random.Random(seed)
    return [rng.randint(2000, 4000) if rng.random() < 0.005 else rng.randint(100, 400) for _ in range(n)]


def write_result(
    path: Path, *, fitted_from: tuple[int, ...] = (256, 1024, 4096), lengths: bool = True
) -> Path:
    """A result tuned over lengths, by hand: 32-true/adamw chosen at micro-batch 24, planned at 1,024 tokens."""
    combo = ComboResult("32-true", "adamw", False, status="exact", max_batch_size=116, probes=5, seq_len=1024)
    result = TuneResult(
        script="train.py",
        script_args=[],
        device={"type": "cpu", "name": "cpu", "budget_bytes": LINE + (64 << 20)},
        objective="max-batch",
        combinations=[combo],
        chosen=Chosen("32-true", "adamw", False, MICRO, 1, 1, MICRO, seq_len=1024),
    )
    if lengths:
        surface = {"intercept_bytes": A, "bytes_per_token": B, "bytes_per_token_squared": C,
                   "fitted_from": list(fitted_from)}  # fmt: skip
        entry = {"precision": "32-true", "optimizer": "adamw", "recompute": False, "surface": surface,
                 "fit_error": 0.01, "attention_share": 0.34, "token_budget": TOKEN_BUDGET}  # fmt: skip
        # the same combination compiled, with another surface: never the chosen one's
        decoy = {**entry, "compile": True, "surface": {**surface, "intercept_bytes": 0}, "token_budget": 1}
        seq_lens = sorted(set(fitted_from) | {1024})
        result.lengths = Lengths(seq_lens, 1024, LINE, maxima=[combo], surfaces=[decoy, entry])
    path.write_text(result.to_json())
    return path


def greedy_tokens(lengths: list[int], budget: int) -> list[tuple[int, int]]:
    """A max_tokens sampler, written here again: (count, longest) per batch."""
    batches: list[list[int]] = []
    for n in lengths:
        if batches and batches[-1] and max(batches[-1] + [n]) * (len(batches[-1]) + 1) <= budget:
            batches[-1].append(n)
        else:
            batches.append([n])
    return [(len(b), max(b)) for b in batches]


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[int]]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOBATCH_RESULT", raising=False)
    write_result(tmp_path / "autobatch-result.json")
    data = long_tail()
    (tmp_path / "lengths.txt").write_text("\n".join(map(str, data)) + "\n")
    return tmp_path / "lengths.txt", data


def lengths(*args: str) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    code, out, err = run_main("lengths", *args)
    return code, (json.loads(out) if out.strip() else {}), err


def test_the_padded_overflow_is_the_count_over_the_file(files: tuple[Path, list[int]]) -> None:
    path, data = files
    code, report, err = lengths(str(path), "--json")
    assert code == 0, err
    critical = brute_critical(MICRO)
    assert 2900 < critical < 3100  # in the middle of the tail: some long sequences fit, some do not
    chunks = [data[i : i + MICRO] for i in range(0, len(data), MICRO)]
    over = [i for i, chunk in enumerate(chunks) if max(chunk) > brute_critical(len(chunk))]
    padding = report["padding"]
    assert padding["batch_size"] == MICRO and padding["batch_size_from"] == "chosen"
    assert (padding["batches"], padding["overflowing"]) == (len(chunks), len(over)) and over
    assert padding["first_overflowing_batch"] == over[0]
    assert padding["share"] == pytest.approx(len(over) / len(chunks))
    assert padding["longest_length"] == critical
    short = sum(1 for n in data if n <= critical)
    assert padding["long_sequences"] == len(data) - short
    exact = 1 - Fraction(comb(short, MICRO), comb(len(data), MICRO))
    assert padding["shuffled_share"] == pytest.approx(float(exact), rel=1e-9)
    ordered = sorted(data)
    distribution = report["distribution"]
    assert distribution["count"] == 10_000 and distribution["max"] == ordered[-1]
    assert distribution["p99"] == ordered[9_899] and distribution["p50"] == ordered[4_999]
    assert distribution["longer_than_plan"] == sum(1 for n in data if n > 1024)
    assert report["overflows"] is True and report["combination"]["key"] == "32-true/adamw/no-recompute"
    assert report["combination"]["compile"] is False and report["surface"]["intercept_bytes"] == A
    assert "warning: some batches would run out of memory" in err
    assert (
        f"of batches ({len(over)} of {len(chunks)}) would run out of memory under padding at batch 24" in err
    )


def test_the_token_budget_counts_greedy_batches(files: tuple[Path, list[int]]) -> None:
    path, data = files
    code, report, _ = lengths(str(path), "--json")
    assert code == 0
    tokens = report["tokens"]
    expected = greedy_tokens(data, TOKEN_BUDGET)
    assert tokens["max_tokens"] == TOKEN_BUDGET and tokens["max_tokens_from"] == "token_budget"
    assert tokens["batches"] == len(expected) and tokens["overflowing"] == 0  # the budget holds at 4,096
    # a budget twice the result's: the batches of long sequences cross the line
    code, report, _ = lengths(str(path), "--json", "--max-tokens", str(2 * TOKEN_BUDGET))
    doubled = greedy_tokens(data, 2 * TOKEN_BUDGET)
    over = [i for i, (count, longest) in enumerate(doubled) if peak(count, longest) > LINE]
    assert report["tokens"]["overflowing"] == len(over) and over
    assert report["tokens"]["first_overflowing_batch"] == over[0]
    # every length up to it survives in a full batch; the saw-tooth of the count fits again past it (at 1,162)
    fails = [n for n in range(1, 2 * TOKEN_BUDGET + 1) if peak(2 * TOKEN_BUDGET // n, n) > LINE]
    longest_fit = max(n for n in range(1, 2 * TOKEN_BUDGET + 1) if peak(2 * TOKEN_BUDGET // n, n) <= LINE)
    assert report["tokens"]["longest_length"] == fails[0] - 1 < longest_fit


def test_a_sequence_longer_than_the_budget_cannot_be_batched(files: tuple[Path, list[int]]) -> None:
    path, data = files
    code, report, err = lengths(str(path), "--json", "--max-tokens", "3000", "--batching", "tokens")
    assert code == 0 and report["padding"] is None
    assert report["tokens"]["unbatchable"] == sum(1 for n in data if n > 3000) > 0
    assert "too long" in err


def test_fail_on_overflow_exits_5_and_the_batch_size_can_be_given(files: tuple[Path, list[int]]) -> None:
    path, data = files
    code, _, _ = lengths(str(path), "--fail-on-overflow")
    assert code == EXIT_OOM
    code, report, err = lengths(
        str(path), "--fail-on-overflow", "--batch-size", "1", "--batching", "padding", "--json"
    )
    assert (
        code == 0
        and report["padding"]["overflowing"] == 0
        and report["padding"]["batch_size_from"] == "--batch-size"
    )
    assert "warning" not in err
    code, _, _ = lengths(str(path), "--fail-on-overflow", "--batching", "tokens")
    assert code == 0  # the token budget holds


def test_data_smaller_than_one_batch_reads_the_same_shuffled(
    files: tuple[Path, list[int]], tmp_path: Path
) -> None:
    # five sequences, the longest past what 24 survive and within what 5 do: one batch of 5, shuffled or not
    few = [300, brute_critical(MICRO) + 40, 200, 250, 100]
    assert brute_critical(MICRO) < max(few) <= brute_critical(len(few))
    (tmp_path / "few.txt").write_text("\n".join(map(str, few)) + "\n")
    code, report, err = lengths(str(tmp_path / "few.txt"), "--json", "--batching", "padding")
    assert code == 0, err
    padding = report["padding"]
    assert (padding["batches"], padding["overflowing"], padding["share"], padding["shuffled_share"]) == (
        1,
        0,
        0,
        0,
    )
    assert "expected when shuffled" not in err and "one batch of 5 in any order" in err
    assert "100" not in err.split("autobatch lengths:")[-1]


def test_json_lines_give_the_same_answer(files: tuple[Path, list[int]], tmp_path: Path) -> None:
    path, data = files
    records = [{"id": i, "num_tokens": n} for i, n in enumerate(data[:3000])]
    records[5] = {"id": 5, "num_tokens": [7] * data[5]}  # a token list counts its items
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    (tmp_path / "short.txt").write_text("\n".join(map(str, data[:3000])))
    _, from_jsonl, _ = lengths("data.jsonl", "--json")
    _, from_text, _ = lengths("short.txt", "--json")
    assert from_jsonl["data"] == {"path": "data.jsonl", "format": "jsonl", "field": "num_tokens"}
    for key in ("padding", "tokens", "distribution"):
        assert from_jsonl[key] == from_text[key]
    (tmp_path / "other.jsonl").write_text('{"ids": [1, 2, 3]}\n{"ids": [4]}\n')
    code, _, err = lengths("other.jsonl")
    assert code == EXIT_USAGE and "none of the fields length, num_tokens" in err and "--field NAME" in err
    code, report, _ = lengths("other.jsonl", "--field", "ids", "--json")
    assert code == 0 and report["distribution"]["count"] == 2 and report["distribution"]["max"] == 3


def test_bad_lines_are_named(files: tuple[Path, list[int]], tmp_path: Path) -> None:
    (tmp_path / "bad.txt").write_text("120\n\n300\nabc\n-4\n2.5\n")
    code, _, err = lengths("bad.txt")
    assert code == EXIT_USAGE and "3 bad line(s) in bad.txt" in err
    assert (
        "line 4: expected a length" in err and "line 5" in err and "line 6" in err and "Traceback" not in err
    )
    (tmp_path / "bad.jsonl").write_text('{"length": 3}\n{"length": "x"}\n[1]\n{"other": 1}\n')
    code, _, err = lengths("bad.jsonl")
    assert code == EXIT_USAGE and "line 2: length: expected a whole number" in err
    assert "line 3: expected a JSON object" in err and "line 4: length: missing" in err
    code, _, err = lengths("bad.txt", "--field", "n")
    assert code == EXIT_USAGE and "--field applies to a JSON Lines file only" in err
    (tmp_path / "empty.txt").write_text("\n\n")
    code, _, err = lengths("empty.txt")
    assert code == EXIT_USAGE and "holds no lengths" in err
    code, _, err = lengths("missing.txt")
    assert code == EXIT_USAGE and "no file or folder at missing.txt" in err


def test_a_json_array_gives_the_same_answer(files: tuple[Path, list[int]], tmp_path: Path) -> None:
    """A list of lengths saved as Python saves one (``json.dump(lengths, f)``, on one line or indented), or a list
    of records: each was refused line by line ("expected a JSON object, found list", or "not JSON" for the "[" of
    an indented one). A JSON array that is not JSON is named as one, with where it breaks."""
    path, data = files
    (tmp_path / "lengths.json").write_text(json.dumps(data))
    (tmp_path / "indented.txt").write_text(json.dumps(data, indent=2))
    (tmp_path / "records.json").write_text(json.dumps([{"text": "x", "num_tokens": n} for n in data]))
    (tmp_path / "cut.json").write_text(json.dumps(data)[:30])
    text = run_cli("lengths", str(path), "--json", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    expected = {k: v for k, v in json.loads(text.stdout).items() if k != "data"}
    for name, source in (
        ("lengths.json", {"format": "json"}),
        ("indented.txt", {"format": "json"}),
        ("records.json", {"format": "json", "field": "num_tokens"}),
    ):
        proc = run_cli("lengths", name, "--json", cwd=tmp_path)
        assert proc.returncode == 0, (name, proc.stderr)
        report = json.loads(proc.stdout)
        assert report.pop("data") == {"path": name, **source} and report == expected, name
    proc = run_cli("lengths", "cut.json", cwd=tmp_path)
    assert proc.returncode == EXIT_USAGE and "Traceback" not in proc.stderr, proc.stderr
    assert (
        "cut.json starts as a JSON array and is not JSON" in proc.stderr and "[512, 1024, 300]" in proc.stderr
    )


#: A real tune's figures: examples/transformer_lengths.py (eager attention, width 32, depth 2) under 512 MiB on
#: the CPU device, 32-true/adamw at 64, 128 and 256 tokens: per length the maximum, its peak and the batch above it
#: that ran out of memory; the fitted surface, the line, the token budget.
TUNED = {64: (299, 479_526_912), 128: (133, 479_010_816), 256: (55, 480_002_048)}
TUNED_SURFACE = {"intercept_bytes": 317_042_005, "bytes_per_token": 7571.299,
                 "bytes_per_token_squared": 15.242923, "fitted_from": [64, 128, 256]}  # fmt: skip
TUNED_LINE = 480_038_092


def write_tuned(path: Path) -> Path:
    maxima = [
        ComboResult("32-true", "adamw", False, status="exact", max_batch_size=top, peak_bytes=peak_bytes,
                    seq_len=seq_len, recompute_level="off", trace=[ProbeRecord(top, "fits", peak_bytes),
                                                                   ProbeRecord(top + 1, "oom", TUNED_LINE + 1)])
        for seq_len, (top, peak_bytes) in TUNED.items()
    ]  # fmt: skip
    entry = {"precision": "32-true", "optimizer": "adamw", "recompute": False, "recompute_level": "off",
             "surface": TUNED_SURFACE, "fit_error": 0.0067, "token_budget": 14_080}  # fmt: skip
    result = TuneResult(
        script="transformer_lengths.py",
        script_args=[],
        device={"type": "cpu", "name": "cpu", "budget_bytes": 483_183_820},
        objective="throughput",
        combinations=[maxima[-1]],
        chosen=Chosen("32-true", "adamw", False, 55, 1, 1, 55, seq_len=256),
        lengths=Lengths([64, 128, 256], 256, TUNED_LINE, maxima=maxima, surfaces=[entry]),
    )
    path.write_text(result.to_json())
    return path


def test_the_plans_batch_survives_the_plans_length_and_not_a_token_more(tmp_path: Path) -> None:
    """The plan's micro-batch is the maximum at the plan's length, whose peak left 36 KB under the line; a token
    more costs batch 55 about 0.8 MiB. The least-squares surface passes 1.4 MB under that peak, and ``lengths``
    read the longest length batch 55 survives as 257 tokens, past the plan's 256, and counted a batch of 257
    tokens as fitting; it said a full token budget "survives up to 272 tokens a sequence", where 265 (in batches
    of 53) crosses the surface's own line."""
    write_tuned(tmp_path / "tuned.json")
    (tmp_path / "data.txt").write_text("\n".join(["257"] * 55 + ["256"] * 55) + "\n")
    proc = run_cli("lengths", "data.txt", "--result", "tuned.json", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    padding, tokens = report["padding"], report["tokens"]
    assert padding["batch_size"] == 55 and padding["longest_length"] == 256, padding
    assert (padding["overflowing"], padding["first_overflowing_batch"]) == (1, 0), padding
    assert report["surface"]["raised_bytes"] > 0 and report["overflows"]
    assert tokens["max_tokens"] == 14_080 and 256 <= tokens["longest_length"] < 265, tokens
    assert "the longest length batch 55 survives is 256 tokens" in proc.stderr, proc.stderr
    assert f"survives every length up to {tokens['longest_length']} tokens a sequence" in proc.stderr


def test_a_result_without_lengths_or_with_one_length_names_the_fix(
    files: tuple[Path, list[int]], tmp_path: Path
) -> None:
    path, _ = files
    write_result(tmp_path / "plain.json", lengths=False)
    code, _, err = lengths(str(path), "--result", "plain.json")
    assert code == EXIT_USAGE and "tuned without sequence lengths" in err
    assert "autobatch tune SCRIPT --seq-len A --seq-len B" in err
    write_result(tmp_path / "one.json", fitted_from=(1024,))
    code, _, err = lengths(str(path), "--result", "one.json")
    assert (
        code == EXIT_USAGE
        and "fitted from one length (1024 tokens)" in err
        and "--seq-len A --seq-len B" in err
    )
    code, _, err = lengths(str(path), "--result", "nowhere.json")
    assert code == EXIT_USAGE and "no result file at nowhere.json" in err


def test_a_data_set_needs_the_datasets_library(
    files: tuple[Path, list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "state.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets raises ImportError
    code, _, err = lengths(str(folder))
    assert (
        code == EXIT_USAGE and "needs the `datasets` library" in err and "hint: pip install datasets" in err
    )
    (tmp_path / "plain").mkdir()
    code, _, err = lengths("plain")
    assert code == EXIT_USAGE and "not a data set saved with save_to_disk" in err


def test_the_command_imports_no_torch(files: tuple[Path, list[int]], tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from autobatch.cli import main\n"
        "sys.argv = ['autobatch', 'lengths', 'lengths.txt', '--json']\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["padding"]["batch_size"] == MICRO


def build_model() -> str:
    return "model"


def make_batch(batch_size: int, seq_len: int = 128) -> list[int]:
    return [batch_size, seq_len]


def compute_loss(model: str, batch: list[int]) -> int:
    return batch[0]


def test_a_result_written_by_a_tune_over_lengths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The figures from a real tune's result (a fake probe runner whose peak is a surface)."""
    import autobatch
    from autobatch.testing import FakeRunner, affine

    monkeypatch.chdir(tmp_path)
    a, b, c = 300 << 20, 20_000.0, 30.0
    runner = FakeRunner(affine(a, b * 128), lengths=lambda n: affine(a, b * n + c * n * n))
    result = autobatch.tune(build_model=build_model, make_batch=make_batch, compute_loss=compute_loss,
                            device="cpu", memory="1GiB", precisions=["32-true"], optimizers=["adamw"],
                            recompute=False, seq_lens=[128, 512], result="r.json", runner=runner)  # fmt: skip
    assert result.chosen is not None and result.lengths is not None
    micro, line = result.chosen.micro_batch_size, result.lengths.line_bytes
    data = [512] * (3 * micro) + [2048] + [100] * (micro - 1)  # four batches, the fourth holds 2,048 tokens
    Path("data.txt").write_text("\n".join(map(str, data)))
    code, report, err = lengths("data.txt", "--result", "r.json", "--json")
    assert code == 0, err
    padding = report["padding"]
    assert padding["batch_size"] == micro and padding["batches"] == 4
    assert padding["overflowing"] == 1 and padding["first_overflowing_batch"] == 3
    longest = padding["longest_length"]
    assert (
        512 <= longest < 2048 and peak(micro, longest, a, b, c) <= line * 1.02
    )  # the fitted surface, within 2 %
    assert report["tokens"]["max_tokens"] == result.lengths.surfaces[0]["token_budget"]
    assert report["notes"] and "past the longest length searched (512)" in report["notes"][0]


SAVE_DATA_SETS = """
import sys
import datasets

datasets.disable_progress_bars()
subset = [int(n) for n in open("short.txt").read().split()]
saved = datasets.Dataset.from_dict({"input_ids": [[1] * n for n in subset], "n": subset, "text": ["x"] * len(subset)})
saved.save_to_disk("saved")
datasets.DatasetDict({"train": saved.select(range(100)), "test": saved}).save_to_disk("dict")
datasets.DatasetDict({"a": saved, "b": saved}).save_to_disk("ab")
"""


#: Runs ``autobatch lengths`` through its ``main()`` once for each argument list in ``argv[1]`` (JSON), after
#: SAVE_DATA_SETS, and prints the (exit code, stdout, stderr) of each: datasets is imported once.
LENGTHS_APART = f"""
{SAVE_DATA_SETS}
import json
sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
from support import run_main

print(json.dumps([run_main("lengths", *args) for args in json.loads(sys.argv[1])]))
"""


def lengths_apart(*calls: tuple[str, ...]) -> list[tuple[int, dict, str]]:  # type: ignore[type-arg]
    """The data sets made, and ``autobatch lengths`` run on them, in a process of its own: importing datasets
    (pyarrow) here would grow this process's data memory, which the probe processes later tests fork from it
    count under their cap."""
    done = subprocess.run(
        [sys.executable, "-c", LENGTHS_APART, json.dumps(calls)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return [
        (code, (json.loads(out) if out.strip() else {}), err) for code, out, err in json.loads(done.stdout)
    ]


@pytest.mark.consumers
@pytest.mark.slow
def test_a_data_set_saved_to_disk(files: tuple[Path, list[int]], tmp_path: Path) -> None:
    """The real library's save_to_disk, read back by column: token lists, counts, and a DatasetDict's split."""
    if importlib.util.find_spec("datasets") is None:
        pytest.skip("datasets is not installed")  # a failure when consumers are required (conftest)
    _, data = files
    (tmp_path / "short.txt").write_text("\n".join(map(str, data[:2000])))
    _, from_text, _ = lengths("short.txt", "--json")
    calls = [
        ("saved", "--json"),
        ("saved", "--column", "n", "--json"),
        ("saved", "--column", "text"),
        ("saved", "--column", "ids"),
        ("dict", "--json"),
        ("ab",),
        ("ab/b", "--json"),
    ]
    lists, counts, text, ids, split_dict, ab, ab_b = lengths_apart(*calls)
    code, from_lists, err = lists
    assert code == 0, err
    assert from_lists["data"] == {"path": "saved", "format": "datasets", "column": "input_ids", "split": None}
    _, from_counts, _ = counts
    for key in ("padding", "tokens", "distribution"):
        assert from_lists[key] == from_text[key] == from_counts[key]
    code, _, err = text
    assert code == EXIT_USAGE and "neither token counts nor token lists" in err and "tokenize" in err
    code, _, err = ids
    assert code == EXIT_USAGE and "has no column 'ids' (its columns: input_ids, n, text)" in err
    code, split, _ = split_dict
    assert code == 0 and split["data"]["split"] == "train" and split["distribution"]["count"] == 100
    code, _, err = ab
    assert code == EXIT_USAGE and "the splits a, b" in err and "ab/a" in err
    code, one, _ = ab_b
    assert code == 0 and one["distribution"] == from_text["distribution"]


def test_a_byte_order_mark_is_not_part_of_the_first_line(
    files: tuple[Path, list[int]], tmp_path: Path
) -> None:
    """A file written with ``encoding="utf-8-sig"`` (pandas' and Python's choice for Excel, Windows editors' own)
    starts with U+FEFF: its first line was refused as ``'\\ufeff180'``, a JSON Lines file's as not JSON."""
    data = [180, 420, 3100]
    (tmp_path / "excel.txt").write_text("".join(f"{n}\r\n" for n in data), encoding="utf-8-sig")
    records = "".join(json.dumps({"num_tokens": n}) + "\n" for n in data)
    (tmp_path / "excel.jsonl").write_text(records, encoding="utf-8-sig")
    for name in ("excel.txt", "excel.jsonl"):
        code, report, err = lengths(name, "--json")
        assert code == 0 and report["distribution"]["count"] == 3 and report["distribution"]["max"] == 3100, (
            err
        )
