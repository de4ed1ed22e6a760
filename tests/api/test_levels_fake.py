"""Recomputation levels and compile in a tune, with a fake probe runner: memory falls linearly in the blocks
checkpointed, so off and full predict the partial level a plan needs, which is searched in a few probes and
chosen under throughput when it plans fewer accumulation steps with less work than full. The real probes are
in tests/cli/test_levels_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import FAKE_STEP

import autobatch
from autobatch.devices.budget import margin_bytes
from autobatch.settings import FIELDS
from autobatch.testing import FakeRunner, affine, true_max

GiB, MiB = 1 << 30, 1 << 20
A, S = 300 * MiB, 4 * MiB  # static bytes, activations per sample without recomputation
BUDGET = int(GiB * 0.9)
LINE = BUDGET - margin_bytes("cpu", BUDGET)
ONE = {"device": "cpu", "memory": "1GiB", "precisions": ["32-true"], "optimizers": ["adamw"]}
SAVED = {"off": 1.0, "full": 0.4, "selective": 0.7}  # the share of activations each level keeps
COST = {"off": 1.0, "full": 1.33, "selective": 1.25}  # step time against off


def keeps(level: str) -> float:
    if level in SAVED:
        return SAVED[level]
    k, n = map(int, level.split("/"))
    return 1 - 0.6 * k / n


def cost(level: str) -> float:
    if level in COST:
        return COST[level]
    k, n = map(int, level.split("/"))
    return 1 + 0.33 * k / n


def curve(level: str, compiled: bool = False) -> affine:  # type: ignore[valid-type]
    return affine(A, S * keeps(level))


def runner(**kw: object) -> FakeRunner:
    return FakeRunner(
        affine(A, S),
        levels=curve,
        recompute_counts={"Block": 12},
        level_seconds=lambda level: 0.01 * cost(level),
        **kw,  # type: ignore[arg-type]
    )


STEP = FAKE_STEP


@pytest.fixture(autouse=True)
def _clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for info in FIELDS:
        if info.env not in ("AUTOBATCH_CACHE_DIR", "AUTOBATCH_LOCK_DIR"):
            monkeypatch.delenv(info.env, raising=False)


def test_the_partial_level_a_plan_needs_is_found_searched_in_few_probes_and_chosen() -> None:
    off_max = true_max(curve("off"), LINE, 65536)
    assert off_max is not None
    goal = off_max * 6 // 5  # one micro-batch a little above what off fits: off plans two steps
    result = autobatch.tune(**STEP, **ONE, global_batch_size=goal, objective="throughput", runner=runner())
    levels = {c.recompute_level: c for c in result.combinations}
    assert set(levels) == {"off", "full", "selective", "4/12"}  # 4 of 12: the fewest blocks that reach it
    partial = levels["4/12"]
    assert partial.status == "exact" and partial.max_batch_size == true_max(curve("4/12"), LINE, 65536)
    searched = [t for t in partial.trace if t.purpose != "throughput"]  # timing probes come after the search
    assert len(searched) <= 3 and partial.max_batch_size >= goal
    assert levels["selective"].max_batch_size == true_max(curve("selective"), LINE, 65536)
    assert off_max < levels["selective"].max_batch_size < levels["full"].max_batch_size  # type: ignore[operator]
    chosen = result.chosen
    assert chosen is not None and chosen.recompute_level == "4/12" and chosen.accumulation_steps == 1
    assert any("recompute: not chosen" in note and "less recomputation" in note for note in result.notes)
    assert result.to_dict()["chosen"]["recompute_level"] == "4/12"


def test_a_global_batch_that_off_plans_in_one_step_leaves_the_levels_unsearched() -> None:
    off_max = true_max(curve("off"), LINE, 65536)
    assert off_max is not None
    result = autobatch.tune(**STEP, **ONE, global_batch_size=off_max // 2, runner=runner())
    levels = [c for c in result.combinations if c.recompute_level != "off"]
    assert [c.recompute_level for c in levels] == ["full", "selective", "partial"]  # partial: never resolved
    assert all(c.status == "skipped" and "cannot win" in (c.reason or "") for c in levels[:2])
    assert levels[2].status == "skipped"
    assert result.chosen is not None and result.chosen.recompute_level == "off"


def test_max_batch_searches_the_middle_level_when_no_plan_binds() -> None:
    result = autobatch.tune(**STEP, **ONE, objective="max-batch", exact_all=True, runner=runner())
    levels = {c.recompute_level: c for c in result.combinations}
    assert "6/12" in levels and levels["6/12"].max_batch_size == true_max(curve("6/12"), LINE, 65536)
    assert levels["6/12"].probes <= 3


def test_levels_are_settings_and_old_booleans_still_work() -> None:
    result = autobatch.tune(**STEP, **ONE, recompute=["off", "3/12"], objective="max-batch", runner=runner())
    assert [c.recompute_level for c in result.combinations] == ["off", "3/12"]
    assert result.combinations[1].key == "32-true/adamw/recompute-3of12"
    old = autobatch.tune(**STEP, **ONE, recompute=True, runner=runner())
    assert [c.recompute_level for c in old.combinations] == ["full"] and old.combinations[0].recompute is True


def test_a_model_that_does_not_compile_is_that_combinations_answer() -> None:
    fake = runner(compile_error="backend 'inductor' failed: no C++ compiler")
    result = autobatch.tune(**STEP, **ONE, recompute=False, compile="both", runner=fake)
    plain, compiled = result.combinations
    assert plain.status == "exact" and not plain.compile
    assert compiled.compile and compiled.status == "uncompiled"
    assert compiled.reason is not None and compiled.reason.startswith("does not compile: backend 'inductor'")
    assert result.chosen is not None and not result.chosen.compile


def test_apply_recompute_gives_the_job_the_level_the_probes_measured() -> None:
    import torch

    from autobatch.errors import NoBlocksError

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.linear(x))

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(*(Block() for _ in range(4)))

    x = torch.randn(3, 8)
    plain, partial = model(), model()
    assert autobatch.apply_recompute(partial, "2/4") == ("Block",)
    assert autobatch.apply_recompute(model(), "off") == ()
    torch.testing.assert_close(plain(x), partial(x))
    with pytest.raises(NoBlocksError, match="2 of 3 blocks"):
        autobatch.apply_recompute(model(), "2/3")


def test_a_partial_level_that_falls_short_of_its_prediction_gives_way_to_its_neighbour() -> None:
    # Each checkpointed block saves less than the lines of off and full promise (a block's recompute transient
    # sits at the peak): the predicted K misses the plan's micro-batch, and K + 1, its neighbour, is searched.
    def short(level: str, compiled: bool = False) -> affine:  # type: ignore[valid-type]
        if "/" not in level:
            return curve(level)
        k, n = map(int, level.split("/"))
        return affine(A, S * (1 - 0.6 * k / n + 0.06))

    off_max = true_max(curve("off"), LINE, 65536)
    assert off_max is not None
    goal = off_max * 6 // 5
    fake = FakeRunner(
        affine(A, S),
        levels=short,
        recompute_counts={"Block": 12},
        level_seconds=lambda level: 0.01 * cost(level),
    )
    result = autobatch.tune(**STEP, **ONE, global_batch_size=goal, objective="throughput", runner=fake)
    rows = {c.recompute_level: c for c in result.combinations}
    assert list(rows) == ["off", "full", "selective", "4/12", "5/12"]  # the neighbour in a row of its own
    assert rows["4/12"].status == "pruned" and rows["4/12"].trace[-1].batch_size == goal
    neighbour = rows["5/12"]
    assert neighbour.status == "exact" and neighbour.max_batch_size == true_max(short("5/12"), LINE, 65536)
    assert neighbour.max_batch_size >= goal  # type: ignore[operator]
    assert result.chosen is not None and result.chosen.recompute_level == "5/12"
