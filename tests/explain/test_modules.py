"""explain's per-module figures and categories against closed forms, in this process (no probe server).

Linear M->N: M*N + N parameters, B*N output values, B*M*N multiply-adds (FlopCounterMode: 2*B*M*N FLOPs);
Conv1d: Cin*Cout*K parameters, B*S*Cin*Cout*K multiply-adds; a transformer encoder layer: 4*H^2 + 4*H
attention and 2*H*I + I + H feed-forward parameters. Optimizer state: SGD 0, momentum 1, Adam/AdamW 2
parameter-sized states (plus a 4-byte step per parameter), Adafactor a row and a column per matrix.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from autobatch.core.space import optimizer_state_bytes
from autobatch.core.step_peaks import StepRule
from autobatch.explain.pure.records import Scenario, Transforms
from autobatch.explain.worker.breakdown import Instrument
from autobatch.explain.worker.simulate import simulate
from autobatch.explain.worker.tracker import MemoryTracker
from autobatch.step.contract import UserScript
from autobatch.step.loop import StepConfig, StepReport, run_steps


def _script(
    build: Callable[[], nn.Module], batch: Callable[[int], Any], loss: Callable[..., Any]
) -> UserScript:
    return UserScript(Path("inline.py"), types.ModuleType("inline"), build, batch, loss)


def _instrumented(script: UserScript, batch_size: int, optimizer: str = "sgd", steps: int = 3) -> Instrument:
    instrument = Instrument(Transforms(), MemoryTracker())
    with instrument:
        run_steps(
            instrument.wrap(script),
            StepConfig(batch_size, "32-true", optimizer),
            StepReport(),
            StepRule(steps, steps, 0),
            peak_now=lambda: 0,
            synchronize=lambda: None,
        )
    assert instrument.count_flops("32-true", "cpu") is None
    return instrument


def _rows(instrument: Instrument) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in instrument.modules()}


def _mean_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).float().pow(2).mean()


@pytest.mark.parametrize(("m", "n", "b"), [(24, 10, 6), (7, 3, 1), (64, 32, 5)])
def test_linear(m: int, n: int, b: int) -> None:
    script = _script(lambda: nn.Sequential(nn.Linear(m, n)), lambda bs: torch.randn(bs, m), _mean_loss)
    row = _rows(_instrumented(script, b))["0"]
    assert row["type"] == "Linear"
    assert row["params"] == m * n + n and row["param_bytes"] == 4 * (m * n + n)
    assert row["output_elements"] == b * n and row["output_bytes"] == 4 * b * n
    assert row["macs"] == b * m * n and row["flops"] == 2 * b * m * n


def test_conv1d() -> None:
    cin, cout, k, s, b = 3, 5, 3, 20, 4
    script = _script(
        lambda: nn.Sequential(nn.Conv1d(cin, cout, k, padding=1, bias=False)),
        lambda bs: torch.randn(bs, cin, s),
        _mean_loss,
    )
    row = _rows(_instrumented(script, b))["0"]
    assert row["params"] == cin * cout * k
    assert row["output_elements"] == b * cout * s
    assert row["macs"] == b * s * cin * cout * k


def test_transformer_encoder_layer() -> None:
    h, heads, inner, b, s = 32, 4, 48, 2, 6
    script = _script(
        lambda: nn.TransformerEncoderLayer(h, heads, inner, dropout=0.0, batch_first=True),
        lambda bs: torch.randn(bs, s, h),
        _mean_loss,
    )
    rows = _rows(_instrumented(script, b))
    attention = sum(r["params"] for name, r in rows.items() if name.startswith("self_attn"))
    assert attention == 4 * h * h + 4 * h  # in_proj (3H^2 + 3H) + out_proj (H^2 + H)
    assert rows["linear1"]["params"] + rows["linear2"]["params"] == 2 * h * inner + inner + h
    assert rows["norm1"]["params"] == rows["norm2"]["params"] == 2 * h
    assert rows["linear1"]["macs"] == b * s * h * inner and rows["linear2"]["macs"] == b * s * inner * h
    total = sum(p.numel() for p in script.build_model().parameters())
    assert sum(r["params"] for r in rows.values()) == total


def _wide_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 8))


SHAPES = [(64, 16), (64,), (64, 64), (64,), (8, 64), (8,)]


@pytest.mark.parametrize(
    ("optimizer", "states"),
    [("sgd", 0), ("sgd-momentum", 1), ("adam", 2), ("adamw", 2), ("adafactor", None)],
)
def test_optimizer_state_against_analytic_sizes(optimizer: str, states: int | None) -> None:
    script = _script(_wide_mlp, lambda bs: torch.randn(bs, 16), _mean_loss)
    instrument = _instrumented(script, 512, optimizer)
    numel = sum(p.numel() for p in _wide_mlp().parameters())
    step_scalars = 4 * len(SHAPES) if optimizer in ("adam", "adamw", "adafactor") else 0
    if states is None:
        expected = optimizer_state_bytes("adafactor", SHAPES) + step_scalars
    else:
        expected = states * numel * 4 + step_scalars
    tracker = instrument.tracker
    assert tracker is not None
    assert tracker.live["optimizer_state"] == expected
    peak = tracker.peak.categories
    if expected:
        assert tracker.peak.step >= 2, "an activation-heavy step peaks once optimizer state exists"
    assert peak["parameters"] == numel * 4
    assert peak["optimizer_state"] == expected
    assert peak["activations"] > 0 and peak["gradients"] <= numel * 4


def test_adafactor_state_shapes_are_factored() -> None:
    matrix, cube, vector = (nn.Parameter(torch.randn(*s)) for s in ((6, 5), (3, 4, 5), (7,)))
    opt = torch.optim.Adafactor([matrix, cube, vector])
    (matrix.sum() + cube.sum() + vector.sum()).backward()
    opt.step()
    assert opt.state[matrix]["row_var"].shape == (6, 1) and opt.state[matrix]["col_var"].shape == (1, 5)
    assert opt.state[cube]["row_var"].shape == (3, 4, 1) and opt.state[cube]["col_var"].shape == (3, 1, 5)
    assert opt.state[vector]["variance"].shape == (7,)
    real = sum(v.numel() * 4 for p in (matrix, cube, vector) for k, v in opt.state[p].items() if k != "step")
    assert real == optimizer_state_bytes("adafactor", [(6, 5), (3, 4, 5), (7,)])


def test_saved_activations_are_attributed_once() -> None:
    script = _script(_wide_mlp, lambda bs: torch.randn(bs, 16), _mean_loss)
    instrument = _instrumented(script, 32)
    rows = _rows(instrument)
    # Linear 2 saves its input, the ReLU's output, which the ReLU saved already: counted at the ReLU.
    assert rows["1"]["saved_bytes"] == 32 * 64 * 4
    assert rows["2"]["saved_bytes"] == 0
    assert rows["3"]["saved_bytes"] == 32 * 64 * 4  # tanh saves its output
    # the first Linear saves the batch (counted as inputs, not as its activation)
    assert rows["0"]["saved_bytes"] == 0


def test_simulation_matches_the_real_tracked_peak() -> None:
    """Fake tensors see the same storages a real run does: same categories, same peak."""
    script = _script(_wide_mlp, lambda bs: torch.randn(bs, 16), _mean_loss)
    real = _instrumented(script, 96, "adamw")
    fake = simulate(script, Scenario("32-true", "adamw", False), 96, target="exact")
    assert fake.ok, fake.error
    assert real.tracker is not None
    assert fake.tensor_peak == real.tracker.peak.tensor_bytes
    assert fake.categories["optimizer_state"] == real.tracker.peak.categories["optimizer_state"]
    numel = 5768
    assert fake.static == {
        "parameters": 4 * numel,
        "gradients": 4 * numel,
        "optimizer_state": 2 * 4 * numel + 24,
    }
