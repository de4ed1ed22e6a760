"""Decide, in one place, whether a failed probe ran out of memory or the training script is broken.

A probe that runs out of memory is an *answer* (this batch does not fit); any other exception is the
*script's error*. :func:`classify_exception` applies a table of rules over the exception chain's type
names and messages (definite OOMs, ambiguous ones that count only near the budget, the script's own
exception types), without importing torch. The rules are listed in docs/reliability.md ("Out of memory,
or the script's error"). :func:`explain_traceback` applies the same rules to a process's printed traceback
(``autobatch run`` reads its job's stderr).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

Classification = Literal["oom", "error"]

#: An ambiguous failure (oneDNN, cuDNN) is an OOM when the probe had used at least this fraction of
#: its budget. The failed request itself is not known for these messages, and it can be large (a
#: convolution's scratchpad or workspace), so the threshold leaves room for a request of up to a fifth
#: of the budget (docs/measurements/in-the-code.md).
NEAR_BUDGET_FRACTION: float = 0.8

#: Exception types that a script raises for its own reasons: never an OOM by their message alone
#: (an OOM in their ``__cause__``/``__context__`` chain still counts).
SCRIPT_ERROR_TYPES: frozenset[str] = frozenset(
    {
        "ValueError",
        "TypeError",
        "KeyError",
        "IndexError",
        "AttributeError",
        "NameError",
        "AssertionError",
        "NotImplementedError",
        "ZeroDivisionError",
    }
)

#: ``cudaErrorMemoryAllocation`` and ``hipErrorOutOfMemory`` (both 2): the code an ``AcceleratorError``
#: carries (as ``error_code`` in recent PyTorch) when the device ran out of memory.
OOM_ERROR_CODES: frozenset[int] = frozenset({2})


@dataclass(frozen=True)
class Rule:
    """One face of an out-of-memory failure."""

    name: str
    #: Class names of which at least one must be in the exception's MRO; empty: any type except
    #: :data:`SCRIPT_ERROR_TYPES`.
    types: frozenset[str]
    #: Searched in the message; ``None``: the type alone decides.
    pattern: re.Pattern[str] | None
    #: An ambiguous rule is an OOM only near the budget.
    ambiguous: bool = False


def _rx(pattern: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(pattern, flags)


_NONE: frozenset[str] = frozenset()

RULES: tuple[Rule, ...] = (
    Rule("out-of-memory-error", frozenset({"OutOfMemoryError"}), None),
    Rule("python-memory-error", frozenset({"MemoryError"}), None),
    Rule(
        "accelerator-out-of-memory",
        frozenset({"AcceleratorError"}),
        _rx(r"out of memory|cudaErrorMemoryAllocation|hipErrorOutOfMemory", re.IGNORECASE),
    ),
    Rule(
        "device-out-of-memory",
        _NONE,
        _rx(
            r"\b(?:CUDA|HIP|XPU|MPS)\b[^\n]{0,40}?\bout of memory"
            r"|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|hipErrorOutOfMemory",
            re.IGNORECASE,
        ),
    ),
    Rule(
        "gpu-library-alloc-failed",
        _NONE,
        _rx(
            r"\b(?:CUBLAS|CUSOLVER|CUSPARSE|CUDNN|HIPBLAS|MIOPEN)_STATUS_ALLOC_FAILED\b"
            r"|\bCUFFT_ALLOC_FAILED\b|\bCURAND_STATUS_ALLOCATION_FAILED\b|\bmiopenStatusAllocFailed\b"
        ),
    ),
    Rule("cpu-allocator", _NONE, _rx(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)")),
    Rule("bad-alloc", _NONE, _rx(r"\bbad_alloc\b")),
    Rule("enomem", _NONE, _rx(r"Cannot allocate memory|\[Errno 12\]")),
    Rule("onednn-primitive", _NONE, _rx(r"could not (?:create|execute) a primitive"), ambiguous=True),
    Rule("cudnn-not-supported", _NONE, _rx(r"\bCUDNN_STATUS_NOT_SUPPORTED\b"), ambiguous=True),
    Rule("cudnn-internal-error", _NONE, _rx(r"\bCUDNN_STATUS_INTERNAL_ERROR\b"), ambiguous=True),
    Rule(
        "cudnn-no-algorithm",
        _NONE,
        _rx(r"Unable to find a valid cuDNN algorithm|\b(?:GET|FIND) was unable to find an engine"),
        ambiguous=True,
    ),
    Rule("cublas-not-initialized", _NONE, _rx(r"\bCUBLAS_STATUS_NOT_INITIALIZED\b"), ambiguous=True),
)


@dataclass(frozen=True)
class Verdict:
    """A classification with the rule that decided it and a sentence saying why."""

    kind: Classification
    rule: str | None
    reason: str


def near_budget(used_bytes: int | None, budget_bytes: int | None) -> bool:
    """True when both figures are known and usage reached ``NEAR_BUDGET_FRACTION`` of the budget."""
    if used_bytes is None or budget_bytes is None or budget_bytes <= 0:
        return False
    return used_bytes >= NEAR_BUDGET_FRACTION * budget_bytes


def match_rule(type_names: Iterable[str], message: str, error_code: int | None = None) -> Rule | None:
    """The first rule of :data:`RULES` this failure matches (definite rules come first), or None."""
    names = {name.rsplit(".", 1)[-1] for name in type_names}
    scripted = bool(names & SCRIPT_ERROR_TYPES)
    for rule in RULES:
        if rule.types:
            if not names & rule.types:
                continue
            if rule.name == "accelerator-out-of-memory" and error_code in OOM_ERROR_CODES:
                return rule
        elif scripted:
            continue
        if rule.pattern is None or rule.pattern.search(message):
            return rule
    return None


def explain_message(
    type_name: str,
    message: str,
    *,
    used_bytes: int | None = None,
    budget_bytes: int | None = None,
    type_names: Iterable[str] = (),
    error_code: int | None = None,
) -> Verdict:
    """Classify one failure from its type name(s) and message (pure); see the module docstring."""
    rule = match_rule([type_name, *type_names], message, error_code)
    if rule is None:
        return Verdict("error", None, f"{_short(type_name)} is not an out-of-memory failure")
    if not rule.ambiguous:
        return Verdict("oom", rule.name, f"{_short(type_name)} is an out-of-memory failure ({rule.name})")
    if near_budget(used_bytes, budget_bytes):
        assert used_bytes is not None and budget_bytes is not None
        share = used_bytes / budget_bytes
        return Verdict(
            "oom",
            rule.name,
            f"{rule.name} at {share:.0%} of the budget (>= {NEAR_BUDGET_FRACTION:.0%}): out of memory",
        )
    where = (
        "with the usage unknown"
        if used_bytes is None or budget_bytes is None or budget_bytes <= 0
        else f"at {used_bytes / budget_bytes:.0%} of the budget (< {NEAR_BUDGET_FRACTION:.0%})"
    )
    return Verdict("error", rule.name, f"{rule.name} {where}: treated as the script's error")


def classify_message(
    type_name: str,
    message: str,
    *,
    used_bytes: int | None = None,
    budget_bytes: int | None = None,
    type_names: Iterable[str] = (),
    error_code: int | None = None,
) -> Classification:
    """``"oom"`` or ``"error"`` for one failure given as data (pure; no chain)."""
    return explain_message(
        type_name,
        message,
        used_bytes=used_bytes,
        budget_bytes=budget_bytes,
        type_names=type_names,
        error_code=error_code,
    ).kind


def explain_exception(
    exc: BaseException, *, used_bytes: int | None = None, budget_bytes: int | None = None
) -> Verdict:
    """Classify an exception and its chain: the first link that is an OOM decides, else ``"error"``."""
    first: Verdict | None = None
    for link in exception_chain(exc):
        verdict = explain_message(
            type(link).__name__,
            _message(link),
            used_bytes=used_bytes,
            budget_bytes=budget_bytes,
            type_names=_mro_names(type(link)),
            error_code=_error_code(link),
        )
        if verdict.kind == "oom":
            if link is not exc:
                return Verdict("oom", verdict.rule, f"{verdict.reason}, wrapped in {type(exc).__name__}")
            return verdict
        if first is None:
            first = verdict
    assert first is not None
    return first


def classify_exception(
    exc: BaseException, *, used_bytes: int | None = None, budget_bytes: int | None = None
) -> Classification:
    """``"oom"`` if this exception, or any exception in its chain, is an out-of-memory failure."""
    return explain_exception(exc, used_bytes=used_bytes, budget_bytes=budget_bytes).kind


#: The lines of a printed traceback: where one starts, the lines that chain two, an exception's own line.
TRACEBACK = "Traceback (most recent call last):"
_CHAINED = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
_EXCEPTION_LINE = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception))(?::\s?(.*))?$")


def explain_traceback(
    text: str, *, used_bytes: int | None = None, budget_bytes: int | None = None
) -> Verdict | None:
    """Classify the last traceback a process printed (its chain: the tracebacks joined by "During handling
    of ..." or "The above exception was the direct cause ..."): the first exception line in it that is an
    OOM decides; None when the text holds no traceback."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == TRACEBACK]
    if not starts:
        return None
    first = len(starts) - 1
    while first > 0 and any(c in line for line in lines[starts[first - 1] : starts[first]] for c in _CHAINED):
        first -= 1
    verdict: Verdict | None = None
    for line in lines[starts[first] :]:
        match = _EXCEPTION_LINE.match(line.rstrip())
        if match is None:
            continue
        found = explain_message(
            match.group(1), match.group(2) or "", used_bytes=used_bytes, budget_bytes=budget_bytes
        )
        if found.kind == "oom":
            return found
        verdict = found
    return verdict


def exception_chain(exc: BaseException, limit: int = 64) -> Iterator[BaseException]:
    """The exception, then its causes, contexts and group members, breadth first, each once."""
    seen: set[int] = set()
    queue: list[BaseException] = [exc]
    while queue and len(seen) < limit:
        link = queue.pop(0)
        if id(link) in seen:
            continue
        seen.add(id(link))
        yield link
        for nxt in (link.__cause__, link.__context__):
            if nxt is not None:
                queue.append(nxt)
        members = getattr(link, "exceptions", None)
        if isinstance(members, (tuple, list)):
            queue.extend(m for m in members if isinstance(m, BaseException))


def _mro_names(cls: type) -> list[str]:
    return [k.__name__ for k in cls.__mro__]


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the classification
        text = ""
    errno = getattr(exc, "errno", None)
    if errno == 12 and "[Errno 12]" not in text:  # ENOMEM from an OSError built without strerror
        text += " [Errno 12]"
    return text


def _error_code(exc: BaseException) -> int | None:
    code = getattr(exc, "error_code", None)
    return code if isinstance(code, int) else None


def _short(type_name: str) -> str:
    return type_name.rsplit(".", 1)[-1]


__all__ = [
    "NEAR_BUDGET_FRACTION",
    "OOM_ERROR_CODES",
    "RULES",
    "SCRIPT_ERROR_TYPES",
    "TRACEBACK",
    "Classification",
    "Rule",
    "Verdict",
    "classify_exception",
    "classify_message",
    "explain_exception",
    "exception_chain",
    "explain_message",
    "explain_traceback",
    "match_rule",
    "near_budget",
]
