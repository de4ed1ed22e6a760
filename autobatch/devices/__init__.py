"""Devices a probe runs on: how a memory budget is enforced there and how the peak is measured.

``cuda``  PyTorch's caching allocator capped with ``torch.cuda.set_per_process_memory_fraction``;
          capacity, other processes and the CUDA context read from ``torch.cuda`` and pynvml.
``cpu``   the probe process's data memory capped with ``RLIMIT_DATA``.

``backend`` is the one protocol a probe process holds either through (:func:`~autobatch.devices.backend.backend_for`).

Each module imports torch (and pynvml) inside its functions, so importing this package is cheap.
"""
