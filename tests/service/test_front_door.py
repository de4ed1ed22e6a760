"""One front door: the command, the Python API and the Lightning callback run one request through the same
service, so they obey the same rules: the world size, the plan, the device's lock, the result cache.

Every face runs the same request with a fake probe runner while another process holds the CPU device's
lock for a moment: each face must wait for it (and say so), plan the same micro-batch x accumulation x
world, and serve its second identical run from the cache.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pytest
from support import run_main, wire_fake_runner

import autobatch
from autobatch.testing import FakeRunner, affine

MiB = 1 << 20
CURVE = affine(400 * MiB, 1.7 * MiB)
GLOBAL = 96
#: The request, as settings; each face spells it its own way below.
REQUEST: dict[str, Any] = {
    "device": "cpu",
    "memory": "1GiB",
    "precisions": ["32-true"],
    "optimizers": ["adamw"],
    "recompute": False,
    "world_size": 2,
    "global_batch_size": GLOBAL,
}
FLAGS = (
    "-d",
    "cpu",
    "-m",
    "1GiB",
    "-p",
    "32-true",
    "-o",
    "adamw",
    "--no-recompute",
    "-w",
    "2",
    "-g",
    str(GLOBAL),
)

HOLD = textwrap.dedent(
    """
    import sys, time
    from autobatch.run.locks import RunLock
    lock = RunLock.device(sys.argv[2], "cpu (test)", folder=sys.argv[1], command="another tune")
    lock.acquire()
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
    """
)


def build_model() -> str:
    return "model"


def make_batch(batch_size: int) -> list[int]:
    return [batch_size]


def compute_loss(model: str, batch: list[int]) -> int:
    return batch[0]


@contextmanager
def device_held(seconds: float = 1.5) -> Iterator[None]:
    """Another process holds this host's CPU lock for ``seconds`` (in this test's lock folder) while the
    block starts."""
    holder = hold_device_lock(seconds)
    try:
        yield
    finally:
        holder.kill()
        holder.wait()


def hold_device_lock(seconds: float) -> subprocess.Popen[str]:
    """Another process holding this host's CPU lock for ``seconds`` (the lock folder of this test)."""
    root = Path(__file__).resolve().parents[2]
    key = f"host-{socket.gethostname()}"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, os.environ["AUTOBATCH_LOCK_DIR"], key, str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


Held = AbstractContextManager[None]


def through_the_command(
    runner: FakeRunner, caplog: pytest.LogCaptureFixture, held: Held
) -> tuple[dict[str, Any], str]:
    with held:
        code, out, err = run_main("tune", "train.py", *FLAGS, "--json")
    assert code == 0, err
    return json.loads(out), err


def through_the_api(
    runner: FakeRunner, caplog: pytest.LogCaptureFixture, held: Held
) -> tuple[dict[str, Any], str]:
    with caplog.at_level(logging.INFO, logger="autobatch"), held:
        result = autobatch.tune(
            build_model=build_model,
            make_batch=make_batch,
            compute_loss=compute_loss,
            runner=runner,
            **REQUEST,
        )
    return result.to_dict(), caplog.text


def through_the_callback(
    runner: FakeRunner, caplog: pytest.LogCaptureFixture, held: Held
) -> tuple[dict[str, Any], str]:
    pytest.importorskip("lightning")
    from lightning.pytorch import Trainer

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integrations"))  # the Lightning test app
    from lit_app import LitData, LitMLP

    from autobatch.integrations.lightning import AutoBatch

    callback = AutoBatch(runner=runner, **REQUEST)
    data = LitData(width=8, tokens=4, samples=512)
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
    )  # fmt: skip
    model = LitMLP(width=8)
    with caplog.at_level(logging.INFO, logger="autobatch"), held:
        trainer.fit(model, datamodule=data)
    assert callback.result is not None and callback.result.chosen is not None
    chosen = callback.result.chosen
    assert data.batch_size == chosen.micro_batch_size  # and it trains with it
    assert trainer.accumulate_grad_batches == chosen.accumulation_steps
    return callback.result.to_dict(), caplog.text


FACES: dict[str, Callable[[FakeRunner, pytest.LogCaptureFixture, Held], tuple[dict[str, Any], str]]] = {
    "command": through_the_command,
    "api": through_the_api,
    "callback": through_the_callback,
}
PLANS: dict[str, tuple[int, ...]] = {}


@pytest.mark.parametrize(
    "face",
    [pytest.param(face, marks=[pytest.mark.consumers] if face == "callback" else []) for face in FACES],
)
@pytest.mark.slow
def test_one_request_through_every_face(
    face: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runner = wire_fake_runner(FakeRunner(CURVE), tmp_path, monkeypatch)
    for name in ("WORLD_SIZE", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_NTASKS", "SLURM_GPUS_ON_NODE"):
        monkeypatch.delenv(name, raising=False)
    first, said = FACES[face](runner, caplog, device_held())
    assert "waiting for cpu" in said  # the device's lock was taken: it waited for the other holder
    probes = len([r for r in runner.requests if r.op == "probe"])
    assert probes > 0 and not first["cache"]["served"]
    chosen = first["chosen"]
    plan = (chosen["micro_batch_size"], chosen["accumulation_steps"], chosen["world_size"])
    assert chosen["world_size"] == 2 and plan[0] * plan[1] * plan[2] == GLOBAL
    PLANS[face] = plan
    assert len(set(PLANS.values())) == 1, PLANS  # every face planned the same

    caplog.clear()
    second, said = FACES[face](runner, caplog, nullcontext())
    assert second["cache"]["served"] and "served from the cache" in said
    assert len([r for r in runner.requests if r.op == "probe"]) == probes  # no probe ran again
    assert second["chosen"]["micro_batch_size"] == chosen["micro_batch_size"]


def test_the_api_plans_for_the_world_a_strategy_implies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = wire_fake_runner(FakeRunner(CURVE), tmp_path, monkeypatch)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    request = {k: v for k, v in REQUEST.items() if k != "world_size"}
    result = autobatch.tune(
        build_model=build_model, make_batch=make_batch, compute_loss=compute_loss, runner=runner,
        strategy="ddp", nproc_per_node=2, **request,
    )  # fmt: skip
    assert result.chosen is not None and result.chosen.world_size == 2
    assert result.chosen.micro_batch_size * result.chosen.accumulation_steps * 2 == GLOBAL
    with pytest.raises(autobatch.UsageError, match="smaller than the world size 2"):
        autobatch.tune(
            build_model=build_model, make_batch=make_batch, compute_loss=compute_loss, runner=runner,
            strategy="ddp", nproc_per_node=2, **{**request, "global_batch_size": 1},
        )  # fmt: skip


class SlowRunner(FakeRunner):
    """A fake runner whose probes take a while, so that two tunes would overlap without the lock."""

    def run(self, request: Any) -> Any:
        if request.op == "probe":
            time.sleep(0.05)
        return super().run(request)


def test_two_concurrent_api_tunes_on_one_device_queue_on_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    wire_fake_runner(FakeRunner(CURVE), tmp_path, monkeypatch)
    spans: dict[int, list[float]] = {0: [], 1: []}
    errors: list[BaseException] = []

    def one(number: int) -> None:
        try:
            autobatch.tune(
                build_model=build_model, make_batch=make_batch, compute_loss=compute_loss,
                runner=SlowRunner(CURVE), cache=False, on_probe=lambda _: spans[number].append(time.monotonic()),
                **REQUEST,
            )  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    with caplog.at_level(logging.INFO, logger="autobatch"):
        threads = [threading.Thread(target=one, args=(n,)) for n in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert not errors, errors
    assert spans[0] and spans[1]
    first, second = sorted(spans.values(), key=min)
    assert max(first) < min(second)  # one tune probed, then the other: never both at once
    assert "waiting for cpu" in caplog.text


def test_the_tune_is_resolved_once_at_the_front_door(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autobatch.service.tune import tune_request
    from autobatch.settings import load_settings

    monkeypatch.setenv("WORLD_SIZE", "4")
    (tmp_path / "train.py").write_text("")  # a script that does not exist is refused at the door
    overrides = {"script": str(tmp_path / "train.py"), "global_batch_size": GLOBAL, "strategy": "none"}
    settings = load_settings(env={}, overrides=overrides, use_default_file=False)
    request = tune_request(settings, None, refresh=True)
    options = request.options
    assert (options.world_size, options.global_batch_size, request.refresh) == (4, GLOBAL, True)
    assert "WORLD_SIZE" in options.world_size_source
    assert request.spec.is_file and Path(request.spec.target).name == "train.py"
    with pytest.raises(autobatch.UsageError, match="smaller than the world size 4"):
        small = load_settings(env={}, overrides={**overrides, "global_batch_size": 3}, use_default_file=False)
        tune_request(small, None, refresh=False)
