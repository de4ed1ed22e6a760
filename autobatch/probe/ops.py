"""The operations a probe process runs, registered by name, and the one dispatch the server's children call.

An operation is a function ``handler(request, script[, options])`` registered with :func:`register`; the
built-in ``probe`` and ``inspect`` are registered by :mod:`autobatch.probe.worker`, other layers' in modules
the probe server imports at start-up because the client names them (``ProbeClient(..., op_modules=...)``):
this layer never names them. :func:`dispatch` decodes a request's options and turns whatever an operation
raises into an ``error`` outcome; :func:`report_and_exit` ends a process that ran code it does not control.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

from autobatch.errors import ProbeFailure
from autobatch.probe.files import note_sources
from autobatch.records.failures import describe_failure
from autobatch.records.protocol import ProbeOutcome, ProbeRequest

if TYPE_CHECKING:
    from autobatch.step.contract import UserScript

#: The module that registers the built-in operations; imported before the client's ``op_modules``.
BUILTIN_MODULES = ("autobatch.probe.worker", "autobatch.probe.fresh", "autobatch.probe.as_is")

OptionsT = TypeVar("OptionsT")
OptionsT_co = TypeVar("OptionsT_co", covariant=True)


class OptionsType(Protocol[OptionsT_co]):
    """A class of options records: ``from_dict`` decodes what the record's ``to_dict`` wrote."""

    def from_dict(self, data: dict[str, Any], /) -> OptionsT_co: ...


Handler = Callable[[ProbeRequest, "UserScript"], ProbeOutcome]
OptionsHandler = Callable[[ProbeRequest, "UserScript", OptionsT], ProbeOutcome]

_OPERATIONS: dict[str, Handler] = {}


@overload
def register(name: str) -> Callable[[Handler], Handler]: ...
@overload
def register(
    name: str, options_type: OptionsType[OptionsT]
) -> Callable[[OptionsHandler[OptionsT]], OptionsHandler[OptionsT]]: ...
def register(name: str, options_type: OptionsType[Any] | None = None) -> Callable[[Any], Any]:
    """Register the decorated function as the operation ``name`` (with its options' record type).

    An operation's options are a typed record, a frozen dataclass with ``to_dict`` and ``from_dict``. The parent
    builds the record and sends ``to_dict()`` as :attr:`ProbeRequest.options` (requests cross the process
    boundary as JSON); :func:`dispatch` decodes it with ``from_dict`` before it calls the handler. Modules that
    register operations are imported after the script and before any fork.
    """

    def decorate(handler: Callable[..., ProbeOutcome]) -> Callable[..., ProbeOutcome]:
        if name in _OPERATIONS:
            raise ValueError(f"the probe operation {name!r} is registered twice")
        if options_type is None:
            _OPERATIONS[name] = handler
        else:
            _OPERATIONS[name] = lambda request, script: handler(
                request, script, options_type.from_dict(request.options)
            )
        return handler

    return decorate


def operations() -> list[str]:
    """The names of the registered operations."""
    return sorted(_OPERATIONS)


def load_operations(modules: Iterable[str]) -> None:
    """Import the modules that register operations: the built-in ones, then ``modules``."""
    for name in (*BUILTIN_MODULES, *modules):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ProbeFailure(
                f"the probe server cannot import the operations module {name}: {exc}",
                hint="op_modules names importable modules that register probe operations",
            ) from exc


def dispatch(request: ProbeRequest, script: UserScript) -> ProbeOutcome:
    """Run the request's operation in this process; never raises (an exception becomes an outcome)."""
    try:
        handler = _OPERATIONS.get(request.op)
        if handler is None:
            raise ProbeFailure(
                f"the probe server has no operation {request.op!r} (it has {', '.join(operations())})",
                hint="the client names the module that registers it in op_modules",
            )
        return handler(request, script)
    except BaseException as exc:  # noqa: BLE001 - whatever an operation raises becomes data
        return describe_failure(ProbeOutcome(kind="error", batch_size=request.batch_size), exc)


#: In a probe process: the pipe its outcome goes to (set by the server before it runs the request).
outcome_fd: int | None = None
#: The modules the probe process was forked with (None: not a probe process): what it imports besides is
#: reported on its outcome (:data:`LAZY_IMPORTS`).
modules_at_fork: frozenset[str] | None = None
#: The outcome's ``info`` key of the installed packages' modules the probe imported itself (a library's lazy
#: imports: ``accelerate``'s ``Accelerator()`` takes ``torch.distributed`` and ``sympy``); the daemon's warm
#: parents import them too (:func:`autobatch.probe.forked.learn`).
LAZY_IMPORTS = "lazy_imports"


def write_report(fd: int, outcome: ProbeOutcome, **extra: Any) -> None:
    """One report line on a pipe: ``{"outcome": ..., **extra}`` (a rank's, a fresh process's), with the user's
    modules it ran among its files read (:func:`autobatch.probe.files.note_sources`)."""
    note_sources(outcome)
    write_all(fd, (json.dumps({"outcome": outcome.to_dict(), **extra}) + "\n").encode())


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (a pipe takes a large record in several writes)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_outcome(fd: int, outcome: ProbeOutcome) -> None:
    """Write an outcome record to the probe's pipe (the server reads it to the end of the pipe), with the
    installed packages' modules the probe imported itself and the user's own modules it ran among its files read
    (:func:`autobatch.probe.files.note_sources`)."""
    note_sources(outcome)
    if modules_at_fork is not None:
        outcome.info[LAZY_IMPORTS] = installed_since(modules_at_fork)
    write_all(fd, json.dumps(outcome.to_dict()).encode())


def installed_since(before: frozenset[str]) -> list[str]:
    """The modules imported since ``before`` that are installed packages' (their file in a site folder)."""
    from autobatch.cache.sources import in_site_folder
    from autobatch.probe.warming import loaded_since

    return sorted(
        n for n, path in loaded_since(before).items() if in_site_folder(path) and not n.startswith("__")
    )


def report_and_exit(outcome: ProbeOutcome) -> None:
    """Write the outcome and end this probe process now, wherever it is: a script run as it is is ended
    from inside its own loop (its ``finally`` blocks, checkpoint saving and worker joins never run;
    whatever it started is killed by the server, their subreaper)."""
    assert outcome_fd is not None, "only in a probe process"
    code = 0
    try:
        write_outcome(outcome_fd, outcome)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - the server reports a probe that wrote nothing as a crash
        code = 70
    os._exit(code)
