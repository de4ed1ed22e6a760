"""Explain and estimate: where a step's memory goes, what each lever buys, and maxima without a GPU.

Grouped by where the code runs (no subpackage imports torch at package import): ``pure/`` (no torch, no
I/O: records, options, maxima, levers, cards), ``worker/`` (inside a forked probe process, with torch: the
operations, the tracker, allocator models, the simulation), ``parent/`` (in the command's process, driving
a probe server) and ``output/`` (tables and plots). The package map: docs/architecture.md ("Explain and
estimate, by where they run"); what the commands do: docs/explain-estimate.md.
"""
