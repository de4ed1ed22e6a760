"""Worker: accelerate's ``find_executable_batch_size`` on a workload, under autobatch's CPU cap.

The decorated function does what accelerate's own examples do: build everything that depends on the
batch size inside (the model, AdamW with ``torch.optim`` defaults, one ``make_batch(batch_size)``
batch) and run ``steps`` full training steps (at least 3, so that AdamW's state is resident). On an
error accelerate recognises as out-of-memory it clears caches, shrinks the batch by 0.9 and calls the
function again (a restart); anything else escapes and is recorded as a crash.

Request options: ``starting_batch_size`` (4096), ``steps`` (3).
"""

from __future__ import annotations

from typing import Any

import accelerate.utils  # imported before the cap: imports count, as in autobatch's probes

from .common import Record, Request, Tries, adamw_steps, run_worker, setup


def body(request: Request, record: Record, tries: Tries) -> None:
    start = int(request.options.get("starting_batch_size", 4096))
    steps = int(request.options.get("steps", 3))
    record.extra.update(starting_batch_size=start, steps=steps)
    script = setup(request, record)

    @accelerate.utils.find_executable_batch_size(starting_batch_size=start)
    def train(batch_size: int) -> int:
        adamw_steps(script, batch_size, steps, tries)
        return batch_size

    found: Any = train()
    record.found = int(found)


if __name__ == "__main__":
    run_worker("accelerate", body)
