"""Decide, in one place, whether a compiled probe failed because its model does not compile.

With ``--compile``, a model that does not compile is an *answer* about that combination ("does not compile:
..."), not a crash of the tune and not the script's error. :func:`note_compile_failure` decides it from the
exception chain (:func:`compiler_link`: an exception of a class defined in :data:`COMPILER_MODULES`), after
:mod:`autobatch.probe.oom` found no out-of-memory in it. Type names and modules are compared as strings, so
this module never imports torch.
"""

from __future__ import annotations

from autobatch.probe.oom import exception_chain
from autobatch.records.protocol import ProbeOutcome

#: Modules (and their submodules) whose exceptions are the compiler's.
COMPILER_MODULES: tuple[str, ...] = ("torch._dynamo", "torch._inductor")

#: ``ProbeOutcome.error_type`` of a model that does not compile.
COMPILE_ERROR = "CompileError"


def compiler_link(exc: BaseException) -> BaseException | None:
    """The first exception of ``exc``'s chain whose class (or a base) comes from :data:`COMPILER_MODULES`.

    The chain is ``__cause__``, ``__context__`` and group members; the compiler's classes are Dynamo's
    ``BackendCompilerFailed``, ``Unsupported``, ``TorchRuntimeError``, ``InternalTorchDynamoError``, inductor's
    ``InductorError``, ``CppCompileError``, ``InvalidCxxCompiler``, ``LoweringException``, ... The compiler runs
    inside the step's first forward and backward (and at a recompilation), so the place it is raised from is its
    class's module; an exception the script raises itself keeps its own type (Dynamo lets the script's code raise
    as it would without compiling). An OOM wrapped by the compiler is still an OOM: the batch did not fit.

    Caveat: an operation that fails while Dynamo traces it with fake tensors (a shape mismatch the script would
    also hit without compiling) comes back as Dynamo's ``TorchRuntimeError`` and is reported as a compile
    failure, with the operation's message; the same combination without ``--compile`` reports it as the
    script's error.
    """
    for link in exception_chain(exc):
        if any(_from_compiler(cls.__module__) for cls in type(link).__mro__):
            return link
    return None


def first_line(exc: BaseException) -> str:
    """The compiler's message in one line: its first line that says something, followed by what the first
    line announces when it only announces it (a wrapper's ``backend='inductor' raised:``, then the backend's
    error; Dynamo's summary, then its ``Explanation:``, which names the operation and its error)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if len(lines) > 1 and lines[0].endswith("raised:"):
        return f"{lines[0]} {lines[1]}"
    if len(lines) > 1 and lines[1].startswith("Explanation:"):
        return f"{lines[0]}: {lines[1].removeprefix('Explanation:').strip()}"
    return lines[0]


def note_compile_failure(outcome: ProbeOutcome, exc: BaseException) -> bool:
    """Turn a failed compiled probe's ``error`` outcome into a compile failure when the compiler raised:
    ``error_type`` :data:`COMPILE_ERROR`, the compiler's first line as the message, ``info["compile_error"]``
    (the traceback stays, for ``--verbose``); returns whether it did. Call only for a probe that compiles and
    whose failure is no OOM."""
    link = compiler_link(exc)
    if link is None:
        return False
    outcome.kind = "error"
    outcome.error_type = COMPILE_ERROR
    outcome.error_message = first_line(link)
    outcome.contract = False
    outcome.info["compile_error"] = True
    outcome.info["compile_error_type"] = type(link).__name__
    return True


def _from_compiler(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in COMPILER_MODULES)


__all__ = ["COMPILER_MODULES", "COMPILE_ERROR", "compiler_link", "first_line", "note_compile_failure"]
