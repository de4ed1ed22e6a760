"""Memory that arrives late in a script run as it is: what its probe waits for, and what it cannot see.

An optimizer's state appears at its first ``step()``, and frozen parameters add their gradients, optimizer
state and activations once the script unfreezes them; a probe that stops after a few steps of its first
optimizer misses both. :class:`LateMemory` (used by :class:`autobatch.probe.as_is_watch.StepWatch`) waits
for every optimizer's first step, stops a script that updates its parameters itself, and notes frozen
parameters.
"""

from __future__ import annotations

import weakref
from types import FrameType
from typing import Any

from autobatch.core.units import format_bytes
from autobatch.errors import ContractError
from autobatch.probe.progress import OPTION, write_step
from autobatch.records.protocol import ProbeRequest
from autobatch.settings.levers import neutral

#: Steps of the first optimizer a probe waits for the others' first steps (``max_steps``, when larger).
WAIT_STEPS = 32
#: Backward passes without any ``torch.optim.Optimizer`` built after which a script updates its parameters itself.
NO_OPTIMIZER_BACKWARDS = 5
#: Most backward passes a probe waits for an optimizer step (a script's own accumulation of more takes that many).
MAX_BACKWARDS_PER_STEP = 32


class LateMemory:
    """The optimizers a probe's script builds and steps, its backward passes, and its frozen parameters.

    (A GAN whose generator first steps at iteration 10; a fine-tuning script that unfreezes its backbone after
    20 steps.) It:

    * tracks every ``torch.optim.Optimizer`` the script builds (a wrapper around ``Optimizer.__init__``, which
      every subclass's constructor calls) and counts its steps only from the step at which every one of them has
      stepped once: the steps then follow the rule of every probe. It waits at most :data:`WAIT_STEPS` steps of
      the first optimizer (or ``max_steps``, when larger); an optimizer still waited for then is named in a note;
    * counts the backward passes (``torch.autograd.backward``, which ``Tensor.backward`` calls, wrapped by
      :class:`autobatch.probe.as_is_watch.BackwardCount`): a script that has run :data:`NO_OPTIMIZER_BACKWARDS` of
      them without building a ``torch.optim.Optimizer`` updates its parameters itself, and one that runs more than
      :data:`MAX_BACKWARDS_PER_STEP` without an optimizer step would make a probe of minutes: both are stopped, with
      what the probe waited for;
    * notes frozen parameters, when it reports: those of the optimizers' groups, and those of the modules the
      script's frames hold (its globals, its functions' locals), that require no gradient and have no optimizer state.
    """

    def __init__(self, request: ProbeRequest) -> None:
        self.request = request
        self.built: list[weakref.ref[Any]] = []  # every torch.optim.Optimizer the script built, in order
        self.stepped: set[int] = set()  # id() of those that stepped
        # steps that counted before the latest first step of an optimizer (the steps that count come after)
        self.since = 0
        self.backwards = 0  # backward passes since the last optimizer step
        self.unseen: list[str] = []  # optimizers still waited for when the wait ended
        self.counted = 0  # steps that counted so far
        self.progress = request.options.get(OPTION)  # the live line's file (the CLI's, on a terminal)

    def install(self) -> None:
        from torch.optim import Optimizer

        original = Optimizer.__init__
        built = self.built

        def tracked(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            original(optimizer, *args, **kwargs)
            built.append(weakref.ref(optimizer))

        Optimizer.__init__ = tracked  # type: ignore[method-assign,assignment]

    # -- what the watch tells it ----------------------------------------------------------------

    def step(self, optimizer: Any, counted: int) -> None:
        """Any optimizer stepped, after ``counted`` steps that counted."""
        self.backwards = 0
        if id(optimizer) not in self.stepped:
            self.stepped.add(id(optimizer))
            self.since = counted  # its state exists from the next step that counts on

    def backward(self) -> ContractError | None:
        """A backward pass ended: the error that stops the probe when it has waited enough for a step."""
        self.backwards += 1
        batch = self.request.batch_size
        if self.progress and self.backwards > 1:
            write_step(
                str(self.progress), self.counted, f"{self.backwards} backward passes, waiting for a step"
            )
        if not self._alive() and self.backwards >= NO_OPTIMIZER_BACKWARDS:
            return ContractError(
                f"no torch.optim optimizer: the script ran {self.backwards} backward passes at batch {batch} and "
                "built no torch.optim.Optimizer, so it updates its parameters itself (p.data -= lr * p.grad), and "
                "a probe of a script run as it is measures up to its optimizer steps, which it never sees",
                hint="train with a torch.optim optimizer (torch.optim.SGD(model.parameters(), lr=...) makes the "
                "same update as p.data -= lr * p.grad), or define build_model, make_batch and compute_loss so "
                "that autobatch runs the step itself (see examples/)",
            )
        if self.backwards > MAX_BACKWARDS_PER_STEP:
            names = ", ".join(sorted({type(o).__name__ for o in self._alive()}))
            return ContractError(
                f"waited for an optimizer step: the script ran {self.backwards} backward passes at batch {batch} "
                f"without a step of its {names} (a probe waits at most {MAX_BACKWARDS_PER_STEP} backward passes "
                "for each step: it needs several steps, and each would take as many)",
                hint="if the script accumulates gradients over many micro-batches, let the plan set that: pass "
                "{accum} where it takes the number (for example --accumulate {accum}: 1 in every probe, the plan's "
                "accumulation steps in the command the tune prints)",
            )
        return None

    def counted_from(self, counted: int) -> int | None:
        """Where the steps that count start (an index into the peaks of the ``counted`` steps so far), or None
        while an optimizer the script built has not stepped and the wait is not over."""
        waiting = self._waiting()
        self.counted = counted
        if self.progress:
            write_step(
                str(self.progress),
                counted,
                f"waiting for the first step of {', '.join(waiting)}" if waiting else "",
            )
        if waiting and counted < max(WAIT_STEPS, self.request.max_steps):
            return None
        if waiting:
            self.unseen = waiting
        return self.since

    # -- what it says ---------------------------------------------------------------------------

    def notes(self, frame: FrameType | None) -> list[str]:
        """The result's notes on memory the probe could not see: optimizers that never stepped, frozen
        parameters (``frame``: where to start looking for the script's modules)."""
        notes = []
        if self.unseen:
            notes.append(
                f"the script built {', '.join(self.unseen)} that had not stepped after "
                f"{max(WAIT_STEPS, self.request.max_steps)} steps of its first optimizer: the memory of its first "
                "step (its state, the step's temporaries) is not in the probes, and the job can run out of memory "
                f"there; if it steps later, raise {neutral('max_steps')} past that step (the probe waits as many steps)"
            )
        frozen = frozen_parameters([o for o in self._alive()], frame)
        if frozen:
            count = sum(p.numel() for p in frozen)
            size = sum(p.numel() * p.element_size() for p in frozen)
            notes.append(
                f"the script holds {count:,} frozen parameters ({format_bytes(size)}, requires_grad=False, no "
                "optimizer state): when it unfreezes them, their gradients, optimizer state and saved activations "
                "add memory the probes did not see; if the job unfreezes them after N steps, tune with "
                f"{neutral('steps')} above N (for example {neutral('steps', 25)} when it unfreezes after 20)"
            )
        return notes

    def _alive(self) -> list[Any]:
        return [o for o in (ref() for ref in self.built) if o is not None]

    def _waiting(self) -> list[str]:
        """The optimizers built that have not stepped (their class and place: ``Adam (optimizer 2 of 2 built)``)."""
        alive = [(n, ref()) for n, ref in enumerate(self.built, 1)]
        return [
            f"{type(o).__name__} (optimizer {n} of {len(alive)} built)"
            for n, o in alive
            if o is not None and id(o) not in self.stepped
        ]


def frozen_parameters(optimizers: list[Any], frame: FrameType | None) -> list[Any]:
    """Parameters that require no gradient and have no optimizer state: those of the optimizers' groups, and
    those of every ``torch.nn.Module`` a frame from ``frame`` outwards holds in its locals (a module's frame:
    its globals), but a frozen copy of a module that trains (the same parameter shapes: an exponential moving
    average of the model's weights, ``copy.deepcopy(model).requires_grad_(False)``), which is never unfrozen (a
    red-team's EMA script was told of 5.3 M frozen parameters to come)."""
    import torch

    params: dict[int, Any] = {}
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            params.update((id(p), p) for p in group["params"])
    modules: dict[int, torch.nn.Module] = {}
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if isinstance(value, torch.nn.Module):
                modules.setdefault(id(value), value)
        frame = frame.f_back
    trained = {_shapes(m) for m in modules.values() if any(p.requires_grad for p in m.parameters())}
    for module in modules.values():
        own = list(module.parameters())
        if any(p.requires_grad for p in own) or _shapes(module) not in trained:
            params.update((id(p), p) for p in own)
    state = {id(p) for optimizer in optimizers for p in optimizer.state}
    return [p for p in params.values() if not p.requires_grad and id(p) not in state]


def _shapes(module: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(p.shape) for p in module.parameters())
