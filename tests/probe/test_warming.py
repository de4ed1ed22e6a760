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


#: ``from transformers import Trainer`` loads pyarrow, whose allocators start a jemalloc background thread and
#: reserve address space by what they find; the data memory it leaves, as a probe reads it.
TRAINER_IMPORT = (
    "import sys\nimport torch\nfrom autobatch.probe.warming import Warming, thread_count\n"
    "warming = Warming(fork_safe=True, data_limit=int(sys.argv[1]) or None)\nbefore = thread_count(True)\n"
    "with warming.importing():\n    from transformers import Trainer\n"
    "data = [l for l in open('/proc/self/status') if l.startswith('VmData')][0].split()[1]\n"
    "print(int(data) * 1024, thread_count() - thread_count(True), thread_count(True) - before)\n"
)


@pytest.mark.slow  # two Pythons import transformers
def test_trainer_imported_under_the_budget_reserves_what_a_capped_probe_would() -> None:
    import subprocess

    def imported(limit: int) -> tuple[int, int, int]:
        out = subprocess.run(
            [sys.executable, "-c", TRAINER_IMPORT, str(limit)], capture_output=True, text=True, check=True
        )
        data, fork_safe, others = (int(x) for x in out.stdout.split())
        return data, fork_safe, others

    free, free_safe, free_others = imported(0)
    capped, capped_safe, capped_others = imported(900 << 20)
    # the jemalloc thread is the only one the import starts, and the one that is not counted
    assert free_safe == capped_safe == 1 and free_others == capped_others == 0
    assert free > 1 << 30  # unlimited, its allocators reserve over a GiB of data memory
    assert capped < 900 << 20  # under the cap they fit it, as in a probe that imports them itself


HF_STEP = textwrap.dedent(
    """
    import torch
    from transformers import Trainer  # noqa: F401  (as a Trainer script imports it)


    def build_model():
        return torch.nn.Linear(8, 2)


    def make_batch(batch_size):
        return torch.randn(batch_size, 8)


    def compute_loss(model, batch):
        return model(batch).pow(2).mean()
    """
)


@pytest.mark.slow  # starts a probe server
@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_a_trainer_script_s_probes_fork_with_trainer_loaded_under_the_cpu_budget(
    tmp_path: Path, device: str
) -> None:
    from support import session_settings

    from autobatch.core.space import Combo
    from autobatch.devices.selection import resolve_targets
    from autobatch.run.session import Session
    from autobatch.step.spec import ScriptSpec

    script = tmp_path / "train.py"
    script.write_text(HF_STEP)
    # the probes alone (the job's fresh process of this script: the next test)
    settings = session_settings(
        device=device, memory=1 << 30, headroom=0.1, timeout=120, cache=False, fresh_baseline=False
    )
    # as a tune runs it: ``auto`` resolved from the inventory before the server starts (the CPU here)
    target = resolve_targets(device, 1 << 30)[0]
    if target.device != "cpu":
        pytest.skip("a GPU is visible: auto is not the CPU device here")
    with Session(settings, spec=ScriptSpec.file(script), target=target) as session:
        start = session.runner.client.start
        # before, the jemalloc thread restarted the server and every probe loaded Trainer itself (2.2 s here)
        assert "transformers:Trainer" in start["warmed"] and describe(start) is None, start
        probe = session.probe(Combo("32-true", "adamw"), 8, min_steps=3, max_steps=3)
    # forked with the reservations an import under the cap makes (unlimited, the probe would start at 1.4 GiB)
    assert probe.fits and probe.peak_bytes is not None and probe.peak_bytes < 800 << 20, probe


@pytest.mark.slow  # a check command
def test_a_job_process_that_holds_the_budget_before_building_is_refused_not_fitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    monkeypatch.setenv("AUTOBATCH_FRESH_BASELINE", "true")  # what this test is about (the suite turns it off)

    # The job's fresh process imports the script, and so Trainer, before any cap: its allocators reserve 1.2 GiB.
    # Counted as that process, a probe holds more than the budget before building: refused, as the inspection
    # refused it when it imported Trainer itself (a fitted probe "peak 1.38 GiB of budget 921.60 MiB" is wrong).
    script = tmp_path / "train.py"
    script.write_text(HF_STEP)
    command = [sys.executable, "-m", "autobatch", "check", str(script), "--device", "cpu", "--memory", "1GiB"]
    proc = subprocess.run([*command, "-b", "8", "--no-cache"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the CPU budget 921.60 MiB is below what a probe process holds before building" in proc.stderr
    assert "hint: raise --memory" in proc.stderr and "Traceback" not in proc.stderr
