"""Exceptions become outcomes and outcomes become errors, in one place (autobatch.records.failures)."""

from __future__ import annotations

import pytest

from autobatch.errors import ScriptError
from autobatch.records.failures import describe_failure, raise_for
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
