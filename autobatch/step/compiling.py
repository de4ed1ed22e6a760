"""``torch.compile`` inside a probe: the model compiled as the job would compile it, timed apart.

Compiles the model last (after recomputation, the precision's cast, the move to the device and a
distributed wrapper) with ``torch.compile``'s defaults, marks the batch dimension dynamic so one graph
serves every batch size, shares inductor's on-disk caches between probes (:func:`inductor_cache_dir`) and
reports the compile time apart from the step time (:class:`CompileClock`). Where, why and what it costs:
docs/levers.md ("Compile in a probe").
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
