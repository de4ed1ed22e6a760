"""The next smaller plan of ``autobatch run``: the largest micro-batch below that keeps the global batch."""

from __future__ import annotations

import pytest

from autobatch.records.result import Chosen
from autobatch.service.relaunch import smaller


def _plan(micro: int, accum: int, world: int = 1, own: int | None = None) -> Chosen:
    return Chosen(
        "script", "script", False, micro, accum, world, micro * accum * world, script_accumulation=own
    )


@pytest.mark.parametrize(
    ("micro", "accum", "world", "own", "expected"),
    [
        (8, 1, 1, None, (4, 2)),  # half, twice the accumulation
        (4, 2, 1, None, (2, 4)),
        (6, 1, 1, None, (3, 2)),
        (7, 1, 1, None, (1, 7)),  # a prime: only 1 keeps 7 exactly
        (12, 2, 2, None, (8, 3)),  # 48 on 2 ranks
        (8, 2, 1, 2, (4, 4)),  # the script's own accumulation of 2 kept
        (1, 8, 1, None, None),
    ],
)
def test_smaller_keeps_the_global_batch(micro, accum, world, own, expected) -> None:
    got = smaller(_plan(micro, accum, world, own))
    assert got == expected
    if got is not None:
        assert got[0] * got[1] * world == micro * accum * world
