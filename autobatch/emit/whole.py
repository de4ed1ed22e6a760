"""The whole result as JSON (the result file's own schema) or TOML.

JSON is exactly ``TuneResult.to_json()``: ``TuneResult.load`` reads it back, and it carries no
comment (JSON has none). TOML has no null, so keys whose value is null are left out, at every
depth; ``TuneResult.from_dict`` restores each as its default, which is null for every such field of
the result itself (free-form ``device`` entries that were null are simply absent). The TOML file
starts with the provenance comment. Both formats also render a result with nothing chosen.
"""

from __future__ import annotations

from typing import Any

import tomli_w

from autobatch.emit.common import EmitOptions, comment_block, provenance
from autobatch.records.result import TuneResult


def render_json(result: TuneResult, options: EmitOptions) -> str:
    """The result as JSON, as ``tune --json`` prints it."""
    return result.to_json() + "\n"


def render_toml(result: TuneResult, options: EmitOptions) -> str:
    """The result as TOML, nulls left out, headed by a provenance comment."""
    header = provenance(result, options, "autobatch result")
    header.append("TOML has no null: keys whose value is null are left out")
    return comment_block(header) + tomli_w.dumps(drop_none(result.to_dict()))


def drop_none(value: Any) -> Any:
    """``value`` with every null dict entry removed, recursively (null list items become absent too)."""
    if isinstance(value, dict):
        return {str(k): drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [drop_none(v) for v in value if v is not None]
    return value


def caveats(result: TuneResult, options: EmitOptions) -> list[str]:
    return []
