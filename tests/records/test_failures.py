"""Exceptions become outcomes and outcomes become errors, in one place (autobatch.records.failures)."""

from __future__ import annotations

import pytest

from autobatch.errors import ContractError, ScriptError
from autobatch.records.failures import describe_failure, raise_for, with_larger_oom
from autobatch.records.protocol import ProbeOutcome


def test_an_exception_without_a_message_still_says_something() -> None:
    try:
        raise KeyboardInterrupt  # raised inside make_batch, as a script that catches Ctrl-C badly does
    except KeyboardInterrupt as exc:
        outcome = describe_failure(ProbeOutcome(kind="error", batch_size=8), exc)
    with pytest.raises(
        ScriptError, match=r"raised KeyboardInterrupt while making a batch: \(it carries no message\)"
    ):
        raise_for(outcome, what="making a batch")


def _as_the_probe_catches(exc: BaseException) -> BaseException:
    """``exc`` as the probe process sees it: without this test's frame (the probe's catching frame is autobatch's)."""
    assert exc.__traceback__ is not None
    exc.__traceback__ = exc.__traceback__.tb_next
    return exc


def test_an_error_autobatch_raises_on_the_scripts_data_keeps_its_traceback() -> None:
    """Every frame is autobatch's (moving a batch of meta tensors): --verbose shows them rather than nothing."""
    import torch

    from autobatch.step.loop import move

    try:
        move(torch.empty(2, device="meta"), torch.device("cpu"))
    except NotImplementedError as exc:
        outcome = describe_failure(ProbeOutcome(kind="error", batch_size=8), _as_the_probe_catches(exc))
    assert outcome.traceback is not None
    assert outcome.traceback.startswith("Traceback (most recent call last)")
    assert "autobatch/step/loop.py" in outcome.traceback and "in move" in outcome.traceback


def test_a_broken_contract_carries_no_traceback() -> None:
    """Its message and hint say it all; the CLI then promises no details under --verbose."""
    import torch

    from autobatch.step.contract import check_batch

    try:
        check_batch((torch.empty(8, 3, device="meta"),), 8)
    except ContractError as exc:
        outcome = describe_failure(ProbeOutcome(kind="error", batch_size=8), _as_the_probe_catches(exc))
    assert outcome.contract and outcome.traceback is None
    with pytest.raises(ContractError, match=r"on the meta device \(batch\[0\]\)") as raised:
        raise_for(outcome, what="a probe")
    assert raised.value.detail is None


def _oom(batch: int) -> ProbeOutcome:
    return ProbeOutcome(kind="oom", batch_size=batch, peak_bytes=600 << 20, budget_bytes=630 << 20)


def test_the_scripts_error_below_the_smallest_oom_names_both() -> None:
    error = ScriptError(
        "the training script raised ValueError while x at batch 1: Expected more", hint="fix it"
    )
    told = with_larger_oom(error, 1, [_oom(2), _oom(4), _oom(8)])
    assert type(told) is ScriptError
    assert told.message.endswith(
        "; and batch 2 ran out of memory (peak 600.00 MiB, budget 630.00 MiB), so batch 1 is the only one that "
        "could fit, and it fails"
    )
    assert told.hint is not None and "make the step run at batch 1" in told.hint and "BatchNorm" in told.hint
    assert "make batch 2 fit" in told.hint


def test_an_oom_further_up_is_named_and_the_hint_kept() -> None:
    error = ContractError("compute_loss(model, batch) returned nan at the first step", hint="a finite loss")
    told = with_larger_oom(error, 4, [_oom(16), ProbeOutcome(kind="fits", batch_size=2)])
    assert type(told) is ContractError and told.hint == "a finite loss"
    assert told.message.endswith("; and batch 16 ran out of memory (peak 600.00 MiB, budget 630.00 MiB)")


def test_without_a_larger_oom_the_error_is_unchanged() -> None:
    error = ScriptError("the training script raised ValueError", hint="fix it")
    assert with_larger_oom(error, 8, [ProbeOutcome(kind="fits", batch_size=4), _oom(4)]) is error


def test_an_error_that_says_nothing_of_memory_is_not_set_beside_an_oom() -> None:
    from autobatch.records.failures import NOTHING_OF_MEMORY

    error = ContractError(
        f"train.py ended after 3 optimizer step(s) at batch 354: not enough data; {NOTHING_OF_MEMORY}"
    )
    assert with_larger_oom(error, 354, [_oom(355)]) is error


def test_a_broken_contract_from_the_scripts_frames_keeps_its_hint_beside_its_traceback() -> None:
    """An autobatch error raised from the script's own frames (its build_model asked autobatch for recomputation
    the model cannot have) keeps its traceback for --verbose, whose last line is the message alone: the hint, in
    the error's text, is printed once, on its own line, not again at the end of the traceback."""
    from autobatch.errors import NoBlocksError

    def build_model() -> None:  # the script's frame
        raise NoBlocksError("the model has no repeated blocks", hint="name them with RECOMPUTE_CLASSES")

    try:
        build_model()
    except NoBlocksError as exc:
        assert str(exc) == "the model has no repeated blocks\nhint: name them with RECOMPUTE_CLASSES"
        outcome = describe_failure(ProbeOutcome(kind="error", batch_size=8), _as_the_probe_catches(exc))
    assert outcome.traceback is not None and "in build_model" in outcome.traceback
    assert outcome.traceback.endswith("NoBlocksError: the model has no repeated blocks\n")
    with pytest.raises(ContractError) as raised:
        raise_for(outcome, what="building the model")
    assert (raised.value.message, raised.value.hint) == (
        "the model has no repeated blocks",
        "name them with RECOMPUTE_CLASSES",
    )
    assert "hint: " not in str(raised.value.detail)  # --verbose prints the detail, then the hint
