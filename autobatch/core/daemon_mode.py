"""The ``daemon`` setting's values, where the settings and the command's light entry point both read them.

The client (:func:`autobatch.daemon.client.route`) reads :data:`DAEMON_ENV` before, and instead of, importing
the settings when it names one of :data:`DAEMON_MODES`: the variable overrides any config file.
"""

from __future__ import annotations

#: off: never through the daemon; auto: started on first use, in-process with a note when unreachable; on: an
#: error when unreachable.
DAEMON_MODES: tuple[str, ...] = ("off", "auto", "on")
#: The setting's environment variable (``AUTOBATCH_`` and the field's name).
DAEMON_ENV = "AUTOBATCH_DAEMON"
