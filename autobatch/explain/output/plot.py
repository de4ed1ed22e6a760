"""Pictures: memory against batch size, with the budget, the maximum and the breakdown (PNG or SVG).

Left panel: the measured probes (fits as dots, out-of-memory as crosses drawn at the budget, where
their peak is unknown), the fitted line ``peak = static + per-sample x batch``, the budget and the
maximum batch. Right panel: the breakdown of one peak as a stacked bar (explain: every category; tune:
static parts of the chosen combination and the per-sample rest). matplotlib is an optional extra
(``pip install 'autobatch-tuner[plot]'``); it is imported only when a plot is asked for, and the
figure is drawn without pyplot (no display, no global state).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from autobatch.errors import UsageError
from autobatch.explain.pure.records import CATEGORIES

if TYPE_CHECKING:
    from autobatch.records.result import ComboResult, TuneResult

SUFFIXES = (".png", ".svg")
INSTALL_HINT = "install the plot extra: pip install 'autobatch-tuner[plot]' (or pip install matplotlib)"
COLOURS: dict[str, str] = {
    "baseline": "#9e9e9e",
    "parameters": "#1f77b4",
    "buffers": "#17becf",
    "gradients": "#9467bd",
    "optimizer_state": "#d62728",
    "inputs": "#7f7f7f",
    "activations": "#2ca02c",
    "autocast_copies": "#98df8a",
    "temporaries": "#ffbf00",
    "ddp_buckets": "#e377c2",
    "runtime_overhead": "#ff7f0e",
    "residual": "#d9d9d9",
    "per-sample (activations, temporaries)": "#2ca02c",
}


def check_plot_path(path: str | Path) -> None:
    """Fail early (before any probe) on a suffix we cannot write or a missing matplotlib."""
    if Path(path).suffix.lower() not in SUFFIXES:
        raise UsageError(f"cannot plot to {path}: unknown image type", hint="use a .png or .svg file name")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib, which is not installed", hint=INSTALL_HINT) from None


def _figure() -> tuple[Any, Any, Any]:
    check_plot_path("x.png")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 6.2), layout="constrained")
    grid = figure.add_gridspec(1, 2, width_ratios=(3, 1.15))
    return figure, figure.add_subplot(grid[0, 0]), figure.add_subplot(grid[0, 1])


def _unit(largest: float) -> tuple[float, str]:
    return (float(1 << 30), "GiB") if largest >= 4 << 30 else (float(1 << 20), "MiB")


def _stacked(
    ax: Any, parts: list[tuple[str, float]], scale: float, unit: str, title: str, budget: float | None
) -> None:
    bottom = 0.0
    for name, value in parts:
        if value <= 0:
            continue
        ax.bar(
            0,
            value / scale,
            bottom=bottom,
            width=0.6,
            color=COLOURS.get(name, "#cccccc"),
            label=name,
            edgecolor="white",
        )
        bottom += value / scale
    if budget:
        ax.axhline(budget / scale, color="black", linestyle="--", linewidth=1)
    ax.set_xticks([0], [title])
    ax.set_xlim(-0.6, 0.6)
    ax.set_ylabel(f"memory ({unit})")
    ax.set_title("breakdown of the peak")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), fontsize=8, frameon=False, ncol=1)


def _memory_axes(ax: Any, unit: str, title: str, handles: list[Any] | None = None) -> None:
    ax.set_xlabel("batch size (samples)")
    ax.set_ylabel(f"peak memory ({unit})")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(
        handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False
    )


def plot_explain(report: dict[str, Any], path: str | Path) -> None:
    """Memory against batch size from an explain report, and its breakdown."""
    figure, ax, bar = _figure()
    budget = float(report["budget_bytes"])
    points = [
        (m["batch_size"], m["peak_bytes"])
        for m in report["measured"]
        if m["kind"] == "fits" and m["peak_bytes"]
    ]
    levers = [lever for lever in report.get("levers", []) if lever["applicable"]]
    now = next((lever for lever in levers if lever["kind"] == "now"), None)
    b_max = now["predicted_max_batch_size"] if now else None
    right = max([b for b, _ in points] + [b_max or 0, report["batch_size"]]) * 1.15
    scale, unit = _unit(max(budget, report["peak_bytes"]))
    _explain_lines(ax, report, levers, scale, right)
    _explain_marks(ax, report, points, b_max, scale, unit)
    ax.set_xlim(0, right)
    lows = [p for _, p in points] + [
        float(lever["static_bytes"]) for lever in levers if lever["static_bytes"]
    ]
    if report.get("line"):
        lows.append(float(report["line"]["static_bytes"]))
    bottom = max(0.0, min(lows or [0.0]) * 0.85)
    ax.set_ylim(bottom / scale, max(budget, report["peak_bytes"]) / scale * 1.08)
    title = f"{Path(report['script']).name}: {report['precision']} / {report['optimizer']}" + (
        " / recompute" if report["recompute"] else ""
    )
    _memory_axes(ax, unit, title)
    parts = [(name, float(report["categories"].get(name, 0))) for name in CATEGORIES]
    parts.append(("residual", float(report["residual_bytes"])))
    _stacked(bar, parts, scale, unit, f"batch {report['batch_size']}", budget)
    _save(figure, path)


def _explain_lines(
    ax: Any, report: dict[str, Any], levers: list[dict[str, Any]], scale: float, right: float
) -> None:
    """The line through the measured probes, and the predicted lines of now and the first levers."""
    if report.get("line"):
        static, slope = report["line"]["static_bytes"], report["line"]["bytes_per_sample"]
        ax.plot(
            [0, right],
            [static / scale, (static + slope * right) / scale],
            color="#1f77b4",
            label="fitted: measured line",
        )
    shown = [lever for lever in levers if lever["kind"] != "accumulation"][:4]
    for index, lever in enumerate(shown):
        if lever["static_bytes"] is not None and lever["bytes_per_sample"]:
            s, k = lever["static_bytes"], lever["bytes_per_sample"]
            now_line = lever["kind"] == "now"
            ax.plot(
                [0, right],
                [s / scale, (s + k * right) / scale],
                color="#d62728" if now_line else f"C{index + 1}",
                linestyle="--" if now_line else ":",
                linewidth=1,
                label="predicted now (simulation calibrated on the probes)"
                if now_line
                else f"predicted with {lever['name']}",
            )


def _explain_marks(
    ax: Any,
    report: dict[str, Any],
    points: list[tuple[int, int]],
    b_max: int | None,
    scale: float,
    unit: str,
) -> None:
    """The measured probes, the explained batch when it does not fit, the budget and the maximum."""
    budget = float(report["budget_bytes"])
    if points:
        ax.scatter(
            [b for b, _ in points],
            [p / scale for _, p in points],
            color="black",
            zorder=5,
            label="measured probes",
        )
    if not report["fits"]:
        ax.scatter(
            [report["batch_size"]],
            [budget / scale],
            marker="x",
            color="red",
            s=60,
            zorder=5,
            label="does not fit",
        )
    ax.axhline(
        budget / scale,
        color="black",
        linestyle="--",
        linewidth=1,
        label=f"budget {budget / scale:.2f} {unit}",
    )
    if b_max:
        ax.axvline(
            b_max, color="#d62728", linestyle="-.", linewidth=1, label=f"maximum batch (predicted) {b_max}"
        )


def plot_tune(result: TuneResult, path: str | Path) -> None:
    """Memory against batch size for every combination of a tune, and the chosen one's breakdown.

    One colour per combination; dots are probes that fit, crosses probes that ran out of memory (drawn
    on the budget line: their peak is unknown), solid lines the least-squares fit of the probes that
    fit, dash-dotted lines the maxima. The x axis ends at 1.5 x the largest maximum, so that probes far
    beyond it (the search's first guesses) do not squeeze the interesting part.
    """
    figure, ax, bar = _figure()
    budget = float(result.device.get("budget_bytes") or 0)
    peaks = [float(p.peak_bytes) for c in result.combinations for p in c.trace if p.peak_bytes]
    scale, unit = _unit(max([budget, *peaks]))
    maxima = [c.max_batch_size for c in result.combinations if c.max_batch_size]
    batches = [p.batch_size for c in result.combinations for p in c.trace] or [1]
    right = max(maxima) * 1.5 if maxima else max(batches) * 1.1
    handles: list[Any] = []
    lows = [budget, *peaks]
    for index, combo in enumerate(result.combinations):
        if combo.trace:
            handle, low = _tune_combo(ax, combo, f"C{index % 10}", budget, scale, right)
            handles.append(handle)
            lows += [low] if low is not None else []
    ax.axhline(budget / scale, color="black", linestyle="--", linewidth=1)
    ax.set_xlim(0, right)
    ax.set_ylim(max(0.0, min(lows) * 0.85) / scale, max([budget, *peaks]) / scale * 1.08)
    title = f"{Path(result.script).name} on {result.device.get('name')}"
    _memory_axes(ax, unit, title, handles=handles + _tune_legend(budget, scale, unit))
    _tune_breakdown(bar, result, budget, scale, unit)
    _save(figure, path)


def _tune_combo(
    ax: Any, combo: ComboResult, colour: str, budget: float, scale: float, right: float
) -> tuple[Any, float | None]:
    """One combination's probes, fitted line and maximum; its legend handle and the line's intercept."""
    from matplotlib.lines import Line2D

    fits = sorted({(p.batch_size, p.peak_bytes) for p in combo.trace if p.kind == "fits" and p.peak_bytes})
    misses = sorted({p.batch_size for p in combo.trace if p.kind != "fits" and p.batch_size <= right})
    ax.scatter([b for b, _ in fits], [p / scale for _, p in fits], color=colour, s=22, zorder=5)
    if misses:
        ax.scatter(misses, [budget / scale] * len(misses), marker="x", color=colour, s=45, zorder=6)
    line = _fit(fits)
    if line:
        ax.plot([0, right], [line[0] / scale, (line[0] + line[1] * right) / scale], color=colour, linewidth=1)
    if combo.max_batch_size:
        ax.axvline(combo.max_batch_size, color=colour, linestyle="-.", linewidth=1)
    label = (
        f"{combo.key}: max {combo.max_batch_size}" if combo.max_batch_size else f"{combo.key}: {combo.status}"
    )
    return Line2D([], [], color=colour, marker="o", label=label), line[0] if line else None


def _tune_legend(budget: float, scale: float, unit: str) -> list[Any]:
    """The legend entries that explain the marks (the same for every combination)."""
    from matplotlib.lines import Line2D

    return [
        Line2D([], [], color="black", marker="o", linestyle="none", label="probe that fits"),
        Line2D(
            [], [], color="black", marker="x", linestyle="none", label="out of memory (on the budget line)"
        ),
        Line2D([], [], color="black", linewidth=1, label="fitted line"),
        Line2D([], [], color="black", linestyle="-.", linewidth=1, label="maximum batch"),
        Line2D(
            [], [], color="black", linestyle="--", linewidth=1, label=f"budget {budget / scale:.2f} {unit}"
        ),
    ]


def _tune_breakdown(bar: Any, result: TuneResult, budget: float, scale: float, unit: str) -> None:
    """The chosen combination's peak (else the first with one): baseline, static parts, per-sample rest."""
    chosen = result.chosen
    same = chosen.ident if chosen else None
    picked = next((c for c in result.combinations if c.trace and c.ident == same), None)
    picked = picked or next((c for c in result.combinations if c.peak_bytes), None)
    if picked is None or not picked.peak_bytes:
        return
    baseline = float(result.device.get("baseline_bytes") or 0)
    static = {k: float(v) for k, v in (picked.static_bytes or {}).items()}
    rest = float(picked.peak_bytes) - baseline - sum(static.values())
    parts = [("baseline", baseline), *static.items(), ("per-sample (activations, temporaries)", rest)]
    _stacked(bar, parts, scale, unit, f"{picked.key}\nat batch {picked.max_batch_size}", budget)


def _fit(points: list[tuple[int, int]]) -> tuple[float, float] | None:
    """Least-squares line through (batch, peak) points; None with fewer than two batch sizes."""
    if len({b for b, _ in points}) < 2:
        return None
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_p = sum(p for _, p in points) / n
    var = sum((b - mean_b) ** 2 for b, _ in points)
    slope = sum((b - mean_b) * (p - mean_p) for b, p in points) / var
    return mean_p - slope * mean_b, slope


def _save(figure: Any, path: str | Path) -> None:
    """Render in memory, then write atomically: an interrupted run leaves no half-written image."""
    import io

    from autobatch.records.files import write_atomic

    buffer = io.BytesIO()
    figure.savefig(buffer, format=Path(path).suffix.lower().lstrip("."))
    write_atomic(path, buffer.getvalue())
