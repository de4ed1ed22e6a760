"""The ``AutoBatch`` callback's own words and its cache key: the fixes it names are its keyword arguments, the
world size it was handed by the Trainer is the Trainer's; and a module without ``save_hyperparameters()``,
shipped to the probes with its random weights, keys the same cache entry in every run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import SCRIPTS

if importlib.util.find_spec("lightning") is None:  # found, not imported: collection stays quick
    pytest.skip("lightning is not installed", allow_module_level=True)

MiB = 1 << 20
SCRIPT = SCRIPTS / "lightning" / "no_hparams.py"


def fit(callback: object, module: object = None) -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from no_hparams import Classifier  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(SCRIPT.parent))
    from lightning.pytorch import Trainer

    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
    )  # fmt: skip
    trainer.fit(module if module is not None else Classifier(width=16, depth=1))


def test_the_callback_names_its_keywords_and_the_trainers_world(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autobatch.errors import UsageError
    from autobatch.integrations.lightning import AutoBatch
    from autobatch.testing import FakeRunner, affine

    monkeypatch.setenv("AUTOBATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    runner = FakeRunner(affine(400 * MiB, 1.7 * MiB))  # its probe process holds 300 MiB before building
    with pytest.raises(UsageError) as small:
        fit(AutoBatch(memory="200MiB", runner=runner))
    assert "raise memory=" in str(small.value.hint) and "--memory" not in str(small.value.hint)
    callback = AutoBatch(memory="1GiB", global_batch_size=8, runner=runner)
    fit(callback)
    assert callback.result is not None
    assert not [
        note for note in callback.result.notes if "world size" in note
    ]  # the Trainer's 1, planned on 1


@pytest.mark.slow  # one probe server
def test_a_probes_refusal_names_the_callbacks_keyword(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe process writes its hint before any door is known; the callback's user reads its keyword."""
    from autobatch.errors import ContractError
    from autobatch.integrations.lightning import AutoBatch

    monkeypatch.setenv("AUTOBATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # the probes import the module's class by name
    from fixed_loader import FixedLoader  # type: ignore[import-not-found]

    with pytest.raises(ContractError) as refused:
        fit(AutoBatch(memory="1GiB", precisions=["32-true"]), FixedLoader())
    assert "holds 4 samples" in refused.value.message
    assert "lower max_batch_size=" in str(refused.value.hint), refused.value.hint
    assert "--" not in str(refused.value.hint)


#: A fresh process that fits the script's module under the callback (a fake probe runner: the key is the
#: parent's) and prints the result's cache record.
FRESH = f"""
import json, sys
sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parent.parent)!r}]
from test_lightning_doors import fit
from autobatch.integrations.lightning import AutoBatch
from autobatch.testing import FakeRunner, affine
callback = AutoBatch(memory="1GiB", runner=FakeRunner(affine(400 << 20, 1 << 20)))
fit(callback)
print(json.dumps(callback.result.cache))
"""


@pytest.mark.slow  # two processes that import Lightning
def test_a_module_without_saved_hyperparameters_keys_one_cache_entry(tmp_path: Path) -> None:
    env = {**os.environ, "AUTOBATCH_CACHE_DIR": str(tmp_path / "cache")}
    runs = []
    for _ in range(2):  # two fresh processes: each draws the module's weights anew
        proc = subprocess.run(
            [sys.executable, "-c", FRESH], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert runs[0]["key"] == runs[1]["key"] and (runs[0]["served"], runs[1]["served"]) == (False, True), runs
