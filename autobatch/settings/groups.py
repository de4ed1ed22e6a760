"""The settings groups: one frozen dataclass per config section, each validated on construction.

Field names are unique across groups, so a name alone identifies a setting: TOML key ``name`` in
``[group]``, environment variable ``AUTOBATCH_NAME``, and the flag in the field's metadata.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, ClassVar, Optional

from autobatch.core.daemon_mode import DAEMON_MODES
from autobatch.core.maximum import Limits
from autobatch.core.references import HF_TASKS
from autobatch.core.space import (
    OBJECTIVES,
    OPTIMIZERS,
    PRECISION_ALIASES,
    PRECISIONS,
    STRATEGIES,
    canonical_precision,
)
from autobatch.errors import ConfigError, UsageError
from autobatch.settings.values import HINT, Bad, Door, coerce, plain, setting

#: Formats of ``--emit FORMAT[=PATH]``.
EMIT_FORMATS: tuple[str, ...] = ("deepspeed", "hf", "lightning", "accelerate", "env", "args", "json", "toml")


def _validate(group: Any) -> None:
    """Normalise and check a group built in code; the loader does the same with sources attached."""
    problems: list[str] = []
    for f in fields(group):
        try:
            object.__setattr__(group, f.name, coerce(f.metadata, getattr(group, f.name), text=False))
        except Bad as bad:
            problems.append(f"{group.SECTION}.{f.name}: {bad}")
    if not problems:
        for name, other in relations(type(group)):
            if getattr(group, name) < getattr(group, other):
                problems.append(
                    f"{group.SECTION}.{name}: expected an integer >= {other} ({getattr(group, other)}), "
                    f"found {getattr(group, name)}"
                )
    if problems:
        raise ConfigError(problems, hint=HINT)


def relations(group: type) -> list[tuple[str, str]]:
    """Pairs (field, other) of a group where the field must be >= the other (max_steps >= steps)."""
    return [(f.name, f.metadata["at_least"]) for f in fields(group) if "at_least" in f.metadata]


_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@dataclass(frozen=True)
class ScriptSettings:
    """``[script]``: the training script and its arguments."""

    SECTION: ClassVar[str] = "script"
    script: Optional[str] = setting(
        None, "path", "path", "Training script defining build_model(), make_batch(batch_size) and "
        "compute_loss(model, batch), or package.module:attribute holding them, or a script run as it is "
        "(a {batch} placeholder in script_args, or batch_env). Relative paths resolve against the config file.",
        flag="SCRIPT", optional=True, example="train.py", reference_ok=True,
    )  # fmt: skip
    script_args: tuple[str, ...] = setting(
        (), "args", "a list of strings", "Arguments the script sees in sys.argv after its own name (on the "
        "command line: after --; in the environment: one shell-quoted string).",
        flag="-- ARGS", example=["--size", "small"],
    )  # fmt: skip
    batch_env: Optional[str] = setting(None, "str", "an environment variable name", "For a script run as it "
        "is: the variable it reads its batch size from.", optional=True, example="BATCH_SIZE")  # fmt: skip
    seq_len_env: Optional[str] = setting(None, "str", "an environment variable name", "For a script run as it "
        "is, tuned over sequence lengths: the variable it reads its length from (AUTOBATCH_SEQ_LENGTH is always "
        "set), for a length kept in a config file and overridden from the environment.", optional=True,
        example="SEQ_LEN")  # fmt: skip
    variants: tuple[str, ...] = setting((), "strs", "a list of NAME=ARGS", "For a script run as it is: "
        "variants searched beside it, each NAME=ARGS (ARGS, split as a shell splits them, after script_args).",
        flag="--variant", example=["bf16=--bf16"])  # fmt: skip
    check_batch_size: bool = setting(
        True, "bool", "true or false", "Check that every tensor make_batch(n) returns has n in its leading "
        "dimension (a make_batch that ignores its argument gives a wrong maximum); turn off for other layouts.",
        flag="--check-batch-size/--no-check-batch-size",
    )  # fmt: skip
    hf: Optional[str] = setting(
        None, "path", "path", "Instead of a script: a Hugging Face config.json, or a model folder holding one. "
        "The model is built from the config with the auto class of hf_task (weights are never loaded) and "
        "trained on synthesised worst-case batches (of each --seq-len, else the model's maximum positions); the "
        "loss is the model's own.",
        optional=True, example="models/gpt2-small/config.json",
    )  # fmt: skip
    hf_task: Optional[str] = setting(
        None, "str", f"one of {', '.join(HF_TASKS)}", "The Hugging Face task (which auto class builds the "
        "model); unset: from the config's architectures.", optional=True, choices=HF_TASKS, example="causal-lm",
    )  # fmt: skip
    lightning: Optional[str] = setting(
        None, "target", "PATH:Class", "Instead of a script: a LightningModule, as PATH:Class or "
        "package.module:Class. Its training_step is the loss; the batch is the first of train_dataloader() "
        "with the batch size set where Lightning's own finder sets it.",
        optional=True, example="train.py:LitModel",
    )  # fmt: skip
    datamodule: Optional[str] = setting(
        None, "target", "PATH:Class", "The LightningDataModule (PATH:Class or package.module:Class) whose "
        "train_dataloader() gives the batches; unset: the module's own.", optional=True,
        example="train.py:LitData",
    )  # fmt: skip
    lightning_config: Optional[str] = setting(
        None, "path", "path", "YAML file with the init arguments of the module and the data module, as "
        "LightningCLI takes them (model: and data: sections).", optional=True, example="config.yaml",
    )  # fmt: skip

    def __post_init__(self) -> None:
        _validate(self)


@dataclass(frozen=True)
class DeviceSettings:
    """``[device]``: where to tune and how much memory counts."""

    SECTION: ClassVar[str] = "device"
    device: str = setting(
        "auto", "str", "auto, cpu, cuda or cuda:N",
        "Device to tune on; auto picks CUDA when available, else the CPU.", check=_DEVICE.match,
    )  # fmt: skip
    memory: Optional[int] = setting(
        None, "size", 'bytes, or a size such as "2GiB"', "Memory capacity to tune for: on CUDA it "
        "calibrates for a smaller card; on the CPU it caps the probe process's data memory (RLIMIT_DATA). "
        "Unset: the device's capacity. A number without a unit is bytes, from 1 MiB up (below, a unit left out "
        "is refused).", optional=True, example="2GiB",
    )  # fmt: skip
    headroom: float = setting(
        0.10, "float", "a fraction 0 <= h < 1",
        "Fraction of the capacity kept free as a safety margin, on every device.", check=lambda h: 0 <= h < 1,
    )  # fmt: skip

    def __post_init__(self) -> None:
        _validate(self)


@dataclass(frozen=True)
class SearchSettings:
    """``[search]``: the grid of precision x optimizer x recomputation and the batch-size range."""

    SECTION: ClassVar[str] = "search"
    precisions: tuple[str, ...] = setting(
        ("32-true", "bf16-mixed"), "strs", "a list of precisions", "Precisions to search, in order of "
        f"preference (ties go to the earlier one): {', '.join(PRECISIONS)}; Lightning's short names "
        f"{', '.join(f'{k} ({v})' for k, v in PRECISION_ALIASES.items())} are accepted.",
        flag="--precision", choices=PRECISIONS, item="precision names", nonempty=True,
        aliases=canonical_precision,
    )  # fmt: skip
    optimizers: tuple[str, ...] = setting(
        ("adamw",), "strs", "a list of optimizers",
        f"Optimizers to search, in order of preference: {', '.join(OPTIMIZERS)}.",
        flag="--optimizer", choices=OPTIMIZERS, item="optimizer names", nonempty=True,
    )  # fmt: skip
    recompute: tuple[str, ...] = setting(
        ("off", "full", "selective", "partial"), "levels", "a list of levels, a bool, or \"both\"",
        "Activation recomputation levels to search: off, full (every repeated block checkpointed), selective "
        "(matmul and attention outputs kept, the rest recomputed), K/N (K of the N blocks), partial (the K the "
        "plan needs); true is full, false is off, both is off and full.",
        flag="--recompute/--no-recompute, --recompute-level", example=["off", "full"],
    )  # fmt: skip
    compile: tuple[bool, ...] = setting(
        (False,), "bools", 'a bool, a list of bools, or "both"', "torch.compile the model in each probe: false, "
        "true, or both (searched as a dimension; compile time is reported apart from step time).",
        flag="--compile/--no-compile",
    )  # fmt: skip
    recompute_classes: tuple[str, ...] = setting(
        (), "strs", "a list of class names",
        "Module class names to checkpoint when recomputing; empty: detect the repeated blocks.",
        flag="--recompute-class", example=["Block"],
    )  # fmt: skip
    seq_lens: tuple[int, ...] = setting(
        (), "ints", "a list of integers >= 1", "Sequence lengths (tokens per sample) to search, each passed to "
        "make_batch(batch_size, seq_len); empty: make_batch(batch_size), one shape.", flag="--seq-len",
        minimum=1, example=[512, 2048],
    )  # fmt: skip
    batch_multiple: int = setting(
        1, "int", "an integer >= 1", "Candidate batch sizes are multiples of this.", minimum=1,
    )  # fmt: skip
    max_batch_size: int = setting(
        65536, "int", "an integer >= batch_multiple", "Largest batch size the search tries.",
        minimum=1, at_least="batch_multiple",
    )  # fmt: skip
    exact_all: bool = setting(
        False, "bool", "true or false",
        "Find the exact maximum of every combination, also of those that cannot win under the objective.",
        flag="--exact-all/--no-exact-all",
    )  # fmt: skip
    strict: bool = setting(
        False, "bool", "true or false", "Fail the tune (exit 3) when the step's peak depends on the data (make_batch "
        "must return the worst case); otherwise the result's notes and a warning say so.", flag="--strict/--no-strict",
    )  # fmt: skip
    # Last in the group, so that the starter file's [search.optimizer_kwargs.NAME] tables come last.
    optimizer_kwargs: Mapping[str, Mapping[str, Any]] = setting(
        None, "kwargs", "a table per optimizer name", "Keyword arguments for each optimizer: one table per "
        "optimizer name, such as search.optimizer_kwargs.adamw holding lr = 3e-4 (in the environment: JSON).",
        flag=None, factory=lambda: MappingProxyType({}), example={"adamw": {"lr": 3e-4}},
    )  # fmt: skip

    def __post_init__(self) -> None:
        _validate(self)


@dataclass(frozen=True)
class PlanSettings:
    """``[plan]``: the accumulation plan and how the winner is chosen."""

    SECTION: ClassVar[str] = "plan"
    global_batch_size: Optional[int] = setting(
        None, "int", "an integer >= 1", "Target global batch (micro x accumulation x world size); "
        "unset: the chosen micro-batch with no accumulation.", optional=True, minimum=1, example=256,
    )  # fmt: skip
    world_size: Optional[int] = setting(
        None, "int", "an integer >= 1", "Data-parallel processes; unset: WORLD_SIZE, else SLURM's "
        "variables, else 1.", optional=True, minimum=1, example=8,
    )  # fmt: skip
    seq_len: Optional[int] = setting(None, "int", "an integer >= 1", "The job's sequence length, which the plan "
        "and the emitted configs use (searched too); unset: the longest of seq_lens.", optional=True, minimum=1,
        flag="--plan-seq-len", example=2048)  # fmt: skip
    objective: str = setting(
        "throughput", "str", f"one of {', '.join(OBJECTIVES)}", "How the winner is chosen: throughput "
        "(least time per global batch) or max-batch (largest micro-batch).", choices=OBJECTIVES,
    )  # fmt: skip

    def __post_init__(self) -> None:
        _validate(self)


@dataclass(frozen=True)
class DistributedSettings:
    """``[distributed]``: the strategy the job trains with, measured on every rank of one node."""

    SECTION: ClassVar[str] = "distributed"
    strategy: str = setting(
        "none", "str", "none, ddp or fsdp", "Distributed strategy each probe runs: none (one process), "
        "ddp (DistributedDataParallel) or fsdp (FSDP2 fully_shard per repeated block and the root); "
        "every rank is measured and a batch fits only if it fits on every rank.", choices=STRATEGIES,
    )  # fmt: skip
    nproc_per_node: int = setting(
        1, "int", "an integer >= 1", "Rank processes per probe (and per node in the plan); with a "
        "strategy, tune and check need at least 2 (on CUDA, one GPU each from the device's index).", minimum=1,
    )  # fmt: skip
    nnodes: Optional[int] = setting(
        None, "int", "an integer >= 1", "Nodes of the job: with a strategy, the plan's world size is "
        "nproc_per_node x nnodes unless world_size is set; unset: SLURM's node count, else 1.",
        optional=True, minimum=1, example=4,
    )  # fmt: skip

    def __post_init__(self) -> None:
        _validate(self)


@dataclass(frozen=True)
class ProbeSettings:
    """``[probe]``: how long each isolated probe runs."""

    SECTION: ClassVar[str] = "probe"
    steps: int = setting(
        3, "int", "an integer >= 3", "Full training steps per probe (forward, loss, backward, "
        "optimizer.step, zero_grad); at least 3, as optimizer state appears at the first step.", minimum=3,
    )  # fmt: skip
    max_steps: int = setting(
        8, "int", "an integer >= steps", "Most steps a probe runs while its peak still grows.",
        minimum=3, at_least="steps",
    )  # fmt: skip
    confirm_steps: int = setting(
        10, "int", "an integer >= steps", "Most steps of the longer probe that confirms each final maximum: "
        "six at least (what the leak check reads), then on while its peak still grows.",
        minimum=3, at_least="steps",
    )  # fmt: skip
    timeout: float = setting(
        300.0, "float", "seconds > 0", "Seconds before a probe is killed and reported as timed out.",
        check=lambda t: t > 0,
    )  # fmt: skip
    cache: bool = setting(
        True, "bool", "true or false", "Reuse an earlier run's result and probes when nothing that decides "
        "memory changed: the script and its local modules, its arguments, the searched settings, the device "
        "and the versions (tune --refresh measures again and replaces them); on the CPU also the job's fresh "
        "process, measured once and kept for the next tune or check.", flag="--cache/--no-cache",
    )  # fmt: skip
    cache_dir: Optional[str] = setting(
        None, "path", "path", "Folder of the cache: probe journals (one file per fingerprint, appended after "
        "every probe) and stored results; safe to share between runs and nodes (file-locked); unset: the "
        "user's cache folder (autobatch/probes under it).", optional=True,
        flag=None, example="/scratch/autobatch-cache", folder=True,
    )  # fmt: skip
    lock_dir: Optional[str] = setting(
        None, "path", "path", "Folder of the per-device locks (one tuner per GPU, or per host on the CPU); "
        "must be local to the node and shared by its users and jobs; unset: autobatch-locks in the node's /tmp "
        "(else /var/tmp), whatever TMPDIR says.", optional=True, flag=None, example="/tmp/autobatch-locks", folder=True,
    )  # fmt: skip
    lock_timeout: Optional[float] = setting(
        None, "float", "seconds > 0", "Longest wait for another run's probes on the same device (exit 7) or for "
        "another run writing the same result file (exit 2) before giving up; unset: as long as it takes.", optional=True, check=lambda t: t > 0, example=600,
    )  # fmt: skip
    fresh_baseline: bool = setting(True, "bool", "true or false", "CPU: count in every probe how much more the job's "
        "fresh process (or each rank as torchrun starts it) holds than a forked probe (measured once per run).", flag=None)  # fmt: skip

    def __post_init__(self) -> None:
        _validate(self)


@dataclass(frozen=True)
class OutputSettings:
    """``[output]``: the result file and the launcher configs written from it."""

    SECTION: ClassVar[str] = "output"
    result: str = setting(
        "autobatch-result.json", "str", "a path", "Where the result JSON is written (relative to the "
        "working directory).", flag="--output",
    )  # fmt: skip
    emit: tuple[str, ...] = setting(
        (), "strs", "a list of FORMAT or FORMAT=PATH", "Launcher configs to write after a tune, each FORMAT "
        f"or FORMAT=PATH; formats: {', '.join(EMIT_FORMATS)}.",
        choices=EMIT_FORMATS, item="formats", pairs=True, example=["deepspeed", "env=autobatch.env"],
    )  # fmt: skip
    lightning_batch_key: str = setting(
        "data.batch_size", "str", "a dotted key", "Dotted key of the data module's batch size in the "
        "Lightning overlay.", check=_DOTTED.match,
    )  # fmt: skip
    deepspeed_base: Optional[str] = setting(
        None, "path", "path", "Your DeepSpeed config: the deepspeed emitter overlays the batch settings "
        "onto it and keeps the rest (ZeRO stage included).", optional=True, example="ds_config.json",
    )  # fmt: skip
    deepspeed_optimizer: bool = setting(
        False, "bool", "true or false", "Write an optimizer section into the DeepSpeed config even when the "
        "base config has none (DeepSpeed then builds the optimizer, at its default learning rate unless the "
        "base sets one); otherwise the optimizer stays the one your code passes.",
        flag="--deepspeed-optimizer",
    )  # fmt: skip
    allow_cpu: bool = setting(
        False, "bool", "true or false", "Write launcher configs (deepspeed, hf, lightning, accelerate, env) "
        "from a result measured on the CPU although the CPU was not asked for (device auto found no GPU).",
        flag="--allow-cpu",
    )  # fmt: skip

    def __post_init__(self) -> None:
        _validate(self)


@dataclass(frozen=True)
class DaemonSettings:
    """``[daemon]``: whether commands run through the user's daemon on this node (docs/daemon.md)."""

    SECTION: ClassVar[str] = "daemon"
    daemon: str = setting(
        "off", "str", "off, auto or on", "Run tune, check, explain and estimate through the daemon "
        "(`autobatch serve`): auto starts it on first use and runs in-process with a note when it cannot be "
        "reached; on makes that an error; off never uses it.", flag=None, choices=DAEMON_MODES,
    )  # fmt: skip
    daemon_idle: float = setting(
        900.0, "float", "seconds > 0", "Seconds without a request after which a started daemon exits.",
        flag=None, check=lambda t: t > 0,
    )  # fmt: skip

    def __post_init__(self) -> None:
        _validate(self)


_ALL = (ScriptSettings, DeviceSettings, SearchSettings, PlanSettings, DistributedSettings, ProbeSettings)
GROUPS: dict[str, type] = {cls.SECTION: cls for cls in (*_ALL, OutputSettings, DaemonSettings)}
SECTIONS = ", ".join(f"[{section}]" for section in GROUPS)


@dataclass(frozen=True)
class Settings:
    """Every setting of a run, by group; ``origins`` maps a field name to where its value came from."""

    script: ScriptSettings = field(default_factory=ScriptSettings)
    device: DeviceSettings = field(default_factory=DeviceSettings)
    search: SearchSettings = field(default_factory=SearchSettings)
    plan: PlanSettings = field(default_factory=PlanSettings)
    distributed: DistributedSettings = field(default_factory=DistributedSettings)
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    output: OutputSettings = field(default_factory=OutputSettings)
    daemon: DaemonSettings = field(default_factory=DaemonSettings)
    source_files: tuple[str, ...] = ()
    origins: Mapping[str, str] = field(default_factory=dict, compare=False)
    door: Door = field(default="cli", compare=False)  # who asked: how a message names a lever

    def require_script(self) -> str:
        """The training script; a clear error when none was given (the one place that says so)."""
        if not self.script.script:
            raise UsageError(
                "no training script given",
                hint="pass SCRIPT, or set `script` under [script] in autobatch.toml (autobatch init writes one)",
            )
        return self.script.script

    def limits(self) -> Limits:
        """The candidates and probe lengths of the per-combination search."""
        return Limits(
            max_batch_size=self.search.max_batch_size,
            batch_multiple=self.search.batch_multiple,
            steps=self.probe.steps,
            max_steps=self.probe.max_steps,
            confirm_steps=self.probe.confirm_steps,
        )

    def get(self, name: str) -> Any:
        """A field's value by its (unique) name: ``settings.get("headroom")``."""
        for section, cls in GROUPS.items():
            if name in {f.name for f in fields(cls)}:
                return getattr(getattr(self, section), name)
        raise KeyError(f"not a setting: {name!r}")

    def origin(self, name: str) -> str:
        """Where ``name`` came from: "default", a file path, ``AUTOBATCH_X``, a flag or a keyword argument."""
        return self.origins.get(name, "default")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain, TOML- and JSON-able values by section (unset values left out)."""
        return {
            section: {
                f.name: plain(getattr(getattr(self, section), f.name))
                for f in fields(cls)
                if getattr(getattr(self, section), f.name) is not None
            }
            for section, cls in GROUPS.items()
        }
