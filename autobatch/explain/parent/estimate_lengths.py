"""``autobatch estimate --seq-len L ...``: the estimate at each length, and the table over lengths.

Each length is one estimate operation (every combination simulated under fake tensors with
``make_batch(batch_size, L)``), in the same probe server. The result is laid out as a tune over lengths
(:mod:`autobatch.run.lengths`): ``combinations`` at the plan's length (``--plan-seq-len``, else the longest),
``lengths.maxima`` an entry per combination and length with its ``seq_len``, and ``lengths.surfaces`` the
surface ``a + b·B·L + c·B·L²`` (:func:`autobatch.core.lengths.fit`) fitted per combination over the lines the
estimates drew (intercept and slope through the smallest simulated batch and the largest that fits), with
its token budget and ``attention_share``: the share of the per-sample activations the ``L²`` term holds at
the plan's length. With one length the surface has no ``L²`` term (it needs two lengths to tell it apart).
"""

from __future__ import annotations

import copy
from typing import Any

from autobatch.core.model import Affine
from autobatch.core.space import Combo
from autobatch.explain.pure.maxima import to_combo_result
from autobatch.records.result import ComboResult, TuneResult
from autobatch.run.lengths import LengthSearch


def rows_at(
    entries: list[ComboResult | None], info: dict[str, Any], seq_len: int | None
) -> list[ComboResult]:
    """One estimate operation's answers in the grid's order: the simulated scenarios' and, for the
    placeholders that were never simulated (``entries``' skipped ones), a copy of them; each at ``seq_len``."""
    found = iter(info.get("scenarios", []))
    rows = []
    for entry in entries:
        row = copy.deepcopy(entry) if entry is not None else to_combo_result(next(found))
        row.seq_len = seq_len
        rows.append(row)
    return rows


def add_lengths(
    result: TuneResult,
    combos: list[Combo],
    answers: dict[int | None, tuple[list[ComboResult], dict[str, Any]]],
    plan: int,
    multiple: int,
) -> None:
    """``result.lengths`` from each length's rows and estimate ``info`` (``answers``, keyed by length): the
    maxima, and the surfaces fitted over the estimated lines (tune's own :class:`LengthSearch` does the
    fitting, the token budgets and the rows it predicts between the lengths)."""
    lengths = tuple(sorted(n for n in answers if n is not None))
    search = LengthSearch(result, lengths, plan, int(result.device["budget_bytes"]), multiple)
    table = result.lengths
    assert table is not None
    for seq_len in lengths:
        rows, info = answers[seq_len]
        table.maxima.extend(rows)
        lines = {found["name"]: found for found in info.get("scenarios", [])}
        for combo in combos:
            found = lines.get(combo.key)
            if found is None or found.get("status") == "error":
                continue
            intercept, slope = found.get("intercept_bytes"), found.get("bytes_per_sample")
            if intercept is not None and slope is not None:
                search.learn(combo.at(seq_len), Affine(float(intercept), float(slope)))
    search.finish(combos)
