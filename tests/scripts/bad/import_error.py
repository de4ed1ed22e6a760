"""Fixture for the bad-input catalogue (tests/reliability/catalogue.py): imports a module that does not exist."""

from __future__ import annotations

import autobatch_no_such_module  # noqa: F401
