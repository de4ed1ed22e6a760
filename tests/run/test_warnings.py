"""A run's warnings (autobatch.run.session.Warnings): each shown and kept once, whoever raises it, and every one a
note of the result once the tuner names its notes, those raised before it (a lock, the cache folder) included."""

from __future__ import annotations

from autobatch.run.session import Session, SessionWiring, Warnings
from autobatch.settings import load_settings
from autobatch.step.spec import ScriptSpec


def test_a_warning_raised_twice_is_shown_and_noted_once() -> None:
    shown: list[str] = []
    notes = ["device note"]
    warnings = Warnings(shown.append)
    warnings("the lock folder is read-only")
    warnings("the lock folder is read-only")
    warnings.keep_in(notes)
    warnings("a probe started processes")
    warnings("a probe started processes")
    warnings("the lock folder is read-only")
    assert shown == ["the lock folder is read-only", "a probe started processes"]
    assert notes == [
        "device note",
        "warning: the lock folder is read-only",
        "warning: a probe started processes",
    ]
    assert warnings.messages == shown


def test_a_session_shares_the_runs_warnings() -> None:
    shown: list[str] = []
    warnings = Warnings(shown.append)
    warnings("the cache folder is read-only")
    settings = load_settings(env={}, overrides={"script": "train.py"}, use_default_file=False)
    session = Session(settings, spec=ScriptSpec.file("train.py"), wiring=SessionWiring(warnings=warnings))
    session.warn("the cache folder is read-only")
    session.warn("processes the script started are not counted")
    assert session.warnings is warnings
    assert shown == ["the cache folder is read-only", "processes the script started are not counted"]
