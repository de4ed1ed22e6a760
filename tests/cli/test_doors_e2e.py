"""Refusals that come before anything starts, through the real command: ``explain`` of a script that runs as it
is, and a DDP plan whose world is not whole nodes of the ranks measured; and the command's words for the fix an
outcome's translation names in the neutral form (the API says ``.detail`` there)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import EXAMPLES, SCRIPTS, run_cli

from autobatch.errors import EXIT_SCRIPT, EXIT_USAGE


def test_explain_refuses_a_script_run_as_it_is_before_starting_anything(tmp_path: Path) -> None:
    proc = run_cli(
        "explain", str(EXAMPLES / "as_is" / "plain_loop.py"), "--batch-size", "8", "--device", "cpu",
        "--", "--batch-size", "{batch}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert "runs as it is" in proc.stderr and "autobatch check" in proc.stderr
    assert "starting the probe server" not in proc.stderr and "device cpu" not in proc.stderr


def test_a_world_that_is_not_whole_nodes_of_the_measured_ranks_is_refused_with_its_arithmetic(
    tmp_path: Path,
) -> None:
    proc = run_cli(
        "tune", str(EXAMPLES / "as_is" / "ddp_torchrun.py"), "--device", "cpu", "--memory", "512MiB",
        "--nproc-per-node", "2", "--world-size", "3", "--no-cache", "--", "--batch-size", "{batch}", cwd=tmp_path,
    )  # fmt: skip
    err = " ".join(proc.stderr.split())
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert "world size 3 (from --world-size) is not a multiple of nproc_per_node 2" in err, err
    assert "3 / 2 = 1.50 nodes" in err and "--world-size 2 or --world-size 4" in err, err
    assert "probing" not in err and "device cpu" not in err  # refused before any probe


@pytest.mark.slow  # one probe server
def test_a_script_error_through_the_command_says_verbose(tmp_path: Path) -> None:
    proc = run_cli(
        "check", str(SCRIPTS / "value_error.py"), "--batch-size", "65", "--device", "cpu", "--memory", "600MiB",
        cwd=tmp_path, env={"AUTOBATCH_DAEMON": "off", "AUTOBATCH_CACHE_DIR": str(tmp_path / "cache")},
    )  # fmt: skip
    err = " ".join(proc.stderr.split())
    assert proc.returncode == EXIT_SCRIPT, proc.stderr
    assert "fix the script (rerun with --verbose for the traceback)" in err and "{{" not in err, err
