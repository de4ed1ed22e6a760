"""The probe server's start-up wait honours --timeout (issue #10: it was a fixed 300 s)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import session_settings

from autobatch.probe.client import IMPORT_GRACE
from autobatch.run.session import Session
from autobatch.step.spec import ScriptSpec


class Started(Exception):
    pass


def test_the_start_up_wait_is_the_timeout_plus_the_import_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def client(*args: Any, **kwargs: Any) -> None:
        seen.update(kwargs)
        raise Started

    monkeypatch.setattr("autobatch.probe.client.ProbeClient", client)
    script = tmp_path / "train.py"
    script.write_text("# not imported\n")
    session = Session(session_settings(timeout=7.0), spec=ScriptSpec.file(script))
    with pytest.raises(Started):
        session.start()
    assert seen["start_timeout"] == 7.0 + IMPORT_GRACE
