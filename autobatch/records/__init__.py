"""The records that cross process and file boundaries, and their reading and writing.

A probe's request and outcome (:mod:`~autobatch.records.protocol`) and the translation between
exceptions and outcomes (:mod:`~autobatch.records.failures`), what the pure core reads of an outcome
(:mod:`~autobatch.records.readings`), the result of a tune (:mod:`~autobatch.records.result`, published
as ``result.schema.json``, checked by :mod:`~autobatch.records.schema`) and of a check
(:mod:`~autobatch.records.check`), whether the run behind a result file is alive
(:mod:`~autobatch.records.liveness`), and atomic file writes (:mod:`~autobatch.records.files`).
Nothing here imports torch.
"""
