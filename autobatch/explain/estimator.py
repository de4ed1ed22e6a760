"""The parent side of ``autobatch estimate``: the target's budget, one estimate operation, the result.

The result is a :class:`autobatch.result.TuneResult` (its ``combinations`` in ``tune``'s schema, each
``trace`` the simulated batch sizes), so everything that reads a tune (tables, plots) reads it too.
The probe server is started without the usual inspection (which builds the model for real): every
tensor of the estimate is fake.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..core.space import combinations
from ..core.units import format_bytes
from ..errors import UsageError
from .cards import CardProfile, generic_card, get_card
from .estimate import CPU_RUNTIME_BYTES, to_combo_result

CUDA_DEFINITION = (
    "cuda (estimated): memory reserved by the caching allocator (modelled: 512 B rounding, 2 MiB / 20 MiB / "
    "own segments), budget (memory - CUDA context) x (1 - headroom)"
)


@dataclass(frozen=True)
class Target:
    """What to estimate for: ``kind`` "cpu" (capacity None: the memory available now) or "cuda"."""

    kind: str
    name: str
    capacity_bytes: int | None
    headroom: float
    card: CardProfile | None = None

    @classmethod
    def resolve(
        cls,
        *,
        card: str | None,
        device: str,
        memory: int | None,
        headroom: float,
        given_device: bool,
        memory_flag: int | None = None,
    ) -> Target:
        """``--card`` wins, then ``--device cpu``; otherwise a CUDA card of ``--memory``."""
        if card:
            if given_device and device == "cpu":
                raise UsageError("--card and --device cpu contradict each other", hint="drop one of them")
            profile = get_card(card)
            if memory_flag:
                profile = CardProfile(
                    profile.name,
                    profile.description,
                    memory_flag,
                    profile.context_bytes,
                    profile.workspace_bytes,
                    profile.bf16,
                )
            return cls("cuda", profile.name, profile.memory_bytes, headroom, profile)
        if device == "cpu":
            return cls("cpu", "cpu", memory, headroom)
        if not memory:
            raise UsageError(
                "estimate needs a target: a card, a memory size or the CPU",
                hint="pass --card NAME (autobatch estimate --list-cards), --memory 80GiB for a CUDA card, or --device cpu",
            )
        return cls("cuda", f"cuda ({format_bytes(memory)})", memory, headroom, generic_card(memory))

    def describe(self) -> str:
        if self.card is not None:
            return (
                f"{self.card.description}: {format_bytes(self.card.memory_bytes)}, CUDA context "
                f"{format_bytes(self.card.context_bytes)} and workspaces {format_bytes(self.card.workspace_bytes)} assumed"
            )
        return f"the CPU device, {format_bytes(self.capacity_bytes) if self.capacity_bytes else 'memory available now'}"


def cuda_budget_bytes(card: CardProfile, headroom: float) -> int:
    return int((card.memory_bytes - card.context_bytes) * (1 - headroom))


def run_estimate(settings: Any, target: Target, progress: Callable[[str], None] | None = None) -> Any:
    """Estimate every combination of the settings' grid on the target; returns a TuneResult."""
    from .. import __version__
    from ..devices.cpu import MALLOC_ENV, MEMORY_DEFINITION
    from ..probe.client import ProbeClient
    from ..probe.protocol import ProbeRequest
    from ..result import ComboResult, TuneResult
    from .driver import run_estimate_op

    say = progress or (lambda _text: None)
    search = settings.search
    combos = combinations(search.precisions, search.optimizers, search.recompute)
    entries: list[ComboResult | None] = []
    scenarios: list[dict[str, Any]] = []
    for combo in combos:
        if target.card is not None and not target.card.bf16 and combo.precision.startswith("bf16"):
            entry = ComboResult(combo.precision, combo.optimizer, combo.recompute, status="skipped")
            entry.reason = f"{target.card.name} has no native bfloat16"
            entries.append(entry)
            continue
        entries.append(None)
        scenarios.append({"name": combo.key, **combo.to_dict(), "transforms": {}})
    if target.kind == "cpu":
        import psutil

        capacity = target.capacity_bytes or int(psutil.virtual_memory().available)
        budget = int(capacity * (1 - target.headroom))
        definition = MEMORY_DEFINITION
        extra: dict[str, Any] = {"cpu_runtime_bytes": CPU_RUNTIME_BYTES}
    else:
        assert target.card is not None
        capacity = target.card.memory_bytes
        budget = cuda_budget_bytes(target.card, target.headroom)
        definition = CUDA_DEFINITION
        extra = {"offset": {"intercept": target.card.workspace_bytes, "basis": "card profile workspaces"}}
    if budget <= 0:
        raise UsageError(
            f"no budget left on {target.name}", hint="the card's memory must exceed its CUDA context"
        )
    options = {
        "target": target.kind,
        "scenarios": scenarios,
        "budget_bytes": budget,
        "max_batch_size": search.max_batch_size,
        "batch_multiple": search.batch_multiple,
        "optimizer_kwargs": {k: dict(v) for k, v in search.optimizer_kwargs.items()},
        **extra,
    }
    say(f"simulating {len(scenarios)} combination(s) under fake tensors (no real allocation)")
    client = ProbeClient(settings.script.script, settings.script.script_args, env=dict(MALLOC_ENV))
    try:
        request = ProbeRequest(
            batch_size=0,
            precision="32-true",
            optimizer="sgd",
            recompute=False,
            device="cpu",
            budget_bytes=0,
            timeout=settings.probe.timeout * max(1, len(scenarios)),
            recompute_classes=tuple(search.recompute_classes),
            op="estimate",
            options=options,
        )
        info = run_estimate_op(client, request, "estimating under fake tensors")
        torch_version = client.torch_version
    finally:
        client.close()
    found = iter(info.get("scenarios", []))
    combos_out = [entry if entry is not None else to_combo_result(next(found)) for entry in entries]
    device: dict[str, Any] = {
        "type": target.kind,
        "name": target.name,
        "capacity_bytes": capacity,
        "budget_bytes": budget,
        "headroom": target.headroom,
        "memory_definition": definition,
    }
    notes = [f"predicted memory = simulated step + {info.get('offset', {}).get('basis', 'offset')}"]
    if target.kind == "cpu":
        device["baseline_bytes"] = info.get("baseline_bytes")
        if (info.get("baseline_bytes") or 0) >= budget:
            notes.append("the probe process alone exceeds the budget: raise --memory")
    else:
        assert target.card is not None
        device.update(card=target.card.to_dict())
        notes.append(f"card profile {target.card.name}: {target.card.description}")
    return TuneResult(
        script=str(settings.script.script),
        script_args=list(settings.script.script_args),
        device=device,
        objective="max-batch",
        combinations=combos_out,
        status="complete",
        torch_version=torch_version,
        autobatch_version=__version__,
        notes=notes,
    )
