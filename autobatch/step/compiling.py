"""``torch.compile`` inside a probe: the model compiled as the job would compile it, timed apart.

Where: the model is compiled last, after recomputation, the precision's cast, the move to the device and a
distributed strategy's wrapper: PyTorch's guidance is to compile the ``DistributedDataParallel``-wrapped model
(so that Dynamo's DDPOptimizer splits the graph at the gradient buckets), and FSDP2's ``fully_shard`` works
in place on the module that is then compiled. The optimizer is built on the same parameters either way.
The model is compiled whole, with ``torch.compile``'s defaults (the ``inductor`` backend, graph breaks
allowed: the job's model need not trace in one graph); on the CPU device inductor generates C++ (a
working C++ compiler is needed: ``g++`` by default, ``CXX`` to change it). A fake-tensor simulation does not
compile.

Batch sizes: every tensor of the batch gets its first dimension marked dynamic
(:func:`torch._dynamo.maybe_mark_dynamic`), so the graph is traced for a symbolic batch and one compiled
graph serves every batch size of a combination. ``maybe_``, not ``mark_dynamic``: a model whose code
specialises the batch (``if x.shape[0] == 8``) compiles a static graph, as in the job, instead of
failing with a constraint violation that no job would see. Each probe is a fresh process, so what is shared
between its probes is the on-disk cache: inductor's FX graph cache and AOTAutograd's cache (both on), in
:func:`inductor_cache_dir`, so a combination compiles cold once and its later probes mostly load (measured
through the probe server on a small ``examples/mlp.py``, two busy cores: 34-44 s cold, 5-7 s warm).

Time: the report's ``compile_seconds`` is the time :func:`compile_model` takes (importing Dynamo and
inductor, a few seconds in a fresh process) plus what :class:`CompileClock` adds up of the time Dynamo
reports compiling (its start and end callbacks, which also cover a backward compiled lazily at the first
backward, inductor's C++ builds and the per-process checks of the CPU's vector ISA). Each step's time is its
wall time less the compiling inside it, so a recompilation at a later step (a batch of another shape) is not
counted as step time either; the worker's throughput already leaves the first step out. With a torch whose
Dynamo has no callbacks, the compiling is estimated as the first step's time over the median of the later
steps'.

Memory: on the CPU device the probe's peak is its process's data memory, and the compiler works in that
process (Dynamo's and inductor's Python objects), as it does in the job's: a compiled probe's peak includes
it.
"""

from __future__ import annotations

import os
import tempfile
import time
from types import TracebackType
from typing import Any

import torch

#: The folder of inductor's on-disk caches that a tune's probes share (set by the probe server); unset,
#: :func:`inductor_cache_dir` picks one under the system's temporary folder.
INDUCTOR_CACHE_ENV = "AUTOBATCH_INDUCTOR_CACHE"


def inductor_cache_dir() -> str:
    """``$AUTOBATCH_INDUCTOR_CACHE``, else ``autobatch-inductor-<uid>`` in the temporary folder."""
    chosen = os.environ.get(INDUCTOR_CACHE_ENV)
    if chosen:
        return chosen
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"autobatch-inductor-{uid}")


def use_inductor_cache() -> str:
    """Point inductor's caches at :func:`inductor_cache_dir` unless ``TORCHINDUCTOR_CACHE_DIR`` names another
    folder than torch's default (importing ``torch._dynamo`` sets the variable to that default, so "set to
    the default" counts as unset), and turn the FX graph and AOTAutograd caches on; returns the folder."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    given = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if given and os.path.abspath(given) != os.path.abspath(default_cache_dir()):
        folder = given
    else:
        folder = inductor_cache_dir()
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    os.makedirs(folder, exist_ok=True)
    import torch._functorch.config
    import torch._inductor.config

    torch._inductor.config.fx_graph_cache = True
    torch._functorch.config.enable_autograd_cache = True
    return folder


def compile_model(model: torch.nn.Module) -> torch.nn.Module:
    """``torch.compile(model)`` with the shared cache (compiling happens at the first call)."""
    use_inductor_cache()
    return torch.compile(model)  # type: ignore[return-value]


def mark_batch_dynamic(batch: Any) -> None:
    """Mark the first dimension of every tensor in a nested batch as dynamic (see the module docstring)."""
    import torch._dynamo

    if isinstance(batch, torch.Tensor):
        if batch.dim() >= 1:
            torch._dynamo.maybe_mark_dynamic(batch, 0)
    elif isinstance(batch, dict):
        for value in batch.values():
            mark_batch_dynamic(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            mark_batch_dynamic(value)


class CompileClock:
    """Adds up the seconds Dynamo spends compiling while it is entered (``seconds``; ``compiles``: how many
    compilations started). Without Dynamo's callbacks (an older torch) ``available`` is False and it reads 0."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.compiles = 0
        self._started: float | None = None
        self._handler: Any = None
        self.available = False

    def __enter__(self) -> CompileClock:
        import torch._dynamo

        self._handler = getattr(torch._dynamo, "callback_handler", None)
        if self._handler is not None:
            self._handler.register_start_callback(self._start)
            self._handler.register_end_callback(self._end)
            self.available = True
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._started is not None:  # a compile that raised ends without its callback
            self._end()
        if self._handler is not None:
            self._handler.remove_start_callback(self._start)
            self._handler.remove_end_callback(self._end)

    def _start(self, *_args: Any) -> None:
        self.compiles += 1
        self._started = time.perf_counter()

    def _end(self, *_args: Any) -> None:
        if self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None
