"""Helpers of ``scripts/benchmark.py``.

Run in fresh processes (``python -m bench_workers.NAME ...`` with ``scripts/`` on ``PYTHONPATH``):

``lightning_tuner``   Lightning's ``Tuner.scale_batch_size`` (binsearch or power) around a workload
``accelerate_finder`` accelerate's ``find_executable_batch_size`` around a workload
``build_cost``        how long a workload's own build (model, optimizer, batch) takes in a fresh process

Each of them imports everything it needs, then caps its own data memory with ``RLIMIT_DATA`` at the
same budget autobatch's probes get (so the cap counts the same ``VmData``, imports included), under the
same pinned glibc allocator (``MALLOC_ARENA_MAX=1``, ``MALLOC_MMAP_THRESHOLD_=65536`` in the
environment the harness starts it with), and writes one JSON record (:mod:`bench_workers.common`).

Imported by the harness itself (not run as workers): ``runs`` (the subprocess runners, the true
maximum by fresh-process bisection, the probe-overhead measurement) and ``report`` (tables, targets).
"""
