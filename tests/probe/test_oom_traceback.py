"""A job's printed traceback classified by the same rules as every probe's exception."""

from __future__ import annotations

from autobatch.probe.oom import explain_traceback

CPU_OOM = """step 3
Traceback (most recent call last):
  File "train.py", line 40, in <module>
    loss.backward()
RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 268435456 bytes. Error code 12 (Cannot allocate memory)
"""
CUDA_OOM_WRAPPED = """Traceback (most recent call last):
  File "train.py", line 10, in step
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "train.py", line 20, in <module>
RuntimeError: the training step failed
"""
VALUE_ERROR_AFTER_A_CAUGHT_OOM = (
    CPU_OOM
    + """caught it, going on
Traceback (most recent call last):
  File "train.py", line 50, in <module>
ValueError: label 7 is not a class
"""
)


def test_the_cpu_allocators_error_is_an_oom() -> None:
    verdict = explain_traceback(CPU_OOM)
    assert verdict is not None and (verdict.kind, verdict.rule) == ("oom", "cpu-allocator")


def test_an_oom_that_caused_the_last_error_counts() -> None:
    verdict = explain_traceback(CUDA_OOM_WRAPPED)
    assert verdict is not None and verdict.kind == "oom"


def test_only_the_last_traceback_decides() -> None:
    verdict = explain_traceback(VALUE_ERROR_AFTER_A_CAUGHT_OOM)
    assert verdict is not None and verdict.kind == "error"


def test_no_traceback_no_verdict() -> None:
    assert explain_traceback("Killed\n") is None
