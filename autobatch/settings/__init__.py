"""Settings, defined once: one frozen dataclass per group, validated on construction.

Modules: ``values`` (parse and check one value), ``groups`` (the dataclasses), ``docs`` (FIELDS, help,
starter file, the docs' key table), ``load`` (the layers, and the world size).

Layers, lowest to highest: defaults < config file (``--config FILE``, else ``./autobatch.toml`` when it
exists) < ``AUTOBATCH_<FIELD>`` environment variables < command-line flags. A value from a higher layer
replaces the lower one whole (lists are not merged), and only the value that wins is checked.

Each field is named once: TOML key ``name`` in section ``[group]``, environment variable
``AUTOBATCH_`` + ``NAME``, and the flag recorded in its metadata. :data:`FIELDS` is generated from
the dataclasses and feeds ``--help`` texts (:func:`help_for`), ``autobatch init``
(:func:`render_starter_toml`) and the key table of docs/configuration.md (:func:`render_markdown_table`).

Environment values are strings, parsed by the field's type: integers, floats, booleans
(1/true/yes/on, 0/false/no/off), lists (comma-separated), sizes ("2GiB"), ``script_args`` (one
shell-quoted string), ``optimizer_kwargs`` (JSON). An empty variable counts as unset. Other
``AUTOBATCH_*`` names are not settings and are ignored: the env emitter writes, for instance,
``AUTOBATCH_MICRO_BATCH_SIZE`` for the training job to read.

Input paths (``script``, ``deepspeed_base``) given in a config file resolve against the file's
folder; from the environment or flags, against the working directory. Output paths (``result``,
``emit``) stay relative to the working directory of the run.

Every problem (unknown section or key, with a close valid name where one exists; wrong type;
impossible value) is collected, each naming its source, and reported in one :class:`ConfigError`.
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
    DeviceSettings,
    DistributedSettings,
    OutputSettings,
    PlanSettings,
    ProbeSettings,
    ScriptSettings,
    SearchSettings,
    Settings,
)
from autobatch.settings.load import DEFAULT_FILE, load_settings, planned_world, resolve_world_size

__all__ = [
    "DEFAULT_FILE",
    "EMIT_FORMATS",
    "ENV_PREFIX",
    "FIELDS",
    "GROUPS",
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
    "render_markdown_table",
    "render_starter_toml",
    "resolve_world_size",
]
