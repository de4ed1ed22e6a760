"""Explain and estimate: where a step's memory goes, what each lever buys, and maxima without a GPU.

The code is grouped by where it runs (no subpackage imports torch at package import; the CLI imports
what it needs inside its commands):

``pure/``    no torch, no I/O; imported on both sides of the process boundary
             ``records``  categories, model transforms and scenarios, as plain records
             ``options``  the typed options of the ``explain`` and ``estimate`` probe operations
             ``maxima``   the largest batch from simulations (the search over a simulated curve)
             ``levers``   what bf16, lighter optimizers, recomputation, accumulation, ... would buy
             ``attention_lever``  the saved (.., L, L) attention scores at a length, and their lever
             ``cards``    named GPU card profiles
``worker/``  inside a forked probe process, with torch
             ``ops``         the ``explain`` and ``estimate`` operations, registered with autobatch.probe.ops
             ``tracker``     a TorchDispatchMode that tracks tensor storages by category (the breakdown)
             ``allocators``  how a device turns tensor allocations into budgeted memory (CPU, CUDA)
             ``breakdown``   ``Instrument``: hooks a step so that its categories add up to the peak
             ``modules``     the per-module table (parameters, activations, forward FLOPs)
             ``transforms``  in-place activations and vocabulary trimming, applied to the user's model
             ``simulate``    the probe's own step under fake tensors (no real allocation)
``parent/``  in the command's process, driving a probe server (no torch)
             ``driver``     requests of the operations, real maxima searched with probes
             ``explainer``  ``autobatch explain`` end to end (``explain_batch``)
             ``estimator``  ``autobatch estimate`` end to end (``estimate_combinations``)
             ``estimate_lengths``  ``estimate --seq-len``: the answers per length laid out as tune's
``output/``  presentation: ``render`` (rich tables and bars), ``plot`` (matplotlib figures, optional)
"""
