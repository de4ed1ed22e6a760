"""The command line the job runs, with the plan filled in: for a script tuned as it is (pure).

The script's arguments (with the chosen variant's) get the chosen micro-batch in place of ``{batch}`` (or
``NAME=value`` before the command for ``batch_env``), the plan's length in place of ``{seq_len}`` (or for
``seq_len_env``), the accumulation in place of ``{accum}``, and the launcher of the plan's world (the interpreter
for one process, else the interpreter's ``-m torch.distributed.run``, torchrun's module, starting the world the global
batch is planned for, measured as ranks or not). The ``args`` format writes it as a shell file, ``env`` exports it as
``AUTOBATCH_COMMAND``: docs/as-is.md ("The answer in the form you run").

The interpreter is the one the tune measured with (``as_is["python"]`` of the result: the tuning process's
``sys.executable``), named by its path, not ``python`` or ``torchrun`` looked up on ``PATH``: a job script that runs
the file without the virtualenv activated (``sh autobatch-command.sh`` from a scheduler) would otherwise start
another Python, one without torch or with another torch, whose peak no probe measured. The path holds on every node
that mounts the same environment (a cluster's shared file system); where it lives elsewhere (another image), the
file's header names it and says to put that node's Python in its place. A result written before the interpreter was
recorded keeps ``python``, and its header says so.
"""

from __future__ import annotations

import shlex

from autobatch.core.space import variant_of
from autobatch.emit.common import EmitOptions, comment_block, provenance, require_chosen
from autobatch.errors import UsageError
from autobatch.records.result import Chosen, TuneResult
from autobatch.step.as_is import ACCUM_PLACEHOLDER, substitute


def command(result: TuneResult, python: str | None = None) -> list[str] | None:
    """The plan's command line as words (``NAME=value`` words first), or None for a result whose script
    did not run as it is. ``AUTOBATCH_BATCH_SIZE`` and ``AUTOBATCH_SEQ_LENGTH``, set in every probe too, are
    autobatch's own and are not repeated (unless named as ``batch_env`` or ``seq_len_env``). ``python``: the
    interpreter to run it (default: the tune's, :func:`interpreter`)."""
    if result.as_is is None or result.chosen is None:
        return None
    chosen = result.chosen
    env = [f"{name}={value}" for name, value in chosen.environment.items()]  # what the answer holds under
    batch_env, seq_len_env = result.as_is.get("batch_env"), result.as_is.get("seq_len_env")
    env += [f"{batch_env}={chosen.micro_batch_size}"] if batch_env else []
    env += [f"{seq_len_env}={chosen.seq_len}"] if seq_len_env and chosen.seq_len is not None else []
    variant = variant_of(chosen.precision)
    extra = (result.as_is.get("variants") or {}).get(variant, []) if variant else []
    given = chosen.accumulation_steps // (chosen.script_accumulation or 1)  # the rest is the script's own
    args = substitute([*result.script_args, *extra], chosen.micro_batch_size, given, chosen.seq_len)
    return [*env, *launcher(chosen, python or interpreter(result)), result.script, *args]


#: What runs the command of a result that does not record the tune's interpreter (written before it did).
PATH_PYTHON = "python"


def interpreter(result: TuneResult) -> str:
    """The Python the tune measured with (its path), or ``python`` for a result that does not record it."""
    return (result.as_is or {}).get("python") or PATH_PYTHON


def launcher(chosen: Chosen, python: str) -> list[str]:
    """``python`` (the interpreter's path) for a world of one, else ``python -m torch.distributed.run`` (torchrun,
    run by that interpreter) starting the plan's world: its nodes (when they divide the world) and the processes per
    node that make it up. From the world size, never from how many ranks were measured: a plan for 2 measured in one
    process (``WORLD_SIZE=2``) is a job of 2 processes, and one process would run half its global batch."""
    world = chosen.world_size
    if world < 2:
        return [python]
    nodes = chosen.num_nodes if chosen.num_nodes >= 1 and world % chosen.num_nodes == 0 else 1
    words = [python, "-m", "torch.distributed.run", f"--nproc-per-node={world // nodes}"]
    if nodes > 1:
        words.append(f"--nnodes={nodes}")
    return words


def command_text(result: TuneResult) -> str | None:
    """:func:`command` as one shell line."""
    words = command(result)
    return shlex.join(words) if words is not None else None


def render_args(result: TuneResult, options: EmitOptions) -> str:
    """A shell file: the provenance as comments, then the command line."""
    require_chosen(result)
    line = command_text(result)
    if line is None:
        raise UsageError(
            "the args format writes the command line of a script tuned as it is; this result's script defines "
            "autobatch's functions (its batch size is yours to pass)",
            hint="use --format env (AUTOBATCH_MICRO_BATCH_SIZE) or a launcher's format, or tune the training "
            "script itself: autobatch tune train.py -- --batch-size {batch}",
        )
    header = provenance(result, options, "The job's command line")
    header.append(f"python: {interpreter_words(result)}")
    header.append("run: sh <this file>  (or copy the line)")
    header.extend(caveats(result, options))
    return comment_block(header) + line + "\n"


def interpreter_words(result: TuneResult) -> str:
    """What the file's header says of the interpreter its line runs."""
    python = interpreter(result)
    if python == PATH_PYTHON:
        return "the first python on PATH (this result does not record the interpreter its tune measured with)"
    return (
        f"{python}, the interpreter the tune measured with (its torch and packages); on a machine where that "
        "environment lives elsewhere, put its Python in place of the path"
    )


def caveats(result: TuneResult, options: EmitOptions) -> list[str]:
    """What the command line cannot say: a world it starts that no probe measured as ranks, an accumulation
    the script's arguments cannot carry."""
    chosen = require_chosen(result)
    if result.as_is is None:
        return []
    notes = []
    if chosen.strategy == "none" and chosen.world_size > 1:
        notes.append(
            f"the plan is for a world of {chosen.world_size} processes and its micro-batch was measured in one, "
            "not beside its peers (a DDP rank holds more: its gradient buckets): the line starts them on one machine "
            "(on several, give torchrun --nnodes and --nproc-per-node whose product is "
            f"{chosen.world_size}); to measure the ranks, tune with --nproc-per-node N"
        )
    if chosen.accumulation_steps != (chosen.script_accumulation or 1) and not any(
        ACCUM_PLACEHOLDER in arg for arg in result.script_args
    ):
        notes.append(
            f"the plan accumulates {chosen.accumulation_steps} micro-batches per optimizer step, and the script's "
            "arguments have no {accum} to carry it: pass it the way the script takes it (or tune with {accum} in "
            "the arguments)"
        )
    return notes
