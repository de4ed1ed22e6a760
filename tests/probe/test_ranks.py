"""Distributed probes for real (gloo on the CPU, 2 ranks): every rank measured; one failing rank ends all."""

from __future__ import annotations

import os
import time

import psutil
import pytest
from requesting import probe_request
from support import EXAMPLES, SCRIPTS

from autobatch.devices.cpu import MALLOC_ENV
from autobatch.probe.client import ProbeClient
from autobatch.records.protocol import ProbeRequest

pytestmark = pytest.mark.slow  # every test starts a probe server

GIB = 1 << 30
TIMEOUT = 120.0


def _request(strategy: str, batch: int = 8, **kw: object) -> ProbeRequest:
    values: dict[str, object] = dict(
        batch_size=batch, precision="32-true", optimizer="adamw", device="cpu",
        budget_bytes=2 * GIB, timeout=TIMEOUT, strategy=strategy, nproc_per_node=2, min_steps=3, max_steps=3,
    )  # fmt: skip
    values.update(kw)
    return probe_request(**values)  # type: ignore[arg-type]


def _probe_processes(client: ProbeClient) -> list[psutil.Process]:
    """Every process under the probe server (probes, coordinators, ranks): none between probes."""
    return psutil.Process(client.pid).children(recursive=True)


@pytest.mark.parametrize("fault", ["oom", "crash", "helper-crash", "error"])
def test_a_failure_on_rank_1_ends_every_rank_promptly_and_names_it(fault: str) -> None:
    with ProbeClient(SCRIPTS / "rank_fault.py", [fault], env=dict(MALLOC_ENV)) as client:
        started = time.perf_counter()
        outcome = client.run(_request("ddp"))
        seconds = time.perf_counter() - started
        assert (
            outcome.kind == {"oom": "oom", "crash": "crash", "helper-crash": "crash", "error": "error"}[fault]
        ), outcome
        assert outcome.failed_rank == 1
        assert outcome.reason is not None and outcome.reason.startswith("rank 1 of 2")
        assert seconds < TIMEOUT / 4, f"rank 0 was left waiting: {seconds:.1f} s"
        assert _probe_processes(client) == []  # no rank, no coordinator left behind
    assert [p for p in psutil.Process(os.getpid()).children(recursive=True) if p.is_running()] == []


def test_per_rank_peaks_order_fsdp_below_one_process_below_ddp() -> None:
    """A parameter-heavy MLP (32 MiB of parameters, AdamW): FSDP2 shards parameters, gradients and
    state (below one process, gloo's runtime included), DDP adds its gradient buckets (above it)."""
    args = ["--width", "512", "--depth", "32", "--tokens", "1", "--in-features", "512", "--classes", "10"]
    with ProbeClient(EXAMPLES / "mlp.py", args, env=dict(MALLOC_ENV)) as client:
        single = client.run(_request("none", nproc_per_node=1))
        ddp = client.run(_request("ddp"))
        fsdp = client.run(_request("fsdp"))
        assert _probe_processes(client) == []
    assert single.kind == "fits" and single.rank_peak_bytes == []
    for outcome in (ddp, fsdp):
        assert outcome.kind == "fits", outcome
        assert len(outcome.rank_peak_bytes) == 2
        assert outcome.peak_bytes == max(outcome.rank_peak_bytes)
        assert outcome.info["distributed"]["world_size"] == 2
    # FSDP2 holds half of the parameters and of the AdamW state on each rank (to a shard's padding)
    assert abs(fsdp.param_bytes * 2 - ddp.param_bytes) <= 4096
    assert abs(fsdp.optimizer_state_bytes * 2 - ddp.optimizer_state_bytes) <= 8192
    assert fsdp.peak_bytes < single.peak_bytes < ddp.peak_bytes  # type: ignore[operator]
    # DDP's buckets: about one more copy of the gradients than one process holds
    assert ddp.peak_bytes - single.peak_bytes >= single.grad_bytes  # type: ignore[operator]


def test_no_rank_stops_at_a_search_line_on_its_own() -> None:
    """A single process stops at the step whose peak crosses the search's line; a rank that did would leave
    the others waiting in a collective until the timeout, so every rank runs every step."""
    with ProbeClient(EXAMPLES / "mlp.py", env=dict(MALLOC_ENV)) as client:
        started = time.perf_counter()
        outcome = client.run(_request("ddp", min_steps=4, max_steps=4, stop_above_bytes=1 << 20))
        seconds = time.perf_counter() - started
    assert outcome.kind == "fits" and outcome.steps == 4 and outcome.stopped_above_bytes is None, outcome
    assert seconds < TIMEOUT / 4


def test_no_rank_stops_at_a_steady_peak_on_its_own() -> None:
    """Each rank reads its own peak, and rank 1's holds still four steps before rank 0's: every rank stops at
    the step after which all would, not rank 1 alone (rank 0 then waited in DDP's all-reduce until the
    timeout)."""
    with ProbeClient(SCRIPTS / "rank_settles_late.py", env=dict(MALLOC_ENV)) as client:
        started = time.perf_counter()
        outcome = client.run(_request("ddp", min_steps=2, max_steps=10))
        seconds = time.perf_counter() - started
    assert outcome.kind == "fits", outcome
    # rank 0's peak grows at each of its first four steps and holds still at its fifth
    assert outcome.steps == len(outcome.step_peaks) == 5, outcome
    assert seconds < TIMEOUT / 4, f"a rank was left waiting: {seconds:.1f} s"
