"""Explain and estimate: where a step's memory goes, what each lever buys, and maxima without a GPU.

Modules (none imports torch at package import; the CLI imports them inside its commands):

``tracker``     a TorchDispatchMode that tracks tensor storages by category (the peak breakdown)
``allocators``  how a device turns tensor allocations into budgeted memory (CPU VmData, CUDA segments)
``breakdown``   the instrumented real step: categories that add up to the measured peak
``modules``     the per-module table (parameters, activations, forward FLOPs)
``transforms``  in-place activations and vocabulary trimming, applied to the user's model
``simulate``    a step under fake tensors (no real allocation)
``estimate``    the largest batch from simulations
``levers``      what bf16, lighter optimizers, recomputation, accumulation, ... would buy
``cards``       named GPU card profiles
``records``     plain records shared by both sides (categories, transforms, scenarios)
``ops``         the ``explain``/``estimate`` operations run in a forked probe process
``driver``      the parent side: run those operations through a probe server, search real maxima
``explainer``   ``autobatch explain`` end to end;  ``estimator``  ``autobatch estimate`` end to end
``render``      rich tables and bars;  ``plot``  matplotlib figures (optional extra ``plot``)
"""
