"""Which failures of a compiled probe are the compiler's: decided over exception classes' modules, in one place."""

from __future__ import annotations

import pytest

from autobatch.probe.compile_errors import COMPILE_ERROR, compiler_link, first_line, note_compile_failure
from autobatch.probe.oom import classify_exception
from autobatch.records.protocol import ProbeOutcome


def _compiler_class(name: str, module: str, base: type[Exception] = RuntimeError) -> type[Exception]:
    return type(name, (base,), {"__module__": module})


BackendCompilerFailed = _compiler_class("BackendCompilerFailed", "torch._dynamo.exc")
InductorError = _compiler_class("InductorError", "torch._inductor.exc")
TorchRuntimeError = _compiler_class("TorchRuntimeError", "torch._dynamo.exc")
Subclassed = _compiler_class("MyError", "user.module", base=InductorError)


def _raised(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as exc:  # noqa: BLE001
        return exc


@pytest.mark.parametrize(
    ("exc", "found"),
    [
        (
            BackendCompilerFailed(
                "backend='inductor' raised:\nCppCompileError: C++ compile error\n\nSet ..."
            ),
            True,
        ),
        (InductorError("InvalidCxxCompiler: No working C++ compiler found"), True),
        (Subclassed("a subclass of the compiler's error"), True),
        (_raised(ValueError("the script's wrapper"), InductorError("x")), True),  # in the chain
        (ValueError("the script's own"), False),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
        (_compiler_class("Oops", "torch._dynamo_lookalike")("not dynamo's module"), False),
    ],
)
def test_the_compilers_exceptions_are_told_by_their_module(exc: BaseException, found: bool) -> None:
    assert (compiler_link(exc) is not None) is found


@pytest.mark.parametrize(
    ("message", "line"),
    [
        (
            "backend='inductor' raised:\nCppCompileError: C++ compile error\n\nSet TORCHDYNAMO_VERBOSE=1",
            "backend='inductor' raised: CppCompileError: C++ compile error",
        ),
        (
            "RuntimeError when making fake tensor call\n  Explanation: Dynamo failed to run FX node: got "
            "RuntimeError('a and b')\n  Hint: Your code may result in an error",
            "RuntimeError when making fake tensor call: Dynamo failed to run FX node: got RuntimeError('a and b')",
        ),
        (
            "InvalidCxxCompiler: No working C++ compiler found\n\nSet TORCHDYNAMO_VERBOSE=1",
            "InvalidCxxCompiler: No working C++ compiler found",
        ),
        ("", "TorchRuntimeError"),
    ],
)
def test_the_message_is_one_line_that_says_something(message: str, line: str) -> None:
    assert first_line(TorchRuntimeError(message)) == line


def test_a_compile_failure_is_noted_on_an_error_outcome() -> None:
    exc = InductorError("InvalidCxxCompiler: No working C++ compiler found\n\nmore")
    outcome = ProbeOutcome(kind="error", error_type="InductorError", error_message=str(exc), traceback="tb")
    assert note_compile_failure(outcome, exc)
    assert outcome.kind == "error" and outcome.error_type == COMPILE_ERROR
    assert outcome.error_message == "InvalidCxxCompiler: No working C++ compiler found"
    assert outcome.info == {"compile_error": True, "compile_error_type": "InductorError"}
    assert outcome.traceback == "tb"  # kept for --verbose
    plain = ProbeOutcome(kind="error", error_type="ValueError")
    assert not note_compile_failure(plain, ValueError("the script's"))
    assert plain.error_type == "ValueError" and "compile_error" not in plain.info


def test_an_oom_inside_the_compiler_stays_an_oom() -> None:
    # The worker asks the OOM rules first: a compiler that ran out of memory says the batch did not fit.
    exc = _raised(BackendCompilerFailed("backend='inductor' raised:\nMemoryError"), MemoryError())
    assert classify_exception(exc) == "oom"
    assert classify_exception(InductorError("InvalidCxxCompiler: No working C++ compiler found")) == "error"
