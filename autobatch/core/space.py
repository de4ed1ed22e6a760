"""The searched space: precisions, optimizers, recomputation, and their combinations.

Names follow the ecosystem: precisions use Lightning's names, optimizers short names that map to
``torch.optim`` classes with their default settings (see ``autobatch.step.optimizers``).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple, get_args

from autobatch.core.levels import FULL, OFF, key_word, parse_level

Precision = Literal["32-true", "bf16-mixed", "16-mixed", "bf16-true"]
OptimizerName = Literal[
    "sgd", "sgd-momentum", "adam", "adamw", "adamw-fused", "adafactor", "rmsprop", "adagrad"
]
Objective = Literal["throughput", "max-batch"]

PRECISIONS: tuple[str, ...] = get_args(Precision)
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerName)
OBJECTIVES: tuple[str, ...] = get_args(Objective)
#: Distributed strategies a probe can run (autobatch.step.wrapping): one process, DDP, FSDP2.
STRATEGIES: tuple[str, ...] = ("none", "ddp", "fsdp")

#: Lightning's short precision names (``Trainer(precision="bf16")``), and what Lightning takes them for.
PRECISION_ALIASES: dict[str, str] = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}


def canonical_precision(name: str | int) -> str:
    """A precision by its full name: ``"bf16"`` -> ``"bf16-mixed"``, ``16`` -> ``"16-mixed"``; others unchanged."""
    return PRECISION_ALIASES.get(str(name).strip(), str(name).strip())


#: Parameter-sized optimizer states each optimizer keeps (Adafactor's state is factored: rows + columns).
OPTIMIZER_STATES: dict[str, float] = {
    "sgd": 0,
    "sgd-momentum": 1,
    "adam": 2,
    "adamw": 2,
    "adamw-fused": 2,
    "adafactor": 0,  # factored; see optimizer_state_bytes
    "rmsprop": 1,
    "adagrad": 1,
}


@dataclass(frozen=True, order=True)
class Combo:
    """One point of the searched grid."""

    precision: str
    optimizer: str
    level: str = OFF  # the recomputation level (autobatch.core.levels): off, full, selective or K/N
    seq_len: int | None = None  # tokens per sample (None: make_batch's one shape)
    compile: bool = False  # torch.compile in the probe

    @property
    def recompute(self) -> bool:
        """Anything recomputed (the result file's boolean; ``level`` says how much)."""
        return self.level != OFF

    @property
    def recompute_level(self) -> str:
        return self.level

    @property
    def ident(self) -> Ident:
        """What tells combinations apart at one length: precision, optimizer, level, compile."""
        return Ident(self.precision, self.optimizer, self.recompute_level, self.compile)

    @property
    def key(self) -> str:
        key = self.ident.name
        return key if self.seq_len is None else f"{key} at {self.seq_len} tokens"

    def at(self, seq_len: int | None) -> Combo:
        """The same combination at another sequence length."""
        return replace(self, seq_len=seq_len)

    def with_level(self, level: str) -> Combo:
        """The same combination at another recomputation level."""
        return replace(self, level=level)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"precision": self.precision, "optimizer": self.optimizer}
        out.update(recompute=self.recompute, recompute_level=self.recompute_level)
        if self.compile:
            out["compile"] = True
        if self.seq_len is not None:
            out["seq_len"] = self.seq_len
        return out


class Ident(NamedTuple):
    """A combination's identity at one length. A tuple still: it compares and hashes as
    ``(precision, optimizer, level, compile)``."""

    precision: str
    optimizer: str
    level: str  # the recomputation level (autobatch.core.levels)
    compile: bool

    @property
    def name(self) -> str:
        """How tables, notes and progress lines name the combination (:func:`combo_key`)."""
        return combo_key(self.precision, self.optimizer, self.level, self.compile)


def combo_key(precision: str, optimizer: str, level: str, compile: bool = False) -> str:
    """``32-true/adamw/recompute``, ``bf16-mixed/adamw/recompute-6of12+compile``: a combination as tables,
    notes and progress lines name it."""
    return f"{precision}/{optimizer}/{key_word(level)}" + ("+compile" if compile else "")


def ident_of(item: object) -> Ident:
    """The identity of anything that names a combination (a Combo, a result's entry, the chosen one, or their
    dicts): its ``recompute_level`` when it has one (results written before levels: from ``recompute``)."""
    names = ("precision", "optimizer", "recompute", "recompute_level", "compile")
    values = item if isinstance(item, Mapping) else {name: getattr(item, name, None) for name in names}
    level = values.get("recompute_level") or (FULL if values.get("recompute") else OFF)
    return Ident(
        str(values.get("precision")), str(values.get("optimizer")), str(level), bool(values.get("compile"))
    )


#: The one combination of a script run as it is (autobatch.step.as_is): its precision, optimizer and
#: recomputation are its own, so the search is over the batch size alone.
SCRIPT_OWN = "script"
SCRIPT_COMBO = Combo(SCRIPT_OWN, SCRIPT_OWN)


def script_combo(variant: str | None = None) -> Combo:
    """The combination of a script run as it is, or of one of its argument variants (``script:NAME``)."""
    return SCRIPT_COMBO if not variant else Combo(f"{SCRIPT_OWN}:{variant}", SCRIPT_OWN)


def script_combos(variants: Mapping[str, object]) -> list[Combo]:
    """The combinations of a script run as it is: the script, then each argument variant."""
    return [SCRIPT_COMBO, *map(script_combo, variants)]


def variant_of(precision: str) -> str | None:
    """The argument variant a ``script:NAME`` precision names (None: the script's own arguments)."""
    own, colon, name = precision.partition(":")
    return name if own == SCRIPT_OWN and colon else None


def script_note(variants: dict[str, list[str]]) -> str:
    """The result's note on a script run as it is (and its argument variants)."""
    note = (
        "the script runs as it is: precision, optimizer and recomputation are its own, so the combination "
        "searched (script/script) is the batch size alone; the micro-batch is what reached the script in its "
        "arguments or environment"
    )
    for name, args in variants.items():
        note += f"; script:{name} is the script with {shlex.join(args) or 'no more arguments'} after its own"
    return note


def combinations(
    precisions: list[str] | tuple[str, ...],
    optimizers: list[str] | tuple[str, ...],
    recompute: list[str] | tuple[str, ...] | list[bool] | tuple[bool, ...],
    compile: list[bool] | tuple[bool, ...] = (False,),
) -> list[Combo]:
    """Every combination, in the order the user listed precisions, then optimizers, then compile, then
    recomputation levels (booleans: off and full)."""
    levels = [parse_level(r) for r in recompute]
    return [
        Combo(p, o, level, compile=c)
        for p in precisions
        for o in optimizers
        for c in compile
        for level in levels
    ]


def block_labels(blocks: Iterable[str], counts: Mapping[str, int]) -> list[str]:
    """The block classes recomputation wraps as the table and ``explain`` name them, ``["Block x 12"]``
    (a class alone where its count is not known)."""
    return [f"{name} x {counts[name]}" if counts.get(name) else name for name in blocks]


def optimizer_state_bytes(optimizer: str, param_shapes: list[tuple[int, ...]], state_bytes: int = 4) -> int:
    """Analytic optimizer-state bytes for parameters of the given shapes.

    Adafactor (``torch.optim.Adafactor``) keeps, for a matrix, one row and one column vector
    (factored second moment) and, for a vector or scalar, a full-size second moment; plus a step.
    """
    numel = sum(_prod(s) for s in param_shapes)
    if optimizer != "adafactor":  # a script's own optimizer (SCRIPT_OWN): not known before it runs
        return int(OPTIMIZER_STATES.get(optimizer, 0) * numel * state_bytes)
    total = 0
    for shape in param_shapes:
        if len(shape) >= 2:
            rows = _prod(shape[:-1])
            cols = _prod(shape[:-2]) * shape[-1]
            total += (rows + cols) * state_bytes
        else:
            total += _prod(shape) * state_bytes
    return total


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out
