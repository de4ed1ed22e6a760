"""How each door names a lever: the neutral form a probe or a note writes, rendered in the door's words."""

from __future__ import annotations

from autobatch.records.result import Circumstance, warning_note
from autobatch.settings.levers import in_words, neutral


def test_a_lever_is_named_as_each_door_writes_it() -> None:
    text = f"pass {neutral('nproc_per_node', 2)} or {neutral('strategy', 'none')}; raise {neutral('memory')}"
    assert in_words(text, "cli") == "pass --nproc-per-node 2 or --strategy none; raise --memory"
    assert in_words(text, "api") == 'pass nproc_per_node=2 or strategy="none"; raise memory='


def test_a_circumstance_stays_one_when_its_levers_are_worded() -> None:
    """A circumstance's note (true of the run that measured) naming a lever: worded, it must stay a
    Circumstance, or a result served from the cache repeats it as its own warning (the launcher's variables)."""
    note = warning_note(Circumstance(f"a worker of a launched job: set {neutral('nproc_per_node')}"))
    worded = in_words(note, "cli")
    assert isinstance(worded, Circumstance) and worded.endswith("set --nproc-per-node")
    assert type(in_words("plain " + neutral("memory"), "cli")) is str
