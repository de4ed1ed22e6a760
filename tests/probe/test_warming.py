"""What the probe server imports before it forks: the step's third-party modules, never the user's own."""

from __future__ import annotations

import gc
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from autobatch.probe.server import lifelong_imports
from autobatch.probe.warming import describe, step_imports, warm

#: A library that loads its names lazily, as transformers does: ``from lazylib import Thing`` loads a submodule,
#: which starts a thread when ``LAZYLIB_THREAD`` is set (as some libraries' pools do).
LAZY_INIT = textwrap.dedent(
    """
    def __getattr__(name):
        if name == "Thing":
            from lazylib.thing import Thing

            return Thing
        raise AttributeError(name)
    """
)
LAZY_THING = textwrap.dedent(
    """
    import os, threading, time

    if os.environ.get("LAZYLIB_THREAD"):
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()


    class Thing:
        pass
    """
)


def _lazylib(folder: Path) -> Path:
    (folder / "lazylib").mkdir(parents=True)
    (folder / "lazylib" / "__init__.py").write_text(LAZY_INIT)
    (folder / "lazylib" / "thing.py").write_text(LAZY_THING)
    return folder


def test_the_scripts_third_party_imports_are_warmed_not_its_own_modules(tmp_path: Path) -> None:
    (tmp_path / "helpers.py").write_text("X = 1\n")
    script = tmp_path / "train.py"
    script.write_text(
        "import os, json\nimport torch.nn as nn\nfrom yaml import safe_load\nimport helpers\n"
        "from helpers import X\n\ndef build_model():\n    import psutil\n"
    )
    names = step_imports(str(script))
    assert "torch.nn" in names and "yaml" in names  # installed packages, as the script imports them
    assert "yaml:safe_load" in names  # and each name taken from one
    assert not [name for name in names if name.startswith("helpers")]  # the user's module: never here
    assert "psutil" not in names  # imported inside a function: not at the script's import
    assert "os" not in names and "json" not in names  # the standard library is already cheap


def test_a_name_a_lazy_library_loads_on_first_use_is_loaded_by_the_warm_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(_lazylib(tmp_path / "lib")))
    monkeypatch.delitem(sys.modules, "lazylib", raising=False)
    monkeypatch.delitem(sys.modules, "lazylib.thing", raising=False)
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("from lazylib import Thing, missing\n")
    names = step_imports(str(script))
    assert names == ["lazylib", "lazylib:Thing", "lazylib:missing"]
    assert warm(names) == ["lazylib", "lazylib:Thing"]  # a name that is not there is the probe's to report
    assert "lazylib.thing" in sys.modules  # loaded once, in the process the probes are forked from


def test_adapters_warm_their_library() -> None:
    assert step_imports({"kind": "hf", "target": "gpt2", "options": {}}) == ["transformers"]
    assert step_imports({"kind": "pickled", "target": "step.pkl"}) == []


def test_a_cold_start_is_said() -> None:
    assert describe({"warmed": ["torch"], "cold": None}) is None
    assert "importing numpy started 1 thread(s)" in (
        describe({"cold": "importing numpy started 1 thread(s)"}) or ""
    )


@pytest.mark.slow  # starts probe servers
@pytest.mark.parametrize("thread", [False, True], ids=["quiet", "starts-a-thread"])
def test_the_server_warms_the_names_unless_loading_them_starts_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, thread: bool
) -> None:
    from autobatch.probe.client import ProbeClient

    lib = _lazylib(tmp_path / "lib")
    monkeypatch.setenv("PYTHONPATH", f"{lib}{_pythonpath()}")
    if thread:
        monkeypatch.setenv("LAZYLIB_THREAD", "1")
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text(
        "import torch\nfrom lazylib import Thing\n\n\ndef build_model():\n    return torch.nn.Linear(4, 2)\n\n\n"
        "def make_batch(batch_size):\n    return torch.randn(batch_size, 4)\n\n\n"
        "def compute_loss(model, batch):\n    return model(batch).sum()\n"
    )
    with ProbeClient(script) as client:
        start = client.start
    if thread:  # the names load in each probe, as before; the modules stay warm and nothing is noted
        assert "lazylib" in start["warmed"] and "lazylib:Thing" not in start["warmed"], start
    else:
        assert "lazylib:Thing" in start["warmed"], start
    assert describe(start) is None


def _pythonpath() -> str:
    import os

    current = os.environ.get("PYTHONPATH")
    return f":{current}" if current else ""


def _collections_while(build: Callable[[], None]) -> Counter[int]:
    """How many collections of each generation run while ``build`` runs."""
    seen: Counter[int] = Counter()

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen[info["generation"]] += 1

    gc.callbacks.append(count)
    try:
        build()
    finally:
        gc.callbacks.remove(count)
    return seen


def test_the_servers_imports_run_young_collections_and_no_full_one() -> None:
    """Importing builds objects that live as long as the server: full collections would walk them again and
    again. Under ``lifelong_imports`` the young ones still run, the full ones do not, and the thresholds
    are the caller's again after it."""
    kept: list[list[object]] = []

    def build() -> None:  # what an import does: many long-lived containers, some short-lived cycles
        for _ in range(200_000):
            cycle: list[object] = []
            cycle.append(cycle)
            kept.append([])

    before = gc.get_threshold()
    assert _collections_while(build)[2] > 0  # the collector's defaults run full collections here
    kept.clear()
    try:
        with lifelong_imports():
            seen = _collections_while(build)
        assert seen[2] == 0 and seen[0] > 0, seen
        assert gc.get_threshold() == before
    finally:
        gc.unfreeze()  # what the context froze is this test worker's, not a server's
