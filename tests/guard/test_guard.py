"""The guard in one process: splitting, weighting, lowering on a real allocator failure, the error at 1.

The out-of-memory failures here are real: the loss allocates a petabyte when its micro-batch is larger than
a limit, and the CPU allocator refuses (``DefaultCPUAllocator: can't allocate memory``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from autobatch import Guard, GuardError, LadderSettings
from autobatch.cache import CacheFolder, EvidenceStore
from autobatch.cache.evidence import summary
from autobatch.errors import UsageError
from autobatch.guard.batches import bounds, samples, split
from autobatch.records.result import Chosen, ComboResult, ProbeRecord, TuneResult


def model_and_batch(n: int = 10) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return nn.Linear(5, 1).double(), (
        torch.randn(n, 5, dtype=torch.float64),
        torch.randn(n, 1, dtype=torch.float64),
    )


def loss_up_to(limit: int) -> Any:
    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        if len(x) > limit:
            torch.empty(1 << 50, dtype=torch.uint8)  # the allocator refuses: a real out-of-memory failure
        return nn.functional.mse_loss(model(x), y)

    return loss_fn


def full_gradient(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    nn.functional.mse_loss(model(batch[0]), batch[1]).backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return grads


def test_split_slices_every_batch_tensor_and_keeps_the_rest() -> None:
    batch = {
        "ids": torch.arange(10).view(5, 2),
        "mask": (torch.ones(5), torch.zeros(5)),
        "scale": torch.tensor(2.0),
    }
    parts = list(split(batch, 2))
    assert [len(p["ids"]) for p in parts] == [2, 2, 1]
    assert all(p["scale"] is batch["scale"] for p in parts)
    assert torch.equal(torch.cat([p["mask"][0] for p in parts]), batch["mask"][0])


def test_split_slices_the_samples_own_lists_not_a_container_of_batched_values() -> None:
    names, sizes = (
        ["a", "b", "c"],
        [torch.ones(3), torch.ones(1), torch.ones(2)],
    )  # one of 3 rows: not batched
    parts = list(split({"x": torch.zeros(3, 2), "names": names, "sizes": sizes, "pair": ("en", "fr")}, 2))
    assert [p["names"] for p in parts] == [["a", "b"], ["c"]]
    assert [len(p["sizes"]) for p in parts] == [2, 1] and parts[1]["sizes"][0] is sizes[2]
    assert all(p["pair"] == ("en", "fr") for p in parts)  # 2 items, not 3: the same in every micro-batch
    pair = (
        torch.zeros(2, 3),
        ["u", "v"],
    )  # two samples: the tuple holds batched values, it is no sample list
    assert [(len(x), names) for x, names in split(pair, 1)] == [(1, ["u"]), (1, ["v"])]


def test_a_list_of_the_samples_tensors_is_split_by_sample_even_when_each_has_as_many_rows_as_samples() -> (
    None
):
    """A collate's list of one tensor a sample whose lengths all equal the batch's (16 documents cut to 16 tokens;
    3 RGB images, as torchvision's detection collate ``tuple(zip(*batch))`` leaves them) is split by its items: it
    was read as a container of batched tensors, each sample's tokens or channels cut in two."""
    tokens = [torch.full((16,), i) for i in range(16)]
    parts = list(split({"tokens": tokens, "label": torch.arange(16)}, 8))
    assert [[int(t[0]) for t in p["tokens"]] for p in parts] == [list(range(8)), list(range(8, 16))]
    assert all(len(t) == 16 for p in parts for t in p["tokens"])
    images = tuple(torch.zeros(3, 5 + i, 7) for i in range(3))
    targets = tuple({"boxes": torch.zeros(i + 1, 4), "labels": torch.ones(i + 1)} for i in range(3))
    first, second = split((images, targets), 2)
    assert [im.shape[0] for im in first[0]] == [3, 3] and first[1] == targets[:2]
    assert second[0][0] is images[2]
    # what stays a container of batched values: the batch itself, and values of different kinds
    x, y = torch.zeros(2, 4), torch.ones(2, 4)
    assert [(len(a), len(b)) for a, b in split((x, y), 1)] == [(1, 1), (1, 1)]
    nested = {"inputs": [torch.zeros(2, 6, dtype=torch.long), torch.zeros(2)], "weight": torch.ones(2)}
    assert [[len(t) for t in p["inputs"]] for p in split(nested, 1)] == [[1, 1], [1, 1]]


@given(st.integers(1, 300), st.integers(1, 64))
def test_a_batch_splits_into_as_few_micro_batches_as_fit_of_sizes_within_one(n: int, size: int) -> None:
    cuts = bounds(n, size)
    sizes = [stop - start for start, stop in cuts]
    assert cuts[0][0] == 0 and cuts[-1][1] == n and all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
    assert len(cuts) == -(-n // size) and max(sizes) <= size and max(sizes) - min(sizes) <= 1
    # a micro-batch of 1 only where it cannot be helped: a one-sample batch, size 1, or more parts than pairs
    assert min(sizes) > 1 or n == 1 or size == 1 or len(cuts) > n // 2


def test_the_batch_size_is_read_past_a_first_value_of_the_samples_own_tensors() -> None:
    tokens = [torch.ones(40), torch.ones(3), torch.ones(7)]
    assert samples({"tokens": tokens, "label": torch.zeros(3)}) == 3
    assert samples({"tokens": tokens}) == 3  # the samples' list alone
    assert samples([torch.zeros(4, 2), torch.zeros(4)]) == 4  # (inputs, labels), not 2 samples
    assert samples([torch.zeros(16, 5), torch.zeros(16, 1)]) == 16  # [x, y] of one kind: still 16, not 2


def test_a_batch_that_is_a_list_of_its_samples_own_tensors_counts_them() -> None:
    """``collate_fn=list`` over token tensors of their own lengths: the batch is the list, one tensor a sample. It
    counted 7 (and split every tensor's rows) when one sample held 7 tokens, and was refused otherwise."""
    docs = [torch.arange(n) for n in (12, 7, 30, 5, 9, 3, 21)]
    assert samples(docs) == 7 and samples(docs[:3]) == 3 and samples(tuple(docs[:4])) == 4
    first, second = split(docs, 4)
    assert [len(t) for t in first] == [12, 7, 30, 5] and [len(t) for t in second] == [9, 3, 21]
    assert first[0] is docs[0]  # whole samples, not their rows
    # tensors that share their first dimension are fields, whatever else they share: 16 rows, 3 fields
    assert samples([torch.zeros(16), torch.zeros(16), torch.zeros(16)]) == 16
    # tensors of different kinds that disagree are not a list of samples, but parts that disagree
    with pytest.raises(UsageError, match="disagree"):
        samples([torch.zeros(16, 2), torch.zeros(12, dtype=torch.long)])
    with pytest.raises(UsageError, match=r"batch\['ids'\] 4 against batch\['positions'\] 1") as caught:
        samples({"ids": torch.zeros(4, 2), "positions": torch.zeros(1, 2)})
    assert caught.value.hint and "outside the batch" in caught.value.hint


@pytest.mark.parametrize("micro", [1, 3, 4, 10])
def test_the_gradient_is_the_mean_over_the_batch_whatever_the_split(micro: int) -> None:
    model, batch = model_and_batch()
    expected = full_gradient(model, batch)
    Guard(micro).backward(model, batch, loss_up_to(100))
    for got, want in zip([p.grad for p in model.parameters()], expected):
        assert got is not None and torch.allclose(got, want, rtol=1e-12, atol=1e-14)


def test_out_of_memory_lowers_to_the_next_rung_and_reruns_the_same_batch(tmp_path: Path) -> None:
    model, batch = model_and_batch()
    expected = full_gradient(model, batch)
    guard = Guard(8, sizes=[3, 6, 8], events=tmp_path / "events.jsonl")
    loss = guard.backward(model, batch, loss_up_to(3))
    assert guard.micro_batch_size == 3 and guard.last is not None
    assert (guard.last.attempts, guard.last.micro_batches, guard.last.samples) == (3, 4, 10)
    for got, want in zip([p.grad for p in model.parameters()], expected):
        assert got is not None and torch.allclose(got, want, rtol=1e-12, atol=1e-14)
    with torch.no_grad():
        assert float(loss) == pytest.approx(float(nn.functional.mse_loss(model(batch[0]), batch[1])))
    summary = guard.close()
    lines = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["old"], e["new"]) for e in lines[:-1]] == [(8, 6), (6, 3)]
    assert lines[0]["shapes"] == [[10, 5], [10, 1]] and lines[-1]["event"] == "summary"
    assert summary.out_of_memory == 2 and not summary.held and summary.steps == 1


def test_it_grows_back_after_clean_steps_and_steps_the_optimizer_once_per_batch() -> None:
    model, batch = model_and_batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = Guard(2, max_micro_batch_size=4, settings=LadderSettings(grow_after=2))
    done = [guard.step(model, optimizer, batch, loss_up_to(100)) for _ in range(3)]
    assert [d.micro_batch_size for d in done] == [2, 2, 4]
    assert optimizer.state_dict()["state"] == {}  # SGD without momentum keeps none; grads cleared after
    assert all(p.grad is None for p in model.parameters())


def test_at_one_sample_it_names_the_batch_that_did_not_fit() -> None:
    model, batch = model_and_batch(4)
    guard = Guard(2)
    with pytest.raises(GuardError, match=r"batch 0 \(4 samples, shapes \[\[4, 5\], \[4, 1\]\]\)") as caught:
        guard.backward(model, batch, loss_up_to(0))
    assert caught.value.exit_code == 5 and caught.value.hint
    assert str(caught.value).endswith(f"\nhint: {caught.value.hint}")  # a script's traceback shows it
    assert guard.summary.out_of_memory == 1  # 2 -> 1, handled; the failure at 1 was not
    assert all(p.grad is None for p in model.parameters())


def test_an_error_that_is_not_memory_passes_through() -> None:
    model, batch = model_and_batch()

    def broken(model: nn.Module, batch: Any) -> torch.Tensor:
        raise ValueError("labels out of range")

    guard = Guard(4)
    with pytest.raises(ValueError, match="labels out of range"):
        guard.backward(model, batch, broken)
    assert guard.summary.events == []


def test_from_result_takes_the_plan_the_maximum_and_the_sizes_that_fitted() -> None:
    combo = ComboResult("32-true", "adamw", False, status="exact", max_batch_size=14)
    combo.trace = [
        ProbeRecord(batch_size=4, kind="fits"),
        ProbeRecord(batch_size=16, kind="oom"),
        ProbeRecord(batch_size=11, kind="fits"),
        ProbeRecord(batch_size=14, kind="fits"),
    ]
    chosen = Chosen(
        "32-true",
        "adamw",
        False,
        micro_batch_size=11,
        accumulation_steps=3,
        world_size=1,
        global_batch_size=33,
    )
    result = TuneResult("train.py", [], {}, "throughput", [combo], chosen=chosen)
    guard = Guard.from_result(result)
    assert guard.micro_batch_size == 11 and guard.batch_size == 33
    assert guard.ladder.sizes == (1, 2, 4, 11, 14) and guard.ladder.ceiling == 14


def test_the_test_hook_runs_out_of_memory_for_real_at_the_named_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AUTOBATCH_GUARD_FAIL_AT", "1, 3")
    model, batch = model_and_batch(8)
    expected = full_gradient(model, batch)
    guard = Guard(8, sizes=[2, 4, 8])
    done = []
    for _ in range(4):
        guard.backward(model, batch, loss_up_to(100))
        assert guard.last is not None
        done.append((guard.last.attempts, guard.last.micro_batch_size, guard.last.samples))
        for got, want in zip([p.grad for p in model.parameters()], expected):
            assert got is not None and torch.allclose(got, want, rtol=1e-12, atol=1e-14)
        model.zero_grad(set_to_none=True)
    assert done == [(1, 8, 8), (2, 4, 8), (1, 4, 8), (2, 2, 8)]
    assert [(e.step, e.old, e.new, e.reason) for e in guard.summary.events] == [
        (1, 8, 4, "out of memory"),
        (3, 4, 2, "out of memory"),
    ]


def test_the_test_hook_refuses_what_is_not_a_list_of_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOBATCH_GUARD_FAIL_AT", "step 3")
    with pytest.raises(UsageError, match="AUTOBATCH_GUARD_FAIL_AT='step 3'"):
        Guard(4)
    assert Guard(4, fail_at=[2]).fail_at == {2}


def cached_result(folder: Path, budget: int = 1 << 40) -> TuneResult:
    """A result kept in the cache as ``k1`` in ``folder``: micro-batch 8 x accumulation 2, sizes 3, 6, 8."""
    combo = ComboResult("32-true", "adamw", False, status="exact", max_batch_size=8, peak_bytes=200 << 20)
    combo.trace = [ProbeRecord(batch_size=b, kind="fits", peak_bytes=(100 + b) << 20) for b in (3, 6, 8)]
    chosen = Chosen(
        "32-true", "adamw", False, micro_batch_size=8, accumulation_steps=2, world_size=1, global_batch_size=16
    )  # fmt: skip
    device = {"type": "cpu", "budget_bytes": budget}
    result = TuneResult("train.py", [], device, "throughput", [combo], chosen=chosen)
    result.cache = {"key": "k1", "served": False, "folder": str(folder)}
    return result


def test_a_guard_from_a_cached_result_records_its_run_under_the_key(tmp_path: Path) -> None:
    model, batch = model_and_batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Guard.from_result(cached_result(tmp_path)) as guard:
        guard.step(model, optimizer, batch, loss_up_to(3))  # runs out at 8 and 6: 8 -> 6 -> 3
        guard.step(model, optimizer, batch, loss_up_to(3))
    events = EvidenceStore(CacheFolder(tmp_path)).read("k1")
    assert [(e.kind, e.step, e.micro_batch_size, e.new_micro_batch_size) for e in events] == [
        ("change", 0, 8, 6),
        ("change", 0, 6, 3),
        ("run", 2, 8, 3),
    ]
    assert events[0].shapes == [[10, 5], [10, 1]] and events[0].reason == "out of memory"
    run = events[-1]
    assert (run.source, run.outcome, run.accumulation_steps) == ("guard", "exit", 2)
    assert run.peak_bytes and run.tuned_peak_bytes == 108 << 20 and run.budget_bytes == 1 << 40
    said = summary(events)
    assert said is not None and "the guard held for 2 steps in 1 run(s)" in said
    assert "ran out of memory at step 0 with shapes [10, 5] [10, 1] (micro-batch 8 -> 3)" in said


def test_running_out_at_one_sample_records_the_batch_and_a_script_error_its_end(tmp_path: Path) -> None:
    model, batch = model_and_batch(4)
    with pytest.raises(GuardError), Guard.from_result(cached_result(tmp_path)) as guard:
        guard.backward(model, batch, loss_up_to(0))
    (*_, run) = EvidenceStore(CacheFolder(tmp_path)).read("k1")
    assert (run.kind, run.outcome, run.step, run.shapes) == ("run", "oom", 0, [[4, 5], [4, 1]])
    assert "DefaultCPUAllocator" in run.reason

    def broken(model: nn.Module, batch: Any) -> torch.Tensor:
        raise ValueError("labels out of range")

    with pytest.raises(ValueError), Guard.from_result(cached_result(tmp_path)) as guard:
        guard.backward(model, batch, broken)
    (*_, run) = EvidenceStore(CacheFolder(tmp_path)).read("k1")
    assert (run.outcome, run.reason) == ("error", "ValueError: labels out of range")


def test_a_guard_built_directly_records_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOBATCH_CACHE_DIR", str(tmp_path))
    model, batch = model_and_batch()
    with Guard(8, sizes=[3, 6]) as guard:
        guard.backward(model, batch, loss_up_to(3))
    assert list(tmp_path.iterdir()) == []


def test_a_peak_near_the_budget_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, batch = model_and_batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with (
        caplog.at_level("WARNING", logger="autobatch"),
        Guard.from_result(cached_result(tmp_path, 64 << 20)) as g,
    ):
        for _ in range(3):
            g.step(model, optimizer, batch, loss_up_to(100))
    warnings = [r.getMessage() for r in caplog.records if "may run out of memory later" in r.getMessage()]
    assert len(warnings) == 1 and "past its budget 64.00 MiB, into the headroom" in warnings[0], warnings
    assert "within" not in warnings[0]  # the process's peak is far past a budget of 64 MiB


def test_on_cuda_the_peak_is_what_the_budget_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    # The tune's probes measured, and its budget caps, the caching allocator's reserved memory: a job whose
    # tensors (max_memory_allocated) stay under the budget while its segments (max_memory_reserved) passed it has
    # used more than it was tuned for. torch.cuda's counters are replaced: there is no GPU here.
    from autobatch.devices.budget import EarlyWarning
    from autobatch.guard.events import PeakMeter

    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda index=None: 70 << 20)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda index=None: 50 << 20)
    meter = PeakMeter("cuda", 0)
    assert meter.peak() == 70 << 20 and PeakMeter.HOW["cuda"] == "torch.cuda.max_memory_reserved"
    warned: list[str] = []
    assert EarlyWarning("cuda", 64 << 20, warned.append).check(meter.peak())
    assert "the job's peak reached 70.00 MiB" in warned[0]


def test_a_state_the_guard_did_not_write_is_a_usage_error() -> None:
    guard = Guard(8, sizes=[2, 4])
    guard.load_state_dict(Guard(8, sizes=[2, 4]).state_dict() | {"steps": 7, "micro_batch_size": 4})
    assert (guard.summary.steps, guard.micro_batch_size) == (7, 4)
    with pytest.raises(UsageError, match="not one Guard.state_dict"):
        guard.load_state_dict({"steps": 3})


def test_step_refuses_what_is_not_an_optimizer_before_the_batch_runs() -> None:
    """A dict of optimizers (or anything without ``step``) is a usage error that names the fix, raised before the
    forward and backward (which would leave gradients behind)."""
    model = nn.Linear(4, 1)
    optimizers = {"adamw": torch.optim.AdamW(model.parameters())}
    guard = Guard(4, sizes=[2, 4])
    with pytest.raises(UsageError, match="an optimizer or a list of them, and got dict"):
        guard.step(model, optimizers, torch.randn(4, 4), lambda m, b: m(b).mean())  # type: ignore[arg-type]
    assert all(p.grad is None for p in model.parameters())
