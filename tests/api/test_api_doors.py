"""What ``autobatch.tune()`` tells a notebook: the fixes it names are keyword arguments (``memory=``,
``refresh=True``), never the command's flags; and the note on the world size says where it came from, only when
that tells something. A fake probe runner (:mod:`autobatch.testing`): the messages are the service's."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from support import FAKE_STEP

import autobatch
from autobatch.errors import ConfigError, DeviceError, NothingFitsError, UsageError
from autobatch.settings import FIELDS
from autobatch.testing import FakeRunner, affine

MiB = 1 << 20
ONE = {
    "device": "cpu",
    "memory": "1GiB",
    "precisions": ["32-true"],
    "optimizers": ["sgd"],
    "recompute": False,
}


def flags(text: str) -> list[str]:
    """The command-line flags a text names outside a quoted command (`autobatch check ... --verbose`)."""
    outside = re.sub(r"`[^`]*`", "", text)
    return re.findall(r"(?<![\w-])--[a-z][a-z-]*", outside)


@pytest.fixture(autouse=True)
def _clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(
        "AUTOBATCH_CACHE_DIR", str(tmp_path / "cache")
    )  # the journals of these fake curves alone
    for info in FIELDS:
        if info.env not in ("AUTOBATCH_CACHE_DIR", "AUTOBATCH_LOCK_DIR"):
            monkeypatch.delenv(info.env, raising=False)
    for name in ("WORLD_SIZE", "SLURM_NTASKS", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_GPUS_ON_NODE"):
        monkeypatch.delenv(name, raising=False)


def test_the_api_names_keywords_where_the_command_names_flags(caplog: pytest.LogCaptureFixture) -> None:
    runner = FakeRunner(affine(400 * MiB, 1.7 * MiB))
    with pytest.raises(DeviceError) as no_gpu:
        autobatch.tune(**FAKE_STEP, **{**ONE, "device": "cuda"}, runner=runner)
    assert 'device="cuda" asked for' in no_gpu.value.message and 'device="cpu"' in str(no_gpu.value.hint)
    with pytest.raises(ConfigError) as bad:
        autobatch.tune(**FAKE_STEP, **{**ONE, "device": "tpu"}, runner=runner)
    assert 'device="tpu": expected' in bad.value.message
    with pytest.raises(UsageError) as small:  # the fake probe process holds 300 MiB before building
        autobatch.tune(**FAKE_STEP, **{**ONE, "memory": "200MiB"}, runner=runner)
    assert "raise memory=" in str(small.value.hint)
    with pytest.raises(NothingFitsError) as none:
        autobatch.tune(**FAKE_STEP, **ONE, runner=FakeRunner(affine(2000 * MiB, 1.7 * MiB)), refresh=True)
    assert "more memory=" in str(none.value.hint)
    caplog.set_level(logging.INFO, logger="autobatch")
    first = autobatch.tune(**FAKE_STEP, **ONE, max_batch_size=64, runner=runner, refresh=True)
    served = autobatch.tune(**FAKE_STEP, **ONE, max_batch_size=64, runner=runner)
    assert served.cache and served.cache["served"]
    assert "refresh=True measures again" in caplog.text
    errors = [no_gpu.value, bad.value, small.value, none.value]
    said = [*(f"{e.message} {e.hint}" for e in errors), caplog.text, *first.notes, *served.notes]
    assert [flags(text) for text in said] == [[]] * len(said), said


def test_the_world_note_says_where_the_world_came_from_when_it_tells(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = FakeRunner(affine(400 * MiB, 1.7 * MiB))

    def world_notes(**settings: object) -> list[str]:
        result = autobatch.tune(**FAKE_STEP, **ONE, max_batch_size=64, runner=runner, **settings)  # type: ignore[arg-type]
        return [note for note in result.notes if note.startswith("world size")]

    assert world_notes() == []  # one process, nothing planned over it: nothing to say
    assert world_notes(world_size=3, global_batch_size=48) == ["world size 3 from world_size=3"]
    (alone,) = world_notes(global_batch_size=48)  # a global batch planned for one process by default
    assert "nothing gave one (no world_size=, WORLD_SIZE or SLURM variables)" in alone
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert world_notes(global_batch_size=48) == ["world size 4 from WORLD_SIZE=4"]
