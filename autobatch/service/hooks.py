"""What a face of autobatch (the command, the API, a callback) shows of a run, and how it runs probes.

The service calls these and nothing else to talk to the user: it never prints. The command renders
them with rich on stderr; the Python API sends them to ``on_probe`` and the ``autobatch`` logger.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autobatch.errors import AutobatchError
from autobatch.settings.levers import in_words

if TYPE_CHECKING:
    from autobatch.devices.budget import DeviceInfo
    from autobatch.records.protocol import ProbeRunner
    from autobatch.records.result import TuneResult
    from autobatch.run.session import OnProbe, WrapRunner
    from autobatch.settings.values import Door


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

    def worded(self, door: Door) -> Hooks:
        """These hooks, told each text and result with its levers in ``door``'s words (a text written where the
        door is not known names them in the neutral form: :mod:`autobatch.settings.levers`)."""

        def text(show: Callable[[str], None]) -> Callable[[str], None]:
            return lambda message: show(in_words(message, door))

        def result(show: Callable[[TuneResult], None]) -> Callable[[TuneResult], None]:
            return lambda tuned: show(tuned.in_words(door))

        return replace(
            self,
            on_status=text(self.on_status),
            on_warning=text(self.on_warning),
            on_wait=text(self.on_wait),
            on_update=result(self.on_update),
            on_start=result(self.on_start),
            on_result=result(self.on_result),
            on_partial=lambda tuned, where: self.on_partial(tuned.in_words(door), where),
        )


@contextmanager
def worded(door: Door) -> Iterator[None]:
    """An autobatch error leaving the block names its levers in ``door``'s words (its message, hint and detail,
    and the partial result a nothing-fits error carries)."""
    try:
        yield
    except AutobatchError as exc:
        error_in_words(exc, door)
        raise


def error_in_words(exc: AutobatchError, door: Door) -> None:
    """``exc`` (changed in place) with the levers its texts name in the neutral form in ``door``'s words."""
    exc.message = in_words(exc.message, door)
    exc.args = (exc.message, *exc.args[1:])
    exc.hint = exc.hint and in_words(exc.hint, door)
    exc.detail = exc.detail and in_words(exc.detail, door)
    partial = getattr(exc, "result", None)
    if partial is not None and hasattr(partial, "in_words"):
        partial.in_words(door)
