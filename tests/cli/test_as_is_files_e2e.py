"""The files a script run as it is reads and writes, through the real command on the CPU device.

A tune keys its stored result on the files the script reads (a JSON config passed as an argument), and leaves
the folder it runs in as it was: what the script writes there during probes lands in a scratch folder, and the
result lists it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from support import SCRIPTS, run_cli

from autobatch.devices.cpu import MALLOC_ENV
from autobatch.errors import EXIT_NOTHING_FITS

pytestmark = pytest.mark.slow

AS_IS = SCRIPTS / "as_is"
CPU = ("--device", "cpu", "--memory", "512MiB")


def _snapshot(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` (relative path) -> sha256 of a file's bytes, "dir" for a folder."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _tune(folder: Path, script: str, *args: str, env: dict[str, str]):
    output = Path(env["AUTOBATCH_CACHE_DIR"]).parent / "result.json"  # the result file: outside the folder
    return run_cli(
        "tune",
        script,
        *CPU,
        "--max-batch-size",
        "512",
        "--output",
        str(output),
        "--json",
        "--",
        *args,
        cwd=folder,
        env=env,
    )


def test_an_edited_config_is_measured_again_not_served(tmp_path) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(AS_IS / "config_width.py", folder / "train.py")
    config = folder / "config.json"
    config.write_text(json.dumps({"width": 64}))
    env = {"AUTOBATCH_CACHE_DIR": str(tmp_path / "cache")}
    args = ("--config", "config.json", "--batch-size", "{batch}")

    first = _tune(folder, "train.py", *args, env=env)
    assert first.returncode == 0, first.stderr
    narrow = json.loads(first.stdout)
    assert "config.json" in narrow["script_files"]["read"]
    assert "result kept in the cache" in first.stderr

    config.write_text(
        json.dumps({"width": 4096})
    )  # parameters and AdamW state: 4 x 64 MiB, more than is left
    second = _tune(folder, "train.py", *args, env=env)
    assert "served from the cache:" not in second.stderr
    assert "measuring again: config.json changed" in second.stderr
    assert second.returncode == EXIT_NOTHING_FITS, second.stderr
    err = " ".join(second.stderr.split())
    # its own words: a script run as it is has no combination to try, no lever to search, and before its first
    # step nothing told its model's memory from the batch's ("parameters 0 B + gradients 0 B ... the batch
    # needs more"; "try bf16, a lighter optimizer, recomputation")
    assert "the script does not fit even the smallest batch" in err, err
    assert "0 B" not in err and "no probe ran far enough to tell the model's own memory" in err
    assert "keeps its own precision, optimizer and model" in err

    config.write_text(json.dumps({"width": 64}))  # as it was: the stored answer holds again
    third = _tune(folder, "train.py", *args, env=env)
    assert third.returncode == 0, third.stderr
    served = json.loads(third.stdout)
    assert served["cache"]["served"] is True
    assert served["combinations"][0]["max_batch_size"] == narrow["combinations"][0]["max_batch_size"]


#: The model of a project whose package is on PYTHONPATH (``export PYTHONPATH=$HOME/project/src``).
WIDTH_MODEL = """
import torch
import torch.nn.functional as F
from torch import nn

WIDTH = 64


def build_model():
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10))


def make_batch(batch_size):
    return torch.randn(batch_size, WIDTH), torch.randint(0, 10, (batch_size,))


def compute_loss(model, batch):
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)
"""


def test_an_edited_module_on_pythonpath_is_measured_again_not_served(tmp_path) -> None:
    """The script's model comes from a package of the user's on ``PYTHONPATH``, outside the script's folder and
    the working folder: its source counts as a file the script read. Edited, the stored answer was served (a
    width of 64 -> 4096, where nothing fits)."""
    source, folder, temporary = tmp_path / "src", tmp_path / "job", tmp_path / "tmp"
    for each in (source, folder, temporary):
        each.mkdir()
    module = source / "widthmodel.py"
    module.write_text(WIDTH_MODEL)
    (folder / "train.py").write_text(
        "from widthmodel import build_model, compute_loss, make_batch  # noqa: F401\n"
    )
    # the temporary folder elsewhere: this test's folder sits in the system's, whose files are never an input
    env = {
        "AUTOBATCH_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": str(source),
        "TMPDIR": str(temporary),
    }
    first = _tune(folder, "train.py", env=env)
    assert first.returncode == 0, first.stderr
    assert str(module) in json.loads(first.stdout)["script_files"]["read"]

    module.write_text(WIDTH_MODEL.replace("WIDTH = 64", "WIDTH = 8192"))  # 4 x 256 MiB of weights and state
    second = _tune(folder, "train.py", env=env)
    assert f"measuring again: {module} changed" in second.stderr
    assert second.returncode == EXIT_NOTHING_FITS, second.stderr


def test_a_config_tried_and_absent_and_a_package_in_the_project_venv_keep_the_result_cacheable(
    tmp_path,
) -> None:
    """A script that tries ``local.json`` (absent) and imports a package from the project's ``.venv``: the
    result is kept and served (the absent file is part of the key, the installed package's files are not), and
    the override appearing is a change."""
    folder = tmp_path / "job"
    package = folder / ".venv" / "lib" / "python3.11" / "site-packages" / "vocabpkg"
    package.mkdir(parents=True)
    (package / "words.txt").write_text("a b c d e f g h")
    (package / "__init__.py").write_text(
        "from pathlib import Path\nWORDS = (Path(__file__).parent / 'words.txt').read_text().split()\n"
    )
    shutil.copy(AS_IS / "optional_overrides.py", folder / "train.py")
    env = {"AUTOBATCH_CACHE_DIR": str(tmp_path / "cache")}

    first = _tune(folder, "train.py", "--batch-size", "{batch}", env=env)
    assert first.returncode == 0, first.stderr
    read = json.loads(first.stdout)["script_files"]["read"]
    assert read["local.json"] == "absent" and not any(".venv" in path for path in read), read
    assert "result kept in the cache" in first.stderr

    again = _tune(folder, "train.py", "--batch-size", "{batch}", env=env)
    assert again.returncode == 0 and json.loads(again.stdout)["cache"]["served"] is True, again.stderr

    (folder / "local.json").write_text(json.dumps({"width": 4096}))  # AdamW's state alone is past the budget
    edited = _tune(folder, "train.py", "--batch-size", "{batch}", env=env)
    assert "measuring again: local.json changed" in edited.stderr
    assert edited.returncode == EXIT_NOTHING_FITS, edited.stderr


def test_a_script_that_moves_into_its_outputs_folder_writes_there_in_the_scratch_folder(tmp_path) -> None:
    """``os.chdir("outputs")`` (as Hydra runs do), then its metrics and checkpoint relative to it: the probes' writes
    land in the scratch folder, the user's outputs stay as they were. They were refused ("reached by a path other
    than one relative to the working folder"): the folder was entered through the scratch folder's link."""
    folder = tmp_path / "run"
    (folder / "outputs").mkdir(parents=True)
    shutil.copy(AS_IS / "chdir_outputs.py", folder / "train.py")
    (folder / "outputs" / "metrics.csv").write_text("0,1.0\n")
    (folder / "outputs" / "last.pt").write_bytes(b"last week's model")
    before = _snapshot(folder)
    proc = _tune(
        folder, "train.py", "--batch-size", "{batch}", env={"AUTOBATCH_CACHE_DIR": str(tmp_path / "c")}
    )
    assert proc.returncode == 0, proc.stderr
    assert _snapshot(folder) == before
    assert {"outputs/metrics.csv", "outputs/last.pt"} <= set(
        json.loads(proc.stdout)["script_files"]["written"]
    )


def test_a_tune_leaves_the_run_folder_as_it_was(tmp_path) -> None:
    folder = tmp_path / "run"
    (folder / "data").mkdir(parents=True)
    (folder / "runs" / "earlier").mkdir(parents=True)
    shutil.copy(AS_IS / "writes_run_files.py", folder / "train.py")
    (folder / "data" / "train.csv").write_text(
        "".join(f"{i % 7},{i % 5},{i % 3},{i % 2}\n" for i in range(64))
    )
    (folder / "ckpt_last.pt").write_bytes(b"the real checkpoint of a week of training")
    (folder / "train_log.csv").write_text("0,1,0.5\n")
    (folder / "runs" / "earlier" / "events.txt").write_text("step 1\n")
    before = _snapshot(folder)

    proc = _tune(
        folder, "train.py", "--batch-size", "{batch}", env={"AUTOBATCH_CACHE_DIR": str(tmp_path / "c")}
    )

    assert proc.returncode == 0, proc.stderr
    assert _snapshot(folder) == before
    written = json.loads(proc.stdout)["script_files"]["written"]
    assert {"ckpt_last.pt", "train_log.csv"} <= set(written)
    assert any(path.startswith("runs/") for path in written)
    assert "ckpt_last.pt" in proc.stderr
    assert "data/train.csv" in json.loads(proc.stdout)["script_files"]["read"]


def test_a_folder_named_in_letters_the_locale_cannot_decode_survives_the_result_the_cache_and_the_files(
    tmp_path,
) -> None:
    """A script and its config in ``données/``, tuned under ``LC_ALL=C`` without Python's UTF-8 mode: Python holds
    the name as surrogate escapes. The result file, the cache (served the second time, its files read checked) and
    the printed table survive it, and the job's command line in the ``args`` and ``env`` files names the folder as
    the file system has it, from the tune and from ``autobatch emit`` of the result. Before the fix the files
    failed after the tune: "internal error: UnicodeEncodeError: 'utf-8' codec can't encode characters ...:
    surrogates not allowed" (exit 1)."""
    folder = tmp_path / "données"
    folder.mkdir()
    shutil.copy(AS_IS / "config_width.py", folder / "train.py")
    (folder / "config.json").write_text(json.dumps({"width": 64}))
    env = {"LC_ALL": "C", "PYTHONUTF8": "0", "AUTOBATCH_CACHE_DIR": str(tmp_path / "cache")}
    job, exported, output = tmp_path / "job.sh", tmp_path / "autobatch.env", tmp_path / "result.json"
    args = ("tune", "données/train.py", *CPU, "--max-batch-size", "64", "--output", str(output), "--json")
    script_args = ("--", "--config", "données/config.json", "--batch-size", "{batch}")
    emits = ("--emit", f"args={job}", "--emit", f"env={exported}")
    first = run_cli(*args, *emits, *script_args, cwd=tmp_path, env=env, timeout=150)
    assert first.returncode == 0, first.stderr
    measured = json.loads(first.stdout)
    script = folder / "train.py"
    assert os.fsencode(measured["script"]) == os.fsencode(
        str(script)
    )  # the name's bytes, as the locale held it
    assert b"donn\xc3\xa9es/config.json" in [os.fsencode(path) for path in measured["script_files"]["read"]]
    pinned = [f"{name}={value}" for name, value in MALLOC_ENV.items()]  # the allocator the answer holds under
    line = shlex.join(
        [*pinned, sys.executable, str(script), "--config", "données/config.json", "--batch-size", "64"]
    ).encode()
    assert job.read_bytes().splitlines()[-1] == line
    assert (
        f"export AUTOBATCH_COMMAND={shlex.quote(line.decode())}".encode()
        in exported.read_bytes().splitlines()
    )

    second = run_cli(*args, *script_args, cwd=tmp_path, env=env, timeout=150)
    assert second.returncode == 0, second.stderr
    served = json.loads(second.stdout)
    assert served["cache"]["served"] and served["probes"] == 0
    assert (
        "| script" in second.stderr and "donn\\udcc3\\udca9es/train.py" in second.stderr
    )  # the table, escaped

    again = run_cli("emit", str(output), "--format", f"args={tmp_path / 'again.sh'}", cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again.sh").read_bytes().splitlines()[-1] == line
