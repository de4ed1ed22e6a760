"""``explain --strategy ddp|fsdp --nproc-per-node N`` through a fake probe runner: the explain requests run on
the ranks, the levers' simulations are one rank of the strategy, the report shows the worst rank with every
rank's peak and the strategy lever; without a strategy nothing changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import run_main, wire_fake_runner

from autobatch.errors import EXIT_USAGE
from autobatch.explain.pure.per_rank import merge_ranks, rank_summary
from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.testing import FakeRunner, affine

MiB = 1 << 20
EXPLAIN = ("explain", "train.py", "-b", "64", "--device", "cpu", "--memory", "1GiB")


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    keep = ("AUTOBATCH_CACHE_DIR", "AUTOBATCH_LOCK_DIR")  # a fake runner waits for no real run's device lock
    runner = wire_fake_runner(FakeRunner(affine(400 * MiB, 1.7 * MiB)), tmp_path, monkeypatch, keep=keep)
    plain = runner.run

    def on_ranks(request: ProbeRequest) -> ProbeOutcome:
        """An explain on two ranks: rank 1 peaks 1 MiB lower than rank 0 (whose breakdown is shown)."""
        out = plain(request)
        if request.op != "explain" or request.strategy == "none" or not out.fits or not out.peak_bytes:
            return out
        ranks = []
        for rank, less in ((0, 0), (1, MiB)):
            info: dict[str, Any] = {**out.info, "rank": rank}
            info["categories"] = {**info["categories"], "ddp_buckets": 4 * MiB}
            info["residual_bytes"] -= 4 * MiB + less
            ranks.append(ProbeOutcome(kind="fits", peak_bytes=out.peak_bytes - less, info=info))
            ranks[-1].info["rank_summary"] = rank_summary(info, ranks[-1].peak_bytes)
        out.info = dict(ranks[0].info)
        out.rank_peak_bytes = [r.peak_bytes or 0 for r in ranks]
        merge_ranks(out, ranks)
        return out

    monkeypatch.setattr(runner, "run", on_ranks)
    return runner


def test_explain_with_a_strategy_shows_the_worst_rank_and_every_peak(fake: FakeRunner) -> None:
    code, out, err = run_main(*EXPLAIN, "--strategy", "ddp", "--nproc-per-node", "2", "--json")
    assert code == 0, err
    report = json.loads(out)
    explains = [r for r in fake.requests if r.op == "explain"]
    assert explains and all((r.strategy, r.nproc_per_node) == ("ddp", 2) for r in explains)
    estimate = next(r for r in fake.requests if r.op == "estimate")
    assert estimate.strategy == "none"  # the simulations are one rank of the strategy, in one process
    assert (estimate.options["strategy"], estimate.options["world_size"]) == ("ddp", 2)
    dist = report["distributed"]
    assert (dist["strategy"], dist["nproc_per_node"], dist["shown_rank"]) == ("ddp", 2, 0)
    assert dist["rank_peak_bytes"] == [report["peak_bytes"], report["peak_bytes"] - MiB]
    assert [r["rank"] for r in dist["ranks"]] == [0, 1]
    assert report["categories"]["ddp_buckets"] == 4 * MiB
    assert sum(report["categories"].values()) + report["residual_bytes"] == report["peak_bytes"]
    lever = next(lever for lever in report["levers"] if lever["kind"] == "strategy")
    assert lever["name"] == "strategy fsdp" and "not measured" in lever["description"]
    assert "per-rank peaks: rank 0" in err and "(shown)" in err and "strategy fsdp" in err


def test_explain_without_a_strategy_is_unchanged(fake: FakeRunner) -> None:
    code, out, err = run_main(*EXPLAIN, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert "distributed" not in report and "ddp_buckets" not in report["categories"]
    assert all(lever["kind"] != "strategy" for lever in report["levers"])
    assert all(r.strategy == "none" for r in fake.requests)
    assert "strategy" not in next(r for r in fake.requests if r.op == "estimate").options or (
        next(r for r in fake.requests if r.op == "estimate").options["strategy"] == "none"
    )


def test_explain_with_a_strategy_needs_two_ranks(fake: FakeRunner) -> None:
    code, _, err = run_main(*EXPLAIN, "--strategy", "fsdp", "--nproc-per-node", "1")
    assert code == EXIT_USAGE and "--nproc-per-node 2" in err
    code, _, err = run_main(*EXPLAIN, "--strategy", "zero3", "--nproc-per-node", "2")
    assert code != 0 and "none, ddp, fsdp" in err
    assert not [r for r in fake.requests if r.op == "explain"]


def test_explain_verify_searches_with_the_strategy(fake: FakeRunner) -> None:
    code, out, err = run_main(*EXPLAIN, "--strategy", "fsdp", "--nproc-per-node", "2", "--verify", "--json")
    assert code == 0, err
    measured = [r for r in fake.requests if r.op in ("probe", "explain")]
    assert [r for r in measured if r.op == "probe"], "the levers' maxima are searched with real probes"
    assert all((r.strategy, r.nproc_per_node) == ("fsdp", 2) for r in measured)
    levers = {lever["name"]: lever for lever in json.loads(out)["levers"]}
    assert levers["now"]["verified_max_batch_size"]
    assert levers["fsdp on 4 ranks"]["verified_max_batch_size"] is None  # computed, another world: not probed
