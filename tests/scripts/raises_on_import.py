"""Fixture: fails while being imported, as a script with a broken module-level line does.

autobatch must report the script's own exception and traceback, not an internal error or a crash.
"""

from __future__ import annotations

raise RuntimeError("raises_on_import: this script fails at import time")
