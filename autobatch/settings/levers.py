"""How each door of autobatch names a lever in what it tells its user: the command's flag (``--device cpu``),
the Python API's and the Lightning callback's keyword argument (``device="cpu"``).

A message that tells what to change names the lever through :func:`lever` with the run's door
(``Settings.door``, one of :data:`~autobatch.settings.values.Door`), so a notebook is never told to pass a flag
it has no command line for. The table is the settings' own (each setting's flag in
:data:`~autobatch.settings.docs.FIELDS`, its keyword its name) and the few levers of one call that are not
settings (:data:`CALL_LEVERS`).
"""

from __future__ import annotations

from typing import Any

from autobatch.settings.values import Door

#: Levers of one call, not settings: the command's flag (the keyword is the name).
CALL_LEVERS: dict[str, str] = {"refresh": "--refresh"}

#: Settings whose documented flag is not one plain flag, by the flag a message names.
FLAGS: dict[str, str] = {"recompute": "--recompute-level", "script_args": "--", "script": "SCRIPT"}

_UNSET: Any = object()


def flag(name: str) -> str:
    """The command's flag of a lever (``--cache`` of ``--cache/--no-cache``)."""
    from autobatch.settings.docs import BY_NAME

    if name in CALL_LEVERS:
        return CALL_LEVERS[name]
    if name in FLAGS:
        return FLAGS[name]
    return (BY_NAME[name].flag or name).split("/")[0].split(",")[0]


def lever(door: Door, name: str, value: Any = _UNSET) -> str:
    """``name`` set to ``value`` as ``door``'s user writes it: ``--memory 2GiB`` or ``memory="2GiB"``,
    ``--refresh`` or ``refresh=True``, ``--no-cache`` or ``cache=False``; without a value, the lever alone
    (``--memory``, ``memory=``)."""
    if door == "cli":
        named = flag(name)
        if value is _UNSET or value is True:
            return named
        if value is False:
            return "--no-" + named.removeprefix("--")
        values = value if isinstance(value, (list, tuple)) else [value]
        return " ".join(f"{named} {item}" for item in values)
    return f"{name}=" if value is _UNSET else f"{name}={_python(value)}"


def given_by(door: Door, name: str, raw: Any) -> str:
    """Where a value the door's user gave came from, as messages name it (``--world-size``,
    ``world_size=3``)."""
    return flag(name) if door == "cli" else f"{name}={_python(raw)}"


def _python(value: Any) -> str:
    """A value as Python source, strings in double quotes (``"cpu"``, ``["bf16"]``)."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_python(item) for item in value) + "]"
    return repr(value)
