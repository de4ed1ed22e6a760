"""The search on an as-is loop that prepares its data set at import (issue 33: none over six), from real tunes of
``tests/scripts/as_is/loader_workers.py`` on the CPU under 512 MiB with 10 % headroom (2026-12-01): the data set
holds the reading flat up to about a thousand samples, and near the boundary a step's peak moves against its
reading by 0.2 MiB between processes (12 samples), where the readings themselves lie on a line. No torch.
"""

from __future__ import annotations

from autobatch.core.search import Observation
from autobatch.testing import next_probe

BUDGET = 480_038_092  # the search's line: 512 MiB less the headroom and the CPU margin


def seen(batch: int, peak: int, rising: int, steps: int = 3, static: int | None = None) -> Observation:
    """A probe as the tune journaled it: a fit when it reports its static memory, else out of memory."""
    if static is None:
        return Observation(batch, False, kind="oom", peak_bytes=peak, steps=steps, rising_bytes=rising)
    return Observation(batch, True, peak_bytes=peak, steps=steps, rising_bytes=rising, static_bytes=static)


def test_fits_as_flat_as_the_noise_send_the_next_probe_where_a_slope_under_the_noise_reaches() -> None:
    # The scout's reading holds the data set built at import, so the proportional guess lands at 32 and reads
    # 0.4 MiB lower. Before: doubling, 64 and 128 before a point rose, then 1196 (10 probes in all; the same
    # script with two workers, 8, 23, 46, 92, 1830, 9 to 12). A slope of 1 MiB over 24 samples reaches the
    # budget at 2903; the maximum is about 6600.
    static = 316_063_920
    known = [
        seen(8, 356_732_928, 354_562_144, static=static),
        seen(32, 356_065_280, 354_177_120, static=static),
    ]
    batch, final = next_probe(known, BUDGET, 314_970_248)
    assert 2000 < batch < 6000 and not final


def test_fits_a_miss_proves_the_peak_jitters_over_spread_the_end_game_as_wide() -> None:
    # Fits at 7061 and 7187 peaked 0.04-0.08 MiB under their readings; the miss at 7191 stopped 0.12 MiB over its
    # own. Read as one gap, the readings put the boundary at 7187.1 with a spread of 0.7 samples, and the end game
    # expected a miss right above each fit: 7188, 7189 and 7190 fitted, a probe each (12 probes). The jitter is
    # the spread: the middle of 7188-7190 next, and the pair is known in two probes whatever the maximum.
    static = 307_703_984
    known = [
        seen(8, 365_117_440, 362_954_848, static=static),
        seen(23, 364_429_312, 362_504_288, static=static),
        seen(46, 364_453_888, 362_623_072, static=static),
        seen(92, 364_519_424, 362_967_136, static=static),
        seen(1830, 392_237_056, 392_134_752, steps=6, static=static),
        seen(7061, 477_896_704, 477_855_840, steps=6, static=static),
        seen(7224, 480_448_512, 480_530_528, steps=2),
        seen(7191, 480_092_160, 479_969_376, steps=6),
        seen(7187, 479_830_016, 479_912_032, steps=6, static=static),
    ]
    assert next_probe(known, BUDGET, 306_610_312) == (7189, True)
