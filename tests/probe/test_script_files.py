"""A probe's watch on the script's files (autobatch.probe.files), in a real process of its own: what the
script writes lands in a scratch folder or is refused, what it reads is listed, and the working folder stays
as it was. (Through the command: tests/cli/test_as_is_files_e2e.py.)"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from support import ROOT

#: What a script does to its working folder: each step's error (or None) is printed as JSON at the end.
SCRIPT = r"""
import json, os, shutil, sys
from pathlib import Path

import torch

from autobatch.probe import files
from autobatch.records.protocol import ProbeOutcome

outcome = ProbeOutcome(kind="fits")
user = os.getcwd()
files.install(outcome, Path(user) / "train.py")
errors = {}


def attempt(name, action):
    try:
        action()
        errors[name] = None
    except OSError as exc:
        errors[name] = f"{type(exc).__name__}: {exc}"


def write(path, mode, text):
    with open(path, mode) as handle:
        handle.write(text)


attempt("read config", lambda: json.load(open("config.json")))
attempt("overwrite checkpoint", lambda: torch.save({"step": 1}, "ckpt_last.pt"))
attempt("append log", lambda: write("train_log.csv", "a", "1,2\n"))
attempt("new run folder", lambda: os.makedirs("runs/new", exist_ok=True))
attempt("write into it", lambda: write("runs/new/events.txt", "w", "x"))
attempt("into an existing one", lambda: write("runs/earlier/events.txt", "w", "overwritten"))
attempt("remove", lambda: os.remove("runs/earlier/keep.txt"))
attempt("rename", lambda: os.replace("notes.txt", "moved.txt"))
attempt("truncate", lambda: os.truncate("data.bin", 1))
attempt("rmtree", lambda: shutil.rmtree("runs"))
attempt("read back its own", lambda: open("ckpt_last.pt", "rb").read())
attempt("absolute", lambda: write(os.path.join(user, "absolute.txt"), "w", "x"))
attempt("absolute torch.save", lambda: torch.save({}, os.path.join(user, "ckpt_last.pt")))
print(json.dumps({"errors": errors, "read": outcome.files_read, "written": outcome.files_written,
                  "cwd": os.getcwd()}))
"""


def _snapshot(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
    }


def test_writes_land_in_scratch_or_are_refused_and_the_folder_stays_as_it_was(tmp_path: Path) -> None:
    user = tmp_path / "run"
    (user / "runs" / "earlier").mkdir(parents=True)
    (user / "train.py").write_text("print('train')\n")
    (user / "config.json").write_text('{"width": 64}')
    (user / "ckpt_last.pt").write_bytes(b"a week of training")
    (user / "train_log.csv").write_text("0,1\n")
    (user / "runs" / "earlier" / "events.txt").write_text("step 1\n")
    (user / "runs" / "earlier" / "keep.txt").write_text("keep\n")
    (user / "notes.txt").write_text("notes\n")
    (user / "data.bin").write_bytes(b"0123456789")
    before = _snapshot(user)
    scratch_root = tmp_path / "scratch"
    scratch_root.mkdir()

    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOBATCH_SCRATCH_ROOT": str(scratch_root)}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=user, env=env, capture_output=True, text=True, timeout=300
    )

    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert _snapshot(user) == before
    errors = seen["errors"]
    refused = ("absolute", "absolute torch.save")
    assert all(errors[name] is None for name in errors if name not in refused), errors
    for name in refused:
        assert "PermissionError" in errors[name] and "cannot be redirected" in errors[name]
    assert seen["read"] == {"config.json": None}  # its own checkpoint, read back, is not an input
    assert seen["written"][:4] == ["ckpt_last.pt", "train_log.csv", "runs/new", "runs/new/events.txt"]
    assert {"absolute.txt", "runs/earlier/keep.txt", "moved.txt", "data.bin"} <= set(seen["written"])
    scratch = Path(seen["cwd"])
    assert scratch.parent == scratch_root.resolve()  # the probe server removes it with its root
    assert (scratch / "train_log.csv").read_text() == "0,1\n1,2\n"  # appended to a copy
    assert (scratch / "data.bin").read_bytes() == b"0"
    assert (scratch / "moved.txt").is_symlink() and not (scratch / "runs").exists()


#: A script whose first use of the temporary folder comes after the watch is installed (nothing imported
#: before it asked for it, as in a fresh environment without the test tools).
FIRST_TEMPDIR = r"""
import tempfile
from pathlib import Path

from autobatch.probe import files
from autobatch.records.protocol import ProbeOutcome

files.install(ProbeOutcome(kind="fits"), None)
tempfile.tempdir = None  # Python works it out again on the next call, opening test files in candidates
print(tempfile.gettempdir() == tempfile.gettempdir(), open("/proc/self/status").read().startswith("Name"))
"""


def test_the_scripts_first_look_at_the_temporary_folder_under_the_watch_does_not_hang(tmp_path: Path) -> None:
    # tempfile works the folder out under a lock and opens files to do it; a watch that asked tempfile for the
    # folder from inside its open hook waited for that lock for ever (a fresh venv's first tune hung 3 minutes)
    work, temp = tmp_path / "work", tmp_path / "tmp"  # the probe's scratch folder goes to the test's own
    work.mkdir()
    temp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOBATCH_WORKING_FOLDER": str(work), "TMPDIR": str(temp)}
    proc = subprocess.run(
        [sys.executable, "-c", FIRST_TEMPDIR],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"], proc.stdout
