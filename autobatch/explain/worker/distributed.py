"""``explain --strategy ddp|fsdp``: the ``explain`` operation inside every rank of a real distributed probe.

The ranks are started, joined and stopped by the probe layer (:func:`autobatch.probe.ranks.run_ranks`, as a
tune's distributed probe); each rank runs the instrumented step of
:func:`autobatch.explain.worker.instrumented.explain_step` on the wrapped model (DDP, or FSDP2's
``fully_shard``), so its breakdown is that of the real wrapped step on that rank, with DDP's buckets and
FSDP2's buffers as categories of their own (:func:`explain_rank`). The coordinator keeps the worst rank's
breakdown and a summary of every rank (:mod:`autobatch.explain.pure.per_rank`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from autobatch.explain.pure.options import ExplainOptions
from autobatch.explain.pure.per_rank import merge_ranks, rank_summary
from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.step.contract import UserScript


def explain_on_ranks(request: ProbeRequest, script: UserScript, options: ExplainOptions) -> ProbeOutcome:
    """The explain operation on ``request.nproc_per_node`` ranks: one outcome, the worst rank's breakdown."""
    from autobatch.probe.ranks import run_ranks

    measure = functools.partial(explain_rank, options=options)
    return run_ranks(request, script, measure, summarize=merge_ranks)


#: The category of what a strategy's wrapper allocates and keeps (tagged as the model is wrapped).
WRAP_CATEGORY = {"ddp": "ddp_buckets"}
#: FSDP2's own buffers: the outputs of its ``fsdp`` operators (all-gather inputs and outputs, reduce-scatter
#: inputs) and the unsharded parameters it frees and refills with ``UntypedStorage.resize_``.
FSDP_CATEGORY = "fsdp_buffers"


def explain_rank(
    request: ProbeRequest, script: UserScript, start: float, *, wrap: Any, options: ExplainOptions
) -> ProbeOutcome:
    """One rank: the instrumented step on the wrapped model, its breakdown with the strategy's own parts.

    Its categories::

        ``parameters``    the rank's own parameters: the whole model under DDP, the local shards under FSDP2
                          (a ``DTensor`` counts as its local shard: :func:`autobatch.explain.worker.tracker.storage_of`)
        ``gradients``     the rank's gradients (sharded under FSDP2, tagged before each optimizer step since
                          FSDP2 sets them itself); ``optimizer_state`` likewise
        ``ddp_buckets``   DDP's gradient buckets (a flat copy of every gradient, ``gradient_as_bucket_view=False``):
                          what DDP allocates and keeps while it wraps the model; a note compares it with DDP's own
                          figure (``bucket_sizes`` of its logging data)
        ``fsdp_buffers``  FSDP2's own buffers: what its ``fsdp`` operators return (all-gather inputs and outputs,
                          reduce-scatter inputs) and the unsharded parameters it frees and refills with
                          ``UntypedStorage.resize_``, alive at the peak
        ``residual``      what no tracked tensor explains, now also the buffers of the gloo (NCCL) collectives

    Each rank also names itself (``rank``) in its outcome's ``info``.
    """
    import torch.distributed as dist

    from autobatch.explain.worker.instrumented import explain_step

    seen: dict[str, Any] = {}

    def keep(model: Any) -> Any:
        tracker = seen.get("tracker")
        before = tracker.seq if tracker is not None else 0
        out = wrap(model) if wrap is not None else model
        if tracker is not None and request.strategy in WRAP_CATEGORY:
            seen["wrap_bytes"] = tracker.tag_since(before, WRAP_CATEGORY[request.strategy])
            if request.strategy == "ddp":
                _follow_rebuilt_buckets(out, tracker)
        seen["model"] = out
        return out

    @contextlib.contextmanager
    def around(tracker: Any) -> Iterator[None]:
        seen["tracker"] = tracker
        if tracker is None:
            yield
            return
        with _strategy_tracking(tracker, request.strategy):
            yield

    outcome = explain_step(request, script, options, start=start, wrap=keep, around=around)
    info = outcome.info
    info["rank"] = dist.get_rank() if dist.is_initialized() else 0
    if options.instrument and "categories" in info:
        category = WRAP_CATEGORY.get(request.strategy, FSDP_CATEGORY)
        info["categories"].setdefault(category, 0)
        if request.strategy == "ddp" and "model" in seen:
            info.setdefault("notes", []).append(
                f"DDP reports {ddp_bucket_bytes(seen['model'])} B of gradient buckets; the tracker saw "
                f"{seen.get('wrap_bytes', 0)} B allocated and kept while wrapping the model"
            )
    info["rank_summary"] = rank_summary(info, outcome.peak_bytes)
    return outcome


def _follow_rebuilt_buckets(model: Any, tracker: Any) -> None:
    """DDP rebuilds its buckets in the order gradients became ready, in the forward after the first backward
    (``_pre_forward``): what that allocates and keeps is buckets, not activations."""
    pre_forward = getattr(model, "_pre_forward", None)
    if pre_forward is None:
        return

    @functools.wraps(pre_forward)
    def tagged(*args: Any, **kwargs: Any) -> Any:
        before = tracker.seq
        out = pre_forward(*args, **kwargs)
        tracker.tag_since(before, WRAP_CATEGORY["ddp"])
        return out

    model._pre_forward = tagged


@contextlib.contextmanager
def _strategy_tracking(tracker: Any, strategy: str) -> Iterator[None]:
    """What the tracker needs under a strategy: gradients tagged before each optimizer step (FSDP2 sets the
    sharded ``.grad`` itself, so the post-accumulate hooks on the sharded parameters never run) and, under
    FSDP2, its buffers in their own category."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    def tag_grads(optimizer: torch.optim.Optimizer, *_: Any) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        tracker.tag(grads, "gradients")

    handle = register_optimizer_step_pre_hook(tag_grads)
    try:
        if strategy != "fsdp":
            yield
            return
        tracker.op_categories = {"fsdp": FSDP_CATEGORY}
        with _follow_resize(tracker):
            yield
    finally:
        handle.remove()


def ddp_bucket_bytes(model: Any) -> int:
    """The bytes of DDP's gradient buckets, from DDP's own logging data (0 when it has none)."""
    getter = getattr(model, "_get_ddp_logging_data", None)
    if getter is None:
        return 0
    try:
        sizes = str(getter().get("bucket_sizes", ""))
    except Exception:  # noqa: BLE001 - a prototype interface of DDP's: no figure rather than a failure
        return 0
    return sum(int(s) for s in sizes.split(",") if s.strip().isdigit())


@contextlib.contextmanager
def _follow_resize(tracker: Any) -> Iterator[None]:
    """FSDP2 frees and refills unsharded parameters with ``UntypedStorage.resize_``: follow it, and count
    every storage it resizes as FSDP2's."""
    import torch

    from autobatch.explain.worker.ranks import track_resize

    with track_resize(tracker):
        followed = torch.UntypedStorage.resize_

        @functools.wraps(followed)
        def resize_(storage: torch.UntypedStorage, size: int) -> Any:
            out = followed(storage, size)
            tracker.tag_storage(storage, FSDP_CATEGORY)
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign, assignment]
        try:
            yield
        finally:
            torch.UntypedStorage.resize_ = followed  # type: ignore[method-assign]
