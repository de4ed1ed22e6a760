"""A process that tuned and then trains (the Lightning callback, ``apply_to_training_arguments``) runs the CPU plan's
allocator from then on, as a job started with the plan's environment does: a block of 100 KiB is a mapping of its own
(glibc's default threshold is 128 KiB, and rises from there), read from glibc's own counters (``mallinfo2``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = r"""
import ctypes, json, sys

class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
held = None
if sys.argv[1] == "hold":
    from autobatch.devices.cpu import MALLOC_ENV, hold_environment_here
    held = hold_environment_here(MALLOC_ENV)
before = libc.mallinfo2().hblks
block = libc.malloc(100 << 10)
mapped = libc.mallinfo2().hblks - before
libc.free(block)
print(json.dumps({"held": held, "mapped": mapped}))
"""


def _child(mode: str) -> dict[str, object]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")
    }  # glibc's defaults at the start
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(done.stdout)


def test_a_started_process_takes_the_plans_allocator() -> None:
    assert _child("defaults") == {"held": None, "mapped": 0}  # from the heap under glibc's defaults
    assert _child("hold") == {"held": True, "mapped": 1}  # a mapping of its own, as in the probes


def test_nothing_to_hold_is_held() -> None:
    from autobatch.devices.cpu import hold_environment_here

    assert hold_environment_here({}) is True  # a CUDA plan's environment: nothing to set in this process
