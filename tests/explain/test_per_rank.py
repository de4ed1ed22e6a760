"""``explain --strategy``'s pure parts: merging every rank's breakdown, the strategy lever (fake data)."""

from __future__ import annotations

from autobatch.core.units import format_bytes
from autobatch.explain.pure.per_rank import merge_ranks, rank_peaks_line, rank_summary, worst_rank
from autobatch.explain.pure.sharding_lever import COMPUTED, line_max, strategy_lever
from autobatch.records.protocol import ProbeOutcome

MiB = 1 << 20


def rank_outcome(rank: int, peak: int, params: int) -> ProbeOutcome:
    info = {
        "rank": rank,
        "categories": {"baseline": 300 * MiB, "parameters": params, "activations": peak - 300 * MiB - params},
        "residual_bytes": 0,
        "peak_phase": "step 2 backward",
        "modules": [{"name": f"rank {rank}'s"}],
    }
    info["rank_summary"] = rank_summary(info, peak)
    return ProbeOutcome(kind="fits", peak_bytes=peak, info=info)


def test_the_worst_rank_is_shown_and_every_rank_is_summarized() -> None:
    ranks = [rank_outcome(0, 400 * MiB, 10 * MiB), rank_outcome(1, 420 * MiB, 12 * MiB)]
    out = ProbeOutcome(kind="fits", peak_bytes=420 * MiB, info=dict(ranks[1].info))  # combine's worst
    merge_ranks(out, list(reversed(ranks)))
    assert out.info["shown_rank"] == 1
    assert [r["rank"] for r in out.info["ranks"]] == [0, 1]
    assert [r["peak_bytes"] for r in out.info["ranks"]] == [400 * MiB, 420 * MiB]
    assert out.info["ranks"][0]["categories"]["parameters"] == 10 * MiB
    assert "rank_summary" not in out.info and out.info["modules"] == [{"name": "rank 1's"}]
    for summary in out.info["ranks"]:
        assert sum(summary["categories"].values()) + summary["residual_bytes"] == summary["peak_bytes"]


def test_ties_show_the_lowest_rank_as_combine_does() -> None:
    summaries = [{"rank": 1, "peak_bytes": 5}, {"rank": 0, "peak_bytes": 5}, {"rank": 2, "peak_bytes": 4}]
    assert worst_rank(summaries) == 0
    assert worst_rank([]) == 0


def test_the_rank_line_names_the_shown_rank() -> None:
    line = rank_peaks_line(
        [{"rank": 0, "peak_bytes": MiB}, {"rank": 1, "peak_bytes": 2 * MiB}], 1, format_bytes
    )
    assert line == "rank 0 1.00 MiB, rank 1 2.00 MiB (shown)"


CATEGORIES = {
    "baseline": 300 * MiB,
    "parameters": 40 * MiB,
    "gradients": 40 * MiB,
    "optimizer_state": 80 * MiB,
    "ddp_buckets": 40 * MiB,
    "activations": 20 * MiB,
}
LINE = {"static_bytes": 500.0 * MiB, "bytes_per_sample": 1.0 * MiB}


def test_under_ddp_fsdp_is_a_computed_lever() -> None:
    lever = strategy_lever("ddp", 4, CATEGORIES, LINE, (1000 * MiB, 65536, 1))
    assert lever is not None and lever.kind == "strategy" and lever.name == "strategy fsdp"
    assert lever.saving_bytes == 160 * MiB * 3 // 4 + 40 * MiB  # 3/4 of the sharded state, and the buckets
    assert lever.static_bytes == 500 * MiB - lever.saving_bytes
    assert lever.predicted_max_batch_size == (1000 - 340) * 1  # (budget - static) / per sample
    assert "160.00 MiB" in lever.description and "4 ranks" in lever.description
    assert COMPUTED in lever.description
    assert lever.scenario is None  # nothing to simulate or verify with this run's probes


def test_under_fsdp_twice_the_ranks_halves_the_shards() -> None:
    lever = strategy_lever("fsdp", 2, CATEGORIES, None, (1000 * MiB, 65536, 1))
    assert lever is not None and lever.name == "fsdp on 4 ranks"
    assert lever.saving_bytes == 80 * MiB and lever.predicted_max_batch_size is None  # no line: no maximum
    assert strategy_lever("none", 1, CATEGORIES, LINE, (1000 * MiB, 65536, 1)) is None


def test_the_line_maximum_respects_the_limits() -> None:
    assert line_max(100.0, 10.0, (1000, 65536, 8)) == 88
    assert line_max(100.0, 10.0, (1000, 50, 1)) == 50
    assert line_max(1000.0, 10.0, (1000, 65536, 1)) is None
    assert line_max(100.0, 0.0, (1000, 64, 1)) == 64


def test_levers_that_cannot_run_under_the_strategy_are_not_offered() -> None:
    from autobatch.explain.pure.levers import Lever
    from autobatch.explain.pure.sharding_lever import offered

    now = Lever("now", "now", "as measured")
    adafactor = Lever("optimizer adafactor", "optimizer", "adafactor instead of adamw", applicable=False)
    adafactor.reason = "cannot run: RuntimeError: aten.pow_.Scalar: in-place operations\nmore"
    vocab = Lever("vocab trim 50%", "vocab", "trim", applicable=False, reason="the model has no nn.Embedding")
    kept, notes = offered([now, adafactor, vocab], "fsdp")
    assert kept == [now, vocab]  # a lever that does not apply for another reason is still listed, with it
    assert notes == ["not offered under fsdp: optimizer adafactor (cannot run: RuntimeError: aten.pow_.Scalar: "
                     "in-place operations)"]  # fmt: skip
    assert offered([now, adafactor], "none") == ([now, adafactor], [])
