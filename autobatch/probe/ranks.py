"""A distributed probe: N fresh rank processes in one process group, measured on every rank.

The probe process the server forked for a ``ddp`` or ``fsdp`` request becomes the *coordinator*: it forks
``nproc_per_node`` ranks, hands rank 0 an open rendezvous socket, watches them and answers with one
:class:`ProbeOutcome` for the group (the probe fits only if every rank fits); at the first rank that does
not fit, dies or times out it kills them all. Why fork, the port, and the abort: docs/distributed.md
("Inside a distributed probe").
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from autobatch.probe.lineage import (
    POLL,
    die_with_parent,
    drain,
    end_script_descendants,
    end_tree,
    exit_fd,
    has_exited,
)
from autobatch.probe.ops import write_report
from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.step.contract import UserScript

if TYPE_CHECKING:
    import torch

    from autobatch.step.loop import Wrap

#: The share of the probe's timeout the coordinator gives its ranks (the rest: stopping them, answering).
RANK_TIME_SHARE = 0.9


@dataclass
class Rank:
    """A rank process as the coordinator sees it."""

    rank: int
    pid: int
    fd: int
    buffer: bytes = b""
    outcome: ProbeOutcome | None = None
    open: bool = True
    info: dict[str, Any] = field(default_factory=dict)
    exit_fd: int | None = None  # readable once the rank has exited (while watched; None: polled)


def rank_device(device: str, rank: int) -> str:
    """The device of ``rank``: the CPU for every rank, else ``cuda:(first + rank)``."""
    if not device.startswith("cuda"):
        return device
    first = int(device.partition(":")[2] or 0)
    return f"cuda:{first + rank}"


#: The probe proper on one rank (:func:`autobatch.probe.worker.measure_steps`, passed in by the worker).
Measure = Callable[..., ProbeOutcome]
#: What an operation adds to the group's outcome from every rank's own (explain: each rank's breakdown).
Summarize = Callable[[ProbeOutcome, list[ProbeOutcome]], None]


#: A rank process's body when it is not autobatch's own step (a script run as it is): called with
#: ``(rank, port, listening socket)``, the rank's report pipe and the coordinator's start; never returns.
RankBody = Callable[[tuple[int, int, int], int, float], None]


def run_ranks(
    request: ProbeRequest,
    script: UserScript,
    measure: Measure | None,
    *,
    summarize: Summarize | None = None,
    body: RankBody | None = None,
) -> ProbeOutcome:
    """Run ``request`` on ``request.nproc_per_node`` fresh ranks; one outcome for the group
    (``summarize``: called with it and every rank's outcome when every rank fitted).

    ``measure``: autobatch's own step on a rank; ``body``: each rank runs it instead (``measure`` None), and joins the process group itself, as a
    rank ``torchrun`` starts does (``env://``, :func:`torchrun_env`): the coordinator then hosts the
    rendezvous store, as ``torchrun``'s agent does, and every rank is its client."""
    world = request.nproc_per_node
    started = time.perf_counter()
    deadline = started + request.timeout * RANK_TIME_SHARE
    listener = socket.create_server(("127.0.0.1", 0))  # bound and listening: the port stays ours
    port = listener.getsockname()[1]
    ranks: list[Rank] = []
    store = None
    try:
        for rank in range(world):
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:  # a rank process
                die_with_parent()
                os.close(read_fd)
                for other in ranks:
                    os.close(other.fd)
                if rank != 0 or body is not None:
                    listener.close()
                where = (rank, port, listener.fileno())
                if body is not None:
                    body(where, write_fd, started)
                assert measure is not None, "a rank runs autobatch's step (measure) or a body"
                rank_main(request, script, measure, where, write_fd, started)
            os.close(write_fd)
            ranks.append(Rank(rank, pid, read_fd))
        if body is not None:
            store = _agent_store(listener.detach(), port, world, request.timeout)
        listener.close()
        failure = watch(ranks, deadline)
    finally:
        listener.close()
        stop(ranks)
        del store
    out = combine(request, ranks, failure, time.perf_counter() - started)
    if summarize is not None and failure is None:
        summarize(out, [r.outcome for r in ranks if r.outcome is not None])
    return out


def _agent_store(listen_fd: int, port: int, world: int, timeout: float) -> Any:
    """The rendezvous store ``torchrun``'s agent hosts, on the coordinator's reserved port (ranks started
    with ``TORCHELASTIC_USE_AGENT_STORE=True`` connect to it as clients)."""
    import torch.distributed as dist

    return dist.TCPStore(
        "127.0.0.1", port, world, True, timeout=timedelta(seconds=timeout), wait_for_workers=False,
        master_listen_fd=listen_fd,
    )  # fmt: skip


def torchrun_env(rank: int, world: int, port: int) -> dict[str, str]:
    """The environment ``torchrun --nproc-per-node world`` gives rank ``rank`` on one node (its agent hosts
    the store on ``port``; for several ranks ``OMP_NUM_THREADS`` is 1 unless the user set it, torchrun's
    default)."""
    env = {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
        "ROLE_NAME": "default", "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
        "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": "autobatch", "TORCHELASTIC_USE_AGENT_STORE": "True",
    }  # fmt: skip
    if world > 1:
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    return env


#: The variables by which ``torchrun`` (and launchers that imitate it) names a worker of its job.
TORCHRUN_VARIABLES = (*torchrun_env(0, 1, 0), "TORCHELASTIC_ERROR_FILE")


def launcher_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that name a worker of a launched job (:data:`TORCHRUN_VARIABLES`)."""
    return {name: environ[name] for name in TORCHRUN_VARIABLES if name in environ}


def one_process_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What a single-process probe takes instead of the launcher's variables in ``environ`` (a wrapper's, or
    those of the rank a command runs in): nothing when there are none (the script runs as ``python script.py``
    runs it); else the environment ``torchrun`` gives a world of one: rank 0 of 1, and a rendezvous of its own
    (``MASTER_PORT=0``: the script's store binds a port the kernel picks; no agent store; no other worker's
    error file). A script that joins its process group (``init_process_group("env://")``) then starts
    at once, instead of waiting until the probe's timeout for the peers the variables name. The ranks of a
    probe (:func:`torchrun_env`) set their own over it. Why: docs/as-is.md ("A launcher's variables")."""
    if not launcher_variables(environ):
        return {}
    return {
        **torchrun_env(0, 1, 0),
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": "",
    }


def watch(ranks: list[Rank], deadline: float) -> Rank | None:
    """Read every rank's report until all fitted (None) or one did not (that rank, its outcome set). A rank
    that exits is read then, not at its pipe's end of file, which a process it started may hold off
    (:mod:`autobatch.probe.lineage`)."""
    for rank in ranks:
        rank.exit_fd = exit_fd(rank.pid)
    try:
        return _watch(ranks, deadline)
    finally:
        for rank in ranks:
            if rank.exit_fd is not None:
                os.close(rank.exit_fd)
                rank.exit_fd = None


def _watch(ranks: list[Rank], deadline: float) -> Rank | None:
    while any(r.outcome is None for r in ranks):
        remaining = deadline - time.perf_counter()
        waiting = [r for r in ranks if r.outcome is None and r.pid]
        if remaining <= 0 or not waiting:
            late = next(r for r in ranks if r.outcome is None)
            late.outcome = ProbeOutcome(
                kind="timeout",
                reason=f"rank {late.rank} did not report within the probe's time; every rank was stopped",
            )
            return late
        exits = [r.exit_fd for r in waiting if r.exit_fd is not None]
        pipes = [r.fd for r in waiting if r.open]
        wait = remaining if len(exits) == len(waiting) else min(remaining, POLL)
        ready, _, _ = select.select(pipes + exits, [], [], wait)
        for rank in waiting:
            if rank.open and rank.fd in ready:
                failed = _read(rank)
            elif rank.exit_fd in ready or (rank.exit_fd is None and has_exited(rank.pid)):
                failed = _exited(rank)
            else:
                continue
            if failed is not None:
                return _first_cause(ranks, failed)
    return None


#: Seconds a failure waits for another rank's death to show: a rank killed mid-step makes its peers fail
#: in the collective they share, and the dead rank, not the one that noticed, is the failure to name.
CAUSE_GRACE = 1.0
ROOT_CAUSES = ("crash", "oom")


def _first_cause(ranks: list[Rank], failed: Rank) -> Rank:
    """``failed``, unless another rank died or ran out of memory (its peers' errors are the consequence)."""
    if failed.outcome is not None and failed.outcome.kind in ROOT_CAUSES:
        return failed
    deadline = time.perf_counter() + CAUSE_GRACE
    while (remaining := deadline - time.perf_counter()) > 0:
        waiting = [r for r in ranks if r is not failed and r.outcome is None and r.open]
        if not waiting:
            break
        ready, _, _ = select.select([r.fd for r in waiting], [], [], remaining)
        for rank in (r for r in waiting if r.fd in ready):
            dead = _read(rank)
            if dead is not None and dead.outcome is not None and dead.outcome.kind in ROOT_CAUSES:
                return dead
    return failed


def _read(rank: Rank) -> Rank | None:
    """Read what a rank wrote; the rank when its report is a failure (or it died without one)."""
    chunk = os.read(rank.fd, 1 << 16)
    if chunk:
        return _take(rank, chunk)
    rank.open = False
    return None if rank.outcome is not None else _died(rank)


def _exited(rank: Rank) -> Rank | None:
    """The rank exited: its report, read from what is left in its pipe; else it died without one."""
    if rank.open:
        failed = _take(rank, drain(rank.fd))
        if rank.outcome is not None:
            return failed
    return _died(rank)


def _take(rank: Rank, chunk: bytes) -> Rank | None:
    """Add ``chunk`` to what the rank wrote; the rank when its whole report is a failure."""
    rank.buffer += chunk
    line, newline, _ = rank.buffer.partition(b"\n")
    if not newline:
        return None
    report = json.loads(line)
    rank.info = report.get("rank_info", {})
    rank.outcome = ProbeOutcome.from_dict(report["outcome"])
    return None if rank.outcome.fits else rank


def _died(rank: Rank) -> Rank:
    """Reap a rank that ended without a report: a crash, named with its status."""
    try:
        _, status = os.waitpid(rank.pid, 0)
    except ChildProcessError:  # reaped elsewhere (a discarded Popen's clean-up): its status is lost
        status = 0
    rank.pid = 0
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        how = f"was killed by signal {sig} ({signal.Signals(sig).name})"
    else:
        how = f"exited with status {os.WEXITSTATUS(status)}"
    rank.outcome = ProbeOutcome(kind="crash", reason=f"rank {rank.rank} {how} without reporting")
    return rank


def stop(ranks: list[Rank]) -> None:
    """SIGKILL every rank still running, and what it started, and reap it (see the module docstring for why
    SIGKILL)."""
    for rank in ranks:
        if rank.pid:
            end_tree(rank.pid)
    for rank in ranks:
        if rank.pid:
            try:
                os.waitpid(rank.pid, 0)
            except ChildProcessError:
                pass
            rank.pid = 0
        if rank.open:
            os.close(rank.fd)
            rank.open = False


def combine(request: ProbeRequest, ranks: list[Rank], failure: Rank | None, wall: float) -> ProbeOutcome:
    """One outcome for the group: the failing rank's, named; else the worst rank's figures."""
    world = len(ranks)
    cost = {
        "strategy": request.strategy,
        "world_size": world,
        "start_seconds": max((r.info.get("start_seconds", 0.0) for r in ranks), default=0.0),
        "rendezvous_seconds": max((r.info.get("rendezvous_seconds", 0.0) for r in ranks), default=0.0),
        "wrap_seconds": max((r.info.get("wrap_seconds", 0.0) for r in ranks), default=0.0),
    }
    if failure is not None:
        assert failure.outcome is not None
        out = failure.outcome
        out.batch_size = request.batch_size
        out.budget_bytes = request.budget_bytes
        out.failed_rank = failure.rank
        what = out.reason or (out.error_message or "").split("\n")[0] or out.kind
        out.reason = f"rank {failure.rank} of {world}: {what}; every rank was stopped"
        if out.error_message is not None:
            out.error_message = f"[rank {failure.rank} of {world}] {out.error_message}"
        out.info = {**out.info, "distributed": cost}
        return out
    outcomes = [r.outcome for r in ranks if r.outcome is not None]
    worst = max(outcomes, key=lambda o: o.peak_bytes or 0)
    out = replace(worst)
    out.rank_peak_bytes = [o.peak_bytes or 0 for o in outcomes]
    out.peak_bytes = max(out.rank_peak_bytes)
    steps = min(len(o.step_peaks) for o in outcomes)
    out.step_peaks = [max(o.step_peaks[i] for o in outcomes) for i in range(steps)]
    out.step_seconds = [max(o.step_seconds[i] for o in outcomes) for i in range(steps)]
    if all(len(o.update_seconds) >= steps for o in outcomes):
        out.update_seconds = [max(o.update_seconds[i] for o in outcomes) for i in range(steps)]
    out.steps = min(o.steps for o in outcomes)
    rates = [o.samples_per_second for o in outcomes if o.samples_per_second]
    out.samples_per_second = min(rates) if len(rates) == world else None  # per rank: the slowest's
    out.info = {**out.info, "distributed": cost}
    out.wall_seconds = wall
    return out


def rank_main(
    request: ProbeRequest,
    script: UserScript,
    measure: Measure,
    where: tuple[int, int, int],
    write_fd: int,
    t0: float,
) -> None:
    """A rank process (``where``: rank, port, listening socket), which dies with its parent: run, report one
    line, wait to be stopped (never returns)."""
    code = 0
    rank, port, listen_fd = where
    try:
        outcome, info = run_rank(request, script, measure, (rank, port, listen_fd if rank == 0 else None), t0)
        write_report(write_fd, outcome, rank_info=info)
        while True:  # peers may still be inside a collective with us: the coordinator ends us all
            signal.pause()
    except BaseException:  # noqa: BLE001
        code = 70
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        try:
            end_script_descendants()  # what the script started ends with its rank
        finally:
            os._exit(code)


def run_rank(
    request: ProbeRequest,
    script: UserScript,
    measure: Measure,
    where: tuple[int, int, int | None],
    t0: float,
) -> tuple[ProbeOutcome, dict[str, Any]]:
    """Join the process group, then the probe proper on this rank (``where``: rank, port, rank 0's
    listening socket): budget, wrapped model, steps."""
    import torch.distributed as dist

    from autobatch.records.failures import describe_failure
    from autobatch.step.wrapping import backend_for, wrapper

    rank, port, listen_fd = where
    world = request.nproc_per_node
    device = rank_device(request.device, rank)
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    info: dict[str, Any] = {"start_seconds": time.perf_counter() - t0}
    started = time.perf_counter()
    timeout = timedelta(seconds=request.timeout)
    try:
        store = dist.TCPStore(
            "127.0.0.1", port, world, rank == 0, timeout=timeout, wait_for_workers=False,
            master_listen_fd=listen_fd,
        )  # fmt: skip
        if device.startswith("cuda"):
            import torch

            torch.cuda.set_device(torch.device(device))
        dist.init_process_group(
            backend_for(device), store=store, rank=rank, world_size=world, timeout=timeout
        )
    except Exception as exc:  # noqa: BLE001 - a rendezvous failure is the probe layer's, reported as data
        return describe_failure(ProbeOutcome(kind="error", batch_size=request.batch_size), exc), info
    info["rendezvous_seconds"] = time.perf_counter() - started
    if not device.startswith("cuda"):
        import torch

        # N ranks share the cores: split them, as torchrun does (OMP_NUM_THREADS), or they thrash
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    wrap = _timed(
        wrapper(request.strategy, device, request.step.recompute_classes or script.recompute_classes), info
    )
    rank_request = request.on_rank(device, rank)
    outcome = measure(rank_request, script, time.perf_counter(), wrap=wrap)
    return outcome, info


def _timed(wrap: Wrap | None, info: dict[str, Any]) -> Wrap | None:
    """``wrap``, noting in ``info["wrap_seconds"]`` how long it took (part of a distributed probe's fixed cost)."""
    if wrap is None:
        return None

    def timed(model: torch.nn.Module) -> torch.nn.Module:
        started = time.perf_counter()
        try:
            return wrap(model)
        finally:
            info["wrap_seconds"] = time.perf_counter() - started

    return timed
