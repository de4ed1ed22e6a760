"""Timing probes run glibc's allocator as the job does: the thresholds a repeating step ends at, set in the
probe process, whatever the pinned environment it inherited."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from autobatch.devices.cpu import MALLOC_ENV

# How many blocks of 1 MiB held at once are mappings of their own (glibc's mallinfo2 ``hblks``).
CODE = """
import ctypes, sys
from autobatch.devices.cpu import job_allocator
if sys.argv[1] == "job":
    assert job_allocator()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc.mallinfo2.restype = Info
before = libc.mallinfo2().hblks
blocks = [libc.malloc(1 << 20) for _ in range(4)]
print(libc.mallinfo2().hblks - before)
"""


@pytest.mark.parametrize(("mode", "mapped"), [("pinned", 4), ("job", 0)])
def test_the_job_allocator_takes_blocks_from_the_heap_where_the_pinned_one_maps_each(
    mode: str, mapped: int
) -> None:
    env = {**os.environ, **MALLOC_ENV}
    out = subprocess.run(
        [sys.executable, "-c", CODE, mode], env=env, capture_output=True, text=True, check=True
    )
    assert int(out.stdout.strip()) == mapped, out
