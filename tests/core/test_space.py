"""A combination's identity: named fields, and still the tuple that results, journals and tables compare."""

from __future__ import annotations

import json

from autobatch.core.space import Combo, ident_of


def test_an_identity_names_its_fields_and_the_combination():
    ident = Combo("bf16-mixed", "adamw", "6of12", seq_len=512, compile=True).ident
    assert (ident.precision, ident.optimizer, ident.level, ident.compile) == (
        "bf16-mixed",
        "adamw",
        "6of12",
        True,
    )
    assert ident.name == "bf16-mixed/adamw/recompute-6of12+compile"


def test_an_identity_is_the_same_tuple_as_before():
    """Equal to, hashed as and written to JSON as the plain tuple it replaced."""
    ident = ident_of({"precision": "32-true", "optimizer": "sgd", "recompute": True})
    plain = ("32-true", "sgd", "full", False)
    assert ident == plain and hash(ident) == hash(plain) and {plain: 1}[ident] == 1
    assert json.dumps(ident) == json.dumps(plain) == '["32-true", "sgd", "full", false]'
    assert ident == Combo("32-true", "sgd", "full").ident
