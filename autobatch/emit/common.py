"""What every emitter shares: the options, the chosen plan, and the provenance comment.

Emitters render text from a :class:`~autobatch.records.result.TuneResult`; this module holds the pieces they
all need, so each format module only maps the plan onto its consumer's keys. Nothing here writes a
file or imports torch or a consumer library.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata

from autobatch.core.levels import SELECTIVE, fraction
from autobatch.core.space import ident_of
from autobatch.core.units import format_bytes
from autobatch.errors import AutobatchError, UsageError
from autobatch.records.liveness import RESUME_HINT, unfinished
from autobatch.records.result import Chosen, TuneResult, nothing_chosen
from autobatch.settings.levers import neutral

_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

#: Momentum autobatch's ``sgd-momentum`` uses (``autobatch.step.optimizers``); emitters repeat it.
SGD_MOMENTUM = 0.9


@dataclass(frozen=True)
class EmitOptions:
    """How to render; everything else comes from the result.

    ``generated_by`` is the command line named in each file's header, ``generated_at`` the emission
    time (None: left out, which keeps golden files stable). ``deepspeed_base`` is the path of the
    user's DeepSpeed JSON that the deepspeed emitter overlays. ``transformers_version`` picks the
    TrainingArguments key names (None: the names every release from 4.11 to 5.x accepts).
    ``deepspeed_optimizer`` writes a DeepSpeed optimizer section although the base has none;
    ``allow_cpu`` lets launcher configs come from a CPU result the CPU was not asked for
    (:func:`check_device`).
    """

    generated_by: str = "autobatch emit"
    generated_at: str | None = None
    lightning_batch_key: str = "data.batch_size"
    deepspeed_base: str | None = None
    hf_output_dir: str = "trainer_output"
    transformers_version: str | None = None
    deepspeed_optimizer: bool = False
    allow_cpu: bool = False

    def __post_init__(self) -> None:
        if not _DOTTED.match(self.lightning_batch_key):
            raise UsageError(
                f"not a dotted key: {self.lightning_batch_key!r}",
                hint="name the data module's batch-size argument as it appears in the LightningCLI config, "
                "such as data.batch_size or data.init_args.batch_size",
            )


def make_options(generated_by: str, **overrides: object) -> EmitOptions:
    """Options for a real run: emitted now, for the transformers installed here (if any)."""
    values: dict[str, object] = {
        "generated_by": generated_by,
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "transformers_version": installed_version("transformers"),
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return EmitOptions(**values)  # type: ignore[arg-type]


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution, read from its metadata (no import)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def require_chosen(result: TuneResult) -> Chosen:
    """The chosen configuration, or a UsageError when the tune chose none (or has not finished): why, and the fix,
    in the words of the tune's own error (a length at which not one sample fits is fixed by a shorter length, a
    script run as it is by its own arguments, not by a lighter optimizer)."""
    if result.chosen is None:
        reason = unfinished(result.to_dict())
        if reason is not None:
            raise UsageError(f"no configuration to emit: {reason}", hint=RESUME_HINT)
        why = _nothing_chosen(result)  # the tune's own error, again
        raise UsageError(
            f"no configuration to emit: {why.message}",
            hint=f"{why.hint}; then emit again (the json and toml formats write the whole result as it is)",
        )
    return result.chosen


def why_none(result: TuneResult) -> str:
    """Why ``result`` holds no chosen configuration, as :func:`require_chosen` says it: its tune did not finish, or
    the tune's own error (nothing fits the budget, recomputation asked of a model without repeated blocks, a length
    at which not one sample fits)."""
    return unfinished(result.to_dict()) or _nothing_chosen(result).message


def _nothing_chosen(result: TuneResult) -> AutobatchError:
    return nothing_chosen(result, int(result.device.get("budget_bytes") or 0))


#: The caveat of every launcher's file for a script tuned as it is.
SCRIPT_OWN = (
    "the script ran as it is: its precision, optimizer and recomputation are its own, so this file leaves them "
    "out and sets the batch arithmetic alone"
)


def script_own(chosen: Chosen) -> bool:
    """The script ran as it is: precision, optimizer and recomputation are the script's (none to set)."""
    return chosen.precision.partition(":")[0] == "script"  # "script:NAME": one of its argument variants


def arithmetic(chosen: Chosen) -> str:
    """The batch arithmetic, nanoGPT-style: ``micro-batch 12 x accumulation 5 x world 8 = global 480``."""
    text = (
        f"micro-batch {chosen.micro_batch_size} x accumulation {chosen.accumulation_words} "
        f"x world {chosen.world_size} = global {chosen.global_batch_size}"
    )
    if chosen.seq_len is not None:  # the plan is for the job's length (autobatch.run.lengths)
        text += f" at {chosen.seq_len} tokens per sample"
    if chosen.requested_global_batch_size is None:
        return text + " (no global batch requested)"
    return text + f" (requested {chosen.requested_global_batch_size})"


def token_budget(result: TuneResult) -> int | None:
    """The chosen combination's token budget (the most tokens per micro-batch that fit at every searched
    length), or None when no lengths were searched."""
    chosen = result.chosen
    if result.lengths is None or chosen is None:
        return None
    for surface in result.lengths.surfaces:
        if ident_of(surface) == chosen.ident:
            return surface.get("token_budget")
    return None


def describe_choice(chosen: Chosen) -> str:
    level = chosen.ident.level
    return f"{chosen.precision}, optimizer {chosen.optimizer}, recompute {level}" + (
        ", torch.compile" if chosen.compile else ""
    )


def lever_caveats(chosen: Chosen, compile_set: bool = False) -> list[str]:
    """What a launcher file cannot set of a recomputation level between off and full, or of compile
    (``compile_set``: the format sets compile itself)."""
    level, notes = chosen.ident.level, []
    if fraction(level) is not None:
        k, n = fraction(level)  # type: ignore[misc]
        notes.append(
            f"recompute {level}: the maximum was measured with the first {k} of the model's {n} repeated blocks "
            "checkpointed (torch.utils.checkpoint; autobatch.apply_recompute(model, level) does the same in your "
            "job); checkpointing every block also fits, with more recomputation"
        )
    elif level == SELECTIVE:
        notes.append(
            "recompute selective: the maximum was measured with every repeated block checkpointed under a policy "
            "that keeps matmul and attention outputs (torch.utils.checkpoint.create_selective_checkpoint_contexts; "
            "autobatch.apply_recompute(model, 'selective') does the same in your job)"
        )
    if chosen.compile and not compile_set:
        notes.append(
            "compile: the maximum was measured under torch.compile(model); compile yours the same way"
        )
    return notes


def provenance(result: TuneResult, options: EmitOptions, what: str) -> list[str]:
    """Where a file came from, its batch arithmetic, and the plan's note (lines without ``#``)."""
    version = result.autobatch_version or "(unknown version)"
    script = " ".join([result.script, *(shlex.quote(a) for a in result.script_args)])
    device = result.device or {}
    where = str(device.get("type", "unknown device"))
    if device.get("name"):
        where += f" ({device['name']})"
    if device.get("budget_bytes"):
        where += f", budget {format_bytes(device['budget_bytes'])}"
    lines = [
        f"{what} written by autobatch {version} from a tune of {script}",
        f"command: {options.generated_by}",
    ]
    lines.append(f"device: {where}")
    dates = [
        f"tuned {result.created}" if result.created else "",
        f"emitted {options.generated_at}" if options.generated_at else "",
    ]
    if any(dates):
        lines.append(", ".join(d for d in dates if d))
    if result.chosen is None:
        lines.append(f"no configuration was chosen: {why_none(result)}")
        return lines
    if result.status != "complete":
        lines.append(f"the tune is {result.status}: the choice comes from a partial search")
    lines.append(f"chosen: {describe_choice(result.chosen)} (objective: {result.objective})")
    lines.append(arithmetic(result.chosen))
    if result.chosen.note:
        lines.append(f"note: {result.chosen.note}")
    elif not result.chosen.exact:
        lines.append("note: the requested global batch has no exact split; this is the closest one")
    return lines


def comment_block(lines: list[str], width: int = 110) -> str:
    """``# ``-prefixed lines; embedded newlines and long lines are wrapped, never left uncommented.

    Characters YAML and TOML refuse in a comment (control characters) are written as escapes.
    """
    out: list[str] = []
    for line in lines:
        for raw in str(line).splitlines() or [""]:
            part = "".join(
                c if c.isprintable() or c == "\t" else c.encode("unicode_escape").decode() for c in raw
            )
            wrapped = textwrap.wrap(
                part, width=width, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False
            )
            out.extend(f"# {w}" for w in wrapped or [""])
    return "\n".join(out) + "\n"


def version_at_least(version: str | None, minimum: tuple[int, ...]) -> bool:
    """Compare the leading numeric parts of a version string (``5.23.0.dev0`` counts as 5.23.0)."""
    if version is None:
        return False
    parts: list[int] = []
    for piece in version.split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
    return tuple(parts) >= minimum


def on_cpu(result: TuneResult) -> bool:
    """The tune measured the CPU device, so its numbers apply to CPU training."""
    return str((result.device or {}).get("type", "")).lower() == "cpu"


def cpu_by_choice(result: TuneResult) -> bool:
    """The result was measured on the CPU because the CPU was asked for (``--device cpu``)."""
    return on_cpu(result) and (result.device or {}).get("requested") == "cpu"


def check_device(result: TuneResult, what: str, options: EmitOptions) -> None:
    """Refuse a launcher config (``what``) from a CPU result unless the CPU was asked for or ``allow_cpu``.

    ``--device auto`` on a machine without a GPU (a login node) measures the CPU; its numbers in a
    GPU job's config would be wrong, and ``use_cpu: true`` would move the job off its GPUs.
    """
    if not on_cpu(result) or cpu_by_choice(result) or options.allow_cpu:
        return
    requested = (result.device or {}).get("requested")
    how = (
        "--device auto found no GPU and fell back to the CPU"
        if requested == "auto"
        else "the result does not say the CPU was asked for"
    )
    raise UsageError(
        f"the result was measured on the CPU ({how}): {what} from it would carry CPU numbers into a GPU job",
        hint=f"tune on a machine with the GPU; to train on the CPU, tune with {neutral('device', 'cpu')} or pass "
        f"{neutral('allow_cpu', True)}",
    )
