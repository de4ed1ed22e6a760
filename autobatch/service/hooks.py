"""What a face of autobatch (the command, the API, a callback) shows of a run, and how it runs probes.

The service calls these and nothing else to talk to the user: it never prints. The command renders
them with rich on stderr; the Python API sends them to ``on_probe`` and the ``autobatch`` logger.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autobatch.devices.budget import DeviceInfo
    from autobatch.records.protocol import ProbeRunner
    from autobatch.records.result import TuneResult
    from autobatch.run.session import OnProbe, WrapRunner


def _ignore(*_args: Any) -> None:
    return None


@dataclass
class Hooks:
    """Every field is optional: a run with ``Hooks()`` shows nothing and probes through the real server."""

    on_probe: OnProbe | None = None  # each probe as it finishes (or as the journal replays it)
    on_update: Callable[[TuneResult], None] = _ignore  # the result after every probe
    on_start: Callable[[TuneResult], None] = (
        _ignore  # the result the tuner keeps current (partial on failure)
    )
    on_status: Callable[[str], None] = _ignore  # what is happening ("served from the cache", a model's turn)
    on_device: Callable[[DeviceInfo], None] = _ignore  # the device and its budget, once inspected
    on_warning: Callable[[str], None] = _ignore
    on_wait: Callable[[str], None] = _ignore  # waiting for another run's lock
    on_result: Callable[[TuneResult], None] = _ignore  # the answer, before the result file's last write
    on_partial: Callable[[TuneResult, str], None] = _ignore  # a tune that stopped early: what it kept, where
    wrap_runner: WrapRunner | None = None  # the command's live display of a probe in flight
    runner_factory: Callable[[], ProbeRunner] | None = None  # tests: a fake probe runner
