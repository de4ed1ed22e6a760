"""The operations of a script run as it is: ``as_is`` (one probe, in this process or on ranks) and
``as_is_inspect`` (the device alone). The watch on the script's steps is :mod:`autobatch.probe.as_is_watch`.

On several ranks (``--nproc-per-node N``), as ``torchrun`` starts the script: the probe process becomes the
coordinator of :func:`autobatch.probe.ranks.run_ranks`; it forks N rank processes, hosts the rendezvous store
as ``torchrun``'s agent does, and answers with one outcome for the group. Each rank gets ``torchrun``'s
environment (:func:`autobatch.probe.ranks.torchrun_env`: the script's own ``init_process_group("env://")``
joins the store as a client), the thread count a rank ``torchrun`` starts runs with, its own device and
budget, and runs the script under the same watch as a single probe. A rank reports once
(:class:`RankReport`): a fit as soon as its steps are enough, and its script goes on stepping with its peers
(none waits in a collective for one that stopped) until the coordinator stops every rank; any other outcome
ends the rank, and the coordinator ends the others.
"""

from __future__ import annotations

import os
import signal
import traceback
from dataclasses import replace
from functools import partial

from autobatch.devices.backend import backend_for
from autobatch.probe import ops
from autobatch.probe.as_is_watch import run_script
from autobatch.probe.files import scratch_folder
from autobatch.probe.ops import register
from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.step.as_is import AsIsScript


@register("as_is_inspect")  # type: ignore[arg-type]  # the server hands these an AsIsScript
def inspect_device(request: ProbeRequest, script: AsIsScript) -> ProbeOutcome:
    """The device alone: an as-is script's model exists only while the script runs."""
    return ProbeOutcome(kind="fits", info=backend_for(request.device).facts())


@register("as_is")  # type: ignore[arg-type]
def run_as_is(request: ProbeRequest, script: AsIsScript) -> ProbeOutcome:
    """One probe of the script as it is, at the request's batch size, under its budget: in this process, or
    on ``nproc_per_node`` ranks (:func:`run_on_ranks`)."""
    if request.nproc_per_node > 1:
        return run_on_ranks(request, script)
    return run_script(request, script, ops.report_and_exit)


def run_on_ranks(request: ProbeRequest, script: AsIsScript) -> ProbeOutcome:
    """One probe of the script on ``request.nproc_per_node`` ranks: one outcome for the group."""
    from autobatch.probe.ranks import RANK_TIME_SHARE, run_ranks

    # no rank stops at the search's line on its own (its peers would wait for it in a collective), and
    # a rank that never steps says so before the coordinator's deadline
    ranked = replace(request.with_run(timeout=request.timeout * RANK_TIME_SHARE), stop_above_bytes=None)
    scratch_folder()  # one for the probe's ranks, as the job's ranks share one working folder
    body = partial(run_rank, ranked, script)
    return run_ranks(ranked, script, None, body=body)  # type: ignore[arg-type]


def run_rank(
    request: ProbeRequest, script: AsIsScript, where: tuple[int, int, int], fd: int, t0: float
) -> None:
    """One rank of a script run as it is on several: ``torchrun``'s environment, the script, one report on
    ``fd`` (a fit as soon as its steps are enough: the script goes on stepping with its peers until the
    coordinator stops every rank; any other outcome ends the rank). Never returns."""
    from autobatch.probe.lineage import die_with_parent
    from autobatch.probe.ranks import rank_device, torchrun_env

    rank, port, _ = where
    code = 0
    try:
        die_with_parent()
        os.environ.update(torchrun_env(rank, request.nproc_per_node, port))
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # what a rank torchrun starts runs with
        device = rank_device(request.device, rank)
        mine = request.on_rank(device, rank)
        emit = RankReport(fd)
        emit(run_script(mine, script, emit))  # the script ended or raised (ignored after a fit)
        while True:
            signal.pause()
    except BaseException:  # noqa: BLE001
        code = 70
        traceback.print_exc()
    finally:
        os._exit(code)


class RankReport:
    """How a rank reports: one line on its pipe; a fit lets the script go on, anything else ends the rank."""

    def __init__(self, fd: int) -> None:
        self.fd, self.sent = fd, False

    def __call__(self, outcome: ProbeOutcome) -> None:
        if self.sent:
            return
        self.sent = True
        ops.write_report(self.fd, outcome)
        if not outcome.fits:
            os._exit(0)
