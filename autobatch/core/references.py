"""How the step is named, as text: ``package.module:attribute`` and ``PATH:Class`` references, HF tasks.

Pure string functions, shared by the settings (which must not resolve a reference as a path) and by
:mod:`autobatch.step.spec` (which turns the names into what the probe server loads).
"""

from __future__ import annotations

import re

#: ``--hf-task`` names, each a transformers auto class (:mod:`autobatch.step.hf`).
HF_TASKS = (
    "causal-lm",
    "masked-lm",
    "seq-classification",
    "token-classification",
    "question-answering",
    "seq2seq-lm",
)

_REFERENCE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)?$")


def is_reference(text: str) -> bool:
    """``"package.module:attribute"``: a dotted module, a colon, a dotted attribute (no ``.py``, no slash)."""
    return ":" in text and not text.endswith(".py") and bool(_REFERENCE.match(text))


def split_reference(reference: str) -> tuple[str, str]:
    """``"models/lit.py:LitModel"`` or ``"pkg.lit:LitModel"`` -> (where, attribute); the attribute may be empty."""
    where, _, attribute = reference.rpartition(":") if ":" in reference else (reference, "", "")
    return where, attribute


def is_file_reference(where: str) -> bool:
    """Whether the part before the colon names a file (``.py`` or a path) rather than a module."""
    return where.endswith(".py") or "/" in where or "\\" in where
