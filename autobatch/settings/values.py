"""Parsing and checking one setting's value, whatever layer it came from.

A field's metadata (see :func:`setting`) says its kind, how its type reads in messages and docs,
and its constraints; :func:`coerce` turns a TOML value, an environment string or a flag value into
the field's type or raises :class:`Bad` with "expected X, found Y; did you mean Z?".
"""

from __future__ import annotations

import difflib
import json
import math
import shlex
from collections.abc import Callable, Mapping
from dataclasses import field
from types import MappingProxyType
from typing import Any, Literal

from autobatch.core.levels import FULL, OFF, PARTIAL, parse_level
from autobatch.core.space import OPTIMIZERS
from autobatch.core.units import parse_size

#: Hint of every ConfigError about settings.
#: Who asked for a run, which decides how its messages name a lever (:mod:`autobatch.settings.levers`): the
#: command (and the daemon's client, which is the command), the Python API, the Lightning callback.
Door = Literal["cli", "api", "callback"]

HINT = (
    "fix each one; `autobatch init` writes a starter file that lists every key, its default and its meaning"
)


class Bad(Exception):
    """A value that cannot be used; the message reads 'expected X, found Y[; did you mean Z?]'."""


def expected(what: str, found: Any, choices: tuple[str, ...] = ()) -> Bad:
    near = difflib.get_close_matches(str(found), choices, n=1, cutoff=0.5) if isinstance(found, str) else []
    return Bad(f"expected {what}, found {show(found)}" + (f"; did you mean {show(near[0])}?" if near else ""))


def unknown_names(what: str, names: list[str], choices: tuple[str, ...]) -> Bad:
    """Every unknown name of a list in one message, each with its close valid name where one exists."""

    def one(name: str) -> str:
        near = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
        return show(name) + (f" (did you mean {show(near[0])}?)" if near else "")

    return Bad(f"expected {what} from {', '.join(choices)}, found " + ", ".join(one(name) for name in names))


def show(value: Any) -> str:
    """A value as it would be written in TOML (strings quoted, lists bracketed)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} = {show(v)}" for k, v in value.items()) + "}"
    return repr(value)


def setting(
    default: Any, kind: str, type_text: str, help: str, *, flag: str | None = "", **extra: Any
) -> Any:
    """A dataclass field carrying what parses, checks and documents it (``extra``: choices, minimum,
    at_least (another field of the group), check, example, factory)."""
    meta = {"kind": kind, "type": type_text, "help": help, "flag": flag, **extra}
    factory = extra.get("factory")
    return field(default_factory=factory, metadata=meta) if factory else field(default=default, metadata=meta)


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _parse_bool(raw: Any, text: bool, what: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if text and isinstance(raw, str) and raw.strip().lower() in _TRUE + _FALSE:
        return raw.strip().lower() in _TRUE
    raise expected(what, raw)


def _parse_number(raw: Any, text: bool, integer: bool, what: str) -> float | int:
    if isinstance(raw, str) and text:
        try:
            raw = int(raw.strip()) if integer else float(raw.strip())
        except ValueError:
            raise expected(what, raw) from None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise expected(what, raw)
    if integer:
        if isinstance(raw, float) and not raw.is_integer():
            raise expected(what, raw)
        return int(raw)
    if not math.isfinite(raw):
        raise expected(what, raw)
    return float(raw)


def _parse_list(raw: Any, split: bool, what: str) -> list[Any]:
    if isinstance(raw, str):
        return [part.strip() for part in raw.split(",") if part.strip()] if split else [raw]
    if isinstance(raw, (list, tuple)):
        return list(raw)
    raise expected(what, raw)


def coerce(meta: Mapping[str, Any], raw: Any, text: bool) -> Any:
    """Turn a raw value (TOML value, environment string, flag value) into the field's type and check it.

    ``text`` says the value came as text (environment, flags), so strings are parsed.
    """
    kind, what = meta["kind"], meta["type"]
    if raw is None:
        if meta.get("optional"):
            return None
        raise expected(what, raw)
    value = _PARSERS[kind](meta, raw, text)
    choices = meta.get("choices", ())
    if kind == "str" and choices and value not in choices:
        raise expected(f"one of {', '.join(choices)}", value, choices)
    if "minimum" in meta and kind != "ints" and value < meta["minimum"]:  # ints: each item (_ints)
        raise expected(what, value)
    check: Callable[[Any], bool] | None = meta.get("check")
    if check is not None and not check(value):
        raise expected(what, value, choices)
    return value


def _text(meta: Mapping[str, Any], raw: Any, text: bool) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise expected(meta["type"], raw)
    return raw.strip()


#: A size given without a unit below this is a unit left out, not a budget: ``memory = 420`` meant 420MiB (as
#: bytes it failed the tune two seconds later, "budget 378 B", where ``validate`` had said ok).
UNITLESS_FLOOR = 1 << 20


def _size(meta: Mapping[str, Any], raw: Any, text: bool) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise expected(meta["type"], raw)
    try:
        size = parse_size(raw if isinstance(raw, (int, str)) else str(raw))
    except ValueError as exc:
        if "more than 0" in str(exc) or str(raw).strip().startswith("-"):
            raise Bad(f"expected a size above 0 bytes (such as 2GiB), found {raw!r}") from None
        raise expected(meta["type"], raw) from None
    if size < UNITLESS_FLOOR and str(raw).strip().replace(".", "", 1).isdigit():
        number = str(raw).strip()
        raise Bad(
            f"{number} without a unit is {number} bytes, less than any model needs: give a unit, such as "
            f"{number}MiB or {number}GiB"
        )
    return size


def _args(meta: Mapping[str, Any], raw: Any, text: bool) -> tuple[str, ...]:
    if isinstance(raw, str):
        try:
            return tuple(shlex.split(raw))
        except ValueError:
            raise expected(meta["type"], raw) from None
    if isinstance(raw, (list, tuple)) and all(isinstance(a, str) for a in raw):
        return tuple(raw)
    raise expected(meta["type"], raw)


def _strs(meta: Mapping[str, Any], raw: Any, text: bool) -> tuple[str, ...]:
    what = meta["type"]
    items = []
    aliases: Callable[[Any], str] | None = meta.get("aliases")
    for item in raw if isinstance(raw, (list, tuple)) else [raw]:
        if aliases is not None and isinstance(item, int) and not isinstance(item, bool):
            item = str(item)  # Lightning's precision=16
        items += _parse_list(item, True, what)
    if aliases is not None:
        items = [aliases(item) if isinstance(item, str) else item for item in items]
    if not all(isinstance(item, str) for item in items):
        raise expected(what, raw)
    value = tuple(dict.fromkeys(items))  # drop repeats, keep the user's order (it breaks ties)
    if meta.get("nonempty") and not value:
        raise expected(what + " (at least one)", raw)
    choices = meta.get("choices", ())
    names = [item.split("=", 1)[0].strip() if meta.get("pairs") else item for item in value]
    if choices and any(name not in choices for name in names):
        raise unknown_names(meta["item"], [name for name in names if name not in choices], choices)
    for item in value:
        if meta.get("pairs") and "=" in item and not item.split("=", 1)[1].strip():
            raise expected("FORMAT or FORMAT=PATH with a non-empty PATH", item)
    return value


def _ints(meta: Mapping[str, Any], raw: Any, text: bool) -> tuple[int, ...]:
    what = meta["type"]
    items = _parse_list(raw, True, what) if isinstance(raw, (str, list, tuple)) else [raw]
    values = tuple(dict.fromkeys(int(_parse_number(item, True, True, what)) for item in items))
    if any(v < meta.get("minimum", 1) for v in values):
        raise expected(what, raw)
    return values


def _levels(meta: Mapping[str, Any], raw: Any, text: bool) -> tuple[str, ...]:
    """Recomputation levels (:mod:`autobatch.core.levels`): booleans as before (``both``: off and full), level
    words, ``K/N``; in the order given, ``partial`` last (it is chosen from ``off`` and ``full``)."""
    what = meta["type"]
    if isinstance(raw, str) and raw.strip().lower() == "both":
        return (OFF, FULL)
    items = [raw] if isinstance(raw, bool) else _parse_list(raw, True, what)
    try:
        levels = list(dict.fromkeys(parse_level(item) for item in items))
    except ValueError:
        raise expected(what, raw) from None
    if not levels:
        raise expected(what, raw)
    return tuple(sorted(levels, key=lambda level: level == PARTIAL))


def _bools(meta: Mapping[str, Any], raw: Any, text: bool) -> tuple[bool, ...]:
    what = meta["type"]
    if isinstance(raw, str) and raw.strip().lower() == "both":
        return (False, True)
    items = _parse_list(raw, text, what) if not isinstance(raw, bool) else [raw]
    if not items:
        raise expected(what, raw)
    return tuple(dict.fromkeys(_parse_bool(item, text, what) for item in items))


def _kwargs(meta: Mapping[str, Any], raw: Any, text: bool) -> Mapping[str, Mapping[str, Any]]:
    what = meta["type"]
    if isinstance(raw, str) and text:
        try:
            raw = json.loads(raw)
        except ValueError:
            raise expected(what + " (as JSON)", raw) from None
    if not isinstance(raw, Mapping) or not all(isinstance(t, Mapping) for t in raw.values()):
        raise expected(what, raw)
    if any(name not in OPTIMIZERS for name in raw):
        raise unknown_names("optimizer names", [name for name in raw if name not in OPTIMIZERS], OPTIMIZERS)
    return MappingProxyType({name: MappingProxyType(dict(kw)) for name, kw in raw.items()})


#: How each kind of setting is parsed from a raw value.
_PARSERS: dict[str, Callable[[Mapping[str, Any], Any, bool], Any]] = {
    "str": _text,
    "path": _text,
    "target": _text,
    "int": lambda meta, raw, text: _parse_number(raw, text, True, meta["type"]),
    "float": lambda meta, raw, text: _parse_number(raw, text, False, meta["type"]),
    "bool": lambda meta, raw, text: _parse_bool(raw, text, meta["type"]),
    "size": _size,
    "args": _args,
    "strs": _strs,
    "bools": _bools,
    "levels": _levels,
    "ints": _ints,
    "kwargs": _kwargs,
}


def plain(value: Any) -> Any:
    """A setting's value as plain lists and dicts (for TOML, JSON and the docs)."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    return value
