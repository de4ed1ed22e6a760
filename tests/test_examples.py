"""The examples and the fixture training scripts honour the user contract (docs/script.md).

Every script is imported the way autobatch imports it (from its path, not as ``__main__``, with its own
arguments in ``sys.argv[1:]``) and trained for a real step at a small batch. The fixtures meant to fail
are checked to fail exactly the way their tests elsewhere rely on. No memory caps here: the probe tests
own those.
"""

from __future__ import annotations

import itertools
import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

from autobatch.step.recompute import wrap_blocks

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SCRIPTS = ROOT / "tests" / "scripts"

EXAMPLE_PATHS = [
    EXAMPLES / "mlp.py",
    EXAMPLES / "cnn.py",
    EXAMPLES / "gpt.py",
    EXAMPLES / "transformer_lengths.py",
    EXAMPLES / "text_classifier.py",
]
# Fixtures that train normally at small batches (each one's failure mode needs a larger batch or an env var).
VALID_FIXTURES = [
    SCRIPTS / name
    for name in (
        "later_step_trap.py",
        "quadratic.py",
        "value_error.py",
        "sleepy.py",
        "args_echo.py",
        "crash.py",
    )
]
VALID_PATHS = [*EXAMPLE_PATHS, EXAMPLES / "lstm.py", *VALID_FIXTURES]  # lstm.py: no repeated blocks
SMALL_BATCH = 4  # below crash.py's CRASH_AT and value_error.py's data set size

_counter = itertools.count()


def load_script(path: Path, argv: Sequence[str] = ()) -> ModuleType:
    """Import a training script from its path as autobatch does: not as __main__, args in sys.argv[1:]."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_autobatch_script_{path.stem}_{next(_counter)}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = sys.argv
    sys.argv = [str(path), *argv]
    try:
        spec.loader.exec_module(module)
    finally:
        sys.argv = saved
    return module


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLEEPY_SECONDS", "0")
    monkeypatch.delenv("ARGS_ECHO_FILE", raising=False)


def tensors_in(batch: Any) -> Iterator[torch.Tensor]:
    """The tensors of a batch: a tensor, or tuples/lists/dicts of them, nested."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, dict):
        for value in batch.values():
            yield from tensors_in(value)
    elif isinstance(batch, (tuple, list)):
        for value in batch:
            yield from tensors_in(value)
    else:
        raise AssertionError(f"batch holds a {type(batch).__name__}, not tensors")


def train_step(
    module: ModuleType, model: nn.Module, optimizer: torch.optim.Optimizer, batch_size: int
) -> float:
    """One full step as autobatch runs it; returns the loss."""
    loss = module.compute_loss(model, module.make_batch(batch_size))
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0, f"loss is not a scalar: {loss!r}"
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.item())


@pytest.mark.parametrize("path", VALID_PATHS, ids=lambda p: p.stem)
@pytest.mark.slow
def test_one_training_step_gives_a_finite_scalar_loss_and_moves_the_parameters(path: Path) -> None:
    module = load_script(path)
    for name in ("build_model", "make_batch", "compute_loss"):
        assert callable(getattr(module, name, None)), f"{path.name} lacks {name}"
    model = module.build_model()
    assert isinstance(model, nn.Module)
    assert all(p.device.type == "cpu" for p in model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss = train_step(module, model, optimizer, SMALL_BATCH)
    assert math.isfinite(loss)
    moved = [not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters())]
    assert any(moved), "the optimizer step changed no parameter"


@pytest.mark.parametrize("path", VALID_PATHS, ids=lambda p: p.stem)
def test_make_batch_scales_its_leading_dimension_and_keeps_the_rest(path: Path) -> None:
    module = load_script(path)
    one = list(tensors_in(module.make_batch(1)))
    three = list(tensors_in(module.make_batch(3)))
    assert one and len(one) == len(three)
    for a, b in zip(one, three):
        assert a.shape[0] == 1 and b.shape[0] == 3
        assert a.shape[1:] == b.shape[1:], "per-sample shapes must be the fixed worst case"
        assert a.dtype == b.dtype


@pytest.mark.parametrize("path", EXAMPLE_PATHS, ids=lambda p: p.stem)
@pytest.mark.slow
def test_step_at_batch_32_runs_and_reports_its_time(path: Path) -> None:
    module = load_script(path)
    model = module.build_model()
    optimizer = torch.optim.AdamW(model.parameters())
    train_step(module, model, optimizer, 32)  # warm-up: kernels, optimizer state
    start = time.perf_counter()
    loss = train_step(module, model, optimizer, 32)
    elapsed = time.perf_counter() - start
    parameters = sum(p.numel() for p in model.parameters())
    print(f"{path.name}: {parameters:,} parameters, one AdamW fp32 step at batch 32 took {elapsed:.3f} s")
    assert math.isfinite(loss)


def _blocks(module: ModuleType, model: nn.Module) -> list[nn.Module]:
    classes = tuple(getattr(module, name) for name in module.RECOMPUTE_CLASSES)
    return [m for m in model.modules() if isinstance(m, classes)]


@pytest.mark.parametrize("path", EXAMPLE_PATHS, ids=lambda p: p.stem)
def test_recompute_classes_name_blocks_repeated_inside_a_container(path: Path) -> None:
    module = load_script(path)
    model = module.build_model()
    blocks = _blocks(module, model)
    assert len(blocks) >= 2
    # Auto-detection (no RECOMPUTE_CLASSES) looks for repeated children of a ModuleList/Sequential.
    containers = [m for m in model.modules() if isinstance(m, (nn.ModuleList, nn.Sequential))]
    assert any(sum(type(c) is type(blocks[0]) for c in m.children()) >= 2 for m in containers)


@pytest.mark.parametrize("path", EXAMPLE_PATHS, ids=lambda p: p.stem)
@pytest.mark.slow
def test_recomputing_the_blocks_gives_the_same_loss_and_gradients(path: Path) -> None:
    module = load_script(path)
    torch.manual_seed(0)
    plain = module.build_model()
    wrapped = module.build_model()
    wrapped.load_state_dict(plain.state_dict())
    assert wrap_blocks(wrapped, module.RECOMPUTE_CLASSES) == len(_blocks(module, wrapped))
    batch = module.make_batch(2)
    losses = []
    for model in (plain, wrapped):
        torch.manual_seed(
            1
        )  # the same dropout masks for both (the recomputed forward restores the RNG state)
        loss = module.compute_loss(model, batch)
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[0], losses[1])
    for (name, p), q in zip(plain.named_parameters(), wrapped.parameters()):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_script_arguments_shape_the_examples() -> None:
    mlp = load_script(
        EXAMPLES / "mlp.py", ["--width", "64", "--depth", "2", "--in-features", "32", "--tokens", "5"]
    )
    model = mlp.build_model()
    assert [b.linear.out_features for b in model.blocks] == [64, 64]
    assert mlp.make_batch(2)[0].shape == (2, 5, 32)

    cnn = load_script(EXAMPLES / "cnn.py", ["--image-size", "32", "--channels", "4"])
    assert cnn.make_batch(2)[0].shape == (2, 3, 32, 32)
    assert cnn.build_model().stem[0].out_channels == 4

    gpt = load_script(
        EXAMPLES / "gpt.py", ["--depth", "1", "--width", "32", "--heads", "2", "--seq-len", "16"]
    )
    model = gpt.build_model()
    assert len(model.blocks) == 1
    assert gpt.make_batch(2)["input_ids"].shape == (2, 16)


def test_the_classifier_masks_its_padding_and_batches_the_longest_texts() -> None:
    classifier = load_script(EXAMPLES / "text_classifier.py", ["--depth", "2", "--texts", "64"])
    assert int(classifier.LENGTHS.min()) < classifier.ARGS.max_len  # the data has padding
    ids, labels = classifier.make_batch(3)
    assert ids.shape == (3, 32) and labels.shape == (3,) and bool((ids != 0).all())  # the worst case
    model = classifier.build_model().eval()
    short = classifier.IDS[:2]
    trimmed = short[:, : int(classifier.LENGTHS[:2].max())]
    # padding changes nothing: the padded texts and the same texts cut at their batch's longest agree
    torch.testing.assert_close(model(short), model(trimmed), rtol=1e-4, atol=1e-5)


def test_examples_ignore_arguments_they_do_not_own() -> None:
    gpt = load_script(EXAMPLES / "gpt.py", ["--not-ours", "1", "positional", "--depth", "2"])
    assert gpt.ARGS.depth == 2


def test_defaults_hold_without_arguments() -> None:
    assert load_script(EXAMPLES / "gpt.py").ARGS.seq_len == 64
    assert load_script(EXAMPLES / "mlp.py").ARGS.width == 256
    assert load_script(EXAMPLES / "cnn.py").ARGS.image_size == 64


def test_gpt_rejects_a_width_its_heads_do_not_divide() -> None:
    with pytest.raises(SystemExit):
        load_script(EXAMPLES / "gpt.py", ["--width", "30", "--heads", "4"])


def test_gpt_shares_the_embedding_with_the_head() -> None:
    model = load_script(EXAMPLES / "gpt.py").build_model()
    assert model.lm_head.weight is model.token_embedding.weight


@pytest.mark.parametrize("path", EXAMPLE_PATHS, ids=lambda p: p.stem)
@pytest.mark.slow
def test_examples_train_when_run_directly(path: Path) -> None:
    small = {
        "mlp": ["--width", "64"],
        "cnn": ["--image-size", "16"],
        "gpt": ["--seq-len", "16", "--depth", "1"],
        "transformer_lengths": ["--depth", "2"],
        "text_classifier": ["--depth", "2"],
    }
    done = subprocess.run(
        [sys.executable, str(path), *small[path.stem]],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "step 2: loss" in done.stdout


# --- fixtures that must fail, and how ---------------------------------------------------------------


def test_missing_loss_lacks_compute_loss_only() -> None:
    module = load_script(SCRIPTS / "missing_loss.py")
    assert callable(module.build_model) and callable(module.make_batch)
    assert not hasattr(module, "compute_loss")


def test_bad_loss_returns_one_value_per_sample() -> None:
    module = load_script(SCRIPTS / "bad_loss.py")
    loss = module.compute_loss(module.build_model(), module.make_batch(5))
    assert loss.shape == (5,)


def test_raises_on_import_raises_runtime_error() -> None:
    with pytest.raises(RuntimeError, match="fails at import time"):
        load_script(SCRIPTS / "raises_on_import.py")


def test_value_error_refuses_batches_above_its_data_set() -> None:
    module = load_script(SCRIPTS / "value_error.py")
    assert module.make_batch(64)[0].shape[0] == 64
    with pytest.raises(ValueError, match=r"^batch_size 65 exceeds the dataset's 64 samples$"):
        module.make_batch(65)


def test_sleepy_sleeps_as_long_as_told(monkeypatch: pytest.MonkeyPatch) -> None:
    module = load_script(SCRIPTS / "sleepy.py")
    monkeypatch.setenv("SLEEPY_SECONDS", "0.3")
    start = time.monotonic()
    module.build_model()
    assert time.monotonic() - start >= 0.3


def test_args_echo_reads_its_width_and_echoes_its_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_script(SCRIPTS / "args_echo.py").WIDTH == 8
    echo = tmp_path / "echo.json"
    monkeypatch.setenv("ARGS_ECHO_FILE", str(echo))
    module = load_script(SCRIPTS / "args_echo.py", ["--width", "7", "--other", "x"])
    assert module.WIDTH == 7
    assert module.ARGV == ["--width", "7", "--other", "x"]
    assert json.loads(echo.read_text()) == {"argv": ["--width", "7", "--other", "x"], "width": 7}
    assert module.make_batch(3)[0].shape == (3, 7)


@pytest.mark.slow
def test_crash_kills_its_process_by_sigabrt_at_batch_8() -> None:
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('crash_fixture', sys.argv[1])\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "m.compute_loss(m.build_model(), m.make_batch(7)).backward()\n"
        "print('batch 7 trained', flush=True)\n"
        "m.compute_loss(m.build_model(), m.make_batch(8))\n"
        "print('unreachable', flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(SCRIPTS / "crash.py")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -signal.SIGABRT
    assert done.stdout.splitlines() == ["batch 7 trained"]


def test_quadratic_keeps_a_batch_by_batch_matrix_for_backward() -> None:
    module = load_script(SCRIPTS / "quadratic.py")
    model = module.build_model()
    shapes: list[tuple[int, ...]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        module.compute_loss(model, module.make_batch(37)).backward()
    assert (37, 37) in shapes


def test_later_step_trap_allocates_two_parameter_sized_states_at_the_first_step() -> None:
    module = load_script(SCRIPTS / "later_step_trap.py")
    model = module.build_model()
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    table_bytes = module.VOCAB * module.DIM * 4
    assert table_bytes == 64 * 2**20 and parameter_bytes < 1.01 * table_bytes
    optimizer = torch.optim.AdamW(model.parameters())
    loss = module.compute_loss(model, module.make_batch(2))
    loss.backward()
    assert not optimizer.state, "no optimizer state before the first step"
    optimizer.step()
    state_bytes = sum(
        value.numel() * value.element_size()
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0
    )
    assert state_bytes == 2 * parameter_bytes
    # Per sample the embedding output is TOKENS x DIM fp32 values: 0.5 MiB, the docstring's A(b) / b.
    assert module.TOKENS * module.DIM * 4 == 2**19
