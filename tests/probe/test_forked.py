"""A probe server forked from a warm process (autobatch.probe.forked) counts its probes as the job's fresh
process, as a server started as a fresh Python does, also after a restart that starts the other kind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import EXAMPLES, ROOT

from autobatch.devices.cpu import MALLOC_ENV

pytestmark = pytest.mark.slow  # real probe servers

#: A process started as the daemon starts its warm one (the CPU device's allocator pinned, what it imports
#: imported), marked warm as a
#: command forked from it is; a session with the fresh-process measurement probes batch 8 on the server forked
#: from it, then on a server started as a fresh Python (what the busy CPU's switch starts: OpenMP reads its wait
#: policy as it loads, so a fork cannot give it), and prints both readings.
DRIVER = """
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
from support import session_settings
from autobatch.core.space import Combo
from autobatch.probe import forked
from autobatch.probe.yielding import YIELDING_ENV
from autobatch.run.session import Session
from autobatch.step.spec import ScriptSpec

import torch, autobatch.cli, autobatch.service.tune  # what the daemon's warm process imports
from autobatch.probe.ops import load_operations
from autobatch.probe.server import preload
load_operations(())
preload()
held = bytearray(32 << 20)  # what a command holds beside its imports (the daemon's held 14 MiB more)
forked.enable(os.environ)
settings = session_settings(memory=2 << 30, headroom=0.0, timeout=120, cache=False, fresh_baseline=True)
with Session(settings, spec=ScriptSpec.file(sys.argv[2])) as session:
    session.runner.switched = True  # the switch below, not one a busy machine makes on its own before it
    client = session.runner.client
    first = client.cold
    before = session.probe(Combo("32-true", "adamw"), 8, min_steps=3, max_steps=3)
    client.reopen(YIELDING_ENV)
    after = session.probe(Combo("32-true", "adamw"), 8, min_steps=3, max_steps=3)
    print(json.dumps({"first": first, "second": client.cold, "offsets": session.fresh_offsets,
                      "before": before.to_dict(), "after": after.to_dict()}))
"""


def test_a_server_restarted_as_a_fresh_python_counts_its_probes_as_the_forked_one_did() -> None:
    env = {**os.environ, **MALLOC_ENV, "PYTHONPATH": str(ROOT)}
    env.pop("OMP_WAIT_POLICY", None)
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(ROOT), str(EXAMPLES / "mlp.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["first"] is None, "the first server is forked from the warm process"
    assert "OMP_WAIT_POLICY" in seen["second"], seen["second"]
    assert seen["offsets"], done.stderr[-3000:]
    before, after = seen["before"], seen["after"]
    assert before["kind"] == after["kind"] == "fits", (before, after)
    # the forked server carries the warm process's session and imports: counted with the offset measured
    # against it, the fresh server's probe would read as much less as it holds less
    assert abs(after["peak_bytes"] - before["peak_bytes"]) < 2 << 20, (
        before["peak_bytes"],
        after["peak_bytes"],
    )


def test_a_command_of_a_warm_parent_forks_its_server_only_under_the_warm_up_its_libraries_were_imported_under(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A library imported under one data limit reserves by it: a server whose budget is smaller is not forked
    from a warm parent that imported under the larger one (autobatch.daemon.parents); a larger one is."""
    from autobatch.devices.cpu import cores
    from autobatch.probe import forked
    from autobatch.probe.warming import Warming

    env = dict(os.environ)
    monkeypatch.setattr(forked, "_warm", forked.load_time_env(env))
    monkeypatch.setattr(forked, "_threads", 10_000)  # this test's process: whatever its threads
    monkeypatch.setattr(forked, "_lineage", None)
    monkeypatch.setattr(forked, "_cores", cores() + 1)  # torch imported on more cores than this process has
    why = forked.why_cold(env, None)
    assert why is not None and f"it may run on {cores()} core(s), the warm process on {cores() + 1}" in why
    monkeypatch.setattr(forked, "_cores", cores())
    imported = Warming(fork_safe=True, data_limit=600 << 20)
    assert forked.why_cold(env, imported) is None and forked.lineage() == ""
    forked.descend(
        {"key": "k", "modules": ["transformers", "transformers:Trainer"], "warming": imported.to_dict()}
    )
    assert forked.why_cold(env, imported) is None
    assert forked.why_cold(env, None) is None  # whatever the warm-up: the load-time environment decides
    # a larger budget: the parent's imports reserved less than the server's own would, which the offset counts
    assert forked.why_cold(env, Warming(fork_safe=True, data_limit=700 << 20)) is None
    why = forked.why_cold(env, Warming(fork_safe=True, data_limit=500 << 20))
    assert why is not None and "imported transformers, transformers:Trainer under a larger warm-up" in why
    assert forked.why_cold(env, Warming(fork_safe=True, data_limit=None)) is None  # a GPU's: no limit
    forked.descend({"key": "k", "modules": ["lightning"], "warming": Warming(fork_safe=True).to_dict()})
    assert forked.why_cold(env, imported) is not None  # imported unlimited (a GPU's): not for a CPU budget
    assert forked.lineage() != ""  # what is kept per warm process is kept per parent too


def test_a_command_that_started_cudas_driver_forks_no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.cuda.is_available()`` starts CUDA's driver without a context on a torch built with CUDA, after which
    torch refuses CUDA in every forked child while ``torch.cuda.is_initialized()`` stays False: a probe server
    forked from such a command could run no CUDA probe. The CPU build here stands in for the CUDA build's calls
    as tests/libs/gpukernels does (a ``pthread_atfork`` child handler sets the flag ``_is_in_bad_fork`` reads)."""
    import torch

    from autobatch.devices.cpu import cores
    from autobatch.probe import forked

    env = dict(os.environ)
    monkeypatch.setattr(forked, "_warm", forked.load_time_env(env))
    monkeypatch.setattr(forked, "_threads", 10_000)
    monkeypatch.setattr(forked, "_lineage", None)
    monkeypatch.setattr(forked, "_cores", cores())
    assert forked.why_cold(env, None) is None
    marked: list[bool] = []

    def device_count() -> int:
        os.register_at_fork(after_in_child=lambda: marked.append(True))
        return 0

    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", device_count, raising=False)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: bool(marked))
    assert forked.why_cold(env, None) is None  # a CUDA build whose driver nothing started: forks use CUDA
    assert not torch.cuda.is_available() and not torch.cuda.is_initialized()
    why = forked.why_cold(env, None)
    assert why is not None and why.startswith(
        "the command started CUDA's driver (torch.cuda.is_available()"
    ), why
