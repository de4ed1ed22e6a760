"""The strategy as a lever of ``explain --strategy ddp|fsdp`` (pure: computed from the measured categories).

:func:`strategy_lever`: under DDP, what FSDP2 over the same ranks would save; under FSDP2, twice the ranks.
The figure is computed, never measured, and says so; ``--verify`` does not measure it (run ``explain
--strategy fsdp`` for that).
"""

from __future__ import annotations

from autobatch.core.units import format_bytes
from autobatch.explain.pure.levers import Lever

#: The categories FSDP2 shards across the ranks.
SHARDED = ("parameters", "gradients", "optimizer_state")
COMPUTED = "computed from the measured categories, not measured"


def strategy_lever(
    strategy: str,
    world: int,
    categories: dict[str, int],
    line: dict[str, float] | None,
    limits: tuple[int, int, int],
) -> Lever | None:
    """The strategy lever of a report (None without a strategy); ``limits``: budget bytes, largest batch,
    batch multiple.

    Under DDP every rank holds the whole model's parameters, gradients and optimizer state, plus DDP's gradient
    buckets. FSDP2 over the same ``N`` ranks keeps ``1/N`` of the first three on each rank and has no buckets, so
    at the explained batch it would save ``(1 - 1/N) x (parameters + gradients + optimizer state) + buckets`` per
    rank, *less* the all-gather buffers it adds (at least one block's full parameters while that block runs),
    which no DDP measurement shows. Under FSDP2 the sharded state is already ``1/N`` per rank; the lever is twice
    the ranks (``2N``), which halves it again. A lever's line keeps the measured per-sample slope (sharding does
    not change the activations of a rank's own micro-batch) and lowers the static part by the saving; its
    maximum batch is that line's under the budget.
    """
    sharded = sum(int(categories.get(name, 0)) for name in SHARDED)
    if strategy == "ddp":
        buckets = int(categories.get("ddp_buckets", 0))
        saving = int(sharded * (1 - 1 / world)) + buckets
        lever = Lever(
            "strategy fsdp",
            "strategy",
            f"fsdp would shard {format_bytes(sharded)} of parameters+grads+optimizer state across {world} ranks "
            f"and drop DDP's {format_bytes(buckets)} of gradient buckets ({COMPUTED}; FSDP's all-gather buffers "
            "not counted)",
        )
    elif strategy == "fsdp":
        saving = sharded // 2
        lever = Lever(
            f"fsdp on {2 * world} ranks",
            "strategy",
            f"{2 * world} ranks instead of {world} would halve the {format_bytes(sharded)} of sharded "
            f"parameters+grads+optimizer state on each rank ({COMPUTED})",
        )
    else:
        return None
    lever.saving_bytes = saving
    if line is not None:
        lever.static_bytes = line["static_bytes"] - saving
        lever.bytes_per_sample = line["bytes_per_sample"]
        lever.predicted_max_batch_size = line_max(lever.static_bytes, lever.bytes_per_sample, limits)
    return lever


def line_max(static: float, per_sample: float, limits: tuple[int, int, int]) -> int | None:
    """The largest batch (a multiple of the batch multiple, at most the largest) whose line stays within
    the budget; None when not even one multiple fits."""
    budget, largest, multiple = limits
    if per_sample <= 0:
        return largest
    best = int((budget - static) // per_sample)
    best = min(best, largest) // max(1, multiple) * max(1, multiple)
    return best if best >= 1 else None


def offered(levers: list[Lever], strategy: str) -> tuple[list[Lever], list[str]]:
    """The levers offered under ``strategy`` and a note for each one left out: a lever whose step cannot run
    under the strategy (its simulation, one rank of the strategy, failed: Adafactor's in-place updates on
    FSDP2's sharded parameters, say) does not apply to this job. Without a strategy every lever stays."""
    if strategy == "none":
        return levers, []
    kept, notes = [], []
    for lever in levers:
        if lever.kind != "now" and not lever.applicable and (lever.reason or "").startswith("cannot run"):
            first = (lever.reason or "").splitlines()[0]
            notes.append(f"not offered under {strategy}: {lever.name} ({first})")
        else:
            kept.append(lever)
    return kept, notes
