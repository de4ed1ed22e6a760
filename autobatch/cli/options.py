"""Options shared by ``tune``, ``check`` and the commands that probe, declared once.

Every option defaults to ``None`` (not given) so that ``autobatch.toml`` and ``AUTOBATCH_*`` can fill
it in; the defaults themselves live only in :mod:`autobatch.settings`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from autobatch.cli.progress import Output
    from autobatch.run.session import OnProbe, Session
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


#: Accepted by every command, after its name as well as before it (``autobatch tune -v``).
VERBOSE = typer.Option(
    False, "--verbose", "-v", callback=_set_verbose, help="Show tracebacks and probe logs on errors."
)
QUIET = typer.Option(
    False, "--quiet", "-q", callback=_set_quiet, help="Print only errors and the final summary line."
)
CONFIG = typer.Option(None, "--config", "-c", help="Settings file (default: ./autobatch.toml when present).")
DEVICE = typer.Option(None, "--device", "-d", help=_help("device"))
MEMORY = typer.Option(None, "--memory", "-m", help=_help("memory"))
HEADROOM = typer.Option(None, "--headroom", help=_help("headroom"))
PRECISION = typer.Option(None, "--precision", "-p", help=_help("precisions"))
OPTIMIZER = typer.Option(None, "--optimizer", "-o", help=_help("optimizers"))
RECOMPUTE = typer.Option(None, "--recompute/--no-recompute", help=_help("recompute"))
RECOMPUTE_CLASS = typer.Option(None, "--recompute-class", help=_help("recompute_classes"))
TIMEOUT = typer.Option(None, "--timeout", help=_help("timeout"))
STRATEGY = typer.Option(None, "--strategy", help=_help("strategy"))
NPROC_PER_NODE = typer.Option(None, "--nproc-per-node", help=_help("nproc_per_node"))
NNODES = typer.Option(None, "--nnodes", help=_help("nnodes"))
JSON = typer.Option(False, "--json", help="Print the result as JSON on stdout.")
CHECK_BATCH_SIZE = typer.Option(
    None, "--check-batch-size/--no-check-batch-size", help=_help("check_batch_size")
)
#: One combination (check, explain): the first precision and optimizer of the settings unless given.
ONE_PRECISION = typer.Option(None, "--precision", "-p", help="Precision (default: the first in settings).")
ONE_OPTIMIZER = typer.Option(None, "--optimizer", "-o", help="Optimizer (default: the first in settings).")
ONE_RECOMPUTE = typer.Option(
    False, "--recompute/--no-recompute", help="Wrap repeated blocks in activation checkpointing."
)
SCRIPT = typer.Argument(
    None,
    help="Training script, or package.module:attribute (default: `script` in autobatch.toml).",
    show_default=False,
)
#: Where the step comes from instead of a script (tune and check).
HF = typer.Option(None, "--hf", help=_help("hf"))
HF_TASK = typer.Option(None, "--hf-task", help=_help("hf_task"))
SEQ_LEN = typer.Option(None, "--seq-len", help=_help("seq_len"))
LIGHTNING = typer.Option(None, "--lightning", help=_help("lightning"))
DATAMODULE = typer.Option(None, "--datamodule", help=_help("datamodule"))
LIGHTNING_CONFIG = typer.Option(None, "--lightning-config", help=_help("lightning_config"))
SCRIPT_ARGS = typer.Argument(None, help="Arguments for the script, after `--`.", show_default=False)


#: Command parameters whose setting has another name (a flag names one item of a list setting).
SETTING_OF: dict[str, str] = {
    "precision": "precisions",
    "optimizer": "optimizers",
    "recompute_class": "recompute_classes",
    "output": "result",
}


def overrides(params: dict[str, Any]) -> dict[str, Any]:
    """Setting name -> value for a command's parameters that name a setting and were given.

    None and empty lists are 'not given'; a single precision or optimizer counts as a list of one.
    """
    from autobatch.settings.docs import BY_NAME

    out: dict[str, Any] = {}
    for param, value in params.items():
        name = SETTING_OF.get(param, param)
        if name not in BY_NAME or value is None or value == []:
            continue
        if name in ("precisions", "optimizers") and isinstance(value, str):
            value = [value]
        elif name == "recompute":
            value = [bool(value)]
        out[name] = value
    return out


def load(params: dict[str, Any]) -> Settings:
    """The settings of a command from its own parameters (``opt.load(locals())``, first thing):
    ``autobatch.toml`` (or ``--config``) < ``AUTOBATCH_*`` < the flags that were given. Parameters
    that are not settings (``batch_size``, ``as_json``, ...) are left out by name."""
    from autobatch.settings import load_settings

    return load_settings(config=params.get("config"), overrides=overrides(params))


def open_session(
    settings: Settings,
    *,
    cache: bool | None = None,
    on_probe: OnProbe | None = None,
    op_modules: tuple[str, ...] = (),
    out: Output | None = None,
) -> Session:
    """The session a command probes through: the probe server (or the runner the CLI state names, in
    tests) on the first device the ``device`` setting names, holding that device's lock while open;
    ``op_modules`` register operations beyond ``probe`` and ``inspect`` (see autobatch.probe.ops)."""
    from autobatch.cli.progress import Output
    from autobatch.cli.state import STATE
    from autobatch.devices.selection import resolve_targets
    from autobatch.run.locks import DeviceLock
    from autobatch.run.session import Session

    out = out or Output()
    target = resolve_targets(settings.device.device, settings.device.memory)[0]
    lock = DeviceLock(
        target.lock_key,
        target.label,
        folder=settings.probe.lock_dir,
        timeout=settings.probe.lock_timeout,
        on_wait=out.wait,
        on_warning=out.warning,
    )
    runner = STATE.runner_factory() if STATE.runner_factory is not None else None
    return Session.from_settings(
        settings,
        cache=cache,
        on_probe=on_probe,
        runner=runner,
        op_modules=op_modules,
        device=target.device,
        identity=target.identity,
        lock=lock,
        wrap_runner=out.watch,
        on_warning=out.warning,
    )
