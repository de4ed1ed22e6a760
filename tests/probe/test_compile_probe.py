"""Compiled probes, for real: the compile's time reported apart and shared through the on-disk cache between
probes, a model that does not compile answered as such (never an OOM, never a crash), recomputation levels
carried by the request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from requesting import probe_request
from support import EXAMPLES

from autobatch.probe.client import ProbeClient
from autobatch.records.protocol import ProbeRequest

pytestmark = pytest.mark.slow  # every test starts a probe server

GIB = 1 << 30
#: A small MLP: compiling it takes seconds, not minutes, on two CPU cores.
SMALL = ["--in-features", "32", "--width", "64", "--tokens", "4", "--depth", "2", "--classes", "10"]


def _request(batch: int, **kw: object) -> ProbeRequest:
    values: dict[str, object] = dict(
        batch_size=batch,
        precision="32-true",
        optimizer="adamw",
        device="cpu",
        budget_bytes=4 * GIB,
        min_steps=3,
        max_steps=3,
        timeout=600.0,
    )
    values.update(kw)
    return probe_request(**values)  # type: ignore[arg-type]


def test_a_compiled_probe_reports_its_compile_apart_and_the_next_probe_reuses_the_cache(
    tmp_path: Path,
) -> None:
    env = {"AUTOBATCH_INDUCTOR_CACHE": str(tmp_path / "inductor")}  # cold for the first probe
    with ProbeClient(EXAMPLES / "mlp.py", SMALL, env=env) as client:
        eager = client.run(_request(8))
        first = client.run(_request(8, compile=True))
        second = client.run(_request(16, compile=True))
    assert eager.kind == first.kind == second.kind == "fits", (eager, first, second)
    assert eager.compile_seconds is None
    assert first.compile_seconds is not None and second.compile_seconds is not None
    # the step times leave the compile out: a step takes milliseconds, the compile seconds
    assert first.compile_seconds > 1.0 and max(first.step_seconds) < first.compile_seconds / 10
    assert first.samples_per_second and second.samples_per_second
    # the second probe (another process, another batch size) loads the graph the first compiled for a
    # dynamic batch dimension
    assert second.compile_seconds < first.compile_seconds / 2, (first.compile_seconds, second.compile_seconds)
    assert any((tmp_path / "inductor").iterdir())


RECORDING = """
import json, os, sys, time
import torch
from torch import nn

def build_model():
    record = {"inductor": "torch._inductor.compile_fx" in sys.modules, "parent": os.getppid()}
    with open(os.path.join(os.environ["RECORDS"], f"{time.monotonic_ns()}.json"), "w") as handle:
        json.dump(record, handle)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

def make_batch(batch_size):
    return torch.randn(batch_size, 32), torch.randn(batch_size, 1)

def compute_loss(model, batch):
    inputs, targets = batch
    return nn.functional.mse_loss(model(inputs), targets)
"""


def test_compiled_probes_fork_from_a_compiler_and_eager_ones_from_the_server_as_before(
    tmp_path: Path,
) -> None:
    script, records = tmp_path / "script" / "recording.py", tmp_path / "records"  # not the script's folder
    script.parent.mkdir()
    script.write_text(RECORDING)
    records.mkdir()
    env = {"AUTOBATCH_INDUCTOR_CACHE": str(tmp_path / "inductor"), "RECORDS": str(records)}
    with ProbeClient(script, [], env=env) as client:
        outcomes = [
            client.run(_request(8)),
            client.run(_request(8, compile=True)),
            client.run(_request(16, compile=True)),
            client.run(_request(8)),
        ]
    assert [o.kind for o in outcomes] == ["fits"] * 4, outcomes
    seen = [json.loads(path.read_text()) for path in sorted(records.iterdir(), key=lambda p: int(p.stem))]
    assert len(seen) == len(outcomes), seen  # each probe built the model once, in the order asked
    # the compiled probes found the compiler imported, by the process they forked from (the same for both); the
    # eager probe after them forked from the server, whose heap holds none of it, as an eager job's does not
    assert [r["inductor"] for r in seen] == [False, True, True, False], seen
    server, compiler = seen[0]["parent"], seen[1]["parent"]
    assert compiler != server and seen[2]["parent"] == compiler and seen[3]["parent"] == server


def test_a_model_that_does_not_compile_is_an_answer(tmp_path: Path) -> None:
    # No working C++ compiler, as on a machine without g++; a cold cache so nothing is loaded instead.
    env = {"AUTOBATCH_INDUCTOR_CACHE": str(tmp_path / "inductor"), "CXX": "/bin/false"}
    with ProbeClient(EXAMPLES / "mlp.py", SMALL, env=env) as client:
        failed = client.run(_request(8, compile=True))
        eager = client.run(_request(8))
    assert failed.kind == "error", failed
    assert failed.error_type == "CompileError" and failed.info.get("compile_error") is True
    assert (
        failed.error_message and "C++ compiler" in failed.error_message and "\n" not in failed.error_message
    )
    assert not failed.contract
    assert failed.compile_seconds is not None
    assert eager.kind == "fits"  # the script itself is fine


def test_the_request_carries_the_recomputation_level() -> None:
    with ProbeClient(EXAMPLES / "mlp.py", SMALL) as client:  # two Blocks (the script's RECOMPUTE_CLASSES)
        half = client.run(_request(8, level="1/2"))
        selective = client.run(_request(8, level="selective"))
        wrong = client.run(_request(8, level="1/12"))
    assert half.kind == selective.kind == "fits" and half.recompute_blocks == ["Block"]
    assert wrong.kind == "error" and wrong.contract and wrong.error_type == "NoBlocksError"
    assert "1 of 12 blocks, but the model holds 2 (Block x 2)" in (wrong.error_message or "")
