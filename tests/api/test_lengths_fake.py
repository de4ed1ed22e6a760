"""A tune over sequence lengths with a fake probe runner: the surface peak = a + b·B·L + c·B·L² stands in for
a transformer, so that the search over lengths, the table, the token budget and the plan's length are checked
against a brute-force oracle at every length. The real probes are in tests/cli/test_lengths_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import autobatch
from autobatch.core.lengths import Surface
from autobatch.devices.budget import margin_bytes
from autobatch.emit.env import variables
from autobatch.errors import UsageError
from autobatch.records.result import TuneResult
from autobatch.records.schema import result_problems
from autobatch.settings import FIELDS
from autobatch.testing import FakeRunner, affine, true_max

GiB, MiB = 1 << 30, 1 << 20
A, B, C = 300 * MiB, 20_000.0, 30.0
BUDGET = int(GiB * 0.9)
LINE = BUDGET - margin_bytes("cpu", BUDGET)
ONE = {
    "device": "cpu",
    "memory": "1GiB",
    "precisions": ["32-true"],
    "optimizers": ["adamw"],
    "recompute": False,
}


def build_model() -> str:
    return "model"


def make_batch(batch_size: int, seq_len: int = 128) -> list[int]:
    return [batch_size, seq_len]


def compute_loss(model: str, batch: list[int]) -> int:
    return batch[0]


STEP = {"build_model": build_model, "make_batch": make_batch, "compute_loss": compute_loss}


def surface(c: float = C) -> FakeRunner:
    return FakeRunner(affine(A, B * 128), lengths=lambda n: affine(A, B * n + c * n * n))


@pytest.fixture(autouse=True)
def _clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for info in FIELDS:
        if info.env not in ("AUTOBATCH_CACHE_DIR", "AUTOBATCH_LOCK_DIR"):
            monkeypatch.delenv(info.env, raising=False)


def test_every_length_is_exact_and_the_further_ones_cost_at_most_three_probes() -> None:
    runner = surface()
    result = autobatch.tune(**STEP, **ONE, seq_lens=[128, 256, 512], runner=runner)
    lengths = result.lengths
    assert lengths is not None and lengths.seq_lens == [128, 256, 512] and lengths.plan_seq_len == 512
    rows = {r.seq_len: r for r in lengths.maxima}
    for n in (128, 256, 512):
        truth = true_max(affine(A, B * n + C * n * n), LINE, 65536)
        assert rows[n].status == "exact" and rows[n].max_batch_size == truth, n
    assert rows[256].probes <= 3 and rows[128].probes <= 3
    assert [r.step.seq_len for r in runner.requests if r.op == "probe"][0] == 512  # the plan's length first
    # the plan is made at the plan's length, and the grid's entry is that length's row
    assert result.chosen is not None and result.chosen.seq_len == 512
    assert result.chosen.micro_batch_size == rows[512].max_batch_size
    assert result.combinations[0] is rows[512] or result.combinations[0].seq_len == 512
    (entry,) = lengths.surfaces
    assert entry["token_budget"] == min(rows[n].max_batch_size * n for n in (128, 256, 512))  # type: ignore[operator]
    fitted = Surface.from_dict(entry["surface"])
    assert fitted.per_token_squared == pytest.approx(C, rel=0.05) and entry["fit_error"] <= 0.02
    assert result.probes == sum(r.probes for r in lengths.maxima)
    assert result_problems(result.to_dict()) == []


def test_lengths_between_the_searched_ones_are_predicted_never_measured() -> None:
    runner = surface()
    result = autobatch.tune(**STEP, **ONE, seq_lens=[128, 1024], runner=runner)
    assert result.lengths is not None
    predicted = [r for r in result.lengths.maxima if r.status == "predicted"]
    assert [r.seq_len for r in predicted] == [256, 512] and all(r.probes == 0 for r in predicted)
    assert {r.step.seq_len for r in runner.requests if r.op == "probe"} == {128, 1024}
    for row in predicted:
        truth = true_max(affine(A, B * row.seq_len + C * row.seq_len**2), LINE, 65536)  # type: ignore[operator]
        assert truth is not None and abs(row.max_batch_size - truth) <= max(1, truth * 0.05)  # type: ignore[operator]
    loaded = TuneResult.from_dict(result.to_dict())
    assert loaded.lengths is not None and loaded.lengths.maxima[1].status == "predicted"


def test_the_plans_length_is_searched_too_and_the_emitted_env_carries_it() -> None:
    result = autobatch.tune(**STEP, **ONE, seq_lens=[128, 512], seq_len=256, runner=surface())
    assert result.lengths is not None and result.lengths.seq_lens == [128, 256, 512]
    assert result.chosen is not None and result.chosen.seq_len == 256
    env = variables(result)
    assert env["AUTOBATCH_PLAN_SEQ_LEN"] == "256"
    assert int(env["AUTOBATCH_TOKEN_BUDGET"]) == result.lengths.surfaces[0]["token_budget"]


def test_a_cached_tune_is_served_again_only_for_the_same_lengths() -> None:
    runner = surface()
    autobatch.tune(**STEP, **ONE, seq_lens=[128, 512], runner=runner)
    asked = len(runner.requests)
    again = autobatch.tune(**STEP, **ONE, seq_lens=[128, 512], runner=runner)
    assert again.cache and again.cache["served"] and len(runner.requests) == asked
    other = autobatch.tune(**STEP, **ONE, seq_lens=[128, 256, 512], runner=runner)
    assert (
        not (other.cache or {}).get("served")
        and other.lengths is not None
        and len(other.lengths.seq_lens) == 3
    )
    one = autobatch.tune(**STEP, **ONE, runner=runner)
    assert one.lengths is None and one.chosen is not None and one.chosen.seq_len is None


def test_an_attention_that_keeps_no_scores_shows_no_quadratic_share() -> None:
    result = autobatch.tune(**STEP, **ONE, seq_lens=[128, 256, 512], runner=surface(c=0.0))
    assert result.lengths is not None
    (entry,) = result.lengths.surfaces
    assert entry["attention_share"] < 0.02 and entry["surface"]["bytes_per_token_squared"] < C / 50


def test_bad_lengths_are_named() -> None:
    with pytest.raises(autobatch.ConfigError, match=r"seq_lens=\[0, 128\]: expected a list of integers >= 1"):
        autobatch.tune(**STEP, **ONE, seq_lens=[0, 128], runner=surface())
    with pytest.raises(UsageError, match="runs one length"):
        autobatch.check(**STEP, **ONE, batch_size=4, seq_lens=[128, 256], runner=surface())


def test_a_script_run_as_it_is_must_take_its_length_in_its_arguments() -> None:
    Path("train.py").write_text("import sys\nprint(sys.argv)\n")
    with pytest.raises(UsageError, match=r"no \{seq_len\} in its arguments"):
        autobatch.tune("train.py", **ONE, seq_lens=[128], script_args=["--bs", "{batch}"], runner=surface())


def test_a_length_whose_secant_is_too_shallow_is_drawn_through_its_maximum() -> None:
    """Seen on a real tune: at 256 tokens the search ended on a fit at 80 and a miss at 81 whose peak was only
    where the probe stopped at the line; their secant had half the slope. The maximum was exact."""
    from autobatch.core.model import Affine
    from autobatch.core.space import Combo
    from autobatch.records.result import TuneResult
    from autobatch.run.lengths import LengthSearch

    result = TuneResult("s", [], {}, "throughput", [])
    search = LengthSearch(result, (128, 256, 512), 512, LINE, 1)
    combo = Combo("32-true", "adamw")
    search.learn(combo.at(512), Affine(A, 20_000.0 * 512 + C * 512**2), exact=31)
    search.learn(combo.at(256), Affine(613_330_944, 4_358_144), exact=80)  # the shallow secant
    line = search.lines[combo.ident][256][0]
    assert line.intercept == A and A + line.slope * 80 <= LINE < A + line.slope * 81


def test_the_predicted_maxima_are_those_the_lengths_command_reads_from_the_same_surface(
    tmp_path: Path,
) -> None:
    """The least-squares surface passes under the peaks measured at 64 and 1,024 tokens; ``autobatch lengths``
    raises it to them, and the table's predictions must come from the same raised surface: at 512 tokens the
    fit alone said 29, where 29 runs out of memory and ``lengths`` counts the batch as one that does."""
    from support import run_main

    c = 47.0
    result = autobatch.tune(**STEP, **ONE, seq_lens=[64, 1024], runner=surface(c))
    assert result.lengths is not None
    (result_file := tmp_path / "tuned.json").write_text(result.to_json())
    predicted = {r.seq_len: r.max_batch_size for r in result.lengths.maxima if r.status == "predicted"}
    assert sorted(predicted) == [128, 256, 512]
    assert predicted[512] == true_max(affine(A, B * 512 + c * 512**2), LINE, 65536) == 28
    for seq_len, batch in predicted.items():
        assert batch is not None
        for size, overflowing in ((batch, 0), (batch + 1, 1)):
            (data := tmp_path / "lengths.txt").write_text(f"{seq_len}\n" * size)
            code, out, err = run_main(
                "lengths",
                str(data),
                "-r",
                str(result_file),
                "-b",
                str(size),
                "--batching",
                "padding",
                "--json",
            )
            assert code == 0, err
            assert json.loads(out)["padding"]["overflowing"] == overflowing, (seq_len, size)
