"""Where the runs of every job and user on a node meet: the node's own temporary folder.

A scheduler often gives each job a ``TMPDIR`` of its own (and pam_tmpdir each user), which Python's
:func:`tempfile.gettempdir` follows. What must be one per node (the device locks, a user's daemon) lives in the
node's ``/tmp`` (else ``/var/tmp``) whatever ``TMPDIR`` says; the temporary folder only where the node has none to
write in.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

#: The node's own temporary folders, in the order they are tried.
NODE_TEMP = ("/tmp", "/var/tmp")


def node_temp() -> Path:
    """The node's temporary folder (see the module's docstring)."""
    for folder in NODE_TEMP:
        if os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK):
            return Path(folder)
    return Path(tempfile.gettempdir())
