"""The one exception tree of autobatch, and the exit codes the CLI maps it to.

::

    AutobatchError                 (exit 1)  anything autobatch reports on purpose
    ├── UsageError                 (exit 2)  bad flag, bad value, bad config file
    │   └── ConfigError            (exit 2)  every problem of a config file, collected
    ├── ContractError              (exit 3)  the training script breaks the user contract
    │   ├── NoBlocksError          (exit 3)  recomputation asked for a model without repeated blocks
    │   └── DataDependentError     (exit 3)  with --strict: the step's peak depends on the data
    ├── ScriptError                (exit 3)  the training script raised during a probe
    ├── NothingFitsError           (exit 4)  no combination fits even the smallest batch
    ├── JobOutOfMemory             (exit 5)  ``run``: the job ran out of memory and no relaunch is left
    ├── GuardError                 (exit 5)  in a job: the guard ran out of memory at a micro-batch of 1, or
    │                                        the model refused a micro-batch of 1 (BatchNorm); ``run``: its
    │                                        job ended with one
    ├── ProbeFailure               (exit 6)  a probe crashed or timed out where an answer was needed
    ├── DeviceError                (exit 7)  the device cannot be used (no driver, no GPU, ...)
    ├── LeakError                  (exit 8)  the step's peak grows at every step: no batch holds for a job
    └── DaemonError                (exit 1)  the daemon cannot be started, reached or asked (``autobatch daemon``)

``autobatch check`` exits with 5 when the batch runs out of memory (an answer, not an error), and so does
``autobatch lengths --fail-on-overflow`` when a batch of the data would. ``autobatch run`` otherwise exits
with its job's own exit code.
An interrupted run exits with 128 + the signal: 130 (SIGINT), 143 (SIGTERM) or 129 (SIGHUP).
Every error carries a ``hint``: what to do about it. Its text (``str(error)``, what a traceback in your own
process prints) is the message and, on a line of its own, the hint; the CLI prints the two apart (``error:``,
``hint:``) from ``message`` and ``hint``.
"""

from __future__ import annotations

EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_SCRIPT = 3
EXIT_NOTHING_FITS = 4
EXIT_OOM = 5
EXIT_PROBE_FAILURE = 6
EXIT_DEVICE = 7
EXIT_LEAK = 8
EXIT_SIGINT = 130
EXIT_SIGTERM = 143
EXIT_SIGHUP = 129

#: Separates an error's message from its hint in its text (``str(error)``).
HINT_MARK = "\nhint: "


class AutobatchError(Exception):
    """Base of every error autobatch raises on purpose."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str, hint: str | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        #: Long text shown only with --verbose (a traceback, a log tail).
        self.detail = detail

    def __str__(self) -> str:
        """The message and its hint: raised in a user's own process (the API, the guard), a traceback prints this,
        and a hint left out of it is never seen. What renders an error itself reads ``message`` and ``hint``."""
        return f"{self.message}{HINT_MARK}{self.hint}" if self.hint else self.message


class UsageError(AutobatchError):
    """A flag, value or file given by the user is wrong."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """One or more problems in settings; ``problems`` holds each, already formatted."""

    def __init__(self, problems: list[str], hint: str | None = None) -> None:
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"{len(problems)} {noun} in the settings:\n  - " + "\n  - ".join(problems), hint)
        self.problems = problems


class ContractError(AutobatchError):
    """The training script lacks a required function or returns the wrong thing."""

    exit_code = EXIT_SCRIPT


class NoBlocksError(ContractError):
    """Recomputation was asked for, but the model has no repeated blocks to wrap.

    A broken contract in a real probe; a simulation reports it as a scenario that cannot run.
    """


class DataDependentError(ContractError):
    """With ``strict``: the step's peak depends on the data (``make_batch`` must return the worst case)."""


class ScriptError(AutobatchError):
    """The training script raised an exception that is not an out-of-memory error."""

    exit_code = EXIT_SCRIPT


class CompileFailed(ScriptError):
    """``torch.compile`` failed on the model (a combination with compile): an answer for that combination
    ("does not compile"), the other combinations go on; from ``check --compile``, exit 3 as a script error."""


class NothingFitsError(AutobatchError):
    """No searched combination fits even the smallest batch."""

    exit_code = EXIT_NOTHING_FITS


class JobOutOfMemory(AutobatchError):
    """``autobatch run``: the job ran out of memory, and it cannot be relaunched (``--max-restarts`` used up, or
    already at a micro-batch of 1)."""

    exit_code = EXIT_OOM


class GuardError(AutobatchError):
    """In a job, :class:`autobatch.Guard` cannot run the batch it names (``step``: the global batch, 0-based;
    ``shapes``: its tensors' shapes): it ran out of memory even one sample at a time, or the model refused a
    micro-batch of 1 sample (BatchNorm in training)."""

    exit_code = EXIT_OOM

    def __init__(
        self, message: str, hint: str | None = None, step: int = 0, shapes: list[list[int]] | None = None
    ):
        super().__init__(message, hint)
        self.step = step
        self.shapes = shapes or []


class ProbeFailure(AutobatchError):
    """A probe crashed or timed out where the run needed an answer."""

    exit_code = EXIT_PROBE_FAILURE


class DeviceError(AutobatchError):
    """The requested device cannot be used."""

    exit_code = EXIT_DEVICE


class LeakError(AutobatchError):
    """The step's peak grows at every step: something keeps each step's tensors, so no batch size holds for a
    job's length (reported instead of "nothing fits", which the failed confirmations would otherwise read as)."""

    exit_code = EXIT_LEAK


class DaemonError(AutobatchError):
    """The daemon cannot be started or reached, or refused a request (``daemon = "on"``, ``autobatch daemon``)."""

    exit_code = EXIT_INTERNAL
