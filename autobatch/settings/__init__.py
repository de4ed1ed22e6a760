"""Settings, defined once: one frozen dataclass per group, validated on construction.

Modules: ``values`` (parse and check one value), ``groups`` (the dataclasses), ``docs`` (:data:`FIELDS`,
``--help`` texts, the starter file, the docs' key table), ``load`` (the layers, and the world size). Each
field is named once (TOML key, ``AUTOBATCH_<NAME>`` variable, flag), and every problem is collected into one
:class:`ConfigError`. The layers, the environment's value syntax and path resolution: docs/configuration.md.
"""

from __future__ import annotations

from autobatch.settings.docs import (
    ENV_PREFIX,
    FIELDS,
    FieldInfo,
    help_for,
    render_markdown_table,
    render_starter_toml,
)
from autobatch.settings.groups import (
    EMIT_FORMATS,
    GROUPS,
    DaemonSettings,
    DeviceSettings,
    DistributedSettings,
    OutputSettings,
    PlanSettings,
    ProbeSettings,
    ScriptSettings,
    SearchSettings,
    Settings,
)
from autobatch.settings.load import (
    DEFAULT_FILE,
    DEFAULT_WORLD,
    load_settings,
    planned_world,
    resolve_world_size,
)

__all__ = [
    "DEFAULT_FILE",
    "EMIT_FORMATS",
    "ENV_PREFIX",
    "FIELDS",
    "GROUPS",
    "DaemonSettings",
    "DeviceSettings",
    "FieldInfo",
    "OutputSettings",
    "PlanSettings",
    "DistributedSettings",
    "ProbeSettings",
    "ScriptSettings",
    "SearchSettings",
    "Settings",
    "help_for",
    "load_settings",
    "planned_world",
    "DEFAULT_WORLD",
    "render_markdown_table",
    "render_starter_toml",
    "resolve_world_size",
]
