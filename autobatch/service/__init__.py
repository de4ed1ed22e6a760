"""The one front door: settings in, a tune, a check or an explanation out.

``autobatch tune``, :func:`autobatch.tune`, the Lightning ``AutoBatch`` callback and a cluster job's
calibration step all call :func:`~autobatch.service.tune.tune`; ``check`` and ``explain`` (command and
API) call :func:`~autobatch.service.check.check` and :func:`~autobatch.service.explain.explain`. Here,
once, settings become what a run needs: the step's source, the device and its budget, the device's lock,
the result cache, the world size a strategy implies, the global-batch check, the refusal of GPU launcher
configs after a CPU fallback, the result file and the emitted configs. A face only maps its flags or
keywords to settings and shows what :class:`~autobatch.service.hooks.Hooks` tells it.
"""

from __future__ import annotations

from autobatch.service.check import check
from autobatch.service.explain import explain
from autobatch.service.hooks import Hooks
from autobatch.service.tune import tune

__all__ = ["Hooks", "check", "explain", "tune"]
