"""What the probe server loads: a script spec, the one record every way of naming a training step maps onto.

A :class:`ScriptSpec` says where the three functions come from (``kind``: path, reference, pickled, hf,
lightning, as_is); :func:`autobatch.step.contract.load_script` turns it into a
:class:`~autobatch.step.contract.UserScript` inside the probe server. :meth:`ScriptSpec.content` is what the
probe journal's fingerprint hashes. The ways of naming a step: docs/script.md ("Other ways to name the
step") and docs/python-api.md ("The step"). No torch here.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autobatch.core.references import HF_TASKS, is_file_reference, is_reference, split_reference
from autobatch.errors import UsageError

__all__ = [
    "HF_TASKS",
    "KINDS",
    "ScriptSpec",
    "is_file_reference",
    "is_reference",
    "select_spec",
    "split_reference",
]

KINDS = ("path", "reference", "pickled", "hf", "lightning", "as_is")


@dataclass(frozen=True)
class ScriptSpec:
    """Where the probe server finds the training step (see the module docstring for the kinds)."""

    kind: str
    target: str
    options: Mapping[str, Any] = field(default_factory=dict)
    #: Folders the server adds to ``sys.path`` (the caller's, for references and pickled objects).
    sys_path: tuple[str, ...] = ()
    label: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown script spec kind {self.kind!r}")
        if not self.label:
            object.__setattr__(self, "label", self.target)

    @classmethod
    def file(cls, path: str | Path) -> ScriptSpec:
        return cls("path", str(path))

    @property
    def is_file(self) -> bool:
        """The step is one ``.py`` file the user wrote (three functions, or run as it is)."""
        return self.kind in ("path", "as_is")

    def to_init(self) -> str | dict[str, Any]:
        """What the probe server's init message carries: the path itself, or this record."""
        return self.target if self.kind == "path" else self.to_dict()

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "target": self.target,
            "options": dict(self.options),
            "sys_path": list(self.sys_path),
            "label": self.label,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScriptSpec:
        return cls(
            str(data["kind"]),
            str(data["target"]),
            dict(data.get("options") or {}),
            tuple(data.get("sys_path") or ()),
            str(data.get("label") or ""),
        )

    # -- checks and identity, in the parent --------------------------------------------------------

    def check(self) -> None:
        """Refuse, before the server starts, a spec whose files do not exist."""
        if self.is_file:
            from autobatch.step.scriptpath import check_script_path

            check_script_path(self.target)  # a folder, a missing file, not a regular file: each named
        elif self.kind == "hf":
            hf_config_file(self.target)
        elif self.kind == "lightning":
            for flag, target in (
                ("--lightning", self.target),
                ("--datamodule", self.options.get("datamodule")),
            ):
                if target:
                    _check_target(flag, target)
            config = self.options.get("config")
            if config and not Path(config).is_file():
                raise UsageError(
                    f"--lightning-config: no such file: {config}", hint="pass a LightningCLI YAML file"
                )

    def content(self) -> bytes:
        """The bytes the probe journal's fingerprint covers: the spec and every file it reads."""
        head = json.dumps([self.kind, self.target, dict(self.options)], sort_keys=True, default=str).encode()
        if self.kind == "path":
            return Path(self.target).read_bytes()
        if self.kind == "as_is":  # the batch's way in changes what runs
            return head + Path(self.target).read_bytes()
        if self.kind == "pickled":  # a temporary file; its identity is the same in every process
            identity = self.options.get("identity")
            return json.dumps([self.kind, self.label, identity]).encode() + (
                b"" if identity else Path(self.target).read_bytes()
            )
        if self.kind == "hf":
            return head + hf_config_file(self.target).read_bytes()
        files: list[Path | None] = []
        if self.kind == "reference":
            files.append(self.module_file(split_reference(self.target)[0]))
        else:
            for target in (self.target, self.options.get("datamodule")):
                if target:
                    where = split_reference(target)[0]
                    files.append(Path(where) if is_file_reference(where) else self.module_file(where))
            config = self.options.get("config")
            files.append(Path(config) if config else None)
        return head + b"".join(f.read_bytes() for f in files if f is not None and f.is_file())

    def module_file(self, module: str) -> Path | None:
        """The source file of an importable module, found as the server will find it (its sys.path)."""
        with extra_sys_path(self.sys_path):
            try:
                found = importlib.util.find_spec(module)
            except (ImportError, ValueError) as exc:
                raise UsageError(
                    f"cannot import {module} (for {self.label}): {exc}",
                    hint="check the module name, and that its folder is on sys.path (or the working directory)",
                ) from None
        if found is None:
            raise UsageError(
                f"no module named {module!r} (for {self.label})",
                hint="check the module name, and that its folder is on sys.path (or the working directory)",
            )
        return Path(found.origin) if found.origin and found.origin.endswith(".py") else None


@contextmanager
def extra_sys_path(folders: tuple[str, ...] | list[str]) -> Iterator[None]:
    """``folders`` added to ``sys.path`` for the block (the ones not already there, after the others)."""
    added = [f for f in folders if f not in sys.path]
    sys.path.extend(added)
    try:
        yield
    finally:
        for folder in added:
            if folder in sys.path:
                sys.path.remove(folder)


def hf_config_file(target: str | Path) -> Path:
    """The ``config.json`` that ``--hf PATH`` names: the file itself, or the one in the folder."""
    path = Path(target)
    found = path / "config.json" if path.is_dir() else path
    if not found.is_file():
        raise UsageError(
            f"--hf: no Hugging Face config at {path}"
            + (" (the folder has no config.json)" if path.is_dir() else ""),
            hint="pass a config.json, or a model folder holding one (weights are never loaded)",
        )
    return found


def _file_spec(
    script: str,
    args: Any,
    batch_env: str | None,
    variants: Sequence[str] = (),
    seq_len_env: str | None = None,
) -> ScriptSpec:
    """A script file: three functions, or run as it is (:func:`autobatch.step.as_is.is_as_is`, read from its
    source); a file that is not there is reported by :meth:`ScriptSpec.check`, one that is neither by the
    probe server's check (:func:`autobatch.step.contract.load_script`)."""
    from autobatch.step.as_is import check_env_name, is_as_is, parse_variants, variants_need_as_is

    check_env_name(batch_env, "--batch-env", "batch size", "BATCH_SIZE")
    check_env_name(seq_len_env, "--seq-len-env", "sequence length", "SEQ_LEN")
    named = parse_variants(variants)
    try:
        source = Path(script).read_text(errors="replace")
    except OSError:
        return ScriptSpec.file(script)
    if is_as_is(source, list(args), batch_env):
        options: dict[str, Any] = {"batch_env": batch_env}
        if named:
            options["variants"] = named
        if seq_len_env:
            options["seq_len_env"] = seq_len_env
        return ScriptSpec("as_is", script, options, label=script)
    if named:
        raise variants_need_as_is()
    return ScriptSpec.file(script)


def _check_target(flag: str, target: str) -> None:
    where, attribute = split_reference(target)
    if not attribute:
        raise UsageError(
            f"{flag} {target}: expected PATH:Class", hint=f"for example {flag} train.py:LitModel"
        )
    if is_file_reference(where) and not Path(where).is_file():
        raise UsageError(f"{flag}: no such file: {where}", hint="pass the .py file that defines the class")


# -- choosing the source from the settings ------------------------------------------------------------

#: Settings that name where the training step comes from, and the ones that only go with one of them.
SOURCES = ("script", "hf", "lightning")
DEPENDENT = {"hf_task": "hf", "datamodule": "lightning", "lightning_config": "lightning"}


def _rank(origin: str) -> int:
    """Layer of a setting's origin: 0 default, 1 a config file, 2 ``AUTOBATCH_*``, 3 a flag or argument
    (``--hf``, ``SCRIPT``, or the setting's own name when an API keyword argument gave it)."""
    if origin == "default" or origin.startswith("default,"):
        return 0
    if origin.startswith("AUTOBATCH_"):
        return 2
    if origin.startswith("-") or origin.isidentifier():
        return 3
    return 1


def select_spec(
    values: Mapping[str, Any], origin: Callable[[str], str], cwd: Path | None = None
) -> ScriptSpec:
    """The spec the settings name (``values``: the ``[script]`` settings by name; ``origin``: where each came from).

    The source given at the highest layer wins (a ``--hf`` flag over a ``script`` in autobatch.toml);
    two sources at the same layer, or an option of another source given there, are an error.
    """
    given = [(name, _rank(origin(name))) for name in SOURCES if values.get(name)]
    if not given:
        raise UsageError(
            "no training script given",
            hint="pass SCRIPT (or --hf PATH, or --lightning PATH:Class), or set `script` under [script] in "
            "autobatch.toml (autobatch init writes one)",
        )
    top = max(rank for _, rank in given)
    winners = [name for name, rank in given if rank == top]
    if len(winners) > 1:
        raise UsageError(
            f"{' and '.join(winners)} both name the training step (from {origin(winners[0])})",
            hint="give one of SCRIPT, --hf or --lightning",
        )
    source = winners[0]
    for name, owner in DEPENDENT.items():
        if values.get(name) is not None and owner != source and _rank(origin(name)) >= top:
            raise UsageError(
                f"{name} (from {origin(name)}) goes with {owner}, but the training step comes from {source}",
                hint=f"drop {name}, or give {owner}",
            )
    return _spec_for(source, values, cwd or Path.cwd())


def _spec_for(source: str, values: Mapping[str, Any], cwd: Path) -> ScriptSpec:
    if source == "script":
        script = str(values["script"])
        if is_reference(script) and not Path(script).exists():
            return ScriptSpec("reference", script, sys_path=(str(cwd),))
        return _file_spec(
            script,
            values.get("script_args") or (),
            values.get("batch_env"),
            values.get("variants") or (),
            values.get("seq_len_env"),
        )
    if source == "hf":
        options = {"task": values.get("hf_task"), "seq_len": values.get("seq_len")}
        task = f" ({options['task']})" if options["task"] else ""
        return ScriptSpec("hf", str(values["hf"]), options, label=f"hf:{values['hf']}{task}")
    options = {
        "datamodule": values.get("datamodule"),
        "config": values.get("lightning_config"),
        "batch_attr": values.get("batch_attr") or "batch_size",
    }
    return ScriptSpec(
        "lightning",
        str(values["lightning"]),
        options,
        sys_path=(str(cwd),),
        label=f"lightning:{values['lightning']}",
    )


if TYPE_CHECKING:
    from autobatch.settings import Settings


def spec_from_settings(settings: Settings) -> ScriptSpec:
    """Where the settings say the step comes from: ``script``, ``hf`` or ``lightning`` (see :func:`select_spec`)."""
    names = (
        "script",
        "script_args",
        "batch_env",
        "seq_len_env",
        "variants",
        "hf",
        "hf_task",
        "lightning",
        "datamodule",
    )
    values = {f: settings.get(f) for f in names}
    values["lightning_config"] = settings.script.lightning_config
    values["seq_len"] = max(settings.search.seq_lens, default=None)  # --hf: checked against its positions
    values["batch_attr"] = settings.output.lightning_batch_key.rpartition(".")[2]
    return select_spec(values, settings.origin)
