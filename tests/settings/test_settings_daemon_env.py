"""The light entry point reads the ``daemon`` setting's variable as the settings do."""

from __future__ import annotations

import pytest

from autobatch.core.daemon_mode import DAEMON_ENV
from autobatch.daemon.client import _mode
from autobatch.settings import ENV_PREFIX, load_settings


@pytest.mark.parametrize("mode", ["off", "auto", "on"])
def test_the_clients_reading_of_the_variable_is_the_settings(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert DAEMON_ENV == ENV_PREFIX + "DAEMON"
    monkeypatch.setenv(DAEMON_ENV, mode)
    assert _mode([]) == load_settings().daemon.daemon == mode


def test_a_value_that_names_no_mode_is_left_to_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DAEMON_ENV, "sometimes")
    assert _mode([]) is None  # the command then reports the settings' error
