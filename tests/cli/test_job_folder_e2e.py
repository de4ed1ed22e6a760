"""A job folder whose ``autobatch.toml`` names the script: the real command, its arguments after ``--`` alone.

The synopsis is ``autobatch tune [SCRIPT] [-- SCRIPT_ARGS]``: with the script in the folder's settings, a job
passes only the script's arguments. Click hands the first word after ``--`` to SCRIPT, and the tune looked for a
training script named ``--batch-size`` (exit 2, "training script not found").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import EXAMPLES, run_cli

pytestmark = pytest.mark.slow

SETTINGS = f"""\
[script]
script = "{EXAMPLES / "as_is" / "plain_loop.py"}"

[device]
device = "cpu"
memory = "512MiB"

[search]
max_batch_size = 16
"""


def test_the_arguments_after_dashes_are_the_scripts_when_the_settings_name_it(tmp_path: Path) -> None:
    (tmp_path / "autobatch.toml").write_text(SETTINGS)
    proc = run_cli(
        "tune", "--no-cache", "--json", "--", "--batch-size", "{batch}", "--samples", "256", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["script"] == str(EXAMPLES / "as_is" / "plain_loop.py")
    assert result["script_args"] == ["--batch-size", "{batch}", "--samples", "256"]
    assert result["chosen"]["micro_batch_size"] == 16
