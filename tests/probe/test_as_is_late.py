"""What a probe of a script run as it is waits for, in this process: the optimizers the script built, its
backward passes, and the frozen parameters it holds (:mod:`autobatch.probe.as_is_late`)."""

from __future__ import annotations

import pytest
import torch
from requesting import probe_request
from torch import nn

from autobatch.probe.as_is_late import (
    MAX_BACKWARDS_PER_STEP,
    NO_OPTIMIZER_BACKWARDS,
    WAIT_STEPS,
    LateMemory,
    frozen_parameters,
)
from autobatch.probe.progress import OPTION, read_progress
from autobatch.settings.levers import in_words


@pytest.fixture
def late(monkeypatch) -> LateMemory:
    monkeypatch.setattr(torch.optim.Optimizer, "__init__", torch.optim.Optimizer.__init__)  # restored after
    watch = LateMemory(probe_request(8, "script", "script", op="as_is"))
    watch.install()
    return watch


def test_steps_count_once_every_optimizer_built_has_stepped(late) -> None:
    critic = torch.optim.Adam(nn.Linear(4, 1).parameters())
    generator = torch.optim.Adam(nn.Linear(4, 4).parameters())
    late.step(critic, 0)
    assert late.counted_from(1) is None  # the generator is waited for
    late.step(critic, 1)
    late.step(generator, 2)  # after the critic's second counted step
    assert late.counted_from(3) == 2 and not late.notes(None)


def test_the_wait_is_capped_and_the_result_says_what_was_not_seen(late) -> None:
    critic = torch.optim.Adam(nn.Linear(4, 1).parameters())
    never = torch.optim.SGD(nn.Linear(4, 4).parameters())  # built, never stepped
    late.step(critic, 0)
    assert late.counted_from(WAIT_STEPS - 1) is None
    assert late.counted_from(WAIT_STEPS) == 0
    (note,) = late.notes(None)
    assert (
        "SGD (optimizer 2 of 2 built) that had not stepped after 32 steps" in note
        and "--max-steps" in in_words(note, "cli")  # the probe names it neutrally, the door renders it
        and "max_steps=" in in_words(note, "api")
    )
    del never  # an optimizer the script dropped is not waited for


def test_backward_passes_without_an_optimizer_stop_the_probe(late) -> None:
    errors = [late.backward() for _ in range(NO_OPTIMIZER_BACKWARDS)]
    assert errors[:-1] == [None] * (NO_OPTIMIZER_BACKWARDS - 1)
    assert errors[-1] is not None and "no torch.optim optimizer" in str(errors[-1])


def test_backward_passes_between_steps_are_capped(late) -> None:
    optimizer = torch.optim.AdamW(nn.Linear(4, 1).parameters())
    for _ in range(3):  # an accumulation of 32 steps: never stopped
        assert all(late.backward() is None for _ in range(MAX_BACKWARDS_PER_STEP))
        late.step(optimizer, 0)
    assert all(late.backward() is None for _ in range(MAX_BACKWARDS_PER_STEP))
    error = late.backward()
    assert error is not None and "33 backward passes" in str(error) and "AdamW" in str(error)


def test_frozen_parameters_in_the_optimizer_and_in_the_scripts_modules(late) -> None:
    import sys

    backbone, head, in_group = nn.Linear(8, 8), nn.Linear(8, 2), nn.Linear(2, 2)
    for p in [*backbone.parameters(), *in_group.parameters()]:
        p.requires_grad = False
    optimizer = torch.optim.AdamW([*head.parameters(), *in_group.parameters()])
    head(backbone(torch.randn(3, 8))).sum().backward()
    optimizer.step()
    found = frozen_parameters(
        [optimizer], sys._getframe()
    )  # backbone: a local here; in_group: in the optimizer
    assert {id(p) for p in found} == {id(p) for p in [*backbone.parameters(), *in_group.parameters()]}
    assert len(frozen_parameters([optimizer], None)) == 2  # without frames: the optimizer's own
    (note,) = late.notes(sys._getframe())
    assert "frozen parameters" in note and f"{8 * 8 + 8 + 2 * 2 + 2:,}" in note


def test_a_frozen_copy_of_the_model_is_no_frozen_parameter_to_come() -> None:
    """An exponential moving average of the weights (``copy.deepcopy(model).requires_grad_(False)``) is never
    unfrozen: not noted. A frozen module of other shapes beside the model still is (a backbone held apart)."""
    import copy
    import sys

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    ema = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 8)).sum().backward()
    optimizer.step()
    assert ema is not None and frozen_parameters([optimizer], sys._getframe()) == []
    encoder = nn.Linear(8, 4).requires_grad_(False)
    assert {id(p) for p in frozen_parameters([optimizer], sys._getframe())} == {
        id(p) for p in encoder.parameters()
    }


def test_the_live_line_hears_what_the_probe_waits_for(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(torch.optim.Optimizer, "__init__", torch.optim.Optimizer.__init__)
    path = str(tmp_path / "step")
    late = LateMemory(probe_request(8, "script", "script", op="as_is", options={OPTION: path}))
    late.install()
    critic, generator = (
        torch.optim.Adam(nn.Linear(4, 1).parameters()),
        torch.optim.Adam(nn.Linear(4, 4).parameters()),
    )
    late.step(critic, 0)
    late.counted_from(1)
    assert read_progress(path) == (1, "waiting for the first step of Adam (optimizer 2 of 2 built)")
    late.backward(), late.backward()
    assert read_progress(path) == (1, "2 backward passes, waiting for a step")
    late.step(generator, 1)
    late.counted_from(2)
    assert read_progress(path) == (2, "")
