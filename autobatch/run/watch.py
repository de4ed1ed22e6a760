"""Whether a tune's answers hold in the job: the checks on its probes (the run's side of
:mod:`autobatch.core.sanity` and :mod:`autobatch.core.step_peaks`).

* **Every probe**: a peak that grows at every step is a leak and ends the tune (:class:`LeakError`, exit 8).
  Left to the search, every confirmation would fail (ten steps leak more than three) down to the smallest
  batch, and the tune would report that nothing fits.
* **Every combination's answer**: a crash or timeout that bounds it sets its status; a batch that never reached
  the step (peaks and step times that do not move over a wide range) ends the tune (:class:`ContractError`,
  exit 3); flat peaks are noted;
  a peak that depends on the data is noted and warned about, and with ``strict`` ends the tune
  (:class:`DataDependentError`, exit 3).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

from autobatch.core import sanity
from autobatch.core.step_peaks import Reading, data_dependence, find_leak, growth_tolerance
from autobatch.devices.budget import margin_bytes
from autobatch.errors import ContractError, DataDependentError, LeakError
from autobatch.records.readings import reading

if TYPE_CHECKING:
    from autobatch.records.protocol import ProbeOutcome
    from autobatch.records.result import ComboResult

LEAK_HINT = (
    "keep no tensor from one step to the next (log loss.item(), not the loss; clear a list of activations "
    "every step), then tune again"
)
DATA_HINT = (
    "make make_batch return the worst case at every call (pad to the longest sequence, the largest image the "
    "job sees); without --strict the tune keeps the answer and warns"
)
#: :data:`DATA_HINT` for a script run as it is: its own loader draws the batches.
AS_IS_DATA_HINT = (
    "make the script's first batches its worst case (sort its data longest first, or pad every batch to the "
    "longest sequence, the largest image the job sees); without --strict the tune keeps the answer and warns"
)


class Watch:
    """Reads every probe of a tune; ``warn`` is the run's (:class:`autobatch.run.session.Warnings`): shown as the
    run goes and kept in the result's notes."""

    def __init__(
        self,
        budget_bytes: int,
        *,
        strict: bool,
        warn: Callable[[str], None],
        batch_way: str | None = None,
    ) -> None:
        self.budget_bytes = budget_bytes
        #: A script run as it is: how its batch reaches it (:func:`autobatch.step.as_is.batch_way`); its words
        #: are the script's, not make_batch's. None: a three-function script.
        self.batch_way = batch_way
        self.as_is = batch_way is not None
        self.tolerance = growth_tolerance(budget_bytes)
        self.threshold = margin_bytes("cpu", budget_bytes)  # the CPU's margin, as the noise on every device
        self.strict = strict
        self.warn = warn
        self.readings: defaultdict[str, list[Reading]] = defaultdict(list)

    def probe(self, key: str, outcome: ProbeOutcome) -> None:
        """Keep a probe's reading; a leak ends the tune."""
        read = reading(outcome)
        self.readings[key].append(read)
        leak = find_leak(read.step_peaks, self.tolerance, read.batch_size)
        if leak is not None:
            raise LeakError(f"{key}: {leak.describe()}", hint=LEAK_HINT)

    def answer(self, key: str, entry: ComboResult, notes: list[str]) -> None:
        """A maximum bounded by a crash or timeout says so in its status; flat peaks get a note; a peak that
        depends on the data a note and a warning (with ``strict``, the error)."""
        points = [(r.batch_size, r.kind, r.peak_bytes) for r in entry.trace]
        limit = sanity.limited_by(points, entry.max_batch_size)
        if limit is not None and entry.status in ("exact", "capped", "infeasible", "incomplete"):
            entry.status, entry.reason = limit.status, limit.reason(entry.max_batch_size)
        ignored = sanity.batch_ignored(self.readings[key], self.threshold)
        if ignored is not None:
            raise self._ignored(key, ignored)
        question = (
            f"does the script use the batch size it is given ({self.batch_way})?"
            if self.batch_way is not None
            else sanity.MAKE_BATCH_QUESTION
        )
        flat = sanity.flat_peaks(points, self.budget_bytes, question)
        if flat:
            notes.append(f"{key}: warning: {flat}")
        dependence = data_dependence(self.readings[key], self.threshold, self.tolerance, self.as_is)
        if dependence is None:
            return
        if self.strict:
            raise DataDependentError(
                f"{key}: {dependence}", hint=AS_IS_DATA_HINT if self.as_is else DATA_HINT
            )
        self.warn(f"{key}: {dependence}")  # a note too: the run keeps its warnings in the notes

    def _ignored(self, key: str, evidence: str) -> ContractError:
        """The error of a batch that never reached the step (:func:`autobatch.core.sanity.batch_ignored`)."""
        if self.batch_way is None:
            return ContractError(
                f'{key}: make_batch ignores its batch_size: {evidence}; every batch would "fit"',
                hint="make make_batch(batch_size) return batch_size samples (its size check is off: check_batch_size "
                "= false), then tune again",
            )
        return ContractError(
            f'{key}: the batch size never reached the script\'s step: {evidence}; every batch would "fit", so '
            "there is no maximum to give",
            hint=f"the script is given its batch size as {self.batch_way} (each probe's micro-batch), and builds its "
            "batches from something else (a config value, a default, a DataLoader's fixed batch_size): make it use "
            "the value it is given, then tune again",
        )
