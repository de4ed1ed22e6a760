"""Every option of ``tune``, ``check``, ``explain`` and ``estimate``, declared once as an annotated alias.

A command names its parameters with these types (``device: opt.Device = None``). Every option that is a
setting defaults to ``None`` (not given) so that ``autobatch.toml`` and ``AUTOBATCH_*`` can fill it in;
the defaults and help texts live only in :mod:`autobatch.settings`. :func:`load` turns a command's
parameters into its settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

if TYPE_CHECKING:
    from collections.abc import Mapping

    from autobatch.settings import Settings


def _help(name: str) -> str:
    try:
        from autobatch.settings import help_for

        return help_for(name)
    except Exception:  # noqa: BLE001 - help text must never break the CLI
        return ""


def _set_verbose(value: bool) -> bool:
    from autobatch.cli.state import STATE

    if value:
        STATE.verbose = True
    return value


def _set_quiet(value: bool) -> bool:
    from autobatch.cli.app import console
    from autobatch.cli.state import STATE

    if value:
        STATE.quiet = True
        console.quiet = True  # errors and the summary line print past it (Output.summary, report_error)
    return value


def _setting(flag: str, name: str, *short: str) -> Any:
    """The option of the setting ``name`` (its help text from the settings)."""
    return typer.Option(flag, *short, help=_help(name))


# -- what every probing command takes --------------------------------------------------------------------

#: Accepted by every command, after its name as well as before it (``autobatch tune -v``).
Verbose = Annotated[
    bool,
    typer.Option("--verbose", "-v", callback=_set_verbose, help="Show tracebacks and probe logs on errors."),
]
Quiet = Annotated[
    bool,
    typer.Option(
        "--quiet",
        "-q",
        callback=_set_quiet,
        help="Print only errors and the final summary line (errors alone with --json).",
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
Script = Annotated[
    Optional[str],
    typer.Argument(
        help="Training script, or package.module:attribute (default: `script` in autobatch.toml).",
        show_default=False,
    ),
]
ScriptArgs = Annotated[
    Optional[list[str]], typer.Argument(help="Arguments for the script, after `--`.", show_default=False)
]
Config = Annotated[
    Optional[Path],
    typer.Option("--config", "-c", help="Settings file (default: ./autobatch.toml when present)."),
]
Device = Annotated[Optional[str], _setting("--device", "device", "-d")]
Memory = Annotated[Optional[str], _setting("--memory", "memory", "-m")]
Headroom = Annotated[Optional[float], _setting("--headroom", "headroom")]
RecomputeClass = Annotated[Optional[list[str]], _setting("--recompute-class", "recompute_classes")]
Timeout = Annotated[Optional[float], _setting("--timeout", "timeout")]
BatchEnv = Annotated[Optional[str], _setting("--batch-env", "batch_env")]
SeqLenEnv = Annotated[Optional[str], _setting("--seq-len-env", "seq_len_env")]
Variant = Annotated[Optional[list[str]], _setting("--variant", "variants")]
CheckBatchSize = Annotated[
    Optional[bool], _setting("--check-batch-size/--no-check-batch-size", "check_batch_size")
]
Strategy = Annotated[Optional[str], _setting("--strategy", "strategy")]
NprocPerNode = Annotated[Optional[int], _setting("--nproc-per-node", "nproc_per_node")]
Nnodes = Annotated[Optional[int], _setting("--nnodes", "nnodes")]
WorldSize = Annotated[Optional[int], _setting("--world-size", "world_size", "-w")]
BatchMultiple = Annotated[Optional[int], _setting("--batch-multiple", "batch_multiple")]
MaxBatchSize = Annotated[Optional[int], _setting("--max-batch-size", "max_batch_size")]
Plot = Annotated[
    Optional[Path],
    typer.Option("--plot", help="Draw memory against batch size (and the breakdown) to FILE (.png or .svg)."),
]

# -- the search space: every combination (tune, estimate) or one (check, explain) -------------------------

Precisions = Annotated[Optional[list[str]], _setting("--precision", "precisions", "-p")]
Optimizers = Annotated[Optional[list[str]], _setting("--optimizer", "optimizers", "-o")]
Recompute = Annotated[Optional[bool], _setting("--recompute/--no-recompute", "recompute")]
#: Recomputation levels to search (tune, estimate): off, full, selective, K/N, partial; overrides --recompute.
RecomputeLevel = Annotated[
    Optional[list[str]],
    typer.Option("--recompute-level", help="Recomputation level to search (repeatable): off, full, selective, "
    "K/N (K of the N blocks), partial (the K the plan needs)."),
]  # fmt: skip
Compile = Annotated[Optional[bool], _setting("--compile/--no-compile", "compile")]
#: One combination (check, explain): the first precision and optimizer of the settings unless given.
OnePrecision = Annotated[
    Optional[str], typer.Option("--precision", "-p", help="Precision (default: the first in settings).")
]
OneOptimizer = Annotated[
    Optional[str], typer.Option("--optimizer", "-o", help="Optimizer (default: the first in settings).")
]
#: One level (check, explain): overrides --recompute.
OneLevel = Annotated[
    Optional[str],
    typer.Option(
        "--recompute-level", help="Recomputation level: off, full, selective or K/N (K of the N blocks)."
    ),
]
OneCompile = Annotated[
    bool, typer.Option("--compile/--no-compile", help="torch.compile the model in the probe.")
]
OneRecompute = Annotated[
    bool, typer.Option("--recompute/--no-recompute", help="Wrap repeated blocks in activation checkpointing.")
]
BatchSize = Annotated[int, typer.Option("--batch-size", "-b", min=1, help="The batch size to run.")]

# -- where the step comes from instead of a script (tune and check) --------------------------------------

Hf = Annotated[Optional[str], _setting("--hf", "hf")]
HfTask = Annotated[Optional[str], _setting("--hf-task", "hf_task")]
#: Sequence lengths: tune searches each; check, explain and estimate take one each (see their help).
SeqLen = Annotated[Optional[list[int]], _setting("--seq-len", "seq_lens")]
PlanSeqLen = Annotated[Optional[int], _setting("--plan-seq-len", "seq_len")]
Lightning = Annotated[Optional[str], _setting("--lightning", "lightning")]
Datamodule = Annotated[Optional[str], _setting("--datamodule", "datamodule")]
LightningConfig = Annotated[Optional[str], _setting("--lightning-config", "lightning_config")]

# -- tune only: the search, the plan, the cache, the output ----------------------------------------------

GlobalBatchSize = Annotated[Optional[int], _setting("--global-batch-size", "global_batch_size", "-g")]
Objective = Annotated[Optional[str], _setting("--objective", "objective")]
Steps = Annotated[Optional[int], _setting("--steps", "steps")]
MaxSteps = Annotated[Optional[int], _setting("--max-steps", "max_steps")]
ConfirmSteps = Annotated[Optional[int], _setting("--confirm-steps", "confirm_steps")]
Cache = Annotated[Optional[bool], _setting("--cache/--no-cache", "cache")]
Refresh = Annotated[
    bool,
    typer.Option(
        "--refresh",
        help="Ignore the cache: measure every probe again (the new result replaces the stored one).",
    ),
]
LockTimeout = Annotated[Optional[float], _setting("--lock-timeout", "lock_timeout")]
ExactAll = Annotated[Optional[bool], _setting("--exact-all/--no-exact-all", "exact_all")]
Strict = Annotated[Optional[bool], _setting("--strict/--no-strict", "strict")]
Output = Annotated[Optional[str], _setting("--output", "result")]
Emit = Annotated[Optional[list[str]], _setting("--emit", "emit", "-e")]
LightningBatchKey = Annotated[Optional[str], _setting("--lightning-batch-key", "lightning_batch_key")]
DeepspeedBase = Annotated[Optional[str], _setting("--deepspeed-base", "deepspeed_base")]
DeepspeedOptimizer = Annotated[Optional[bool], _setting("--deepspeed-optimizer", "deepspeed_optimizer")]
AllowCpu = Annotated[Optional[bool], _setting("--allow-cpu", "allow_cpu")]


#: Command parameters whose setting has another name (a flag names one item of a list setting).
SETTING_OF: dict[str, str] = {
    "precision": "precisions",
    "optimizer": "optimizers",
    "recompute_class": "recompute_classes",
    "variant": "variants",
    "recompute_level": "recompute",
    "output": "result",
}


def overrides(params: dict[str, Any]) -> dict[str, Any]:
    """Setting name -> value for a command's parameters that name a setting and were given.

    None and empty lists are 'not given'; a single precision or optimizer counts as a list of one. A script
    that starts with ``-`` is the first of the script's arguments (``autobatch tune -- --seq-len 2048``, the
    script named in ``autobatch.toml``): Click gives the first word after ``--`` to SCRIPT, and a word before
    ``--`` that starts with ``-`` is an option, so only that word can.
    """
    from autobatch.settings.docs import BY_NAME

    script = params.get("script")
    if isinstance(script, str) and script.startswith("-"):
        params = {**params, "script": None, "script_args": [script, *(params.get("script_args") or [])]}
    out: dict[str, Any] = {}
    for param, value in params.items():
        name = SETTING_OF.get(param, param)
        if name not in BY_NAME or value is None or value == []:
            continue
        if name in ("precisions", "optimizers") and isinstance(value, str):
            value = [value]
        elif name == "recompute" and isinstance(value, bool):
            value = [value]
        elif name == "compile":
            value = [bool(value)]
        out[name] = value
    return out


def load(params: dict[str, Any]) -> Settings:
    """The settings of a command from its own parameters (``opt.load(locals())``, first thing):
    ``autobatch.toml`` (or ``--config``) < ``AUTOBATCH_*`` < the flags that were given. Parameters
    that are not settings (``batch_size``, ``as_json``, ...) are left out by name."""
    import os

    from autobatch.settings import load_settings

    settings = load_settings(config=params.get("config"), overrides=overrides(params))
    warn_stray_variables(os.environ)
    return settings


def warn_stray_variables(env: Mapping[str, str]) -> None:
    """A warning line for each ``AUTOBATCH_*`` variable that reads like a setting's but is none, and so is ignored
    (:func:`autobatch.settings.load.stray_variables`). A name the env file writes for the job (``AUTOBATCH_PRECISION``,
    read like ``AUTOBATCH_PRECISIONS``) is warned about too, saying whose name it is, unless the environment holds the
    env file's plan (:func:`sourced_plan`: a job that sourced it); a probe's own variables never are."""
    from autobatch.settings.load import stray_variables

    stray = stray_variables(env)
    if not stray:
        return
    from autobatch.cli.progress import Output
    from autobatch.emit.env import ENV_NAMES
    from autobatch.step.as_is import BATCH_ENV, SEQ_LEN_ENV

    sourced = sourced_plan(env)
    out = Output()
    for name, meant in stray:
        if name in (BATCH_ENV, SEQ_LEN_ENV) or (name in ENV_NAMES and sourced):
            continue
        whose = (
            " (a name the env file writes for the job, --emit env, not a setting)"
            if name in ENV_NAMES
            else ""
        )
        out.warning(f"{name} is no setting's variable and is ignored{whose}: did you mean {meant}?")


#: What every env file writes: all of them set means the environment holds a sourced env file's plan.
SOURCED_MARKS = ("AUTOBATCH_MICRO_BATCH_SIZE", "AUTOBATCH_ACCUMULATION_STEPS", "AUTOBATCH_PLAN_WORLD_SIZE")


def sourced_plan(env: Mapping[str, str]) -> bool:
    """Whether ``env`` holds the plan of an env file a job sourced (every name of :data:`SOURCED_MARKS` set): its
    other names are then the file's too, not a setting mistyped."""
    return all(env.get(name, "").strip() for name in SOURCED_MARKS)


def own_variables() -> set[str]:
    """The ``AUTOBATCH_*`` names autobatch itself sets that read like a setting's variable: the env file's plan
    (a job sources it), a probe's batch and length. Not settings, and not mistakes (the env file's are warned about
    when set alone: :func:`warn_stray_variables`)."""
    from autobatch.emit.env import ENV_NAMES
    from autobatch.step.as_is import BATCH_ENV, SEQ_LEN_ENV

    return {*ENV_NAMES, BATCH_ENV, SEQ_LEN_ENV}
