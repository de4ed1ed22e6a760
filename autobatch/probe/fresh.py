"""The job's processes are fresh; probes are forked: on the CPU device, the difference, measured once per run.

The ``fresh_baseline`` operation starts the job's processes as the job starts them (one ``python``
process, or ranks with the environment ``torchrun`` gives), runs the request's steps there and in a forked
process, and reads each one's data memory once the steps' objects are gone. The per-rank *offset* (fresh,
less autobatch's own imports, less forked) lowers every later probe's cap and raises its readings
(:attr:`autobatch.records.protocol.RunConfig.fresh_offset_bytes`). Why and how: docs/how-a-tune-works.md
("Budget", the job's process).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from autobatch.probe.files import SCRATCH_ENV, install_for, multiprocessing_folder, remove_root, scratch_root
from autobatch.probe.lineage import (
    become_subreaper,
    die_with_parent,
    end_descendants_on,
    end_script_descendants,
    end_tree,
    read_until_exit,
)
from autobatch.probe.ops import register, write_report
from autobatch.probe.spare import SPARE_FLAG, Taken, take, wait_for_start
from autobatch.records.protocol import ProbeOutcome, ProbeRequest, read_start_word, start_word

if TYPE_CHECKING:
    from autobatch.probe.ranks import Measure, Rank
    from autobatch.step.contract import UserScript

#: The share of the probe's timeout the fresh processes get (the forked steps and the answer: the rest).
FRESH_TIME_SHARE = 0.6
#: What a forked run's outcome says of the processes the script started (:mod:`autobatch.probe.as_is_watch`),
#: kept in the measurement's answer.
CHILD_KEYS = ("child_processes", "child_own_bytes")


@dataclass(frozen=True)
class FreshOptions:
    """How to start the job's process: the script as the probe server's init names it, and its arguments."""

    script: Any
    script_args: list[str] = field(default_factory=list)
    #: Only the forked half (a server of another start counts its probes against the fresh process measured).
    forked_only: bool = False
    #: The job's fresh processes as an earlier run measured them (:mod:`autobatch.cache.fresh`), per rank: not
    #: started again, the forked half counted against them.
    kept: list[int] | None = None
    #: The outcomes of the job's fresh processes, one per rank, as the command measured them beside the probe
    #: server's start (:class:`FreshAhead`): not started again.
    measured: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "script": self.script,
            "script_args": list(self.script_args),
            "forked_only": self.forked_only,
            "kept": self.kept,
            "measured": self.measured,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FreshOptions:
        kept = data.get("kept")
        return cls(
            data["script"],
            list(data.get("script_args", [])),
            bool(data.get("forked_only", False)),
            [int(b) for b in kept] if kept is not None else None,
            data.get("measured"),
        )


@register("fresh_baseline", FreshOptions)
def measure_offsets(request: ProbeRequest, script: UserScript, options: FreshOptions) -> ProbeOutcome:
    """The request's steps in the job's fresh processes and in forked ones: every rank's offset in ``info``
    (the forked outcome as it is when it does not fit; ``info["fresh_error"]`` when a fresh process failed;
    with ``forked_only``, the forked processes' settled data alone; with ``kept``, the forked half counted
    against the fresh processes an earlier run measured)."""
    from autobatch.probe.ranks import run_ranks
    from autobatch.probe.worker import measure_steps
    from autobatch.step.as_is import AsIsScript

    plain = replace(request.with_run(fresh_offset_bytes=()), stop_above_bytes=None)
    if options.forked_only or options.kept is not None:
        fresh: list[ProbeOutcome] = []
    elif options.measured:
        fresh = [ProbeOutcome.from_dict(each) for each in options.measured]
    else:
        fresh = _run_fresh(plain, options)
    measure = settled(measure_steps)
    forked_ranks: list[ProbeOutcome] = []
    if isinstance(script, AsIsScript):  # one process (the ranks of one: not yet)
        forked = _forked_as_is(plain, script)
        forked_ranks.append(forked)
    elif plain.strategy == "none":
        forked = measure(plain, script, time.perf_counter())
        forked_ranks.append(forked)
    else:
        forked = run_ranks(plain, script, measure, summarize=lambda _out, each: forked_ranks.extend(each))
    if not forked.fits:
        return forked
    # the processes the script started (DataLoader workers) and what they held of their own, as any probe reads
    # them: a job in a memory cgroup needs room for them beside its own process (autobatch.devices.budget)
    children = {key: forked.info[key] for key in CHILD_KEYS if key in forked.info}
    if options.forked_only:
        forked.info = {"forked_settled_bytes": [o.info["settled_bytes"] for o in forked_ranks], **children}
        return forked
    failed = next((o for o in fresh if not o.fits), None)
    measured = len(options.kept) if options.kept is not None else len(fresh)
    if failed is not None or measured != len(forked_ranks):
        what = (failed.reason or failed.error_message or failed.kind) if failed is not None else "no report"
        forked.info = {"fresh_error": what}
        return forked
    job = (
        options.kept
        if options.kept is not None
        else [o.info["settled_bytes"] - o.info["own_import_bytes"] for o in fresh]
    )
    forked.info = {
        **(
            {
                "fresh_peak_bytes": [o.peak_bytes or 0 for o in fresh],
                "fresh_settled_bytes": [o.info["settled_bytes"] for o in fresh],
                "own_import_bytes": [o.info["own_import_bytes"] for o in fresh],
                **({"spare": fresh[0].info["spare"]} if "spare" in fresh[0].info else {}),
            }
            if fresh
            else {"kept": True}
        ),
        "forked_peak_bytes": [o.peak_bytes or 0 for o in forked_ranks],
        "forked_settled_bytes": [o.info["settled_bytes"] for o in forked_ranks],
        "job_bytes": job,
        "offset_bytes": [j - k.info["settled_bytes"] for j, k in zip(job, forked_ranks, strict=False)],
        **children,
    }
    return forked


def settled(measure: Measure, own_import_bytes: int = 0) -> Measure:
    """``measure``, followed by a reading of the process's data memory once the steps' objects are gone (the
    model, the optimizer, the batches: what remains is the process, the part that differs)."""

    def measured(request: ProbeRequest, script: UserScript, t0: float, **kwargs: Any) -> ProbeOutcome:
        import gc

        outcome = measure(request, script, t0, **kwargs)
        gc.collect()
        outcome.info = {**outcome.info, "settled_bytes": _data_bytes(), "own_import_bytes": own_import_bytes}
        return outcome

    return measured


def _forked_as_is(request: ProbeRequest, script: Any) -> ProbeOutcome:
    """The script run as it is in a process forked from this one: its outcome, read as the fresh one's."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        die_with_parent()
        _as_is_steps(request, script, write_fd, 0)
    os.close(write_fd)
    data, _ = read_until_exit(read_fd, pid, None)  # the server's timeout bounds it
    os.close(read_fd)
    if not data:
        return ProbeOutcome(kind="crash", reason="the forked run of the script ended without a report")
    return ProbeOutcome.from_dict(json.loads(data)["outcome"])


def _as_is_steps(request: ProbeRequest, script: Any, fd: int, own_import_bytes: int) -> None:
    """Run a script as it is until its steps are enough; one report line on ``fd`` with the data memory then
    (the script's objects live on in its globals, so both processes are read at the same point: after the
    last step, the step's own memory freed); never returns."""
    from autobatch.probe.as_is_watch import run_script

    def report(outcome: ProbeOutcome) -> None:
        outcome.info = {**outcome.info, "settled_bytes": _data_bytes(), "own_import_bytes": own_import_bytes}
        _report_and_leave(fd, outcome)

    report(run_script(request, script, report))


def _report_and_leave(fd: int, outcome: ProbeOutcome) -> None:
    """Write the one report line on ``fd``, end what the script started, and exit (never returns): nothing
    raised on the way out reaches the script, which would report again."""
    code = 0
    try:
        write_report(fd, outcome)
        end_script_descendants()
    except BaseException:  # noqa: BLE001 - a report that failed is no report: the reader says so
        code = 70
    finally:
        os._exit(code)


def _run_fresh(
    request: ProbeRequest,
    options: FreshOptions,
    env: Mapping[str, str] | None = None,
    ranks: list[Rank] | None = None,
) -> list[ProbeOutcome]:
    """Start the job's processes (one, or a rank each), run the request there; every rank's outcome. ``env``:
    theirs, their output going nowhere (started by the command, whose own output they must not write into;
    None: this process's environment and output). ``ranks``: the list the started processes go into (a caller
    that may stop them from another thread passes its own)."""
    from autobatch.probe.ranks import Rank, stop, watch

    world = request.nproc_per_node if request.strategy != "none" else 1
    deadline = time.perf_counter() + request.timeout * FRESH_TIME_SHARE
    listener = socket.create_server(("127.0.0.1", 0)) if world > 1 else None
    port = listener.getsockname()[1] if listener is not None else 0
    quiet = env is not None
    env = dict(os.environ if env is None else env)
    # the processes' scratch folders (autobatch.probe.files) go into the caller's root (a probe's, or the
    # command's: FreshAhead), or into one this run makes and removes
    made = None if env.get(SCRATCH_ENV) else scratch_root(None)
    if made is not None:
        env[SCRATCH_ENV] = made
    spool = multiprocessing_folder(env[SCRATCH_ENV])  # theirs: a process ended by os._exit leaves it
    ranks = [] if ranks is None else ranks
    spares: list[Taken] = []  # a spare the daemon started ahead (autobatch.probe.spare), held while it runs
    how = ""
    try:
        for rank in range(world):
            read_fd, write_fd = os.pipe()
            keep = [write_fd]
            if listener is not None and rank == 0:
                keep.append(listener.fileno())
            start = {
                **options.to_dict(),
                "request": request.to_dict(),
                "report_fd": write_fd,
                "rank": rank,
                "port": port,
                "listen_fd": keep[1] if len(keep) > 1 else None,
                "multiprocessing_folder": spool,
            }
            spare, how = take(start, env, env[SCRATCH_ENV], write_fd, quiet) if world == 1 else (None, "")
            if spare is not None:
                spares.append(spare)
                pid = spare.pid
            else:
                pid = subprocess.Popen(
                    [sys.executable, "-m", "autobatch.probe.fresh", start_word(start, env[SCRATCH_ENV])],
                    pass_fds=keep,
                    env={**env, **_launcher_env(rank, world, port)},
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL if quiet else None,
                    stderr=subprocess.DEVNULL if quiet else None,
                ).pid
            os.close(write_fd)
            ranks.append(Rank(rank, pid, read_fd))
        if listener is not None:
            listener.close()
        failed = watch(ranks, deadline)
    finally:
        if listener is not None:
            listener.close()
        stop(ranks)
        for each in spares:  # its hang-up: what it left running ends with it
            each.connection.close()
        remove_root(spool)
        if made is not None:
            remove_root(made)
    if failed is not None and failed.outcome is not None:
        outcomes = [failed.outcome]
    else:
        outcomes = [r.outcome for r in ranks if r.outcome is not None]
    if how:  # a command the daemon runs: whether a spare measured it, or why not (the result's fresh_process)
        for outcome in outcomes:
            outcome.info = {**outcome.info, "spare": how}
    return outcomes


class FreshAhead:
    """The job's fresh processes started by the command itself, in a thread, while its probe server starts: the
    two imports of torch (the server's, the fresh process's) on two cores instead of one after the other. The
    run then sends the probe server the outcomes (:attr:`FreshOptions.measured`), which measures the forked half
    against them as it would against its own, or :meth:`cancel` stops them (not needed after all, or the session
    closing first: an interrupted notebook cell leaves none running)."""

    def __init__(self, request: ProbeRequest, options: FreshOptions, env: Mapping[str, str]) -> None:
        self.request = request
        #: The processes' scratch folders (autobatch.probe.files) go here, removed once they ended (or by the
        #: probe server, when the command is killed outright: :func:`autobatch.probe.client.start_server`).
        self.root = scratch_root(None)
        self._outcomes: list[ProbeOutcome] = []
        self._ranks: list[Rank] = []
        env = {**env, SCRATCH_ENV: self.root}
        self._thread = threading.Thread(
            target=self._run, args=(request, options, env), name="autobatch-fresh", daemon=True
        )
        self._thread.start()

    def _run(self, request: ProbeRequest, options: FreshOptions, env: dict[str, str]) -> None:
        try:
            self._outcomes = _run_fresh(request, options, env, self._ranks)
        except Exception:  # noqa: BLE001 - the run measures it again on its probe server, which reports why
            self._outcomes = []
        finally:
            remove_root(self.root)

    def cancel(self) -> None:
        """Stop the fresh processes and wait for the thread (its watch sees them exit and reaps them); a
        process started while this waits is stopped too."""
        while self._thread.is_alive():
            for rank in list(self._ranks):
                if rank.pid:
                    end_tree(rank.pid)
            self._thread.join(0.05)
        self._outcomes = []

    def outcomes(self) -> list[dict[str, Any]] | None:
        """Every rank's outcome once they have ended (None: one did not fit or report; the probe server then
        measures the fresh half itself, and says why it failed)."""
        self._thread.join()
        if not self._outcomes or not all(o.fits for o in self._outcomes):
            return None
        return [o.to_dict() for o in self._outcomes]


def _launcher_env(rank: int, world: int, port: int) -> dict[str, str]:
    """The environment ``torchrun`` gives rank ``rank`` of ``world`` on one node (none for one process)."""
    from autobatch.probe.ranks import torchrun_env

    return torchrun_env(rank, world, port) if world > 1 else {}


def _data_bytes() -> int:
    from autobatch.devices import cpu

    return cpu.read_status().data


def main() -> None:
    """A fresh process (``python -m autobatch.probe.fresh START``): torch, autobatch's modules (measured),
    the script, the steps; one report line on ``report_fd``."""
    spare = (
        sys.argv[1] == SPARE_FLAG
    )  # started ahead by the daemon: its start message comes once torch is imported
    start = {} if spare else read_start_word(sys.argv[1])
    # what the script starts stays below this process, where its end finds it (end_tree), and ends with it when
    # the command is killed outright (unless the script takes SIGHUP for itself)
    become_subreaper()
    end_descendants_on(signal.SIGHUP)
    die_with_parent(signal.SIGHUP)
    if spare:
        import torch  # noqa: F401  (first, as the job imports it)

        start = wait_for_start(int(sys.argv[2]))
    if start.get("multiprocessing_folder"):
        from autobatch.probe.files import use_multiprocessing_folder

        use_multiprocessing_folder(start["multiprocessing_folder"])
    started = time.perf_counter()
    import torch  # noqa: F401  (first, as the job imports it)

    before = _data_bytes()
    from autobatch.probe import as_is_watch, ranks, worker  # noqa: F401  (as_is_watch: before the reading)
    from autobatch.step import loop  # noqa: F401  (what the steps import, before the reading)
    from autobatch.step.as_is import AsIsScript
    from autobatch.step.contract import load_script

    own = _data_bytes() - before
    request = ProbeRequest.from_dict(start["request"])
    if isinstance(start["script"], dict) and start["script"].get("kind") == "as_is":
        _as_is_steps(
            request, AsIsScript.from_spec(start["script"], start["script_args"]), start["report_fd"], own
        )
    install_for(start)  # the job's fresh process, from a scratch folder as every probe
    script = load_script(start["script"], start["script_args"])

    measure = settled(worker.measure_steps, own)
    if request.strategy == "none" or request.nproc_per_node < 2:
        _report_and_leave(start["report_fd"], measure(request, script, started))
    where = (start["rank"], start["port"], start["listen_fd"] if start["rank"] == 0 else -1)
    ranks.rank_main(request, script, measure, where, start["report_fd"], started)


if __name__ == "__main__":
    main()
