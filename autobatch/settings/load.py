"""Loading settings: defaults < config file < ``AUTOBATCH_*`` environment variables < flags; and the
world size from the launcher's environment."""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, NamedTuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python < 3.11 only
    import tomli as tomllib

from autobatch.core.references import is_file_reference, is_reference, split_reference
from autobatch.errors import ConfigError
from autobatch.settings.docs import BY_NAME, ENV_PREFIX, FIELDS, META
from autobatch.settings.groups import GROUPS, SECTIONS, Settings, relations
from autobatch.settings.levers import Door, given_by
from autobatch.settings.values import HINT, Bad, coerce, show

DEFAULT_FILE = "autobatch.toml"


class _Given(NamedTuple):
    raw: Any
    where: str  # prefix of a problem: "autobatch.toml: device.headroom", "AUTOBATCH_HEADROOM", "--headroom"
    origin: str  # "autobatch.toml", "AUTOBATCH_HEADROOM", "--headroom"
    text: bool  # came as text: parse strings
    base: Path  # folder that relative input paths resolve against


def load_settings(
    *,
    config: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    cwd: Path | None = None,
    use_default_file: bool = True,
    check_paths: bool = False,
    door: Door = "cli",
    labels: Mapping[str, str] | None = None,
) -> Settings:
    """Merge defaults < config file < ``AUTOBATCH_*`` variables < ``overrides`` (flat field names from
    ``door``'s flags or keywords; None means "not given") and check everything, raising one :class:`ConfigError`
    that lists every problem. ``check_paths`` also requires ``script`` and ``deepspeed_base`` to exist.
    ``labels``: where overrides the door's user did not give came from (the callback's Trainer)."""
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    problems: list[str] = []
    named = _Named(door, labels or {})
    given, source_files = _gather(
        config, os.environ if env is None else env, overrides, named, cwd, use_default_file, problems
    )
    values = _coerce_all(given, check_paths, problems)
    _relate(values, given, cwd, problems)
    if problems:
        raise ConfigError(problems, hint=HINT)
    groups = {
        section: cls(**{f.name: values[f.name] for f in fields(cls)}) for section, cls in GROUPS.items()
    }
    origins = {name: g.origin for name, g in given.items()}
    return Settings(**groups, source_files=tuple(source_files), origins=origins, door=door)


class _Named(NamedTuple):
    door: Door
    labels: Mapping[str, str]

    def origin(self, name: str, raw: Any) -> str:
        return self.labels.get(name) or given_by(self.door, name, raw)


def _gather(
    config: str | Path | None,
    env: Mapping[str, str],
    overrides: Mapping[str, Any] | None,
    named: _Named,
    cwd: Path,
    use_default_file: bool,
    problems: list[str],
) -> tuple[dict[str, _Given], list[str]]:
    """Every value given, by field name, the higher source replacing the lower; and the files read."""
    given: dict[str, _Given] = {}
    source_files: list[str] = []
    path = Path(config) if config is not None else (cwd / DEFAULT_FILE if use_default_file else None)
    if path is not None and (config is not None or path.is_file()):
        shown = str(config) if config is not None else DEFAULT_FILE
        path = path if path.is_absolute() else cwd / path
        source_files.append(str(path))
        _read_file(path, shown, given, problems)
    for info in FIELDS:
        value = env.get(info.env)
        if value is not None and value.strip():
            given[info.name] = _Given(value, info.env, info.env, True, cwd)
    for name, value in (overrides or {}).items():
        if name not in BY_NAME:
            raise ValueError(f"not a setting: {name!r}")
        if value is not None:
            origin = named.origin(name, value)
            given[name] = _Given(value, origin, origin, True, cwd)
    return given, source_files


def stray_variables(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(name, meant)`` for each set ``AUTOBATCH_*`` variable of ``env`` that no setting reads but that reads like
    one's variable: a typo or a shortened name (``AUTOBATCH_GLOBAL_BATCH`` for ``AUTOBATCH_GLOBAL_BATCH_SIZE``), or
    a flag's name (``AUTOBATCH_OUTPUT`` for ``AUTOBATCH_RESULT``, the variable of ``--output``). Every name no
    setting reads is ignored (the env file's plan, ``AUTOBATCH_MICRO_BATCH_SIZE``, reads like one too: the caller
    decides about the names autobatch writes), so a job script's mistyped setting would be ignored in silence."""
    variables = {info.env for info in FIELDS}
    words = sorted(
        name.removeprefix(ENV_PREFIX) for name in variables
    )  # the prefix alone would make any two close
    by_flag = {
        ENV_PREFIX + flag[2:].upper().replace("-", "_"): info.env
        for info in FIELDS
        for flag in (info.flag or "").replace(",", "/").replace(" ", "").split("/")
        if flag.startswith("--") and not flag.startswith("--no-") and len(flag) > 2
    }
    out = []
    for name, value in sorted(env.items()):
        if not name.startswith(ENV_PREFIX) or name in variables or not value.strip():
            continue
        near = difflib.get_close_matches(name.removeprefix(ENV_PREFIX), words, n=1, cutoff=0.8)
        meant = by_flag.get(name) or (ENV_PREFIX + near[0] if near else None)
        if meant is not None:
            out.append((name, meant))
    return out


def _coerce_all(given: dict[str, _Given], check_paths: bool, problems: list[str]) -> dict[str, Any]:
    """Each field's value: its default, or the given value parsed and checked (paths resolved)."""
    values: dict[str, Any] = {}
    for info in FIELDS:
        if info.name not in given:
            values[info.name] = info.default
            continue
        g = given[info.name]
        try:
            value = coerce(META[info.name], g.raw, g.text)
        except Bad as bad:
            problems.append(f"{g.where}: {bad}")
            continue
        if META[info.name]["kind"] in ("path", "target") and value is not None:
            value = _resolve(META[info.name], value, g.base)
            if check_paths and META[info.name]["kind"] == "path" and not META[info.name].get("folder"):
                exists = Path(value).exists() if info.name == "hf" else Path(value).is_file()
                if not exists and not is_reference(value):
                    problems.append(f"{g.where}: expected an existing file, found {show(g.raw)} (as {value})")
        values[info.name] = value
    return values


def _expand(value: str) -> Path:
    """``~`` and ``~user`` expanded; a user that does not exist leaves the path as given (it then fails
    the existence check with the usual message rather than with Python's RuntimeError)."""
    try:
        return Path(value).expanduser()
    except RuntimeError:
        return Path(value)


def _resolve(meta: Mapping[str, Any], value: str, base: Path) -> str:
    """An input path resolved against ``base``: a ``path``, or the file part of a ``PATH:Class`` target.

    A ``package.module:attribute`` reference (where the setting allows one) and a module target stay as given.
    """
    if meta["kind"] == "path":
        if meta.get("reference_ok") and is_reference(value):
            return value
        return os.path.normpath(base / _expand(value))
    where, attribute = split_reference(value)
    if not is_file_reference(where):
        return value
    return os.path.normpath(base / _expand(where)) + (f":{attribute}" if attribute else "")


def _relate(values: dict[str, Any], given: dict[str, _Given], cwd: Path, problems: list[str]) -> None:
    """Fields that must be >= another: a default follows the other field, a given value is checked."""
    for cls in GROUPS.values():
        for name, other in relations(cls):
            if not (name in values and other in values and values[name] < values[other]):
                continue
            if name not in given:
                # a default that depends on another field follows it (steps = 12 raises max_steps to 12)
                values[name] = values[other]
                given[name] = _Given(values[name], "", f"default, raised to {other}", False, cwd)
            else:
                origin = given[other].origin if other in given else "default"
                problems.append(
                    f"{given[name].where}: expected an integer >= {other} ({values[other]}, from {origin}), "
                    f"found {values[name]}"
                )


def _read_file(path: Path, shown: str, given: dict[str, _Given], problems: list[str]) -> None:
    """Read one TOML file into ``given``, collecting syntax errors and unknown sections and keys."""
    data = _parse_toml(path, shown, problems)
    for section, table in (data or {}).items():
        cls = GROUPS.get(section)
        if not isinstance(table, dict):
            owner = BY_NAME.get(section)
            where = f"write it under [{owner.group}]" if owner else "sections: " + SECTIONS
            problems.append(f"{shown}: {section}: settings go inside a section; {where}")
            continue
        if cls is None:
            near = difflib.get_close_matches(section, list(GROUPS), n=1, cutoff=0.5)
            hint = f"did you mean [{near[0]}]?" if near else "sections: " + SECTIONS
            problems.append(f"{shown}: [{section}]: unknown section; {hint}")
            continue
        names = [f.name for f in fields(cls)]
        for key, raw in table.items():
            if key in names:
                given[key] = _Given(raw, f"{shown}: {section}.{key}", shown, False, path.parent)
            else:
                problems.append(
                    f"{shown}: {section}.{key}: unknown key; {_unknown_key_hint(section, key, names)}"
                )


def _parse_toml(path: Path, shown: str, problems: list[str]) -> dict[str, Any] | None:
    """The file's tables, or None with the reason in ``problems`` (missing, unreadable, not TOML)."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(f"{shown}: no such config file")
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{shown}: cannot read the config file ({exc})")
    except tomllib.TOMLDecodeError as exc:
        line = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        at = f"line {line.group(1)}, column {line.group(2)}: " if line else ""
        problems.append(f"{shown}: {at}not valid TOML: {message}")
    return None


def _unknown_key_hint(section: str, key: str, names: list[str]) -> str:
    """What to write instead of an unknown key of ``[section]``: where it moved or belongs, or the nearest name."""
    owner = BY_NAME.get(key)
    if (section, key) in MOVED:
        return MOVED[(section, key)]
    if owner is not None:
        return f"{show(key)} belongs in [{owner.group}]"
    near = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    if near:
        return f"did you mean {show(near[0])}?"
    anywhere = difflib.get_close_matches(key, list(BY_NAME), n=1, cutoff=0.6)
    if anywhere:
        return f"did you mean {show(anywhere[0])} in [{BY_NAME[anywhere[0]].group}]?"
    return f"keys of [{section}]: {', '.join(names)}"


#: Keys that moved, and what to write instead.
MOVED = {
    ("script", "seq_len"): "the lengths to search are seq_lens under [search] (a list: seq_lens = [512]); "
    "seq_len under [plan] is the job's length the plan is for",
}


# --- world size ----------------------------------------------------------------------------------------


#: Where a world size came from when nothing gave one (:func:`resolve_world_size`).
DEFAULT_WORLD = "default"


def resolve_world_size(
    value: int | None, env: Mapping[str, str], origin: str = "the world_size setting"
) -> tuple[int, str]:
    """The number of data-parallel processes and where it came from, first found wins:

    1. ``value`` (the ``world_size`` setting: ``origin`` names where it was given, a flag, a keyword, a
       variable or a file);
    2. ``WORLD_SIZE`` (torchrun, accelerate and DeepSpeed launchers set it);
    3. SLURM: the number of tasks, ``SLURM_NTASKS``, else ``SLURM_JOB_NUM_NODES`` x
       ``SLURM_NTASKS_PER_NODE``; except when that is one task per node on nodes with several GPUs
       (``SLURM_GPUS_ON_NODE`` > 1: one launcher per node, such as torchrun, starting one process per
       GPU), where it is nodes x GPUs per node; with no task counts, nodes x ``SLURM_GPUS_ON_NODE``;
    4. 1, from :data:`DEFAULT_WORLD`.
    """
    if value is not None:
        if value < 1:
            raise ConfigError([f"world_size: expected an integer >= 1, found {value}"])
        return value, origin
    world = _env_int(env, "WORLD_SIZE")
    if world is not None:
        return world, f"WORLD_SIZE={world}"
    nodes = _env_int(env, "SLURM_JOB_NUM_NODES") or _env_int(env, "SLURM_NNODES")
    gpus = _env_int(env, "SLURM_GPUS_ON_NODE")
    tasks, tasks_from = _env_int(env, "SLURM_NTASKS"), "SLURM_NTASKS"
    per_node = _env_int(env, "SLURM_NTASKS_PER_NODE")
    if tasks is None and per_node is not None:
        tasks, tasks_from = (nodes or 1) * per_node, "SLURM_JOB_NUM_NODES x SLURM_NTASKS_PER_NODE"
    if tasks is not None and not (gpus and gpus > 1 and tasks == (nodes or 1)):
        return tasks, f"{tasks_from} ({tasks} tasks)"
    if gpus is not None:
        return (nodes or 1) * gpus, f"SLURM_JOB_NUM_NODES x SLURM_GPUS_ON_NODE ({nodes or 1} x {gpus})"
    return 1, DEFAULT_WORLD


def planned_world(settings: Settings, env: Mapping[str, str]) -> tuple[int, str]:
    """The world size a run plans for and where it came from: the ``world_size`` setting; else the world
    a distributed strategy implies (``nproc_per_node x nnodes``); else :func:`resolve_world_size`'s
    launcher and SLURM variables."""
    from autobatch.core.world import strategy_world

    if settings.plan.world_size is None:
        dist = settings.distributed
        implied = strategy_world(dist.strategy, dist.nproc_per_node, dist.nnodes, env)
        if implied is not None:
            return implied
    return resolve_world_size(settings.plan.world_size, env, settings.origin("world_size"))


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    """An integer environment variable; SLURM writes per-node counts like ``4(x2)``: take the 4."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    match = re.match(r"^(\d+)", raw)
    if not match or int(match.group(1)) < 1:
        raise ConfigError([f"{name}: expected an integer >= 1, found {show(raw)}"],
                          hint=f"fix or unset {name}, or pass --world-size")  # fmt: skip
    return int(match.group(1))
