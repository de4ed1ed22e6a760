"""What the runtime guard costs: its overhead per step against the bare loop, the time to recover from an
out-of-memory failure, and the steps until it grows back.

* **Overhead.** The same model, optimizer and batches, trained by a bare loop (``zero_grad``, forward,
  ``backward``, ``step``; with two micro-batches the loop accumulates them itself, each loss weighted by its
  share) and by ``Guard.step`` at the same micro-batch, in the same process, in interleaved rounds (the
  order alternates each round). Per round the ratio of the guarded time to the bare time; the table gives
  the median of the rounds' ratios and their spread. On a small MLP (a step of about a millisecond, where the
  guard's fixed cost shows most) and a medium transformer classifier.
* **Recovery.** At one batch the loss asks the allocator for a petabyte at the end of the first micro-batch's
  forward: a real out-of-memory failure (``DefaultCPUAllocator``). The guard drops the gradients, releases the
  heap, lowers the micro-batch one rung and runs the batch again. Its time, from the start of the failing
  batch to the end of its re-run, is set against the median clean batch at the lowered size.
* **Growing back.** The steps from the failing batch to the first batch at the original size again, with the
  default ``grow_after``.

    python scripts/guard_bench.py [--rounds 15] [--output docs/measurements/guard.md]

One torch thread (the machine is shared; one thread keeps the two loops' times comparable).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import measurements  # noqa: E402  (scripts/ is on sys.path when a script runs)
import torch
from torch import nn

import autobatch
from autobatch.core.ladder import LadderSettings

PAGE = measurements.PAGES / "guard.md"
TITLE = "The runtime guard's cost"
INTRO = (
    "What `autobatch.Guard` costs a training loop (docs: [The guard](../guard.md)): its overhead per step "
    "against the bare loop with no out-of-memory failure (goal: at most 2 %), the time to recover from one, "
    "and the steps until it grows back. Written by `scripts/guard_bench.py`."
)


@dataclass(frozen=True)
class Workload:
    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    batch_size: int
    steps: int  # steps per timed run


class Mlp(nn.Module):
    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(x))


class Classifier(nn.Module):
    def __init__(self, width: int = 256, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, width)
        layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, 10)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids)).mean(1))


def _features(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 64), torch.randint(0, 10, (n,))


def _tokens(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randint(0, 1000, (n, 64)), torch.randint(0, 10, (n,))


WORKLOADS = {
    "small": Workload("small: MLP 64-256-256-10, batch 32", Mlp, _features, 32, 20),
    "medium": Workload(
        "medium: transformer classifier, 4 layers of 256, 64 tokens, batch 16", Classifier, _tokens, 16, 1
    ),
}


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def bare_steps(model: nn.Module, optimizer: Any, batches: list[Any], micro: int) -> float:
    started = time.perf_counter()
    for x, y in batches:
        for start in range(0, len(x), micro):
            part = (x[start : start + micro], y[start : start + micro])
            (loss_fn(model, part) * (len(part[0]) / len(x))).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def guarded_steps(model: nn.Module, optimizer: Any, batches: list[Any], guard: autobatch.Guard) -> float:
    started = time.perf_counter()
    for batch in batches:
        guard.step(model, optimizer, batch, loss_fn)
    return time.perf_counter() - started


def release_seconds(times: int = 5) -> float:
    """The median time of the CPU heap release the guard runs after a failure (a collection and a trim)."""
    from autobatch.devices.cpu import release_heap

    spent = []
    for _ in range(times):
        started = time.perf_counter()
        release_heap()
        spent.append(time.perf_counter() - started)
    return statistics.median(spent)


def overhead(work: Workload, micro: int, rounds: int) -> list[float]:
    """Per round, the guarded loop's time over the bare loop's (same model state, same batches)."""
    torch.manual_seed(0)
    bare_model, guarded_model = work.build(), work.build()
    guarded_model.load_state_dict(bare_model.state_dict())
    bare_opt = torch.optim.AdamW(bare_model.parameters())
    guarded_opt = torch.optim.AdamW(guarded_model.parameters())
    batches = [work.batch(work.batch_size) for _ in range(work.steps)]
    guard = autobatch.Guard(micro)
    bare_steps(bare_model, bare_opt, batches[:2], micro)  # warm-up: the optimizer's state, the allocator
    guarded_steps(guarded_model, guarded_opt, batches[:2], guard)
    ratios = []
    for number in range(rounds):
        if number % 2:
            g = guarded_steps(guarded_model, guarded_opt, batches, guard)
            b = bare_steps(bare_model, bare_opt, batches, micro)
        else:
            b = bare_steps(bare_model, bare_opt, batches, micro)
            g = guarded_steps(guarded_model, guarded_opt, batches, guard)
        ratios.append(g / b)
    return ratios


@dataclass
class Recovery:
    failing: float  # the failing batch, from its start to the end of its re-run (s)
    clean_lowered: float  # median clean batch at the lowered size (s)
    clean_start: float  # median clean batch at the start size before the failure (s)
    old: int
    new: int
    grew_back: int | None  # steps from the failing batch to the first at the start size again
    grow_after: int


def recovery(work: Workload, start: int, sizes: list[int], fail_at: int = 10) -> Recovery:
    """One failure at batch ``fail_at`` (every micro-batch larger than half the start fails there)."""
    steps = fail_at + LadderSettings().grow_after + 5
    torch.manual_seed(0)
    model = work.build()
    optimizer = torch.optim.AdamW(model.parameters())
    guard = autobatch.Guard(start, sizes=sizes)
    step = 0

    def failing_loss(model: nn.Module, batch: Any) -> torch.Tensor:
        loss = loss_fn(model, batch)
        if step == fail_at and len(batch[0]) > start // 2:
            torch.empty(1 << 50, dtype=torch.uint8)  # a real allocator failure after the forward
        return loss

    times, micro = [], []
    for step in range(steps):  # noqa: B007 - failing_loss reads it
        batch = work.batch(work.batch_size)
        started = time.perf_counter()
        done = guard.step(model, optimizer, batch, failing_loss)
        times.append(time.perf_counter() - started)
        micro.append(done.micro_batch_size)
    lowered = micro[fail_at]
    back = next((s - fail_at for s in range(fail_at + 1, steps) if micro[s] == start), None)
    clean_low = [t for s, t in enumerate(times) if s > fail_at and micro[s] == lowered]
    return Recovery(
        failing=times[fail_at],
        clean_lowered=statistics.median(clean_low),
        clean_start=statistics.median(times[2:fail_at]),
        old=start,
        new=lowered,
        grew_back=back,
        grow_after=LadderSettings().grow_after,
    )


def _spread(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4)
    return f"{(q[0] - 1) * 100:+.1f} % .. {(q[2] - 1) * 100:+.1f} %"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60, help="interleaved rounds per workload and split")
    parser.add_argument("--output", type=Path, default=PAGE)
    args = parser.parse_args()
    torch.set_num_threads(1)
    began, load = time.time(), os.getloadavg()
    rows = []
    for work in WORKLOADS.values():
        for micro in (work.batch_size, work.batch_size // 2):
            ratios = overhead(work, micro, args.rounds)
            split = "1 micro-batch" if micro == work.batch_size else f"2 micro-batches of {micro}"
            rows.append(
                f"| {work.name} | {split} | {(statistics.median(ratios) - 1) * 100:+.1f} % | {_spread(ratios)} |"
            )
            print(rows[-1], flush=True)
    recoveries = []
    for work in WORKLOADS.values():
        size = work.batch_size
        r = recovery(work, size, [size // 4, size // 2, size])
        recoveries.append(
            f"| {work.name} | {r.old} -> {r.new} | {r.failing * 1000:.1f} | {r.clean_lowered * 1000:.1f} | "
            f"{(r.failing - r.clean_lowered) * 1000:+.1f} ({r.failing / r.clean_lowered:.2f}x) | "
            f"{r.clean_start * 1000:.1f} | {r.grew_back} (grow_after {r.grow_after}) |"
        )
        print(recoveries[-1], flush=True)
    release = release_seconds()
    lines = [
        "## Latest run",
        "",
        *measurements.run_header(
            measurements.command_line("guard_bench.py", ["--rounds", str(args.rounds)]),
            extra=[
                f"- {time.time() - began:.0f} s in all; one torch thread; AdamW",
                f"- load average {load[0]:.1f} at the start and {os.getloadavg()[0]:.1f} at the end (2 cores); the "
                "overhead is a ratio of the two loops timed side by side, in interleaved rounds",
            ],
        ),
        "",
        f"### Overhead per step, no out-of-memory failure ({args.rounds} interleaved rounds)",
        "",
        "Guarded time over the bare loop's, minus one: the median of the rounds' ratios, and the middle half of "
        "them.",
        "",
        "| workload | split | overhead (median) | middle half |",
        "|---|---|---:|---|",
        *rows,
        "",
        "### Recovery from one out-of-memory failure, and growing back",
        "",
        "The failure is injected at batch 10 at the end of the first micro-batch's forward; the failing batch's "
        "time runs from its start to the end of its re-run at the lowered size.",
        "",
        "| workload | micro-batch | failing batch (ms) | clean batch at the lowered size (ms) | recovery cost (ms) | "
        "clean batch before (ms) | steps until it grows back |",
        "|---|---|---:|---:|---:|---:|---:|",
        *recoveries,
        "",
        f"Of the recovery, the heap release (a garbage collection and `malloc_trim`) took {release * 1000:.1f} ms "
        "(median of 5, in this process after the runs).",
    ]
    print("\n".join(lines))
    measurements.update(args.output, "guard", lines, title=TITLE, intro=INTRO)


if __name__ == "__main__":
    main()
