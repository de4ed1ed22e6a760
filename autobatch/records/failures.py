"""The one translation between exceptions and outcomes, both ways across the process boundary.

In a probe process, :func:`describe_failure` turns whatever the script or autobatch raised into the
fields of a :class:`ProbeOutcome` (an exception never crosses a process boundary, only a record).
In the parent, :func:`raise_for` turns an outcome that carries no answer (``error``, ``crash``,
``timeout``) back into the :class:`~autobatch.errors.AutobatchError` the CLI reports, and
:func:`server_error` does the same for a probe server that could not start.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from autobatch.core.units import format_bytes
from autobatch.errors import (
    HINT_MARK,
    AutobatchError,
    CompileFailed,
    ContractError,
    ProbeFailure,
    ScriptError,
    UsageError,
)
from autobatch.records.protocol import ProbeOutcome
from autobatch.settings.levers import neutral


def describe_failure(outcome: ProbeOutcome, exc: BaseException, *, kind: str = "error") -> ProbeOutcome:
    """Fill ``outcome`` with ``exc`` as data: its type, message (with the hint of an autobatch error),
    traceback, and whether it is a broken contract. An ``oom`` keeps no traceback (it is an answer)."""
    outcome.kind = kind
    outcome.error_type = type(exc).__name__
    # an autobatch error's text is its message, HINT_MARK and its hint, which raise_for parts again
    outcome.error_message = str(exc) or "(it carries no message)"
    outcome.contract = isinstance(exc, ContractError)
    outcome.traceback = None if kind == "oom" else script_traceback(exc) or None
    return outcome


#: autobatch's own source folder: its frames are left out of the tracebacks of the script's errors.
PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)


def script_traceback(exc: BaseException) -> str:
    """The traceback of an exception without autobatch's own frames: the script's frames (and those of
    the libraries it called) are what the user can act on.

    An exception of the script's that has no frame outside autobatch (raised by autobatch's code on what
    the script returned) keeps its whole traceback: ``--verbose`` shows where it was raised. autobatch's own
    error raised there (a broken contract) has none: its message and hint say it all (empty text).
    """
    raised = traceback.extract_tb(exc.__traceback__)
    frames = [f for f in raised if not f.filename.startswith(PACKAGE_DIR)]
    if not frames and isinstance(exc, AutobatchError):
        return ""
    frames = frames or raised
    text = "Traceback (most recent call last):\n" if frames else ""
    text += "".join(traceback.format_list(frames))
    ending = "".join(traceback.format_exception_only(type(exc), exc))
    if isinstance(exc, AutobatchError) and exc.hint:  # its hint goes beside the traceback, not twice
        ending = ending.replace(f"{HINT_MARK}{exc.hint}", "", 1)
    return text + ending


def with_last_lines(outcome: ProbeOutcome, lines: int = 8) -> None:
    """Put the last ``lines`` lines of the probe's log into an error's message (before its hint): what a script
    run as it is printed last is what tells why it stopped (the whole log is in the detail, with --verbose)."""
    if outcome.kind != "error" or not outcome.log_tail:
        return
    message, mark, hint = (outcome.error_message or "").partition(HINT_MARK)
    last = "\n".join("  " + line for line in outcome.log_tail.splitlines()[-lines:])
    outcome.error_message = f"{message}\nits last lines:\n{last}{mark}{hint}"


def raise_for(outcome: ProbeOutcome, what: str) -> None:
    """Raise the error an outcome without an answer stands for (``what``: what was being done).

    ``error`` is the script's own exception (or a broken contract, or a :class:`ProbeFailure` of the
    probe layer itself, such as an unknown operation); ``crash`` and ``timeout`` are a probe that did
    not report. Outcomes that are answers (``fits``, ``oom``) raise nothing.
    """
    if outcome.kind in ("fits", "oom"):
        return
    detail = "\n".join(
        x for x in (outcome.traceback, outcome.log_tail and f"probe log:\n{outcome.log_tail}") if x
    )
    if outcome.contract or outcome.error_type == ProbeFailure.__name__:
        message, _, hint = (outcome.error_message or "").partition(HINT_MARK)
        kind = ContractError if outcome.contract else ProbeFailure
        raise kind(message, hint=hint or None, detail=detail or None)
    if outcome.info.get("compile_error"):
        message = (outcome.error_message or "").partition(HINT_MARK)[0]
        raise CompileFailed(
            f"does not compile: {message}",
            hint=f"torch.compile could not compile the model; search without {neutral('compile')}, or fix what the "
            f"message names ({neutral('verbose')} for the compiler's traceback)",
            detail=detail or None,
        )
    if outcome.kind in ("crash", "timeout"):
        hint = (
            "the probe did not finish in time. A probe that hangs before its first step (importing the script, "
            "building the model) waits on something the script does at import or in build_model: a thread or a "
            "multiprocessing pool it joins, input, the network, a lock (import the script in a plain `python -c` "
            f"to see); a model that is only slow needs a larger {neutral('timeout')} ({neutral('verbose')} for its log)"
            if outcome.kind == "timeout"
            else crash_hint(outcome.reason or "")
        )
        raise ProbeFailure(f"{what}: {outcome.reason}", hint=hint, detail=detail or None)
    message, _, _hint = (outcome.error_message or "").partition(HINT_MARK)
    raise ScriptError(
        f"the training script raised {outcome.error_type} while {what}: {message}",
        hint="this is the script's own error, not an out-of-memory; fix the script "
        f"({neutral('verbose')} for the traceback)",
        detail=detail or None,
    )


#: How an error that is no answer about memory says so (a script run as it is that ran out of data).
NOTHING_OF_MEMORY = "this says nothing about memory"


def with_larger_oom(
    error: ScriptError | ContractError,
    batch_size: int,
    outcomes: Iterable[ProbeOutcome],
    batch_multiple: int = 1,
) -> ScriptError | ContractError:
    """The script's ``error`` at ``batch_size``, with what the smallest larger batch of ``outcomes`` that ran
    out of memory did ("fix the script" is half the answer then); ``error`` itself when none did.

    When no batch (a multiple of ``batch_multiple``) lies between them, fixing the script alone gives at most
    ``batch_size``, and making the larger batch fit alone gives nothing (a BatchNorm model at batch 1).
    """
    larger = [o for o in outcomes if o.kind == "oom" and o.batch_size > batch_size]
    if not larger or NOTHING_OF_MEMORY in error.message:  # no memory answer to set beside the larger one
        return error
    oom = min(larger, key=lambda o: o.batch_size)
    peak = f"peak {format_bytes(oom.peak_bytes)}, " if oom.peak_bytes else ""
    budget = f"budget {format_bytes(oom.budget_bytes)}" if oom.budget_bytes else "over the budget"
    message = f"{error.message}; and batch {oom.batch_size} ran out of memory ({peak}{budget})"
    if oom.batch_size - batch_size > batch_multiple:
        return type(error)(message, hint=error.hint, detail=error.detail)
    why = " (a layer that needs more than one sample in training, such as BatchNorm, fails there)"
    return type(error)(
        message + f", so batch {batch_size} is the only one that could fit, and it fails",
        hint=f"make the step run at batch {batch_size}{why if batch_size == 1 else ''}, or make batch "
        f"{oom.batch_size} fit (more {neutral('memory')}, bf16, a lighter optimizer, recomputation); "
        f"{neutral('verbose')} for the traceback",
        detail=error.detail,
    )


def crash_hint(reason: str) -> str:
    """What to do about a probe process that died, by how it died (never "raise --timeout")."""
    if "SIGSEGV" in reason or "SIGBUS" in reason or "SIGILL" in reason:
        return (
            "the probe process hit a native crash (segmentation fault): a bug in compiled code the step runs "
            "(an extension, a custom kernel, a driver) or in the script, not a lack of memory; "
            f"{neutral('verbose')} for its log"
        )
    if "SIGKILL" in reason:
        return (
            "the probe process was killed (SIGKILL): usually the kernel's out-of-memory killer, when the machine "
            f"has less free memory than {neutral('memory')} allows; lower {neutral('memory')}, or stop what else uses "
            "memory"
        )
    return f"the probe process died (a signal, an abort, an illegal memory access): {neutral('verbose')} for its log"


def server_error(error: dict[str, Any]) -> AutobatchError:
    """The error a probe server reported instead of ``ready`` (it could not import torch or the script)."""
    message = error.get("message") or "the probe server failed to start"
    code = error.get("exit_code")
    detail = error.get("detail") or error.get("traceback")
    if code == UsageError.exit_code:
        return UsageError(message, hint=error.get("hint"), detail=detail)
    if error.get("type") == "ContractError":
        return ContractError(message, hint=error.get("hint"), detail=detail)
    if code == ScriptError.exit_code:
        return ScriptError(message, hint=error.get("hint"), detail=detail)
    return ProbeFailure(message, hint=error.get("hint") or neutral("verbose"), detail=detail)
