"""The registry of probe operations, in this process: typed options, errors as outcomes, unknown operations."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from requesting import probe_request

from autobatch.errors import ProbeFailure, ScriptError
from autobatch.probe import ops
from autobatch.records.failures import raise_for
from autobatch.records.protocol import ProbeOutcome, ProbeRequest


@dataclass(frozen=True)
class Knobs:
    size: int
    label: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "label": self.label}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Knobs:
        return cls(int(data["size"]), str(data.get("label", "")))


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Operations registered here do not outlive the test (the built-in ones are registered first: imported
    for the first time under the copy, they would be missing from the registry for every later test)."""
    ops.load_operations(())
    monkeypatch.setattr(ops, "_OPERATIONS", dict(ops._OPERATIONS))


def _request(op: str, options: dict[str, Any] | None = None) -> ProbeRequest:
    return probe_request(7, "32-true", "sgd", budget_bytes=0, max_steps=3, op=op, options=options or {})


def test_the_handler_gets_the_options_record() -> None:
    seen: list[Knobs] = []

    @ops.register("knobs", Knobs)
    def knobs(request: ProbeRequest, script: Any, options: Knobs) -> ProbeOutcome:
        seen.append(options)
        return ProbeOutcome(kind="fits", batch_size=request.batch_size, info={"size": options.size})

    outcome = ops.dispatch(_request("knobs", Knobs(3, "x").to_dict()), script=None)  # type: ignore[arg-type]
    assert outcome.kind == "fits" and outcome.info == {"size": 3}
    assert seen == [Knobs(3, "x")]
    assert "knobs" in ops.operations()


def test_an_operation_without_options_and_a_second_registration() -> None:
    @ops.register("plain")
    def plain(request: ProbeRequest, script: Any) -> ProbeOutcome:
        return ProbeOutcome(kind="fits", batch_size=request.batch_size)

    assert ops.dispatch(_request("plain"), script=None).batch_size == 7  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="registered twice"):
        ops.register("plain")(plain)


def test_whatever_an_operation_raises_is_an_error_outcome() -> None:
    @ops.register("broken", Knobs)
    def broken(request: ProbeRequest, script: Any, options: Knobs) -> ProbeOutcome:
        raise ValueError(f"size {options.size} is too odd")

    outcome = ops.dispatch(_request("broken", {"size": 5}), script=None)  # type: ignore[arg-type]
    assert outcome.kind == "error" and outcome.error_type == "ValueError"
    assert outcome.traceback and "too odd" in outcome.traceback
    with pytest.raises(ScriptError, match="size 5 is too odd"):
        raise_for(outcome, what="testing")
    undecodable = ops.dispatch(_request("broken", {}), script=None)  # type: ignore[arg-type]
    assert undecodable.kind == "error" and undecodable.error_type == "KeyError"


def test_an_unknown_operation_is_a_probe_failure_that_names_the_known_ones() -> None:
    outcome = ops.dispatch(_request("nowhere"), script=None)  # type: ignore[arg-type]
    assert outcome.kind == "error" and outcome.error_type == "ProbeFailure"
    with pytest.raises(ProbeFailure, match="no operation 'nowhere'") as raised:
        raise_for(outcome, what="testing")
    assert raised.value.hint and "op_modules" in raised.value.hint


def test_loading_an_operations_module_that_does_not_exist() -> None:
    with pytest.raises(ProbeFailure, match="cannot import the operations module autobatch.nowhere"):
        ops.load_operations(["autobatch.nowhere"])


def test_a_probe_reports_the_installed_modules_it_imported_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a library imports lazily (at its first call, not at its import) is named on the probe's outcome, for
    the daemon's warm parents; a module of the user's own folder is not."""
    site = tmp_path / "site-packages"
    (site / "lazylib").mkdir(parents=True)
    (site / "lazylib" / "__init__.py").write_text("def call():\n    from lazylib import heavy\n")
    (site / "lazylib" / "heavy.py").write_text("")
    (tmp_path / "mine.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(ops, "modules_at_fork", frozenset(sys.modules))
    import lazylib  # type: ignore[import-not-found]
    import mine  # type: ignore[import-not-found]  # noqa: F401

    lazylib.call()
    read, write = os.pipe()
    ops.write_outcome(write, ProbeOutcome(kind="fits"))
    os.close(write)
    with os.fdopen(read) as pipe:
        info = json.loads(pipe.read())["info"]
    assert info[ops.LAZY_IMPORTS] == ["lazylib", "lazylib.heavy"]
    for name in ("lazylib", "lazylib.heavy", "mine"):
        monkeypatch.delitem(sys.modules, name)
