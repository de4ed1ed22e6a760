"""How each door of autobatch names a lever in what it tells its user: the command's flag (``--device cpu``),
the Python API's and the Lightning callback's keyword argument (``device="cpu"``).

A message that tells what to change names the lever through :func:`lever` with the run's door
(``Settings.door``, one of :data:`~autobatch.settings.values.Door`), so a notebook is never told to pass a flag
it has no command line for. The table is the settings' own (each setting's flag in
:data:`~autobatch.settings.docs.FIELDS`, its keyword its name) and the few levers of one call that are not
settings (:data:`CALL_LEVERS`).

A text written where the door is not known (in a probe process, whose records cross a process boundary as
data, or in the parent's probe client and its translation of outcomes into errors) names a lever in a neutral
form, the setting's name in double braces (:func:`neutral`: ``{{max_batch_size}}``, ``{{max_batch_size=64}}``),
and the service renders it in its run's door's words where the text leaves for its user (:func:`in_words`: the
error raised, the result returned or written, the warnings): the probe is never told who asked, so a probe
process, the probe server and a cached outcome serve every door alike, and a text reads one way per door
wherever it was written. Passing the door down instead would thread it through the session, the client and
every probe request, for texts that only its user reads. ``{{verbose}}`` is where the long text of an error
is (:data:`DETAIL`). The command's error printer renders an error that reached it another way (``estimate``,
``run``), so a mark never shows. Texts of ``explain`` and ``estimate`` alone name flags: they have no other door.
"""

from __future__ import annotations

import json
import re
from typing import Any

from autobatch.settings.values import Door

#: Levers of one call, not settings: the command's flag (the keyword is the name).
CALL_LEVERS: dict[str, str] = {
    "refresh": "--refresh",
    "precision": "--precision",  # check's one precision, optimizer and batch size
    "optimizer": "--optimizer",
    "batch_size": "--batch-size",
}

#: Settings whose documented flag is not one plain flag, by the flag a message names.
FLAGS: dict[str, str] = {"recompute": "--recompute-level", "script_args": "--", "script": "SCRIPT"}

_UNSET: Any = object()

#: Where a door's user finds the long text of an error (a traceback, a probe's log): ``{{verbose}}`` in a text.
DETAIL: dict[Door, str] = {
    "cli": "rerun with --verbose",
    "api": "read the error's .detail",
    "callback": "read the error's .detail",
}

#: A lever in the neutral form: ``{{name}}`` or ``{{name=JSON}}``.
MARK = re.compile(r"\{\{([a-z_]+)(?:=(.*?))?\}\}")


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


def neutral(name: str, value: Any = _UNSET) -> str:
    """``name`` (set to ``value``) in a text whose door is not known here, for :func:`in_words` to render."""
    return "{{" + name + ("" if value is _UNSET else "=" + json.dumps(value)) + "}}"


def in_words(text: str, door: Door) -> str:
    """``text`` with each lever in the neutral form named as ``door``'s user writes it."""
    if "{{" not in text:
        return text

    def word(match: re.Match[str]) -> str:
        name, value = match[1], match[2]
        if name == "verbose":
            return DETAIL[door]
        return lever(door, name) if value is None else lever(door, name, json.loads(value))

    worded = MARK.sub(word, text)
    # a str's subclass keeps its kind (a Circumstance note stays one: a served result says it as the measuring run's)
    return type(text)(worded) if type(text) is not str else worded


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
