"""``explain`` behind every face: where the peak of one batch size goes on one device, and what each lever
would buy, under the device's lock (the session opened as ``check``'s is, with the explainer's op modules).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from autobatch.service.check import combination, started
from autobatch.service.hooks import Hooks, worded
from autobatch.service.sessions import open_session

if TYPE_CHECKING:
    from autobatch.explain.parent.explainer import ExplainReport
    from autobatch.settings import Settings
    from autobatch.step.spec import ScriptSpec


def explain(
    settings: Settings,
    batch_size: int,
    hooks: Hooks | None = None,
    *,
    recompute: bool = False,
    vocab_trim: float = 0.5,
    verify: bool = False,
    progress: Callable[[str], None] | None = None,
    spec: ScriptSpec | None = None,
) -> ExplainReport:
    """Where the peak of ``batch_size`` goes and what each lever would buy; ``verify`` measures each
    lever's maximum."""
    from autobatch.explain.parent.explainer import explain_batch
    from autobatch.explain.pure.options import OP_MODULES
    from autobatch.step.as_is import not_measured_by
    from autobatch.step.spec import spec_from_settings

    hooks = (hooks or Hooks()).worded(settings.door)
    with worded(settings.door):
        combo = combination(settings, recompute)
        if (spec or spec_from_settings(settings)).kind == "as_is":  # refused before anything starts
            raise not_measured_by(
                "explain", "breaks a peak down by running autobatch's own step on its parts"
            )
        hooks.on_status("starting the probe server")
        with open_session(settings, hooks, spec=spec, op_modules=OP_MODULES) as session:
            started(session, combo, hooks)
            return explain_batch(
                session,
                combo,
                batch_size,
                settings.limits(),
                vocab_trim=vocab_trim,
                verify=verify,
                progress=progress or hooks.on_status,
            )
