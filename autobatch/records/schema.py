"""The published JSON Schema of the result (``autobatch/result.schema.json``) and the check of a loaded result.

A result read back is checked before anything is rendered from it: its ``schema_version``, every field's
type, the batch arithmetic of ``chosen``, and integers written as integers (``139.0`` is refused where the
schema says integer). Every problem is listed in one :class:`~autobatch.errors.UsageError` (exit 2), each
naming its field. The rules: docs/result-file.md.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from autobatch.core.space import ident_of
from autobatch.errors import UsageError

SCHEMA_FILE = Path(__file__).resolve().parent.parent / "result.schema.json"
#: The schema_version this autobatch writes, and the newest it reads.
SCHEMA_VERSION = 1
_JSON_TYPES: dict[str, str] = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
               "array": "a list", "object": "an object", "null": "null"}  # fmt: skip


@lru_cache(maxsize=1)
def result_schema() -> dict[str, Any]:
    """The JSON Schema of a result (draft 2020-12), as published in the package."""
    data: dict[str, Any] = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    return data


def result_problems(data: Any) -> list[str]:
    """Every problem of a result document, each naming its field; empty when it is valid."""
    if not isinstance(data, dict):
        return [f"expected a JSON object, found {_json_type(data)}"]
    version = data.get("schema_version")
    if "schema_version" not in data:
        return ["schema_version: missing: not an autobatch result"]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        return [f"schema_version: expected an integer >= 1, found {json.dumps(version)}"]
    if version > SCHEMA_VERSION:
        return [
            f"schema_version: {version} was written by a newer autobatch; this one reads "
            f"{SCHEMA_VERSION} (upgrade autobatch)"
        ]
    errors = sorted(_validator().iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
    problems = [f"{_where(error.absolute_path)}: {_message(error)}" for error in errors]
    chosen = data.get("chosen")
    if not problems and isinstance(chosen, dict):
        problems += _chosen_problems(chosen, data["combinations"])
    return problems


@lru_cache(maxsize=1)
def _validator() -> Any:
    """The schema's validator, with ``integer`` meaning a Python int (JSON ``139.0`` is a float)."""
    from jsonschema import Draft202012Validator, validators

    strict = Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)
    )
    return validators.extend(Draft202012Validator, type_checker=strict)(result_schema())


def _chosen_problems(chosen: dict[str, Any], combinations: list[dict[str, Any]]) -> list[str]:
    """The batch arithmetic of a schema-valid ``chosen``, and its micro-batch within its combination's maximum."""
    problems = []
    product = chosen["micro_batch_size"] * chosen["accumulation_steps"] * chosen["world_size"]
    if product != chosen["global_batch_size"]:
        problems.append(
            f"chosen.global_batch_size: expected micro_batch_size x accumulation_steps x world_size = "
            f"{product}, found {chosen['global_batch_size']}"
        )
    name = ident_of(chosen).name
    same = [c for c in combinations if ident_of(c) == ident_of(chosen)]
    if not same:  # a result made by hand may hold only its choice: no maximum to check it against
        return problems
    if same[0]["max_batch_size"] is None:
        problems.append(
            f"chosen: names the combination {name}, whose max_batch_size is null: it did not fit, so it cannot be chosen"
        )
    elif chosen["micro_batch_size"] > same[0]["max_batch_size"]:
        problems.append(
            f"chosen.micro_batch_size: {chosen['micro_batch_size']} is larger than the maximum "
            f"{same[0]['max_batch_size']} of {name} (its combination's max_batch_size)"
        )
    return problems


def check_result(data: Any, source: str | Path) -> None:
    """Raise a UsageError listing every problem of the result read from ``source``."""
    problems = result_problems(data)
    if problems:
        noun = "problem" if len(problems) == 1 else "problems"
        raise UsageError(
            f"{source} is not a valid autobatch result ({len(problems)} {noun}):\n  - "
            + "\n  - ".join(problems),
            hint=f"pass a result written by `autobatch tune`; its schema is {SCHEMA_FILE.name} in the autobatch package",
        )


def _where(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(the document)"


def _message(error: Any) -> str:
    found = (
        json.dumps(error.instance)
        if not isinstance(error.instance, (dict, list))
        else _json_type(error.instance)
    )
    if error.validator == "type":
        types = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        return f"expected {' or '.join(_JSON_TYPES.get(str(t), str(t)) for t in types)}, found {found}"
    if error.validator in ("enum", "const"):
        allowed = error.validator_value if error.validator == "enum" else [error.validator_value]
        return f"expected one of {', '.join(json.dumps(v) for v in allowed)}, found {found}"
    if error.validator in ("minimum", "exclusiveMaximum"):
        sign = ">=" if error.validator == "minimum" else "<"
        return f"expected a number {sign} {error.validator_value}, found {found}"
    if error.validator == "required":
        return error.message.replace("is a required property", "is missing")
    return str(error.message)


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
