"""Acceptance: a notebook defines the three functions in ``__main__``, calls ``autobatch.tune()``, and gets
the exact maximum the CLI finds on the same functions written as a script (real probe server; slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import ROOT, run_cli

pytestmark = pytest.mark.slow

#: Cheap to compute, heavy in memory: about 24 MiB of activations per sample. Under a 495 MiB cap the
#: boundary lies mid-way between two batch sizes, far from the ~1 MiB by which probe processes of two
#: different probe servers differ.
STEP = """
import torch
from torch import nn

TOKENS, WIDTH = 32768, 32


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x.mean()


def build_model():
    return Net()


def make_batch(batch_size):
    return torch.randn(batch_size, TOKENS, WIDTH)


def compute_loss(model, batch):
    return model(batch)
"""
SETTINGS = {"device": "cpu", "memory": "495MiB", "precisions": ["32-true"], "optimizers": ["adamw"],
            "recompute": False, "confirm_steps": 5}  # fmt: skip
NOTEBOOK = STEP + textwrap.dedent(f"""
    # --- the cell that tunes ---
    import json, autobatch

    events = []
    result = autobatch.tune(build_model=build_model, make_batch=make_batch, compute_loss=compute_loss,
                            on_probe=events.append, **{SETTINGS!r})
    print(json.dumps({{"result": result.to_dict(), "events": len(events), "repr": repr(result)}}))
""")


def run_notebook(
    folder: Path, cells: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The notebook's cells run as one ``python`` in ``folder`` (their ``__main__``), autobatch importable."""
    (folder / "notebook.py").write_text(cells)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "notebook.py"], cwd=folder, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_callables_in_main_get_the_clis_exact_maximum(tmp_path: Path) -> None:
    proc = run_notebook(tmp_path, NOTEBOOK, timeout=1200)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, "autobatch.tune() wrote to stdout"  # only the cell's own print
    notebook = json.loads(lines[0])
    api = notebook["result"]
    assert (
        api["script"] == "<callables from __main__>"
        and notebook["events"] == api["combinations"][0]["probes"]
    )

    (tmp_path / "step.py").write_text(STEP)
    flags = ("--device", "cpu", "--memory", "495MiB", "-p", "32-true", "-o", "adamw", "--no-recompute",
             "--confirm-steps", "5")  # fmt: skip
    cli = run_cli("tune", "step.py", *flags, "--json", cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    from_cli = json.loads(cli.stdout)

    (mine,), (theirs,) = api["combinations"], from_cli["combinations"]
    assert mine["status"] == theirs["status"] == "exact"
    assert mine["max_batch_size"] == theirs["max_batch_size"] > 1
    assert api["chosen"]["micro_batch_size"] == from_cli["chosen"]["micro_batch_size"]

    from autobatch.records.schema import result_problems

    assert result_problems(api) == [] and result_problems(from_cli) == []  # real results match the schema
    # what the notebook shows of the result: its answer in a line, not pages of its record
    shown, chosen = notebook["repr"], api["chosen"]
    assert (
        shown.startswith("<TuneResult complete: 32-true/adamw/no-recompute micro-batch ")
        and "\n" not in shown
    )
    assert f"micro-batch {chosen['micro_batch_size']} x accumulation 1 x world 1" in shown
    assert "; cpu, budget 445.50 MiB; " in shown and f"{api['probes']} probes over 1 combination" in shown
    assert len(shown) < 250, shown


def test_an_errors_traceback_in_the_notebook_shows_its_hint(tmp_path: Path) -> None:
    """An autobatch error raised in the user's own process prints as Python prints any error, its text: the
    message and, on a line of its own, the hint (the traceback showed the message alone, never the fix). Refused
    before any probe."""
    cell = "import autobatch\nautobatch.check(build_model=build_model, make_batch=make_batch, compute_loss=compute_loss, batch_size=0)\n"
    proc = run_notebook(tmp_path, STEP + cell, timeout=120)
    assert proc.returncode == 1, proc.stderr
    *_, error, hint = proc.stderr.rstrip().splitlines()
    assert error == "autobatch.errors.UsageError: batch_size=0: expected a whole number of at least 1", (
        proc.stderr
    )
    assert hint == "hint: give batch size as an int, such as batch_size=8", proc.stderr


#: A cell interrupted (Ctrl-C, the kernel's interrupt) while the tune starts: the job's fresh process, which
#: the tune starts beside its probe server, is running then (it imports torch and the step for seconds).
INTERRUPTED = STEP + textwrap.dedent(f"""
    # --- the cell that tunes, interrupted as it starts ---
    import json, os, signal, threading, time
    import psutil, autobatch

    me, seen = psutil.Process(), []

    def running(fresh=False):
        out = []
        for p in me.children(recursive=True):
            try:
                if p.status() != psutil.STATUS_ZOMBIE and (not fresh or "autobatch.probe.fresh" in p.cmdline()):
                    out.append(p.pid)
            except psutil.Error:  # gone meanwhile
                pass
        return out

    def interrupt():
        while not seen:
            seen.extend(running(fresh=True))
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        autobatch.tune(build_model=build_model, make_batch=make_batch, compute_loss=compute_loss, **{SETTINGS!r})
    except KeyboardInterrupt:
        pass
    print(json.dumps({{"fresh": seen[0], "left": running()}}))
""")


def test_an_interrupted_cell_leaves_no_fresh_process_running(tmp_path: Path) -> None:
    proc = run_notebook(tmp_path, INTERRUPTED, timeout=300, env={"AUTOBATCH_FRESH_BASELINE": "true"})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["left"] == [], report  # the fresh process (and the probe server) stopped with the cell


#: A cell whose model does not build (a name not defined yet: the cell that defines it has not run): ``check``
#: raises the script's error, and the probe server it started stops with it, and so does its hold on the device's
#: lock (a second check waited for the first's: it had not returned after 120 s; a tune's was closed already).
BROKEN = textwrap.dedent("""
    import json
    import psutil, autobatch
    import torch

    def build_model():
        return Net()  # the cell that defines Net has not run

    def make_batch(batch_size):
        return torch.randn(batch_size, 8)

    def compute_loss(model, batch):
        return model(batch).sum()

    errors, left = [], []
    for attempt in range(2):  # the cell run again: it must not wait for the first one's device lock
        try:
            autobatch.check(build_model=build_model, make_batch=make_batch, compute_loss=compute_loss,
                            batch_size=4, device="cpu", memory="600MiB")
        except Exception as exc:
            errors.append(type(exc).__name__)
        left += [p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    print(json.dumps({"errors": errors, "left": left}))
""")


def test_a_model_that_does_not_build_leaves_no_probe_server_and_no_lock(tmp_path: Path) -> None:
    proc = run_notebook(tmp_path, BROKEN, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report == {"errors": ["ScriptError", "ScriptError"], "left": []}, report


#: A notebook whose model is a class of its own (defined in ``__main__``, carried to the probes by value) and whose
#: data is a tensor prepared in a cell, run twice as two kernels are: cloudpickle gives such a class a random id in
#: each process, torch pickles a tensor under its memory address and a set of strings comes out in its hash order,
#: which made the same cells a new step each time (a tune from scratch, the first's probe journal never replayed).
OWN_CLASS = textwrap.dedent("""
    import json
    import torch
    from torch import nn
    import autobatch

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(64, 64)

        def forward(self, x):
            return self.layer(x).mean()

    NO_DECAY = {"layer.bias", "norm.weight", "embed.weight"}

    def build_model():
        model = Net()
        model.no_decay = [n for n, _ in model.named_parameters() if n in NO_DECAY]
        return model

    DATA = torch.randn(64, 256, 64, generator=torch.Generator().manual_seed(0))

    def make_batch(batch_size):
        return DATA[:batch_size]

    def compute_loss(model, batch):
        return model(batch)

    events = []
    result = autobatch.tune(build_model=build_model, make_batch=make_batch, compute_loss=compute_loss,
                            on_probe=events.append, device="cpu", memory="600MiB", precisions=["32-true"],
                            optimizers=["adamw"], recompute=False, confirm_steps=3, max_batch_size=8)
    print(json.dumps({"cache": result.cache, "probes": len(events), "max": result.combinations[0].max_batch_size}))
""")


def test_a_notebook_run_again_in_a_new_process_is_served_from_the_cache(tmp_path: Path) -> None:
    first, second = (run_notebook(tmp_path, OWN_CLASS, timeout=300) for _ in range(2))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    before, after = (json.loads(p.stdout.splitlines()[-1]) for p in (first, second))
    assert before["probes"] > 0 and not before["cache"]["served"], before
    assert after["cache"]["served"] and after["probes"] == 0, after  # no probe: the same step, the same key
    assert after["cache"]["key"] == before["cache"]["key"] and after["max"] == before["max"]


#: A cell interrupted (Ctrl-C) while a tune probes, with no result file: the interrupt carries what the probes
#: measured (it was logged as "not written" and lost), and no probe process is left.
INTERRUPTED_MEASURING = STEP + textwrap.dedent(f"""
    import json, os, signal, threading, time
    import psutil, autobatch

    def interrupt(event):
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()  # during the next probe

    try:
        autobatch.tune(build_model=build_model, make_batch=make_batch, compute_loss=compute_loss,
                       on_probe=interrupt, **{SETTINGS!r})
    except KeyboardInterrupt as stop:
        kept = stop.result
    left = [p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    print(json.dumps({{"status": kept.status, "probes": kept.combinations[0].probes, "left": left}}))
""")


def test_an_interrupted_tune_keeps_what_it_measured_on_the_interrupt(tmp_path: Path) -> None:
    proc = run_notebook(tmp_path, INTERRUPTED_MEASURING, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["status"] == "interrupted" and report["probes"] >= 1 and report["left"] == [], report
