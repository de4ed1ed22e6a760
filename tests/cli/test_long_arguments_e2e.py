"""A script's arguments longer than one command-line word may be: the real command on the CPU device.

A job passes its data's shards on the command line (a glob of thousands of files); the shell hands them to
``autobatch tune`` as separate words, and the tune must hand them on to its probes. Linux refuses a single
argument above 128 KiB (``E2BIG``): a start message carried as JSON in one word failed the tune with an internal
error (exit 1) before its first probe.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import SCRIPTS, run_cli

pytestmark = pytest.mark.slow

#: 3,000 shards under a pytest folder: about 250 KB of paths, twice what one word may hold.
SHARDS = 3000


def test_a_script_given_thousands_of_shard_files_is_tuned(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    shards = []
    for i in range(SHARDS):
        shard = data / f"train-shard-{i:05d}-of-{SHARDS:05d}.txt"
        shard.write_text(" ".join(str((i * 7 + j) % 1000) for j in range(64)))
        shards.append(str(shard))
    assert len(json.dumps(shards)) > 128 * 1024
    proc = run_cli(
        "tune", str(SCRIPTS / "as_is" / "shards_loop.py"), "--device", "cpu", "--memory", "512MiB",
        "--max-batch-size", "32", "--no-cache", "--output", str(tmp_path / "r.json"), "--json",
        "--", "--batch-size", "{batch}", "--shards", *shards, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["chosen"]["micro_batch_size"] == 32
    assert result["script_args"][-1] == shards[-1]
