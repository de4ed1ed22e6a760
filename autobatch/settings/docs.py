"""The generated documentation of every setting: :data:`FIELDS`, ``--help`` texts, the starter
file of ``autobatch init`` and the key table of docs/configuration.md, all from the dataclasses' field metadata."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from autobatch.settings.groups import GROUPS
from autobatch.settings.values import plain, show

ENV_PREFIX = "AUTOBATCH_"


@dataclass(frozen=True)
class FieldInfo:
    """One setting as documented: section, name, type, default, help, environment variable and flag."""

    group: str
    name: str
    type: str
    default: Any
    help: str
    env: str
    flag: str | None
    example: Any = None

    @property
    def key(self) -> str:
        return f"{self.group}.{self.name}"


def _field_infos() -> tuple[FieldInfo, ...]:
    out = []
    for section, cls in GROUPS.items():
        for f in fields(cls):
            meta = f.metadata
            default = meta["factory"]() if meta.get("factory") else f.default
            flag = meta["flag"] if meta["flag"] != "" else "--" + f.name.replace("_", "-")
            out.append(
                FieldInfo(section, f.name, meta["type"], default, meta["help"], ENV_PREFIX + f.name.upper(),
                          flag, meta.get("example"))
            )  # fmt: skip
    return tuple(out)


FIELDS: tuple[FieldInfo, ...] = _field_infos()
BY_NAME: dict[str, FieldInfo] = {info.name: info for info in FIELDS}
META: dict[str, Mapping[str, Any]] = {f.name: f.metadata for cls in GROUPS.values() for f in fields(cls)}
assert len(BY_NAME) == len(FIELDS), "setting names must be unique across groups"


def default_text(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, Mapping) and not value:
        return "{}"
    return show(plain(value))


def help_for(name: str) -> str:
    """Help text for the flag of setting ``name``, with its default, variable and config key."""
    info = BY_NAME[name]
    # No brackets: Typer renders help as rich markup, where "[false, true]" would read as a style tag.
    value = plain(info.default)
    if isinstance(value, list):
        default = ", ".join(show(v).strip('"') for v in value) or "none"
    else:
        default = "none" if value == {} else default_text(info.default)
    return f"{info.help} Default: {default}. Env {info.env}; config {info.group}.{info.name}."


def render_starter_toml() -> str:
    """A commented ``autobatch.toml`` with every key; as written it loads back to the defaults."""
    lines = [
        "# autobatch.toml: settings for `autobatch tune` (written by `autobatch init`).",
        "# Precedence: command-line flags > AUTOBATCH_<KEY> environment variables > this file > defaults.",
        "# Every key is shown with its default; delete a key to follow autobatch's default.",
        "# Check this file with `autobatch validate`.",
    ]
    for section in GROUPS:
        lines += ["", f"[{section}]"]
        for info in (i for i in FIELDS if i.group == section):
            flag = f", flag {info.flag}" if info.flag else ""
            lines += [""] + textwrap.wrap(f"{info.help} ({info.type}; env {info.env}{flag})", 98,
                                          initial_indent="# ", subsequent_indent="# ")  # fmt: skip
            if info.name == "optimizer_kwargs":
                lines += [f"# [search.optimizer_kwargs.{name}]\n# " + "\n# ".join(
                    f"{k} = {show(v)}" for k, v in kwargs.items()) for name, kwargs in info.example.items()
                ]  # fmt: skip
            elif info.default is None or (info.default == () and info.example is not None):
                lines.append(f"# {info.name} = {show(info.example)}")
                if info.default == ():
                    lines.append(f"{info.name} = []")
            else:
                lines.append(f"{info.name} = {show(plain(info.default))}")
    return "\n".join(lines) + "\n"


def render_markdown_table() -> str:
    """The table of config keys in docs/configuration.md, generated from :data:`FIELDS`."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = [
        "| Key | Type | Default | Environment | Flag | Meaning |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for info in FIELDS:
        flag = f"`{info.flag}`" if info.flag else "-"
        default = "unset" if info.default is None else f"`{cell(default_text(info.default))}`"
        rows.append(
            f"| `[{info.group}]` `{info.name}` | {cell(info.type)} | {default} "
            f"| `{info.env}` | {cell(flag)} | {cell(info.help)} |"
        )
    return "\n".join(rows) + "\n"
