"""Paths and helpers shared by the tests (imported by name: tests/ is on sys.path under pytest)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SCRIPTS = Path(__file__).resolve().parent / "scripts"

#: A tiny training script: embedding, two Linear + ReLU blocks, a head; the logits dominate per sample.
TINY = """
import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, TOKENS = 512, 64, 32
RECOMPUTE_CLASSES = ("Block",)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.linear(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.Sequential(Block(WIDTH), Block(WIDTH))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(ids)))


def build_model() -> nn.Module:
    return Net()


def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (batch_size, TOKENS), generator=generator)
    return ids, torch.randint(0, VOCAB, (batch_size, TOKENS), generator=generator)


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    ids, targets = batch
    return F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
"""


def run_folder(factory: Any) -> Path:
    """The folder every worker of this pytest run shares (a ``pytest.TempPathFactory``'s): pytest-xdist gives
    each worker a folder of its own inside it; outside xdist, the run's own."""
    base = Path(factory.getbasetemp())
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_in_the_run(kept: Path, make: Callable[[], Any]) -> Any:
    """``make()``'s answer (JSON), made by the first worker of the run that asks and kept in ``kept`` (a file of
    :func:`run_folder`) for the others."""
    from filelock import FileLock

    with FileLock(f"{kept}.lock"):
        if not kept.exists():
            kept.write_text(json.dumps(make()))
        return json.loads(kept.read_text())


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run the real command (`python -m autobatch`) in a subprocess."""
    full_env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "autobatch", *args],
        cwd=cwd or ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_main(*args: str) -> tuple[int, str, str]:
    """Run the command's ``main()`` in this process, in Typer's CliRunner isolation.

    Returns (exit code, stdout, stderr with white space folded). ``main()`` maps autobatch's errors to
    their documented exit codes, as the installed command does.
    """
    from typer.testing import CliRunner

    from autobatch.cli import main
    from autobatch.cli.app import console
    from autobatch.cli.state import STATE

    runner = CliRunner()
    argv = sys.argv
    sys.argv = ["autobatch", *args]
    # what a command's flags set for its process (--quiet, --verbose): the tests after it run as before it
    before = (STATE.verbose, STATE.quiet, console.quiet)
    try:
        with runner.isolation() as (out, err, _):
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            return code, out.getvalue().decode(), " ".join(err.getvalue().decode().split())
    finally:
        sys.argv = argv
        STATE.verbose, STATE.quiet, console.quiet = before


def wire_fake_runner(
    runner: Any,
    folder: Path,
    monkeypatch: Any,
    *,
    keep: tuple[str, ...] = ("AUTOBATCH_CACHE_DIR", "AUTOBATCH_LOCK_DIR"),
    script: str = "# the fake runner never imports it\n",
) -> Any:
    """Make every command run in-process (``run_main``) probe through ``runner``, in ``folder``, with no
    ``AUTOBATCH_*`` setting from the caller's environment but ``keep``; writes ``train.py`` there. The test's own
    lock folder is always kept: a fake run never waits for a real run's device lock on this machine."""
    from autobatch.cli.state import STATE
    from autobatch.settings import FIELDS

    monkeypatch.setattr(STATE, "runner_factory", lambda: runner)
    monkeypatch.chdir(folder)
    for info in FIELDS:
        if info.env not in (*keep, "AUTOBATCH_LOCK_DIR"):
            monkeypatch.delenv(info.env, raising=False)
    (folder / "train.py").write_text(script)
    return runner


def session_settings(
    device: str = "cpu", memory: int | None = None, headroom: float = 0.1, **probe: Any
) -> Any:
    """Settings for a session a test builds itself: the ``[device]`` section, and ``[probe]`` fields."""
    from autobatch.settings import DeviceSettings, ProbeSettings, Settings

    device_settings = DeviceSettings(device=device, memory=memory, headroom=headroom)
    return Settings(device=device_settings, probe=ProbeSettings(**probe))


def cpu_session(script: Path, memory: int = 2 << 30) -> Any:
    """A session on the CPU device with the real probe server, no journal, no headroom and no fresh-process
    measurement (start it)."""
    from autobatch.run.session import Session
    from autobatch.step.spec import ScriptSpec

    settings = session_settings(memory=memory, headroom=0.0, timeout=120, cache=False, fresh_baseline=False)
    return Session(settings, spec=ScriptSpec.file(script))


#: One combination on the CPU device, as the Python API takes it (tests with a fake runner).
ONE_COMBINATION = {
    "device": "cpu",
    "memory": "1GiB",
    "precisions": ["32-true"],
    "optimizers": ["adamw"],
    "recompute": False,
}


def _fake_model() -> str:
    return "model"


def _fake_batch(batch_size: int) -> list[int]:
    return [batch_size]


def _fake_loss(model: str, batch: list[int]) -> int:
    return batch[0]


#: A step for the API with a fake runner: nothing of it runs a tensor.
FAKE_STEP = {"build_model": _fake_model, "make_batch": _fake_batch, "compute_loss": _fake_loss}


def terminate_at(proc: subprocess.Popen[str], line: str, timeout: float = 60) -> str:
    """SIGTERM to ``proc`` once it printed ``line`` on its stdout, as a scheduler preempts a job; its stderr (it is
    killed if it has not ended ``timeout`` seconds later)."""
    try:
        assert proc.stdout is not None
        for out in proc.stdout:
            if out.strip() == line:
                break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return err


def daemon_served(place: Any, seconds: float = 30.0) -> int:
    """How many commands the daemon at ``place`` has served, once none is still listed: a client has its exit code
    when the command's output ends, a moment before the daemon counts it served (a loaded machine read 0)."""
    import time

    from autobatch.daemon.client import Client

    deadline = time.monotonic() + seconds
    while True:
        status = Client(place).status()
        if status is not None and not status["requests"]:
            return int(status["served"])
        assert time.monotonic() < deadline, f"the daemon still lists a request after {seconds} s: {status}"
        time.sleep(0.1)
