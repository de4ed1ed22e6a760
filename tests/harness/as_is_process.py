"""An independent harness for a training script run as it is: does it fit when the job starts it fresh?

Written without autobatch's code, to check its as-is answers from outside (see ``docs/as-is.md``). A trial
runs an unmodified script the way the job runs it under the same cap: a fresh ``python`` process whose data
memory is capped with ``RLIMIT_DATA`` before ``exec`` (the interpreter, torch, the script's imports and its
data set all count), glibc's malloc pinned as autobatch pins it (the environment of
:mod:`harness.fresh_process`), ``sys.argv`` the script and its arguments, the script run as ``__main__``
(``runpy.run_path``). A hook on every ``torch.optim`` optimizer step
(``register_optimizer_step_post_hook``) counts the steps of the first optimizer that steps; after ``steps``
of them the trial reports ``fits`` and ends the process where it is. The hooks read the data high-water mark at
every step (and before the first step's update) as a probe's is read, so that the batches a ``DataLoader``'s
workers send as shared memory are not counted as data (``PEAK``, :data:`harness.fresh_process.CHILD_PRELUDE`).

The verdict is ``fits``, ``oom`` (a ``MemoryError`` or an allocation error from torch, seen where it is
raised by a trace function on exception events, so one the script catches counts too; or a native abort
that says so) or ``error`` (the script ended, or raised anything else, before its steps: :func:`fits_as_is`
raises it as :class:`HarnessError`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .fresh_process import CHILD_PRELUDE, HarnessError, bisect, read_report, run_child

__all__ = ["AsIsTrial", "HarnessError", "fits_as_is", "largest_fitting_as_is", "run_as_is_trial"]

PLACEHOLDER = "{batch}"
Kind = Literal["fits", "oom", "error"]

#: The trial process: ``python -c CHILD REPORT_PATH SCRIPT STEPS [SCRIPT_ARGS...]``.
CHILD = (
    CHILD_PRELUDE
    + r"""
import json, os, runpy, sys, threading, traceback

report_path, script, steps = sys.argv[1:4]
steps = int(steps)
sys.argv = [script, *sys.argv[4:]]
sys.path.insert(0, os.path.dirname(script))
report = {"steps": 0}



def finish(kind, code, exc=None):
    sys.settrace(None)
    report["kind"] = kind
    if exc is not None:
        report["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    report["peak_estimate"] = PEAK.read()
    report["vm_data_end"] = vm("VmData")[0]
    with open(report_path, "w") as handle:
        json.dump(report, handle)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def is_oom(exc):
    if isinstance(exc, MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(mark in str(exc).lower() for mark in OOM_MARKS)


def on_call(frame, event, arg):
    frame.f_trace_lines = False
    return on_event


def on_event(frame, event, arg):
    if event == "exception" and is_oom(arg[1]):  # where it is raised, caught later or not
        traceback.print_exception(arg[0], arg[1], arg[2])
        finish("oom", EXIT_OOM, arg[1])
    return on_event


first = None


def before_step(optimizer, args, kwargs):
    if first is None:  # the first step's forward and backward, read before the optimizer's state exists
        PEAK.read()


def after_step(optimizer, args, kwargs):
    global first
    PEAK.read()  # at every optimizer's step, as a probe's peak is read
    if first is None:
        first = id(optimizer)
    if id(optimizer) == first:
        report["steps"] += 1
        if report["steps"] >= steps:
            finish("fits", EXIT_FITS)


try:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(before_step)
    register_optimizer_step_post_hook(after_step)
    report["baseline_bytes"] = vm("VmData")[0]  # after import torch, before the script
    sys.settrace(on_call)
    threading.settrace(on_call)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        ended = f"the script ended (exit code {exc.code}) after {report['steps']} optimizer step(s)"
    else:
        ended = f"the script ended after {report['steps']} optimizer step(s)"
    sys.settrace(None)
    finish("error", EXIT_ERROR, RuntimeError(f"{ended}, fewer than {steps}"))
except BaseException as exc:
    traceback.print_exc()
    finish("oom" if is_oom(exc) else "error", EXIT_OOM if is_oom(exc) else EXIT_ERROR, exc)
"""
)


@dataclass(frozen=True)
class AsIsTrial:
    """One trial's outcome: ``kind``, the optimizer steps that ran and the figures the process reported."""

    kind: Kind
    args: tuple[str, ...]
    budget_bytes: int
    seconds: float
    steps: int = 0
    baseline_bytes: int | None = None  # VmData after import torch, before the script
    vm_data_end: int | None = None
    #: The data high-water mark, read at every optimizer step and at the end as autobatch reads a probe's (the
    #: prelude's ``PEAK``: :data:`harness.fresh_process.CHILD_PRELUDE`).
    peak_estimate: int | None = None
    detail: str = ""


def run_as_is_trial(
    script: str | Path,
    args: Sequence[str],
    budget_bytes: int,
    steps: int = 10,
    timeout: float = 1800.0,
) -> AsIsTrial:
    """Run ``script`` with ``args`` as ``__main__`` in one fresh process capped at ``budget_bytes``, until
    ``steps`` optimizer steps (or its end, or an out-of-memory error)."""
    path = Path(script).resolve()

    def command(report: Path) -> list[str]:
        return [sys.executable, "-c", CHILD, str(report), str(path), str(steps), *args]

    def read(report: Path, logs: Path, code: int, seconds: float) -> AsIsTrial:
        return _read(report, logs, code, tuple(args), budget_bytes, seconds)

    return run_child(command, read, budget_bytes, timeout, f"{path.name} {' '.join(args)}")


def fits_as_is(
    script: str | Path, args: Sequence[str], budget_bytes: int, steps: int = 10, timeout: float = 1800.0
) -> bool:
    """Whether ``steps`` optimizer steps of ``script`` with ``args`` run in a fresh process capped at
    ``budget_bytes`` (raises :class:`HarnessError` on a failure that is not out of memory)."""
    trial = run_as_is_trial(script, args, budget_bytes, steps, timeout)
    if trial.kind == "error":
        raise HarnessError(f"{Path(script).name} {' '.join(args)}: {trial.detail}")
    return trial.kind == "fits"


def substitute(template: Sequence[str], batch: int) -> list[str]:
    """The arguments with ``{batch}`` replaced (``--bs={batch}`` too)."""
    return [arg.replace(PLACEHOLDER, str(batch)) for arg in template]


def largest_fitting_as_is(
    script: str | Path,
    args_template: Sequence[str],
    budget_bytes: int,
    lo: int,
    hi: int,
    steps: int = 10,
    timeout: float = 1800.0,
) -> int:
    """The largest batch in ``[lo, hi]`` that fits, ``{batch}`` in ``args_template`` replaced by it, by
    bisection (fitting is assumed monotone in the batch size); ``lo - 1`` when none does. About
    ``log2(hi - lo + 2)`` trials: give a tight bracket."""
    if not any(PLACEHOLDER in arg for arg in args_template):
        raise ValueError(f"no {PLACEHOLDER} in the arguments {list(args_template)}")
    return bisect(
        lo,
        hi,
        lambda batch: fits_as_is(script, substitute(args_template, batch), budget_bytes, steps, timeout),
    )


def _read(
    report: Path, logs: Path, code: int, args: tuple[str, ...], budget_bytes: int, seconds: float
) -> AsIsTrial:
    """A trial process's outcome from its report, or, without one, from its exit and its output."""
    data, tail = read_report(report, logs, code)
    kind = data["kind"]
    if "no_report" in data:
        return AsIsTrial(kind, args, budget_bytes, seconds, detail=data["no_report"])
    detail = "" if kind == "fits" else f"{data.get('error', '')}\n{tail[-1500:]}".strip()
    return AsIsTrial(
        kind, args, budget_bytes, seconds, data.get("steps", 0), data.get("baseline_bytes"),
        data.get("vm_data_end"), data.get("peak_estimate"), detail,
    )  # fmt: skip
