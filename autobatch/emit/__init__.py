"""Emitters: the tune result as the config files launchers already read.

Each format module has a pure ``render_<fmt>(result, options) -> str`` and a ``caveats(result, options)
-> list[str]`` (what the file cannot say). :func:`targets` checks every requested path before anything is
rendered (a tune checks them before its first probe); :func:`emit` renders every requested file first, so
that a rendering error writes nothing, then writes each atomically. Launcher configs of a CPU result are refused
unless the CPU was asked for (:func:`~autobatch.emit.common.check_device`). The formats, their default
files and consumers: docs/clusters.md ("Launcher configs").
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from autobatch.emit import accelerate, args, deepspeed, env, hf, lightning, whole
from autobatch.emit.common import (
    SCRIPT_OWN,
    EmitOptions,
    arithmetic,
    check_device,
    lever_caveats,
    make_options,
    require_chosen,
    script_own,
    why_none,
)
from autobatch.errors import UsageError
from autobatch.records.files import preflight, write_atomic
from autobatch.records.liveness import unfinished
from autobatch.records.result import TuneResult
from autobatch.settings.levers import Door, lever

Renderer = Callable[[TuneResult, EmitOptions], str]


@dataclass(frozen=True)
class Format:
    """One output format: its renderer, its default file name, and its caveats."""

    name: str
    render: Renderer
    filename: str
    caveats: Callable[[TuneResult, EmitOptions], list[str]]
    needs_choice: bool = True


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("deepspeed", deepspeed.render_deepspeed, "ds_config.json", deepspeed.caveats),
        Format("hf", hf.render_hf, "hf_training_args.json", hf.caveats),
        Format("lightning", lightning.render_lightning, "lightning_overlay.yaml", lightning.caveats),
        Format("accelerate", accelerate.render_accelerate, "accelerate_config.yaml", accelerate.caveats),
        Format("env", env.render_env, "autobatch.env", env.caveats),
        Format("args", args.render_args, "autobatch-command.sh", args.caveats),
        Format("json", whole.render_json, "autobatch-result.json", whole.caveats, needs_choice=False),
        Format("toml", whole.render_toml, "autobatch-result.toml", whole.caveats, needs_choice=False),
    )
}


def get_format(name: str) -> Format:
    """The format called ``name``, or a UsageError naming the known ones (and the closest)."""
    try:
        return FORMATS[name]
    except KeyError:
        pass
    close = difflib.get_close_matches(name, list(FORMATS), n=1)
    did_you_mean = f" (did you mean {close[0]!r}?)" if close else ""
    raise UsageError(
        f"unknown emit format {name!r}{did_you_mean}",
        hint=f"use one of {', '.join(FORMATS)}, optionally as FORMAT=PATH",
    )


def parse_emit_spec(spec: str) -> tuple[str, Path]:
    """``"deepspeed=out/ds.json"`` -> ``("deepspeed", Path("out/ds.json"))``; a bare format gets its default file."""
    name, sep, path = spec.partition("=")
    fmt = get_format(name.strip())
    if sep and not path.strip():
        raise UsageError(f"empty path in --emit {spec!r}", hint=f"write {fmt.name}=PATH, or just {fmt.name}")
    return fmt.name, Path(path.strip()) if sep else Path(fmt.filename)


def render(result: TuneResult, fmt: str, options: EmitOptions) -> str:
    """Render one format (pure apart from reading a DeepSpeed base config)."""
    spec = get_format(fmt)
    if spec.needs_choice:
        require_chosen(result)
        check_device(result, f"a {fmt} config", options)
    return spec.render(result, options)


def caveats(result: TuneResult, fmt: str, options: EmitOptions) -> list[str]:
    """What a person should know about this format's file that the file itself may not say."""
    spec = get_format(fmt)
    if result.chosen is None:
        reason = unfinished(result.to_dict())
        if reason is not None:
            return [f"a partial result: {reason}"]
        return [] if not spec.needs_choice else [f"no configuration to emit: {why_none(result)}"]
    own = [SCRIPT_OWN] if script_own(result.chosen) and spec.needs_choice and fmt != "args" else []
    launcher = fmt in ("deepspeed", "hf", "lightning", "accelerate") and not own
    levers = lever_caveats(result.chosen, compile_set=fmt == "hf") if launcher else []
    return own + spec.caveats(result, options) + levers


def emit(
    result: TuneResult, specs: Iterable[str | tuple[str, str | Path]], options: EmitOptions
) -> list[Path]:
    """Render every spec (``"FORMAT[=PATH]"`` or ``(format, path)``), then write them; returns the paths.

    Nothing is written if any file fails to render, if two specs name the same path, or if a path cannot be
    written (:func:`targets`).
    """
    rendered = [(path, render(result, fmt, options)) for fmt, path in targets(specs)]
    return [write_atomic(path, text) for path, text in rendered]


#: How to name a launcher config's file, on every face (``tune --emit``, ``emit --format``, ``emit=`` in the API).
FIX = "give it as FORMAT=PATH (tune --emit, emit --format) with PATH a file in a folder you can write"


def targets(specs: Iterable[str | tuple[str, str | Path]]) -> list[tuple[str, Path]]:
    """Every spec's format and path: a UsageError when a format is unknown, two specs name the same path, or a
    path cannot be written (a folder, under a file, a folder this process cannot write: named with the fix)."""
    found: list[tuple[str, Path]] = []
    for spec in specs:
        if isinstance(spec, str):
            found.append(parse_emit_spec(spec))
        else:
            fmt, path = spec
            found.append((get_format(fmt).name, Path(path)))
    seen: dict[Path, str] = {}
    for fmt, path in found:
        key = Path(path).resolve()
        if key in seen:
            raise UsageError(
                f"{seen[key]} and {fmt} would both write {path}",
                hint="give each format its own file with FORMAT=PATH",
            )
        seen[key] = fmt
    for fmt, path in found:
        preflight(path, f"{fmt} file", FIX)
    return found


def refuse_fallback(specs: Iterable[str], allow_cpu: bool, door: Door = "cli") -> None:
    """Before probing: ``--device auto`` fell back to the CPU and ``specs`` ask for launcher configs
    (which :func:`render` would refuse after the whole tune): say so now, unless ``allow_cpu`` (the fixes named
    as ``door`` names them)."""
    launchers = [fmt for fmt, _ in map(parse_emit_spec, specs) if FORMATS[fmt].needs_choice]
    if launchers and not allow_cpu:
        raise UsageError(
            "device auto found no CUDA device and would tune the CPU, but emit asks for launcher configs "
            f"({', '.join(launchers)}) that would carry CPU numbers into a GPU job",
            hint=f"run on a machine with the GPU; to train on the CPU, pass {lever(door, 'device', 'cpu')} (or "
            f"{lever(door, 'allow_cpu', True)})",
        )


def summary(result: TuneResult) -> str | None:
    """The chosen plan's batch arithmetic, for a command to print after emitting."""
    return arithmetic(result.chosen) if result.chosen else None


def report(result: TuneResult, written: Iterable[tuple[str, Path]], options: EmitOptions) -> list[str]:
    """What a command prints after writing files: the arithmetic, the plan's note, and per file where it
    went and its caveats (for the JSON formats, which hold no comment, the only place they appear)."""
    lines = [line for line in (summary(result),) if line]
    if result.chosen is not None and result.chosen.note:
        lines.append(f"note: {result.chosen.note}")
    for fmt, path in written:
        lines.append(f"wrote {path} ({fmt})")
        lines += [f"  note: {note}" for note in caveats(result, fmt, options)]
    return lines


__all__ = [
    "FORMATS",
    "EmitOptions",
    "Format",
    "caveats",
    "emit",
    "get_format",
    "make_options",
    "parse_emit_spec",
    "refuse_fallback",
    "render",
    "report",
    "summary",
]
