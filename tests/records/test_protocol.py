"""A probe request crosses the process boundary as JSON with its two sections whole: the step and the run."""

from __future__ import annotations

import json

from requesting import probe_request

from autobatch.records.protocol import ProbeRequest, RunConfig


def test_a_request_round_trips_with_its_run_section():
    request = probe_request(
        device="cuda:1", budget_bytes=3 << 30, timeout=12.5, process_limit_bytes=5 << 30, strategy="fsdp",
        nproc_per_node=2, fresh_offset_bytes=(7, 9), op="explain",
    )  # fmt: skip
    crossed = ProbeRequest.from_dict(json.loads(json.dumps(request.to_dict())))
    assert crossed == request
    assert crossed.run == RunConfig(3 << 30, 12.5, 5 << 30, "fsdp", 2, (7, 9))
    assert (crossed.budget_bytes, crossed.timeout, crossed.strategy, crossed.nproc_per_node) == (
        3 << 30,
        12.5,
        "fsdp",
        2,
    )


def test_a_ranks_request_is_on_its_device_with_its_own_offset():
    request = probe_request(device="cuda:0", strategy="ddp", nproc_per_node=2, fresh_offset_bytes=(7, 9))
    rank = request.on_rank("cuda:1", 1)
    assert rank.device == "cuda:1" and rank.run.fresh_offset_bytes == (9,) and rank.offset_for() == 9
    assert (
        rank.run.budget_bytes == request.run.budget_bytes and rank.step.batch_size == request.step.batch_size
    )
    assert request.on_rank("cpu", 5).offset_for() == 0  # not measured for that rank
