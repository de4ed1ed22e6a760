"""Plots (matplotlib, optional) and the terminal breakdown bar."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from rich.console import Console

from autobatch.errors import UsageError
from autobatch.explain.output.plot import check_plot_path, plot_explain, plot_tune
from autobatch.explain.output.render import category_bar, print_breakdown, print_levers, print_modules
from autobatch.records.result import ComboResult, ProbeRecord, TuneResult

MiB = 1 << 20

REPORT = {
    "script": "examples/gpt.py",
    "precision": "32-true",
    "optimizer": "adamw",
    "recompute": False,
    "batch_size": 16,
    "fits": True,
    "kind": "fits",
    "peak_bytes": 432 * MiB,
    "budget_bytes": 921 * MiB,
    "categories": {
        "baseline": 297 * MiB,
        "parameters": 5 * MiB,
        "buffers": 0,
        "gradients": 0,
        "optimizer_state": 10 * MiB,
        "inputs": MiB // 64,
        "activations": 49 * MiB,
        "autocast_copies": 0,
        "temporaries": 32 * MiB,
        "runtime_overhead": 0,
    },
    "residual_bytes": 432 * MiB - (297 + 5 + 10 + 49 + 32) * MiB - MiB // 64,
    "measured": [
        {"batch_size": 16, "peak_bytes": 432 * MiB, "kind": "fits"},
        {"batch_size": 8, "peak_bytes": 392 * MiB, "kind": "fits"},
    ],
    "line": {"static_bytes": 352 * MiB, "bytes_per_sample": 5 * MiB},
    "peak_phase": "step 2 backward",
    "modules": [
        {
            "name": "blocks.0.mlp.0",
            "type": "Linear",
            "params": 66048,
            "param_bytes": 264192,
            "grad_bytes": 264192,
            "optimizer_state_bytes": 528384,
            "output_elements": 524288,
            "output_bytes": 2 * MiB,
            "saved_bytes": 2 * MiB,
            "flops": 134217728,
            "macs": 67108864,
            "calls": 1,
            "memory_bytes": 3 * MiB,
        }
    ],
    "levers": [
        {
            "name": "now",
            "kind": "now",
            "applicable": True,
            "predicted_max_batch_size": 112,
            "static_bytes": 352 * MiB,
            "bytes_per_sample": 5 * MiB,
            "saving_bytes": 0,
            "verified_max_batch_size": 112,
            "error": 0.0,
            "reason": None,
            "description": "as measured",
        },
        {
            "name": "recompute",
            "kind": "recompute",
            "applicable": True,
            "predicted_max_batch_size": 178,
            "static_bytes": 352 * MiB,
            "bytes_per_sample": 3 * MiB,
            "saving_bytes": 31 * MiB,
            "verified_max_batch_size": None,
            "error": None,
            "reason": None,
            "description": "checkpointing",
        },
    ],
}


def test_explain_plot_png_and_svg(tmp_path: Path) -> None:
    png, svg = tmp_path / "e.png", tmp_path / "e.svg"
    plot_explain(REPORT, png)
    plot_explain(REPORT, svg)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    text = svg.read_text()
    for label in (
        "batch size (samples)",
        "peak memory (MiB)",
        "budget",
        "maximum batch",
        "activations",
        "residual",
    ):
        assert label in text, label


def _tune_result() -> TuneResult:
    combo = ComboResult("32-true", "adamw", False, status="exact", max_batch_size=112, peak_bytes=915 * MiB)
    combo.static_bytes = {"parameters": 5 * MiB, "gradients": 5 * MiB, "optimizer_state": 10 * MiB}
    combo.trace = [
        ProbeRecord(1, "fits", 357 * MiB),
        ProbeRecord(60, "fits", 652 * MiB),
        ProbeRecord(112, "fits", 915 * MiB),
        ProbeRecord(113, "oom"),
    ]
    other = ComboResult("32-true", "adamw", True, status="exact", max_batch_size=180, peak_bytes=920 * MiB)
    other.trace = [
        ProbeRecord(1, "fits", 352 * MiB),
        ProbeRecord(180, "fits", 920 * MiB),
        ProbeRecord(181, "oom"),
    ]
    return TuneResult(
        script="examples/gpt.py",
        script_args=[],
        device={"name": "cpu", "budget_bytes": 921 * MiB, "baseline_bytes": 297 * MiB},
        objective="max-batch",
        combinations=[combo, other],
    )


def test_tune_plot(tmp_path: Path) -> None:
    svg = tmp_path / "t.svg"
    plot_tune(_tune_result(), svg)
    text = svg.read_text()
    for label in (
        "batch size (samples)",
        "out of memory",
        "max 112",
        "maximum batch",
        "fitted line",
        "budget",
        "optimizer_state",
    ):
        assert label in text, label


def test_plot_path_and_missing_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError) as error:
        check_plot_path("out.pdf")
    assert ".png or .svg" in (error.value.hint or "")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the extra were not installed
    with pytest.raises(UsageError) as error:
        check_plot_path("out.png")
    assert "autobatch-tuner[plot]" in (error.value.hint or "")


def test_terminal_breakdown() -> None:
    bar = category_bar(REPORT["categories"], REPORT["residual_bytes"], REPORT["budget_bytes"], width=40)
    assert bar.plain.count("█") + bar.plain.count("░") in range(38, 43)
    assert "432.00 MiB of 921.00 MiB" in bar.plain
    out = io.StringIO()
    console = Console(file=out, width=200, no_color=True)
    print_breakdown(console, REPORT)
    print_modules(console, REPORT["modules"])
    print_levers(console, REPORT["levers"], 16, verified=True)
    text = out.getvalue()
    for word in (
        "activations",
        "residual",
        "measured peak",
        "blocks.0.mlp.0",
        "67.11 M",
        "recompute",
        "+0.0%",
    ):
        assert word in text, word


@pytest.mark.slow
def test_tune_command_plots_a_real_tune(tmp_path: Path) -> None:
    """``autobatch tune --plot`` from a real (CPU-capped) tune: an SVG with every part the issue lists."""
    from support import EXAMPLES, run_cli

    svg = tmp_path / "tune.svg"
    common = ("--device", "cpu", "--memory", "500MiB", "--precision", "32-true", "--optimizer", "adamw")
    bad = run_cli("tune", str(EXAMPLES / "mlp.py"), *common, "--plot", str(tmp_path / "t.pdf"))
    assert bad.returncode == 2 and ".png or .svg" in bad.stderr
    assert not list(tmp_path.iterdir()), "a refused --plot must stop before probing or writing"
    proc = run_cli(
        "tune",
        str(EXAMPLES / "mlp.py"),
        *common,
        "--no-recompute",
        "--output",
        str(tmp_path / "r.json"),
        "--plot",
        str(svg),
    )
    assert proc.returncode == 0, proc.stderr
    text = svg.read_text()
    for label in ("batch size (samples)", "fitted line", "budget", "maximum batch", "optimizer_state"):
        assert label in text, label
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left
