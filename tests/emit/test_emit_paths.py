"""A launcher config's path that cannot be written, through the real command: named before any probe (``tune
--emit``) or before any file (``autobatch emit``), exit 2, nothing written.

Before the fix ``tune`` ran every probe, wrote the result, then failed with exit 1 ("internal error:
IsADirectoryError" or a PermissionError on the atomic write's temporary file); ``autobatch emit`` failed the
same way. These tests are not marked slow: the suite forbids them a probe server (``AUTOBATCH_NO_PROBE_SERVER``),
so a tune that probes before it checks the path fails at once, with exit 1.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from emit_cases import BY_NAME
from support import EXAMPLES, run_cli

from autobatch.errors import EXIT_USAGE

#: Paths no atomic write can take, with the words the error names them by.
BAD: list[tuple[str, Callable[[Path], Path], str]] = [
    ("a-folder", lambda d: (d / "out").mkdir() or d / "out", "is a folder"),
    ("under-a-file", lambda d: (d / "f").write_text("x") and d / "f" / "a.env", "is a file, not a folder"),
    ("under-proc", lambda d: Path("/proc/autobatch.env"), "/proc is not writable"),
]
IDS = [name for name, _, _ in BAD]


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.mark.parametrize(
    ("fmt", "case"), [("env", b) for b in BAD] + [("deepspeed", BAD[0])], ids=[*IDS, "ds-folder"]
)
def test_tune_names_an_emit_path_it_cannot_write_before_any_probe(
    tmp_path: Path, fmt: str, case: tuple[str, Callable[[Path], Path], str]
) -> None:
    _, make, words = case
    bad = make(tmp_path)
    before = _files(tmp_path)
    proc = run_cli(
        "tune", str(EXAMPLES / "mlp.py"), "--device", "cpu", "--memory", "600MiB", "--no-cache", "--timeout", "20",
        "--output", str(tmp_path / "ok.json"), "--emit", f"{fmt}={bad}", cwd=tmp_path, timeout=120,
    )  # fmt: skip
    err = " ".join(proc.stderr.split())
    assert proc.returncode == EXIT_USAGE, err
    assert f"{fmt} file {bad}" in err and words in err, err
    assert "hint: " in err and "FORMAT=PATH" in err and "internal error" not in err
    assert _files(tmp_path) == before  # no result file, no temporary file, no config


@pytest.mark.parametrize("case", BAD, ids=IDS)
def test_emit_names_a_path_it_cannot_write_and_writes_nothing(
    tmp_path: Path, case: tuple[str, Callable[[Path], Path], str]
) -> None:
    _, make, words = case
    result = tmp_path / "r.json"
    result.write_text(BY_NAME["bf16-mixed_accum_w4"].result().to_json())
    bad = make(tmp_path)
    before = _files(tmp_path)
    # the good file first: a bad path anywhere writes none of them
    proc = run_cli("emit", str(result), "--format", "hf=good.json", "--format", f"env={bad}", cwd=tmp_path)
    err = " ".join(proc.stderr.split())
    assert proc.returncode == EXIT_USAGE, err
    assert f"env file {bad}" in err and words in err and "internal error" not in err, err
    assert _files(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere (the /proc case stands for it)")
def test_emit_names_a_read_only_folder(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    result.write_text(BY_NAME["bf16-mixed_accum_w4"].result().to_json())
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    proc = run_cli("emit", str(result), "--format", f"env={folder / 'a.env'}", cwd=tmp_path)
    assert proc.returncode == EXIT_USAGE and f"{folder} is not writable" in proc.stderr, proc.stderr
    assert list(folder.iterdir()) == []
