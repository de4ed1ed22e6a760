"""The init arguments of a LightningModule and a LightningDataModule, from the YAML file LightningCLI takes.

``model:`` and ``data:`` sections, each either the arguments themselves or ``class_path`` with
``init_args``; a value that is itself a ``{"class_path": ..., "init_args": ...}`` mapping is built first
(as jsonargparse does for nested objects). Other sections (``trainer:``, ...) are not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autobatch.errors import UsageError
from autobatch.step.importing import import_reference


def init_arguments(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``model`` and ``data`` init arguments of a LightningCLI config file."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(
            f"cannot read --lightning-config {path}: {exc}", hint="pass a LightningCLI YAML file"
        ) from None
    if not isinstance(data, Mapping):
        raise UsageError(
            f"--lightning-config {path} is not a YAML mapping", hint="write model: and data: sections"
        )
    return _section(data.get("model")), _section(data.get("data"))


def _section(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping) and "class_path" in value:
        value = value.get("init_args") or {}
    if not isinstance(value, Mapping):
        raise UsageError(f"expected init arguments as a mapping, found {value!r}", hint="model: {width: 64}")
    return dict(value)


def instantiate(cls: Any, kwargs: Mapping[str, Any]) -> Any:
    """``cls(**kwargs)``, with nested ``{"class_path": ..., "init_args": ...}`` values built first."""
    return cls(**{name: _build(value) for name, value in kwargs.items()})


def _build(value: Any) -> Any:
    if isinstance(value, Mapping) and "class_path" in value:
        module, _, name = str(value["class_path"]).rpartition(".")
        return instantiate(import_reference(f"{module}:{name}", "class_path"), value.get("init_args") or {})
    if isinstance(value, list):
        return [_build(v) for v in value]
    return value
