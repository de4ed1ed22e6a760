"""The parent side of ``autobatch estimate``: the target's budget, one estimate operation, the result.

The result is a :class:`autobatch.records.result.TuneResult` (its ``combinations`` in ``tune``'s schema, each
``trace`` the simulated batch sizes; with ``--seq-len``, its ``lengths`` as a tune over lengths has them), so
everything that reads a tune (tables, plots) reads it too.
The probe server is started without the usual inspection (which builds the model for real): every
tensor of the estimate is fake.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autobatch.core.levels import PARTIAL
from autobatch.core.space import Combo, combinations
from autobatch.core.units import format_bytes
from autobatch.devices.cpu import MALLOC_ENV, MEMORY_DEFINITION
from autobatch.errors import UsageError
from autobatch.explain.parent.estimate_lengths import add_lengths, rows_at
from autobatch.explain.parent.per_rank_estimate import estimate_strategy, strategy_notes
from autobatch.explain.pure.cards import CardProfile, generic_card, get_card
from autobatch.explain.pure.maxima import Offset
from autobatch.explain.pure.options import ESTIMATE, OP_MODULES, EstimateOptions, NamedScenario
from autobatch.explain.pure.records import Scenario
from autobatch.probe.client import ProbeClient
from autobatch.records.failures import raise_for
from autobatch.records.result import ComboResult, TuneResult
from autobatch.records.version import __version__
from autobatch.run.session import INSPECT_COMBO, build_request, run_config

if TYPE_CHECKING:
    from autobatch.settings.groups import Settings

CUDA_DEFINITION = (
    "cuda (estimated): memory reserved by the caching allocator (modelled: 512 B rounding, 2 MiB / 20 MiB / "
    "own segments), budget (memory - CUDA context) x (1 - headroom)"
)


@dataclass(frozen=True)
class EstimateDevice:
    """The device an estimate simulates (not a device that is tuned): ``kind`` "cpu" (capacity None: the
    memory available now) or "cuda"."""

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
    ) -> EstimateDevice:
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


def estimate_combinations(
    settings: Settings, target: EstimateDevice, progress: Callable[[str], None] | None = None
) -> TuneResult:
    """Estimate every combination of the settings' grid on the target, at each ``--seq-len`` (one
    estimate operation per length: :mod:`autobatch.explain.parent.estimate_lengths`)."""
    from autobatch.run.lengths import plan_lengths
    from autobatch.step.as_is import not_measured_by
    from autobatch.step.spec import spec_from_settings

    if spec_from_settings(settings).kind == "as_is":
        raise not_measured_by("estimate", "simulates autobatch's own step under fake tensors")
    say = progress or (lambda _text: None)
    search = settings.search
    combos = combinations(search.precisions, search.optimizers, search.recompute)  # compile: not simulated
    entries, scenarios = _scenarios(combos, target)
    device = _device(target)
    options = EstimateOptions(
        budget_bytes=device["budget_bytes"],
        scenarios=tuple(scenarios),
        target=target.kind,
        max_batch_size=search.max_batch_size,
        batch_multiple=search.batch_multiple,
        optimizer_kwargs={k: dict(v) for k, v in search.optimizer_kwargs.items()},
        offset=Offset(target.card.workspace_bytes, 0.0, "card profile workspaces") if target.card else None,
        **estimate_strategy(settings),
    )
    lengths, plan = plan_lengths(search.seq_lens, settings.plan.seq_len)
    at = f" at {', '.join(map(str, lengths))} tokens" if lengths else ""
    say(f"simulating {len(scenarios)} combination(s){at} under fake tensors (no real allocation)")
    timeout = settings.probe.timeout * max(1, len(scenarios))
    infos, torch_version = _run(settings, options, timeout, lengths or (None,))
    answers = {seq_len: (rows_at(entries, info, seq_len), info) for seq_len, info in infos.items()}
    info = infos[plan]
    if target.kind == "cpu":
        device["baseline_bytes"] = info.get("baseline_bytes")
    result = TuneResult(
        script=str(settings.script.script),
        script_args=list(settings.script.script_args),
        device=device,
        objective="max-batch",
        combinations=answers[plan][0],
        status="complete",
        torch_version=torch_version,
        autobatch_version=__version__,
        notes=_notes(target, device, info) + strategy_notes(info),
    )
    if plan is not None:
        add_lengths(result, combos, answers, plan, search.batch_multiple)
    return result


def _scenarios(
    combos: list[Combo], target: EstimateDevice
) -> tuple[list[ComboResult | None], list[NamedScenario]]:
    """The scenarios to simulate, and a placeholder per combination (a skipped one's result already)."""
    entries: list[ComboResult | None] = []
    scenarios: list[NamedScenario] = []
    for combo in combos:
        skip = None
        if target.card is not None and not target.card.bf16 and combo.precision.startswith("bf16"):
            skip = f"{target.card.name} has no native bfloat16"
        elif combo.recompute_level == PARTIAL:
            skip = (
                "partial is the K a tune chooses from the measured off and full; name a level: --recompute-level "
                "K/N, the first K of the model's N repeated blocks"
            )
        if skip is not None:
            entries.append(ComboResult.of(combo, status="skipped", reason=skip))
            continue
        entries.append(None)
        level = combo.recompute_level if combo.recompute else "full"
        scenarios.append(
            NamedScenario(combo.key, Scenario(combo.precision, combo.optimizer, combo.recompute, level=level))
        )
    return entries, scenarios


def _device(target: EstimateDevice) -> dict[str, Any]:
    """The target as ``tune --json`` describes a device: capacity, budget, and how memory is counted."""
    if target.card is None:
        import psutil

        capacity = target.capacity_bytes or int(psutil.virtual_memory().available)
        budget, definition = int(capacity * (1 - target.headroom)), MEMORY_DEFINITION
    else:
        capacity = target.card.memory_bytes
        budget, definition = cuda_budget_bytes(target.card, target.headroom), CUDA_DEFINITION
    if budget <= 0:
        raise UsageError(
            f"no budget left on {target.name}", hint="the card's memory must exceed its CUDA context"
        )
    device: dict[str, Any] = {
        "type": target.kind,
        "name": target.name,
        "capacity_bytes": capacity,
        "budget_bytes": budget,
        "headroom": target.headroom,
        "memory_definition": definition,
    }
    if target.card is not None:
        device["card"] = target.card.to_dict()
    return device


def _run(
    settings: Settings, options: EstimateOptions, timeout: float, lengths: tuple[int | None, ...]
) -> tuple[dict[int | None, dict[str, Any]], str]:
    """Run the estimate operation at each length in one probe server started without inspection (every
    tensor is fake); returns each length's ``info`` and the server's torch version."""
    assert settings.script.script, "the command checks that a script is given"
    client = ProbeClient(
        settings.script.script, settings.script.script_args, env=dict(MALLOC_ENV), op_modules=OP_MODULES
    )
    infos: dict[int | None, dict[str, Any]] = {}
    try:
        for seq_len in lengths:
            run = run_config(settings, None, 0, timeout=timeout)
            request = build_request(
                settings,
                INSPECT_COMBO.at(seq_len),
                0,
                "cpu",
                run,
                steps=(0, 0),
                op=ESTIMATE,
                options=options.to_dict(),
            )
            outcome = client.run(request)
            if outcome.kind != "fits":
                at = f" at {seq_len} tokens" if seq_len is not None else ""
                raise_for(outcome, what=f"estimating under fake tensors{at}")
            infos[seq_len] = outcome.info
        return infos, client.torch_version
    finally:
        client.close()


def _notes(target: EstimateDevice, device: dict[str, Any], info: dict[str, Any]) -> list[str]:
    notes = [f"predicted memory = simulated step + {info.get('offset', {}).get('basis', 'offset')}"]
    if target.card is None:
        if (info.get("baseline_bytes") or 0) >= device["budget_bytes"]:
            notes.append("the probe process alone exceeds the budget: raise --memory")
    else:
        notes.append(f"card profile {target.card.name}: {target.card.description}")
    return notes
