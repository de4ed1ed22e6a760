"""A training script run as it is: how the batch reaches it, and whether a script is one. No torch.

A script that defines ``build_model`` and ``make_batch`` is a three-function script (autobatch owns its
step); any other is run as it is, as ``__main__``, when the command line says how the probe's micro-batch
reaches it: a ``{batch}`` placeholder in the arguments after ``--`` (replaced by the batch size), or
``batch_env`` (an environment variable the script reads; ``AUTOBATCH_BATCH_SIZE`` is always set). A tuned
length reaches it the same two ways: ``{seq_len}``, or ``seq_len_env`` (``AUTOBATCH_SEQ_LENGTH`` is always set),
for a script that reads its length from a config file and lets the environment override it. Which one a
script is, is read from its source, never by running it (:func:`defines_contract`), because running an as-is
script runs its training loop. The probe itself lives in :mod:`autobatch.probe.as_is`.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autobatch.core.units import format_bytes
from autobatch.errors import ScriptError, UsageError

#: The placeholder the probe's micro-batch replaces in the script's arguments.
PLACEHOLDER = "{batch}"
#: The placeholder the plan's accumulation steps replace (1 in every probe: a probe is one micro-batch a step).
ACCUM_PLACEHOLDER = "{accum}"
#: Always set in an as-is probe's environment to the probe's micro-batch.
BATCH_ENV = "AUTOBATCH_BATCH_SIZE"
#: The placeholder a probe's sequence length (``--seq-len``) replaces, and the plan's in the job's command line.
SEQ_LEN_PLACEHOLDER = "{seq_len}"
#: Always set in an as-is probe's environment to the probe's sequence length, when lengths are tuned. Not
#: ``AUTOBATCH_SEQ_LEN``: that is the setting of the plan's length (``[plan] seq_len``), which autobatch reads.
SEQ_LEN_ENV = "AUTOBATCH_SEQ_LENGTH"
#: The names whose top-level definition makes a script a three-function one (compute_loss may be the
#: model's own, for Hugging Face models: see autobatch.step.contract.user_script).
CONTRACT_NAMES = ("build_model", "make_batch")
#: Names in a script's source that show a batch-size finder of its own (warned about: autobatch replaces it).
FINDERS = (
    "auto_find_batch_size",
    "find_executable_batch_size",
    "scale_batch_size",
    "BatchSizeFinder",
    "auto_scale_batch_size",
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class AsIsScript:
    """What an as-is probe runs: the script's path, its arguments (placeholders unreplaced), and the
    environment variables that carry the batch and the length (None: only ``AUTOBATCH_BATCH_SIZE`` and
    ``AUTOBATCH_SEQ_LENGTH``)."""

    path: Path
    args: tuple[str, ...] = ()
    batch_env: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    seq_len_env: str | None = None

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], args: Sequence[str]) -> AsIsScript:
        """The script an ``as_is`` spec record names (as the probe server's init message carries it)."""
        options = dict(spec.get("options") or {})
        path = Path(str(spec["target"])).resolve()
        return cls(path, tuple(args), options.get("batch_env"), options, options.get("seq_len_env"))

    def argv(self, batch_size: int, variant: str | None = None, seq_len: int | None = None) -> list[str]:
        """``sys.argv`` of a probe at ``batch_size``: the path, then the arguments (and the ``variant``'s)
        with ``{batch}`` (and ``{seq_len}``) replaced."""
        extra = (self.options.get("variants") or {}).get(variant, []) if variant else []
        return [str(self.path), *substitute([*self.args, *extra], batch_size, seq_len=seq_len)]

    def environment(self, batch_size: int, seq_len: int | None = None) -> dict[str, str]:
        """The variables that carry the batch size (and, given one, the length) into the script."""
        return variables(batch_size, self.batch_env, seq_len, self.seq_len_env)


def variables(
    batch_size: int, batch_env: str | None, seq_len: int | None = None, seq_len_env: str | None = None
) -> dict[str, str]:
    """The environment a script run as it is gets its batch size and length from: autobatch's own variables and
    the script's (``batch_env``, ``seq_len_env``); a length only where one is tuned. A probe's, or the job's."""
    env = {BATCH_ENV: str(batch_size)}
    if batch_env:
        env[batch_env] = str(batch_size)
    if seq_len is not None:
        env[SEQ_LEN_ENV] = str(seq_len)
        if seq_len_env:
            env[seq_len_env] = str(seq_len)
    return env


def not_measured_by(command: str, how: str) -> UsageError:
    """The error of a command that needs autobatch's own step (``explain``, ``estimate``) on a script run
    as it is: ``how`` is what the command does with the three functions."""
    return UsageError(
        f"{command} {how}, and this script runs as it is (it defines no build_model/make_batch/compute_loss)",
        hint="measure it as it runs: `autobatch check SCRIPT --batch-size N -- ... {batch}` (one batch, its peak "
        "per rank) or `autobatch tune`; to break its memory down, write the three functions (see examples/)",
    )


_VARIANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


def parse_variants(items: Sequence[str]) -> dict[str, list[str]]:
    """``["bf16=--bf16 --amp"]`` -> ``{"bf16": ["--bf16", "--amp"]}``: each variant's name and arguments."""
    variants: dict[str, list[str]] = {}
    for item in items:
        name, equals, args = item.partition("=")
        name = name.strip()
        if not equals or not _VARIANT_NAME.match(name) or name in variants:
            why = "a name used twice" if name in variants else "expected NAME=ARGS"
            raise UsageError(
                f"--variant {item!r}: {why}",
                hint="name each variant once, with letters, digits, '.', '_', '+' or '-', and give its arguments: "
                "--variant bf16=--bf16 (ARGS are added after the script's own arguments)",
            )
        try:
            variants[name] = shlex.split(args)
        except ValueError as exc:
            raise UsageError(
                f"--variant {item!r}: {exc}", hint="quote its arguments as a shell would"
            ) from None
    return variants


def variants_need_as_is() -> UsageError:
    return UsageError(
        "--variant compares a script run as it is with other arguments, and this script defines autobatch's "
        "functions",
        hint="a three-function script searches precision, optimizer and recomputation itself (-p, -o, "
        "--recompute); drop --variant, or pass script arguments after --",
    )


def accumulation(laps: Sequence[int]) -> int:
    """Micro-batches per optimizer step from the backward passes before each step: the same number k > 1
    before every step is the script's own gradient accumulation; anything else (one optimizer among several,
    a first step that differs, uneven counts) is 1."""
    return laps[0] if len(laps) >= 2 and laps[0] > 1 and all(n == laps[0] for n in laps) else 1


def accumulation_note(micro: int) -> str:
    return (
        f"the script runs {micro} backward passes per optimizer step (gradient accumulation of its own): samples "
        f"per second count {micro} micro-batches a step, each optimizer step sees {micro} x the micro-batch, and "
        "the plan counts them: micro-batch x accumulation (the script's own, times what {accum} gives it) x world "
        "= global"
    )


def compile_error(path: str) -> ScriptError | None:
    """The probe server's start-up check of an as-is script: it compiles (nothing of it runs), else why not."""
    try:
        compile(Path(path).read_bytes(), path, "exec")
    except (SyntaxError, ValueError, OSError) as exc:
        return ScriptError(
            f"{Path(path).name} cannot be compiled: {exc}", hint="fix the script so that python runs it"
        )
    return None


def finder_warning(path: str | Path) -> str | None:
    """:func:`own_finder` of the script at ``path``."""
    return own_finder(Path(path).read_text(errors="replace"))


def substitute(
    args: Sequence[str], batch_size: int, accumulation: int = 1, seq_len: int | None = None
) -> list[str]:
    """The arguments with every ``{batch}`` replaced by ``batch_size`` (``--bs={batch}`` too), every
    ``{accum}`` by ``accumulation`` and, given a length, every ``{seq_len}`` by it."""
    out = [
        arg.replace(PLACEHOLDER, str(batch_size)).replace(ACCUM_PLACEHOLDER, str(accumulation))
        for arg in args
    ]
    return out if seq_len is None else [arg.replace(SEQ_LEN_PLACEHOLDER, str(seq_len)) for arg in out]


def batch_way(args: Sequence[str], batch_env: str | None) -> str:
    """How the batch size reaches a script run as it is, in the words of its command line: the arguments that
    hold ``{batch}`` (with the option before it), or the environment variable."""
    words = [
        " ".join(args[max(0, i - 1) : i + 1])
        if i and args[i - 1].startswith("-") and arg == PLACEHOLDER
        else arg
        for i, arg in enumerate(args)
        if PLACEHOLDER in arg
    ]
    ways = [f"`{w}` in its arguments" for w in words]
    if batch_env:
        ways.append(f"the environment variable {batch_env}")
    return " and ".join(ways) or f"the environment variable {BATCH_ENV}"


def has_placeholder(args: Sequence[str]) -> bool:
    return any(PLACEHOLDER in arg for arg in args)


def check_env_name(name: str | None, flag: str, what: str, example: str) -> None:
    """``--batch-env`` or ``--seq-len-env`` (``flag``) given an environment variable's name, else a usage error."""
    if name is not None and not _ENV_NAME.match(name):
        raise UsageError(
            f"{flag} {name!r} is not an environment variable name",
            hint=f"name the variable your script reads the {what} from, for example {flag} {example}",
        )


def takes_length(args: Sequence[str], seq_len_env: str | None) -> bool:
    """Whether a length has a way into a script run as it is: ``{seq_len}`` in its arguments, or ``seq_len_env``."""
    return any(SEQ_LEN_PLACEHOLDER in arg for arg in args) or bool(seq_len_env)


def top_level_names(source: str) -> set[str] | None:
    """The names the source defines, imports or assigns at its top level; None when that cannot be read
    (a syntax error, which importing it reports as for any script, or a ``from module import *``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def defines_contract(source: str) -> bool:
    """Whether the source defines ``build_model`` and ``make_batch`` at its top level (or may: see
    :func:`top_level_names`). Read, never run."""
    names = top_level_names(source)
    return names is None or all(name in names for name in CONTRACT_NAMES)


def defines_none(source: str) -> bool:
    """Whether the source surely defines none of the three functions and runs code of its own at its top level
    (a loop, a call, a ``__main__`` block: a script meant to run as it is). A three-function script that misses
    one, or a file of imports alone, is imported as before, and its error names what is wrong."""
    names = top_level_names(source)
    if names is None or names & {*CONTRACT_NAMES, "compute_loss"}:
        return False
    quiet = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    body = ast.parse(source).body
    return any(
        not isinstance(node, quiet)
        and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
        for node in body
    )


def is_as_is(source: str, args: Sequence[str], batch_env: str | None) -> bool:
    """Whether a script runs as it is: it does not define the functions, and the batch has a way in."""
    return not defines_contract(source) and (has_placeholder(args) or bool(batch_env))


def no_way_error(label: str) -> UsageError:
    """The one message for a script with neither the functions nor a way to pass the batch: both ways."""
    return UsageError(
        f"{label} does not define build_model() and make_batch(batch_size), and nothing says how the batch "
        "size reaches it, so autobatch can run it neither way",
        hint=(
            f"run it as it is, with the batch size in its arguments: autobatch tune {label} -- --batch-size "
            f"{PLACEHOLDER} (the placeholder is replaced by each probe's micro-batch), or in an environment "
            f"variable it reads: --batch-env BATCH_SIZE ({BATCH_ENV} is always set); or define the three "
            "functions build_model(), make_batch(batch_size) and compute_loss(model, batch) (see examples/), "
            "so that autobatch also searches precision, optimizer and recomputation"
        ),
    )


def own_finder(source: str) -> str | None:
    """A warning when the script runs a batch-size finder of its own (read from its source), else None."""
    found = [name for name in FINDERS if re.search(rf"\b{name}\b", source)]
    if not found:
        return None
    return (
        f"the script mentions {', '.join(found)}: a batch-size finder of its own would change the batch the "
        "probes measure; autobatch replaces it (turn it off for the tune and for the job)"
    )


def not_counted_note(children: int, own_bytes: int | None = None) -> str:
    """The note of a CPU probe whose script started processes of its own (DataLoader workers, ...), which held
    ``own_bytes`` of their own (unique to them: None, not read) when the probe reported.

    What counts, and why: the budget and the peak are the data memory of the script's own process, the process
    that trains, which ``RLIMIT_DATA`` caps as a job's ``ulimit -d`` caps each of its processes on its own. A
    worker's memory is its own process's: each worker runs under the same cap (inherited, as in the job), and its
    memory counts in no other process's. A spawned worker is a whole interpreter of its own (torch and the script's
    top level imported again: 190 MiB each of tests/scripts/as_is/loader_workers.py's); a forked one shares its
    parent's pages until it writes them. The batches the workers send are shared memory, the data of no process:
    ``RLIMIT_DATA`` does not count them, in the probe or in the job (:class:`autobatch.devices.cpu.DataPeak`).
    A memory cgroup (a container's limit, a SLURM job's ``--mem``) counts every process in it, the workers and
    the batches in flight too: there the job needs room for them beside the budget, which the note's figure
    sizes."""
    held = f", which held {format_bytes(own_bytes)} of their own when the probe reported" if own_bytes else ""
    return (
        f"the script started {children} process(es) of its own (DataLoader workers, ...){held}: on the CPU device "
        "their memory is their own processes', not counted in the probe's peak or budget (each process has its own "
        "cap, as under ulimit -d); where the job's limit is a memory cgroup (a container's, a SLURM --mem), which "
        "counts them too, tune with --memory at its room less theirs"
    )
