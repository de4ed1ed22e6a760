"""Worker: how long a workload's own build takes in a fresh process (model, AdamW, one batch).

The probe overhead the benchmark reports is a probe's wall time less the model's own build and steps;
the steps come from the probe's outcome, the build from here: the same calls a probe makes before its
first step (``build_model()``, ``model.to("cpu")``/``train()``, AdamW, ``make_batch(batch_size)``), timed
once cold (as in a fresh probe process) and then ``repeats`` more times warm. No cap is applied: it
measures time, not memory.

Request options: ``batch_size``, ``repeats`` (2).
"""

from __future__ import annotations

import time

import torch

from .common import Record, Request, Tries, load_workload, run_worker


def body(request: Request, record: Record, tries: Tries) -> None:
    batch_size = int(request.options["batch_size"])
    script = load_workload(request)
    torch.ones(512, 512) @ torch.ones(512, 512)  # the probe starts its thread pool before timing, too
    seconds: list[float] = []
    for _ in range(1 + int(request.options.get("repeats", 2))):
        started = time.perf_counter()
        model = script.build_model().to("cpu")
        model.train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
        tries.use(batch_size)
        batch = script.make_batch(batch_size)
        seconds.append(time.perf_counter() - started)
        del model, optimizer, batch
    record.found = batch_size
    record.extra.update(cold_seconds=seconds[0], warm_seconds=seconds[1:])


if __name__ == "__main__":
    run_worker("build_cost", body)
