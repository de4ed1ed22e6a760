"""A shell file of ``export NAME=value`` lines, read by ``source`` (bash, sh) and by python-dotenv.

Renders the plan as ``AUTOBATCH_*`` variables (micro-batch, accumulation, world, precision, ...), named
apart from the settings' own ``AUTOBATCH_<FIELD>`` variables so that sourcing the file never changes what
the next tune searches. Every variable is listed in docs/clusters.md ("The env file").
"""

from __future__ import annotations

import shlex

from autobatch.emit.args import command_text
from autobatch.emit.common import (
    EmitOptions,
    comment_block,
    provenance,
    require_chosen,
    script_own,
    token_budget,
)
from autobatch.records.result import TuneResult

#: Every name this format may write, in order.
ENV_NAMES: tuple[str, ...] = (
    "AUTOBATCH_MICRO_BATCH_SIZE",
    "AUTOBATCH_ACCUMULATION_STEPS",
    "AUTOBATCH_PLAN_WORLD_SIZE",
    "AUTOBATCH_PLAN_GLOBAL_BATCH_SIZE",
    "AUTOBATCH_REQUESTED_GLOBAL_BATCH_SIZE",
    "AUTOBATCH_PRECISION",
    "AUTOBATCH_OPTIMIZER",
    "AUTOBATCH_RECOMPUTE_ACTIVATIONS",
    "AUTOBATCH_RECOMPUTE_LEVEL",
    "AUTOBATCH_TORCH_COMPILE",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
    "AUTOBATCH_COMMAND",
    "AUTOBATCH_PLAN_SEQ_LEN",
    "AUTOBATCH_TOKEN_BUDGET",
    "MALLOC_ARENA_MAX",
    "MALLOC_MMAP_THRESHOLD_",
)


def variables(result: TuneResult) -> dict[str, str]:
    """The variables and their values, as the file writes them."""
    chosen = require_chosen(result)
    values = {
        "AUTOBATCH_MICRO_BATCH_SIZE": chosen.micro_batch_size,
        "AUTOBATCH_ACCUMULATION_STEPS": chosen.accumulation_steps,
        "AUTOBATCH_PLAN_WORLD_SIZE": chosen.world_size,
        "AUTOBATCH_PLAN_GLOBAL_BATCH_SIZE": chosen.global_batch_size,
        "AUTOBATCH_REQUESTED_GLOBAL_BATCH_SIZE": chosen.requested_global_batch_size,
        "AUTOBATCH_PRECISION": chosen.precision,
        "AUTOBATCH_OPTIMIZER": chosen.optimizer,
        "AUTOBATCH_RECOMPUTE_ACTIVATIONS": int(chosen.recompute),
        "AUTOBATCH_RECOMPUTE_LEVEL": chosen.ident.level,
        "AUTOBATCH_TORCH_COMPILE": int(chosen.compile),
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": chosen.accumulation_steps,
        "AUTOBATCH_COMMAND": command_text(result),
        "AUTOBATCH_PLAN_SEQ_LEN": chosen.seq_len,
        "AUTOBATCH_TOKEN_BUDGET": token_budget(result),
    }
    values.update(chosen.environment)  # what the answer holds under (the CPU device's pinned allocator)
    if script_own(chosen):
        own = ("AUTOBATCH_PRECISION", "AUTOBATCH_OPTIMIZER", "AUTOBATCH_RECOMPUTE_ACTIVATIONS")
        for name in (*own, "AUTOBATCH_RECOMPUTE_LEVEL", "AUTOBATCH_TORCH_COMPILE"):
            del values[name]
    return {name: str(value) for name, value in values.items() if value is not None}


def caveats(result: TuneResult, options: EmitOptions) -> list[str]:
    return []


def render_env(result: TuneResult, options: EmitOptions) -> str:
    """``export`` lines headed by the provenance and the batch arithmetic as ``#`` comments."""
    header = provenance(result, options, "Shell environment")
    header.append("use: source <this file>  (bash), or load_dotenv(<this file>) with python-dotenv")
    lines = [f"export {name}={shlex.quote(value)}" for name, value in variables(result).items()]
    return comment_block(header) + "\n".join(lines) + "\n"
