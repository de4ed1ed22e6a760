"""``autobatch run``: launch a script run as it is with its plan, and relaunch it smaller when memory runs out.

Exit status: the job's own (128 + N when signal N ended it), 5 when it ran out of memory with no relaunch
left or its guard gave up, 2 for a bad command line, and the codes of ``tune`` when the plan has to be tuned
first.
"""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from autobatch.cli import options as opt
from autobatch.cli.app import app
from autobatch.cli.progress import Output

ResultFile = Annotated[
    Optional[str],
    typer.Option(
        "--result",
        help="Take the plan from this result file (written by `autobatch tune`) instead of the cache or a tune.",
    ),
]
MaxRestarts = Annotated[
    int,
    typer.Option(
        "--max-restarts",
        min=0,
        help="Relaunches after the job runs out of memory, each at a smaller micro-batch.",
    ),
]
ResumeArgs = Annotated[
    Optional[str],
    typer.Option(
        "--resume-args",
        help='Arguments added to the script\'s from the second launch on, split as a shell would ("--resume").',
    ),
]


@app.command(context_settings={"allow_interspersed_args": True})
def run(
    script: opt.Script = None,
    script_args: opt.ScriptArgs = None,
    result: ResultFile = None,
    max_restarts: MaxRestarts = 3,
    resume_args: ResumeArgs = None,
    config: opt.Config = None,
    device: opt.Device = None,
    memory: opt.Memory = None,
    headroom: opt.Headroom = None,
    global_batch_size: opt.GlobalBatchSize = None,
    world_size: opt.WorldSize = None,
    strategy: opt.Strategy = None,
    nproc_per_node: opt.NprocPerNode = None,
    nnodes: opt.Nnodes = None,
    batch_multiple: opt.BatchMultiple = None,
    max_batch_size: opt.MaxBatchSize = None,
    objective: opt.Objective = None,
    steps: opt.Steps = None,
    max_steps: opt.MaxSteps = None,
    confirm_steps: opt.ConfirmSteps = None,
    timeout: opt.Timeout = None,
    batch_env: opt.BatchEnv = None,
    seq_len_env: opt.SeqLenEnv = None,
    variant: opt.Variant = None,
    cache: opt.Cache = None,
    lock_timeout: opt.LockTimeout = None,
    verbose: opt.Verbose = False,
    quiet: opt.Quiet = False,
) -> None:
    """Launch a script run as it is with its plan ({batch}, {accum}); relaunch it smaller when memory runs out."""
    import shlex

    from autobatch.service.relaunch import RunOptions
    from autobatch.service.relaunch import run as run_job

    settings = opt.load(locals())
    out = Output()
    options = RunOptions(
        result_file=result, max_restarts=max_restarts, resume_args=tuple(shlex.split(resume_args or ""))
    )
    code = run_job(
        settings,
        options,
        out.hooks(on_result=lambda _: out.close()),  # the tune's live line ends before the job
        say=lambda line: out.line(f"autobatch run: {line}"),
        warn=out.warning,
    )
    out.close()
    sys.exit(code)  # the job's own exit code, whatever it is
